"""Skewed topics through the real ``StreamConsumer`` (``LocalStreams`` over ``MemoryLog``): an
honest producer whose topics carry very different numbers of messages a block never stalls the
consumer, and memory stays within the caps.

Found from outside: every source was read ``limit`` messages a round, so with ten ``state/``
messages a block on ``chain.state`` and one (the Batch) on ``chain``, the Batch partitions ran
thousands of blocks ahead; past ``max_pending`` the highest Batches were shed, already read and
not remembered, and the consumer stopped for good (``head #11105 of #12999``). The mirror case
(the default topic the heavy one) queued messages past ``max_queued`` (``head #307 of #2999``).
And one Reorg naming an unknown ancestor far above the head stopped its partition as long as a
steady producer kept the others moving."""

from __future__ import annotations

import hashlib
import logging
import time

from loglake.cardinal.blocks import ChainUpdate
from loglake.cardinal.codec import encode
from loglake.cardinal.messages import ZERO_HASH, Reorg
from loglake.cardinal.ordering import Checkpoint
from loglake.cardinal.producer import BlockPayload, Producer
from loglake.cardinal.transport import StreamConsumer, StreamProducer, StreamTransport
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams

TOPICS = ["chain", "chain.state"]
PAUSED_ROUNDS = 16  # transport.PAUSED_ROUNDS (not imported: the test runs on the code before it)


def bh(n: int) -> bytes:
    return hashlib.sha256(b"b%d" % n).digest()


def block(n: int, default_msgs: int, state_msgs: int) -> BlockPayload:
    updates = {f"foo/{n}/{i}": b"v" for i in range(default_msgs)}
    updates.update({f"state/{n}/{i}": b"v" for i in range(state_msgs)})
    return BlockPayload(n, bh(n), bh(n - 1) if n else ZERO_HASH, n, updates)


def produce(
    streams: LocalStreams, first: int, count: int, default_msgs: int, state_msgs: int
) -> None:
    sp = StreamProducer(
        StreamTransport(streams, 3), Producer("chain", {"foo/": "chain", "state/": "chain.state"})
    )
    end = first + count
    for start in range(first, end, 500):
        sp.send_blocks(
            block(n, default_msgs, state_msgs) for n in range(start, min(start + 500, end))
        )


def consumer(streams: LocalStreams, max_pending: int | None, max_queued: int | None):
    c = StreamConsumer(
        StreamTransport(streams),
        TOPICS,
        "c1",
        128,
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )
    if max_pending is not None:
        c.core.consumer.max_pending = max_pending
    if max_queued is not None:
        c.core.consumer.max_queued = max_queued
    return c


class Emitted:
    """What the application saw: every block added exactly once, in order, nothing removed."""

    def __init__(self) -> None:
        self.numbers: list[int] = []

    def take(self, updates: list) -> None:
        for u in updates:
            if isinstance(u, ChainUpdate):
                assert not u.removed
                for b in u.added:
                    assert b.number == len(self.numbers), (b.number, len(self.numbers))
                    assert b.hash == bh(b.number)
                    self.numbers.append(b.number)


def drain(c: StreamConsumer, seen: Emitted, last: int, rounds: int, seconds: float) -> None:
    """Poll until block ``last`` is emitted, checking the caps after every round; fails if it
    takes more than ``rounds`` rounds or ``seconds``, or a round reads nothing before."""
    asm = c.core.consumer
    deadline = time.monotonic() + seconds
    for _ in range(rounds):
        before = dict(c.positions)
        seen.take(c.poll())
        assert asm.pending <= asm.max_pending and asm.queued <= asm.max_queued
        if seen.numbers and seen.numbers[-1] == last:
            return
        moved = c.positions != before or getattr(c, "read_any", False)
        assert moved or c.paused, f"stalled at #{seen.numbers[-1] if seen.numbers else None}"
        assert time.monotonic() < deadline, f"too slow: #{seen.numbers[-1]} of #{last}"
    raise AssertionError(f"#{seen.numbers[-1] if seen.numbers else None} of #{last}")


