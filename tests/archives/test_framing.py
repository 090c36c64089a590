"""The archive's framing walk (``archives/framing.py``) against protobuf's parse of the whole.

A member decodes an archive chunk by chunk so that ``max_archive_bytes`` bounds its memory
(found from outside: parsed whole, the smallest messages took 58-66x the archive's bytes with
the hydrate). The walk is hand-written framing code, so it is held here to protobuf itself:
for valid archives (canonical or not: long varints, unknown fields, groups, packed fields,
fields repeated or out of order), mutated bytes and truncations, the chunks it cuts parse as
the same messages, padding and errors as the whole archive does; and for every archive
protobuf accepts that it was made to walk, it vouches for all of it (no tail: the peak stays
bounded). ``decode_archive`` of both layouts is held to the code it replaced, kept below as
``whole_parse_decode``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.archives.errors import ArchiveError, CorruptArchive
from loglake.archives.framing import MAX_GROUP_DEPTH, walk_archive
from loglake.archives.layout import (
    NS,
    PIECE_LENGTH,
    ArchiveMetadata,
    get_layout,
    padding_field,
)
from loglake.archives.member import unpack, unpack_chunks
from loglake.archives.store import MessageStore
from loglake.wire.pb import archives_spec_pb2 as spec_pb
from loglake.wire.pb import archives_statusgo_pb2 as sg_pb
from loglake.wire.varint import encode_uleb

from .helpers import START, WEEK

SPEC = get_layout("spec")
SG = get_layout("status-go")
PB_ERRORS = (Exception,)
PARSED = frozenset({1, 2, 3})


def whole_parse_decode(layout_name: str, region: bytes, entry: Any) -> list[bytes]:
    """``decode_archive`` as it was before the walk: protobuf's parse of the whole archive."""
    layout = get_layout(layout_name)
    layout.check_alignment(entry.offset, len(region))
    if layout_name == "spec":
        a = spec_pb.WakuMessageArchive()
        try:
            a.ParseFromString(region)
        except PB_ERRORS as e:
            raise CorruptArchive(f"archive {entry.archive_id[:18]}… does not decode: {e}") from e
        if a.padding.strip(b"\x00"):
            raise CorruptArchive("archive padding holds non-zero bytes")
        return [m.SerializeToString(deterministic=True) for m in a.messages]
    if entry.padding > len(region):
        raise CorruptArchive(f"archive {entry.archive_id[:18]}… padding exceeds its size")
    body = region[: len(region) - entry.padding]
    if region[len(body) :].strip(b"\x00"):
        raise CorruptArchive("archive padding holds non-zero bytes")
    b = sg_pb.WakuMessageArchive()
    try:
        b.ParseFromString(body)
    except PB_ERRORS as e:
        raise CorruptArchive(f"archive {entry.archive_id[:18]}… does not decode: {e}") from e
    return [m.SerializeToString(deterministic=True) for m in b.messages]


# -- archives, field by field -----------------------------------------------------------------


def varint(n: int, extra: int = 0) -> bytes:
    """``n`` as a varint, ``extra`` octets longer than needed (protobuf reads those too)."""
    v = bytearray(encode_uleb(n))
    if extra:
        v[-1] |= 0x80
        v += b"\x80" * (extra - 1) + b"\x00"
    return bytes(v)


@st.composite
def varints(draw: st.DrawFn, n: int, max_octets: int = 10) -> bytes:
    need = len(encode_uleb(n))
    return varint(n, draw(st.integers(0, max(0, max_octets - need))))


@st.composite
def tags(draw: st.DrawFn, number: int, wire: int) -> bytes:
    return draw(varints((number << 3) | wire, 5))


def spec_record(draw: st.DrawFn) -> bytes:
    return SPEC.make_record(
        payload=draw(st.binary(max_size=6)),
        topic=draw(st.sampled_from(["", "t", "/waku/2/x"])),
        timestamp_ns=draw(st.integers(0, 2**40)),
    )


def sg_record(draw: st.DrawFn) -> bytes:
    return SG.make_record(
        payload=draw(st.binary(max_size=6)),
        topic=draw(st.sampled_from([b"", b"\x01\x02\x03\x04"])),
        timestamp_ns=draw(st.integers(1, 2**31)) * NS,
        sig=draw(st.sampled_from([None, b"\x01" * 3])),
    )


