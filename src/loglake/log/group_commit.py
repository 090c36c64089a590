"""Group commit: appenders on several threads share one fsync.

Why: an fsync costs the same for one record or a thousand, so the ``batch`` policy lets every
appender whose bytes are already written ride on the next fsync instead of issuing its own
(the technique of database WALs and of Redis ``appendfsync always``, FIELD-NOTES.md). An
appender is acknowledged only once an fsync that started after its write has finished.

Sequence numbers count writes per partition. ``sync`` is supplied by the caller: it captures
the newest written sequence number and a file to fsync (under the caller's write lock), fsyncs
outside that lock, and returns the sequence number it covered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class GroupCommit:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._synced = 0
        self._syncing = False
        self.fsyncs = 0
        """How many fsyncs ran (for tests and benchmarks)."""

    @property
    def synced(self) -> int:
        return self._synced

    def mark_synced(self, seq: int) -> None:
        """Everything up to ``seq`` was made durable another way (e.g. a segment roll)."""
        with self._cond:
            if seq > self._synced:
                self._synced = seq
                self._cond.notify_all()

    def wait_durable(self, seq: int, sync: Callable[[], int]) -> None:
        """Return once write ``seq`` is covered by a finished fsync; run it if nobody is."""
        with self._cond:
            while self._synced < seq:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                self._cond.release()
                covered = -1
                try:
                    covered = sync()
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    if covered > self._synced:
                        self._synced = covered
                    self.fsyncs += 1
                    self._cond.notify_all()
