"""Background sealing: rolled segments are written to the lake off the append path.

Why: writing a 64 MB segment as Parquet takes most of a second; doing it inside the append that
rolled the segment would stall every appender of the partition for that long. A rolled segment
is immutable and already durable, so a single worker thread per log can read and seal it while
appends go on. Nothing depends on the seal for correctness: retention never deletes a segment
the lake should hold but does not yet, and a crash before the seal is repaired on open.

With ``processes``, the CPU of a seal (decoding the segment, building and writing the Parquet
table: ~0.2 s for 64 MiB) runs in a child process (``run``): in the server it would hold the
GIL a fifth of the time a client pushes at full speed, taking it from the event loop and the
core thread (pushes in a burst while a seal ran were 20-40% slower). The child only reads the
rolled segment and writes the lake file; the job's bookkeeping stays here. A child that dies
fails the job, which is retried like any other (with a new child). While a layer over the
file primitives is installed (``fs.write`` is not ``os.write``: the simulated disk, a fault
layer), a seal runs in this process, where the layer is.

A job that fails (disk full, a transient I/O error, a damaged segment) is retried with the
exponential back-off of ``reopen.py`` (``retry_first_s`` doubling up to ``retry_max_s``; the
time from ``clock``), forever: a seal that
never happens would block retention of that partition. The job itself reports the failure
(``Partition`` keeps it for ``SegmentLog.health()`` and ``loglake log info``); the sealer logs
each failure as a structured event. ``drain`` waits for queued jobs, not for scheduled retries.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from loglake.log import fs
from loglake.log.reopen import Backoff
from loglake.structured_logging import log_event

logger = logging.getLogger(__name__)

Job = Callable[[], None]
T = TypeVar("T")


def _child_init(parent: int) -> None:
    """In the sealing child: appenders keep the CPU first (as the sealer thread does), and
    the child ends when its parent is gone. Why the watch: a server killed with SIGKILL
    never shuts the pool down, and the child, waiting on its job queue (whose write end it
    holds itself), would stay forever."""
    with contextlib.suppress(AttributeError, OSError):
        os.nice(10)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="loglake-seal-parent-watch", daemon=True).start()


ORPHAN_CHECK_S = 1.0
"""How often the sealing child checks that its parent still runs."""


class Sealer:
    retry_first_s = 1.0
    retry_max_s = 60.0

    def __init__(
        self, processes: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.processes = processes
        self._clock = clock
        """Monotonic seconds, for the retries' back-off."""
        """Seal in a child process (``run``)."""
        self._pool: ProcessPoolExecutor | None = None
        self._q: queue.Queue[tuple[Job, int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._retries: list[tuple[float, int, Job, int]] = []
        self._order = itertools.count()

    @property
    def pending_retries(self) -> int:
        with self._lock:
            return len(self._retries)

    def submit(self, job: Job, attempt: int = 0) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="loglake-sealer", daemon=True
                )
                self._thread.start()
        self._q.put((job, attempt))

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` — in the sealing child with ``processes`` (``fn`` and its arguments
        and result pickled), else here. Called by a job, on the sealer thread."""
        if not self.processes or fs.write is not os.write:
            return fn(*args)
        with self._lock:
            if self._pool is None:
                # spawn, not fork: the server has threads (a forked child could inherit a lock
                # some other thread held)
                self._pool = ProcessPoolExecutor(
                    1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_child_init,
                    initargs=(os.getpid(),),
                )
            pool = self._pool
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool:
            with self._lock:  # the next job starts a new child
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    def _due(self) -> float | None:
        """Queue the retries that are due; seconds until the next one (None: none left)."""
        now = self._clock()
        with self._lock:
            while self._retries and self._retries[0][0] <= now:
                _, _, job, attempt = heapq.heappop(self._retries)
                self._q.put((job, attempt))
            return self._retries[0][0] - now if self._retries else None

    def _run(self) -> None:
        # Linux: a thread's nice value is its own; appenders keep the CPU first.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while True:
            try:
                item = self._q.get(timeout=self._due())
            except queue.Empty:
                continue
            try:
                if item is None:
                    return
                job, attempt = item
                try:
                    job()
                except Exception as e:  # keep sealing the others; this one is retried
                    # where a failure is kept for users: the job's own report (the partition's
                    # seal_failure, SEAL_FAILED, health(), `loglake log info`), not a list here
                    delay = Backoff(self.retry_first_s, self.retry_max_s).delay(attempt)
                    log_event(
                        logger,
                        logging.ERROR,
                        "sealing a segment failed",
                        error=repr(e),
                        attempt=attempt + 1,
                        retry_in_s=delay,
                    )
                    with self._lock:
                        heapq.heappush(
                            self._retries,
                            (self._clock() + delay, next(self._order), job, attempt + 1),
                        )
            finally:
                self._q.task_done()

    def drain(self) -> None:
        """Wait until every queued seal has run (retries scheduled for later are not waited
        for: a failing seal must not stall retention or close)."""
        if self._thread is not None:
            self._q.join()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._retries.clear()
        if thread is not None and thread.is_alive():
            self._q.put(None)
            thread.join()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
