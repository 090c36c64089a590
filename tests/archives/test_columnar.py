"""The columnar WakuMessage decoder (``archives.columnar``) against each layout's own
``decode_record``, record for record, without Spark."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.archives import columnar, get_layout
from loglake.archives.columnar import decode_waku_batch, frame_records
from loglake.archives.errors import BadRecord
from loglake.archives.layout import NS, Layout, frame_parts

LAYOUTS = ["spec", "status-go"]


def _odd_records(layout: Layout, rng: random.Random, n: int) -> list[bytes]:
    """Good records with optional fields, and broken ones: truncated, garbage, repeated or
    unknown fields, bad UTF-8, no timestamp, over-long varints, empty."""
    out = []
    for _ in range(n):
        if layout.name == "spec":
            topic: bytes | str = "/t/é/x"
            extra: dict[str, object] = {
                "version": rng.choice([None, 0, 3]),
                "meta": rng.choice([None, b"mm"]),
                "ephemeral": rng.choice([None, True]),
            }
        else:
            topic = rng.randbytes(4)
            extra = {
                "sig": rng.randbytes(rng.randrange(70)),
                "third_party_id": rng.choice(["", "abc"]),
                "padding": rng.choice([None, b"pp"]),
            }
        ts = rng.choice([0, 1, 10**18 + rng.randrange(10**12)])
        r = layout.make_record(
            payload=rng.randbytes(rng.randrange(300)), topic=topic, timestamp_ns=ts, **extra
        )
        r = rng.choice(
            [
                r,
                r,
                r,
                r[: rng.randrange(len(r) + 1)],
                rng.randbytes(rng.randrange(12)),
                r + r[:8],
                r + b"\xa0\x06\x05",
                b"\x12\x02\xff\xfe" + r,
                r + b"\x12\x02\xff\xfe",
                b"",
                b"\x0a\x01x\x12\x01t",
                r + b"\x50" + b"\xff" * 11,
                r + b"\x50\x81\x80\x80\x80\x80\x80\x80\x80\x80\x7f",
            ]
        )
        out.append(r)
    return out


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_the_vectorised_decoder_agrees_with_decode_record_record_for_record(layout_name):
    """The numpy decoder the archives-build job runs (``decode_waku_batch``) gives, for every
    record, what the layout's ``decode_record`` gives (time, topic, cap), or flags it bad
    where that raises; on a sliced Arrow column too."""
    layout = get_layout(layout_name)
    for seed in range(12):
        recs = _odd_records(layout, random.Random(seed), 300)
        col = pa.array(recs, type=pa.binary())
        if seed % 2:
            col, recs = col.slice(7, 200), recs[7:207]
        ts, topics, cap, bads = decode_waku_batch(layout_name, col)
        got_topics = topics.to_pylist()
        for i, raw in enumerate(recs):
            try:
                m = layout.decode_record(raw)
            except BadRecord:
                assert bads and bads[i] is not None, (seed, i, raw)
                continue
            assert not bads or bads[i] is None, (seed, i, raw)
            assert (int(ts[i]), got_topics[i], int(cap[i])) == (m[0], m[1], m[3]), (seed, i)


def _agrees(layout_name: str, recs: list[bytes]) -> tuple[np.ndarray, list[str | None]]:
    """``decode_waku_batch`` of ``recs`` checked against the scalar reference
    (``decode_record``) record for record; returns (time, bad) for the caller's own checks."""
    layout = get_layout(layout_name)
    ts, topics, cap, bads = decode_waku_batch(layout_name, pa.array(recs, type=pa.binary()))
    got = topics.to_pylist()
    for i, raw in enumerate(recs):
        try:
            m = layout.decode_record(raw)
        except BadRecord:
            assert bads and bads[i] is not None, (i, raw.hex())
            continue
        assert not bads or bads[i] is None, (i, raw.hex())
        assert (int(ts[i]), got[i], int(cap[i])) == (m[0], m[1], m[3]), (i, raw.hex())
    return ts, bads


