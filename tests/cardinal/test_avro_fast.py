"""``avro.decode_batch_common`` (the block job's straight-line Batch decoder where the C kernel
is not built) equals ``avro.decode_batch_reference`` wherever it answers, answers for every
Batch the encoder writes, and says None (never raises, never differs) for hostile bytes: the
reference then judges them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal import avro
from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import ZERO_HASH, BatchRecord

records = st.builds(
    BatchRecord,
    st.binary(max_size=40),
    st.integers(-(2**31), 2**31 - 1),
    st.booleans(),
    st.one_of(st.just(ZERO_HASH), st.binary(min_size=32, max_size=32)),
)
batches = st.tuples(
    st.integers(-(2**62), 2**62 - 1),  # nine octets; a tenth is left to the reference
    st.binary(max_size=40),
    st.binary(min_size=32, max_size=32),
    st.dictionaries(st.text(max_size=12), records, max_size=6),
)


def _reference(data: bytes) -> tuple | None:
    try:
        return avro.decode_batch_reference(data)
    except CardinalDecodeError:
        return None


@settings(max_examples=100, deadline=None)
@given(batches)
def test_decode_batch_common_reads_every_encoded_batch(b):
    data = avro.encode_batch(*b)
    assert avro.decode_batch_common(data) == avro.decode_batch_reference(data)


@settings(max_examples=150, deadline=None)
@given(batches, st.data())
def test_decode_batch_common_on_hostile_bytes_is_none_or_equal(b, data):
    raw = bytearray(avro.encode_batch(*b))
    how = data.draw(st.sampled_from(["truncate", "flip", "append", "random"]))
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    elif how == "flip" and raw:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    elif how == "append":
        raw += data.draw(st.binary(min_size=1, max_size=4))
    else:
        raw = bytearray(data.draw(st.binary(max_size=200)))
    fast = avro.decode_batch_common(bytes(raw))
    ref = _reference(bytes(raw))
    if fast is not None:
        assert fast == ref
    if ref is None:
        assert fast is None


def test_decode_batch_common_leaves_odd_varints_to_the_reference():
    # a non-minimal number (0x80 0x00 is 0) and a 10-octet one: the reference reads both
    tail = avro.encode_batch(0, b"", ZERO_HASH, {})[1:]
    for head in (b"\x80\x00", b"\xff" * 9 + b"\x01"):
        data = head + tail
        assert _reference(data) is not None
        assert avro.decode_batch_common(data) is None


def test_decode_batch_common_reads_several_avro_blocks():
    # the encoder writes 100 entries an Avro block: 250 entries make three blocks
    updates = {f"k{i}": BatchRecord(b"v", i % 3) for i in range(250)}
    data = avro.encode_batch(123456789, b"\x01\x00", bytes(32), updates)
    assert avro.decode_batch_common(data) == avro.decode_batch_reference(data)
