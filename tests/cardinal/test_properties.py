"""Property tests: any chain with forks, any split into messages, two redundant producers, any
partitioning and interleaving → the consumer ends on exactly the chain an in-order delivery
yields, with every block's content intact; the same after a kill and resume at any point.

The interleaving keeps each partition in order (what a partitioned log guarantees) and nothing
else: partitions, topics and the two producers' copies race freely.
"""

from __future__ import annotations

import contextlib
import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal.blocks import ChainUpdate
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer, SubBatch
from loglake.cardinal.transport import partition_for
from tests.cardinal.helpers import REF_SCHEMA, ChainModel, expected_content, flat

THRESHOLD = 1000  # no eviction in these small chains
GENESIS = BlockPayload(0, hashlib.sha256(b"genesis").digest(), ZERO_HASH, 0)


def _hash(*parts: object) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


@st.composite
def chains(draw, linear: bool = False) -> list[BlockPayload]:
    blocks = [GENESIS]
    for i in range(1, draw(st.integers(1, 12)) + 1):
        parent = blocks[-1] if linear else draw(st.sampled_from(blocks[-4:]))
        weight = (parent.weight // 100 + draw(st.integers(1, 30))) * 100 + i  # distinct: i < 100
        updates = {
            f"foo/{i}/{j}": draw(st.binary(max_size=4)) for j in range(draw(st.integers(0, 3)))
        }
        updates |= {f"bar/x{j}/baz/{i}": b"b" for j in range(draw(st.integers(0, 2)))}
        if draw(st.booleans()):
            updates[f"plain/{i}"] = draw(st.binary(max_size=3))
        deletes = frozenset(f"foo/{i}/d{j}" for j in range(draw(st.integers(0, 2))))
        batches = {}
        for j in range(draw(st.integers(0, 2))):
            batches[f"state/{j}"] = SubBatch(
                _hash("sb", i, j, parent.hash),
                tuple(f"state/{i}/gone{k}" for k in range(draw(st.integers(0, 2)))),
                {f"state/{i}/{j}/{k}": b"s" for k in range(draw(st.integers(0, 3)))},
            )
        blocks.append(  # numbered as a chain numbers them: its parent's + 1
            BlockPayload(
                parent.number + 1,
                _hash(i, parent.hash),
                parent.hash,
                weight,
                updates,
                deletes,
                batches,
            )
        )
    return blocks


def heaviest_path(blocks: list[BlockPayload]) -> list[bytes]:
    by_hash = {b.hash: b for b in blocks}
    tip = max(blocks, key=lambda b: b.weight)
    path = [tip.hash]
    while path[-1] != GENESIS.hash:
        path.append(by_hash[path[-1]].parent)
    return path[::-1]


def deliveries(blocks, partitions: int, rng, producers: int = 2):
    """(source, offset, key, value) in a random interleaving of ordered partitions."""
    queues: dict[str, list[list[tuple[bytes, bytes]]]] = {}
    for _ in range(producers):
        p = Producer("default", REF_SCHEMA)
        mine: dict[str, list[tuple[bytes, bytes]]] = {}
        for blk in blocks[1:]:
            for topic, k, v in flat(p, blk):
                mine.setdefault(f"{topic}:{partition_for(k, partitions)}", []).append((k, v))
        for src, msgs in mine.items():
            queues.setdefault(src, []).append(msgs)
    merged: dict[str, list[tuple[bytes, bytes]]] = {}
    for src, lists in queues.items():  # the producers race within a partition
        out: list[tuple[bytes, bytes]] = []
        lists = [list(x) for x in lists]
        while any(lists):
            pick = rng.choice([x for x in lists if x])
            out.append(pick.pop(0))
        merged[src] = out
    pos = dict.fromkeys(merged, 0)
    result = []
    while True:
        live = [s for s in merged if pos[s] < len(merged[s])]
        if not live:
            return result
        s = rng.choice(sorted(live))
        k, v = merged[s][pos[s]]
        result.append((s, pos[s], k, v))
        pos[s] += 1


def consume(consumer, ds) -> list[ChainUpdate]:
    out = []
    for s, o, k, v in ds:
        out += [u for u in consumer.receive(k, v, s, o) if isinstance(u, ChainUpdate)]
    return out


def fresh() -> OrderedConsumer:
    return OrderedConsumer(
        THRESHOLD, checkpoint=Checkpoint.starting_at(0, GENESIS.hash, GENESIS.weight)
    )


def in_order_chain(blocks) -> list[bytes]:
    """The sequential reference: one producer, every message in production order."""
    p = Producer("default", REF_SCHEMA)
    model = ChainModel([GENESIS.hash])
    c = fresh()
    for blk in blocks[1:]:
        for u in consume(c, [(t, 0, k, v) for t, k, v in flat(p, blk)]):
            model.apply(u)
    return model.chain


def check(blocks, updates_runs) -> ChainModel:
    by_hash = {b.hash: b for b in blocks}
    model = ChainModel([GENESIS.hash])
    for updates in updates_runs:
        for u in updates:
            model.apply(u)
            for b in u.added:
                values, deletes = expected_content(by_hash[b.hash])
                assert b.values == values and b.deletes == deletes
                assert (b.number, b.parent, b.weight) == (
                    by_hash[b.hash].number,
                    by_hash[b.hash].parent,
                    by_hash[b.hash].weight,
                )
    expected = in_order_chain(blocks)
    assert expected == heaviest_path(blocks)
    assert model.chain == expected
    return model


@settings(max_examples=150, deadline=None)
@given(chains(), st.integers(1, 3), st.randoms(use_true_random=False))
def test_any_interleaving_with_duplicates_ends_on_the_in_order_chain(blocks, partitions, rng):
    ds = deliveries(blocks, partitions, rng)
    check(blocks, [consume(fresh(), ds)])


@settings(max_examples=100, deadline=None)
@given(chains(linear=True), st.integers(1, 3), st.randoms(use_true_random=False))
def test_linear_chain_each_block_emitted_exactly_once(blocks, partitions, rng):
    ds = deliveries(blocks, partitions, rng)
    updates = consume(fresh(), ds)
    model = check(blocks, [updates])
    assert all(not u.removed for u in updates)
    assert model.added == {b.hash: 1 for b in blocks[1:]}


@settings(max_examples=150, deadline=None)
@given(
    chains(),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
    st.floats(0, 1),
)
def test_kill_and_resume_at_any_point(blocks, partitions, rng, where):
    ds = deliveries(blocks, partitions, rng)
    kill = int(where * len(ds))
    first = fresh()
    before = consume(first, ds[:kill])
    ckpt = Checkpoint.from_bytes(first.checkpoint().to_bytes())
    second = OrderedConsumer(THRESHOLD, checkpoint=ckpt)
    again = [d for d in ds if d[1] >= ckpt.offsets.get(d[0], 0)]
    after = consume(second, again)
    check(blocks, [before, after])


@settings(max_examples=100, deadline=None)
@given(
    chains(linear=True),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
    st.floats(0, 1),
)
def test_resume_never_re_emits_or_skips_a_block(blocks, partitions, rng, where):
    ds = deliveries(blocks, partitions, rng)
    kill = int(where * len(ds))
    first = fresh()
    before = consume(first, ds[:kill])
    second = OrderedConsumer(THRESHOLD, checkpoint=first.checkpoint())
    after = consume(second, [d for d in ds if d[1] >= first.checkpoint().offsets.get(d[0], 0)])
    model = check(blocks, [before, after])
    assert model.added == {b.hash: 1 for b in blocks[1:]}


@settings(max_examples=40, deadline=None)
@given(
    chains(linear=True),
    st.integers(1, 4),
    st.integers(1, 30),
    st.integers(2, 6),
    st.integers(1, 5),
)
def test_stream_transport_with_skewed_partitions_and_a_small_window(
    blocks, partitions, limit, threshold, chunk
):
    """Partitions advance unevenly (``limit`` per round); the window is tiny; two producers
    append runs of ``chunk`` blocks each: the chain still completes, each block once."""
    from loglake.cardinal.transport import StreamConsumer, StreamProducer, StreamTransport
    from loglake.log import MemoryLog
    from loglake.streams.api import LocalStreams

    streams = LocalStreams(MemoryLog())
    cps = [
        StreamProducer(StreamTransport(streams, partitions), Producer("default", REF_SCHEMA))
        for _ in "ab"
    ]
    for i in range(1, len(blocks), chunk):
        for cp in cps:
            cp.send_blocks(blocks[i : i + chunk])
    c = StreamConsumer(
        StreamTransport(streams, partitions),
        ["default", "foo", "bar", "state"],
        "p",
        threshold,
        start=Checkpoint.starting_at(0, GENESIS.hash, GENESIS.weight),
    )
    updates = []
    for _ in range(10_000):
        before = dict(c.positions)
        updates += [u for u in c.poll(limit) if isinstance(u, ChainUpdate)]
        if c.positions == before:
            break
    model = check(blocks, [updates])
    assert model.added == {b.hash: 1 for b in blocks[1:]}


@settings(max_examples=80, deadline=None)
@given(
    chains(),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
    st.lists(st.tuples(st.binary(max_size=70), st.binary(max_size=70)), max_size=20),
    st.lists(st.integers(0, 2**31 - 1), max_size=5),
)
def test_garbage_and_bogus_messages_change_nothing(blocks, partitions, rng, garbage, counts):
    """Random bytes (typed errors), well-formed messages for blocks nobody announced, a
    SubBatchHeader with a huge ItemCount for an unknown block: the chain and every block's
    content come out as without them."""
    from loglake.cardinal.codec import encode
    from loglake.cardinal.errors import CardinalDecodeError, UnknownAncestor
    from loglake.cardinal.messages import BatchMsg, SubBatchHeader, SubBatchMsg

    ds = deliveries(blocks, partitions, rng)
    bogus = [encode(SubBatchHeader(_hash("x", n), _hash("y", n), n)) for n in counts]
    bogus += [encode(SubBatchMsg(_hash("x", n), _hash("y", n), n, (), {"k": b"v"})) for n in counts]
    bogus += [encode(BatchMsg(_hash("z", n), "foo/evil", b"!")) for n in counts]
    for i, (k, v) in enumerate(garbage + bogus):
        ds.insert(rng.randrange(len(ds) + 1), ("junk:0", i, k, v))
    c = fresh()
    updates = []
    for s, o, k, v in ds:
        with contextlib.suppress(CardinalDecodeError, UnknownAncestor):
            updates += [u for u in c.receive(k, v, s, o) if isinstance(u, ChainUpdate)]
    check(blocks, [updates])
