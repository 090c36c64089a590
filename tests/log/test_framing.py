"""The batch framer in C (``loglake.log._framing``) against the Python encoder it stands in
for: the same bytes for any batch, its CRC32C the ``crc32c`` package's on both of its paths
(the CPU's instruction and the table), a fallback to Python for whatever it does not take, and
a log written through it byte-identical on disk to one written without it."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.log import Entry, InvalidTimestamp, StreamConfig, open_log, partition, record_codec
from loglake.log.record_codec import encode_batch_parts, encode_plain_parts, scan

_framing = record_codec._framing
# the install builds it where a C compiler is (setup.py; ``make test`` installs gcc first): a
# missing build skips these tests on a developer's machine and fails them under CI=true
pytestmark = pytest.mark.peer(
    "loglake.log._framing (the C framer)",
    _framing is not None,
    "a C compiler and Python's headers: apt-get install gcc python3-dev, then make test",
)

U64 = 2**64
I64 = st.integers(-(2**63), 2**63 - 1)
NEAR_I64 = st.sampled_from([-(2**63) - 1, -(2**63), 2**63 - 1, 2**63, 2**64]) | I64
"""int64's bounds and the integers just past them, or any int64"""


def python_only(fn, *args):
    saved = record_codec._framing
    record_codec._framing = None
    try:
        return fn(*args)
    finally:
        record_codec._framing = saved


def joined(encoded) -> tuple[bytes, int, list[int], int]:
    parts, size, offsets, max_ts = encoded
    return b"".join(parts), size, offsets, max_ts


@pytest.mark.parametrize("table", [False, True], ids=["cpu", "table"])
def test_crc32c_is_the_packages(table):
    data = os.urandom(5000)
    for start in range(9):  # every alignment
        for n in [*range(0, 70), 255, 256, 1024, 4096 - start]:
            chunk = data[start : start + n]
            assert _framing.crc32c(chunk, table) == crc32c(chunk)


@settings(max_examples=300, deadline=None)
@given(
    datas=st.lists(st.binary(max_size=300), max_size=40),
    first=st.integers(0, U64 - 41),
    now=I64,
)
def test_plain_frames_are_the_python_encoders(datas, first, now):
    got = joined(encode_plain_parts(datas, first, now))
    assert got == joined(python_only(encode_plain_parts, datas, first, now))
    if datas:
        assert len(encode_plain_parts(datas, first, now)[0]) == 1  # the C path was taken


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.tuples(st.binary(max_size=200), st.none() | I64), max_size=30),
    first=st.integers(0, U64 - 31),
    now=I64,
)
def test_entry_frames_are_the_python_encoders(records, first, now):
    entries = [Entry(data, timestamp_ns=ts) for data, ts in records]
    got = joined(encode_batch_parts(entries, first, now))
    assert got == joined(python_only(encode_batch_parts, entries, first, now))


def outcome(fn, *args):
    """The frames, or the type of the error (the C framer and the Python encoder must agree
    on both)."""
    try:
        return joined(fn(*args))
    except Exception as e:
        return type(e)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.tuples(st.binary(max_size=50), st.none() | NEAR_I64), max_size=8),
    now=NEAR_I64,
)
def test_a_timestamp_outside_int64_is_the_same_typed_error_on_both_paths(records, now):
    # the rule of both: a timestamp a record would carry must be an int64 (InvalidTimestamp);
    # now_ns is only read for an entry without its own timestamp (before, the C framer raised
    # OverflowError for an unread now_ns, and the Python encoder a bare struct.error)
    entries = [Entry(data, timestamp_ns=ts) for data, ts in records]
    got = outcome(encode_batch_parts, entries, 0, now)
    assert got == outcome(python_only, encode_batch_parts, entries, 0, now)
    stamps = [now if ts is None else ts for _, ts in records]
    assert (got is InvalidTimestamp) == any(not -(2**63) <= t < 2**63 for t in stamps)
    datas = [data for data, _ in records]
    got = outcome(encode_plain_parts, datas, 0, now)
    assert got == outcome(python_only, encode_plain_parts, datas, 0, now)
    assert (got is InvalidTimestamp) == (bool(datas) and not -(2**63) <= now < 2**63)