@st.composite
def group(draw: st.DrawFn, number: int, depth: int) -> bytes:
    out = draw(tags(number, 3))
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(0, 3 if depth < 3 else 2))
        inner = draw(st.integers(1, 40))
        if k == 0:
            out += draw(tags(inner, 0)) + draw(varints(draw(st.integers(0, 2**64 - 1))))
        elif k == 1:
            v = draw(st.binary(max_size=5))
            out += draw(tags(inner, 2)) + draw(varints(len(v))) + v
        elif k == 2:
            wire = draw(st.sampled_from([1, 5]))
            out += draw(tags(inner, wire)) + bytes(8 if wire == 1 else 4)
        else:
            out += draw(group(inner, depth + 1))
    return out + draw(tags(number, 4))


@st.composite
def fields(draw: st.DrawFn, layout_name: str) -> bytes:
    """One top-level field of a ``WakuMessageArchive`` that protobuf accepts."""
    record = spec_record if layout_name == "spec" else sg_record
    kind = draw(
        st.sampled_from(
            ["message"] * 6
            + ["version", "packed-version", "metadata", "padding", "padding", "unknown"]
            + ["group", "padding-other-wire"]
            + ["message-bad-wire", "empty-message"]
        )
    )
    if kind == "message":
        r = record(draw)
        return draw(tags(3, 2)) + draw(varints(len(r))) + r
    if kind == "empty-message":
        return draw(tags(3, 2)) + draw(varints(0))
    if kind == "version":
        return draw(tags(1, 0)) + draw(varints(draw(st.integers(0, 2**64 - 1))))
    if kind == "packed-version":
        v = b"".join(varint(x) for x in draw(st.lists(st.integers(0, 300), max_size=3)))
        return draw(tags(1, 2)) + draw(varints(len(v))) + v
    if kind == "metadata":
        pb = SPEC if layout_name == "spec" else SG
        md = pb._metadata_pb(ArchiveMetadata(START, START + WEEK, ())).SerializeToString()
        return draw(tags(2, 2)) + draw(varints(len(md))) + md
    if kind == "padding":  # zeros, or not (a hostile archive; status-go: an unknown field)
        v = draw(st.sampled_from([bytes(draw(st.integers(0, 6))), draw(st.binary(max_size=3))]))
        return draw(tags(4, 2)) + draw(varints(len(v))) + v
    if kind == "padding-other-wire":  # an unknown field to protobuf, not the padding
        wire = draw(st.sampled_from([0, 1, 5]))
        return draw(tags(4, wire)) + {0: b"\x01", 1: bytes(8), 5: bytes(4)}[wire]
    if kind == "unknown":
        number = draw(st.sampled_from([4, 5, 15, 16, 2047, 2**29 - 1]))
        wire = draw(st.sampled_from([0, 1, 2, 5]))
        v = {0: varint(draw(st.integers(0, 2**64 - 1))), 1: bytes(8), 5: bytes(4)}.get(wire)
        if v is None:
            b = draw(st.binary(max_size=5))
            v = varint(len(b)) + b
        return draw(tags(number, wire)) + v
    if kind == "group":
        return draw(group(draw(st.sampled_from([3, 4, 9, 100])), 1))
    # a messages field of another wire type: an unknown field to protobuf
    return draw(tags(3, 0)) + varint(draw(st.integers(0, 300)))


@st.composite
def archive_bytes(draw: st.DrawFn, layout_name: str) -> tuple[bytes, bool]:
    """``(bytes, valid)``: fields protobuf accepts, then (not valid) maybe mutated: bytes
    anywhere, or a field protobuf refuses put between two fields."""
    parts = draw(st.lists(fields(layout_name), max_size=12))
    body = b"".join(parts)
    mutate = draw(
        st.sampled_from(
            ["none"] * 3 + ["truncate", "chop", "flip", "insert", "delete", "deep", "refused"]
        )
    )
    if mutate == "none" or (not body and mutate in ("truncate", "chop", "flip", "delete")):
        return body, True
    at = len(b"".join(parts[: draw(st.integers(0, len(parts)))]))  # a field boundary
    if mutate == "deep":  # groups nested past the walk's depth, or past protobuf's (100)
        depth = draw(st.sampled_from([MAX_GROUP_DEPTH, MAX_GROUP_DEPTH + 1, 100, 101]))
        return body[:at] + b"\x4b" * depth + b"\x4c" * depth + body[at:], False
    if mutate == "refused":
        bad = draw(
            st.sampled_from(
                [
                    b"\x00",  # field 0
                    b"\x0e",  # wire type 6
                    b"\x0f",  # wire type 7
                    b"\x0c",  # an end-group at the top
                    b"\x8a\x80\x80\x80\x10\x00",  # a tag of 33 bits
                    b"\xa2\x80\x80\x80\x80\x00\x00",  # a tag of 6 octets
                    b"\x08" + b"\xff" * 10 + b"\x00",  # a varint of 11 octets
                    b"\x2a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # a length of 11
                    b"\x4b\x50\x01\x54",  # a group ended by another field's end-group
                ]
            )
        )
        return body[:at] + bad + body[at:], False
    if mutate == "chop":  # the last octets of the last field
        return body[: -draw(st.integers(1, 3))], False
    i = draw(st.integers(0, max(0, len(body) - 1)))
    if mutate == "truncate":
        return body[:i], False
    if mutate == "flip":
        return body[:i] + bytes([body[i] ^ draw(st.integers(1, 255))]) + body[i + 1 :], False
    if mutate == "insert":
        return body[:i] + draw(st.binary(min_size=1, max_size=4)) + body[i:], False
    return body[:i] + body[i + draw(st.integers(1, 4)) :], False


