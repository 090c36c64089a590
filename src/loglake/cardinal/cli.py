"""``loglake cardinal``: produce a synthetic chain, consume it as blocks and reorgs.

Both commands talk to a running ``loglake serve`` (``--host/--port``, through
``loglake.streams.client.StreamClient``) or to an embedded log (``--data-dir``). The logic
lives in ``produce_chain``/``consume_topic`` so tests drive it without a terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from loglake.cardinal.blocks import Block, BlockRef, ChainUpdate, ReorgEvent
from loglake.cardinal.consumer import DEFAULT_REORG_THRESHOLD, MAX_REORG_THRESHOLD
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint
from loglake.cardinal.producer import BlockPayload, ChainProducer, Producer
from loglake.cardinal.synthetic import ReorgStep, schema_for, synthetic_chain, topics_for
from loglake.cardinal.transport import (
    DEFAULT_PARTITIONS,
    StreamConsumer,
    StreamProducer,
    StreamTransport,
)
from loglake.clitools import PORT, SECONDS
from loglake.errors import LocalProtocolError
from loglake.streams.api import LocalStreams, Streams
from loglake.streams.fence import UNFENCED, Fence
from loglake.streams.nats_url import backend_url
from loglake.streams.service import MAX_PARTITIONS


@contextmanager
def open_streams(host: str | None, port: int | None, data_dir: str | None) -> Iterator[Streams]:
    """A ``Streams`` on a remote node or an embedded log (exactly one of the two)."""
    if data_dir and (host or port):
        raise LocalProtocolError("give either --data-dir or --host/--port, not both")
    if data_dir:
        from loglake.log import open_log

        log = open_log(data_dir)
        try:
            yield LocalStreams(log)
        finally:
            log.close()
        return
    from loglake.streams.client import DEFAULT_PORT, StreamClient  # lazily: a remote node
    from loglake.streams.retry import RetryingStreams

    # a restarting node is waited for; a push repeated after a lost connection is harmless:
    # the consumer assembles each block exactly once from duplicate messages
    client = RetryingStreams(
        lambda: StreamClient(host or "127.0.0.1", port or DEFAULT_PORT), repeat_pushes=True
    )
    try:
        yield client
    finally:
        client.close()


@contextmanager
def _interrupt_between_rounds() -> Iterator[None]:
    """A first Ctrl-C (SIGINT) inside is raised as ``KeyboardInterrupt`` on the way out, once the
    round is read and handed over, so the commit after it is exact; a second one at once (a
    round waiting on a node that does not answer). Only where Python's own handler is in
    place, on the main thread (signals go nowhere else)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    hit: list[int] = []

    def defer(signum: int, frame: object) -> None:
        if hit:
            raise KeyboardInterrupt
        hit.append(signum)

    previous = signal.signal(signal.SIGINT, defer)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if hit:
            raise KeyboardInterrupt


def produce_chain(
    streams: Streams,
    topic: str,
    blocks: int,
    partitions: int | None = None,
    deep_reorg: int = 0,
    sub_items: int = 2,
    reorg_threshold: int = DEFAULT_REORG_THRESHOLD,
    on_step: Callable[[BlockPayload | ReorgStep], None] | None = None,
    on_steps: Callable[[int], None] | None = None,
) -> tuple[int, list[BlockPayload]]:
    """Send a synthetic chain; return (messages sent, the canonical chain). The producer
    decides which branches are reorgs past ``reorg_threshold`` (``ChainProducer``). ``on_steps``
    is told how many steps (blocks, or reorg branches) there are, ``on_step`` of each once sent.
    A missing
    topic is created with ``partitions`` (default ``DEFAULT_PARTITIONS``); an existing one keeps
    its count (``PartitionMismatch`` if ``partitions`` is given and differs)."""
    chain = synthetic_chain(blocks, deep_reorg=deep_reorg, sub_items=sub_items)
    producer = Producer(topic, schema_for(topic))
    cp = StreamProducer(StreamTransport(streams, partitions), producer)
    planner = ChainProducer(producer, reorg_threshold)
    if on_steps:
        on_steps(len(chain.steps))
    for step in chain.steps:
        branch = list(step.blocks) if isinstance(step, ReorgStep) else [step]
        cp.send_emission(planner.branch(branch))
        if on_step:
            on_step(step)
    return cp.sent, chain.canonical


