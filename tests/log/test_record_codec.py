"""The segment record format (``loglake/log/record_codec.py`` docstring) and its decoder's
behaviour on bad bytes.

Vectors: the frames below are built field by field from the format in the module docstring,
and the CRC is computed with a bitwise CRC-32C written here from its definition (reflected
polynomial 0x82F63B78, init and final xor 0xFFFFFFFF; RFC 3720 §B.4, whose check value for
"123456789" is 0xE3069283), independently of the ``crc32c`` package the codec uses.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.errors import DecodeError
from loglake.log import Entry
from loglake.log.record_codec import (
    CorruptRecord,
    RecordDecodeError,
    TornRecord,
    decode_frame,
    encode_batch,
    encode_entries,
    encode_plain,
    plain_columns,
    scan,
)


def crc32c_reference(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_reference_crc_matches_the_rfc3720_check_value():
    assert crc32c_reference(b"123456789") == 0xE3069283


def test_vector_plain_record():
    body = (
        struct.pack("<Q", 1)  # index
        + struct.pack("<q", 2)  # timestamp_ns
        + b"\x00"  # flags: no key
        + b"\x00\x00"  # header_count
        + b"hi"  # data
    )
    frame = struct.pack("<II", len(body), crc32c_reference(body)) + body
    assert encode_entries([Entry(b"hi", timestamp_ns=2)], 1, 999) == [frame]
    r = decode_frame(frame)
    assert (r.index, r.timestamp_ns, r.key, r.headers, r.data, r.size) == (
        1,
        2,
        None,
        (),
        b"hi",
        29,
    )


def test_vector_record_with_key_and_headers():
    body = (
        struct.pack("<Qq", 7, -5)
        + b"\x01"  # flags: key present
        + struct.pack("<I", 1)
        + b"K"
        + struct.pack("<H", 2)
        + struct.pack("<H", 1)
        + b"a"
        + struct.pack("<I", 0)
        + struct.pack("<H", 2)
        + "é".encode()
        + struct.pack("<I", 2)
        + b"\x00\xff"
        + b"payload"
    )
    frame = struct.pack("<II", len(body), crc32c_reference(body)) + body
    entry = Entry(b"payload", key=b"K", headers=(("a", b""), ("é", b"\x00\xff")), timestamp_ns=-5)
    assert encode_entries([entry], 7, 0) == [frame]
    r = decode_frame(frame)
    assert (r.key, r.headers, r.data) == (b"K", (("a", b""), ("é", b"\x00\xff")), b"payload")


def test_encode_batch_offsets_and_now_timestamp():
    buf, offsets, max_ts = encode_batch([Entry(b"a"), Entry(b"bb", timestamp_ns=10**18)], 5, 77)
    assert offsets[0] == 0 and offsets[1] == decode_frame(buf).size
    recs, end, err = scan(buf)
    assert err is None and end == len(buf)
    assert [(r.index, r.timestamp_ns, r.data) for r in recs] == [(5, 77, b"a"), (6, 10**18, b"bb")]
    assert max_ts == 10**18


headers_st = st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=4)
entry_st = st.builds(
    Entry,
    data=st.binary(max_size=300),
    key=st.one_of(st.none(), st.binary(max_size=30)),
    headers=headers_st.map(tuple),
    timestamp_ns=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)


@given(st.lists(entry_st, min_size=1, max_size=10), st.integers(0, 2**63 - 100))
def test_round_trip(entries, first):
    buf, _, _ = encode_batch(entries, first, 123)
    recs, end, err = scan(buf)
    assert err is None and end == len(buf)
    for i, (e, r) in enumerate(zip(entries, recs, strict=True)):
        assert r.index == first + i
        assert r.timestamp_ns == (123 if e.timestamp_ns is None else e.timestamp_ns)
        assert (r.key, r.headers, r.data) == (e.key, e.headers, e.data)


@settings(max_examples=300)
@given(st.binary(max_size=200), st.integers(0, 50))
def test_garbage_raises_only_typed_errors(garbage, pos):
    try:
        r = decode_frame(garbage, min(pos, len(garbage)))
    except RecordDecodeError as e:
        assert isinstance(e, DecodeError)
        assert isinstance(e, TornRecord | CorruptRecord)
    else:  # only possible if the garbage carries a valid CRC32C over its body
        assert r.size <= len(garbage)
    _recs, end, err = scan(garbage)
    assert end <= len(garbage)
    assert (err is None) == (end == len(garbage))


@settings(max_examples=200)
@given(st.lists(entry_st, min_size=1, max_size=3), st.data())
def test_every_truncation_is_torn_and_every_byte_flip_is_detected(entries, data):
    buf, offsets, _ = encode_batch(entries, 0, 1)
    last = offsets[-1]
    cut = data.draw(st.integers(last, len(buf) - 1))
    recs, end, err = scan(buf[:cut])
    assert isinstance(err, TornRecord) or (cut == last and err is None)
    assert len(recs) == len(entries) - 1 and end == last
    at = data.draw(st.integers(last, len(buf) - 1))
    bit = data.draw(st.integers(0, 7))
    bad = bytearray(buf)
    bad[at] ^= 1 << bit
    recs, end, err = scan(bytes(bad))
    # a flipped bit is never decoded as a record: the scan stops at the damaged frame
    assert len(recs) == len(entries) - 1 and end == last
    assert isinstance(err, RecordDecodeError)


def test_implausible_length_is_corrupt_not_torn():
    with pytest.raises(CorruptRecord):
        decode_frame(struct.pack("<II", 0xFFFFFFFF, 0) + b"x" * 20)
    with pytest.raises(CorruptRecord):
        decode_frame(struct.pack("<II", 3, 0) + b"abc")


def test_unknown_flags_and_fields_past_the_body_are_corrupt():
    def frame(body: bytes) -> bytes:
        return struct.pack("<II", len(body), crc32c_reference(body)) + body

    with pytest.raises(CorruptRecord, match="flags"):
        decode_frame(frame(struct.pack("<QqB", 0, 0, 0x80) + b"\x00\x00"))
    with pytest.raises(CorruptRecord, match="key"):
        decode_frame(frame(struct.pack("<QqB", 0, 0, 1) + struct.pack("<I", 99) + b"\x00\x00"))
    with pytest.raises(CorruptRecord):
        decode_frame(frame(struct.pack("<QqB", 0, 0, 0) + struct.pack("<H", 3)))
    with pytest.raises(CorruptRecord, match="UTF-8"):
        body = struct.pack("<QqBHH", 0, 0, 0, 1, 1) + b"\xff" + struct.pack("<I", 0)
        decode_frame(frame(body))


@given(st.lists(st.binary(max_size=40), max_size=12), st.integers(0, 2**40), st.integers(0, 2**62))
def test_encode_plain_is_encode_batch_without_entries(datas, first, now):
    assert encode_plain(datas, first, now) == encode_batch([Entry(d) for d in datas], first, now)


def plain_columns_reference(buf: bytes, first: int):
    """What a frame-by-frame walk (``scan``) says about a segment: the first problem in frame
    order wins. Returns the columns as lists, None for a record with a key or headers."""
    records, _, error = scan(buf)
    for j, r in enumerate(records):
        if r.key is not None or r.headers:
            return None
        if r.index != first + j:
            raise CorruptRecord(r.offset, f"index {r.index}, expected {first + j}")
    if error is not None:
        raise error
    return [r.index for r in records], [r.timestamp_ns for r in records], [r.data for r in records]


@settings(max_examples=300)
@given(
    st.lists(st.binary(max_size=30), min_size=1, max_size=8),
    st.booleans(),
    st.sampled_from(["none", "flip", "cut", "keyed", "gap"]),
    st.data(),
)
def test_plain_columns_agrees_with_a_frame_by_frame_scan(datas, same_size, damage, data):
    # plain_columns checks a whole segment with numpy; it must find exactly what a scan finds,
    # at the same offset, on equal-size frames (the strided path) and on mixed sizes.
    if same_size:
        datas = [d.ljust(30, b".") for d in datas]
    entries = [Entry(d, timestamp_ns=i) for i, d in enumerate(datas)]
    if damage == "keyed":
        k = data.draw(st.integers(0, len(entries) - 1))
        entries[k] = Entry(datas[k], key=b"k")
    buf, _, _ = encode_batch(entries, 7, 0)
    first = 7
    if damage == "flip":
        i = data.draw(st.integers(0, len(buf) - 1))
        buf = buf[:i] + bytes([buf[i] ^ (1 << data.draw(st.integers(0, 7)))]) + buf[i + 1 :]
    elif damage == "cut":
        buf = buf[: data.draw(st.integers(0, len(buf) - 1))]
    elif damage == "gap":
        first = 6
    try:
        want = plain_columns_reference(buf, first)
    except RecordDecodeError as e:
        with pytest.raises(type(e)) as got:
            plain_columns(buf, first, every=3)
        assert got.value.offset == e.offset
        return
    cols = plain_columns(buf, first, every=3)
    if want is None:
        assert cols is None
        return
    assert cols is not None
    got_data = [buf[a:b] for a, b in zip(cols.data_start, cols.data_end, strict=True)]
    assert (cols.index.tolist(), cols.timestamp_ns.tolist(), got_data) == want
