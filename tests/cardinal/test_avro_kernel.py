"""The Batch decode in C (``loglake.cardinal._avro``) against the Python reader it stands in for
(``avro.decode_batch_reference``): the same fields for every Batch, written in either Avro block
form (the reference's negative counts with sizes, fastavro's positive counts); for hostile bytes
the same outcome, value or ``CardinalDecodeError`` with the same text; the reference
implementation's vector; and the Python path taking over where the kernel is not built."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal import avro
from loglake.cardinal.consumer import AssembledBlock, assemble_block, assemble_blocks
from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import ZERO_HASH, BatchRecord
from loglake.wire.varint import encode_uleb, encode_zigzag
from tests.cardinal.helpers import h
from tests.cardinal.test_codec import SERIALIZER_BATCH

_avro = avro._avro
# the install builds it where a C compiler is (setup.py; ``make test`` installs gcc first): a
# missing build skips these tests on a developer's machine and fails them under CI=true
pytestmark = pytest.mark.peer(
    "loglake.cardinal._avro (the Batch decode in C)",
    _avro is not None,
    "a C compiler and Python's headers: apt-get install gcc python3-dev, then make test",
)

BATCH_SCHEMA = fastavro.parse_schema(
    json.loads((Path(avro.__file__).parent / "batch.avsc").read_text())
)
I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
records = st.builds(
    BatchRecord,
    st.binary(max_size=40),
    I32,
    st.booleans(),
    st.one_of(st.just(ZERO_HASH), st.binary(min_size=32, max_size=32)),
)
keys = st.one_of(
    st.text(max_size=12),
    # keys that are not UTF-8 (the reference reads them with surrogateescape)
    st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
batches = st.tuples(
    I64,
    st.binary(max_size=40),
    st.binary(min_size=32, max_size=32),
    st.dictionaries(keys, records, max_size=8),
)


def outcome(decode, data: bytes) -> tuple:
    """What a decoder says of ``data``: its fields with their exact types, or its error."""
    try:
        number, weight, parent, updates = decode(data)
    except CardinalDecodeError as e:
        return ("error", type(e), str(e), e.message_type, e.problem)
    entries = [
        (type(k), k, type(r), *((type(v), v) for v in (r.value, r.count, r.delete, r.subbatch)))
        for k, r in updates.items()
    ]
    return (type(number), number, type(weight), weight, type(parent), parent, entries)


def same(data: bytes) -> tuple:
    got = outcome(_avro.decode_batch, data)
    assert got == outcome(avro.decode_batch_reference, data)
    return got


def fastavro_bytes(number: int, weight: bytes, parent: bytes, updates: dict) -> bytes:
    """The same Batch as fastavro writes it: positive block counts, no sizes."""
    out = io.BytesIO()
    record = {
        "num": number,
        "weight": weight,
        "parent": parent,
        "updates": {
            k: {"value": r.value, "count": r.count, "delete": r.delete, "subbatch": r.subbatch}
            for k, r in updates.items()
        },
    }
    fastavro.schemaless_writer(out, BATCH_SCHEMA, record)
    return out.getvalue()


def test_reference_serializer_vector_through_the_kernel():
    # delivery/types_test.go TestSerializer's Batch, as hamba/avro writes it (test_codec)
    assert _avro.decode_batch(SERIALIZER_BATCH) == (
        0,
        b"\x00",
        h(1),
        {"/foo": BatchRecord(value=b"bar")},
    )
    same(SERIALIZER_BATCH)


def test_decode_batch_is_the_kernel_where_it_is_built():
    assert avro.decode_batch is _avro.decode_batch
    assert avro.decode_batch_or_none(SERIALIZER_BATCH) == avro.decode_batch_reference(
        SERIALIZER_BATCH
    )
    assert avro.decode_batch_or_none(SERIALIZER_BATCH[:-1]) is None


@settings(max_examples=200, deadline=None)
@given(batches)
def test_kernel_equals_reference_field_by_field_on_every_batch(b):
    forms = [avro.encode_batch(*b)]
    if all(k.isascii() or not any("\udc80" <= c <= "\udcff" for c in k) for k in b[3]):
        forms.append(fastavro_bytes(*b))  # (fastavro writes keys as strict UTF-8)
    for data in forms:
        got = same(data)
        assert got[0] is int  # a value, not an error
        assert _avro.decode_batch(data) == (b[0], b[1], b[2], b[3])


def test_kernel_reads_several_hamba_blocks_and_repeated_keys():
    updates = {f"k{i}": BatchRecord(b"v", i % 3, i % 2 == 0, h(i % 5)) for i in range(250)}
    same(avro.encode_batch(123456789, b"\x01\x00", bytes(32), updates))
    # a key twice, in two positive-count blocks: first place, last value (a dict's rule)
    entry = encode_zigzag(1) + b"a" + encode_zigzag(1) + b"%s" + b"\x00\x00" + ZERO_HASH
    data = b"\x00\x00" + h(1) + b"\x02" + entry % b"x" + b"\x02" + entry % b"y" + b"\x00"
    got = _avro.decode_batch(data)
    assert got[3] == {"a": BatchRecord(b"y")}
    same(data)


MUTATIONS = ["truncate", "flip", "append", "insert", "delete", "random", "splice"]


@settings(max_examples=400, deadline=None)
@given(batches, st.data())
def test_kernel_equals_reference_on_hostile_bytes(b, data):
    raw = bytearray(avro.encode_batch(*b))
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(MUTATIONS))
        i = data.draw(st.integers(0, len(raw)))
        if how == "truncate":
            del raw[i:]
        elif how == "flip" and i < len(raw):
            raw[i] = data.draw(st.integers(0, 255))
        elif how == "append":
            raw += data.draw(st.binary(min_size=1, max_size=4))
        elif how == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=11))
        elif how == "delete":
            del raw[i : i + data.draw(st.integers(1, 3))]
        elif how == "splice":  # a varint of any size where a count or length was
            raw[i:i] = encode_zigzag(data.draw(I64))
        else:
            raw = bytearray(data.draw(st.binary(max_size=200)))
    same(bytes(raw))


def _varint(z: int) -> bytes:
    return encode_uleb(z)


TAIL = b"\x00" + h(1) + b"\x00"  # empty weight, parent, no updates
ENTRY = b"\x02a\x00\x00\x00" + ZERO_HASH  # "a": empty value, count 0, not deleted


@pytest.mark.parametrize(
    "data, problem",
    [
        # zig-zag extremes and the odd varint forms the reference accepts
        (encode_zigzag(2**63 - 1) + TAIL, None),
        (encode_zigzag(-(2**63)) + TAIL, None),
        (b"\x80\x00" + TAIL, None),  # non-minimal 0
        (b"\xff" * 9 + b"\x01" + TAIL, None),  # ten octets, 2**64 - 1: -(2**63)
        # over-long and overflowing varints
        (b"\xff" * 10 + b"\x01" + TAIL, "num: varint longer than 10 bytes"),
        (b"\xff" * 9 + b"\x02" + TAIL, "num: -13835058055282163712 overflows a long"),
        (b"\xfe" + b"\xff" * 8 + b"\x02" + TAIL, "num: 13835058055282163711 overflows a long"),
        (b"\xff" * 9 + b"\x7f" + TAIL, "num: -590295810358705651712 overflows a long"),
        (b"\x80" * 4, "num: varint runs past the end"),
        (b"", "num: varint runs past the end"),
        # negative, too long and truncated lengths
        (b"\x00\x01" + h(1) + b"\x00", "weight: negative length -1"),
        (b"\x00" + encode_zigzag(2**62) + h(1), "weight: needs 4611686018427387904 bytes"),
        (b"\x00\x00" + h(1)[:31], "parent: needs 32 bytes, 31 left"),
        (b"\x00\x00" + h(1) + b"\x02\x01a", "updates key: negative length -1"),
        (b"\x00\x00" + h(1) + b"\x02" + ENTRY[:-1], "update.subbatch: needs 32 bytes, 31 left"),
        (b"\x00\x00" + h(1) + b"\x02\x02a\x00\x00", "update.delete: needs 1 bytes, 0 left"),
        # huge counts, a block size past the end, out-of-range fields
        (b"\x00\x00" + h(1) + encode_zigzag(2**62), "4611686018427387904 items cannot fit"),
        (b"\x00\x00" + h(1) + _varint(2**64 - 1) + b"\x00", "9223372036854775808 items"),
        (b"\x00\x00" + h(1) + b"\x01\x7e" + ENTRY, "block size 63 runs past the end"),
        (b"\x00\x00" + h(1) + b"\x01\x01" + ENTRY, "block size -1 runs past the end"),
        (
            b"\x00\x00" + h(1) + b"\x02\x02a\x00" + encode_zigzag(2**31),
            "update.count: 2147483648 overflows an int",
        ),
        (b"\x00\x00" + h(1) + b"\x02\x02a\x00\x00\x02" + ZERO_HASH, "boolean byte 2"),
        (TAIL[:1] + TAIL + b"\x00", "1 trailing bytes"),
        (b"\x00\x00" + h(1) + b"\x02" + ENTRY, "updates block count: varint runs past"),
    ],
)
def test_kernel_edge_cases_answer_as_the_reference(data, problem):
    got = same(data)
    if problem is None:
        assert got[0] is int
    else:
        assert got[0] == "error" and problem in got[2]


def test_kernel_errors_on_every_truncation_as_the_reference():
    updates = {"k": BatchRecord(b"v" * 200, 5, True, h(3)), "k2": BatchRecord(count=-7)}
    data = avro.encode_batch(-(2**40), b"\x07" * 3, h(2), updates)
    for end in range(len(data)):
        assert same(data[:end])[0] == "error"


def test_kernel_takes_any_buffer_and_refuses_other_types_typed():
    data = avro.encode_batch(5, b"\x01", h(1), {"x": BatchRecord(b"y")})
    for buf in (bytearray(data), memoryview(data)):
        assert _avro.decode_batch(buf) == avro.decode_batch_reference(data)
    with pytest.raises(TypeError):
        _avro.decode_batch("not bytes")


def test_block_assembly_is_the_same_through_the_kernel(monkeypatch):
    # the block job's path (assemble_blocks, whose common case reads the Batch with
    # decode_batch_or_none) over a Batch and its BatchMsgs: the same block as the assembler's
    # message-by-message path, and as with the Python decoder
    batch = avro.encode_batch(
        9, b"\x01", h(8), {"a/": BatchRecord(count=2), "b": BatchRecord(b"inline")}
    )
    messages = [
        (b"\x00" + h(9), batch, "p0", 4),
        (b"\x03" + h(9) + b"a/1", b"one", "p0", 5),
        (b"\x03" + h(9) + b"a/2", b"two", "p1", 2),
    ]
    [with_kernel] = assemble_blocks([messages])
    assert with_kernel.block is not None
    assert with_kernel.block.values == {"b": b"inline", "a/1": b"one", "a/2": b"two"}
    assert _fields(with_kernel) == _fields(assemble_block(messages))
    monkeypatch.setattr("loglake.cardinal.consumer.decode_batch_or_none", avro.decode_batch_common)
    assert _fields(assemble_blocks([messages])[0]) == _fields(with_kernel)


def _fields(done: AssembledBlock) -> tuple:
    b = done.block
    assert b is not None  # (Block compares by identity: its fields are compared here)
    return (b.number, b.hash, b.parent, b.weight, b.values, b.deletes, b.offsets), done.kept


def test_without_the_kernel_the_python_reader_decodes():
    # a process where the extension cannot be imported (as where no compiler built it)
    script = (
        "import sys; sys.modules['loglake.cardinal._avro'] = None\n"
        "from loglake.cardinal import avro\n"
        "assert avro._avro is None\n"
        "assert avro.decode_batch is avro.decode_batch_reference\n"
        "assert avro.decode_batch_or_none is avro.decode_batch_common\n"
        f"print(avro.decode_batch({SERIALIZER_BATCH!r})[3])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "BatchRecord(value=b'bar'" in out.stdout
