"""The columnar WakuMessage decoder (``archives.columnar``) against each layout's own
``decode_record``, record for record, without Spark."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.archives import get_layout
from loglake.archives.columnar import decode_waku_batch
from loglake.archives.errors import BadRecord
from loglake.archives.layout import NS, Layout

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
    goes to ``decode_record`` (which refuses it); one padded to 10 octets within 64 bits is
    what protobuf reads."""
    ts_field = 10 if layout_name == "spec" else 3
    tag = bytes([ts_field << 3])
    hostile = [
        tag + b"\x81" + b"\x80" * 9 + b"\x01",  # 11 octets
        tag + b"\xff" * 9 + b"\x02",  # 10 octets, past 64 bits
        tag + b"\x81" + b"\x80" * 8 + b"\x00",  # 10 octets, value 1 (non-minimal, legal)
        b"\x8a" + b"\x80" * 10 + b"\x00\x01x",  # the tag itself of 12 octets
        b"\x0a" + b"\x81" + b"\x80" * 9 + b"\x00",  # a length of 11 octets
    ]
    good = _good(layout_name)
    recs = [good + h for h in hostile] + [h + good for h in hostile] + [good]
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
    recs = []
    for i in range(n):
        r = bytearray(_good(layout_name, i))
        for at, blob, cut in edits:
            at %= len(r) + 1
            if cut:
                del r[at : at + len(blob)]
            else:
                r[at:at] = blob
        recs.append(bytes(r))
    _agrees(layout_name, recs)


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
