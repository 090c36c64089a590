"""The one "fail → back off → reopen" policy (``loglake.log.reopen``) and its three users: a
partition, the consumer index store and the sealer wait the same doubling intervals, counted
the same way, on the clock they are given (the test's: no timed asserts on the product)."""

from __future__ import annotations

import threading
import time

import pytest

from loglake.log import StorageFailed
from loglake.log.reopen import REOPEN_FIRST_S, REOPEN_MAX_S, Backoff, Reopen
from loglake.log.sealer import Sealer
from tests.log.clock import ManualClock


def test_the_back_off_doubles_from_the_first_wait_up_to_the_cap():
    b = Backoff()
    assert [b.delay(n) for n in range(5)] == [0.1, 0.2, 0.4, 0.8, 1.6]
    assert b.delay(30) == REOPEN_MAX_S
    assert Backoff(1.0, 60.0).delay(6) == 60.0


def test_a_failure_waits_the_first_interval_then_each_failed_attempt_doubles_it():
    clock = ManualClock()
    r = Reopen(clock)
    assert r.error is None and r.attempts == 0 and r.record is None
    err = StorageFailed("x: fsync failed")
    assert r.fail(err, "fsync failed (EIO)") == REOPEN_FIRST_S
    assert r.error is err and r.record is not None and r.record.error == "fsync failed (EIO)"
    assert r.wait(clock()) == pytest.approx(REOPEN_FIRST_S)
    clock.advance(REOPEN_FIRST_S)
    assert r.wait(clock()) == 0.0
    assert r.attempt_failed(clock(), OSError(5, "EIO")) == pytest.approx(2 * REOPEN_FIRST_S)
    assert r.attempts == 1 and r.record.reopen_error == "OSError: [Errno 5] EIO"
    assert r.wait(clock()) == pytest.approx(2 * REOPEN_FIRST_S)
    r.recovered()
    assert r.error is None and r.record is None and r.attempts == 0 and r.reopens == 1


def test_a_failed_seal_is_retried_after_the_back_off_on_the_sealers_clock():
    """Before, the sealer read ``time.monotonic`` itself: its back-off could not be driven by
    a test and did not share the policy of a partition or the consumer store."""
    clock = ManualClock()
    sealer = Sealer(clock=clock)
    sealer.retry_first_s = 1.0
    runs: list[float] = []
    retried = threading.Event()

    def job() -> None:
        runs.append(clock())
        if len(runs) == 1:
            raise OSError(28, "No space left on device")
        retried.set()

    try:
        sealer.submit(job)
        sealer.drain()
        assert len(runs) == 1 and sealer.pending_retries == 1
        time.sleep(1.5)  # past the back-off in real time...
        assert len(runs) == 1  # ...but the sealer's clock has not moved: no retry yet
        clock.advance(1.0)
        assert retried.wait(10)  # the sealer looks at its clock again within its poll
        assert runs == [1000.0, 1001.0]
    finally:
        sealer.stop()
