"""Issue 17: the storage core trusts only what was fsynced and never drops an acknowledged
record silently. One test per defect; each failed on the code of 7484460."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from loglake.log import (
    CorruptSegment,
    Entry,
    LogClosed,
    SegmentLog,
    StorageFailed,
    StreamConfig,
    fs,
    open_log,
)
from loglake.log.record_codec import encode_batch
from tests.log.clock import ManualClock

DURABLE = "DURABLE"  # loglake.log.watermark.FILE_NAME


def part_dir(data: Path, stream: str = "s", p: int = 0) -> Path:
    return data / "streams" / stream / str(p)


def seg_files(data: Path, stream: str = "s", p: int = 0) -> list[Path]:
    return sorted(part_dir(data, stream, p).glob("*.seg"))


def flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))


# -- §1 recovery cuts only the unsynced suffix ----------------------------------------------


def test_a_flip_in_acknowledged_records_near_the_end_is_corrupt_segment_not_a_torn_tail(tmp_path):
    """The issue's reproduction: 2,000 records with ``always``, clean close, one byte flipped
    1 KB before the end of the active segment. It used to open with 1,993 records."""
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="always"))
        for i in range(2000):
            log.append("s", b"record %06d " % i + b"x" * 100)
    (seg,) = seg_files(tmp_path)
    size = seg.stat().st_size
    flip(seg, size - 1024)
    with pytest.raises(CorruptSegment) as e, open_log(tmp_path) as log:
        assert log.next_index("s") == 2000
        log.read("s", 0)
    assert e.value.path == str(seg)
    assert size - 1024 - 200 < e.value.offset <= size - 1024
    assert seg.stat().st_size == size  # nothing cut


def test_a_bad_record_followed_by_acknowledged_ones_is_never_cut(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s")
        log.append_many("s", [Entry(b"y" * 300) for _ in range(100)])
    (seg,) = seg_files(tmp_path)
    size = seg.stat().st_size
    (part_dir(tmp_path) / "00000000000000000000.idx").unlink()  # recovery scans from byte 0
    flip(seg, size // 2)
    with open_log(tmp_path) as log, pytest.raises(CorruptSegment) as e:
        log.read("s", 0)  # damage is found as the partition opens, on first use
    assert e.value.path == str(seg) and e.value.offset <= size // 2
    assert seg.stat().st_size == size


def test_a_segment_shorter_than_its_fsynced_bytes_is_corrupt(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s")
        log.append_many("s", [Entry(b"y" * 300) for _ in range(10)])
    (seg,) = seg_files(tmp_path)
    seg.write_bytes(seg.read_bytes()[:-300])
    with open_log(tmp_path) as log, pytest.raises(CorruptSegment) as e:
        log.read("s", 0)  # damage is found as the partition opens, on first use
    assert e.value.path == str(seg)


def test_power_loss_tail_after_the_fsynced_bytes_is_cut_even_if_valid_records_follow(tmp_path):
    """Unsynced writes can reach the disk out of order: a hole then whole records, past the
    watermark, is a torn tail (nothing in it was acknowledged)."""
    with open_log(tmp_path) as log:
        log.create_stream("s")
        log.append_many("s", [Entry(b"a" * 100) for _ in range(10)])
    (seg,) = seg_files(tmp_path)
    durable = seg.stat().st_size
    lost, _, _ = encode_batch([Entry(b"b" * 100) for _ in range(10)], 10, 1)
    kept, _, _ = encode_batch([Entry(b"c" * 100) for _ in range(10)], 20, 1)
    seg.write_bytes(seg.read_bytes() + bytes(len(lost)) + kept)
    with open_log(tmp_path) as log:
        assert log.next_index("s") == 10
        assert log.append("s", b"next") == 10
    assert seg.stat().st_size > durable


# -- §2 the recovery point never trusts an unsynced index entry -----------------------------


def test_recovery_point_ignores_index_entries_past_the_fsynced_bytes(tmp_path):
    """After a power loss the never-fsynced ``.idx`` can name a record that follows a hole:
    starting the scan there would adopt records past lost ones (indexes 10..19 unreadable,
    20.. served)."""
    import struct

    with open_log(tmp_path) as log:
        log.create_stream("s")
        log.append_many("s", [Entry(b"a" * 100) for _ in range(10)])
    (seg,) = seg_files(tmp_path)
    durable = seg.stat().st_size
    lost, _, _ = encode_batch([Entry(b"b" * 1000) for _ in range(10)], 10, 1)
    kept, _, _ = encode_batch([Entry(b"c" * 1000) for _ in range(10)], 20, 1)
    seg.write_bytes(seg.read_bytes() + bytes(len(lost)) + kept)
    idx = seg.with_suffix(".idx")
    idx.write_bytes(struct.pack("<QQ", 0, 0) + struct.pack("<QQ", 20, durable + len(lost)))
    with open_log(tmp_path) as log:
        assert log.next_index("s") == 10
        assert len(log.read("s", 0)) == 10
    assert seg.stat().st_size == durable


def hold_fdatasync(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make the next fdatasyncs wait mid-flight: ``in_sync`` is set when one starts, and it
    finishes once ``release`` is set (the window where a record is written, not yet durable)."""
    in_sync, release = threading.Event(), threading.Event()
    real = fs.fdatasync

    def held(fd):
        in_sync.set()
        assert release.wait(10)
        real(fd)

    monkeypatch.setattr(fs, "fdatasync", held)
    return in_sync, release


