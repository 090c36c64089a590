"""The events process tests' waits, on the shared ``tests.waiting.wait_until``: a call that is
refused until a role is ready (``retry_on``), a deadline that is not a failure (``fail=False``:
the caller asserts on what it has), and gathering an inbox until enough has arrived."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tests.waiting import wait_until as _wait_until

T = TypeVar("T")

STATUS_POLL_S = 0.2
"""The pause between ``icrc77_get_replays`` polls while waiting for a replay (as the CLI's
``replay`` polls): each call counts toward the subscriber's ``Quotas.max_queries_per_window``
(600 a minute), and the module-scoped clusters keep one subscriber for many waits."""


def wait_until(
    cond: Callable[[], T],
    timeout: float = 20.0,
    *,
    what: str = "the condition",
    retry_on: tuple[type[BaseException], ...] = (),
    interval: float = 0.02,
    fail: bool = True,
) -> T | None:
    """``tests.waiting.wait_until``, where an exception in ``retry_on`` counts as "not yet";
    with ``fail=False`` the deadline returns ``None`` instead of raising."""

    def pred() -> T | None:
        try:
            return cond()
        except retry_on:
            return None

    try:
        return _wait_until(pred, timeout, what, interval)
    except AssertionError:
        if fail:
            raise
        return None


def gather(fetch: Callable[[], list[Any]], enough: Callable[[list[Any]], bool], timeout: float):
    """Accumulate ``fetch()`` until ``enough(all so far)``; return what was gathered (the caller
    asserts on it, so a shortfall shows what did arrive)."""
    got: list[Any] = []

    def step() -> bool:
        got.extend(fetch())
        return enough(got)

    wait_until(step, timeout, fail=False)
    return got
