"""The sds-audit decoder's batch path (``_scan``: numpy over a batch's buffers, entries
identified by Arrow's hash table) against its per-record path (``codec.parse`` and
``parse_entry`` per record: a participant's reading, the reference), column for column, on
well-formed records and on hostile ones: truncated, over-long varints, lengths past the end,
unknown fields of every wire type, repeated fields, wrong wire types, bad or non-ASCII UTF-8,
empty and null records, in any split into batches. Protobuf allows repeated and unknown fields;
the batch path hands such records to the per-record path, so both agree with the generated
protobuf code. No Spark."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.sds.codec import (
    TAG_BLOOM_FILTER,
    TAG_CHANNEL_ID,
    TAG_CONTENT,
    TAG_LAMPORT,
    TAG_MESSAGE_ID,
    TAG_REPAIR_REQUEST,
    TAG_SENDER_ID,
    encode_history_entry,
)
from loglake.sds.columnar import DecodeState, _scan
from loglake.sds.messages import HistoryEntry, message_id_of
from loglake.wire.varint import encode_uleb
from tests.sds.records import BLOOM, CHANNEL, ld, readable, sliding_window


def _long(n: int, extra: int) -> bytes:
    """``n`` as a varint ``extra`` octets longer than it needs (protobuf reads it the same)."""
    b = bytearray(encode_uleb(n))
    b[-1] |= 0x80
    b += b"\x80" * (extra - 1) + b"\x00"
    return bytes(b)


ENTRIES = [
    encode_history_entry(HistoryEntry(f"m{i}", b"\x01h%d" % i if i % 2 else None, "s"))
    for i in range(10)
] + [
    encode_history_entry(HistoryEntry("é-id")),  # non-ASCII, valid
    encode_history_entry(HistoryEntry("")),  # bad: empty id
    b"\x5a\x03\x0a\x01\xff",  # bad: an id that is not UTF-8
    b"\x5a\x02\x08\x01",  # an entry with an unknown varint field only: empty id
]
IDS = [b"a", b"b", b"c", "é".encode(), b"\xff", b"\xed\xa0\x80", b"x" * 257, b""]


@st.composite
def record(draw, k: int, hist: list[bytes]) -> bytes | None:
    shape = draw(st.sampled_from(["good"] * 6 + ["junk", "none", "empty"]))
    if shape == "none":
        return None
    if shape == "empty":
        return b""
    if shape == "junk":
        return draw(st.binary(max_size=40))
    sender = draw(st.sampled_from(IDS[:3] * 3 + IDS))
    content = draw(st.sampled_from([b"hello", b"", b"x" * 200, ENTRIES[0], None]))
    own = [message_id_of(content).encode()] * 6 if content else []  # a sender's id for it
    fields = [
        ld(TAG_SENDER_ID, sender),
        ld(TAG_MESSAGE_ID, draw(st.sampled_from([*own, b"id%d" % k, *IDS]))),
        ld(TAG_CHANNEL_ID, draw(st.sampled_from([CHANNEL.encode()] * 5 + [b"other", b""]))),
    ]
    if draw(st.integers(0, 5)):
        fields.append(
            TAG_LAMPORT + encode_uleb(draw(st.sampled_from([1, 5, 300, 2**63 - 1, 2**63 + 1])))
        )
    fields += hist
    if not draw(st.integers(0, 8)):  # of one bit an octet, or over-full (every bit set)
        octet = draw(st.sampled_from([b"\x01", b"\xff"]))
        fields.append(ld(TAG_BLOOM_FILTER, octet * draw(st.sampled_from([BLOOM, 7]))))
    for e in draw(st.lists(st.sampled_from(ENTRIES), max_size=2)):
        fields.append(TAG_REPAIR_REQUEST + e[1:])
    if content is not None:
        fields.append(ld(TAG_CONTENT, content))
    for _ in range(draw(st.integers(0, 2))):  # hostile edits
        edit = draw(
            st.sampled_from(
                [
                    "unknown",
                    "repeat",
                    "override",
                    "override",
                    "wire",
                    "long-len",
                    "long-tag",
                    "past-end",
                    "shuffle",
                    "truncate",
                    "flip",
                ]
            )
        )
        at = draw(st.integers(0, len(fields)))
        if edit == "unknown":
            fields.insert(
                at,
                draw(
                    st.sampled_from(
                        [
                            b"\x78\x01",  # 15, varint
                            b"\x7a\x02ab",  # 15, length-delimited
                            b"\x7d\x00\x00\x00\x00",  # 15, fixed32
                            b"\x79" + bytes(8),  # 15, fixed64
                            b"\x7b\x7c",  # 15, a group
                            b"\x7e",  # wire type 6: invalid
                            b"\xa8\x01\x05",  # 21, varint (two-octet tag)
                        ]
                    )
                ),
            )
        elif edit == "repeat" and fields:
            fields.insert(at, fields[draw(st.integers(0, len(fields) - 1))])
        elif edit == "override":  # a singular field again, another value: the last counts
            fields.insert(
                at,
                draw(
                    st.sampled_from(
                        [
                            ld(TAG_MESSAGE_ID, b"zz"),
                            ld(TAG_SENDER_ID, b"q"),
                            ld(TAG_CHANNEL_ID, CHANNEL.encode()),
                            TAG_LAMPORT + encode_uleb(9),
                            ld(TAG_CONTENT, b"other"),
                            ld(TAG_BLOOM_FILTER, bytes(BLOOM)),
                        ]
                    )
                ),
            )
        elif edit == "wire":
            fields.insert(
                at,
                draw(st.sampled_from([b"\x52\x01x", b"\x58\x01", b"\x08\x01", b"\xa0\x01\x01"])),
            )
        elif edit == "long-len" and fields:
            i = draw(st.integers(0, len(fields) - 1))
            f = fields[i]
            if f[:1] in (b"\x0a", b"\x12", b"\x1a", b"\x5a", b"\x62", b"\x6a") and len(f) > 1:
                n = f[1] if f[1] < 0x80 else None
                if n is not None:
                    fields[i] = f[:1] + _long(n, draw(st.integers(1, 9))) + f[2:]
        elif edit == "long-tag" and fields:
            i = draw(st.integers(0, len(fields) - 1))
            if fields[i][:1] and fields[i][0] < 0x80:
                fields[i] = _long(fields[i][0], 1) + fields[i][1:]
        elif edit == "past-end":
            fields.append(b"\x5a\x7f" + b"\x0a\x01")
        elif edit == "shuffle":
            fields = draw(st.permutations(fields))
        elif edit == "truncate":
            data = b"".join(fields)
            return data[: draw(st.integers(0, len(data)))]
        elif edit == "flip":
            data = bytearray(b"".join(fields))
            if data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            return bytes(data)
    return b"".join(fields)


@st.composite
def channels(draw) -> list[bytes | None]:
    out: list[bytes | None] = []
    hist: list[bytes] = []
    for k in range(draw(st.integers(1, 16))):
        if hist and draw(st.integers(0, 3)):  # a sliding window, mostly
            hist = [*hist[draw(st.integers(0, 2)) :], ENTRIES[k % 10]]
        else:
            hist = draw(st.lists(st.sampled_from(ENTRIES), max_size=6))
        out.append(draw(record(k, list(hist))))
    return out


def _batches(datas: list[bytes | None], cuts: list[int]) -> list[pa.RecordBatch]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(datas)}), len(datas)]
    return [
        pa.RecordBatch.from_pydict(
            {
                "partition": pa.array([0] * (b - a), pa.int32()),
                "index": pa.array(range(a, b), pa.int64()),
                "timestamp_ns": pa.array(range(a, b), pa.int64()),
                "data": pa.array(datas[a:b], pa.binary()),
            }
        )
        for a, b in itertools.pairwise(bounds)
    ]


def _both(batches: list[pa.RecordBatch]) -> None:
    """The C kernel's batch path and ``_scan``'s against the per-record path."""
    kernel = DecodeState(CHANNEL, BLOOM)
    scan = DecodeState(CHANNEL, BLOOM, kernel=False)
    slow = DecodeState(CHANNEL, BLOOM, batched=False)
    for batch in batches:
        want = slow.decode(batch)
        for fast in (kernel, scan):
            got = fast.decode(batch)
            assert got.schema == want.schema
            assert readable([got]) == readable([want])


@pytest.mark.slow  # hypothesis: ~10 s
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datas=channels(), cuts=st.lists(st.integers(0, 16), max_size=3))
def test_batch_path_equals_the_per_record_path(datas, cuts):
    _both(_batches(datas, cuts))


def test_batch_path_on_a_slice_of_a_larger_chunk():
    """A batch that is a slice of a column (as ``Table.to_batches`` makes): positions are the
    slice's own, and the result is the per-record path's."""
    datas = sliding_window(30, senders=3, keep=8)
    (whole,) = _batches(datas, [])
    _both([whole.slice(0, 7), whole.slice(7, 13), whole.slice(20)])


def test_the_scan_vouches_only_for_records_made_of_the_schemas_fields():
    good = ld(TAG_SENDER_ID, b"a") + ld(TAG_MESSAGE_ID, b"m") + ld(TAG_CONTENT, b"x")
    column = pa.array(
        [
            good,
            good + b"\x78\x01",  # an unknown field
            good + ld(TAG_MESSAGE_ID, b"n"),  # message_id twice: protobuf keeps the last
            good + b"\x52\x01x",  # lamport_timestamp as length-delimited
            good[:-1],  # truncated
            b"",
            b"\x0a\x81\x00a" + good[3:],  # a non-minimal length: protobuf reads it
            good + b"\x5a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # an 11-octet length
        ],
        pa.binary(),
    )
    scan = _scan(column)
    assert scan is not None
    assert scan.ok.tolist() == [True, False, False, False, False, False, True, False]
    assert _scan(pa.array([good, None], pa.binary())) is None  # nulls: per record


def test_forgetting_unused_codes_changes_nothing(monkeypatch):
    """A task's state forgets the codes no kept history uses once it holds many
    (``DecodeState.compact``); the ids read afterwards are still each entry's own."""
    datas = sliding_window(40, senders=3, keep=4, hint=True)
    batches = _batches(datas, [7, 15, 22, 30])
    slow = DecodeState(CHANNEL, BLOOM, batched=False)
    want = [slow.decode(b) for b in batches]
    monkeypatch.setattr("loglake.sds.columnar._MAX_CODES", 6)
    fast = DecodeState(CHANNEL, BLOOM)
    for batch, w in zip(batches, want, strict=True):
        assert readable([fast.decode(batch)]) == readable([w])
    assert len(fast.ids) < len(slow.ids)  # it did forget