# -- §8 readers in other processes see only the durable prefix ------------------------------


def test_readonly_reader_sees_only_what_an_fsync_covered(tmp_path, monkeypatch):
    writer = SegmentLog(tmp_path)
    writer.create_stream("s")
    writer.append("s", b"durable")
    in_sync, release = hold_fdatasync(monkeypatch)
    t = threading.Thread(target=writer.append, args=("s", b"pending"))
    t.start()
    try:
        assert in_sync.wait(10)
        with open_log(tmp_path, readonly=True) as reader:
            assert [r.data for r in reader.read("s", 0)] == [b"durable"]
            assert reader.next_index("s") == 1
            assert reader.stream_info("s").partitions[0].next_index == 1
    finally:
        release.set()
        t.join(10)
    monkeypatch.undo()  # fdatasync as it was
    with open_log(tmp_path, readonly=True) as reader:
        assert [r.data for r in reader.read("s", 0)] == [b"durable", b"pending"]
    writer.close()


def test_readonly_reader_of_a_none_stream_sees_whole_records_as_they_land(tmp_path):
    with open_log(tmp_path) as writer:
        writer.create_stream("s", StreamConfig(durability="none"))
        writer.append("s", b"a")
        with open_log(tmp_path, readonly=True) as reader:
            assert reader.next_index("s") == 1


