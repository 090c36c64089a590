"""A monotonic clock that moves only when a test says so (``open_log(dir, clock=clock)``): the
back-off of reopening a failed partition is then driven by the test, with no sleeps."""

from __future__ import annotations

import threading


class ManualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