def test_batch_partitions_read_ahead_of_a_heavy_topic_lose_no_batch():
    """Ten ``state/`` messages a block on ``chain.state``, the Batch alone on ``chain``:
    scaled down (``max_pending`` 600 instead of 10,000: a round reads at most 192 Batches past
    half of it), the same mechanism."""
    streams = LocalStreams(MemoryLog())
    produce(streams, 0, 1500, 0, 10)
    c = consumer(streams, max_pending=600, max_queued=None)
    seen = Emitted()
    drain(c, seen, 1499, rounds=2000, seconds=60)
    assert seen.numbers == list(range(1500))
    assert c.core.consumer.stats.evicted == 0  # held back, not shed


def test_messages_read_ahead_of_a_heavy_default_topic_stay_under_max_queued():
    """The mirror case: twenty ``foo/`` messages a block on ``chain`` (with the Batch), five
    ``state/`` ones on ``chain.state``, which runs ahead: its messages wait for their
    Batches; scaled down (``max_queued`` 500 instead of 100,000)."""
    streams = LocalStreams(MemoryLog())
    produce(streams, 0, 600, 20, 5)
    c = consumer(streams, max_pending=None, max_queued=500)
    seen = Emitted()
    drain(c, seen, 599, rounds=3000, seconds=60)
    assert seen.numbers == list(range(600))
    assert c.core.consumer.stats.evicted == 0


def test_skewed_backlog_at_the_default_caps():
    """The reviewer's case at the default caps (12,500 blocks, ten ``state/`` messages each):
    the Batch partitions would run more than 10,000 blocks ahead."""
    streams = LocalStreams(MemoryLog())
    produce(streams, 0, 12_500, 0, 10)
    c = consumer(streams, max_pending=None, max_queued=None)
    seen = Emitted()
    drain(c, seen, 12_499, rounds=5000, seconds=120)
    assert seen.numbers == list(range(12_500))
    assert c.core.consumer.stats.evicted == 0


def test_a_shed_batch_is_read_again_and_a_restart_does_not_skip_it():
    """Caps so low that holding sources back cannot keep under them (``max_pending`` 4: one
    fetch brings 64 Batches): the Batches shed are read again (their partition goes back),
    and a commit in between never lies past one (restarts every few rounds, each block once
    over all the consumers)."""
    streams = LocalStreams(MemoryLog())
    produce(streams, 0, 240, 0, 6)
    seen = Emitted()
    shed = 0
    for _restart in range(200):
        c = consumer(streams, max_pending=4, max_queued=None)  # resumes from the commit
        for _ in range(7):
            seen.take(c.poll())
            assert c.core.consumer.pending <= 4
        shed += c.core.consumer.stats.evicted
        c.commit()
        if seen.numbers and seen.numbers[-1] == 239:
            break
    assert seen.numbers == list(range(240))
    assert shed > 0  # the caps were passed: this is the shed-and-read-again path


def test_a_reorg_naming_an_unknown_ancestor_far_above_the_head_is_given_up(caplog):
    """A steady producer (more blocks before every round) keeps the other partitions moving:
    the stray Reorg's partition stopped until the chain reached #1,000,000. It gives up after
    ``PAUSED_ROUNDS`` rounds, with a warning naming it, and its partition goes on."""
    streams = LocalStreams(MemoryLog())
    produce(streams, 0, 4, 2, 2)
    StreamTransport(streams).send("chain", [encode(Reorg(b"\xee" * 32, 1_000_000))])
    c = consumer(streams, max_pending=None, max_queued=None)
    seen = Emitted()
    caplog.set_level(logging.WARNING, logger="loglake.cardinal.transport")
    paused_at = resumed_at = None
    for r in range(60):
        produce(streams, 4 + 20 * r, 20, 2, 2)
        seen.take(c.poll())
        if c.paused and paused_at is None:
            paused_at = r
        if paused_at is not None and not c.paused and resumed_at is None:
            resumed_at = r
    assert paused_at == 0
    assert resumed_at is not None and resumed_at <= PAUSED_ROUNDS + 2, resumed_at
    (warning,) = [r for r in caplog.records if "giving up" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert warning.fields["ancestor"] == "ee" * 32  # type: ignore[attr-defined]
    assert warning.fields["number"] == 1_000_000  # type: ignore[attr-defined]
    drain(c, seen, 4 + 20 * 60 - 1, rounds=200, seconds=60)
    assert seen.numbers == list(range(4 + 20 * 60))
    assert c.errors == 1  # the Reorg itself, dropped (UnknownAncestor)
