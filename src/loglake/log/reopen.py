"""Fail → back off → reopen: the one policy for storage that failed and is tried again later.

Why: fsyncgate. After a failed fsync Linux may drop the pages it could not write and mark them
clean, so a later fsync of the same file reports success without writing them. Storage whose
fsync failed is therefore never fsynced again: it refuses writes until it is reopened from disk
(whose recovery writes again what the disk may not hold), and while reopening fails the attempts
back off exponentially so a failing disk is not hammered. Three things follow this rule — a log
partition (``Partition``, reopened by ``SegmentLog`` as a new object), the consumer index store
(``ConsumerStore``, reopened in place) and a seal job (``Sealer``, run again) — and they share
this module so the waits, the counting of attempts and what ``health()`` reports agree.

Sans-I/O: the caller passes the time (``now``, from its own clock, which tests drive) and does
the reopening, the logging and the raising; this object only keeps when, why and how often.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from loglake.log.api import StorageFailed, StorageFailure

REOPEN_FIRST_S = 0.1
"""Failed storage is reopened on the first write at least this long after the failure..."""
REOPEN_MAX_S = 30.0
"""...and, while reopening fails, again after twice the previous wait, up to this."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off: ``first_s`` before the first retry, doubling up to ``max_s``."""

    first_s: float = REOPEN_FIRST_S
    max_s: float = REOPEN_MAX_S

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt + 1`` (``attempt`` 0: the first)."""
        return min(self.max_s, self.first_s * 2**attempt)


class Reopen:
    """One store's failure and the schedule of its reopen attempts.

    ``error`` is None while the store is healthy; ``fail`` sets it (the first failure wins:
    later ones are consequences), ``attempt_failed`` pushes the next attempt back, and
    ``recovered`` clears it for a store that is reopened in place. ``record`` is what
    ``health()`` and the files for other processes show (``StorageFailure``)."""

    __slots__ = ("backoff", "clock", "error", "failed_at", "next_at", "record", "reopens")

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, backoff: Backoff = Backoff()
    ) -> None:
        self.clock = clock
        """Monotonic seconds (tests pass their own)."""
        self.backoff = backoff
        self.error: StorageFailed | None = None
        """The error every write gets until the store is reopened; None: healthy."""
        self.record: StorageFailure | None = None
        self.failed_at = 0.0
        """``clock()`` when the store failed."""
        self.next_at = 0.0
        """``clock()`` from which a reopen may be attempted."""
        self.reopens = 0
        """Reopens that succeeded (a store replaced by a new object carries this over)."""

    @property
    def attempts(self) -> int:
        """Failed reopen attempts since the store failed."""
        return self.record.reopen_attempts if self.record is not None else 0

    def fail(self, error: StorageFailed, reason: str) -> float:
        """The store failed (``reason``: what failed, for ``health()``); return the seconds
        until the first reopen attempt."""
        self.failed_at = self.clock()
        delay = self.backoff.delay(0)
        self.next_at = self.failed_at + delay
        self.record = StorageFailure(reason, time.time_ns())
        self.error = error
        return delay

    def wait(self, now: float) -> float:
        """Seconds until a reopen may be attempted (0: now)."""
        return max(0.0, self.next_at - now)

    def attempt_failed(self, now: float, error: BaseException) -> float:
        """A reopen attempt at ``now`` failed with ``error``: count it, and return the seconds
        until the next one (twice the last wait, at most ``backoff.max_s``)."""
        assert self.record is not None
        n = self.record.reopen_attempts + 1
        self.record = dataclasses.replace(
            self.record, reopen_attempts=n, reopen_error=f"{type(error).__name__}: {error}"
        )
        delay = self.backoff.delay(n)
        self.next_at = now + delay
        return delay

    def recovered(self) -> None:
        """The store was reopened in place and works again."""
        self.error, self.record = None, None
        self.reopens += 1
