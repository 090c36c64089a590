"""``loglake serve`` and ``loglake demo``: the stream service as a process.

``serve`` opens the embedded log (``loglake.log.open_log``) in ``--data-dir`` (default: the
user's data directory, ``platformdirs.user_data_dir("loglake")``) and serves the Ockam stream
service on ``--host``/``--port`` (default ``127.0.0.1:4000``) until interrupted.

Trust (docs/security.md): ``--tls-cert``/``--tls-key`` serve over TLS 1.3,
``--tls-client-ca`` requires client certificates signed by that CA (mutual TLS), and ``--access``
maps certificate names to per-stream permissions. A bind to anything but loopback without TLS is
refused unless ``--insecure`` says that is meant: streams would be open to the network.

``demo`` (what ``make run`` calls) starts the same service on a temporary data dir and a free
loopback port, then walks through the spec end to end with ``StreamClient``: create a partitioned
stream, push, pull, save and get a consumer index, and prints what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import shutil
import signal
import socket
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import click
import platformdirs
from rich.console import Console
from rich.table import Table

from loglake.clitools import MAX_SECONDS, PORT, Number
from loglake.errors import LoglakeError
from loglake.log import Durability, Log, LogLocked, StreamConfig, open_log
from loglake.log.api import RETENTION_BOUNDS
from loglake.streams import eventloop
from loglake.streams.client import DEFAULT_PORT, PermissionDenied, StreamClient
from loglake.streams.descriptors import raise_soft_limit
from loglake.streams.limits import MAX_MEMORY, LimitError
from loglake.streams.limits import click_options as limits_options
from loglake.streams.limits import from_click as limits_from_click
from loglake.streams.nats_url import backend_url
from loglake.streams.permissions import NO_OWNERS_BANNER, AccessConfigError, AccessPolicy
from loglake.streams.server import BackgroundServer, StreamServer
from loglake.streams.service import StreamService
from loglake.streams.tls import TestPki, client_context, server_context, write_test_pki
from loglake.structured_logging import log_event
from loglake.wire.ockam import route_text

DEFAULT_DATA_DIR = platformdirs.user_data_dir("loglake")
PERIOD = Number(0.1, MAX_SECONDS)
"""``--retention-interval`` and ``--seal-interval``: 0.1 s to a year, the node's ``[streams]``
range. click's ``FloatRange(min=0.1)`` took ``nan`` (retention never ran, and Ctrl-C ended in a
``ValueError`` traceback) and ``inf`` (retention never ran)."""
_logger = logging.getLogger(__name__)


class ServeError(LoglakeError):
    """The service could not start (e.g. the port is taken)."""


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (``""`` and ``0.0.0.0``
    are every interface: not loopback; a name that does not resolve is not either)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def data_dir_in_use(data_dir: Path, key: str) -> str:
    """What a second writer on one data dir is told (``key``: the option that names it). Why
    not ``LogLocked``'s own text: it speaks to a programmer (``readonly=True``); an operator
    needs to know that another process has the data dir and what to change."""
    return (
        f"{key} {data_dir} is in use by another process (a running `loglake node` or "
        "`loglake serve`, or a `loglake log` command; one writer per data dir): stop it, or "
        f"give this one another {key}"
    )


def _checked_prefix(prefix: str) -> str:
    """``--nats-prefix`` as JetStreamLog will take it: a bad one is a usage error naming the
    option, not a ValueError traceback as the log opens."""
    from loglake.streams.jetstream import check_prefix

    try:
        return check_prefix(prefix)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def check_exposure(host: str, tls: bool, insecure: bool) -> None:
    """Refuse to serve plain TCP beyond loopback unless the operator said ``--insecure``."""
    if not tls and not insecure and not is_loopback(host):
        raise ServeError(
            f"refusing to serve {host!r} without TLS: anyone who can reach it could read and "
            "write every stream. Give --tls-cert and --tls-key (and --tls-client-ca, --access "
            "to say who may do what; docs/security.md), or --insecure if the network is trusted."
        )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Run loglake's services."""


