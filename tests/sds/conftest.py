from __future__ import annotations

from collections.abc import Callable

import pytest

from loglake.sds.participant import Participant, ParticipantOptions


class Clock:
    """A virtual millisecond clock the tests move by hand."""

    def __init__(self, t: int = 1_700_000_000_000) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t

    def advance(self, ms: int) -> int:
        self.t += ms
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make(clock: Clock) -> Callable[..., Participant]:
    def _make(pid: str, channel: str = "chan", **opts) -> Participant:
        return Participant(channel, pid, clock, ParticipantOptions(**opts))

    return _make
