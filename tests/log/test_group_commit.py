"""The written/durable split of the append path (issue 16): writing goes on while the disk
syncs, and nothing is acknowledged before the fsync that covers it.

- a large ``batch`` append is written in chunks, an fsync of each started while the next is
  encoded (``GroupCommit.kick``); it returns only once all of it is durable;
- ``append_payloads_then`` returns the indexes once written and calls ``done`` after the fsync
  (``done(error)`` when it failed);
- what a power loss keeps (the simulated disk, only fsynced bytes) holds every acknowledged
  record.
"""

from __future__ import annotations

import random
import threading

import pytest

from loglake.log import SegmentLog, StorageFailed, StreamConfig, fs, open_log
from loglake.log.partition import CHUNK_BYTES
from loglake.log.reopen import REOPEN_FIRST_S
from tests.log.clock import ManualClock
from tests.log.simdisk import SimDisk
from tests.waiting import wait_until

BIG = 4 * CHUNK_BYTES // 1024 + 7
"""Records of 1 KB in a batch that is written in about four chunks."""


def _datas(n: int, tag: bytes = b"r") -> list[bytes]:
    return [tag + b"%06d|" % i + bytes(1017) for i in range(n)]


def test_a_large_batch_is_acknowledged_only_when_all_of_it_is_durable(tmp_path):
    """After it returns, a power loss that keeps only fsynced bytes keeps every record."""
    datas = _datas(BIG)
    with SimDisk(tmp_path) as disk:
        log = open_log(disk.root / "data")
        log.create_stream("s", StreamConfig(durability="batch"))
        assert log.append_payloads("s", datas) == list(range(BIG))
        disk.restart(random.Random(0), file_mode="none", entries="none")
        with open_log(disk.root / "data") as log:
            assert [d for _, d in log.read_payloads("s", 0, BIG + 1)] == datas


def test_a_large_batch_is_fsynced_on_another_thread_while_its_next_chunk_is_written(
    tmp_path, monkeypatch
):
    """The written/durable split: the second chunk's write waits here until an fsync has
    started on another thread, which can only be the helper started after the first chunk
    (before, the batch was one write and its only fsync ran after it, on this thread)."""
    log = SegmentLog(tmp_path)
    log.create_stream("s")
    helper_synced = threading.Event()
    chunk_writes = 0
    real_write, real_sync = fs.write, fs.fdatasync
    me = threading.current_thread()

    def write(fd: int, data) -> int:
        nonlocal chunk_writes
        if len(data) > CHUNK_BYTES // 2:  # a chunk of the segment, not an index entry
            chunk_writes += 1
            if chunk_writes == 2:
                assert helper_synced.wait(10), "no fsync started while the batch was written"
        return real_write(fd, data)

    def fdatasync(fd: int) -> None:
        if threading.current_thread() is not me:
            helper_synced.set()
        real_sync(fd)

    monkeypatch.setattr(fs, "write", write)
    monkeypatch.setattr(fs, "fdatasync", fdatasync)
    datas = _datas(BIG)
    assert log.append_payloads("s", datas) == list(range(BIG))
    assert chunk_writes >= 3 and helper_synced.is_set()
    monkeypatch.undo()
    assert [d for _, d in log.read_payloads("s", 0, BIG + 1)] == datas
    log.close()


def test_a_chunked_batch_may_roll_to_a_new_segment_and_keeps_its_indexes(tmp_path):
    datas = _datas(BIG)
    with SimDisk(tmp_path) as disk:
        log = open_log(disk.root / "data")
        log.create_stream(
            "s",
            StreamConfig(durability="batch", segment_bytes=CHUNK_BYTES + 100, seal_to_lake=False),
        )
        log.append_payloads("s", [b"first"])
        assert log.append_payloads("s", datas) == list(range(1, BIG + 1))
        disk.restart(random.Random(0), file_mode="none", entries="none")
        with open_log(disk.root / "data") as log:
            assert len(list((disk.root / "data" / "streams" / "s" / "0").glob("*.seg"))) >= 3
            got = [d for _, d in log.read_payloads("s", 0, BIG + 10)]
            assert got == [b"first", *datas]


def test_append_payloads_then_calls_done_only_after_the_fsync(tmp_path, monkeypatch):
    log = SegmentLog(tmp_path)
    log.create_stream("s")
    log.append_payloads("s", [b"durable"])
    started, release = threading.Event(), threading.Event()
    real = fs.fdatasync

    def held(fd: int) -> None:
        started.set()
        assert release.wait(10)
        real(fd)

    monkeypatch.setattr(fs, "fdatasync", held)
    done = threading.Event()
    outcome: list[BaseException | None] = []

    def on_durable(error: BaseException | None) -> None:
        outcome.append(error)
        done.set()

    try:
        assert log.append_payloads_then("s", [b"a", b"b"], on_durable) == [1, 2]
        assert started.wait(10)  # the fsync runs on the group commit's helper thread
        assert not done.is_set()
        # readers in this process see only the durable prefix meanwhile
        assert [d for _, d in log.read_payloads("s", 0, 10)] == [b"durable"]
        # and the writer goes on writing while it syncs
        assert log.append_payloads_then("s", [b"c"], on_durable) == [3]
    finally:
        release.set()
    assert done.wait(10)
    monkeypatch.undo()
    log.flush()
    assert outcome[0] is None
    assert [d for _, d in log.read_payloads("s", 0, 10)] == [b"durable", b"a", b"b", b"c"]
    log.close()


