"""The log's batch write without a join (issue 16): ``encode_plain_parts`` /
``encode_batch_parts`` hand the records' data on as given, and ``fs.writev_all`` writes the
parts with ``writev`` — whole, across more parts than one ``writev`` takes, after short writes —
or, while a layer has replaced ``fs.write``, through that ``write``."""

from __future__ import annotations

import array
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.log import fs
from loglake.log.api import Entry
from loglake.log.record_codec import (
    decode_frame,
    encode_batch,
    encode_batch_parts,
    encode_plain,
    encode_plain_parts,
)
from loglake.log.segment_log import SegmentLog


@settings(max_examples=60, deadline=None)
@given(
    datas=st.lists(st.binary(max_size=300), max_size=20),
    first=st.integers(0, 2**40),
    now=st.integers(-(2**62), 2**62),
)
def test_plain_parts_are_the_batch_bytes(datas, first, now):
    parts, size, offsets, max_ts = encode_plain_parts(datas, first, now)
    joined = b"".join(parts)
    assert (joined, offsets, max_ts) == encode_plain(datas, first, now)
    assert (joined, offsets, max_ts) == encode_batch([Entry(d) for d in datas], first, now)
    assert size == len(joined)
    bparts, bsize, boffsets, _ = encode_batch_parts([Entry(d) for d in datas], first, now)
    assert (b"".join(bparts), bsize, boffsets) == (joined, size, offsets)


def test_data_is_passed_on_not_copied():
    a, b = os.urandom(100), bytearray(os.urandom(50))
    view = memoryview(os.urandom(80))[10:70]
    parts, _, _, _ = encode_plain_parts([a, b, view], 0, 1)
    assert parts[1] is a
    assert isinstance(parts[3], memoryview) and parts[3].obj is b
    assert isinstance(parts[5], memoryview) and parts[5].obj is view.obj
    joined = b"".join(parts)
    assert decode_frame(joined, 0).data == a
    assert decode_frame(joined, 27 + 100).data == bytes(b)


def test_a_wide_item_view_is_counted_in_bytes():
    words = array.array("I", range(10))  # a memoryview of it has len 10, nbytes 40
    parts, size, _, _ = encode_plain_parts([memoryview(words)], 3, 1)
    assert decode_frame(b"".join(parts), 0).data == words.tobytes()
    assert size == 27 + 40
    strided = memoryview(bytes(range(20)))[::2]  # not contiguous: copied
    parts, _, _, _ = encode_plain_parts([strided], 0, 1)
    assert decode_frame(b"".join(parts), 0).data == bytes(range(0, 20, 2))


def _file(tmp_path):
    return fs.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


@pytest.mark.parametrize("known_size", [False, True])
def test_writev_all_more_parts_than_one_call_takes(tmp_path, known_size):
    parts = [os.urandom(i % 7) for i in range(fs.IOV_MAX * 2 + 5)]
    fd = _file(tmp_path)
    try:
        fs.writev_all(fd, parts, sum(map(len, parts)) if known_size else None)
        fs.writev_all(fd, [])
    finally:
        fs.close(fd)
    assert (tmp_path / "f").read_bytes() == b"".join(parts)


@pytest.mark.parametrize("known_size", [False, True])  # the one-call path for a given size
def test_writev_all_finishes_short_writes(tmp_path, monkeypatch, known_size):
    calls = []

    def short(fd, bufs):  # the real writev of at most 5 bytes: a short write
        calls.append(len(bufs))
        want = b"".join(bufs)[:5]
        return os.writev(fd, [want])

    monkeypatch.setattr(fs, "_writev", short)
    parts = [b"abc", b"", b"defgh", bytearray(b"ij"), memoryview(b"klmnopq")[1:]]
    fd = _file(tmp_path)
    try:
        fs.writev_all(fd, parts, 16 if known_size else None)
    finally:
        fs.close(fd)
    assert (tmp_path / "f").read_bytes() == b"abcdefghijlmnopq"
    assert calls


@pytest.mark.parametrize("known_size", [None, 1])
def test_writev_all_raises_when_nothing_is_written(tmp_path, monkeypatch, known_size):
    monkeypatch.setattr(fs, "_writev", lambda fd, bufs: 0)
    fd = _file(tmp_path)
    try:
        with pytest.raises(OSError, match="writev returned 0"):
            fs.writev_all(fd, [b"x"], known_size)
    finally:
        fs.close(fd)


def test_a_replaced_write_sees_every_byte(tmp_path, monkeypatch):
    """A layer over ``fs.write`` (simulated disk, fault injection) still gets the batch."""
    seen: list[bytes] = []

    def write(fd, data):
        seen.append(bytes(data))
        return os.write(fd, data)

    monkeypatch.setattr(fs, "write", write)
    log = SegmentLog(tmp_path / "log")
    try:
        log.create_stream("s")
        log.append_payloads("s", [b"one", bytearray(b"two"), memoryview(b"three")])
        assert [r.data for r in log.read("s", 0, 10)] == [b"one", b"two", b"three"]
    finally:
        log.close()
    assert any(b"three" in chunk and b"one" in chunk for chunk in seen)
