"""A namespace's live events the Broadcaster did not take, held by the Publisher to send again.

Why: a live ``icrc72_publish`` is answered per event, and ``Busy`` (a subscriber's window of
unconfirmed notifications is full) or a failed call meant the event reached no subscriber; the
Publisher ignored those replies, so a subscriber that stopped confirming for a while made every
subscriber of the namespace lose live events (100 of 300 reached alice while bob was down,
``max_unconfirmed=100``). ICRC-72 leaves resending to the publisher (``#Busy``: "try again
later"); what loglake adds is the bound. The events are kept in the namespace's stream anyway,
so a backlog that outgrows ``max_events`` drops its oldest (counted and logged): a subscriber
gets those with an ICRC-77 replay, and a publisher facing a broadcaster that is gone for good
does not grow without limit.

Order: once a namespace holds a backlog, its new live events queue behind it instead of
overtaking it, and the backlog goes out one call at a time, oldest first. A resend after a
failed call may reach a subscriber twice; subscribers deduplicate by ``(namespace, eventId)``
(ICRC-77 "Security Considerations", ``loglake.events.subscriber``).

Sans-I/O: the Publisher hands it events and the clock, and asks it what to send.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from loglake.events.messages import Event, by_size

log = logging.getLogger("loglake.events")

FIRST_NS = 100_000_000
"""The first resend of a backlog waits 100 ms after the reply that made it."""
CAP_NS = 5_000_000_000
"""No resend waits longer than 5 s (doubling from ``FIRST_NS`` while the broadcaster keeps
answering ``Busy`` or failing)."""
MAX_EVENTS = 100_000
"""Live events held per namespace at most (the oldest beyond are dropped: still in the
stream, replayable). 100,000 events of the 1 MB call budget's average are ~1 GB at worst; the
Broadcaster's default window is 200,000 notifications per subscriber."""


@dataclass
class LiveBacklog:
    """One namespace's held live events."""

    namespace: str
    max_events: int = MAX_EVENTS
    events: deque[Event] = field(default_factory=deque)
    inflight: int = 0
    """Resend calls of this backlog not answered yet (new ones wait for them: order)."""
    due: int = 0
    """Clock time (ns) before which nothing is resent."""
    delay: int = FIRST_NS
    dropped: int = 0
    """Events given up on since the publisher started (the oldest, over ``max_events``)."""
    resent: int = 0
    """Events sent again (a call of them may hold more than one attempt's)."""
    failed_calls: int = 0
    """Resend calls that failed in a row (not answered at all; ``Busy`` is an answer)."""

    def holding(self) -> bool:
        """Events wait here, or a resend is out: new live events go behind them."""
        return bool(self.events) or self.inflight > 0

    def hold(self, events: list[Event], now: int, *, front: bool = False) -> None:
        """``events`` not taken (answered ``Busy``, or their call failed): sent again after the
        back-off. ``front``: a resend's own events, older than whatever queued meanwhile."""
        if not events:
            return
        joint = len(events) if front else len(self.events)  # where the two runs meet
        if front:
            self.events.extendleft(reversed(events))
        else:
            self.events.extend(events)
        if 0 < joint < len(self.events) and (
            self.events[joint - 1].event_id > self.events[joint].event_id
        ):  # an older call's events answered after newer ones were queued: back in id order
            self.events = deque(sorted(self.events, key=lambda e: e.event_id))
        self.due = now + self.delay
        self.delay = min(self.delay * 2, CAP_NS)
        self._bound()

    def queue(self, events: list[Event]) -> None:
        """New live events behind the backlog (no back-off of their own)."""
        self.events.extend(events)
        self._bound()

    def _bound(self) -> None:
        over = len(self.events) - self.max_events
        if over <= 0:
            return
        first = self.events[0].event_id
        for _ in range(over):
            self.events.popleft()
        if not self.dropped:
            log.warning(
                "live events of %r dropped from the publisher's backlog (over %d held; the "
                "broadcaster keeps refusing them): still in the stream, replay them with "
                "ICRC-77; first dropped id %d",
                self.namespace, self.max_events, first,
            )  # fmt: skip
        self.dropped += over

    def ready(self, now: int) -> bool:
        """Events wait, no resend is out and the back-off has passed."""
        return bool(self.events) and not self.inflight and now >= self.due

    def calls(self, most: int) -> int:
        """How many calls to send now: one while backing off (a try), else up to ``most``
        (pipelined in order: one call at a time could not drain a backlog that new events
        join as fast)."""
        return most if self.delay == FIRST_NS else 1

    def take(self, batch: int, max_bytes: int) -> list[Event]:
        """The next call's events, oldest first: at most ``batch`` of them and one ``by_size``
        chunk of ``max_bytes``."""
        head = list(islice(self.events, batch))
        if not head:
            return []
        out = by_size(head, max_bytes)[0]
        for _ in out:
            self.events.popleft()
        self.resent += len(out)
        return out

    def taken(self) -> None:
        """A call of this backlog's events was answered with every event taken: the back-off
        starts again from ``FIRST_NS``."""
        self.delay = FIRST_NS
        self.failed_calls = 0
