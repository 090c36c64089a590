"""Group commit: appenders on several threads share one fsync, and writing goes on while the
disk syncs.

Why: an fsync costs the same for one record or a thousand, so the ``batch`` policy lets every
appender whose bytes are already written ride on the next fsync instead of issuing its own
(the technique of database WALs and of Redis ``appendfsync always``, FIELD-NOTES.md). An
appender is acknowledged only once an fsync that started after its write has finished.

Written/durable split: a write is *written* when its ``write`` returned and *durable* when an
fsync that started after it finished. Nothing waits for durability while it writes:

- ``wait_durable``: the caller waits; if nobody is syncing it runs the fsync itself (the leader),
  so a lone appender pays no thread hand-off;
- ``kick``: a writer that has more to write (the next chunk of a large batch) asks for an fsync
  of what it wrote so far on a helper thread and goes on encoding and writing: the disk works
  while the CPU does. Its final ``wait_durable`` then finds most bytes already on disk;
- ``when_durable``: a callback once a write is durable (or the fsync failed), for a writer that
  goes on to its next batch at once (a server acknowledging pushes).

Sequence numbers count writes per partition. ``sync`` is supplied by the caller: it captures
the newest written sequence number and fsyncs the file, and returns the sequence number it
covered (or raises: the partition is then failed, and every later ``sync`` raises too).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

HELPER_IDLE_S = 1.0
"""A helper thread with nothing to sync for this long ends (a new one starts when needed)."""

Sync = Callable[[], int]
Done = Callable[[BaseException | None], None]


class GroupCommit:
    def __init__(self) -> None:
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        """Appenders waiting for an fsync, and the helper waiting for one to end."""
        self._idle = threading.Condition(lock)
        """The helper with nothing to do, waiting for work (``_start_helper``). Apart from
        ``_cond`` so that an fsync's end does not wake it: a lone appender's every fsync did,
        for a second after a burst, and the helper then took the GIL from the appender."""
        self._synced = 0
        self._syncing = False
        self._want = 0
        """Newest write a helper-thread fsync was asked to cover (``kick``/``when_durable``)."""
        self._sync: Sync | None = None
        self._helper: threading.Thread | None = None
        self._callbacks: list[tuple[int, Done]] = []
        self._waiters = 0
        """Threads in ``_cond.wait()``: ``notify_all`` (Python code that checks the lock's
        owner) is skipped when there are none, as for a lone appender."""
        self._helper_idle = False
        self._error: BaseException | None = None
        """The failure of the last fsync, for callbacks registered after it."""
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
                self._notify()
            due = self._take_due()
        _call(due, None)

    def wait_durable(self, seq: int, sync: Sync) -> None:
        """Return once write ``seq`` is covered by a finished fsync; run it if nobody is."""
        with self._cond:
            while self._synced < seq:
                if self._syncing:
                    self._wait()
                    continue
                self._lead(sync)

    def kick(self, seq: int, sync: Sync) -> None:
        """Have an fsync covering write ``seq`` run on a helper thread soon; do not wait."""
        with self._cond:
            if self._synced >= seq or self._error is not None:
                return
            self._want = max(self._want, seq)
            self._sync = sync
            self._start_helper()

    def when_durable(self, seq: int, sync: Sync, done: Done) -> None:
        """Call ``done(None)`` once write ``seq`` is durable, or ``done(error)`` if the fsync
        that should cover it failed; from this thread if it already is, else from the thread
        whose fsync covered it."""
        with self._cond:
            if self._synced < seq and self._error is None:
                self._callbacks.append((seq, done))
                self._want = max(self._want, seq)
                self._sync = sync
                self._start_helper()
                return
            error = None if self._synced >= seq else self._error
        done(error)

    def fail_pending(self, error: BaseException) -> None:
        """The partition failed or closed without covering them: fail the waiting callbacks."""
        with self._cond:
            self._error = self._error or error
            due = [d for _, d in self._callbacks]
            self._callbacks = []
        _call(due, error)

    # -- inside ---------------------------------------------------------------------------------
    def _start_helper(self) -> None:
        """Caller holds ``_cond``: wake the helper thread, or start one."""
        if self._helper is None:
            self._helper = threading.Thread(target=self._help, name="loglake-sync", daemon=True)
            self._helper.start()
        elif self._helper_idle:
            self._idle.notify()

    def _help(self) -> None:
        """The helper thread: fsync until every write asked for is covered; then wait for
        more (a thread start per batch would cost more than the wait) and end after
        ``HELPER_IDLE_S`` without work, or at the first failed fsync."""
        with self._cond:
            try:
                while self._error is None:
                    if self._synced >= self._want:
                        self._helper_idle = True
                        try:
                            woken = self._idle.wait(HELPER_IDLE_S)
                        finally:
                            self._helper_idle = False
                        if not woken and self._synced >= self._want:
                            break
                        continue
                    if self._syncing:
                        self._wait()
                        continue
                    assert self._sync is not None
                    try:
                        self._lead(self._sync)
                    except BaseException:  # recorded in _error and given to the callbacks
                        break
            finally:
                self._helper = None

    def _wait(self, timeout: float | None = None) -> bool:
        """``_cond.wait``, counted in ``_waiters`` (caller holds ``_cond``)."""
        self._waiters += 1
        try:
            return self._cond.wait(timeout)
        finally:
            self._waiters -= 1

    def _notify(self) -> None:
        """Wake every waiter, if any (caller holds ``_cond``)."""
        if self._waiters:
            self._cond.notify_all()

    def _lead(self, sync: Sync) -> None:
        """Run one fsync (caller holds ``_cond``; released while it runs)."""
        self._syncing = True
        self._cond.release()
        covered = -1
        error: BaseException | None = None
        try:
            covered = sync()
        except BaseException as e:
            error = e
            raise
        finally:
            self._cond.acquire()
            self._syncing = False
            if covered > self._synced:
                self._synced = covered
            self.fsyncs += 1
            if error is not None:
                self._error = error
                due = [d for _, d in self._callbacks]
                self._callbacks = []
            else:
                due = self._take_due()
            self._notify()
            if due:
                self._cond.release()
                try:
                    _call(due, error)
                finally:
                    self._cond.acquire()

    def _take_due(self) -> list[Done]:
        """Pop the callbacks the synced position covers (caller holds ``_cond``)."""
        if not self._callbacks:
            return []
        synced = self._synced
        due = [d for s, d in self._callbacks if s <= synced]
        if due:
            self._callbacks = [(s, d) for s, d in self._callbacks if s > synced]
        return due


def _call(callbacks: list[Done], error: BaseException | None) -> None:
    for done in callbacks:
        done(error)