def _good(layout_name: str, i: int = 0) -> bytes:
    layout = get_layout(layout_name)
    topic: bytes | str = "/status/1/c/proto" if layout_name == "spec" else b"\xd7\xa5\xd2\xc3"
    extra: dict[str, object] = {} if layout_name == "spec" else {"sig": b"s" * 65}
    return layout.make_record(
        payload=bytes(range(200)) + bytes([i % 256]),
        topic=topic,
        timestamp_ns=1_600_000_000 * 10**9 + i * 10**9,
        **extra,
    )


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_a_truncated_record_is_bad_and_its_batch_neighbours_are_not(layout_name):
    """Every prefix of a good record (cut mid-tag, mid-length, mid-value) is what
    ``decode_record`` says of it (bad, or good where the cut falls between fields and leaves
    what the layout needs), inside a batch of good records that stay good."""
    good = [_good(layout_name, i) for i in range(8)]
    raw = good[0]
    for cut in range(len(raw)):
        _, bads = _agrees(layout_name, [*good, raw[:cut], *good])
        assert all(b is None for j, b in enumerate(bads) if j != 8), cut


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_an_overlong_varint_is_refused_as_protobuf_refuses_it(layout_name):
    """A tag, a length or a timestamp varint of 11 octets, or of 10 octets past 64 bits,
    goes to ``decode_record`` (which refuses it); a length or value padded to 10 octets within
    64 bits is what protobuf reads; a tag is read up to 5 octets (a 32-bit varint: upb refuses
    6 to 10, which the fast paths vouched for)."""
    ts_field = 10 if layout_name == "spec" else 3
    tag = bytes([ts_field << 3])
    hostile = [
        tag + b"\x81" + b"\x80" * 9 + b"\x01",  # 11 octets
        tag + b"\xff" * 9 + b"\x02",  # 10 octets, past 64 bits
        tag + b"\x81" + b"\x80" * 8 + b"\x00",  # 10 octets, value 1 (non-minimal, legal)
        b"\x8a" + b"\x80" * 10 + b"\x00\x01x",  # the tag itself of 12 octets
        bytes([ts_field << 3 | 0x80]) + b"\x80" * 4 + b"\x00\x02",  # a 6-octet tag: refused
        bytes([ts_field << 3 | 0x80]) + b"\x80" * 3 + b"\x00\x02",  # 5 octets: read
        b"\x92" + b"\x80" * 8 + b"\x00\x01t",  # a 10-octet tag, value within 64 bits
        b"\x0a" + b"\x81" + b"\x80" * 9 + b"\x00",  # a length of 11 octets
    ]
    good = _good(layout_name)
    recs = [good + h for h in hostile] + [h + good for h in hostile] + [good]
    _agrees(layout_name, recs)
    with pytest.MonkeyPatch.context() as m:  # and the numpy path, where no kernel was built
        m.setattr(columnar, "_waku", None)
        _agrees(layout_name, recs)


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_a_length_past_the_record_end_is_bad_even_if_the_buffer_goes_on(layout_name):
    """A length-delimited field claiming more bytes than its record has is bad, though the
    Arrow buffer holds the next record's bytes right after it (no read across records); a
    length of 2**31 and more is bad too."""
    good = _good(layout_name)
    recs = [
        good + b"\x0a\x05abc",  # 5 claimed, 3 there; the next record follows in the buffer
        good,
        good + b"\x0a\x80\x80\x80\x80\x08",  # 2**31
        good + b"\x0a\xff\xff\xff\xff\x0f",  # 2**32 - 1
        b"\x0a\x7f" + good,  # payload of 127 bytes: runs into the next fields, then past
        good,
    ]
    _, bads = _agrees(layout_name, recs)
    assert [b is not None for b in bads] == [True, False, True, True, True, False]


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_batches_of_one_shape_and_of_mixed_shapes_agree_with_decode_record(layout_name):
    """The one-shape fast path (every record holding the same field next) and the mixed path
    give the same answers: a batch of one shape, then the same with one record of another
    shape (an extra field first) at each end."""
    layout = get_layout(layout_name)
    same = [_good(layout_name, i) for i in range(50)]
    _agrees(layout_name, same)
    if layout_name == "spec":
        other = layout.make_record(payload=b"p", topic="/t", timestamp_ns=5, version=1)
    else:
        other = layout.make_record(payload=b"p", topic=b"\x01\x02\x03\x04", timestamp_ns=5 * NS)
    _agrees(layout_name, [other, *same])
    _agrees(layout_name, [*same, other])


def _edited(record: bytes, edits: list[tuple[int, bytes, bool]]) -> bytes:
    """``record`` with each ``(at, blob, cut)`` applied in turn: ``blob``'s length of bytes cut
    out at ``at``, or ``blob`` spliced in there (``at`` wrapped to the record's length)."""
    r = bytearray(record)
    for at, blob, cut in edits:
        at %= len(r) + 1
        if cut:
            del r[at : at + len(blob)]
        else:
            r[at:at] = blob
    return bytes(r)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout_name=st.sampled_from(LAYOUTS),
    edits=st.lists(
        st.tuples(st.integers(0, 400), st.binary(min_size=0, max_size=12), st.booleans()),
        max_size=4,
    ),
    n=st.integers(1, 20),
)
def test_hypothesis_edited_records_agree_with_decode_record(layout_name, edits, n):
    """Good records with random bytes spliced in or cut out (hypothesis) decode as the
    scalar reference decodes them, or are bad exactly where it raises."""
    _agrees(layout_name, [_edited(_good(layout_name, i), edits) for i in range(n)])


