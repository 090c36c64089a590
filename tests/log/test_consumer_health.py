"""The consumer index store's failure in ``Log.health()`` (issue 15 §3): it was only in the log
events, so a metrics endpoint or ``health()`` caller saw a healthy log while every index save
was refused. The clock is the test's (no sleeps); the fault is the simulated disk's failed
fsync (its pages dropped, as Linux does)."""

from __future__ import annotations

import pytest

from loglake.log import StorageFailed, open_log
from loglake.log.consumer_store import FILE_NAME
from loglake.log.reopen import REOPEN_FIRST_S
from tests.log.clock import ManualClock
from tests.log.simdisk import SimDisk


def _store_entry(log):
    return [h for h in log.health() if h.stream == FILE_NAME]


def test_a_failed_consumer_store_shows_in_health_until_it_reopens(tmp_path):
    with SimDisk(tmp_path) as disk:
        clock = ManualClock()
        log = open_log(disk.root / "data", clock=clock)
        log.create_stream("s")
        assert log.save_index("a", "s", 5) == 5
        assert _store_entry(log) == []  # never failed: the partitions only, as before
        disk.fail_fsync_after(1)
        with pytest.raises(StorageFailed):
            log.save_index("a", "s", 7)
        (h,) = _store_entry(log)
        assert not h.ok and h.partition == 0 and "consumers.log" in (h.storage_failed or "")
        assert h.storage_failure is not None and h.storage_failure.reopen_attempts == 0
        assert h.reopens == 0
        clock.advance(REOPEN_FIRST_S)
        disk.fail_fsync_after(1)  # the first reopen fails too
        with pytest.raises(StorageFailed, match="reopening the store failed"):
            log.save_index("b", "s", 1)
        (h,) = _store_entry(log)
        assert not h.ok and h.storage_failure is not None
        assert h.storage_failure.reopen_attempts == 1 and h.storage_failure.reopen_error
        clock.advance(REOPEN_FIRST_S * 2)
        assert log.save_index("b", "s", 2) == 2
        (h,) = _store_entry(log)
        assert h.ok and h.storage_failure is None and h.reopens == 1
        assert all(p.ok for p in log.health())
        log.close()
