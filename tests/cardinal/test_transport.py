"""The loglake-stream transport: partitioning as the reference's Kafka producer, offsets through
the Ockam index service, reorg channels, resumption after a restart (also on the real log)."""

from __future__ import annotations

import math

import pytest

from loglake.cardinal.blocks import ReorgEvent
from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint
from loglake.cardinal.producer import Producer
from loglake.cardinal.synthetic import ReorgStep, schema_for, synthetic_chain, topics_for
from loglake.cardinal.transport import (
    StreamConsumer,
    StreamProducer,
    StreamTransport,
    envelope,
    fnv1a32,
    open_envelope,
    partition_for,
)
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.cardinal.helpers import ChainModel


def test_fnv1a32_matches_go_hash_fnv_golden_values():
    # Go src/hash/fnv/fnv_test.go golden32a
    assert [fnv1a32(s) for s in (b"", b"a", b"ab", b"abc")] == [
        0x811C9DC5,
        0xE40C292C,
        0x4D2505CA,
        0x1A47E90B,
    ]


@pytest.mark.parametrize("key", [b"", b"a", b"ab", b"abc", b"\x00" + bytes(32), b"\x03xyz" * 9])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 12])
def test_partition_is_sarama_hash_partitioner(key, n):
    # sarama partitioner.go: partition = int32(hasher.Sum32()) % numPartitions; negate if < 0
    # (Go's % truncates toward zero, as math.fmod does).
    s = fnv1a32(key)
    s32 = s - 2**32 if s >= 2**31 else s
    go = int(math.fmod(s32, n))
    assert partition_for(key, n) == (-go if go < 0 else go)


def test_envelope_round_trip_and_garbage():
    assert open_envelope(envelope(b"\x03k", b"value")) == (b"\x03k", b"value")
    assert open_envelope(envelope(b"", b"")) == (b"", b"")
    with pytest.raises(CardinalDecodeError):
        open_envelope(b"\x50abc")
    with pytest.raises(CardinalDecodeError):
        open_envelope(b"")


def produce(streams, chain, topic="chain", producers=2, partitions=3):
    for _ in range(producers):  # redundant producers send the same chain
        cp = StreamProducer(
            StreamTransport(streams, partitions), Producer(topic, schema_for(topic))
        )
        for step in chain.steps:
            if isinstance(step, ReorgStep):
                cp.send_reorg(step.ancestor.number, step.ancestor.hash, step.blocks)
            else:
                cp.send_block(step)


def consumer(streams, threshold=128, client="c1", partitions=3, topic="chain"):
    return StreamConsumer(
        StreamTransport(streams, partitions),
        topics_for(topic),
        client,
        threshold,
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )


def apply_all(model, events):
    for ev in events:
        model.apply(ev)


def test_two_producers_end_to_end_over_loglake_streams():
    streams = LocalStreams(MemoryLog())
    chain = synthetic_chain(60)
    produce(streams, chain)
    c = consumer(streams)
    model = ChainModel([])
    apply_all(model, c.run())
    assert model.chain == [b.hash for b in chain.canonical]
    assert c.core.consumer.stats.duplicates > 0  # the second producer's copies were dropped
    assert c.errors == 0


def test_messages_land_on_the_partition_their_key_hashes_to():
    streams = LocalStreams(MemoryLog())
    produce(streams, synthetic_chain(5), producers=1)
    for p in range(3):
        for m in streams.pull("chain", 0, 1000, p):
            key, _ = open_envelope(m.data)
            assert partition_for(key, 3) == p


def test_restarted_consumer_resumes_from_the_index_service():
    streams = LocalStreams(MemoryLog())
    chain = synthetic_chain(80)
    produce(streams, chain)
    model = ChainModel([])
    first = consumer(streams, threshold=8)
    for _ in range(6):
        apply_all(model, first.poll(limit=20))
    ckpt = first.commit()
    assert 0 < len(model.chain) < len(chain.canonical)
    assert any(o > 0 for o in ckpt.offsets.values())  # past the reorg window: not from 0
    for source, offset in ckpt.offsets.items():
        topic, _, part = source.rpartition(":")
        assert streams.get_index("c1", topic, int(part)) == offset
    second = consumer(streams, threshold=8)  # loads the checkpoint saved under client id c1
    assert second.core.head == first.core.head
    apply_all(model, second.run())
    assert model.chain == [b.hash for b in chain.canonical]
    other = consumer(streams, client="c2")  # another client starts from the beginning
    m2 = ChainModel([])
    apply_all(m2, other.run())
    assert m2.chain == model.chain