@command.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="Where the log keeps its segments, lake and consumer indexes.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=PORT, default=DEFAULT_PORT, show_default=True, help="TCP port.")
@click.option(
    "--durability",
    type=click.Choice(["always", "batch", "none"]),
    default="batch",
    show_default=True,
    help="fsync policy of streams created through the service.",
)
@click.option(
    "--segment-bytes",
    type=click.IntRange(4096, MAX_MEMORY),  # the node's [streams] segment_bytes range
    default=StreamConfig().segment_bytes,
    show_default=True,
    help="Roll a partition's segment (and seal it to the lake) past this size.",
)
@click.option(  # each at most what StreamConfig holds (int64 ns, bytes, records)
    "--retention-ms",
    type=click.IntRange(0, RETENTION_BOUNDS["retention_ms"]),
    help="Keep segments this long.",
)
@click.option(
    "--retention-bytes",
    type=click.IntRange(0, RETENTION_BOUNDS["retention_bytes"]),
    help="Keep this many bytes.",
)
@click.option(
    "--retention-records",
    type=click.IntRange(0, RETENTION_BOUNDS["retention_records"]),
    help="Keep this many records.",
)
@click.option(
    "--retention-interval",
    type=PERIOD,
    default=60.0,
    show_default=True,
    help="Seconds between applications of each stream's retention (age, bytes, count).",
)
@click.option(
    "--backend",
    metavar="nats://H1:4222,H2:4222,...",
    callback=backend_url,
    help="Keep streams in a NATS JetStream cluster instead of the embedded log "
    "(docs/jetstream.md); the data dir then holds only the lake the sealer writes.",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1, max=5),
    default=1,
    show_default=True,
    help="With --backend: replicas of each JetStream stream created (1 or 3).",
)
@click.option(
    "--nats-creds",  # checked by jetstream.check_creds_readable, whose message cuts the path
    type=click.Path(dir_okay=False),
    help="With --backend: a NATS .creds file (user:password@ and token@ go in the URL).",
)
@click.option(
    "--nats-prefix",
    callback=lambda _ctx, _param, v: _checked_prefix(v),
    default="loglake",
    show_default=True,
    help="With --backend: namespace of stream names, subjects and the index bucket.",
)
@click.option(
    "--seal-interval",
    type=PERIOD,
    default=60.0,
    show_default=True,
    help="With --backend: seconds between copies of JetStream history into the data dir's lake.",
)
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, exists=True),
    help="Serve over TLS 1.3 with this certificate (PEM; the chain, leaf first).",
)
@click.option(
    "--tls-key", type=click.Path(dir_okay=False, exists=True), help="The certificate's key (PEM)."
)
@click.option(
    "--tls-client-ca",
    type=click.Path(dir_okay=False, exists=True),
    help="Mutual TLS: require a client certificate signed by this CA (PEM); its names "
    "(cn:…, dns:…, uri:…) are the client's identity for --access.",
)
@click.option(
    "--access",
    type=click.Path(dir_okay=False, exists=True),
    help="Who may do what: a TOML or JSON file of [[grant]] identities/streams/allow "
    "(docs/security.md). Without it every client may do everything. SIGHUP rereads it (a bad "
    "file is reported and the grants in force are kept).",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Allow plain TCP on a non-loopback address (a trusted network only).",
)
@limits_options()
def serve(
    data_dir: Path,
    host: str,
    port: int,
    durability: str,
    segment_bytes: int,
    retention_ms: int | None,
    retention_bytes: int | None,
    retention_records: int | None,
    retention_interval: float,
    backend: str | None = None,
    replicas: int = 1,
    nats_creds: str | None = None,
    nats_prefix: str = "loglake",
    seal_interval: float = 60.0,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_client_ca: str | None = None,
    access: str | None = None,
    insecure: bool = False,
    **limit_flags: Any,
) -> None:
    """Serve the Ockam stream service (stream_service, stream_index_service) over TCP.

    Streams created through the service get the durability, segment size and retention given
    here. Retention trims live segments only; sealed history stays readable from the lake.
    The --limits-* options bound what any client may hold of the server (memory, connections,
    time); docs/security.md lists them.
    """
    try:
        limits = limits_from_click(limit_flags)
    except LimitError as e:
        raise click.UsageError(str(e)) from None
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_client_ca and not tls_cert:
        raise click.UsageError("--tls-client-ca needs --tls-cert and --tls-key")
    if nats_creds:
        from loglake.streams.jetstream import check_creds_readable

        try:
            check_creds_readable(nats_creds)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--nats-creds'") from None
    check_exposure(host, tls=bool(tls_cert), insecure=insecure)
    tls = server_context(tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None
    policy = AccessPolicy.load(access) if access else None
    raise_soft_limit()  # before the log sizes its share of the descriptors
    started = False  # "stopped" after a bind error read as if the service had run
    made = _first_missing(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if made is not None:
        # a start that fails leaves no new data dir behind (found from outside: a port in use
        # left LOCK, consumers.* and streams/ in a new folder). Why not bind before the log
        # opens: the server is made from the service, which needs the log, and it binds what
        # the host resolves to (more than one socket for a name), not a socket given to it
        click.get_current_context().call_on_close(
            lambda: None if started else shutil.rmtree(made, ignore_errors=True)
        )
    log: Log
    if backend:  # the same service in front of JetStream: a cluster keeps the streams
        from loglake.streams.jetstream import JetStreamLog

        log = JetStreamLog(
            backend,
            replicas=replicas,
            credentials=nats_creds,
            prefix=nats_prefix,
            lake_dir=str(data_dir),  # pulls below JetStream's retention read the sealed lake
        )
    else:
        try:  # seals off the server's GIL; partitions open lazily, within the limits
            log = open_log(data_dir, seal_processes=True, **limits.log_options())
        except LogLocked:
            raise click.ClickException(data_dir_in_use(data_dir, "--data-dir")) from None
        except (OSError, LoglakeError) as e:  # e.g. EMFILE under a low ulimit -n: one line
            raise click.ClickException(f"cannot open the data dir {data_dir}: {e}") from None
    config = StreamConfig(
        durability=cast(Durability, durability),  # click.Choice of Durability's values
        segment_bytes=segment_bytes,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        retention_records=retention_records,
    )
    service = StreamService(log, config, access=policy, max_client_id=limits.max_client_id)
    console = Console(stderr=True)
    trust = (("mutual TLS" if tls_client_ca else "TLS") if tls is not None else "plain TCP") + (
        f", access {access}" if policy is not None else ""
    )

    async def main() -> None:
        nonlocal started
        try:
            server = await StreamServer(service, host, port, tls=tls, limits=limits).start()
        except OSError as e:
            raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        # the handlers before the banner: a Ctrl-C the moment "Ctrl-C to stop" showed was a
        # KeyboardInterrupt, "stopped" then "interrupted" and status 130 (found by a test)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        console.print(
            f"[bold green]loglake[/] stream service on [bold]{host}:{server.port}[/] "
            + f"({trust}) "
            + (
                f"(NATS JetStream {backend}, R{replicas})"
                if backend
                else f"(data dir {data_dir}, {durability_banner(log, durability)})"
            )
            + "; Ctrl-C to stop"
        )
        if policy is None:
            console.print(f"[yellow]warning:[/] {NO_OWNERS_BANNER}", highlight=False)
        started = True
        if policy is not None and access:
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signal.SIGHUP, reload_access, policy, Path(access))
        retention = asyncio.create_task(_retention_loop(log, retention_interval, stop))
        sealer = None
        if backend:  # JetStream history into <data_dir>/lake, so Spark and old pulls read it
            from loglake.streams.jetstream_seal import seal_loop

            sealer = asyncio.create_task(seal_loop(log, data_dir, seal_interval, stop))
        await stop.wait()
        await retention
        if sealer is not None:
            await sealer
        await server.stop()

    coro = main()
    try:
        eventloop.run(coro)
    except OSError as e:  # e.g. EMFILE making the loop itself under a tiny ulimit -n: one line
        coro.close()  # never started: no "was never awaited" warning on top of the error
        if started:
            raise
        raise click.ClickException(f"cannot start the stream service: {e}") from None
    finally:
        log.close()
        if started:
            console.print("stopped")


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (``path`` itself or one of its
    parents), or None if it exists."""
    missing = None
    for p in (path.absolute(), *path.absolute().parents):
        if p.exists():
            return missing
        missing = p
    return missing


def reload_access(policy: AccessPolicy, path: Path) -> None:
    """SIGHUP: reread the access file into the running service's ``policy``. A file that does
    not load leaves the grants in force (refusing everyone, or everyone everything, because an
    operator's edit was half saved would be worse) and says why."""
    try:
        fresh = AccessPolicy.load(path)
    except AccessConfigError as e:
        log_event(_logger, logging.ERROR, "access file not reloaded; the grants in force stay",
                  path=str(path), error=str(e))  # fmt: skip
        return
    policy.replace(fresh)
    # WARNING, not INFO: who may do what just changed, which the default log level must show
    log_event(_logger, logging.WARNING, "access file reloaded", path=str(path),
              grants=len(fresh.grants))  # fmt: skip


def durability_banner(log: Log, durability: str) -> str:
    """What each stream actually uses: ``--durability`` applies to streams created from now
    on; an existing stream keeps the policy saved with it."""
    text = f"durability {durability} for new streams"
    kept: dict[str, list[str]] = {}
    for name in log.streams():
        kept.setdefault(log.stream_info(name).config.durability, []).append(name)
    others = {d: names for d, names in kept.items() if d != durability}
    if others:
        listed = "; ".join(f"{d}: {', '.join(n)}" for d, n in sorted(others.items()))
        text += f"; existing streams keep their own ({listed})"
    return text


async def _retention_loop(
    log: Log,
    interval: float,
    stop: asyncio.Event,
    should_run: Callable[[], bool] | None = None,
) -> None:
    """Apply retention off the event loop every ``interval`` s until ``stop`` (the log only
    trims when asked, so without this a server's retention settings would never act); with
    ``should_run`` (a node's retention lease on a shared cluster) only rounds it allows."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
            return
        if should_run is not None and not should_run():
            continue
        try:
            dropped = await asyncio.to_thread(log.enforce_retention)
        except Exception as e:  # a bad disk or lake file must not end retention; say so
            log_event(_logger, logging.ERROR, "retention failed", error=f"{type(e).__name__}: {e}")
            continue
        if dropped:
            log_event(_logger, logging.INFO, "retention applied", dropped=dropped)


@command.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the demo's data here (default: a temporary directory, removed afterwards).",
)
@click.option(
    "--spark/--no-spark",
    default=True,
    show_default=True,
    help="End by reading the stream's history as a Spark DataFrame (local[*]; needs Java 17+).",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Serve over mutual TLS with test certificates and per-stream permissions, and show "
    "a read-only client refused a push (docs/security.md).",
)
def demo(data_dir: Path | None, spark: bool, tls: bool = False) -> None:
    """Start the service, walk through create/push/pull/index, read it with Spark, stop."""
    console = Console()
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="loglake-")))
        log = open_log(data_dir)
        stack.callback(log.close)
        secure = _demo_tls(data_dir) if tls else None
        service = StreamService(log, access=secure.policy if secure else None)
        srv = stack.enter_context(
            BackgroundServer(service, "127.0.0.1", 0, tls=secure.server if secure else None)
        )
        console.print(f"[bold]1.[/] stream service on 127.0.0.1:{srv.port}, data dir {data_dir}")
        if secure:
            console.print(
                f"     mutual TLS (certificates in {secure.pki.ca.parent}); access: "
                "cn:alice admin on demo.*, cn:bob read on demo.*"
            )
        client = stack.enter_context(
            StreamClient("127.0.0.1", srv.port, tls=secure.client("alice") if secure else None)
        )

        name = client.create_stream("demo.orders", partitions=3)
        console.print(f"[bold]2.[/] created stream [cyan]{name}[/] with 3 partitions")
        for a, addr in sorted(client.addresses.map.items()):
            console.print(f"     partition {a[1]} → worker address [dim]{route_text(addr)}[/]")

        pushed = Table("partition", "index", "data", title="3. pushed (PushConfirm)")
        for i in range(6):
            p = i % 3
            data = f"order {i}".encode()
            idx = client.push(name, data, partition=p)
            pushed.add_row(str(p), str(idx), data.decode())
        console.print(pushed)

        pulled = Table("partition", "index", "data", title="4. pulled (PullRequest index 0)")
        for p in range(3):
            for m in client.pull(name, 0, 10, partition=p):
                pulled.add_row(str(p), str(m.index), m.data.decode())
        console.print(pulled)

        first = client.get_index("billing", name, partition=1)
        saved = client.save_index("billing", name, 1, partition=1)
        kept = client.save_index("billing", name, 0, partition=1)
        console.print(
            f"[bold]5.[/] consumer 'billing' on partition 1: first get → {first}, "
            f"save 1 → {saved}, save 0 → {kept} (monotonic: unchanged)"
        )
        # the saved index is the next one to read: a restarted consumer resumes from it
        rest = client.pull(name, saved, 10, partition=1)
        console.print(
            f"[bold]6.[/] consumer restarts on partition 1 and pulls from its saved index "
            f"{saved}: {[m.data.decode() for m in rest]}"
        )
        if secure:
            with StreamClient("127.0.0.1", srv.port, tls=secure.client("bob")) as bob:
                seen = len(bob.pull(name, 0, 10, partition=1))
                try:
                    bob.push(name, b"from bob", partition=1)
                    outcome = "accepted (unexpected)"
                except PermissionDenied as e:
                    outcome = f"refused: {e}"
            console.print(
                f"[bold]6b.[/] bob (read-only) pulls {seen} records from partition 1; "
                f"his push is {outcome}"
            )
        if spark:
            _demo_spark(console, data_dir, name)
        console.print("[bold green]demo done[/]; stopping the service")


@dataclass
class _DemoTls:
    pki: TestPki
    server: ssl.SSLContext
    policy: AccessPolicy

    def client(self, who: str) -> ssl.SSLContext:
        cert, key = self.pki.clients[who]
        return client_context(self.pki.ca, cert, key)


def _demo_tls(data_dir: Path) -> _DemoTls:
    """Test certificates (alice, bob) beside the demo's data, and who may do what."""
    pki = write_test_pki(data_dir / "demo-pki", ("alice", "bob"))
    policy = AccessPolicy.from_dict(
        {
            "grant": [
                {"identities": ["cn:alice"], "streams": ["demo.*"], "allow": ["admin"]},
                {"identities": ["cn:bob"], "streams": ["demo.*"], "allow": ["read"]},
            ]
        }
    )
    return _DemoTls(pki, server_context(pki.server_cert, pki.server_key, pki.ca), policy)


def _demo_spark(console: Console, data_dir: Path, stream: str) -> None:
    """7. The history the service just stored, read by the pipeline while the service runs: the
    lake is Spark's, and the live tail comes from the log read-only."""
    from loglake.pipeline import build_session, read
    from loglake.pipeline.errors import JavaNotFound

    console.print("[bold]7.[/] reading the stream with Spark (local[*]) …")
    try:
        session = build_session(app_name="loglake-demo")
    except JavaNotFound as e:
        console.print(f"     skipped: {e}")
        return
    try:
        df = read(session, str(data_dir), stream)
        rows = df.groupBy("partition").count().orderBy("partition").collect()
    except BaseException as e:
        # Ctrl-C: stopped by the command's clean-up, off this thread, whose connection to the
        # JVM the interrupted call may have left unusable (pipeline.session)
        if not isinstance(e, KeyboardInterrupt):
            session.stop()
        raise
    session.stop()
    console.print(f"     read(spark, data_dir, {stream!r}).groupBy('partition').count():")
    table = Table("partition", "records")
    for r in rows:
        table.add_row(str(r["partition"]), str(r["count"]))
    console.print(table)
