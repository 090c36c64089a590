"""Codec: keys exactly as the spec lays them out, values byte-identical to the reference.

Where the vectors come from: the reference marshals with hamba/avro v1.6.6 (cardinal-streams
go.mod). Its writer (``writer.go: WriteBlockHeader``/``WriteBlockCB``) writes a non-empty
map/array block as zig-zag(-count), zig-zag(byte size), items, and ends with 0; ``int`` and
``long`` are zig-zag varints (``codec_native.go``), ``fixed`` raw bytes. The values below are the
reference tests' own inputs (``delivery/types_test.go: TestSerializer``,
``delivery/producer_test.go: TestProducer``, ``delivery/consumer_test.go: TestConsumerReorg``)
encoded by those rules by hand, byte by byte, with one-entry maps (Go's map order is random).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.cardinal import avro
from loglake.cardinal.codec import decode, encode, weight_bytes
from loglake.cardinal.errors import CardinalDecodeError, ProducerError
from loglake.cardinal.messages import (
    ZERO_HASH,
    Batch,
    BatchDeleteMsg,
    BatchMsg,
    BatchRecord,
    Ping,
    Reorg,
    ReorgComplete,
    SubBatchHeader,
    SubBatchMsg,
)
from tests.cardinal.helpers import h

SCHEMAS = Path(__file__).parents[2] / "src/loglake/cardinal"
BATCH_SCHEMA = fastavro.parse_schema(json.loads((SCHEMAS / "batch.avsc").read_text()))
UPDATE_SCHEMA = fastavro.parse_schema(json.loads((SCHEMAS / "update.avsc").read_text()))

# TestSerializer's Batch with Updates {"/foo": {Value: "bar"}}: num 0, weight []byte{0},
# parent HexToHash("01"). Block: -1 items (0x01), 43 bytes (0x56): "/foo" 08 2f666f6f,
# value 06 626172, count 00, delete 00, subbatch 32 x 00; then the 0 terminator.
SERIALIZER_BATCH = (
    b"\x00"  # num 0
    + b"\x02\x00"  # weight: length 1, byte 0
    + h(1)  # parent
    + b"\x01\x56"  # block: 1 item, 43 bytes
    + b"\x08/foo"
    + b"\x06bar\x00\x00"
    + ZERO_HASH
    + b"\x00"
)
# TestSerializer's SubBatchRecord{Delete: ["/foo"]}: array block -1 (0x01), 5 bytes (0x0a),
# "/foo", end; empty updates map: 0.
SERIALIZER_UPDATE = b"\x01\x0a\x08/foo\x00\x00"


def test_batch_value_matches_reference_serializer_vector():
    got = avro.encode_batch(0, b"\x00", h(1), {"/foo": BatchRecord(value=b"bar")})
    assert got == SERIALIZER_BATCH


def test_update_value_matches_reference_serializer_vector():
    assert avro.encode_update(["/foo"], {}) == SERIALIZER_UPDATE


def test_avro_int_vectors():
    # zig-zag varints (Avro spec "Binary Encoding" table: 0→00, -1→01, 1→02, -2→03, 64→80 01)
    assert [avro.int_bytes(n) for n in (0, -1, 1, -2, 2, 64)] == [
        b"\x00",
        b"\x01",
        b"\x02",
        b"\x03",
        b"\x04",
        b"\x80\x01",
    ]
    with pytest.raises(OverflowError):
        avro.int_bytes(2**31)


def test_producer_test_sub_batch_header_key_and_value():
    # TestProducer: SubBatchHeaderType.GetKey(HexToHash("01"), HexToHash("ff")); 2 items
    key, value = encode(SubBatchHeader(h(1), h(0xFF), 2))
    assert key == b"\x01" + h(1) + h(0xFF)
    assert value == b"\x04"


def test_producer_test_sub_batch_messages():
    # SendBatch(ff, ["whatever/", "other/"], {"state/thing": "thing!"}): index 0 carries the
    # deletes (block of 2 items = 0x03, 17 bytes = 0x22), index 1 the one update
    # (empty array, map block of 1 = 0x01, 19 bytes = 0x26).
    k0, v0 = encode(SubBatchMsg(h(1), h(0xFF), 0, ("whatever/", "other/"), {}))
    assert k0 == b"\x02" + h(1) + h(0xFF) + b"\x00"
    assert v0 == b"\x03\x22\x12whatever/\x0cother/\x00\x00"
    k1, v1 = encode(SubBatchMsg(h(1), h(0xFF), 1, (), {"state/thing": b"thing!"}))
    assert k1 == b"\x02" + h(1) + h(0xFF) + b"\x02"
    assert v1 == b"\x00\x01\x26\x16state/thing\x0cthing!\x00"


def test_reorg_keys_match_consumer_reorg_test():
    # TestConsumerReorg: p.Reorg(0, HexToHash("00")), p.ReorgDone(0, HexToHash("00"))
    assert encode(Reorg(h(0), 0)) == (b"\x05" + h(0), b"\x00")
    assert encode(ReorgComplete(h(0), 0)) == (b"\x06" + h(0), b"\x00")
    assert decode(b"\x05" + h(0), b"\x00") == Reorg(h(0), 0)


def test_batch_msg_and_delete_keys():
    # BatchMsgType.GetKey(hash.Bytes(), []byte(k)), value v; delete has an empty value
    assert encode(BatchMsg(h(1), "foo/something", b"x")) == (
        b"\x03" + h(1) + b"foo/something",
        b"x",
    )
    assert encode(BatchDeleteMsg(h(1), "foo/delete")) == (b"\x04" + h(1) + b"foo/delete", b"")


def test_weight_is_go_big_int_bytes():
    assert weight_bytes(0) == b""
    assert weight_bytes(1) == b"\x01"
    assert weight_bytes(256) == b"\x01\x00"
    assert weight_bytes(2**256 - 1) == b"\xff" * 32
    with pytest.raises(ProducerError):
        weight_bytes(2**256)
    with pytest.raises(ProducerError):
        weight_bytes(-1)


def test_map_over_100_entries_is_split_in_hamba_blocks():
    ups = {f"k{i:03}": b"" for i in range(150)}
    v = avro.encode_update([], ups)
    r = avro.Reader(v, "t")
    assert r.long() == 0  # empty delete array
    assert r.long() == -100  # first block: 100 items, with a byte size
    size = r.long()
    r.pos += size
    assert r.long() == -50
    assert avro.decode_update(v) == ((), ups)


def _batch(updates):
    return Batch(h(7), 12345, 2**200 + 3, h(6), updates)


records = st.builds(
    BatchRecord,
    value=st.binary(max_size=20),
    count=st.integers(0, 2**31 - 1),
    delete=st.booleans(),
    subbatch=st.binary(min_size=32, max_size=32),
)


@given(st.dictionaries(st.text(max_size=10), records, max_size=120))
def test_batch_round_trips_and_fastavro_reads_our_bytes(updates):
    msg = _batch(updates)
    key, value = encode(msg)
    assert decode(key, value) == msg
    rec = fastavro.schemaless_reader(io.BytesIO(value), BATCH_SCHEMA)
    assert rec["num"] == 12345 and rec["parent"] == h(6)
    assert {
        k: (v["value"], v["count"], v["delete"], v["subbatch"]) for k, v in rec["updates"].items()
    } == {k: (r.value, r.count, r.delete, r.subbatch) for k, r in updates.items()}


@given(
    st.lists(st.text(max_size=8), max_size=120),
    st.dictionaries(st.text(max_size=8), st.binary(max_size=8), max_size=120),
)
def test_we_read_fastavro_bytes_and_fastavro_reads_ours(deletes, updates):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, UPDATE_SCHEMA, {"delete": deletes, "updates": updates})
    assert avro.decode_update(buf.getvalue()) == (tuple(deletes), updates)
    ours = avro.encode_update(deletes, updates)
    rec = fastavro.schemaless_reader(io.BytesIO(ours), UPDATE_SCHEMA)
    assert rec == {"delete": deletes, "updates": updates}


@given(
    st.sampled_from(
        [
            Batch(h(1), 0, 0, h(0), {"a": BatchRecord(count=2)}),
            SubBatchHeader(h(1), h(2), 0),
            SubBatchMsg(h(1), h(2), 300, ("d",), {"u": b"v"}),
            BatchMsg(h(1), "k/é", b"v"),
            BatchDeleteMsg(h(1), ""),
            Reorg(h(3), 2**31 - 1),
            ReorgComplete(h(3), 0),
            Ping(h(9), b"t"),
        ]
    )
)
def test_every_type_round_trips(msg):
    assert decode(*encode(msg)) == msg


BAD = [
    (b"", b"", "unknown", "empty key"),
    (b"\x09" + h(1), b"", "unknown", "prefix byte 0x09"),
    (b"\x00" + h(1)[:5], SERIALIZER_BATCH, "Batch", "33 bytes"),
    (b"\x00" + h(1), SERIALIZER_BATCH[:-1], "Batch", "past the end"),
    (b"\x00" + h(1), SERIALIZER_BATCH + b"\x00", "Batch", "trailing"),
    (b"\x00" + h(1), b"\x00\x42" + b"\x01" * 33 + h(0) + b"\x00", "Batch", "weight"),
    (b"\x01" + h(1) + h(2), b"\x01", "SubBatchHeader", "negative item count"),
    (b"\x01" + h(1) + h(2), b"\x80\x80\x80\x80\x10", "SubBatchHeader", "overflows an int"),
    (b"\x01" + h(1), b"\x02", "SubBatchHeader", "65 bytes"),
    (b"\x02" + h(1) + h(2), b"\x00\x00", "SubBatchMsg", "no index"),
    (b"\x02" + h(1) + h(2) + b"\x80", b"\x00\x00", "SubBatchMsg", "past the end"),
    (b"\x02" + h(1) + h(2) + b"\x00", b"\x05\x00", "SubBatchMsg", "cannot fit"),
    (b"\x02" + h(1) + h(2) + b"\x00", b"\x01\x7f\x00", "SubBatchMsg", "block size"),
    (b"\x03" + h(1)[:3], b"v", "BatchMsg", "shorter than 33"),
    (b"\x04" + h(1) + b"k", b"v", "BatchDeleteMsg", "must be empty"),
    (b"\x05" + h(1), b"", "Reorg", "past the end"),
    (b"\x06" + h(1) + b"x", b"\x00", "ReorgComplete", "33 bytes"),
    (
        b"\x00" + h(1),
        b"\x00\x00" + h(0) + b"\x02\x02a\x00\x00\x05" + ZERO_HASH + b"\x00",
        "Batch",
        "neither 0 nor 1",
    ),
]


@pytest.mark.parametrize(("key", "value", "type_name", "problem"), BAD)
def test_malformed_input_raises_typed_error_naming_type_and_problem(key, value, type_name, problem):
    with pytest.raises(CardinalDecodeError) as e:
        decode(key, value)
    assert e.value.message_type == type_name
    assert problem in e.value.problem


@given(st.binary(max_size=80), st.binary(max_size=80))
def test_garbage_never_escapes_as_an_untyped_error(key, value):
    with contextlib.suppress(CardinalDecodeError):
        decode(key, value)


def test_encoder_refuses_bad_hash_sizes():
    with pytest.raises(ProducerError):
        encode(BatchMsg(b"short", "k", b"v"))
    with pytest.raises(ProducerError):
        encode(Batch(h(1), 0, 0, b"x", {}))
