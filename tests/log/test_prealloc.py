"""The active segment is zero-filled ahead of small writes (``Segment._zero_ahead``): zeros past
the last record while it is written, none once it is sealed or the log is closed, and a crash
that leaves them loses nothing and does not make the next record land after them."""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import pytest

from loglake.log import SegmentLog, StreamConfig, fs, open_log
from loglake.log.partition import CHUNK_BYTES
from loglake.log.record_codec import PLAIN_HEAD_SIZE, scan
from loglake.log.segment import READ_CHUNK, SMALL_WRITE, ZERO_AHEAD, ZERO_AHEAD_MIN


def seg_files(data: Path) -> list[Path]:
    return sorted((data / "streams" / "s" / "0").glob("*.seg"))


def records_end(path: Path) -> tuple[int, int, bool]:
    """``(end of the last whole record, file size, the rest is zeros)``."""
    raw = path.read_bytes()
    _, end, _ = scan(raw)
    return end, len(raw), raw.count(0, end) == len(raw) - end


def payload(i: int, n: int = 1000) -> bytes:
    return (b"%08d" % i) * (n // 8)


def crash_image(tmp_path: Path, records: int) -> Path:
    """A copy of the data folder taken while the writer runs (after ``records`` ``always``
    appends): what a crash leaves with the page cache written, the zeros included."""
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    with open_log(live) as log:
        log.create_stream("s", StreamConfig(durability="always"))
        for i in range(records):
            log.append("s", payload(i))
        shutil.copytree(live, crashed, ignore=shutil.ignore_patterns("LOCK"))
    return crashed


def test_the_active_segment_is_zero_filled_ahead_and_trimmed_on_close(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="always"))
        log.append("s", payload(0))
        (seg,) = seg_files(tmp_path)
        end, size, zeros = records_end(seg)
        assert size == end + ZERO_AHEAD_MIN and zeros  # a small segment: few zeros
        n, most = 1, 0
        while end < 3 * ZERO_AHEAD:
            for _ in range(37):
                log.append("s", payload(n))
                n += 1
            end, size, zeros = records_end(seg)
            assert zeros and end <= size <= end + max(end, ZERO_AHEAD_MIN)
            most = max(most, size - end)
        assert most > ZERO_AHEAD // 2  # a large segment: up to ZERO_AHEAD at a time
    end, size, _ = records_end(seg)
    assert end == size  # the clean close cut the zeros
    with open_log(tmp_path) as log:
        assert [r.data for r in log.read("s", 0)] == [payload(i) for i in range(n)]


def test_a_crash_image_with_zeros_reopens_and_appends_after_the_last_record(tmp_path, caplog):
    """Records, then zeros, reopen with every record, without the torn-tail warning (zeros are
    not damage), and the next record follows the last one."""
    crashed = crash_image(tmp_path, 30)
    assert records_end(seg_files(crashed)[0])[1] > records_end(seg_files(crashed)[0])[0]
    with caplog.at_level(logging.INFO), open_log(crashed) as log:
        assert log.next_index("s") == 30
        assert log.append("s", payload(30)) == 30
    assert "truncated torn tail" not in caplog.text
    end, size, _ = records_end(seg_files(crashed)[0])
    assert end == size
    with open_log(crashed) as log:
        assert [r.data for r in log.read("s", 0)] == [payload(i) for i in range(31)]


def test_a_torn_record_before_the_zeros_is_still_reported_and_cut(tmp_path, caplog):
    crashed = crash_image(tmp_path, 5)
    (seg,) = seg_files(crashed)
    end, _, _ = records_end(seg)
    with seg.open("r+b") as f:  # half a record past the last one, as a torn write leaves
        f.seek(end)
        f.write(payload(0)[:8] + b"\x01" * 300)
    with caplog.at_level(logging.INFO), open_log(crashed) as log:
        assert log.next_index("s") == 5
    assert "truncated torn tail" in caplog.text


def test_a_reader_follows_the_writer_through_the_zeros(tmp_path):
    """A reader in another log object (another process, as far as the files go) sees every
    record, including one longer than a read chunk, and nothing of the zeros."""
    big = b"B" * (READ_CHUNK + 5000)
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="always"))
        log.append("s", payload(0))
        with open_log(tmp_path, readonly=True) as reader:
            assert [r.data for r in reader.read("s", 0)] == [payload(0)]
            log.append("s", big)
            for i in range(2, 400):
                log.append("s", payload(i))
            got = [r.data for r in reader.read("s", 0)]
            assert got == [payload(0), big, *(payload(i) for i in range(2, 400))]
            assert reader.next_index("s") == 400


def test_a_rolled_segment_has_no_zeros(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="always", segment_bytes=40_000))
        for i in range(100):
            log.append("s", payload(i))
        segs = seg_files(tmp_path)
        assert len(segs) > 2
        for seg in segs[:-1]:
            end, size, _ = records_end(seg)
            assert end == size <= 40_000
        # zero-filled no further than the roll size
        assert records_end(segs[-1])[1] <= 40_000


