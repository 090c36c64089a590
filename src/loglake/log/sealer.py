"""Background sealing: rolled segments are written to the lake off the append path.

Why: writing a 64 MB segment as Parquet takes most of a second; doing it inside the append that
rolled the segment would stall every appender of the partition for that long. A rolled segment
is immutable and already durable, so a single worker thread per log can read and seal it while
appends go on. Nothing depends on the seal for correctness: retention never deletes a segment
the lake should hold but does not yet, and a crash before the seal is repaired on open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable

from loglake.logs import log_event

logger = logging.getLogger(__name__)


class Sealer:
    def __init__(self) -> None:
        self._q: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="loglake-sealer", daemon=True
                )
                self._thread.start()
        self._q.put(job)

    def _run(self) -> None:
        # Linux: a thread's nice value is its own; appenders keep the CPU first.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while True:
            job = self._q.get()
            try:
                if job is None:
                    return
                job()
            except Exception as e:  # keep sealing the others; the segment stays unsealed
                self.errors.append(e)
                log_event(logger, logging.ERROR, "sealing a segment failed", error=repr(e))
            finally:
                self._q.task_done()

    def drain(self) -> None:
        """Wait until every submitted seal has finished."""
        if self._thread is not None:
            self._q.join()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._q.put(None)
            thread.join()
