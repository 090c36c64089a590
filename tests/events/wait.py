"""Waiting on a condition with a deadline, instead of sleeping a fixed time and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    cond: Callable[[], T],
    timeout: float = 20.0,
    *,
    what: str = "the condition",
    retry_on: tuple[type[BaseException], ...] = (),
    interval: float = 0.02,
    fail: bool = True,
) -> T:
    """Call ``cond`` until it returns something truthy and return that. An exception in
    ``retry_on`` counts as "not yet". At the deadline: ``AssertionError`` naming ``what`` (or,
    with ``fail=False``, the last value)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
        except retry_on:
            value = None  # type: ignore[assignment]
        if value:
            return value
        if time.monotonic() >= deadline:
            if fail:
                raise AssertionError(f"{what} not reached within {timeout}s (last: {value!r})")
            return value
        time.sleep(interval)


def gather(fetch: Callable[[], list[Any]], enough: Callable[[list[Any]], bool], timeout: float):
    """Accumulate ``fetch()`` until ``enough(all so far)``; return what was gathered (the caller
    asserts on it, so a shortfall shows what did arrive)."""
    got: list[Any] = []

    def step() -> bool:
        got.extend(fetch())
        return enough(got)

    wait_until(step, timeout, fail=False)
    return got
