"""A Reorg and what was read around it, from more than one partition (in order only within
one): blocks completed before the Reorg that extend its new branch are kept (they were dropped,
and the chain stopped at the channel's end for good), and the branch given up stays done (a
late copy of one of its messages was queued for good, holding its partition's committed offset
back)."""

from __future__ import annotations

import hashlib

from loglake.cardinal.blocks import ChainUpdate
from loglake.cardinal.codec import encode
from loglake.cardinal.messages import ZERO_HASH, Batch
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer

THR = 2
G = BlockPayload(0, hashlib.sha256(b"g").digest(), ZERO_HASH, 0)


def blk(n: int, parent: BlockPayload, weight: int, tag: str) -> BlockPayload:
    h = hashlib.sha256(f"{tag}{n}".encode() + parent.hash).digest()
    return BlockPayload(n, h, parent.hash, weight, {f"foo/{tag}{n}": b"x"})


def msgs(p: Producer, b: BlockPayload) -> list[tuple[bytes, bytes]]:
    return [encode(m) for _, ms in sorted(p.block_messages(b).items()) for m in ms]


def test_a_block_read_ahead_of_a_deep_reorg_extends_its_new_branch():
    p = Producer("chain", {"foo/": "chain"})
    a = [G]
    for n in range(1, 7):
        a.append(blk(n, a[-1], n * 10, "a"))
    anc = a[2]  # depth 4 > THR: a reorg channel
    b = [anc]
    for n in range(3, 8):
        b.append(blk(n, b[-1], 1000 + n, "b"))  # heavier than a6
    c8 = blk(8, b[-1], 2000, "c")
    c9 = blk(9, c8, 2010, "c")

    core = OrderedConsumer(THR, checkpoint=Checkpoint.starting_at(0, G.hash, G.weight))
    off: dict[str, int] = {}

    def feed(source: str, kv: list[tuple[bytes, bytes]]) -> list:
        out = []
        for k, v in kv:
            out += core.receive(k, v, source, off.setdefault(source, 0))
            off[source] += 1
        return out

    for x in a[1:]:
        feed("chain:0", msgs(p, x))
    # c8 was produced after the Reorg, on another partition that is read ahead of chain:0
    # (in-order delivery holds only within one partition): it completes first, an orphan.
    feed("chain:1", msgs(p, c8))
    assert core.ordering.holds(c8.hash)
    # The Reorg on chain:0 (ready: the head passed the ancestor by more than the window),
    # then its channel in order, as StreamConsumer._follow_reorg reads it.
    channel, chan_msgs = p.reorg_channel(anc.number, anc.hash, b[1:])
    feed("chain:0", [encode(chan_msgs[0])])
    feed(f"{channel}:0", [encode(m) for m in chan_msgs])
    # the channel's blocks land, and the chain goes on through c8, held since
    assert core.head is not None and core.head.hash == c8.hash
    # c9 comes on the topics afterwards
    updates = feed("chain:1", msgs(p, c9))
    added = [x.hash for u in updates if isinstance(u, ChainUpdate) for x in u.added]
    assert core.head.hash == c9.hash, (
        f"chain stuck at #{core.head.number}; c8 was forgotten by the Reorg, "
        f"c9 waits as an orphan (held={core.ordering.held}); added={len(added)}"
    )