def test_the_watermark_survives_a_torn_slot(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s")
        for i in range(5):
            log.append("s", b"%d" % i)
    mark = part_dir(tmp_path) / DURABLE
    raw = bytearray(mark.read_bytes())
    newest = max((0, 512), key=lambda off: int.from_bytes(raw[off + 4 : off + 12], "little"))
    raw[newest + 20] ^= 0xFF
    mark.write_bytes(bytes(raw))
    with open_log(tmp_path) as log:
        assert log.next_index("s") == 5


# -- §4 every fsync failure fails the partition the same way --------------------------------


def _eio(fd):
    raise OSError(5, "Input/output error")


def test_a_failed_fsync_in_flush_is_storage_failed_and_fails_the_partition(tmp_path, monkeypatch):
    log = open_log(tmp_path, clock=ManualClock())
    log.create_stream("s", StreamConfig(durability="none"))
    log.append("s", b"a")
    monkeypatch.setattr(fs, "fdatasync", _eio)
    with pytest.raises(StorageFailed):
        log.flush()
    monkeypatch.undo()
    with pytest.raises(StorageFailed):  # never retried and assumed good
        log.append("s", b"b")
    log.close()


def test_a_failed_fsync_in_close_is_storage_failed(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    log.create_stream("s", StreamConfig(durability="none"))
    log.append("s", b"a")
    monkeypatch.setattr(fs, "fdatasync", _eio)
    with pytest.raises(StorageFailed):
        log.close()
    monkeypatch.undo()
    with open_log(tmp_path) as log:  # the lock was released; recovery takes over
        assert log.next_index("s") <= 1


def test_a_failed_folder_fsync_when_rolling_fails_the_partition(tmp_path, monkeypatch):
    """The new segment's name is durable only once its folder is fsynced: a failure there is
    a failed fsync like any other, never retried and assumed good."""
    log = open_log(tmp_path, clock=ManualClock())
    log.create_stream("s", StreamConfig(segment_bytes=600))
    log.append("s", b"a" * 100)
    real = fs.fsync_dir
    monkeypatch.setattr(fs, "fsync_dir", lambda path: _eio(path))
    with pytest.raises(StorageFailed):
        for _ in range(20):  # until a roll
            log.append("s", b"b" * 100)
    monkeypatch.setattr(fs, "fsync_dir", real)
    with pytest.raises(StorageFailed):
        log.append("s", b"c")
    log.close()


# -- §5 close racing an append -------------------------------------------------------------


def test_an_append_after_close_on_a_held_partition_is_log_closed(tmp_path):
    log = open_log(tmp_path)
    log.create_stream("s")
    part = log._partition("s", 0)  # what an appender holds between lookup and write
    log.close()
    with pytest.raises(LogClosed):
        part.append_many([Entry(b"x")], "batch")
    with pytest.raises(LogClosed):
        part.read(0, None, None)


def test_appenders_racing_close_get_log_closed_only(tmp_path):
    log = open_log(tmp_path)
    log.create_stream("s", StreamConfig(partitions=2))
    errors: list[BaseException] = []
    started = threading.Barrier(5)

    def appender(p: int) -> None:
        started.wait()
        try:
            while True:
                log.append_many("s", [Entry(b"r" * 50)] * 5, partition=p % 2)
        except LogClosed:
            return
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=appender, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    started.wait()
    log.close()
    for t in ts:
        t.join(10)
    assert errors == []


# -- §6 the consumer-index store checks every write ------------------------------------------


def test_short_writes_never_rename_a_truncated_consumer_store(tmp_path, monkeypatch):
    with open_log(tmp_path) as log:
        log.create_stream("s")
        for i in range(20):
            log.save_index(f"client-{i}", "s", 100 + i)
    real = os.write

    def short(fd, data):  # a regular file may take fewer bytes than asked (e.g. a signal)
        return real(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", short)
    monkeypatch.setattr(fs, "write", short)
    with open_log(tmp_path) as log:  # compacts the store on open
        log.save_index("late", "s", 5)
    monkeypatch.undo()
    with open_log(tmp_path) as log:
        assert [log.get_index(f"client-{i}", "s") for i in range(20)] == [
            100 + i for i in range(20)
        ]
        assert log.get_index("late", "s") == 5


def test_a_failed_consumer_save_refuses_later_saves(tmp_path, monkeypatch):
    clock = ManualClock()
    log = open_log(tmp_path, clock=clock)
    log.create_stream("s")
    log.save_index("c", "s", 1)
    monkeypatch.setattr(fs, "fdatasync", _eio)
    with pytest.raises(StorageFailed):
        log.save_index("c", "s", 2)
    monkeypatch.undo()
    with pytest.raises(StorageFailed, match="retried in"):
        log.save_index("c", "s", 3)
    assert log.get_index("c", "s") == 1
    clock.advance(1.0)  # then the store reopens from disk (tests/log/test_reopen.py)
    assert log.save_index("c", "s", 3) == 3
    log.close()


# -- §7 folder fsyncs, and a segment a crash brought back ----------------------------------


@pytest.fixture
def synced_dirs(monkeypatch) -> list[Path]:
    seen: list[Path] = []
    real = fs.fsync_dir

    def spy(path):
        seen.append(Path(path))
        real(path)

    monkeypatch.setattr(fs, "fsync_dir", spy)
    return seen


def test_creating_the_data_dir_fsyncs_every_new_folder_and_its_parent(tmp_path, synced_dirs):
    data = tmp_path / "a" / "b"
    with open_log(data):
        pass
    assert {tmp_path, tmp_path / "a", data, data / "streams"} <= set(synced_dirs)


def test_the_first_seal_fsyncs_the_lake_folders_it_creates(tmp_path, synced_dirs):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=500))
        for _ in range(10):
            log.append("s", b"x" * 100)
        log.wait_for_seals()
    lake = tmp_path / "lake"
    assert {tmp_path, lake, lake / "s", lake / "s" / "partition=0"} <= set(synced_dirs)


def test_retention_fsyncs_the_folder_after_deleting_segments(tmp_path, synced_dirs):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=500, retention_records=1))
        for _ in range(20):
            log.append("s", b"x" * 100)
        synced_dirs.clear()
        assert log.enforce_retention() == 0  # the lake still holds them
        assert part_dir(tmp_path) in synced_dirs


