"""Reorg and ReorgComplete numbers (spec "Reorg": ``$Number`` is the common ancestor's block
number; reference ``delivery/types.go``: written as ``AvroInt``, an int32): the producer
refuses what the wire cannot carry with ``ProducerError``, the consumer refuses a negative
number with ``CardinalDecodeError`` and its chain is untouched."""

from __future__ import annotations

import pytest

from loglake.cardinal import avro
from loglake.cardinal.codec import decode, encode
from loglake.cardinal.errors import CardinalDecodeError, ProducerError
from loglake.cardinal.messages import ZERO_HASH, Reorg, ReorgComplete, SubBatchHeader, SubBatchMsg
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer
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
