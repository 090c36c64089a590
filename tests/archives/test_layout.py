"""Byte-level rules of both layouts.

status-go vectors are derived from status-im/status-go: the message shape is the test helper
``buildMessage`` (protocol/communities/manager_test.go: Sig=[1], Timestamp=Unix seconds,
Payload=[1], Padding=[1], Hash=[n]), the field numbers from protocol/protobuf/communities.proto,
the padding rule from manager_archive_file.go ``createHistoryArchiveTorrent``; the expected bytes
are written out by hand with the protobuf wire rules (tag = field << 3 | wire type).
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.archives.errors import (
    BadRecord,
    CorruptArchive,
    CorruptIndex,
    MisalignedArchive,
)
from loglake.archives.layout import (
    NS,
    PIECE_LENGTH,
    ArchiveMetadata,
    archive_id,
    get_layout,
    keccak256,
    padding_field,
)
from loglake.wire.pb import archives_spec_pb2 as spec_pb
from loglake.wire.pb import archives_statusgo_pb2 as sg_pb
from loglake.wire.varint import uleb_size

SPEC = get_layout("spec")
SG = get_layout("status-go")
TOPIC = bytes.fromhex("d7a5d2c3")  # a 4-byte Waku topic (status-go: transport.ToTopic)
START = 1577836800  # time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC) in the status-go tests
WEEK = 7 * 24 * 3600


def test_keccak256_known_vectors():
    # Keccak-256 (not SHA3-256) of "" and "abc", as go-ethereum crypto.Keccak256 returns.
    assert keccak256(b"").hex() == (
        "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"
    )
    assert keccak256(b"abc").hex() == (
        "4e03657aea45a94fc7d47ba826c8d667c0d1e6e33a64a036ec44f58fa12d6c45"
    )


def test_statusgo_wakumessage_bytes_match_buildMessage_vector():
    # buildMessage(startDate.Add(1*time.Hour), topic, []byte{1}) from manager_test.go
    raw = SG.make_record(
        payload=b"\x01",
        topic=TOPIC,
        timestamp_ns=(START + 3600) * NS,
        sig=b"\x01",
        padding=b"\x01",
        hash=b"\x01",
    )
    expected = bytes.fromhex(
        "0a0101"  # 1 sig
        "1090deaff005"  # 2 timestamp = 1577840400 (varint)
        "1a04d7a5d2c3"  # 3 topic
        "220101"  # 4 payload
        "2a0101"  # 5 padding
        "320101"  # 6 hash
    )
    assert raw == expected
    m = SG.decode_record(raw)
    assert m.timestamp_ns == (START + 3600) * NS and m.topic == TOPIC
    assert m.cap_size == 2  # len(payload) + len(sig), the 30 MB cap's measure


def test_statusgo_index_metadata_bytes_and_key():
    meta = ArchiveMetadata(START * NS, (START + WEEK) * NS, (TOPIC,))
    entry = SG.make_entry(meta, 0, PIECE_LENGTH, PIECE_LENGTH - 60)
    expected = bytes.fromhex(
        "1212"  # 2 metadata (18 bytes)
        "1080c2aff005"  # from = 1577836800
        "1880b7d4f005"  # to = 1578441600
        "2204d7a5d2c3"  # contentTopic
        # offset = 0 is not encoded (proto3 default)
        "2080a006"  # 4 size = 102400
        "28c49f06"  # 5 padding = 102340
    )
    assert entry.encoded == expected
    # Keccak256Hash(...).String(): 0x + 64 lowercase hex
    assert entry.archive_id == "0x" + keccak256(expected).hex()
    assert len(entry.archive_id) == 66


def _sg_size_for(raw: int) -> tuple[int, int]:
    """Drive encode_archive to a body of exactly ``raw`` bytes; return (size, padding)."""
    meta = ArchiveMetadata(START * NS, (START + WEEK) * NS, (TOPIC,))
    md_len = len(SG._metadata_pb(meta).SerializeToString())
    head = 2 + md_len  # 0x12 len metadata
    # one message of payload n: record = 0x22 varint(n) payload; framed 0x1a varint(len)
    for n in range(max(0, raw - head - 40), raw):
        rec = SG.make_record(payload=b"\x07" * n, topic=TOPIC, timestamp_ns=START * NS)
        body = head + 1 + uleb_size(len(rec)) + len(rec)
        if body == raw:
            enc = SG.encode_archive(meta, [rec], 0)
            assert len(enc.body) == raw
            return enc.size, enc.trailing_zeros
        if body > raw:
            break
    pytest.skip(f"no single-message body of exactly {raw} bytes")


@pytest.mark.parametrize(
    "raw,size",
    [
        (100, PIECE_LENGTH),  # small: padded to one piece
        (PIECE_LENGTH, PIECE_LENGTH),  # exactly one piece: no padding (rawSize > pieceLength false)
        (PIECE_LENGTH + 1, 2 * PIECE_LENGTH),
        (2 * PIECE_LENGTH, 3 * PIECE_LENGTH),  # aligned and > one piece: one extra whole piece
    ],
)
def test_statusgo_padding_rule(raw, size):
    got_size, padding = _sg_size_for(raw)
    assert got_size == size and padding == size - raw


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=5 * PIECE_LENGTH))
def test_spec_padding_makes_any_body_a_multiple_of_the_piece_length(body_len):
    field = padding_field(body_len, PIECE_LENGTH)
    assert (body_len + len(field)) % PIECE_LENGTH == 0
    if body_len % PIECE_LENGTH == 0:
        assert field == b""
    else:
        # the field is tag 4 / wire type 2, then only zero bytes
        a = spec_pb.WakuMessageArchive()
        a.ParseFromString(field)
        assert field[0] == 0x22 and a.padding == bytes(len(a.padding))


def test_spec_padding_with_a_varint_length_jump():
    # gap = 130: n = 128 needs a 2-byte length (1+2+128 = 131) and n = 127 a 1-byte one
    # (1+1+127 = 129): no n fits, so the next multiple is used.
    field = padding_field(PIECE_LENGTH - 130, PIECE_LENGTH)
    assert len(field) == 130 + PIECE_LENGTH


def test_spec_padding_is_never_an_empty_field():
    # gap = 2: tag + a zero length would fit, but proto3 never writes an empty bytes field, so
    # the protobuf runtime's re-encoding of such an archive would be 2 bytes short; the next
    # multiple is used, and the runtime writes the very same bytes.
    field = padding_field(PIECE_LENGTH - 2, PIECE_LENGTH)
    assert len(field) == 2 + PIECE_LENGTH
    a = spec_pb.WakuMessageArchive()
    a.ParseFromString(field)
    assert a.SerializeToString(deterministic=True) == field


@pytest.mark.parametrize("layout", [SPEC, SG], ids=lambda x: x.name)
def test_archive_bytes_equal_protobuf_runtime_and_round_trip(layout):
    topic = "/app/1/chat/proto" if layout is SPEC else TOPIC
    recs = [
        layout.make_record(payload=bytes([i]) * (i * 7), topic=topic, timestamp_ns=(START + i) * NS)
        for i in range(200)
    ]
    # one record above 16,383 bytes: a 3-byte length varint (framing's slow path)
    recs.append(layout.make_record(payload=b"\x07" * 20_000, topic=topic, timestamp_ns=START * NS))
    meta = ArchiveMetadata(START * NS, (START + WEEK) * NS, (topic,), layout.archive_version)
    enc = layout.encode_archive(meta, recs, 3 * PIECE_LENGTH)
    assert enc.size % PIECE_LENGTH == 0 and enc.entry.offset == 3 * PIECE_LENGTH
    cls = spec_pb if layout is SPEC else sg_pb
    a = cls.WakuMessageArchive()
    a.ParseFromString(enc.body)
    assert a.SerializeToString(deterministic=True) == enc.body
    assert len(a.messages) == 201
    assert layout.decode_archive(enc.data_bytes(), enc.entry) == recs


def test_spec_index_metadata_has_num_pieces_and_padding_inside():
    recs = [SPEC.make_record(payload=b"x" * 300, topic="t", timestamp_ns=START * NS)] * 500
    meta = ArchiveMetadata(START * NS, (START + WEEK) * NS, ("t",), 1)
    enc = SPEC.encode_archive(meta, recs, 0)
    assert enc.trailing_zeros == 0 and len(enc.body) % PIECE_LENGTH == 0
    md = spec_pb.WakuMessageArchiveIndexMetadata()
    md.ParseFromString(enc.entry.encoded)
    assert md.num_pieces == len(enc.body) // PIECE_LENGTH and md.offset == 0
    assert getattr(md.metadata, "from") == START * NS  # Unix ns, like WakuMessage.timestamp


@pytest.mark.parametrize("layout", [SPEC, SG], ids=lambda x: x.name)
def test_index_round_trip_sorted_by_offset(layout):
    topic = "t" if layout is SPEC else TOPIC
    entries = [
        layout.make_entry(
            ArchiveMetadata((START + k * WEEK) * NS, (START + (k + 1) * WEEK) * NS, (topic,)),
            k * 2 * PIECE_LENGTH,
            2 * PIECE_LENGTH,
            7,
        )
        for k in range(4)
    ]
    raw = layout.encode_index(list(reversed(entries)))
    assert layout.encode_index(entries) == raw  # deterministic map order
    back = layout.decode_index(raw, data_size=8 * PIECE_LENGTH)
    assert [e.archive_id for e in back] == [e.archive_id for e in entries]
    with pytest.raises(CorruptIndex):
        layout.decode_index(raw, data_size=7 * PIECE_LENGTH)  # index points past data


@pytest.mark.parametrize("layout", [SPEC, SG], ids=lambda x: x.name)
def test_index_with_a_forged_key_is_rejected(layout):
    meta = ArchiveMetadata(START * NS, (START + WEEK) * NS, ())
    e = layout.make_entry(meta, 0, PIECE_LENGTH, 0)
    index = layout._index_cls()
    index.archives["0x" + "00" * 32].ParseFromString(e.encoded)
    with pytest.raises(CorruptIndex, match="keccak"):
        layout.decode_index(index.SerializeToString())


@pytest.mark.parametrize(
    ("pb", "frm", "to"),
    [
        (spec_pb, 0, 2**63),  # nanoseconds
        (sg_pb, 0, 2**63 // NS + 1),  # seconds, times NS when read
        (spec_pb, 2**40 + 1, 2**40),
        (sg_pb, 2**30 + 1, 2**30),
    ],
    ids=["spec-past-int64", "status-go-past-int64", "spec-backwards", "status-go-backwards"],
)
def test_an_index_whose_times_the_store_cannot_hold_is_corrupt(pb, frm, to):
    # uint64 on the wire: an archive ending past int64 nanoseconds was accepted, and its
    # hydration failed with a bare OverflowError from SQLite, not an ArchiveError (a member's
    # fetch loop died on it)
    meta = pb.WakuMessageArchiveMetadata(to=to, **{"from": frm})
    if pb is sg_pb:
        md = pb.WakuMessageArchiveIndexMetadata(metadata=meta, offset=0, size=PIECE_LENGTH)
    else:
        md = pb.WakuMessageArchiveIndexMetadata(metadata=meta, offset=0, num_pieces=1)
    raw = md.SerializeToString(deterministic=True)
    index = pb.WakuMessageArchiveIndex()
    index.archives[archive_id(raw)].ParseFromString(raw)
    with pytest.raises(CorruptIndex, match="int64"):
        (SG if pb is sg_pb else SPEC).decode_index(index.SerializeToString(deterministic=True))


def test_statusgo_index_with_size_not_a_multiple_of_the_piece_length_is_rejected():
    md = sg_pb.WakuMessageArchiveIndexMetadata(offset=0, size=PIECE_LENGTH + 5, padding=0)
    raw = md.SerializeToString()
    index = sg_pb.WakuMessageArchiveIndex()
    index.archives[archive_id(raw)].ParseFromString(raw)
    with pytest.raises(MisalignedArchive):
        SG.decode_index(index.SerializeToString())


def test_decode_archive_rejects_region_not_a_multiple_of_the_piece_length():
    meta = ArchiveMetadata(START * NS, (START + WEEK) * NS, (TOPIC,))
    enc = SG.encode_archive(meta, [SG.make_record(payload=b"a", topic=TOPIC, timestamp_ns=0)], 0)
    with pytest.raises(MisalignedArchive):
        SG.decode_archive(enc.data_bytes()[:-1], enc.entry)


@pytest.mark.parametrize("layout", [SPEC, SG], ids=lambda x: x.name)
def test_corrupt_archive_bytes_are_a_typed_error(layout):
    meta = ArchiveMetadata(START * NS, (START + WEEK) * NS, ())
    entry = layout.make_entry(meta, 0, PIECE_LENGTH, 10 if layout is SG else 0)
    with pytest.raises(CorruptArchive):
        layout.decode_archive(b"\xff" * PIECE_LENGTH, entry)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_decode_index_random_bytes_typed_error_or_valid(raw):
    for layout in (SPEC, SG):
        with contextlib.suppress(CorruptIndex, MisalignedArchive):
            layout.decode_index(raw)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_decode_record_random_bytes_typed_error_or_valid(raw):
    for layout in (SPEC, SG):
        with contextlib.suppress(BadRecord):
            layout.decode_record(raw)


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.integers(min_value=0, max_value=PIECE_LENGTH))
def test_unpack_of_arbitrary_region_is_a_typed_error_or_valid(junk, padding):
    from loglake.archives.errors import BadRecord
    from loglake.archives.member import unpack

    region = (junk * (PIECE_LENGTH // len(junk) + 1))[:PIECE_LENGTH]
    for layout in (SPEC, SG):
        meta = ArchiveMetadata(0, 10**18, ())
        entry = layout.make_entry(meta, 0, PIECE_LENGTH, padding if layout is SG else 0)
        with contextlib.suppress(CorruptArchive, MisalignedArchive, BadRecord):
            unpack(layout, entry, region)