def test_a_segment_resurrected_after_retention_is_not_read_as_reaching_the_next_file(tmp_path):
    """Retention deleted segments 0 and 1, the folder was not fsynced, a crash brought back
    segment 0 only: it must not be taken to end where segment 2 starts (records in between
    were skipped from the read, though the lake holds them)."""
    cfg = StreamConfig(segment_bytes=500, retention_records=1)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        for i in range(30):
            log.append("s", b"%04d" % i + b"x" * 100)
        log.wait_for_seals()
        first = seg_files(tmp_path)[0]
        saved = first.read_bytes(), first.with_suffix(".idx").read_bytes()
        log.enforce_retention()
    assert not first.exists()
    first.write_bytes(saved[0])
    first.with_suffix(".idx").write_bytes(saved[1])
    with open_log(tmp_path, readonly=True) as reader:
        assert [r.index for r in reader.read("s", 0)] == list(range(30))
    with open_log(tmp_path) as log:
        assert [r.index for r in log.read("s", 0)] == list(range(30))
        assert [r.data[:4] for r in log.read("s", 0)] == [b"%04d" % i for i in range(30)]
    assert not first.exists()


@pytest.mark.parametrize("seal_to_lake", [False, True])
def test_a_sealed_segment_cut_at_a_record_boundary_is_damage_not_a_leftover(tmp_path, seal_to_lake):
    """Found from outside: a sealed segment that lost its last record at a frame boundary ends
    before its successor starts, as a leftover of an interrupted retention delete does; it was
    taken for one: readers and ``loglake log verify`` dropped it and every older segment
    silently (exit 0, first_index 150 of 0), and the writer deleted them. Retention now records
    what it deletes before the unlinks (``RETAINED``), so only a segment below that is a
    leftover; this one is damage, reported naming the file (or served from a verified lake
    copy) and never deleted."""
    from click.testing import CliRunner

    from loglake.log.cli import command

    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=4096, seal_to_lake=seal_to_lake))
        for b in range(0, 300, 10):
            log.append_many("s", [Entry(b"r%03d" % i + b"." * 40) for i in range(b, b + 10)])
    segs = seg_files(tmp_path)
    victim = segs[2]
    assert victim.name == "00000000000000000100.seg"
    raw = victim.read_bytes()
    victim.write_bytes(raw[: len(raw) - len(raw) // 50])  # record 149 gone, cut at its frame
    data = [b"r%03d" % i + b"." * 40 for i in range(300)]
    with open_log(tmp_path, readonly=True) as reader:
        assert reader.stream_info("s").partitions[0].first_index == 0
        if seal_to_lake:  # the lake copy verifies: served from it
            assert [r.data for r in reader.read("s", 0)] == data
        else:
            with pytest.raises(CorruptSegment) as e:
                reader.read("s", 140)
            assert e.value.path == str(victim)
            assert [r.data for r in reader.read("s", 0, limit=149)] == data[:149]
        with pytest.raises(CorruptSegment) as e:
            reader.verify()
        assert e.value.path == str(victim)
    res = CliRunner().invoke(command, ["verify", "--data-dir", str(tmp_path)])
    assert res.exit_code == 1 and str(victim.name) in res.output
    with open_log(tmp_path) as log:
        assert log.stream_info("s").partitions[0].first_index == 0
        assert [r.data for r in log.read("s", 0, limit=100)] == data[:100]
    assert seg_files(tmp_path) == segs  # nothing deleted


# -- §3 a failing seal is retried and reported; retention resumes without a restart --------


def test_a_failed_seal_is_retried_reported_and_retention_resumes(tmp_path, monkeypatch):
    import time

    import loglake.log.retention as retention_mod
    from loglake.log.cli import command
    from loglake.log.sealer import Sealer

    monkeypatch.setattr(Sealer, "retry_first_s", 0.05)
    real = retention_mod.seal_segment
    failures = {"left": 3}

    def flaky(*args, **kwargs):
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(retention_mod, "seal_segment", flaky)
    log = open_log(tmp_path)
    log.create_stream("s", StreamConfig(segment_bytes=500, retention_records=1))
    for _ in range(6):
        log.append("s", b"x" * 200)
    log.wait_for_seals()
    (h,) = log.health()
    assert h.seal_failure is not None and "No space left" in h.seal_failure.error
    assert not h.ok
    # another process's `loglake log info` sees it too
    from click.testing import CliRunner

    res = CliRunner().invoke(command, ["info", "--data-dir", str(tmp_path), "--json"])
    (row,) = json.loads(res.output)
    assert "No space left" in row["seal_failure"]["error"]
    deadline = time.monotonic() + 20
    while (log.health()[0].seal_failure is not None or failures["left"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    time.sleep(0.3)
    log.wait_for_seals()
    assert log.health()[0].ok
    before = len(seg_files(tmp_path))
    log.enforce_retention()
    assert len(seg_files(tmp_path)) == 1 < before  # not blocked until a restart
    assert [r.index for r in log.read("s", 0)] == list(range(6))
    log.close()
    res = CliRunner().invoke(command, ["info", "--data-dir", str(tmp_path), "--json"])
    assert json.loads(res.output)[0]["seal_failure"] is None


# -- §10 retention per partition; what durability each stream uses ------------------------


def test_one_failing_partition_does_not_stop_retention_of_the_others(tmp_path, monkeypatch):
    from loglake.log import RetentionFailed
    from loglake.log.partition import Partition

    cfg = StreamConfig(partitions=3, segment_bytes=500, retention_records=1, seal_to_lake=False)
    log = open_log(tmp_path)
    log.create_stream("s", cfg)
    for p in range(3):
        for _ in range(10):
            log.append("s", b"x" * 200, partition=p)
    real = Partition.enforce_retention

    def broken_first(self, now_ns):
        if self.partition == 0:
            raise OSError(5, "Input/output error")
        return real(self, now_ns)

    monkeypatch.setattr(Partition, "enforce_retention", broken_first)
    with pytest.raises(RetentionFailed) as e:
        log.enforce_retention()
    assert [(s, p) for s, p, _ in e.value.errors] == [("s", 0)]
    assert e.value.dropped > 0
    assert len(seg_files(tmp_path, p=1)) == len(seg_files(tmp_path, p=2)) == 1
    health = {h.partition: h for h in log.health()}
    assert "Input/output error" in health[0].retention_error and health[1].ok
    log.close()


def test_serve_banner_says_which_durability_each_stream_uses(tmp_path):
    from loglake.node.cli import durability_banner

    with open_log(tmp_path) as log:
        log.create_stream("a", StreamConfig(durability="always"))
        log.create_stream("b", StreamConfig(durability="batch"))
        text = durability_banner(log, "none")
    assert text.startswith("durability none for new streams")
    assert "always: a" in text and "batch: b" in text


# -- §9 reads do not block appends -----------------------------------------------------------


@pytest.mark.parametrize("durability", ["batch", "none"])
def test_a_slow_segment_read_does_not_hold_up_appends(tmp_path, monkeypatch, durability):
    log = open_log(tmp_path)
    log.create_stream(
        "s", StreamConfig(segment_bytes=2000, seal_to_lake=False, durability=durability)
    )
    for i in range(100):
        log.append("s", b"%04d" % i + b"x" * 200)
    reading, release = threading.Event(), threading.Event()
    real = os.pread
    got: list = []

    def slow(fd, n, at):
        if threading.current_thread().name == "cold-reader":
            reading.set()
            assert release.wait(10)
        return real(fd, n, at)

    monkeypatch.setattr(os, "pread", slow)
    monkeypatch.setattr(fs, "pread", slow)
    t = threading.Thread(
        target=lambda: got.extend(log.read("s", 0)), name="cold-reader", daemon=True
    )
    t.start()
    try:
        assert reading.wait(10)
        done = threading.Event()
        a = threading.Thread(target=lambda: (log.append("s", b"hot"), done.set()), daemon=True)
        a.start()
        assert done.wait(5), "an append waited for a read"
    finally:
        release.set()
        t.join(10)
    assert [r.index for r in got] == list(range(100))
    assert log.read("s", 100)[0].data == b"hot"
    log.close()


def test_retention_deleting_a_segment_under_a_lock_free_read(tmp_path, monkeypatch):
    cfg = StreamConfig(segment_bytes=2000, retention_records=1, seal_to_lake=False)
    log = open_log(tmp_path)
    log.create_stream("s", cfg)
    for i in range(100):
        log.append("s", b"%04d" % i + b"x" * 200)
    reading, release = threading.Event(), threading.Event()
    real = fs.pread
    got: list = []

    def slow(fd, n, at):
        if threading.current_thread().name == "cold-reader" and not reading.is_set():
            reading.set()
            assert release.wait(10)
        return real(fd, n, at)

    monkeypatch.setattr(fs, "pread", slow)
    t = threading.Thread(target=lambda: got.extend(log.read("s", 0, limit=5)), name="cold-reader")
    t.start()
    assert reading.wait(10)
    assert log.enforce_retention() > 0  # deletes the segment being read
    release.set()
    t.join(10)
    assert [r.data[:4] for r in got] == [b"%04d" % i for i in range(5)]
    log.close()


def test_a_read_whose_segment_index_is_not_loaded_survives_retention_deleting_it(tmp_path):
    """The segment is pinned (fd open) but its ``.idx`` was never read; retention deletes
    both files before the read loads the index: the index is rebuilt from the open fd."""
    from loglake.log import reads

    cfg = StreamConfig(segment_bytes=2000, retention_records=1, seal_to_lake=False)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        for i in range(100):
            log.append("s", b"%04d" % i + b"x" * 200)
    log = open_log(tmp_path)  # fresh: no sealed segment's index is loaded yet
    part = log._partition("s", 0)
    with part._lock:
        view = reads.pin_view(part, 0, 5)
    assert log.enforce_retention() > 0
    try:
        got = reads.read_segments(part, view, 0, 5, 5)
    finally:
        with part._lock:
            for seg, _ in view:
                seg.unpin()
    assert [r.data[:4] for r in got] == [b"%04d" % i for i in range(5)]
    assert not list(part_dir(tmp_path).glob("00000000000000000000.*"))
    log.close()


def test_stream_info_says_how_far_the_disk_holds(tmp_path, monkeypatch):
    """For the stream service's info (and the Spark source over the wire): the writer's
    ``next_index`` includes a record whose fsync is still running; ``durable_next`` does not."""
    log = open_log(tmp_path)
    log.create_stream("s")
    log.append("s", b"a")
    in_sync, release = hold_fdatasync(monkeypatch)
    t = threading.Thread(target=log.append, args=("s", b"b"))
    t.start()
    try:
        assert in_sync.wait(10)
        (p,) = log.stream_info("s").partitions
        assert (p.next_index, p.durable_next) == (2, 1)
    finally:
        release.set()
        t.join(10)
    (p,) = log.stream_info("s").partitions
    assert (p.next_index, p.durable_next) == (2, 2)
    log.close()


def test_an_open_that_fails_releases_the_lock_even_when_a_partition_close_fails(
    tmp_path, monkeypatch
):
    """A writer's open that fails after recovering partitions cleans up every step: a
    partition whose close raises (a failed fsync) must not leave the LOCK held, or every later
    open in this process would be refused as LogLocked."""
    from loglake.log import segment_log
    from loglake.log.api import StorageFailed
    from loglake.log.partition import Partition

    with open_log(tmp_path) as log:
        log.create_stream("a", StreamConfig(partitions=2))
        log.append("a", b"x")
    real_load = segment_log.SegmentLog._load_streams

    def load_then_fail(self):
        real_load(self)
        raise RuntimeError("boom after the partitions opened")

    def close_fails(self):
        raise StorageFailed("fsync failed (injected)")

    monkeypatch.setattr(segment_log.SegmentLog, "_load_streams", load_then_fail)
    monkeypatch.setattr(Partition, "close", close_fails)
    with pytest.raises(RuntimeError, match="boom"):
        open_log(tmp_path)
    monkeypatch.undo()
    with open_log(tmp_path) as log:  # not LogLocked
        assert log.read_payloads("a", 0, 10)[0][1] == b"x"
