"""Messages of ICRC-72 and ICRC-77 as small immutable dataclasses (one per thing on the wire).

Field meanings follow the ICRC-72 candidate (icdevs/ICEventsWG
``draft_proposals_current/candidate-ICRC72-20240924.md``) and ``specs/icrc-77-event-replay.txt``.
ICRC-16 values keep the ``loglake.wire.icrc16`` form. Candid variants that are results or errors
are :class:`Ok` / :class:`Err` (``Err.tag`` is the Candid tag, ``Err.payload`` its value); a
batch result that is Candid ``opt`` null is Python ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from icp_principal import Principal

from loglake.wire.icrc16 import RawValue, Value

ICRC16Map = list[tuple[str, Value]]

# Header and config keys, with where each comes from.
H_REPLAY_ID = "icrc77:replay:id"  # ICRC-77 "Published Event Headers"
H_REPLAY_END_ID = "icrc77:replay:end_id"  # ICRC-77 "Published Event Headers" (we emit this one)
H_REPLAY_END = "icrc77:replay:end"  # ICRC-77 comment on ReplayRegistration (accepted, not emitted)
C_REPLAY = "icrc77:replay"  # ICRC-77 "Publication Registration Configuration"
C_CAPABLE = "icrc77:capable"  # ICRC-77 "Publisher Capabilities Metadata"
C_PRICING = "icrc77:pricing"  # ICRC-77 "Publisher Capabilities Metadata"
C_SUB_FILTER = "icrc72:subscription:filter"  # ICRC-72 "Subscription Configs"
C_SUB_SKIP = "icrc72:subscription:skip"  # ICRC-72 "Subscription Configs"
C_SUB_STOPPED = "icrc72:subscription:stopped"  # ICRC-72 "Subscription Configs"
C_SUBS_ALLOWED = "icrc72:publication:subscribers:allowed:list"  # ICRC-72 "Publications Configs"
C_SUBS_DISALLOWED = "icrc72:publication:subscribers:disallowed:list"


@dataclass(frozen=True)
class Ok:
    value: Any = None


@dataclass(frozen=True)
class Err:
    tag: str
    payload: Any = None

    def __str__(self) -> str:
        return self.tag if self.payload is None else f"{self.tag}: {self.payload}"


# Event and EventNotification are built once per event on the replay path: plain slotted
# dataclasses construct ~6x faster than frozen ones (benchmarks/replay.py). Treat them as
# immutable all the same.
@dataclass(slots=True)
class Event:
    event_id: int
    prev_event_id: int | None
    timestamp: int
    namespace: str
    data: Value | RawValue
    """Decoded, or the stored Candid value bytes (a replayed event is never decoded)."""
    source: Principal
    headers: ICRC16Map | None = None


MAX_MESSAGE_BYTES = 1_000_000
"""A replay batch's ``icrc72_publish`` call is split so that its events' data stay under this,
and so are a live one, a relay's forward (``by_size``) and a job replay's notifications. The IC
caps a message at 2 MB (the ICRC-72 reference canisters respect it); half of it leaves room for
each event's other fields and for the headers the Broadcaster adds to the notifications it
makes of them (about 100 bytes an event)."""
EVENT_OVERHEAD = 100
"""Bytes counted per event besides its data (ids, timestamp, source, namespace, headers)."""


class _HasData(Protocol):
    @property
    def data(self) -> Value | RawValue: ...


_E = TypeVar("_E", bound=_HasData)


def by_size(events: list[_E], limit: int) -> list[list[_E]]:
    """``events`` in consecutive chunks whose estimated size stays under ``limit`` (at least
    one event a chunk; events or notifications). Why: a call is refused whole (413) over its
    callee's body limit, and the events in it never arrive — the Publisher's calls, a relay's
    forwards and a Broadcaster's notifications are cut by it."""
    sizes = []
    for e in events:
        d = e.data
        n = len(d.value_bytes) if type(d) is RawValue else len(repr(d))
        sizes.append(n + EVENT_OVERHEAD)
    cuts = size_slices(sizes, limit)
    return [events] if len(cuts) <= 1 else [events[lo:hi] for lo, hi in cuts]


def size_slices(sizes: Iterable[int], limit: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` slices of consecutive items whose ``sizes`` add up to at most ``limit``
    (at least one item a slice), in order: one call each (``by_size``, and the Broadcaster's
    notifications made from bytes it already holds)."""
    out: list[tuple[int, int]] = []
    lo = used = count = 0
    for i, n in enumerate(sizes):
        if i > lo and used + n > limit:
            out.append((lo, i))
            lo, used = i, 0
        used += int(n)
        count = i + 1
    if lo < count:
        out.append((lo, count))
    return out


@dataclass(slots=True)
class EventNotification:
    notification_id: int
    event_id: int
    prev_event_id: int | None
    timestamp: int
    namespace: str
    data: Value | RawValue
    headers: ICRC16Map | None
    source: Principal
    filter: str | None = None


class InboxPage(NamedTuple):
    """``loglake_inbox``'s result, ``record { nat; vec EventNotification }``: the oldest
    notifications in a subscriber's inbox, still in it, and the cursor that removes them when
    the next call acknowledges it (they are removed only once their reply arrived)."""

    cursor: int
    notes: list[EventNotification]


@dataclass(frozen=True)
class Registration:
    """``PublicationRegistration`` and ``SubscriptionRegistration`` (same shape in ICRC-72)."""

    namespace: str
    config: ICRC16Map = field(default_factory=list)
    memo: bytes = b""


@dataclass(frozen=True)
class ReplayRegistration:
    """``range = record { nat; opt nat }``: closed-open ``[start, end)``; ``end`` None = to head."""

    namespace: str
    start: int
    end: int | None = None
    config: ICRC16Map = field(default_factory=list)
    memo: bytes = b""


@dataclass(frozen=True)
class ReplayState:
    """``variant { pending; running; completed : nat; canceled : nat; errored : text }``."""

    tag: str
    value: int | str | None = None

    @property
    def final(self) -> bool:
        return self.tag in ("completed", "canceled", "errored")

    def __str__(self) -> str:
        return self.tag if self.value is None else f"{self.tag}({self.value})"


PENDING = ReplayState("pending")
RUNNING = ReplayState("running")


@dataclass(frozen=True)
class ReplayStatus:
    replay_id: int
    namespace: str
    config: ICRC16Map
    stats: ICRC16Map
    start: int
    end: int | None
    status: ReplayState


@dataclass(frozen=True)
class ReplayStatusUpdate:
    replay_id: int
    status: ReplayState


@dataclass(frozen=True)
class OrchestrationFilter:
    statistics: str = "None"  # None | All | List
    statistics_list: tuple[str, ...] = ()
    slices: tuple[
        tuple[str, Any], ...
    ] = ()  # (BySubscriber|ByPublisher|ByBroadcaster|ByNamespace, v)


@dataclass(frozen=True)
class GetReplays:
    prev: Principal | None = None
    take: int | None = None
    filter: OrchestrationFilter | None = None