def consume_topic(
    streams: Streams,
    topic: str,
    client_id: str,
    partitions: int | None = None,
    reorg_threshold: int = DEFAULT_REORG_THRESHOLD,
    prefixes: tuple[str, ...] = (".*",),
    idle_seconds: float = 0.0,
    max_seconds: float = 3600.0,
    on_event: Callable[[ChainUpdate | ReorgEvent], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    commit_seconds: float = 1.0,
    fence: Fence = UNFENCED,
    on_commit: Callable[[StreamConsumer], None] | None = None,
) -> StreamConsumer:
    """Consume ``topic`` (and its companion topics) from the saved checkpoint; commit a
    checkpoint at most every ``commit_seconds`` (each is one record in the checkpoint stream)
    and on the way out; stop when nothing new came for ``idle_seconds`` (0: once caught up).
    Partition counts are read from the streams; ``partitions``, if given, is checked.

    ``fence``: the member's lease (``member.consume_held``); checkpoints go through it, and
    the loop stops, committing nothing more, as soon as it is not held."""
    consumer = StreamConsumer(
        StreamTransport(streams, partitions, fence),
        topics_for(topic),
        client_id,
        reorg_threshold,
        prefixes,
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )
    start = last_new = last_commit = clock()
    dirty = False

    def commit() -> None:
        consumer.commit()
        if on_commit is not None:
            on_commit(consumer)

    # Found from outside: Ctrl-C (or any error) in this loop skipped the last commit, so a
    # restart emitted again every block handed over since the previous one (497 duplicate
    # lines in one run). Now the way out commits what ``on_event`` was handed: Ctrl-C takes
    # effect between rounds (``_interrupt_between_rounds``), so that commit is exact. Where a
    # round was cut short (an error, a second Ctrl-C) updates are left undelivered or a reorg
    # channel half read, the consumer refuses the commit (``UndeliveredUpdates``; ``UpdatesLost``
    # if the cut came while a message was applied) and the previous one stands: the restart
    # hands those blocks again, never skips them.
    try:
        while clock() - start < max_seconds:
            if not fence.holds():
                return consumer  # another member holds it now: nothing more is ours to commit
            before = dict(consumer.positions)
            with _interrupt_between_rounds():
                events = consumer.poll()
                handed = 0
                try:
                    for ev in events:
                        if on_event:
                            on_event(ev)
                        handed += 1
                finally:
                    consumer.give_back(events[handed:])
            if consumer.positions != before or consumer.paused:
                dirty = True
                last_new = clock()
                if last_new - last_commit >= commit_seconds:
                    commit()
                    dirty, last_commit = False, last_new
                continue
            if dirty:
                commit()
                dirty, last_commit = False, clock()
            if clock() - last_new >= idle_seconds:
                break
            sleep(min(0.2, idle_seconds))
    except BaseException:
        if fence.holds():
            with contextlib.suppress(Exception):  # the error on its way out is the one to tell
                commit()
        raise
    if dirty:
        commit()
    return consumer


def _short(b: Block | BlockRef) -> str:
    return f"#{b.number} {b.hash.hex()[:16]}"


_connection = [
    click.option("--host", default=None, help="Host of a running `loglake serve`."),
    click.option("--port", type=PORT, default=None, help="Port of a running `loglake serve`."),
    click.option(
        "--data-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Use the embedded log in this folder instead of a server.",
    ),
    click.option(
        "--partitions",
        type=click.IntRange(1, MAX_PARTITIONS),  # past it: a topic no stream service serves
        default=None,
        help=f"Partitions per topic. Optional: a topic's count is read from the stream; the "
        f"producer creates a missing topic with this many (default {DEFAULT_PARTITIONS}); an "
        "existing topic with another count is an error.",
    ),
]


REORG_THRESHOLD = click.IntRange(1, MAX_REORG_THRESHOLD)


def _regexes(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """Each of ``value`` must compile: found from outside, ``--prefix '('`` ended in a 61-line
    ``re.error`` traceback from deep in the consumer instead of a usage error."""
    for p in value:
        try:
            re.compile(p)
        except re.error as e:
            raise click.BadParameter(f"{p!r} is not a regular expression: {e}") from None
    return value


"""The application's ReorgThreshold, as ``job cardinal-blocks`` takes it: blocks kept for reorgs
(``-1`` and ``0`` were taken: a producer's reorg block numbered ``-1`` failed the Avro codec)."""

MAX_BLOCKS = 1_000_000
"""The longest synthetic chain ``produce --blocks`` makes (and the deepest ``--deep-reorg``).
The chain is built whole in memory before a message is sent, about 1.8 KB a block at the
default ``--sub-items``: 1.8 GB at this many. Its block numbers then stay far inside the Avro
``int`` a Reorg carries (int32); without a ceiling ``--blocks 10**12`` built blocks until memory
ran out."""
MAX_SUB_ITEMS = 100_000
"""The most items one block's sub-batch holds (``produce --sub-items``): all of them are built in
memory with the chain, about 125 bytes each, and sent as one block's sub-batch messages."""
MAX_CHAIN_SUB_ITEMS = 10_000_000
"""Sub-batch items of the whole chain (``--blocks`` × ``--sub-items``), about 1.25 GB: each option
within its own ceiling could still ask for 10^11 items held at once."""

F = TypeVar("F", bound=Callable[..., Any])


def _with_connection(f: F) -> F:
    for opt in reversed(_connection):
        f = opt(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Cardinal Streams: block payloads as messages over partitioned loglake streams."""


@command.command()
@click.option(
    "--blocks",
    type=click.IntRange(1, MAX_BLOCKS),
    required=True,
    help="How many block payloads to produce.",
)
@click.option("--topic", required=True, help="Default topic (sub-batches go to TOPIC.state).")
@click.option(
    "--deep-reorg",
    type=click.IntRange(0, MAX_BLOCKS),
    default=0,
    help="End with a reorg of this depth.",
)
@click.option(
    "--sub-items",
    type=click.IntRange(0, MAX_SUB_ITEMS),
    default=2,
    show_default=True,
    help=f"Items per sub-batch (--blocks × --sub-items at most {MAX_CHAIN_SUB_ITEMS:,}).",
)
@click.option(
    "--reorg-threshold",
    type=REORG_THRESHOLD,
    default=DEFAULT_REORG_THRESHOLD,
    show_default=True,
    help="Reorgs deeper than this go through a reorg channel.",
)
@_with_connection
def produce(
    blocks: int,
    topic: str,
    deep_reorg: int,
    sub_items: int,
    reorg_threshold: int,
    host: str | None,
    port: int | None,
    data_dir: str | None,
    partitions: int | None,
) -> None:
    """Produce a synthetic chain with forks, reorgs and sub-batches."""
    if blocks * sub_items > MAX_CHAIN_SUB_ITEMS:  # checked before any stream is opened
        raise click.BadParameter(
            f"{sub_items:,} items a block for {blocks:,} blocks is over the chain's "
            f"{MAX_CHAIN_SUB_ITEMS:,} items (all held in memory at once)",
            param_hint="'--sub-items'",
        )
    console = Console()
    err = Console(stderr=True)
    # Found from outside: 20,000 blocks took 39 s with nothing on the screen. The bar goes to
    # stderr and only to a terminal, so piped output stays the one summary line.
    with (
        Progress(
            TextColumn(f"producing [bold]{escape(topic)}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as bar,
        open_streams(host, port, data_dir) as streams,
    ):
        task = bar.add_task("produce", total=None)
        sent, canonical = produce_chain(
            streams,
            topic,
            blocks,
            partitions,
            deep_reorg,
            sub_items,
            reorg_threshold,
            on_step=lambda _step: bar.advance(task),
            on_steps=lambda n: bar.update(task, total=n),
        )
    head = canonical[-1]
    console.print(
        f"[green]sent[/] {sent} messages for {blocks} blocks to [bold]{topic}[/]; "
        f"canonical head #{head.number} {head.hash.hex()[:16]}"
    )


@command.command()
@click.option("--topic", required=True, help="Default topic to consume (and TOPIC.state).")
@click.option("--client-id", default="cardinal-cli", show_default=True, help="Checkpoint owner.")
@click.option(
    "--reorg-threshold",
    type=REORG_THRESHOLD,
    default=DEFAULT_REORG_THRESHOLD,
    show_default=True,
    help="Blocks kept for reorgs; older incomplete batches are evicted.",
)
@click.option(
    "--prefix",
    "prefixes",
    multiple=True,
    callback=_regexes,
    help="Track only these prefix regexes.",
)
@click.option(
    "--idle-seconds",
    type=SECONDS,  # nan, inf: polled until the hour's cap instead of stopping
    default=0.0,
    show_default=True,
    help="Keep polling until nothing new came for this long.",
)
@click.option("--quiet", is_flag=True, help="Print only the summary.")
@click.option(
    "--commit-seconds",
    type=SECONDS,  # nan, inf: no checkpoint while blocks came
    default=1.0,
    show_default=True,
    help="Commit a checkpoint at most this often while blocks come (0: after every round).",
)
@click.option(
    "--backend",
    default=None,
    callback=backend_url,
    metavar="nats://H1,H2,...",
    help="Consume from NATS JetStream directly, as one member of a group held by a lease: "
    "start several for one --client-id; one consumes, the others stand by and take over "
    "within --lease-ttl when it dies.",
)
@click.option(
    "--nats-prefix",
    default="loglake",
    show_default=True,
    help="With --backend: the streams' namespace (a node's [streams] nats_prefix).",
)
@click.option(
    "--lease-ttl",
    type=click.IntRange(min=1, max=3600),
    default=5,
    show_default=True,
    help="With --backend: seconds a dead member keeps the lease before a standby takes over.",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1, max=5),
    default=1,
    show_default=True,
    help="With --backend: replicas of the lease bucket if this member creates it.",
)
@_with_connection
def consume(
    topic: str,
    client_id: str,
    reorg_threshold: int,
    prefixes: tuple[str, ...],
    idle_seconds: float,
    quiet: bool,
    commit_seconds: float,
    backend: str | None,
    nats_prefix: str,
    lease_ttl: int,
    replicas: int,
    host: str | None,
    port: int | None,
    data_dir: str | None,
    partitions: int | None,
) -> None:
    """Print blocks and reorgs as they complete; resume from the saved checkpoint."""
    if data_dir and not os.path.isdir(data_dir):
        # Found from outside: a mistyped --data-dir made a fresh, empty log and reported
        # "head #-1"; reading never creates one (``produce`` does)
        raise click.BadParameter(
            f"{data_dir!r} is not a data directory (`loglake cardinal produce` creates one)",
            param_hint="'--data-dir'",
        )
    console = Console()
    counts = {"added": 0, "removed": 0, "reorgs": 0}

    def show(ev: ChainUpdate | ReorgEvent) -> None:
        if isinstance(ev, ReorgEvent):
            counts["reorgs"] += 0 if ev.complete else 1
            if not quiet:
                what = "reorg complete" if ev.complete else "REORG to"
                console.print(f"[magenta]{what}[/] #{ev.number} {ev.hash.hex()[:16]}")
            return
        counts["removed"] += len(ev.removed)
        counts["added"] += len(ev.added)
        if quiet:
            return
        for b in ev.removed:
            console.print(f"[red]- {_short(b)}[/]")
        for b in ev.added:
            console.print(
                f"[green]+ {_short(b)}[/] values={len(b.values)} deletes={len(b.deletes)}"
            )

    if backend:
        if host or port or data_dir:
            raise LocalProtocolError("give either --backend or --host/--port/--data-dir")
        from loglake.cardinal.member import consume_held_cli

        got = consume_held_cli(
            backend,
            nats_prefix,
            lease_ttl,
            replicas,
            console,
            quiet,
            topic,
            client_id,
            partitions=partitions,
            reorg_threshold=reorg_threshold,
            prefixes=prefixes or (".*",),
            idle_seconds=idle_seconds,
            commit_seconds=commit_seconds,
            on_event=show,
        )
        if got is None:
            return
        c = got
    else:
        with open_streams(host, port, data_dir) as streams:
            c = consume_topic(
                streams,
                topic,
                client_id,
                partitions,
                reorg_threshold,
                prefixes or (".*",),
                idle_seconds,
                on_event=show,
                commit_seconds=commit_seconds,
            )
    head = c.core.head
    console.print(
        f"added {counts['added']}, removed {counts['removed']}, deep reorgs {counts['reorgs']}; "
        # the start checkpoint is the chain before block 0 (#-1): no block has come yet
        + (
            f"head #{head.number} {head.hash.hex()[:16]}"
            if head and head.number >= 0
            else "no blocks yet"
        )
    )
    if topic in c.missing_topics:
        console.print(f"[yellow]topic {topic!r} does not exist (yet)[/]: nothing to read")
    conflicting = c.core.consumer.stats.conflicting
    if conflicting:
        console.print(
            f"[red]{conflicting} Batch(es) conflicted with a pending block's first Batch[/]: "
            f"{c.core.consumer.pending} block(s) still incomplete; a forged Batch can hold the "
            "chain there (see the error lines in the log)"
        )
