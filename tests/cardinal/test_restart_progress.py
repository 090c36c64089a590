"""A consumer killed and restarted from its durable checkpoint, any number of times, still
brings every partition's committed offset up to the chain window: nothing but the last
``reorg_threshold + 1`` blocks on the chain holds an offset back (ordering.py module
docstring, "Resumption"; the reference remembers evicted hashes as ``oldBlocks``)."""

from __future__ import annotations

import contextlib
import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal.blocks import BlockRef
from loglake.cardinal.codec import encode
from loglake.cardinal.errors import CardinalDecodeError, CheckpointError
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer, SubBatch
from loglake.cardinal.synthetic import schema_for, synthetic_chain, topics_for
from loglake.cardinal.transport import (
    StreamConsumer,
    StreamProducer,
    StreamTransport,
    partition_for,
    source_name,
)
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.cardinal.helpers import ChainModel, h


def _chain(n: int) -> list[BlockPayload]:
    out, parent = [], ZERO_HASH
    for i in range(n):
        hash_ = hashlib.sha256(b"blk%d" % i).digest()
        sb = SubBatch(
            hashlib.sha256(b"sb%d" % i).digest(), (), {f"s/{i}/{j}": b"x" for j in range(2)}
        )
        upd = {f"foo/{i}/{j}": b"v" for j in range(3)}
        out.append(BlockPayload(i, hash_, parent, i + 1, upd, frozenset(), {"s/": sb}))
        parent = hash_
    return out


def _window_floor(
    parts: dict[str, list[tuple[bytes, bytes]]], window: set[bytes]
) -> dict[str, int]:
    """Per source: the first offset of a message of a window block (else the end): where the
    committed offset must have got to once everything was read."""
    out = {}
    for s, msgs in parts.items():
        out[s] = next((i for i, (k, _v) in enumerate(msgs) if k[1:33] in window), len(msgs))
    return out


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.integers(20, 70),
    threshold=st.integers(1, 4),
    partitions=st.integers(1, 4),
    lag=st.integers(0, 25),
    rounds=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 40), st.booleans()), min_size=1, max_size=60
    ),
)
def test_offsets_reach_the_window_across_kills(blocks, threshold, partitions, lag, rounds):
    chain = _chain(blocks)
    # Two redundant producers, the second ``lag`` blocks behind, appending to the partitions
    # their keys hash to (sarama's rule).
    parts: dict[str, list[tuple[bytes, bytes]]] = {
        source_name("t", p): [] for p in range(partitions)
    }
    producers = [Producer("t", {"foo/": "t", "s/": "t"}) for _ in range(2)]
    for i in range(blocks + lag):
        for p, j in ((producers[0], i), (producers[1], i - lag)):
            if 0 <= j < blocks:
                for msgs in p.block_messages(chain[j]).values():
                    for m in msgs:
                        k, v = encode(m)
                        parts[source_name("t", partition_for(k, partitions))].append((k, v))
    model = ChainModel([])
    ckpt: Checkpoint | None = None

    def start() -> tuple[OrderedConsumer, dict[str, int]]:
        c = OrderedConsumer(threshold, checkpoint=ckpt)
        return c, {s: c.start_offsets.get(s, 0) for s in parts}

    c, pos = start()
    sources = sorted(parts)

    def read(s: str, n: int) -> None:
        for _ in range(n):
            if pos[s] >= len(parts[s]):
                return
            k, v = parts[s][pos[s]]
            with contextlib.suppress(CardinalDecodeError):
                for u in c.receive(k, v, s, pos[s]):
                    model.apply(u)
            pos[s] += 1

    for which, n, kill in rounds:
        read(sources[which % len(sources)], n)
        if kill:  # the durable checkpoint is all that survives
            ckpt = Checkpoint.from_bytes(c.checkpoint().to_bytes())
            c, pos = start()
    for _ in range(3):  # then read everything round-robin, as polling does; killed after each
        while any(pos[s] < len(parts[s]) for s in sources):
            for s in sources:
                read(s, 8)
        ckpt = Checkpoint.from_bytes(c.checkpoint().to_bytes())
        c, pos = start()
        assert ckpt.head is not None and ckpt.head.hash == chain[-1].hash
        window = {b.hash for b in chain[-(threshold + 1) :]}
        floor = _window_floor(parts, window)
        for s in sources:
            assert ckpt.offsets.get(s, 0) >= floor[s], (s, ckpt.offsets, floor)
    assert model.chain[-1:] == [chain[-1].hash] or not model.chain


