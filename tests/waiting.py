"""Wait for a condition with a deadline, instead of sleeping a fixed time and hoping.

A fixed sleep is either too short on a loaded machine (a flaky failure) or longer than needed
everywhere else; ``wait_until`` returns as soon as the state is there and, at the deadline,
fails naming what never happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    pred: Callable[[], T],
    timeout: float = 20.0,
    what: str = "the condition",
    interval: float = 0.02,
) -> T:
    """Call ``pred`` until it returns something truthy, and return that; ``AssertionError``
    naming ``what`` (and the last value) if ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s (last: {value!r})")
        time.sleep(interval)