def test_the_c_framer_reads_now_ns_only_where_it_is_the_timestamp():
    assert _framing.frame_plain([b"a"], 0, 2**63) is None  # left to Python, which names it
    assert _framing.frame_plain([b"a"], 0, 1.0) is None
    with_stamps = _framing.frame_plain([b"a"], 0, 2**63, [5])  # now_ns not used: not read
    assert with_stamps == _framing.frame_plain([b"a"], 0, 5)
    entries = [Entry(b"a", timestamp_ns=5)]
    assert joined(encode_batch_parts(entries, 0, 2**63)) == joined(
        python_only(encode_batch_parts, entries, 0, 2**63)
    )
    with pytest.raises(InvalidTimestamp):
        encode_plain_parts([b"a"], 0, 2**63)


def test_what_the_c_framer_does_not_take_is_framed_in_python():
    # (each returns None from C; the encoder then frames it in Python, the same bytes)
    assert _framing.frame_plain([b"a", bytearray(b"b")], 0, 0) is None  # not all bytes
    assert _framing.frame_plain([b"a"], -1, 0) is None  # a negative index
    assert _framing.frame_plain([b"a", b"b"], U64 - 1, 0) is None  # past u64
    assert _framing.frame_plain([b"a"], 0, 0, [2**63]) is None  # a timestamp past i64
    assert _framing.frame_plain([b"a"], 0, 0, [1.0]) is None  # a timestamp that is no int
    assert _framing.frame_plain(collections.deque([b"a"]), 0, 0) is None  # not list/tuple
    for datas in ([b"a", bytearray(b"b"), memoryview(b"cd")], collections.deque([b"x", b"y"])):
        got = joined(encode_plain_parts(datas, 7, 9))
        assert got == joined(python_only(encode_plain_parts, datas, 7, 9))
    entries = [Entry(b"k", key=b"key"), Entry(b"h", headers=(("n", b"v"),)), Entry(b"p")]
    got = joined(encode_batch_parts(entries, 3, 5))
    assert got == joined(python_only(encode_batch_parts, entries, 3, 5))
    records, end, error = scan(got[0])
    assert [r.data for r in records] == [b"k", b"h", b"p"] and end == len(got[0]) and not error


def test_a_batch_past_64_mib_is_left_to_python():
    # the C framer copies the batch into one buffer; past a segment's default size the
    # Python encoder writes the records' data from where it is
    big = [b"x" * (32 << 20), b"y" * (32 << 20)]
    assert _framing.frame_plain(big, 0, 0) is None
    assert _framing.frame_plain(big[:1], 0, 0) is not None
    assert len(encode_plain_parts(big, 0, 0)[0]) == 4  # head, data, head, data


def _write(root: Path, entries: list[Entry], payloads: list[bytes]) -> None:
    with open_log(root) as log:
        log.create_stream("s", StreamConfig(durability="batch"))
        log.append_many("s", entries)  # chunked: larger than CHUNK_BYTES
        for i in range(0, len(payloads), 100):
            log.append_payloads("s", payloads[i : i + 100])
        log.append_many("s", [Entry(b"one", timestamp_ns=5)])  # a lone, zero-filled append


def test_a_log_written_through_the_c_framer_is_the_same_on_disk(tmp_path, monkeypatch):
    entries = [Entry(os.urandom(700 + i % 50), timestamp_ns=1_000 + i) for i in range(900)]
    payloads = [os.urandom(i % 300) for i in range(700)]
    monkeypatch.setattr(partition.time, "time_ns", lambda: 42)  # the payloads' timestamps
    _write(tmp_path / "c", entries, payloads)
    monkeypatch.setattr(record_codec, "_framing", None)
    _write(tmp_path / "py", entries, payloads)
    files = sorted(p.relative_to(tmp_path / "c") for p in (tmp_path / "c").rglob("*"))
    data_files = [f for f in files if f.suffix in (".seg", ".idx")]
    assert data_files
    for f in data_files:
        assert (tmp_path / "c" / f).read_bytes() == (tmp_path / "py" / f).read_bytes(), f
    with open_log(tmp_path / "c") as log:
        rows = log.read_payloads("s", 0, 10_000)
    assert [d for _, d in rows] == [e.data for e in entries] + payloads + [b"one"]
