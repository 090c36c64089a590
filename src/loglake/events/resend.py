"""Calls a core sends again when their reply was a failure: system messages and status reports.

Why: ICRC-72 system notifications (a replay's add and remove to its Publisher) and ICRC-77
status reports (a Publisher's ``icrc77_replay_status``) are sent once; if one is lost — a
timeout, a peer restarting — the replay waits for it forever (the seeded simulation found a
replay left ``pending`` by a lost add and one left unreported by a lost final status). Both are
idempotent at the receiver (a repeated add or remove keeps the state, a repeated final status is
the same status), so a failed one is queued again after a backoff that doubles up to a cap. The
core stays sans-I/O: it hands a failure to :meth:`Resender.failed` and calls :meth:`Resender.due`
from its ``pump``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loglake.events.actions import Call

FIRST_NS = 100_000_000
"""The first resend waits 100 ms."""
CAP_NS = 10_000_000_000
"""No resend waits more than 10 s: a peer back from a restart hears soon."""


@dataclass
class Resender:
    first_ns: int = FIRST_NS
    cap_ns: int = CAP_NS
    waiting: list[tuple[int, Call]] = field(default_factory=list)
    """(due time in ns, call), in the order they failed."""
    _delay: dict[int, int] = field(default_factory=dict)
    """``id()`` of a call → the wait before its next resend."""

    def failed(self, call: Call, now: int) -> None:
        delay = self._delay.get(id(call), self.first_ns)
        self._delay[id(call)] = min(delay * 2, self.cap_ns)
        self.waiting.append((now + delay, call))

    def succeeded(self, call: Call) -> None:
        self._delay.pop(id(call), None)

    def due(self, now: int) -> list[Call]:
        """The calls to send again now, in the order they failed."""
        if not self.waiting:
            return []
        out = [c for at, c in self.waiting if at <= now]
        if out:
            self.waiting = [(at, c) for at, c in self.waiting if at > now]
        return out

    def __len__(self) -> int:
        return len(self.waiting)