def test_a_burst_sized_write_extends_the_file_without_zeros(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="batch"))
        log.append_payloads("s", [payload(i) for i in range(2 * SMALL_WRITE // 1000)])
        end, size, _ = records_end(seg_files(tmp_path)[0])
        assert end == size


def test_a_chunked_append_writes_no_zeros_even_where_its_last_chunk_is_small(tmp_path):
    # a large ``batch`` append is written a chunk at a time; its last chunk may be small, but
    # zeros ahead of it would be written for nothing (the next large append overwrites them)
    # and fsynced with the batch: 1 MiB more per append once the segment is large
    step = CHUNK_BYTES // (1000 + 64)  # records per chunk (``_chunk_records``)
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="batch"))
        for round_ in range(3):
            log.append_payloads("s", [payload(i) for i in range(step + 10)])
            end, size, _ = records_end(seg_files(tmp_path)[0])
            assert end == size, round_
        log.append_payloads("s", [payload(0)])  # a small append still fills
        end, size, zeros = records_end(seg_files(tmp_path)[0])
        assert size > end and zeros


def _zero_writes_fail(monkeypatch, log, err: int, half_first: bool = False) -> list[int]:
    """Make ``fs.pwrite`` on the active segment fail with ``err`` (the zero fill's call; the
    records go through ``fs.write``), after writing half of the first call's bytes if
    ``half_first`` (a disk that fills midway); returns the failed calls' offsets."""
    seg_fd = log._partition("s", 0).segments[-1].wfd
    real, failed = fs.pwrite, []

    def pwrite(fd, data, offset):
        if fd == seg_fd:
            if half_first and not failed:
                failed.append(None)
                return real(fd, data[: len(data) // 2], offset)
            failed.append(offset)
            raise OSError(err, "injected")
        return real(fd, data, offset)

    monkeypatch.setattr(fs, "pwrite", pwrite)
    return failed


def test_a_disk_too_full_for_the_zeros_still_takes_the_record(tmp_path, monkeypatch):
    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(durability="always"))
    failed = _zero_writes_fail(monkeypatch, log, errno.ENOSPC, half_first=True)
    assert log.append("s", payload(0)) == 0
    first_fill = len(payload(0)) + PLAIN_HEAD_SIZE + ZERO_AHEAD_MIN  # the record, then zeros
    assert failed == [None, first_fill // 2]  # half the zeros, then the disk was full
    end, size, _ = records_end(seg_files(tmp_path)[0])
    assert end == size  # the half written was cut: the write went on without zeros
    assert log.append("s", payload(1)) == 1
    log.close()
    with open_log(tmp_path) as log:
        assert [r.data for r in log.read("s", 0)] == [payload(0), payload(1)]


def test_a_failed_zero_fill_fails_the_append_and_loses_nothing(tmp_path, monkeypatch):
    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(durability="always", segment_bytes=20_000))
    for i in range(25):  # rolls: the new active segment has no zeros yet
        log.append("s", payload(i))
    real = fs.pwrite
    _zero_writes_fail(monkeypatch, log, errno.EIO)
    with pytest.raises(OSError) as e:
        while True:
            log.append("s", payload(99))
    assert e.value.errno == errno.EIO
    monkeypatch.setattr(fs, "pwrite", real)  # the device is back
    n = log.next_index("s")
    assert log.append("s", payload(n)) == n
    log.close()
    with open_log(tmp_path) as log:
        got = [r.data for r in log.read("s", 0)]
    assert got[:25] == [payload(i) for i in range(25)] and got[-1] == payload(n)
    assert len(got) == n + 1


def test_a_disk_too_full_for_the_index_entry_still_takes_the_record_once(tmp_path, monkeypatch):
    # The data lands in blocks zero-filled ahead; the .idx append needs a new block and the
    # disk is full. The append did happen, so it must not be reported as failed: it was, and
    # the caller's retry stored the record twice. The .idx goes instead (derived data: it is
    # rebuilt from the segment wherever it is missing).
    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(durability="always", segment_bytes=1 << 20))
    assert log.append("s", b"a" * 5000) == 0  # the next record is past INTERVAL_BYTES
    seg = log._partition("s", 0).segments[-1]
    idx, real = seg.ifd, fs.write

    def write(fd, data):
        if fd == idx:
            raise OSError(errno.ENOSPC, "injected")
        return real(fd, data)

    monkeypatch.setattr(fs, "write", write)
    assert log.append("s", b"b" * 100) == 1  # an index entry was due: it is not written
    monkeypatch.setattr(fs, "write", real)
    assert seg.ifd is None and not Path(seg.idx_path).exists()
    assert log.append("s", b"c" * 100) == 2
    log.close()
    with open_log(tmp_path) as log:
        assert [r.data[:1] for r in log.read("s", 0)] == [b"a", b"b", b"c"]
        assert [r.index for r in log.read("s", 1)] == [1, 2]  # found through a rebuilt index