def test_append_payloads_then_reports_a_failed_fsync_and_the_partition_fails(tmp_path):
    with SimDisk(tmp_path) as disk:
        clock = ManualClock()
        log = open_log(disk.root / "data", clock=clock)
        log.create_stream("s")
        log.next_index("s")  # opens the partition (its folder fsyncs) before the fault
        disk.fail_fsync_after(1)
        done = threading.Event()
        outcome: list[BaseException | None] = []

        def on_durable(error: BaseException | None) -> None:
            outcome.append(error)
            done.set()

        log.append_payloads_then("s", [b"lost"], on_durable)
        assert done.wait(10)
        assert isinstance(outcome[0], StorageFailed)
        with pytest.raises(StorageFailed):
            log.append_payloads("s", [b"next"])
        after: list[BaseException | None] = []
        with pytest.raises(StorageFailed):
            log.append_payloads_then("s", [b"later"], after.append)
        assert after == []  # refused before anything was written: raised, done not called
        clock.advance(REOPEN_FIRST_S)  # the partition reopens from disk
        durable = threading.Event()
        log.append_payloads_then("s", [b"later"], lambda e: (after.append(e), durable.set()))
        assert durable.wait(10) and after == [None]
        log.close()


def test_close_acknowledges_what_append_payloads_then_wrote(tmp_path, monkeypatch):
    """A write whose fsync had not run yet when the log closed is covered by close's fsync."""
    log = SegmentLog(tmp_path)
    log.create_stream("s")
    log.next_index("s")  # opens the partition (its own fsyncs) before counting
    outcome: list[BaseException | None] = []
    started, release = threading.Event(), threading.Event()
    real = fs.fdatasync
    calls = 0

    def held(fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # the helper's fsync waits; close's own fsync runs after it
            started.set()
            assert release.wait(10)
        real(fd)

    monkeypatch.setattr(fs, "fdatasync", held)
    log.append_payloads_then("s", [b"x"], outcome.append)
    assert started.wait(10)
    closer = threading.Thread(target=log.close)
    closer.start()
    release.set()
    closer.join(10)
    assert outcome == [None]
    monkeypatch.undo()
    with open_log(tmp_path) as log:
        assert [d for _, d in log.read_payloads("s", 0, 10)] == [b"x"]


def test_a_failed_watermark_write_fails_the_partition(tmp_path, monkeypatch):
    """A short write of the ``DURABLE`` slot after a group-commit fsync is ``StorageFailed``
    for the append and every later one (the same path as a failed fsync), and the written
    records stay readable after a reopen."""
    log = SegmentLog(tmp_path, clock=ManualClock())
    log.create_stream("s")
    log.append_payloads("s", [b"before"])
    real = fs.pwrite

    def short(fd: int, data, offset: int) -> int:
        return real(fd, bytes(data)[:10], offset)

    monkeypatch.setattr(fs, "pwrite", short)
    with pytest.raises(StorageFailed, match="watermark"):
        log.append_payloads("s", [b"x"])
    monkeypatch.undo()
    with pytest.raises(StorageFailed):
        log.append_payloads("s", [b"y"])
    outcome: list[BaseException | None] = []
    with pytest.raises(StorageFailed):
        log.append_payloads_then("s", [b"z"], outcome.append)
    log.close()
    with open_log(tmp_path) as log:
        assert [d for _, d in log.read_payloads("s", 0, 10)][:1] == [b"before"]


def test_an_idle_helper_is_woken_by_new_work_only_not_by_every_fsync(monkeypatch):
    """After a burst the helper thread idles for a while; a lone appender's fsyncs (inline,
    ``wait_durable``) must not wake it — each wake took the GIL from the appender — while a
    write handed to it (``when_durable``) still does, and is made durable."""
    from loglake.log import group_commit
    from loglake.log.group_commit import GroupCommit

    monkeypatch.setattr(group_commit, "HELPER_IDLE_S", 30.0)  # idle throughout, even if slow
    gc = GroupCommit()
    written = [0]
    synced: list[int] = []

    def sync() -> int:
        synced.append(written[0])
        return written[0]

    class CountingIdle:
        def __init__(self, cond: threading.Condition) -> None:
            self.cond, self.woken = cond, 0

        def wait(self, timeout: float | None = None) -> bool:
            got = self.cond.wait(timeout)
            self.woken += got
            return got

        def notify(self) -> None:
            self.cond.notify()

    idle = CountingIdle(gc._idle)
    gc._idle = idle  # type: ignore[assignment]
    done = threading.Event()
    written[0] = 1
    gc.when_durable(1, sync, lambda e: done.set())  # the helper starts and syncs it
    assert done.wait(10)
    wait_until(lambda: gc._helper_idle, what="the helper to go idle")
    for seq in range(2, 40):  # a lone appender: each fsync inline, on this thread
        written[0] = seq
        gc.wait_durable(seq, sync)
    assert idle.woken == 0 and gc._helper_idle and gc._helper is not None
    done.clear()
    written[0] = 40
    gc.when_durable(40, sync, lambda e: done.set())  # new work for the helper: woken
    assert done.wait(10)
    assert idle.woken == 1 and synced[-1] == 40 and gc.synced == 40
