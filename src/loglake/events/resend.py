"""Calls a core sends again when their reply was a failure: system messages and status reports,
and the Broadcaster's notifications and the Subscriber's confirmations (bounded, each core says
how).

Why: ICRC-72 system notifications (a replay's add and remove to its Publisher) and ICRC-77
status reports (a Publisher's ``icrc77_replay_status``) are sent once; if one is lost — a
timeout, a peer restarting — the replay waits for it forever (the seeded simulation found a
replay left ``pending`` by a lost add and one left unreported by a lost final status). Both are
idempotent at the receiver (a repeated add or remove keeps the state, a repeated final status is
the same status), so a failed one is queued again after a backoff that doubles up to a cap. The
core stays sans-I/O: it hands a failure to :meth:`Resender.failed` and calls :meth:`Resender.due`
from its ``pump``.

Not for ever: a call whose failure says trying again cannot help (``retriable`` False, as
:class:`NoAddress`: a principal the directory does not list, which any caller may register a
publication or subscription from) is dropped at once, and any other after ``max_attempts``
sends (about an hour). Each was kept and sent every 10 s for the life of the process, a log line
each time. A drop is a warning on ``loglake.events`` and counts in :attr:`Resender.dropped`; a
restarted orchestrator sends its open replays' messages again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from loglake.errors import LoglakeError
from loglake.events.actions import Call

log = logging.getLogger("loglake.events")

FIRST_NS = 100_000_000
"""The first resend waits 100 ms."""
CAP_NS = 10_000_000_000
"""No resend waits more than 10 s: a peer back from a restart hears soon."""
MAX_ATTEMPTS = 360
"""Sends of one call at most, the first included: 7 resends in the first 13 s, then one each
10 s, about an hour in all; a peer down that long is given up on."""


class NoAddress(LoglakeError, ConnectionError):
    """A call to a principal the adapter has no address for (not in the directory, no role in
    the network). Final: the directory is read at start, so sending again cannot reach it."""

    retriable = False

    def __init__(self, target: object) -> None:
        super().__init__(f"no address for {target}")


class CallRefused(ConnectionError):
    """A role answered a call with an HTTP error status. ``retriable`` (read by the cores'
    resends): a server error, 408 or 429 may pass later; any other 4xx (413 too long, 400 bad
    Candid, 401/403) will not, and resending it for ever held back whatever queued behind it."""

    def __init__(self, method: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} → {status}: {body[:200]!r}")
        self.status = status
        self.retriable = status >= 500 or status in (408, 429)


@dataclass
class Resender:
    first_ns: int = FIRST_NS
    cap_ns: int = CAP_NS
    max_attempts: int | None = MAX_ATTEMPTS
    """Sends of one call before it is dropped (None: for ever)."""
    waiting: list[tuple[int, Call]] = field(default_factory=list)
    """(due time in ns, call), in the order they failed."""
    _delay: dict[int, int] = field(default_factory=dict)
    """``id()`` of a call → the wait before its next resend."""
    _attempts: dict[int, int] = field(default_factory=dict)
    """``id()`` of a call → its sends that failed."""
    dropped: int = 0
    """Calls given up on (a failure that cannot pass, or ``max_attempts`` sends)."""

    def failed(self, call: Call, now: int, error: BaseException | None = None) -> bool:
        """Queue ``call`` again after its back-off; False when it is dropped instead."""
        key = id(call)
        attempts = self._attempts.get(key, 0) + 1
        final = error is not None and not getattr(error, "retriable", True)
        if final or (self.max_attempts is not None and attempts >= self.max_attempts):
            self.forget(call)
            self.dropped += 1
            log.warning(
                "%s to %s dropped after %d attempt(s): %s",
                call.method, call.target, attempts, error,
            )  # fmt: skip
            return False
        self._attempts[key] = attempts
        delay = self._delay.get(key, self.first_ns)
        self._delay[key] = min(delay * 2, self.cap_ns)
        self.waiting.append((now + delay, call))
        return True

    def succeeded(self, call: Call) -> None:
        self.forget(call)

    def forget(self, call: Call) -> None:
        self._delay.pop(id(call), None)
        self._attempts.pop(id(call), None)

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
