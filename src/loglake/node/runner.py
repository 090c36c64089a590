"""The node process: the parts a ``NodeConfig`` turns on, in one event loop, started and
stopped in order.

What runs where: the Ockam stream service (``streams.server.StreamServer``) and the HTTP API
(uvicorn, the app of ``node/app.py``) share the asyncio loop; the log's retention runs off the
loop (``node.cli._retention_loop``, the one ``serve`` uses); each protocol part runs in its
handle (``node/api/<part>.py``): its own thread for blocking loops (archives' BitTorrent, SDS
rounds, the ICRC in-process network), stopped before the log closes. Every part talks to the
node's log through ``LocalStreams`` over the same (instrumented) ``Log``, so what they do shows
in the API and in ``/metrics`` like any client's pushes.

``Node.run(stop)`` is the whole process (``loglake node``); ``BackgroundNode`` runs the same on
a thread for the walkthrough, tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import uvicorn

from loglake.errors import LoglakeError
from loglake.log import Durability, Log, LogLocked, StreamConfig, fs
from loglake.node.api.context import NodeContext
from loglake.node.app import create_app
from loglake.node.auth import LoginCodes, Token, forget_token, load_or_create_token
from loglake.node.backend import (
    RETENTION,
    NodeLeases,
    describe_backend,
    open_node_log,
    start_sealer,
)
from loglake.node.config import NodeConfig
from loglake.node.gate import LOOPBACK_HOSTS
from loglake.node.http_protocol import NodeH11Protocol
from loglake.node.metrics import InstrumentedLog, NodeMetrics
from loglake.streams.descriptors import raise_soft_limit
from loglake.streams.server import LoopThread
from loglake.structured_logging import log_event

_logger = logging.getLogger(__name__)


class NodeStartError(LoglakeError):
    """A part of the node could not start (a port taken, a part's state unreadable)."""


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the node stops every part, in order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


NODE_LOCK = "node.lock"


def lock_data_dir(data_dir: Path) -> int:
    """An exclusive ``flock`` on ``<data_dir>/node.lock``, held while the node runs; the fd.

    Why the node's own lock, beside the log's (``LOCK``): on a cluster (``[streams] backend``)
    the log is JetStream's and locks nothing here, so a second node given the same data dir
    ran beside the first, both writing its token, archives member state and caches. One data
    dir per node, whatever the backend; the lock goes with the process (no stale file)."""
    try:
        return fs.lock_file(data_dir / NODE_LOCK)
    except fs.LockHeld:
        from loglake.node.cli import data_dir_in_use

        raise NodeStartError(data_dir_in_use(data_dir, "data_dir")) from None


def bind(host: str, port: int) -> socket.socket:
    try:
        sock = socket.create_server((host, port), reuse_port=False)
    except OSError as e:
        raise NodeStartError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


_T = TypeVar("_T")


async def _off_loop(fn: Callable[[], _T], close: Callable[[_T], object]) -> _T:
    """``fn()`` on a daemon thread of its own, awaited without blocking the loop; a start
    cancelled meanwhile does not wait for it: what ``fn`` returns later is ``close``d, what it
    raises is dropped.

    Why not ``asyncio.to_thread``: a JetStream connect to a cluster that does not answer takes
    its whole timeout (5 s by default), and the default executor's threads are joined before
    the process exits, so a SIGTERM then waited for it. Why not on the loop, as it was: the
    loop runs the signal handlers, so a SIGTERM was not even seen until the connect ended."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[_T] = loop.create_future()

    def deliver(result: _T | None, error: BaseException | None) -> None:
        if fut.cancelled():  # the start gave up on it
            if error is None:
                with contextlib.suppress(Exception):
                    close(cast(_T, result))
        elif error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(cast(_T, result))

    def run() -> None:
        result: _T | None = None
        error: BaseException | None = None
        try:
            result = fn()
        except BaseException as e:
            error = e
        try:
            loop.call_soon_threadsafe(deliver, result, error)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            if error is None:
                with contextlib.suppress(Exception):
                    close(cast(_T, result))

    threading.Thread(target=run, name="loglake-node-start", daemon=True).start()
    return await fut


class Node:
    """One node, as ``config`` says. ``await node.start()``, then ``await node.stop()``.

    A cancelled ``start()`` (``loglake node`` cancels it on SIGTERM or SIGINT) stops at once
    where it is, or after the part being started (parts start one after another on a thread,
    which checks ``_stopping`` between them), and stops what it had started, as a failed
    start does: ports and ``node.lock`` released, a token never shown forgotten."""

    def __init__(self, config: NodeConfig, *, say: Callable[[str], None] = print) -> None:
        self.config = config
        self.say = say
        self.token: Token | None = None
        self.context: NodeContext | None = None
        self.http_port = 0
        self.parts: list[Any] = []
        self._log: Log | None = None
        self._server: Any = None
        self._uvicorn: _Uvicorn | None = None
        self._uvicorn_task: asyncio.Task | None = None
        self._retention: asyncio.Task | None = None
        self._sealer: asyncio.Task | None = None
        self.leases: NodeLeases | None = None
        """Once-only work (the sealer, retention, the ICRC journal, the archives control
        node) on a cluster shared with other nodes."""
        self._stop_retention = asyncio.Event()
        self.logins = LoginCodes()
        self._dir_lock: int | None = None
        """The fd holding ``<data dir>/node.lock`` (``lock_data_dir``) while the node runs."""
        self._stopping = threading.Event()
        """Set once the node stops, or its start is given up: no further part starts."""

    @property
    def url(self) -> str:
        host = self.config.http.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.http_port}"

    def console_link(self) -> str:
        """A console URL that logs in once (``auth.LoginCodes``): safe in a browser's
        history, unlike the token."""
        return f"{self.url}/console/#login={self.logins.issue()}"

    async def start(self) -> Node:
        cfg = self.config
        if cfg.data_dir.exists() and not cfg.data_dir.is_dir():  # mkdir said only "File exists"
            raise NodeStartError(f"data_dir {cfg.data_dir} is a file, not a directory")
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock = lock_data_dir(cfg.data_dir)
        try:
            self.token = load_or_create_token(cfg.data_dir)
        except BaseException:
            self._release_data_dir()
            raise
        stream_config = StreamConfig(
            durability=cast(Durability, cfg.streams.durability),  # checked by config
            segment_bytes=cfg.streams.segment_bytes,
        )
        try:
            try:  # the embedded log or JetStream, whose connect may take its timeout
                raw = await _off_loop(lambda: open_node_log(cfg, stream_config), Log.close)
            except LogLocked:
                from loglake.node.cli import data_dir_in_use

                raise NodeStartError(data_dir_in_use(cfg.data_dir, "data_dir")) from None
            self._log = raw
            await self._start_parts(raw, stream_config)
        except BaseException:  # a failed start, or one cancelled (a signal)
            self._stopping.set()
            await self.stop()
            if self.token.created:
                forget_token(self.token.path)
            raise
        return self

    async def _start_parts(self, raw: Log, stream_config: StreamConfig) -> None:
        cfg = self.config
        metrics = NodeMetrics(cfg.http.metrics_consumers) if cfg.http.metrics else None
        log: Log = InstrumentedLog(raw, metrics) if metrics is not None else raw
        ctx = NodeContext(log=log, data_dir=cfg.data_dir, metrics=metrics)
        self.context = ctx
        if metrics is not None:
            metrics.attach(ctx)
        if cfg.streams.enabled:
            from loglake.streams.limits import ServerLimits
            from loglake.streams.server import StreamServer
            from loglake.streams.service import StreamService

            host, port = cfg.streams.host, cfg.streams.port
            limits = ServerLimits.from_mapping(vars(cfg.limits))  # checked by config
            service = StreamService(log, stream_config, max_client_id=limits.max_client_id)
            try:
                self._server = await StreamServer(service, host, port, limits=limits).start()
            except OSError as e:
                raise NodeStartError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
            ctx.stream_address = (host, self._server.port)
        from loglake.node.cli import _retention_loop

        self.leases = await _off_loop(lambda: NodeLeases(raw, cfg), NodeLeases.close)
        self._retention = asyncio.create_task(
            _retention_loop(
                raw,
                cfg.streams.retention_interval,
                self._stop_retention,
                self.leases.checker(RETENTION),
            )
        )
        ctx.leases = self.leases
        from loglake.node.keys import NodeKeys

        ctx.keys = NodeKeys.for_node(raw, cfg)
        self._sealer = start_sealer(cfg, raw, self._stop_retention, self.leases)
        from loglake.node.cluster import ClusterView

        ctx.cluster = ClusterView(raw, self.leases, cfg.streams, cfg.data_dir)
        ctx.parts = {
            "streams": cfg.streams.enabled,
            "events": cfg.events.enabled,
            "archives": cfg.archives.enabled,
            "sds": cfg.sds.enabled,
            "jobs": cfg.jobs.enabled,
            "console": cfg.console,
            "metrics": metrics is not None,
        }
        parts = asyncio.ensure_future(
            asyncio.to_thread(self._start_protocol_parts, ctx, asyncio.get_running_loop())
        )
        try:
            await asyncio.shield(parts)
        except asyncio.CancelledError:  # the part being started finishes, no other starts;
            self._stopping.set()  # then stop() closes every part started
            with contextlib.suppress(Exception):
                await parts
            raise
        assert self.token is not None
        app = create_app(
            ctx,
            token=self.token.value,
            console=cfg.console,
            metrics_public=cfg.http.metrics_public,
            allowed_hosts=loopback_names(cfg.http.host),
            logins=self.logins,
        )
        sock = bind(cfg.http.host, cfg.http.port)
        self.http_port = sock.getsockname()[1]
        self._uvicorn = _Uvicorn(
            uvicorn.Config(
                app,
                log_level="warning",
                lifespan="off",
                access_log=False,
                http=NodeH11Protocol.configured(send_timeout=cfg.http.send_timeout),
                # no WebSocket route: an upgrade would hand the connection to a protocol that
                # never gives back its place in the process's connection budget
                ws="none",
            )
        )
        self._uvicorn_task = asyncio.create_task(self._uvicorn.serve(sockets=[sock]))
        while not self._uvicorn.started:
            if self._uvicorn_task.done():
                self._uvicorn_task.result()
                raise NodeStartError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)
        log_event(_logger, logging.INFO, "node started", url=self.url, data_dir=str(cfg.data_dir))

    def _start_protocol_parts(self, ctx: NodeContext, loop: asyncio.AbstractEventLoop) -> None:
        """Blocking starts (keys, stores, rebuilding cores from their streams), off the loop;
        ``loop`` serves what must run on it (the ICRC roles' HTTP servers)."""
        cfg = self.config
        stopping = self._stopping.is_set  # checked before each part: a start given up
        if stopping():
            return
        if cfg.events.enabled and cfg.events.transport == "http":
            from loglake.node.api.events_http import EventsHttpHandle

            ctx.events = EventsHttpHandle.start(ctx, cfg.events, loop)
            self.parts.append(ctx.events)
        elif cfg.events.enabled:
            from loglake.node.api.events import EventsHandle

            ctx.events = EventsHandle.start(ctx, cfg.events)
            self.parts.append(ctx.events)
        if cfg.sds.enabled and not stopping():
            from loglake.node.api.sds import SdsHandle

            ctx.sds = SdsHandle.start(ctx, cfg.sds)
            self.parts.append(ctx.sds)
        if cfg.archives.enabled and not stopping():
            from loglake.node.api.archives import ArchivesHandle

            ctx.archives = ArchivesHandle.start(ctx, cfg.archives)
            self.parts.append(ctx.archives)
        if cfg.jobs.enabled and not stopping():
            from loglake.node.api.jobs import JobManager

            ctx.jobs = JobManager(ctx)
            self.parts.append(ctx.jobs)

    async def stop(self) -> None:
        """Stop in reverse order of start; the log closes last."""
        self._stopping.set()
        if self._uvicorn is not None and self._uvicorn_task is not None:
            self._uvicorn.should_exit = True
            with contextlib.suppress(Exception):
                await self._uvicorn_task
        for p in reversed(self.parts):
            try:
                await asyncio.to_thread(p.close)
            except Exception as e:  # one part failing to stop must not keep the log open
                log_event(_logger, logging.ERROR, "part failed to stop", error=repr(e))
        self.parts.clear()
        if self._server is not None:
            await self._server.stop()
            self._server = None
        self._stop_retention.set()
        if self._retention is not None:
            await self._retention
            self._retention = None
        if self._sealer is not None:
            await self._sealer
            self._sealer = None
        if self.leases is not None:
            await asyncio.to_thread(self.leases.close)
            self.leases = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self._release_data_dir()

    def _release_data_dir(self) -> None:
        if self._dir_lock is not None:
            fs.close(self._dir_lock)  # closing the descriptor releases the flock
            self._dir_lock = None


def token_banner(node: Node) -> str:
    """What the node prints at start: the token only when it was just generated."""
    assert node.token is not None and node.context is not None
    lines = [f"loglake node: API {node.url}/api  console {node.url}/console/"]
    addr = node.context.stream_address
    if addr:
        lines.append(f"  stream service on {addr[0]}:{addr[1]}")
        # the node's stream service has no access file: say what that exposes
        lines.append(
            "  warning: the stream service has no authentication: any client can save, and "
            "so move, any consumer's index (reset one with the API or console)"
        )
    lines.append(f"  data dir {node.config.data_dir}; {describe_backend(node.config)}")
    if not _loopback(node.config.http.host):
        lines.append(
            f"  warning: the API listens on {node.config.http.host} over plain HTTP: other "
            "machines can reach it and the token crosses the network in clear text"
        )
    if node.token.created:
        lines.append(
            f"  access token (printed once; kept in {node.token.path}): {node.token.value}"
        )
    else:
        lines.append(f"  access token in {node.token.path}")
    lines.append(f"  console (the link logs in once): {node.console_link()}")
    return "\n".join(lines)


def loopback_names(host: str) -> tuple[str, ...] | None:
    """The ``Host`` names a node bound to ``host`` answers (``node/gate.py``): on a loopback
    address, the loopback names and the address itself; elsewhere any (None: the names it is
    reached by are the operator's)."""
    if not _loopback(host):
        return None
    return (*LOOPBACK_HOSTS, host.lower(), f"[{host.lower()}]")


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BackgroundNode:
    """A ``Node`` on its own event-loop thread: ``with BackgroundNode(cfg) as n: n.url``."""

    def __init__(self, config: NodeConfig, *, say: Callable[[str], None] = print) -> None:
        self.node = Node(config, say=say)
        self._thread = LoopThread(self.node.start, Node.stop, "loglake-node", stop_timeout=60)

    @property
    def url(self) -> str:
        return self.node.url

    @property
    def token(self) -> str:
        assert self.node.token is not None
        return self.node.token.value

    def console_link(self) -> str:
        return self.node.console_link()

    @property
    def context(self) -> NodeContext:
        assert self.node.context is not None
        return self.node.context

    def start(self) -> BackgroundNode:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()

    def __enter__(self) -> BackgroundNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def run_until_signalled(config: NodeConfig, say: Callable[[str], None] = print) -> None:
    """``loglake node``: start, print the banner, run until SIGINT/SIGTERM, stop cleanly. A
    signal while the node starts cuts the start short (``Node.start`` stops what it started)
    and ends the same way: "stopped", exit code 0."""
    import signal

    raise_soft_limit()  # before the log sizes its share of the descriptors
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    node = Node(config, say=say)
    starting = asyncio.ensure_future(node.start())
    signalled = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # a signal while starting: give the start up (it stops itself)
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        say("stopped")
        return
    signalled.cancel()
    starting.result()  # a failed start's error
    try:
        say(token_banner(node))
        await stop.wait()
    finally:
        await node.stop()
    say("stopped")
