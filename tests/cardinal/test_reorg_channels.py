"""Reorg channels as the spec's producer writes them, through ``StreamConsumer`` over the real
stream layer (``LocalStreams(MemoryLog())``), each bounded in rounds:

- a channel read while it is still being written is read on to its ReorgComplete (it was
  abandoned at its end: the app's chain stayed at the ancestor's first blocks until a restart);
- a second deep reorg to the same ancestor (A→B→A′, an honest ``ChainProducer``; the channel is
  named by the ancestor only, ``%s-re-%x``) is applied, and a redundant producer's copy of a
  segment is still not (the second reorg was taken for a copy: the chain stayed on B);
- a Reorg naming an older common ancestor than the fork point: the blocks the two branches
  share, which the channel re-sends, are added back (they were dropped as done/old branch);
- a ReorgComplete read off its reorg channel, or before its Reorg, is ignored (it was applied:
  a reorg notice for a reorg never started, and the real Reorg then counted as a repeat).
"""

from __future__ import annotations

from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
from loglake.cardinal.codec import encode
from loglake.cardinal.messages import ZERO_HASH, ReorgComplete
from loglake.cardinal.ordering import Checkpoint
from loglake.cardinal.producer import BlockPayload, ChainProducer, Producer
from loglake.cardinal.synthetic import schema_for, topics_for
from loglake.cardinal.transport import (
    StreamConsumer,
    StreamProducer,
    StreamTransport,
    partition_for,
)
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.cardinal.helpers import ChainModel, seg

T = 8
ROUNDS = 50


def consumer(streams) -> StreamConsumer:
    return StreamConsumer(
        StreamTransport(streams, 3),
        topics_for("chain"),
        "c1",
        T,
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )


class App:
    """The application: applies what ``poll`` returns, counting adds and removes per block."""

    def __init__(self) -> None:
        self.model = ChainModel([])
        self.removed: dict[bytes, int] = {}
        self.events: list[ReorgEvent] = []

    def apply(self, updates) -> None:
        for u in updates:
            if isinstance(u, ReorgEvent):
                self.events.append(u)
                gone = []  # a reorg deeper than the window: the app reverts to the ancestor
                if not u.complete and u.hash in self.model.chain:
                    gone = self.model.chain[self.model.chain.index(u.hash) + 1 :]
            else:
                assert isinstance(u, ChainUpdate)
                gone = [r.hash for r in u.removed]
            for h in gone:
                self.removed[h] = self.removed.get(h, 0) + 1
            self.model.apply(u)

    def drain(self, c: StreamConsumer) -> None:
        for _ in range(ROUNDS):  # bounded: a round per poll
            before = (dict(c.positions), c.core.head)
            self.apply(c.poll())
            if (dict(c.positions), c.core.head) == before and not c.paused:
                return

    def check(self, want: list[BlockPayload]) -> None:
        hashes = [b.hash for b in want]
        assert self.model.chain == hashes, (
            f"app chain {len(self.model.chain)} blocks, the producer's {len(hashes)}"
        )
        final = set(hashes)
        for h, n in self.model.added.items():  # each block once per time it was installed
            assert n == self.removed.get(h, 0) + (h in final), (h.hex()[:12], n)
        for h in final:
            assert self.model.added.get(h, 0) >= 1 or h == hashes[0]


def _forked():
    """Blocks 0–9 then branch A (20 blocks) sent on ``chain``; branch B (25, heavier) on the same
    ancestor not sent yet: (streams, transport, producer, stream producer, base, ancestor, B)."""
    streams = LocalStreams(MemoryLog())
    tr = StreamTransport(streams, 3)
    prod = Producer("chain", schema_for("chain"))
    sp = StreamProducer(tr, prod)
    base = seg(None, 10, "g", 0, 1)
    x = base[-1]
    a = seg(x, 20, "A", x.weight, 1)
    b = seg(x, 25, "B", x.weight, 2)
    for blk in base + a:
        sp.send_block(blk)
    return streams, tr, prod, sp, base, x, b


def test_a_channel_still_being_written_is_read_on_to_its_reorg_complete():
    streams, tr, prod, sp, base, x, b = _forked()
    ch, msgs = prod.reorg_channel(x.number, x.hash, b)
    half = len(msgs) // 2
    tr.send_channel(ch, [encode(m) for m in msgs[:half]])  # the Reorg and the first blocks
    tr.send("chain", [encode(msgs[0])])  # the Reorg on the default topic
    c = consumer(streams)
    app = App()
    app.drain(c)
    assert c.core.head is not None and c.core.head.number < b[-1].number  # the rest not written
    c.commit()  # a consumer waiting on a channel still commits (the checkpoint resumes it)
    tr.send_channel(ch, [encode(m) for m in msgs[half:]])  # the rest + ReorgComplete
    tail = seg(b[-1], 5, "tail", b[-1].weight, 1)
    for blk in tail:
        sp.send_block(blk)
    app.drain(c)
    app.check(base + b + tail)
    assert [e.complete for e in app.events] == [False, True]
    assert c.core.ordering.held == 0