# -- the walk against protobuf's parse ----------------------------------------------------------


def whole(cls: Any, data: bytes) -> tuple[list[bytes], bytes] | None:
    a = cls()
    try:
        a.ParseFromString(data)
    except PB_ERRORS:
        return None
    return [m.SerializeToString() for m in a.messages], getattr(a, "padding", b"")


def chunked(cls: Any, data: bytes, end: int, chunk_fields: int, padding: int | None) -> Any:
    f = walk_archive(data, end, PARSED, padding, chunk_fields=chunk_fields, chunk_bytes=1 << 20)
    prev = 0
    msgs: list[bytes] = []
    for s, e in f.chunks:
        assert prev <= s < e <= end
        prev = e
        a = cls()
        try:
            a.ParseFromString(data[s:e])
        except PB_ERRORS:
            return None, f
        msgs += [m.SerializeToString() for m in a.messages]
    last = data[f.last_skipped[0] : f.last_skipped[1]] if f.last_skipped else b""
    if f.tail is not None:
        assert prev <= f.tail <= end
        a = cls()
        try:
            if padding is not None:
                a.padding = last
            a.MergeFromString(data[f.tail : end])
        except PB_ERRORS:
            return None, f
        msgs += [m.SerializeToString() for m in a.messages]
        last = getattr(a, "padding", b"")
    return (msgs, last if padding is not None else b""), f


@pytest.mark.parametrize("layout_name", ["spec", "status-go"])
@given(data=st.data(), chunk_fields=st.integers(1, 4))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_walk_cuts_an_archive_into_chunks_that_parse_as_the_whole(
    layout_name, data, chunk_fields
):
    cls = spec_pb.WakuMessageArchive if layout_name == "spec" else sg_pb.WakuMessageArchive
    padding = 4 if layout_name == "spec" else None
    body, valid = data.draw(archive_bytes(layout_name))
    suffix = data.draw(st.sampled_from([b"", b"\x00\x00\x00"]))  # status-go: padding after
    buf = body + suffix
    expected = whole(cls, body)
    got, framing = chunked(cls, buf, len(body), chunk_fields, padding)
    assert got == expected, (body.hex(), framing)
    if valid:
        # an archive protobuf accepts, of the constructs the walk knows: all of it walked
        assert expected is not None
        assert framing.tail is None, (body.hex(), framing)


