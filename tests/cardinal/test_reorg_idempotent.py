"""A Reorg is applied once (follow-up F4 item 3): a redundant producer's copy of a reorg
channel, or a Reorg read again after a restart because its offset was not committed yet,
changes nothing — before, the chain was reverted to the ancestor and the new branch added again
(consistent, not minimal). Recognised by the ancestor hash (the reorg channel's name is keyed by
it, reference ``transports/kafka.go`` ``%s-re-%x``), remembered in the checkpoint."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
from loglake.cardinal.codec import encode
from loglake.cardinal.errors import CheckpointError
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import MAX_REORGS, Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer, reorg_channel_name
from loglake.cardinal.transport import partition_for, source_name
from tests.cardinal.helpers import REF_SCHEMA, ChainModel, flat

THRESHOLD = 1000
GENESIS = BlockPayload(0, hashlib.sha256(b"genesis").digest(), ZERO_HASH, 0)


def _block(n: int, parent: BlockPayload, weight: int, tag: str) -> BlockPayload:
    h = hashlib.sha256(f"{tag}{n}".encode() + parent.hash).digest()
    return BlockPayload(n, h, parent.hash, weight, {f"foo/{tag}{n}": tag.encode()})


def scenario(a_len: int, fork_at: int, b_len: int, c_len: int, partitions: int, rng):
    """Chain A (genesis..#a_len), a deep reorg to A's #fork_at onto branch B (heavier, on its
    reorg channel, written by two redundant producers), then blocks C extending B on the
    topics. Returns the deliveries (source, offset, key, value) in one valid order — topic
    partitions interleaved at random, in order within each — and the final chain."""
    a = [GENESIS]
    for i in range(1, a_len + 1):
        a.append(_block(i, a[-1], i * 10, "a"))
    anc = a[fork_at]
    b = [anc]
    for i in range(fork_at + 1, fork_at + b_len + 1):
        b.append(_block(i, b[-1], 10_000 + i, "b"))
    c = [b[-1]]
    for i in range(b[-1].number + 1, b[-1].number + c_len + 1):
        c.append(_block(i, c[-1], 10_000 + i, "c"))
    out: list[tuple[str, int, bytes, bytes]] = []
    next_off: dict[str, int] = {}

    def interleave(blocks):
        queues: dict[str, list[tuple[bytes, bytes]]] = {}
        for p in (Producer("default", REF_SCHEMA), Producer("default", REF_SCHEMA)):
            for blk in blocks:
                for topic, k, v in flat(p, blk):
                    queues.setdefault(source_name(topic, partition_for(k, partitions)), []).append(
                        (k, v)
                    )
        while any(queues.values()):
            s = rng.choice(sorted(q for q in queues if queues[q]))
            k, v = queues[s].pop(0)
            out.append((s, next_off.get(s, 0), k, v))
            next_off[s] = next_off.get(s, 0) + 1

    def put(s, k, v):
        out.append((s, next_off.get(s, 0), k, v))
        next_off[s] = next_off.get(s, 0) + 1

    interleave(a[1:])
    reorg_key, reorg_value = encode(Producer("default").reorg(anc.number, anc.hash))
    put(source_name("default", partition_for(reorg_key, partitions)), reorg_key, reorg_value)
    channel = source_name(reorg_channel_name("default", anc.hash), 0)
    for _ in range(2):  # two producers, each appends its whole channel
        _, msgs = Producer("default", REF_SCHEMA).reorg_channel(anc.number, anc.hash, b[1:])
        for m in msgs:
            put(channel, *encode(m))
    interleave(c[1:])
    return out, [blk.hash for blk in [*a[: fork_at + 1], *b[1:], *c[1:]]]


def fresh() -> OrderedConsumer:
    return OrderedConsumer(
        THRESHOLD, checkpoint=Checkpoint.starting_at(0, GENESIS.hash, GENESIS.weight)
    )


def feed(consumer, ds) -> list[ChainUpdate | ReorgEvent]:
    out = []
    for s, o, k, v in ds:
        out += consumer.receive(k, v, s, o)
    return out


@settings(max_examples=120, deadline=None)
@given(
    st.integers(2, 8),
    st.integers(0, 4),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
    st.floats(0, 1),
    st.booleans(),
)
def test_reorg_applied_once_across_duplicates_and_a_restart(
    a_len, fork_back, b_len, c_len, partitions, rng, where, serialise
):
    fork_at = max(0, a_len - 1 - fork_back)
    ds, final = scenario(a_len, fork_at, b_len, c_len, partitions, rng)
    kill = int(where * len(ds))
    first = fresh()
    before = feed(first, ds[:kill])
    ckpt = first.checkpoint()
    if serialise:
        ckpt = Checkpoint.from_bytes(ckpt.to_bytes())
    second = OrderedConsumer(THRESHOLD, checkpoint=ckpt)
    after = feed(second, [d for d in ds if d[1] >= ckpt.offsets.get(d[0], 0)])
    events = before + after
    model = ChainModel([GENESIS.hash])
    for ev in events:
        model.apply(ev)
    assert model.chain == final
    final_set = set(final)
    removed = [r.hash for u in events if isinstance(u, ChainUpdate) for r in u.removed]
    assert not final_set & set(removed), "a block of the final chain was removed"
    notices = [(e.hash, e.complete) for e in events if isinstance(e, ReorgEvent)]
    assert len(notices) == len(set(notices)), "a reorg notice was emitted twice"
    assert len(removed) == len(set(removed)), "a block was removed twice"
    assert all(n == 1 for n in model.added.values()), "a block was added twice"


def test_second_copy_of_a_channel_changes_nothing():
    import random

    ds, final = scenario(6, 3, 4, 2, 2, random.Random(1))
    c = fresh()
    events = feed(c, ds)
    assert c.repeated_reorgs == 3  # the channel's own Reorg and the second copy's two
    assert [e.complete for e in events if isinstance(e, ReorgEvent)] == [False, True]
    assert [b.hash for b in c.ordering.chain][-len(final[4:]) :] == final[4:]


def test_checkpoint_keeps_applied_reorgs_bounded_and_round_trips():
    c = fresh()
    chain_hashes = []
    prev = GENESIS
    for i in range(1, MAX_REORGS + 6):  # a reorg to the head each time (no blocks removed)
        blk = _block(i, prev, i * 10, "x")
        for _, k, v in flat(Producer("default"), blk):
            c.receive(k, v, "default:0", -1)
        k, v = encode(Producer("default").reorg(blk.number, blk.hash))
        c.receive(k, v, "default:0", -1)
        chain_hashes.append(blk.hash)
        prev = blk
    ck = c.checkpoint()
    assert len(ck.reorgs) == MAX_REORGS
    assert [h for _, h, _ in ck.reorgs] == chain_hashes[-MAX_REORGS:]
    assert Checkpoint.from_bytes(ck.to_bytes()) == ck
    old = b'{"chain":[[1,"' + b"11" * 32 + b'","' + b"00" * 32 + b'","5"]],"offsets":{}}'
    assert Checkpoint.from_bytes(old).reorgs == ()  # written before the field existed
    with pytest.raises(CheckpointError):
        Checkpoint.from_bytes(old[:-1] + b',"reorgs":[[1,"zz",0]]}')


@pytest.mark.parametrize("rounds", [10, 23, 24, 30, 60])  # the Reorg is read in round 24
def test_restart_after_a_deep_reorg_over_the_stream_transport(rounds):
    """Commit after each polling round, restart after ``rounds``: whatever the restarted
    consumer reads again (the Reorg on the default topic included), no block of the final
    chain is removed and none is added twice."""
    from loglake.cardinal.synthetic import synthetic_chain, topics_for
    from loglake.cardinal.transport import StreamConsumer, StreamTransport
    from loglake.log import MemoryLog
    from loglake.streams.api import LocalStreams
    from tests.cardinal.test_transport import produce

    streams = LocalStreams(MemoryLog())
    chain = synthetic_chain(40, deep_reorg=10)
    produce(streams, chain)

    def consumer():
        return StreamConsumer(
            StreamTransport(streams),
            topics_for("chain"),
            "r",
            8,
            start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
        )

    first = consumer()
    events = []
    for _ in range(rounds):
        events += first.poll(limit=3)
        first.commit()
    events += consumer().run()
    model = ChainModel([])
    for ev in events:
        model.apply(ev)
    final = [b.hash for b in chain.canonical]
    assert model.chain == final
    removed = {r.hash for u in events if isinstance(u, ChainUpdate) for r in u.removed}
    assert not removed & set(final)
    assert all(n == 1 for n in model.added.values())
    assert sum(1 for e in events if isinstance(e, ReorgEvent) and not e.complete) == 1


def test_reorg_read_again_from_older_offsets_is_recognised():
    """Lower offsets are always a valid resumption point. Resume after a deep reorg from
    offsets 0 everywhere (the channel's offset forgotten too), so the Reorg and its whole
    channel are read again: the checkpoint's applied reorgs make that change nothing."""
    from loglake.cardinal.synthetic import synthetic_chain, topics_for
    from loglake.cardinal.transport import StreamConsumer, StreamTransport
    from loglake.log import MemoryLog
    from loglake.streams.api import LocalStreams
    from tests.cardinal.test_transport import produce

    streams = LocalStreams(MemoryLog())
    chain = synthetic_chain(40, deep_reorg=10)
    produce(streams, chain)
    first = StreamConsumer(
        StreamTransport(streams),
        topics_for("chain"),
        "a",
        8,
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )
    model = ChainModel([])
    for ev in first.run():
        model.apply(ev)
    ckpt = first.commit()
    assert [e for e in ckpt.reorgs if e[2]]  # the deep reorg, complete
    rewound = Checkpoint(ckpt.chain, {}, ckpt.reorgs)
    second = StreamConsumer(StreamTransport(streams), topics_for("chain"), "b", 8, start=rewound)
    again = second.run()
    assert second.core.repeated_reorgs >= 2  # its Reorg and ReorgComplete, read again
    assert not [e for e in again if isinstance(e, ReorgEvent)]
    assert not [r for u in again if isinstance(u, ChainUpdate) for r in u.removed]
    for ev in again:
        model.apply(ev)
    assert model.chain == [b.hash for b in chain.canonical]
    assert second.core.head == first.core.head
