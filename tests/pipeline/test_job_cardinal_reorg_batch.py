"""cardinal-blocks (no Spark needed): in one micro-batch every block assembled is ordered before
the micro-batch's Reorg is applied (``BatchWriter._process``), so blocks produced after the
Reorg (extending its channel's branch) are held as orphans when it comes. The Reorg forgot them,
and the assembler's tombstones kept them from coming back: the chain stopped at the channel's
last block, every record in order in one partition. They are kept now."""

from __future__ import annotations

import hashlib

import pyarrow as pa

from loglake.cardinal.codec import encode
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.producer import BlockPayload, Producer
from loglake.cardinal.transport import envelope
from loglake.pipeline.jobs.cardinal_blocks import BatchWriter, CardinalBlocksOptions

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
