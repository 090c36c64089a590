"""Block numbers on the wire. Reorg and ReorgComplete (spec "Reorg": ``$Number`` is the common
ancestor's block number; reference ``delivery/types.go``: written as ``AvroInt``, an int32):
the producer refuses what the wire cannot carry with ``ProducerError``, the consumer refuses a
negative number with ``CardinalDecodeError`` and its chain is untouched. A Batch's ``num`` (an
Avro long, the spec's "64 bit unsigned integer"): the same for a negative one, and a consumer
that was sent one still restarts from its checkpoint."""

from __future__ import annotations

import pytest

from loglake.cardinal import avro
from loglake.cardinal.codec import decode, encode
from loglake.cardinal.errors import CardinalDecodeError, ProducerError
from loglake.cardinal.messages import (
    ZERO_HASH,
    Batch,
    Reorg,
    ReorgComplete,
    SubBatchHeader,
    SubBatchMsg,
)
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer
from loglake.cardinal.synthetic import schema_for, synthetic_chain, topics_for
from loglake.cardinal.transport import StreamConsumer, StreamProducer, StreamTransport
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.cardinal.helpers import h


@pytest.mark.parametrize("number", [2**31, 2**40, -1, -5])
@pytest.mark.parametrize("cls", [Reorg, ReorgComplete])
def test_encoder_refuses_numbers_outside_a_non_negative_int32(cls, number):
    with pytest.raises(ProducerError, match=r"outside 0\.\.2147483647"):
        encode(cls(h(1), number))


@pytest.mark.parametrize("number", [2**31, -5])
def test_producer_reorg_refuses_numbers_outside_the_wire_range(number):
    p = Producer("chain")
    with pytest.raises(ProducerError):
        p.reorg(number, h(1))
    with pytest.raises(ProducerError):
        p.reorg_done(number, h(1))
    with pytest.raises(ProducerError):
        p.reorg_channel(number, h(1), [])


def test_largest_int32_number_round_trips():
    for cls in (Reorg, ReorgComplete):
        msg = cls(h(1), 2**31 - 1)
        assert decode(*encode(msg)) == msg


@pytest.mark.parametrize("msg", [SubBatchHeader(h(1), h(2), -1), SubBatchHeader(h(1), h(2), 2**31)])
def test_encoder_refuses_item_counts_outside_int32(msg):
    with pytest.raises(ProducerError):
        encode(msg)


@pytest.mark.parametrize("index", [-1, 2**31])
def test_encoder_refuses_sub_batch_indexes_outside_int32(index):
    with pytest.raises(ProducerError):
        encode(SubBatchMsg(h(1), h(2), index, frozenset(), {}))


@pytest.mark.parametrize("prefix", [b"\x05", b"\x06"])
def test_decoder_refuses_a_negative_number(prefix):
    with pytest.raises(CardinalDecodeError, match="negative block number -5"):
        decode(prefix + h(1), avro.long_bytes(-5))


def test_consumer_keeps_block_zero_on_a_negative_reorg():
    block0 = BlockPayload(0, h(100), ZERO_HASH, 1, {"k": b"v"})
    producer = Producer("chain")
    c = OrderedConsumer(reorg_threshold=8)
    added = []
    for msgs in producer.block_messages(block0).values():
        for m in msgs:
            for u in c.receive(*encode(m), source="chain:0", offset=0):
                added += [b.number for b in u.added]
    assert added == [0]
    before = c.checkpoint()
    with pytest.raises(CardinalDecodeError):
        c.receive(b"\x05" + h(7), avro.long_bytes(-5), "chain:0", 1)
    assert c.head is not None and c.head.hash == h(100)
    assert c.checkpoint().chain == before.chain
    assert isinstance(Checkpoint.from_bytes(c.checkpoint().to_bytes()), Checkpoint)


@pytest.mark.parametrize("number", [-1, -1000, avro.INT64_MIN])
def test_batch_with_a_negative_number_is_refused_both_ways(number):
    value = avro.encode_batch(number, b"\x01", h(2), {})
    with pytest.raises(CardinalDecodeError, match=f"negative block number {number}"):
        decode(b"\x00" + h(1), value)
    with pytest.raises(ProducerError, match="outside 0"):
        encode(Batch(h(1), number, 1, h(2), {}))


def test_batch_number_bounds_round_trip():
    for number in (0, avro.INT64_MAX):
        msg = Batch(h(1), number, 1, h(2), {})
        assert decode(*encode(msg)) == msg


def test_consumer_sent_a_negative_batch_restarts_from_its_checkpoint():
    """Found from outside: one Batch numbered -1000 (an Avro long the decoder took) was dropped
    as older than the reorg window but remembered as done, and the checkpoint then written held
    a number its loader refuses: the restarted consumer failed with ``CheckpointError`` until
    its state was edited by hand."""
    streams = LocalStreams(MemoryLog())
    t = StreamTransport(streams, partitions=1)
    sp = StreamProducer(t, Producer("chain", schema_for("chain")))
    sp.send_blocks(synthetic_chain(10, lose_every=0, win_every=0).canonical)
    c = StreamConsumer(t, topics_for("chain"), "me")
    for _ in range(5):
        c.poll(limit=300)
    head = c.core.head
    c.commit()
    hostile = b"\x00" + h(0x66), avro.encode_batch(-1000, b"\x01", h(0x67), {})
    t.send("chain", [hostile])
    sp.send_blocks(synthetic_chain(12, lose_every=0, win_every=0).canonical[10:])
    for _ in range(5):
        c.poll(limit=300)
    ck = c.commit()
    assert c.core.head is not None and head is not None
    assert c.core.head.number == head.number + 2
    assert all(n >= 0 for n, _ in ck.done)
    again = StreamConsumer(StreamTransport(streams, partitions=1), topics_for("chain"), "me")
    assert again.core.head == c.core.head