def test_three_thousand_blocks_four_partitions_restarts_reach_the_window():
    # The reproduction: 3,000 blocks from two redundant producers (the second 300 blocks
    # behind) over 4 partitions, a consumer stopped after every few polling rounds and
    # restarted from what it committed: every partition's committed offset gets to the window.
    streams = LocalStreams(MemoryLog())
    t = StreamTransport(streams, partitions=4)
    syn = synthetic_chain(3000, lose_every=0, win_every=0)
    sps = [StreamProducer(t, Producer("chain", schema_for("chain"))) for _ in range(2)]
    steps = syn.steps
    for i in range(len(steps) + 300):
        if i < len(steps):
            sps[0].send_block(steps[i])
        if 0 <= i - 300 < len(steps):
            sps[1].send_block(steps[i - 300])
    threshold = 16
    ckpt = None
    for _ in range(40):
        c = StreamConsumer(t, topics_for("chain"), "me", reorg_threshold=threshold)
        for _ in range(4):
            c.poll(limit=300)
        ckpt = c.commit()
    assert ckpt is not None and ckpt.head is not None
    assert ckpt.head.hash == syn.canonical[-1].hash
    window = {b.hash for b in syn.canonical[-(threshold + 1) :]}
    for s in ckpt.offsets:
        keys = [(d.key, b"") for d in t.fetch(s, 0, 10**7)]
        floor = _window_floor({s: keys}, window)[s]
        assert ckpt.offsets[s] >= floor, (s, ckpt.offsets[s], floor, len(keys))


def test_transport_loads_back_reverted_and_done_blocks():
    # What a restart reads from the checkpoint stream is the whole checkpoint, not only its
    # chain, offsets and reorgs: the blocks a pending Reorg removed and the done blocks too.
    t = StreamTransport(LocalStreams(MemoryLog()), partitions=1)
    chain = _chain(3)
    ckpt = Checkpoint(
        tuple(BlockRef(b.number, b.hash, b.parent, b.weight) for b in chain[:2]),
        {},  # no topic partitions: only the checkpoint stream is written
        ((1, chain[1].hash, False),),
        (chain[2].hash,),
    )
    t.save_checkpoint("me", ckpt)
    loaded = t.load_checkpoint("me")
    assert loaded is not None and loaded.reverted == (chain[2].hash,)
    with_done = Checkpoint(ckpt.chain, ckpt.offsets, ckpt.reorgs, ckpt.reverted, ((0, h(9)),))
    t.save_checkpoint("you", with_done)
    assert t.load_checkpoint("you") == with_done


def test_a_checkpoint_whose_committed_record_is_gone_is_an_error_not_a_fresh_start():
    # The index service says the committed checkpoint is record #1; retention (here a
    # truncation) removed it and kept only a later record a crash left uncommitted. Loading
    # that one, or nothing (a fresh start), would deliver blocks twice or skip some: the
    # transport says which record is gone instead.
    streams = LocalStreams(MemoryLog())
    t = StreamTransport(streams, partitions=1)
    chain = _chain(3)
    refs = tuple(BlockRef(b.number, b.hash, b.parent, b.weight) for b in chain)
    t.save_checkpoint("me", Checkpoint(refs[:1], {}))
    t.save_checkpoint("me", Checkpoint(refs[:2], {}))
    name = "cardinal.ckpt.me"
    assert streams.get_index("me", name) == 2
    assert t.load_checkpoint("me") == Checkpoint(refs[:2], {})
    streams.push(name, Checkpoint(refs, {}).to_bytes())  # appended, never committed
    streams.truncate_before(name, 2)
    with pytest.raises(CheckpointError, match=r"#1 is no longer stored \(#2 is the first kept\)"):
        StreamTransport(streams, partitions=1).load_checkpoint("me")
    streams.truncate_before(name, 3)
    with pytest.raises(CheckpointError, match=r"#1 is no longer stored \(none is kept\)"):
        StreamTransport(streams, partitions=1).load_checkpoint("me")