def test_deep_reorg_through_its_channel():
    streams = LocalStreams(MemoryLog())
    chain = synthetic_chain(40, deep_reorg=10)
    produce(streams, chain)
    c = consumer(streams, threshold=8)
    model = ChainModel([])
    events = c.run()
    apply_all(model, events)
    reorgs = [e for e in events if isinstance(e, ReorgEvent)]
    assert [e.complete for e in reorgs] == [False, True]  # the second producer's is skipped
    assert model.chain == [b.hash for b in chain.canonical]
    assert c.core.head.hash == chain.canonical[-1].hash


def test_resume_on_the_embedded_segment_log(tmp_path):
    from loglake.log import open_log

    chain = synthetic_chain(50)
    log = open_log(tmp_path / "data")
    produce(LocalStreams(log), chain)
    first = consumer(LocalStreams(log), threshold=8)
    model = ChainModel([])
    for _ in range(4):
        apply_all(model, first.poll(limit=15))
    assert any(o > 0 for o in first.commit().offsets.values())
    log.close()
    log = open_log(tmp_path / "data")
    try:
        second = consumer(LocalStreams(log), threshold=8)
        assert second.core.head == first.core.head
        apply_all(model, second.run())
    finally:
        log.close()
    assert model.chain == [b.hash for b in chain.canonical]


def test_undecodable_records_are_logged_and_skipped(caplog):
    streams = LocalStreams(MemoryLog())
    chain = synthetic_chain(10)
    streams.create_stream("chain", 3)
    streams.push("chain", b"\x7f", 0)  # bad envelope
    streams.push("chain", envelope(b"\x00" + bytes(32), b"\xff\xff"), 1)  # bad Batch
    produce(streams, chain, producers=1)
    c = consumer(streams)
    model = ChainModel([])
    apply_all(model, c.run())
    assert model.chain == [b.hash for b in chain.canonical]
    assert c.errors == 2
    assert "dropping" in caplog.text


def test_fetch_past_records_retention_removed_says_so(caplog):
    streams = LocalStreams(MemoryLog())
    t = StreamTransport(streams, 1)
    streams.create_stream("blocks", 1)
    for i in range(6):
        streams.push("blocks", f"k{i}".encode(), 0)
    streams.log.truncate_before("blocks", 4)
    with caplog.at_level("WARNING", "loglake.cardinal.transport"):
        got = t.fetch("blocks:0", 1, 10)
    assert [d.offset for d in got] == [4, 5]
    [r] = [r for r in caplog.records if "no longer kept" in r.getMessage()]
    assert r.fields == {"source": "blocks:0", "first_missing": 1, "next_kept": 4}


def test_a_chain_whose_start_retention_removed_says_which_parent_it_waits_for(caplog):
    """Found from outside: a fresh consumer on topics whose first records retention removed
    held every block (none of their parents would ever come), emitted nothing and logged
    nothing. Now, with blocks waiting for a parent and the head still for ``STALL_ROUNDS``
    rounds, a warning names the parent the lowest of them waits for; again after twice as many
    rounds, and so on (4 lines in 64 idle rounds)."""
    import hashlib
    import logging

    from loglake.cardinal.producer import BlockPayload
    from loglake.cardinal.transport import STALL_ROUNDS

    def bh(n: int) -> bytes:
        return hashlib.sha256(b"block %d" % n).digest()

    streams = LocalStreams(MemoryLog())
    sp = StreamProducer(StreamTransport(streams, 1), Producer("chain", {"foo/": "chain"}))
    for n in range(30):
        if n == 10:  # retention removes blocks 0..9: all the topic held before block 10
            cut = len(streams.pull("chain", 0, 10**6))
        sp.send_block(BlockPayload(n, bh(n), bh(n - 1) if n else ZERO_HASH, n + 1, {"foo/x": b"v"}))
    streams.truncate_before("chain", cut)
    caplog.set_level(logging.WARNING, logger="loglake.cardinal.transport")
    c = StreamConsumer(
        StreamTransport(streams, 1),
        ["chain"],
        "fresh",
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )
    assert c.run() == []
    for _ in range(64):  # idle rounds: nothing more comes
        assert c.poll() == []
    stalls = [r for r in caplog.records if r.getMessage().startswith("the chain is not moving")]
    assert [r.fields["rounds"] for r in stalls] == [STALL_ROUNDS * 2**i for i in range(4)]
    fields = stalls[0].fields
    assert fields["missing_parent"] == bh(9).hex() and fields["child"] == 10
    assert fields["head"] == -1 and fields["waiting"] == 20
