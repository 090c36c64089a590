"""Background sealing: rolled segments are written to the lake off the append path.

Why: writing a 64 MB segment as Parquet takes most of a second; doing it inside the append that
rolled the segment would stall every appender of the partition for that long. A rolled segment
is immutable and already durable, so a single worker thread per log can read and seal it while
appends go on. Nothing depends on the seal for correctness: retention never deletes a segment
the lake should hold but does not yet, and a crash before the seal is repaired on open.

A job that fails (disk full, a transient I/O error, a damaged segment) is retried with
exponential back-off (``retry_first_s`` doubling up to ``retry_max_s``), forever: a seal that
never happens would block retention of that partition. The job itself reports the failure
(``Partition`` keeps it for ``SegmentLog.health()`` and ``loglake log info``); the sealer logs
each failure as a structured event. ``drain`` waits for queued jobs, not for scheduled retries.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from loglake.logs import log_event

logger = logging.getLogger(__name__)

Job = Callable[[], None]


class Sealer:
    retry_first_s = 1.0
    retry_max_s = 60.0

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[Job, int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._retries: list[tuple[float, int, Job, int]] = []
        self._order = itertools.count()
        self.errors: list[BaseException] = []
        """The latest failures (at most 100), newest last."""

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

    def _due(self) -> float | None:
        """Queue the retries that are due; seconds until the next one (None: none left)."""
        now = time.monotonic()
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
                    self.errors.append(e)
                    del self.errors[:-100]
                    delay = min(self.retry_max_s, self.retry_first_s * 2**attempt)
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
                            (time.monotonic() + delay, next(self._order), job, attempt + 1),
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