def test_a_status_go_timestamp_past_int64_nanoseconds_is_a_bad_record_not_a_crash():
    """status-go keeps seconds in a uint64; past 2262 their nanoseconds do not fit the int64
    loglake keeps times in. The record is refused by name, alone and in a batch (the batch
    raised OverflowError, losing the whole batch)."""
    from loglake.wire.pb import archives_statusgo_pb2 as pb

    layout = get_layout("status-go")
    for seconds in ((2**63 - 1) // NS + 1, 2**62, 2**64 - 1):
        m = pb.WakuMessage()
        m.ParseFromString(_good("status-go"))
        m.timestamp = seconds
        raw = m.SerializeToString()
        with pytest.raises(BadRecord, match="int64 nanoseconds"):
            layout.decode_record(raw)
        _, bads = _agrees("status-go", [_good("status-go", 1), raw, _good("status-go", 2)])
        assert bads[1] and "int64 nanoseconds" in bads[1] and bads[0] is bads[2] is None
    m.timestamp = (2**63 - 1) // NS  # the last second that fits is a good record
    _agrees("status-go", [m.SerializeToString()])


# -- the C kernel (``_waku``) against the numpy reference -----------------------------------------

# the install builds it where a C compiler is (setup.py; ``make test`` installs gcc first): a
# missing build skips these tests on a developer's machine and fails them under CI=true
needs_kernel = pytest.mark.peer(
    "loglake.archives._waku (the scan's C kernel)",
    columnar._waku is not None,
    "a C compiler and Python's headers: apt-get install gcc python3-dev, then make test",
)


def _fields_both(layout_name: str, col: pa.Array) -> None:
    """``_read_fields_c`` and ``_read_fields_numpy`` of a column: the same records vouched
    for, and for those the same fields with the same values, starts and lengths."""
    f = columnar._waku_fields(layout_name)
    n = len(col)
    bufs = col.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=col.offset + n + 1)[col.offset :]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    ok_c, c = columnar._read_fields_c(f, data, offs)
    ok_np, r = columnar._read_fields_numpy(f, data, offs)
    assert ok_c.tolist() == ok_np.tolist()
    for num, wire in f.wire.items():
        seen_c = c.seen[num] & ok_c
        seen_np = r.seen.get(num, np.zeros(n, dtype=bool)) & ok_np
        assert seen_c.tolist() == seen_np.tolist(), num
        if wire == 2:
            for got, want in ((c.starts, r.starts), (c.lengths, r.lengths)):
                w = want.get(num, np.zeros(n, dtype=np.int64))
                assert got[num][seen_c].tolist() == w[seen_c].tolist(), num
        else:
            w = r.values.get(num, np.zeros(n, dtype=np.uint64))
            assert c.values[num][seen_c].tolist() == w[seen_c].tolist(), num


@needs_kernel
@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_the_c_kernel_reads_the_fields_the_numpy_reference_reads(layout_name):
    """Good, truncated, garbage, repeated, unknown, over-long and empty records (the odd
    records above), whole and sliced: the kernel and the numpy rounds agree record for
    record, and ``decode_waku_batch`` through either agrees with ``decode_record``."""
    layout = get_layout(layout_name)
    for seed in range(6):
        recs = _odd_records(layout, random.Random(100 + seed), 300)
        col = pa.array(recs, type=pa.binary())
        _fields_both(layout_name, col)
        _fields_both(layout_name, col.slice(5, 150))
    _fields_both(layout_name, pa.array([], type=pa.binary()))


@needs_kernel
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout_name=st.sampled_from(LAYOUTS),
    recs=st.lists(st.binary(max_size=40), max_size=12),
    edits=st.lists(
        st.tuples(st.integers(0, 400), st.binary(min_size=0, max_size=12), st.booleans()),
        max_size=4,
    ),
)
def test_hypothesis_hostile_bytes_the_c_kernel_and_numpy_agree(layout_name, recs, edits):
    """Random bytes, and good records with random bytes spliced in or cut out: the kernel
    vouches for exactly the records the numpy reference vouches for, with the same fields."""
    good = [_edited(_good(layout_name, i), edits) for i in range(3)]
    _fields_both(layout_name, pa.array(recs + good, type=pa.binary()))


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_without_the_kernel_the_numpy_path_agrees_with_decode_record(layout_name, monkeypatch):
    """The fallback where no C compiler built the kernel: ``decode_waku_batch`` on the numpy
    rounds alone still gives what ``decode_record`` gives, record for record."""
    monkeypatch.setattr(columnar, "_waku", None)
    layout = get_layout(layout_name)
    for seed in range(4):
        _agrees(layout_name, _odd_records(layout, random.Random(200 + seed), 200))
    assert frame_records(pa.array([b"x"], type=pa.binary())) is None


