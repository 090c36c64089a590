"""The loop every differential fuzzer runs: hypothesis draws a batch, a check compares loglake
with the reference on it, disagreements are collected (not raised) so one run counts them all.

Seeded (``hypothesis.seed``) so a failing run replays exactly; bounded in examples and in
seconds so ``make test`` stays short on a loaded machine (the run stops at the time budget).
The same loop, with a longer budget, is ``benchmarks/fuzz.py --diff``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st


@dataclass
class Outcome:
    """What one fuzzer run saw: cases compared, wall time, and each disagreement found."""

    name: str
    seed: int
    cases: int = 0
    seconds: float = 0.0
    disagreements: list[str] = field(default_factory=list)
    first_catch: tuple[int, float] | None = None
    """(cases compared, seconds) when the first disagreement was seen: how strong the
    generator is, for a planted bug."""

    @property
    def cases_per_second(self) -> float:
        return self.cases / self.seconds if self.seconds else 0.0

    def report(self, limit: int = 5) -> str:
        head = (
            f"{self.name} (seed {self.seed}): {len(self.disagreements)} disagreements "
            f"in {self.cases} cases, {self.seconds:.1f} s"
        )
        if self.first_catch is not None:
            head += f" (first after {self.first_catch[0]} cases, {self.first_catch[1]:.2f} s)"
        return "\n  ".join([head, *self.disagreements[:limit]])


class _Stop(Exception):
    """Ends a run early: its time budget is spent, or its first disagreement is in."""


Check = Callable[[Any], tuple[int, list[str]]]
"""A check compares one drawn batch and returns (cases compared, disagreements)."""


def run(
    name: str,
    strategy: st.SearchStrategy[Any],
    check: Check,
    *,
    examples: int,
    seed: int,
    max_seconds: float,
    stop_at_first: bool = False,
) -> Outcome:
    """Draw up to ``examples`` batches (seeded) within ``max_seconds``; ``stop_at_first`` ends
    the run at the first disagreement (a planted-bug demonstration asks only for that)."""
    out = Outcome(name, seed)
    t0 = time.monotonic()
    stop = t0 + max_seconds

    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.seed(seed)
    @given(strategy)
    def body(value: Any) -> None:
        if time.monotonic() > stop or (stop_at_first and out.disagreements):
            raise _Stop  # hypothesis has no other way out of a run of max_examples
        cases, bad = check(value)
        out.cases += cases
        out.disagreements.extend(bad)
        if bad and out.first_catch is None:
            out.first_catch = (out.cases, time.monotonic() - t0)

    with contextlib.suppress(_Stop):
        body()
    out.seconds = time.monotonic() - t0
    return out
