"""A Cardinal consumer-group member held by a lease: ``loglake cardinal consume --backend
nats://…`` started on several machines (or processes) for one client id — one consumes, the
others stand by, and one of them takes over within the lease TTL when the consumer dies.

Why a lease: a member's checkpoint (``cardinal.ckpt.<client id>``) and offsets are one history
per client id. Two processes consuming for it at once would each apply every block and commit
over each other's checkpoints; the application would see blocks twice. The lease
(``cardinal.<client id>`` in the cluster's lease bucket, ``<prefix>_leases``, the one the
node's leases live in) says who consumes, and its fence (``streams.lease.LeaseFence``) guards
the checkpoint stream: a member paused past its lease (SIGSTOP, a long GC) and resumed commits
nothing — its checkpoint append is refused — so the member that took over resumes from the
last checkpoint it can trust, and each committed block is applied once.

The consumer's exactly-once unit is the commit, as in the Cardinal reference consumer: blocks
applied after a member's last commit are applied again by the member that takes over (the dead
member's application state after its commit is lost with it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
from loglake.cardinal.consumer import DEFAULT_REORG_THRESHOLD
from loglake.cardinal.transport import StreamConsumer
from loglake.errors import LocalProtocolError
from loglake.streams.jetstream import JetStreamLog, JetStreamStreams
from loglake.streams.lease import JetStreamLease, LeaseCore, LeaseFence, LeaseLost

LEASE_PREFIX = "cardinal."
STANDBY_POLL = 0.1
"""Seconds between a standby member's looks at its lease (a local read, no request)."""


def member_lease(client_id: str) -> str:
    """The lease a member of ``client_id`` holds; ``LocalProtocolError`` for a client id that
    cannot name one (it becomes a JetStream KV key)."""
    name = LEASE_PREFIX + client_id
    try:
        LeaseCore(name, "check")
    except ValueError:
        raise LocalProtocolError(
            f"client id {client_id!r} cannot name a lease: use letters, digits and - _ = / ."
        ) from None
    return name


def checkpoint_stream(client_id: str) -> str:
    """The stream a member's checkpoints go to (``StreamTransport``'s name for it)."""
    return f"cardinal.ckpt.{client_id}"


def open_member(
    log: JetStreamLog, client_id: str, holder: str, *, ttl: int, replicas: int = 1
) -> LeaseFence:
    """Contend for the lease of ``client_id`` on ``log``'s cluster; the fence guarding its
    checkpoint stream (attached before the lease starts, so each acquisition claims it)."""
    name = member_lease(client_id)
    bucket = f"{log.options.prefix}_leases"

    async def start() -> LeaseFence:
        lease = JetStreamLease(log.js, bucket, name, holder, ttl=ttl, replicas=replicas)
        fence = LeaseFence(log, lease, (checkpoint_stream(client_id),))
        await lease.start()
        return fence

    return log.call(start())


def consume_held(
    log: JetStreamLog,
    fence: LeaseFence,
    topic: str,
    client_id: str,
    *,
    partitions: int | None = None,
    reorg_threshold: int = DEFAULT_REORG_THRESHOLD,
    prefixes: tuple[str, ...] = (".*",),
    idle_seconds: float = 0.0,
    max_seconds: float = float("inf"),
    commit_seconds: float = 1.0,
    on_event: Callable[[ChainUpdate | ReorgEvent], None] | None = None,
    on_commit: Callable[[StreamConsumer], None] | None = None,
    on_status: Callable[[str, str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StreamConsumer | None:
    """Stand by until this process holds the member's lease, then consume as
    ``cli.consume_topic`` does (from the checkpoint, committing through the fence); on losing
    the lease drop the consumer's state and stand by again. Returns the consumer once it has
    been idle ``idle_seconds`` while holding, None after ``max_seconds`` without that.
    ``on_status(state, detail)``: ``standby``, ``holding``, ``lost``."""
    from loglake.cardinal.cli import consume_topic

    def status(state: str, detail: str) -> None:
        if on_status is not None:
            on_status(state, detail)

    streams: Any = JetStreamStreams(log)
    start = clock()
    waiting = False
    while (left := max_seconds - (clock() - start)) > 0:
        if not fence.holds():
            if not waiting:
                status("standby", f"another member holds lease {fence.name!r}")
                waiting = True
            sleep(STANDBY_POLL)
            continue
        waiting = False
        status("holding", f"lease {fence.name!r} (token {fence.tenure()})")
        try:
            consumer = consume_topic(
                streams,
                topic,
                client_id,
                partitions,
                reorg_threshold,
                prefixes,
                idle_seconds,
                left,
                on_event=on_event,
                clock=clock,
                sleep=sleep,
                commit_seconds=commit_seconds,
                fence=fence,
                on_commit=on_commit,
            )
        except LeaseLost as e:
            status("lost", str(e))
            continue
        if fence.holds():
            return consumer
        status("lost", f"lease {fence.name!r} expired; nothing committed since")
    return None


def consume_held_cli(
    url: str,
    prefix: str,
    ttl: int,
    replicas: int,
    console: Any,
    quiet: bool,
    topic: str,
    client_id: str,
    **options: Any,
) -> StreamConsumer | None:
    """``loglake cardinal consume --backend``: connect, contend, consume while holding (status
    lines on ``console``, one per change, and ``committed #N`` after each commit unless
    ``quiet``); hand the lease over on the way out (SIGTERM and Ctrl-C included), so a
    standby takes over at once instead of after the TTL."""
    import contextlib
    import os
    import signal
    import socket

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def status(state: str, detail: str) -> None:
        console.print(f"[cyan]{state}[/] {detail}", highlight=False)

    def committed(consumer: StreamConsumer) -> None:
        if not quiet:
            head = consumer.core.head
            console.print(f"committed #{head.number}" if head else "committed", highlight=False)

    member_lease(client_id)  # a bad client id fails before any connection
    holder = f"{socket.gethostname()}-{os.getpid()}"
    log = JetStreamLog(url, prefix=prefix, replicas=replicas)
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        fence = open_member(log, client_id, holder, ttl=ttl, replicas=replicas)
        try:
            return consume_held(
                log,
                fence,
                topic,
                client_id,
                on_status=status,
                on_commit=committed,
                **options,
            )
        finally:
            with contextlib.suppress(Exception):  # a cluster gone: it expires after its ttl
                log.call(fence.lease.release(), timeout=fence.lease.timeout * 2)
    finally:
        signal.signal(signal.SIGTERM, previous)
        log.close()
