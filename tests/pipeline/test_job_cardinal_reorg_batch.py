"""cardinal-blocks (no Spark needed): in one micro-batch every block assembled is ordered before
the micro-batch's Reorg is applied (``BatchWriter._process``), so blocks produced after the
Reorg (extending its channel's branch) are held as orphans when it comes. The Reorg forgot them,
and the assembler's tombstones kept them from coming back: the chain stopped at the channel's
last block, every record in order in one partition. They are kept now."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loglake.cardinal.codec import encode
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.producer import BlockPayload, Producer
from loglake.cardinal.transport import envelope
from loglake.pipeline.jobs.cardinal_blocks import BatchWriter, CardinalBlocksOptions
from tests.cardinal.helpers import seg

THR = 2


def blk(n, parent, weight, tag, parent_hash=None):
    ph = parent.hash if parent is not None else ZERO_HASH
    h = hashlib.sha256(f"{tag}{n}".encode() + ph).digest()
    return BlockPayload(n, h, ph, weight, {f"foo/{tag}{n}": b"x"})


def test_blocks_after_a_deep_reorg_in_the_same_micro_batch(tmp_path, monkeypatch):
    p = Producer("chain", {"foo/": "chain"})
    a = [blk(0, None, 0, "a")]
    for n in range(1, 7):
        a.append(blk(n, a[-1], n * 10, "a"))
    anc = a[2]  # depth 4 > THR: reorg channel
    b = [anc]
    for n in range(3, 8):
        b.append(blk(n, b[-1], 1000 + n, "b"))
    c8 = blk(8, b[-1], 2000, "c")
    c9 = blk(9, c8, 2010, "c")
    channel, chan = p.reorg_channel(anc.number, anc.hash, b[1:])

    recs = []  # the default topic, ONE partition, in production order
    for x in a:
        for _, ms in sorted(p.block_messages(x).items()):
            recs += [encode(m) for m in ms]
    recs.append(encode(chan[0]))  # the Reorg on the default topic (after its channel)
    for x in (c8, c9):
        for _, ms in sorted(p.block_messages(x).items()):
            recs += [encode(m) for m in ms]
    table = pa.table(
        {
            "data": pa.array([envelope(k, v) for k, v in recs], pa.binary()),
            "t": pa.array([0] * len(recs), pa.int32()),
            "partition": pa.array([0] * len(recs), pa.int32()),
            "offset": pa.array(range(len(recs)), pa.int64()),
            "ts": pa.array([-1] * len(recs), pa.int64()),
        }
    )
    channel_records = [(i, envelope(*encode(m))) for i, m in enumerate(chan)]
    monkeypatch.setattr(
        BatchWriter, "_channel", lambda self, name: channel_records if name == channel else []
    )
    opts = CardinalBlocksOptions(
        str(tmp_path), ("chain",), str(tmp_path / "out"), reorg_threshold=THR
    )
    w = BatchWriter(opts)
    w.process(table, 0)
    st = w.load_state(1)
    head = st.core.head
    assert head is not None and head.hash == c9.hash, (
        f"head #{head.number} (want #9): held={st.core.ordering.held}"
    )


def _flipflop_input(data_dir, producers: int):
    """A→B→A′ (both deeper than the threshold, to the same ancestor: one reorg channel) sent
    by ``producers`` redundant ``ChainProducer``s into an embedded log; returns the chain."""
    from loglake.cardinal.producer import ChainProducer
    from loglake.cardinal.synthetic import schema_for
    from loglake.cardinal.transport import StreamProducer, StreamTransport
    from loglake.log import open_log
    from loglake.streams.api import LocalStreams

    base = seg(None, 10, "g", 0, 1)
    x = base[-1]
    a = seg(x, 20, "A", x.weight, 1)
    b = seg(x, 25, "B", x.weight, 2)
    a2 = a + seg(a[-1], 30, "A2", a[-1].weight, 5)
    tail = seg(a2[-1], 5, "tail", a2[-1].weight, 1)
    log = open_log(data_dir)
    try:
        for _ in range(producers):
            planner = ChainProducer(Producer("chain", schema_for("chain")), 8)
            sp = StreamProducer(StreamTransport(LocalStreams(log), 3), planner.producer)
            for branch in (base, a, b, a2, tail):
                sp.send_emission(planner.branch(branch))
    finally:
        log.close()
    return base + a2 + tail


def _topic_records(data_dir, topics):
    from loglake.log import open_log
    from loglake.streams.api import LocalStreams

    log = open_log(data_dir)
    try:
        s = LocalStreams(log)
        rows = []
        for t, topic in enumerate(topics):
            for part in range(s.partitions(topic)):
                rows += [(m.data, t, part, m.index) for m in s.pull(topic, 0, 100_000, part)]
    finally:
        log.close()
    return rows


def _table(rows):
    return pa.table(
        {
            "data": pa.array([r[0] for r in rows], pa.binary()),
            "t": pa.array([r[1] for r in rows], pa.int32()),
            "partition": pa.array([r[2] for r in rows], pa.int32()),
            "offset": pa.array([r[3] for r in rows], pa.int64()),
            "ts": pa.array([-1] * len(rows), pa.int64()),
        }
    )


@pytest.mark.parametrize("producers", [1, 2])
@pytest.mark.parametrize("batches", [1, 3])
def test_a_second_deep_reorg_to_the_same_ancestor(tmp_path, producers, batches):
    """The job follows a channel on past its first ReorgComplete when a Reorg names it again:
    a new reorg to the same ancestor is applied, a redundant producer's copy is not (as
    ``StreamConsumer``: ``tests/cardinal/test_reorg_channels.py``). Before, the channel was
    followed once and the chain stayed on B."""
    from loglake.cardinal.synthetic import topics_for

    data = tmp_path / "data"
    want = _flipflop_input(data, producers)
    topics = tuple(topics_for("chain"))
    rows = _topic_records(data, topics)
    opts = CardinalBlocksOptions(str(data), topics, str(tmp_path / "out"), reorg_threshold=8)
    w = BatchWriter(opts)
    by_offset = sorted(rows, key=lambda r: r[3])
    step = -(-len(by_offset) // batches)
    for i in range(batches):  # each partition's records in order, cut in ``batches`` parts
        w.process(_table(by_offset[i * step : (i + 1) * step]), i)
    st = w.load_state(batches)
    head = st.core.head
    assert head is not None and head.hash == want[-1].hash, f"head #{head and head.number}"
    assert [b.hash for b in st.core.ordering.chain] == [b.hash for b in want[-9:]]
    updates = pq.read_table(tmp_path / "out" / "chain_updates").to_pylist()
    reorgs = [
        u["action"] for u in sorted(updates, key=lambda u: u["seq"]) if "reorg" in u["action"]
    ]
    assert reorgs == ["reorg", "reorg_complete"] * 2


def test_a_channel_still_being_written_is_read_on(tmp_path):
    """A reorg channel read (in a micro-batch) before its producer has written it all stays
    open: the next micro-batch reads on to its ReorgComplete (as ``StreamConsumer``). Before,
    it was followed once, to where it then ended, and the chain stopped there."""
    from loglake.cardinal.synthetic import schema_for, topics_for
    from loglake.cardinal.transport import StreamProducer, StreamTransport
    from loglake.log import open_log
    from loglake.streams.api import LocalStreams

    data = tmp_path / "data"
    base = seg(None, 10, "g", 0, 1)
    x = base[-1]
    a = seg(x, 20, "A", x.weight, 1)
    b = seg(x, 25, "B", x.weight, 2)
    tail = seg(b[-1], 5, "tail", b[-1].weight, 1)
    prod = Producer("chain", schema_for("chain"))
    ch, msgs = prod.reorg_channel(x.number, x.hash, b)
    half = len(msgs) // 2
    topics = tuple(topics_for("chain"))
    opts = CardinalBlocksOptions(str(data), topics, str(tmp_path / "out"), reorg_threshold=8)
    w = BatchWriter(opts)
    seen: set[tuple[int, int, int]] = set()

    def batch(batch_id):
        rows = [r for r in _topic_records(data, topics) if (r[1], r[2], r[3]) not in seen]
        seen.update((r[1], r[2], r[3]) for r in rows)
        w.process(_table(sorted(rows, key=lambda r: r[3])), batch_id)

    def send(fn):
        log = open_log(data)
        try:
            tr = StreamTransport(LocalStreams(log), 3)
            fn(tr, StreamProducer(tr, prod))
        finally:
            log.close()

    def first(tr, sp):
        for blk in base + a:
            sp.send_block(blk)
        tr.send_channel(ch, [encode(m) for m in msgs[:half]])
        tr.send("chain", [encode(msgs[0])])

    def rest(tr, sp):
        tr.send_channel(ch, [encode(m) for m in msgs[half:]])
        for blk in tail:
            sp.send_block(blk)

    send(first)
    batch(0)
    head = w.load_state(1).core.head
    assert head is not None and head.number < b[-1].number
    send(rest)
    batch(1)
    st = w.load_state(2)
    assert st.core.head is not None and st.core.head.hash == tail[-1].hash, st.core.head
    assert st.open_follow is None


def test_a_reorg_to_an_older_common_ancestor(tmp_path):
    """A Reorg naming an older common ancestor than the fork point (an honest ``ChainProducer``
    given the new chain from below the fork): its channel re-sends the blocks both branches
    share, and they go back on the chain (they were dropped as done: the chain stayed cut back
    at the ancestor)."""
    from loglake.cardinal.producer import ChainProducer
    from loglake.cardinal.synthetic import schema_for, topics_for
    from loglake.cardinal.transport import StreamProducer, StreamTransport
    from loglake.log import open_log
    from loglake.streams.api import LocalStreams

    data = tmp_path / "data"
    base = seg(None, 10, "g", 0, 1)
    a = seg(base[-1], 20, "A", base[-1].weight, 1)  # #10..#29
    b = seg(a[14], 25, "B", a[14].weight, 2)  # forks at #24
    tail = seg(b[-1], 5, "tail", b[-1].weight, 1)
    log = open_log(data)
    try:
        planner = ChainProducer(Producer("chain", schema_for("chain")), 8)
        sp = StreamProducer(StreamTransport(LocalStreams(log), 3), planner.producer)
        for branch in (base, a, a[:15] + b, tail):  # the third names #9, not the fork #24
            sp.send_emission(planner.branch(branch))
    finally:
        log.close()
    topics = tuple(topics_for("chain"))
    opts = CardinalBlocksOptions(str(data), topics, str(tmp_path / "out"), reorg_threshold=8)
    w = BatchWriter(opts)
    w.process(_table(sorted(_topic_records(data, topics), key=lambda r: r[3])), 0)
    st = w.load_state(1)
    assert st.core.head is not None and st.core.head.hash == tail[-1].hash, st.core.head
    assert st.core.ordering.held == 0