def test_the_same_through_stream_consumer_over_three_partitions():
    """Same through StreamConsumer and the loglake-stream transport: one producer, 3
    partitions, a deep reorg then 4 more blocks: the consumer reaches the head (it stopped at
    the channel's end)."""
    import random

    from loglake.cardinal.synthetic import (
        ReorgStep,
        make_block,
        schema_for,
        synthetic_chain,
        topics_for,
    )
    from loglake.cardinal.transport import StreamConsumer, StreamProducer, StreamTransport
    from loglake.log import MemoryLog
    from loglake.streams.api import LocalStreams

    thr, parts = 5, 3
    chain = synthetic_chain(20, lose_every=0, win_every=0, deep_reorg=9, sub_items=-1)
    canon, steps = list(chain.canonical), list(chain.steps)
    for _ in range(4):
        nb = make_block(
            canon[-1].number + 1, canon[-1], canon[-1].weight + 10, "after", sub_items=-1
        )
        steps.append(nb)
        canon.append(nb)
    streams = LocalStreams(MemoryLog())
    sp = StreamProducer(StreamTransport(streams, parts), Producer("chain", schema_for("chain")))
    for st in steps:
        if isinstance(st, ReorgStep):
            sp.send_reorg(st.ancestor.number, st.ancestor.hash, st.blocks)
        else:
            sp.send_block(st)
    c = StreamConsumer(
        StreamTransport(streams, parts),
        topics_for("chain"),
        "c",
        thr,
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )
    rng = random.Random(0)
    for _ in range(2000):  # partitions advance unevenly (small, varying poll limits)
        before = dict(c.positions)
        c.poll(limit=rng.randint(1, 2))
        if c.positions == before and not c.paused:
            break
    assert c.core.head.hash == canon[-1].hash, (c.core.head.number, canon[-1].number)


def split(p: Producer, b: BlockPayload):
    """(Batch message, other messages), encoded: keys hash to different partitions."""
    ms = [m for _, x in sorted(p.block_messages(b).items()) for m in x]
    return [encode(m) for m in ms if isinstance(m, Batch)], [
        encode(m) for m in ms if not isinstance(m, Batch)
    ]


def test_a_late_copy_of_a_given_up_block_does_not_pin_the_committed_offset():
    p1, p2 = Producer("chain", {"foo/": "chain"}), Producer("chain", {"foo/": "chain"})
    a = [G]
    for n in range(1, 7):
        a.append(blk(n, a[-1], n * 10, "a"))
    anc = a[2]
    b = [anc]
    for n in range(3, 8):
        b.append(blk(n, b[-1], 1000 + n, "b"))
    c = [b[-1]]
    for n in range(8, 30):
        c.append(blk(n, c[-1], 2000 + n, "c"))

    off: dict[str, int] = {}
    logs: dict[str, list] = {}

    def feed(core, source, kvs):
        for k, v in kvs:
            core.receive(k, v, source, off.setdefault(source, 0))
            logs.setdefault(source, []).append((k, v))
            off[source] += 1

    core = OrderedConsumer(THR, checkpoint=Checkpoint.starting_at(0, G.hash, G.weight))
    for x in a[1:]:
        bat, rest = split(p1, x)
        feed(core, "chain:1", rest)
        feed(core, "chain:0", bat)
    # producer 2's copy of a6: its Batch (chain:0) is read now, a duplicate ...
    late_bat, late_rest = split(p2, a[6])
    feed(core, "chain:0", late_bat)
    # ... then the deep Reorg (ready: head #6 - 2 > #2) and its channel
    channel, chan = p1.reorg_channel(anc.number, anc.hash, b[1:])
    feed(core, "chain:0", [encode(chan[0])])
    feed(core, f"{channel}:0", [encode(m) for m in chan])
    # ... and only now producer 2's BatchMsg of a6, on the lagging partition chain:1
    pinned = off["chain:1"]
    feed(core, "chain:1", late_rest)
    for x in c[1:]:  # the chain moves on by 22 blocks, far past the window
        bat, rest = split(p1, x)
        feed(core, "chain:1", rest)
        feed(core, "chain:0", bat)
    assert core.head is not None and core.head.hash == c[-1].hash
    ck = core.checkpoint()
    # A restart from the stored checkpoint, fed everything from its offsets: still stuck.
    again = OrderedConsumer(THR, checkpoint=Checkpoint.from_bytes(ck.to_bytes()))
    for s, msgs in logs.items():
        for o in range(ck.offsets.get(s, 0), len(msgs)):
            again.receive(*msgs[o], s, o)
    ck2 = again.checkpoint()
    assert min(ck.offsets["chain:1"], ck2.offsets["chain:1"]) > pinned, (
        f"committed offset of chain:1 stuck at {ck.offsets['chain:1']}, and at "
        f"{ck2.offsets['chain:1']} after a restart (the late copy of a block done before the "
        f"Reorg); {off['chain:1']} read; queued={core.consumer.queued}/{again.consumer.queued}"
    )