@pytest.mark.parametrize("layout_name", ["spec", "status-go"])
@given(data=st.data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decode_archive_gives_what_the_whole_parse_gave(layout_name, data):
    # messages, their order, and the error (class and text) of protobuf's parse of the whole
    layout = get_layout(layout_name)
    body, _ = data.draw(archive_bytes(layout_name))
    if layout_name == "spec":
        region = body + padding_field(len(body), PIECE_LENGTH)
        pad = 0
    else:
        region = body + bytes(PIECE_LENGTH - len(body) % PIECE_LENGTH)
        pad = data.draw(st.sampled_from([len(region) - len(body), 0, len(region) + 1]))
    if data.draw(st.booleans()):  # a non-zero byte in the padding (or the last field)
        region = region[:-1] + b"\x01"
    entry = dataclasses.replace(
        SPEC.make_entry(ArchiveMetadata(START, START + WEEK, ()), 0, PIECE_LENGTH, 0),
        padding=pad,
    )
    try:
        expected: Any = whole_parse_decode(layout_name, region, entry)
    except ArchiveError as e:
        expected = (type(e), str(e))
    try:
        got: Any = layout.decode_archive(region, entry)
    except ArchiveError as e:
        got = (type(e), str(e))
    assert got == expected


def _big_archive(layout_name: str, n: int) -> tuple[Any, list[bytes]]:
    """``n`` records over several chunks (``CHUNK_FIELDS``), with copies of one record and
    times shared within and across chunks: what the store's de-duplication sees."""
    layout = get_layout(layout_name)
    recs = []
    for i in range(n):
        t = START + (i % 3000) * NS  # each time in two or three chunks
        recs.append(
            layout.make_record(payload=bytes([i % 7]), topic=_topic(layout), timestamp_ns=t)
        )
    recs[5000:5003] = [recs[10]] * 3  # a record again, chunks later
    return layout, recs


def _topic(layout: Any) -> Any:
    return b"\x01\x02\x03\x04" if layout.name == "status-go" else "/t"


def _rows(store: MessageStore) -> list[tuple]:
    return list(
        store.db.execute(
            "SELECT ts_ns, topic, raw, cap, origin, dig FROM messages ORDER BY ts_ns, rowid"
        )
    )


@pytest.mark.parametrize("layout_name", ["spec", "status-go"])
def test_an_archive_hydrated_in_chunks_leaves_the_rows_of_one_batch(layout_name):
    layout, recs = _big_archive(layout_name, 10_000)
    a = layout.encode_archive(ArchiveMetadata(START, START + WEEK, ()), recs, 0)
    region = a.data_bytes()
    live = layout.decode_record(layout.make_record(payload=b"live", topic=_topic(layout),
                                                   timestamp_ns=START + 7 * NS))  # fmt: skip
    one, chunks = MessageStore(), MessageStore()
    for s in (one, chunks):
        s.add([live, layout.decode_record(recs[20])])  # received live before
    whole_msgs = [layout.decode_record(r) for r in whole_parse_decode(layout_name, region, a.entry)]
    assert unpack(layout, a.entry, region) == whole_msgs
    assert one.hydrate(a.entry, whole_msgs) == chunks.hydrate_many(
        [(a.entry, unpack_chunks(layout, a.entry, region))]
    )
    assert _rows(chunks) == _rows(one)
    assert len(list(unpack_chunks(layout, a.entry, region))) > 2  # chunks, not one


@pytest.mark.parametrize("layout_name", ["spec", "status-go"])
@pytest.mark.parametrize(
    "faults, error",
    [
        # protobuf refuses a message near the end: that error, though a chunk before holds a
        # record that is none and one outside the window
        (("outside", "bad-record", "unparsable"), "does not decode"),
        (("outside", "bad-record"), "without timestamp"),
        (("outside",), "outside its time range"),
        (("truncated", "bad-record"), "does not decode"),
    ],
)
def test_a_bad_archive_gets_the_error_of_the_whole_parse(layout_name, faults, error):
    layout, recs = _big_archive(layout_name, 9_000)
    if "outside" in faults:
        recs[100] = layout.make_record(payload=b"", topic=_topic(layout), timestamp_ns=START + WEEK)
    if "bad-record" in faults:
        recs[6000] = b"\x0a\x01x" if layout_name == "spec" else b"\x22\x01x"  # no timestamp
    if "unparsable" in faults:
        recs[8900] = b"\x0a\x05x"  # a field longer than the record
    a = layout.encode_archive(ArchiveMetadata(START, START + WEEK, ()), recs, 0)
    region = a.data_bytes()
    entry = a.entry
    if "truncated" in faults:  # the last message's length one more than it has
        at = region.rfind(b"\x1a" + bytes([len(recs[-1])]) + recs[-1]) + 1
        region = region[:at] + bytes([region[at] + 1]) + region[at + 1 :]
    try:
        expected = str(_raises(lambda: unpack_whole(layout_name, layout, entry, region)))
    except AssertionError:
        expected = ""
    store = MessageStore()
    before = store.snapshot()
    with pytest.raises(ArchiveError) as e:
        store.hydrate_many([(entry, unpack_chunks(layout, entry, region))])
    assert error in str(e.value) and str(e.value) == expected
    assert store.snapshot() == before


def unpack_whole(layout_name: str, layout: Any, entry: Any, region: bytes) -> list:
    """``member.unpack`` as it was: every record decoded, then the window checked."""
    msgs = [layout.decode_record(r) for r in whole_parse_decode(layout_name, region, entry)]
    m = entry.metadata
    for x in msgs:
        if not m.from_ns <= x.timestamp_ns < m.to_ns:
            raise CorruptArchive(
                f"archive {entry.archive_id[:18]}… holds a message outside its time range"
            )
    return msgs


def _raises(f: Any) -> Exception:
    try:
        f()
    except ArchiveError as e:
        return e
    raise AssertionError("no error")