def _framed_reference(recs: list[bytes]) -> bytes:
    parts, _ = frame_parts(recs)
    return b"".join(parts)


@needs_kernel
@settings(max_examples=150, deadline=None)
@given(
    recs=st.lists(
        st.one_of(
            st.binary(max_size=300),
            st.sampled_from([127, 128, 16_383, 16_384, 2_097_152]).map(lambda k: b"r" * k),
        ),
        max_size=10,
    ),
    cut=st.integers(0, 3),
)
def test_frame_records_is_frame_parts_joined(recs, cut):
    """``frame_records`` (C) holds each record as ``frame_parts`` frames it (``0x1a
    varint(len) record``; lengths at every varint width, past 2 MiB too), on a sliced column,
    with offsets that slice out each frame."""
    col = pa.array(recs, type=pa.binary()).slice(min(cut, len(recs)))
    want = recs[min(cut, len(recs)) :]
    out = frame_records(col)
    assert out is not None and out.type == pa.large_binary()
    assert out.to_pylist() == [_framed_reference([r]) for r in want]
    bufs = out.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int64, count=len(want) + 1)
    body = bufs[2].to_pybytes()[: int(offs[-1])] if bufs[2] is not None else b""
    assert body == _framed_reference(want)


@needs_kernel
def test_the_kernel_refuses_malformed_buffers_without_reading_past_them():
    """Called with offsets that go backwards or past the data, or with buffers too small for
    the answers: a record it cannot read is not vouched for, a frame is refused (None), a
    buffer too small is a ValueError — never a read or write outside the buffers."""
    k = columnar._waku
    f = columnar._waku_fields("spec")
    nums, slots, wires = columnar._slots(f)
    data = np.frombuffer(_good("spec"), dtype=np.uint8)
    offs = np.array([0, len(data), 5, len(data) + 100, -3, 0], dtype=np.int32)
    n, ns = len(offs) - 1, len(nums)
    seen = np.zeros((n, ns), np.uint8)
    value = np.zeros((n, ns), np.uint64)
    length = np.zeros((n, ns), np.int64)
    ok = np.full(n, 7, np.uint8)
    k.fields(data, offs, slots, wires, seen, value, length, ok)
    assert ok.tolist() == [1, 0, 0, 0, 0]
    assert k.frame(data, offs) is None
    with pytest.raises(ValueError):
        k.fields(data, offs, slots, wires, seen[:2], value, length, ok)
    with pytest.raises(ValueError):
        k.fields(data, offs[:-1].tobytes() + b"x", slots, wires, seen, value, length, ok)
    with pytest.raises(ValueError):
        k.fields(data, offs, slots[:10], wires, seen, value, length, ok)
    with pytest.raises(ValueError):
        k.fields(data, offs, b"\x09" * 256, wires, seen, value, length, ok)  # slot past wires
    with pytest.raises(ValueError):
        k.frame(data, b"\x00\x00")


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(
    pool=st.lists(st.binary(max_size=6), min_size=1, max_size=80),
    picks=st.lists(st.integers(0, 79), max_size=60),
    utf8=st.booleans(),
)
def test_topic_codes_hold_the_topics_the_plain_reference_gathers(pool, picks, utf8):
    """``_topic_codes`` (C: codes into the distinct topics) holds, record for record, the
    topics ``_topics_plain`` (the reference) gathers, as ``topic_type``; it gives None (the
    caller gathers them plainly) only for more than ``TOPIC_CODES_MAX`` distinct topics or a
    topic that is not UTF-8 where UTF-8 is wanted."""
    topics = [pool[i % len(pool)] for i in picks]
    data = np.frombuffer(b"~" + b"".join(topics) + b"~", dtype=np.uint8)
    lengths = np.array([len(t) for t in topics], dtype=np.int64)
    starts = np.zeros(len(topics), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    starts += 1
    topic_type = pa.string() if utf8 else pa.binary()
    got = columnar._topic_codes(data, starts, lengths, topic_type)
    ok = np.ones(len(topics), dtype=bool)
    want = columnar._topics_plain(data, starts, lengths, ok, topic_type)
    too_many = len(set(topics)) > columnar.TOPIC_CODES_MAX
    not_utf8 = utf8 and not ok.all()
    if got is None:
        assert not topics or too_many or not_utf8
        return
    assert not too_many and not not_utf8
    assert pa.types.is_dictionary(got.type) and got.type.value_type == topic_type
    assert got.to_pylist() == want.to_pylist()
    assert len(got.dictionary) == len(set(topics))  # each distinct topic once


@needs_kernel
def test_topic_codes_refuse_slices_past_the_data_and_many_topics():
    """Hostile starts or lengths (negative, past the buffer) get None, never a read outside
    it; a batch of more distinct topics than ``TOPIC_CODES_MAX`` gets None; a column of such
    topics still decodes as ``decode_record`` decodes it (through the plain gather)."""
    from loglake.archives import _waku  # type: ignore[attr-defined]

    data = np.frombuffer(b"abcdef", dtype=np.uint8)
    codes = np.empty(1, dtype=np.int32)
    for s, n in ((-1, 1), (0, 7), (6, 1), (2, -1), (7, 0)):
        assert _waku.topic_codes(data, np.array([s]), np.array([n]), codes, 4) is None
    with pytest.raises(ValueError):
        _waku.topic_codes(data, np.array([0]), np.array([1, 1]), codes, 4)
    many = np.arange(6, dtype=np.int64)
    assert _waku.topic_codes(data, many, np.ones(6, np.int64), np.empty(6, np.int32), 5) is None
    assert _waku.topic_codes(data, many, np.ones(6, np.int64), np.empty(6, np.int32), 6) == [
        b"a",
        b"b",
        b"c",
        b"d",
        b"e",
        b"f",
    ]
    layout = get_layout("spec")
    recs = [
        layout.make_record(payload=b"p", topic=f"/t/{i}", timestamp_ns=(i + 1) * NS)
        for i in range(columnar.TOPIC_CODES_MAX + 5)
    ]
    _agrees("spec", recs + recs[:3])


def test_a_spec_timestamp_before_1970_is_bad_on_every_path():
    # sint64 on the wire: a negative time went through, and the build then failed untyped at
    # its window (an archive's from/to are uint64)
    layout = get_layout("spec")
    recs = [
        layout.make_record(payload=b"x", topic="/t", timestamp_ns=-1),
        _good("spec"),
        layout.make_record(payload=b"x", topic="/t", timestamp_ns=0),
    ]
    with pytest.raises(BadRecord, match="before 1970"):
        layout.decode_record(recs[0])
    _, bads = _agrees("spec", recs)
    assert [b is not None for b in bads] == [True, False, False]
    with pytest.MonkeyPatch.context() as m:  # the numpy path, where no kernel was built
        m.setattr(columnar, "_waku", None)
        _agrees("spec", recs)


def _with_nulls(recs: list[bytes], nulls: set[int], typ: pa.DataType) -> pa.Array:
    """``recs`` as a ``typ`` column whose rows ``nulls`` are null, their slots still spanning
    their record's bytes (Arrow allows a null any span; pyarrow's own nulls span none)."""
    col = pa.array(recs, type=typ)
    valid = pa.array([i not in nulls for i in range(len(recs))]).buffers()[1]
    return pa.Array.from_buffers(typ, len(recs), [valid, *col.buffers()[1:]])


@pytest.mark.parametrize("kernel", [True, False], ids=["c", "numpy"])
@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary()], ids=str)
@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_a_null_record_is_a_bad_record_of_its_own_row(layout_name, typ, kernel, monkeypatch):
    # Found from outside: a binary column with a null made decode_waku_batch raise a bare
    # TypeError (decode_record(None)) for the whole batch; a bad record of its own row now, on
    # every path, even where the null's slot spans a good record's bytes
    if not kernel:
        monkeypatch.setattr(columnar, "_waku", None)
    layout = get_layout(layout_name)
    recs = [_good(layout_name, i) for i in range(6)]
    for col in (
        _with_nulls(recs, {1, 4}, typ),
        pa.array([None if i in (1, 4) else r for i, r in enumerate(recs)], type=typ),
    ):
        ts, topics, cap, bads = decode_waku_batch(layout_name, col)
        assert bads == [columnar.NULL_RECORD if i in (1, 4) else None for i in range(6)]
        got = topics.to_pylist()
        for i, raw in enumerate(recs):
            m = layout.decode_record(raw)
            want = (0, None, 0) if i in (1, 4) else (m[0], m[1], m[3])
            assert (int(ts[i]), got[i], int(cap[i])) == want, i
    only = pa.array([None, None], type=typ)
    assert decode_waku_batch(layout_name, only)[3] == [columnar.NULL_RECORD] * 2
