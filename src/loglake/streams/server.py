"""asyncio TCP adapter of the stream service: Ockam TCP framing in, ``StreamService`` core, out.

Per connection a sans-I/O ``TcpConnection`` (``loglake.wire.ockam``) turns bytes into routing
messages; the server hands every message that arrived — from all connections — to the core in one
``handle_batch`` call, run on one worker thread so the event loop keeps reading while the log
fsyncs. Everything that arrived during one fsync is the next group commit: that is how many small
pushes share one ``append_many`` (the throughput target of issue 3 §5). Within a batch, appends
to different partitions run on a small thread pool (``StreamService.map_targets``) so their
fsyncs overlap; one partition's pushes stay in one ``append_many``, in arrival order.

Replies go back on the connection the request came from (each connection is its own Ockam TCP
handler, as ``transport/tcp/handler.ex`` is one worker per socket). A connection that breaks the
protocol (bad version byte, oversized or undecodable frame) is closed with its reason logged; the
messages it sent before the bad frame are still answered, and nothing else is affected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable

from loglake.logs import log_event
from loglake.streams.service import StreamService
from loglake.wire.ockam import DEFAULT_MAX_FRAME, RoutingMessage, TcpConnection, encode_frames

logger = logging.getLogger(__name__)

APPEND_THREADS = 8
"""Partitions appended in parallel within one batch."""
MAX_QUEUED_PER_CONNECTION = 20_000
"""Stop reading a connection while this many of its messages await the core (backpressure)."""


class _Connection(asyncio.Protocol):
    def __init__(self, server: StreamServer) -> None:
        self.server = server
        self.wire = TcpConnection(server.max_frame)
        self.transport: asyncio.Transport | None = None
        self.queued = 0
        self.closing = False
        self.peer = "?"
        self.paused = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.write(TcpConnection.initial_bytes())
        self.server._conns.add(self)
        log_event(logger, logging.DEBUG, "connection opened", peer=self.peer)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        msgs = self.wire.receive_data(data)
        if msgs:
            self.queued += len(msgs)
            self.server._enqueue(self, msgs)
            if self.queued > MAX_QUEUED_PER_CONNECTION and not self.paused:
                self.paused = True
                self.transport.pause_reading()
        if self.wire.error is not None:
            log_event(
                logger,
                logging.WARNING,
                "closing connection: protocol error",
                peer=self.peer,
                reason=str(self.wire.error),
            )
            self.closing = True
            if self.queued == 0:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._conns.discard(self)
        self.closing = True
        log_event(logger, logging.DEBUG, "connection closed", peer=self.peer, error=exc)

    def send(self, msgs: list[RoutingMessage], handled: int) -> None:
        self.queued -= handled
        t = self.transport
        if t is None or t.is_closing():
            return
        if msgs:
            t.write(encode_frames(msgs))
        if self.closing and self.queued == 0:
            t.close()
        elif self.paused and self.queued < MAX_QUEUED_PER_CONNECTION // 2:
            self.paused = False
            t.resume_reading()


class StreamServer:
    """``await StreamServer(service, host, port).start()``; ``.port`` is the bound port."""

    def __init__(
        self,
        service: StreamService,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.service = service
        self.host, self.port = host, port
        self.max_frame = max_frame
        self._conns: set[_Connection] = set()
        self._pending: list[tuple[_Connection, list[RoutingMessage]]] = []
        self._wake = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "loglake-streams")
        # appends to different partitions of one batch run side by side (their fsyncs overlap)
        self._appenders = concurrent.futures.ThreadPoolExecutor(APPEND_THREADS, "loglake-append")
        if service.map_targets is map:
            service.map_targets = self._appenders.map
        self._server: asyncio.Server | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> StreamServer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._task = loop.create_task(self._process())
        log_event(logger, logging.INFO, "stream service listening", host=self.host, port=self.port)
        return self

    def _enqueue(self, conn: _Connection, msgs: list[RoutingMessage]) -> None:
        self._pending.append((conn, msgs))
        self._wake.set()

    async def _process(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch, self._pending = self._pending, []
                msgs = [m for _, ms in batch for m in ms]
                try:
                    results = await loop.run_in_executor(
                        self._executor, self.service.handle_batch, msgs
                    )
                except Exception:  # the core catches per message; this is a last resort
                    logger.exception("stream service batch failed")
                    results = [[] for _ in msgs]
                k = 0
                for conn, ms in batch:
                    out: list[RoutingMessage] = []
                    for _ in ms:
                        out += results[k]
                        k += 1
                    conn.send(out, len(ms))

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            if c.transport is not None:
                c.transport.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            await self._server.wait_closed()
        self._executor.shutdown(wait=True)
        self._appenders.shutdown(wait=True)


class BackgroundServer:
    """A ``StreamServer`` on its own event loop thread (for tests, the demo, embedding).

    ``with BackgroundServer(service) as srv: StreamClient(port=srv.port)``.
    """

    def __init__(
        self, service: StreamService, host: str = "127.0.0.1", port: int = 0, **kw
    ) -> None:
        self._make: Callable[[], StreamServer] = lambda: StreamServer(service, host, port, **kw)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.server: StreamServer | None = None
        self._thread = threading.Thread(target=self._run, name="loglake-server", daemon=True)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.server = self._loop.run_until_complete(self._make().start())
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> BackgroundServer:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self.server is not None and self._loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop)
            fut.result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
