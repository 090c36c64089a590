"""The active segment is allocated ahead of its records (``Segment._allocate``): zeros past the
last record while it is written, none once it is sealed or the log is closed, and a crash that
leaves them loses nothing and does not make the next record land after them."""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import pytest

from loglake.log import SegmentLog, StreamConfig, fs, open_log
from loglake.log.record_codec import scan
from loglake.log.segment import PREALLOC_STEP_MIN, READ_CHUNK


def seg_files(data: Path) -> list[Path]:
    return sorted((data / "streams" / "s" / "0").glob("*.seg"))


def records_end(path: Path) -> tuple[int, int, bool]:
    """``(end of the last whole record, file size, the rest is zeros)``."""
    raw = path.read_bytes()
    _, end, _ = scan(raw)
    return end, len(raw), raw.count(0, end) == len(raw) - end


def payload(i: int, n: int = 1000) -> bytes:
    return (b"%08d" % i) * (n // 8)


def test_the_active_segment_is_allocated_ahead_and_trimmed_on_close(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="always"))
        for i in range(50):
            log.append("s", 0, payload(i))
        (seg,) = seg_files(tmp_path)
        end, size, zeros = records_end(seg)
        assert end > 50 * 1000 and size >= PREALLOC_STEP_MIN > end and zeros
    end, size, _ = records_end(seg)
    assert end == size  # the clean close cut the zeros
    with open_log(tmp_path) as log:
        assert [r.data for r in log.read("s", 0, 0)] == [payload(i) for i in range(50)]


def test_a_crash_image_with_zeros_reopens_and_appends_after_the_last_record(tmp_path, caplog):
    """A copy of the data folder taken while the writer runs is what a crash leaves with the
    page cache written: records, then zeros. It reopens with every record, without the torn-tail
    warning (zeros are not damage), and the next record follows the last one."""
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    with open_log(live) as log:
        log.create_stream("s", StreamConfig(durability="always"))
        for i in range(30):
            log.append("s", 0, payload(i))
        shutil.copytree(live, crashed, ignore=shutil.ignore_patterns("LOCK"))
    assert records_end(seg_files(crashed)[0])[1] > records_end(seg_files(crashed)[0])[0]
    with caplog.at_level(logging.INFO), open_log(crashed) as log:
        assert log.next_index("s") == 30
        assert log.append("s", 0, payload(30)) == 30
    assert "truncated torn tail" not in caplog.text
    end, size, _ = records_end(seg_files(crashed)[0])
    assert end == size
    with open_log(crashed) as log:
        assert [r.data for r in log.read("s", 0, 0)] == [payload(i) for i in range(31)]


def test_a_torn_record_before_the_zeros_is_still_reported_and_cut(tmp_path, caplog):
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    with open_log(live) as log:
        log.create_stream("s", StreamConfig(durability="always"))
        for i in range(5):
            log.append("s", 0, payload(i))
        shutil.copytree(live, crashed, ignore=shutil.ignore_patterns("LOCK"))
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
        log.append("s", 0, payload(0))
        with open_log(tmp_path, readonly=True) as reader:
            assert [r.data for r in reader.read("s", 0, 0)] == [payload(0)]
            log.append("s", 0, big)
            for i in range(2, 400):
                log.append("s", 0, payload(i))
            got = [r.data for r in reader.read("s", 0, 0)]
            assert got == [payload(0), big, *(payload(i) for i in range(2, 400))]
            assert reader.next_index("s") == 400


def test_a_rolled_segment_has_no_zeros(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="always", segment_bytes=40_000))
        for i in range(100):
            log.append("s", 0, payload(i))
        segs = seg_files(tmp_path)
        assert len(segs) > 2
        for seg in segs[:-1]:
            end, size, _ = records_end(seg)
            assert end == size <= 40_000
        # allocated ahead no further than the roll size
        assert records_end(segs[-1])[1] <= 40_000


def test_a_full_disk_fails_the_append_before_writing_and_loses_nothing(tmp_path, monkeypatch):
    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(durability="always"))
    log.append("s", 0, payload(0))
    real = fs.fallocate

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "injected ENOSPC")

    monkeypatch.setattr(fs, "fallocate", full)
    with pytest.raises(OSError) as e:
        log.append("s", 0, b"x" * (PREALLOC_STEP_MIN + 1))
    assert e.value.errno == errno.ENOSPC
    monkeypatch.setattr(fs, "fallocate", real)  # space freed
    assert log.append("s", 0, payload(1)) == 1
    log.close()
    with open_log(tmp_path) as log:
        assert [r.data for r in log.read("s", 0, 0)] == [payload(0), payload(1)]


def test_when_the_step_does_not_fit_only_what_the_write_needs_is_allocated(tmp_path, monkeypatch):
    real = fs.fallocate
    limit = 3 * PREALLOC_STEP_MIN  # the "disk" holds this much of the file

    def nearly_full(fd, offset, length):
        if offset + length > limit:
            raise OSError(errno.ENOSPC, "injected ENOSPC")
        real(fd, offset, length)

    monkeypatch.setattr(fs, "fallocate", nearly_full)
    n = 0
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="always"))
        with pytest.raises(OSError):
            while True:
                log.append("s", 0, payload(n))
                n += 1
        assert n * 1000 > 2 * PREALLOC_STEP_MIN  # it went on past the last whole step
    with open_log(tmp_path) as log:
        assert [r.data for r in log.read("s", 0, 0)] == [payload(i) for i in range(n)]