def test_a_checkpoint_taken_while_waiting_resumes_the_channel():
    streams, tr, prod, _, base, x, b = _forked()
    ch, msgs = prod.reorg_channel(x.number, x.hash, b)
    tr.send_channel(ch, [encode(m) for m in msgs[:40]])
    tr.send("chain", [encode(msgs[0])])
    first = consumer(streams)
    app = App()
    app.drain(first)
    first.commit()
    tr.send_channel(ch, [encode(m) for m in msgs[40:]])
    second = consumer(streams)  # resumes from the commit, taken while waiting
    app.drain(second)
    app.check(base + b)


def flipflop(producers: int) -> tuple[LocalStreams, list[BlockPayload]]:
    """A→B→A′ with both reorgs deeper than T to the same ancestor, each of ``producers``
    redundant ``ChainProducer``s sending the whole chain in turn."""
    streams = LocalStreams(MemoryLog())
    base = seg(None, 10, "g", 0, 1)
    x = base[-1]
    a = seg(x, 20, "A", x.weight, 1)
    b = seg(x, 25, "B", x.weight, 2)  # heavier: a reorg of depth 20 > T
    a2 = a + seg(a[-1], 30, "A2", a[-1].weight, 5)  # A again, heavier than B: depth 25 > T
    tail = seg(a2[-1], 5, "tail", a2[-1].weight, 1)
    for _ in range(producers):
        planner = ChainProducer(Producer("chain", schema_for("chain")), T)
        sp = StreamProducer(StreamTransport(streams, 3), planner.producer)
        channels = []
        for branch in (base, a, b, a2, tail):
            em = planner.branch(branch)
            channels.append(em.channel)
            sp.send_emission(em)
        assert channels[2] is not None and channels[2] == channels[3]  # one channel name
    return streams, base + a2 + tail


def test_a_second_deep_reorg_to_the_same_ancestor_is_applied():
    streams, want = flipflop(1)
    c = consumer(streams)
    app = App()
    app.drain(c)
    app.check(want)
    assert [e.complete for e in app.events] == [False, True, False, True]
    assert c.core.ordering.held == 0


def test_a_redundant_producers_copy_of_each_segment_changes_nothing():
    streams, want = flipflop(2)
    c = consumer(streams)
    app = App()
    app.drain(c)
    app.check(want)
    # two reorgs, each applied once: the second producer's copies are skipped
    assert [e.complete for e in app.events] == [False, True, False, True]


def test_a_restart_after_each_round_of_a_flipflop():
    streams, want = flipflop(2)
    app = App()
    for _ in range(ROUNDS):  # commit and restart after every round
        c = consumer(streams)
        app.apply(c.poll(limit=16))
        c.commit()
        if c.core.head is not None and c.core.head.hash == want[-1].hash:
            break
    app.drain(consumer(streams))
    app.check(want)


def test_a_reorg_to_an_older_common_ancestor_adds_the_shared_blocks_back():
    streams = LocalStreams(MemoryLog())
    planner = ChainProducer(Producer("chain", schema_for("chain")), T)
    sp = StreamProducer(StreamTransport(streams, 3), planner.producer)
    base = seg(None, 10, "g", 0, 1)
    a = seg(base[-1], 20, "A", base[-1].weight, 1)  # #10..#29
    b = seg(a[14], 25, "B", a[14].weight, 2)  # forks at #24
    for branch in (base, a):
        sp.send_emission(planner.branch(branch))
    em = planner.branch(a[:15] + b)  # the new chain from #10 on: the Reorg names #9
    assert em.channel is not None and em.channel_messages[0].number == 9
    sp.send_emission(em)
    tail = seg(b[-1], 5, "tail", b[-1].weight, 1)
    sp.send_emission(planner.branch(tail))
    c = consumer(streams)
    app = App()
    app.drain(c)
    app.check(base + a[:15] + b + tail)
    assert c.core.ordering.held == 0


def test_a_reorg_complete_off_its_channel_is_ignored():
    streams = LocalStreams(MemoryLog())
    tr = StreamTransport(streams, 3)
    planner = ChainProducer(Producer("chain", schema_for("chain")), T)
    sp = StreamProducer(tr, planner.producer)
    base = seg(None, 10, "g", 0, 1)
    x = base[-1]
    a = seg(x, 20, "A", x.weight, 1)
    b = seg(x, 25, "B", x.weight, 2)
    for branch in (base, a, b):
        sp.send_emission(planner.branch(branch))
    k, v = encode(ReorgComplete(x.hash, x.number))
    # a careless copy on the default topic, on another partition than the Reorg: read first
    assert partition_for(k, 3) != partition_for(b"\x05" + x.hash, 3)
    tr.send("chain", [(k, v)])
    tail = seg(b[-1], 5, "tail", b[-1].weight, 1)
    sp.send_emission(planner.branch(tail))
    c = consumer(streams)
    app = App()
    app.drain(c)
    app.check(base + b + tail)
    assert [e.complete for e in app.events] == [False, True]
    assert c.core.ignored_reorg_completes == 1
