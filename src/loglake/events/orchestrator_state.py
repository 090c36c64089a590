"""The Orchestrator's records and their persistence: what a restart must rebuild.

The records (:class:`Publication`, :class:`Subscription`, :class:`Replay`), the quotas and the
error codes the orchestrator answers with, and :class:`OrchestratorState`: applying the journal's
records (``journal.py``) to a fresh core. Kept apart from registration and replay scheduling
because this is the part the events simulation checks after every step — the state rebuilt from
the journal must equal the live one — so what is persisted, and how, reads in one place.
"""

from __future__ import annotations

import dataclasses
from bisect import insort
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icp_principal import Principal

from loglake.events import sysmsg
from loglake.events.actions import (
    Action,
)
from loglake.events.filters import (
    Filter,
    ImproperConfig,
    Skip,
    parse_replay_config,
)
from loglake.events.journal import LEASE_OP, Journal, JournalError, decode_records
from loglake.events.ledger import Ledger
from loglake.events.messages import (
    PENDING,
    Err,
    ICRC16Map,
    ReplayState,
    ReplayStatus,
)
from loglake.events.resend import Resender
from loglake.events.role import SysEmitter, check_positive
from loglake.wire import icrc16
from loglake.wire.icrc16 import Value

E_QUOTA, E_RATE, E_NOT_CAPABLE, E_LEDGER, E_NO_ADDRESS = 1, 2, 3, 4, 5
E_NOT_ASSIGNED, E_NOT_FOUND, E_TRANSITION, E_BATCH = 401, 404, 409, 413
HEAD_KEY = "loglake:publication:head"
"""Config key a Publisher sends with ``icrc72_update_publication``: the namespace's next event
id, so the orchestrator can bound open-ended ranges without reading the Publisher's log."""
DEFAULT_JOB_THRESHOLD = 1_000_000
"""Replays of more events than this are procured by a Spark job, when the orchestrator's
adapter has a job runner (``job_threshold``): one process would take minutes over them."""
PROGRESS_KEY = "loglake:replay:sent"
"""Config key a Publisher sends with ``icrc72_update_publication``: ``#Array[#Nat(replayId),
#Nat(sent)]`` while a replay runs (``ReplayState.running`` has no count); shown in the replay's
stats as ``icrc77:replay:sent`` (the CLI's progress bar reads it)."""


@dataclass(frozen=True)
class Quotas:
    max_batch: int = 100
    max_events_per_replay: int = 5_000_000
    max_concurrent_per_subscriber: int = 4
    max_concurrent_per_namespace: int = 16
    max_subscriptions_per_subscriber: int = 1000
    """Subscriptions one principal may hold (a namespace need not exist to be subscribed to:
    without a bound one caller made tens of thousands a second, each kept and journalled)."""
    max_publications_per_publisher: int = 1000
    """Publications one principal may hold (any caller may claim a namespace nobody has: without
    a bound one caller made ~1,000 a second, each kept, journalled and announced twice)."""
    max_requests_per_window: int = 100
    max_queries_per_window: int = 600
    """``icrc77_get_replays`` calls one principal may make a window, counted apart from the
    registrations and cancels (``max_requests_per_window``): a client waiting for a replay
    polls its status (the CLI 5 times a second)."""
    window_ns: int = 60 * 1_000_000_000
    max_rate_principals: int = 10_000
    """Principals whose rate windows are held at once (each table: requests, queries). A window
    whose calls are all older than ``window_ns`` is forgotten anyway; past this many callers in
    one window the oldest is, its budget starting over as a fresh key's would. Without it every
    principal that ever called was kept for good: fresh keys grew memory without limit."""

    def __post_init__(self) -> None:
        check_positive(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclass
class RateWindows:
    """Each principal's counted calls in the last ``window_ns``: at most ``limit`` of them.

    The table is ordered by each principal's last counted call (moved to the end when it counts
    one), so windows that ended are at the front and each call sweeps them from there: amortised
    O(1), as ``sds.repair``'s requester windows. An ``OrderedDict``: a plain dict's first key
    is found by skipping the slots its deletions left at the front, O(n) a call until it
    resizes (10,000 new principals a window: 19 µs a call, against 2 µs). Forgotten,
    a principal starts an empty window, which is what it would have had: its calls had all left
    the window."""

    limit: int
    window_ns: int
    max_principals: int = 10_000
    calls: OrderedDict[bytes, deque[int]] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self.calls)

    def admit(self, who: bytes, now: int) -> bool:
        """Count a call of ``who`` at ``now`` unless its window already holds ``limit``."""
        calls, start = self.calls, now - self.window_ns
        while calls:  # the ended windows, then the oldest past the bound (not the caller's)
            last = next(iter(calls.values()))
            if last[-1] > start and (len(calls) < self.max_principals or who in calls):
                break
            calls.popitem(last=False)
        q = calls.get(who)
        if q is None:
            if self.limit < 1:
                return False
            q = deque()
        while q and q[0] <= start:
            q.popleft()
        if len(q) >= self.limit:
            return False
        q.append(now)
        calls[who] = q
        calls.move_to_end(who)  # its last counted call is now the latest
        return True

    def wait_ns(self, who: bytes, now: int) -> int:
        """How long until ``who`` may be counted again (0: now)."""
        q = self.calls.get(who)
        return max(0, q[0] + self.window_ns - now) if q and len(q) >= self.limit else 0


@dataclass
class Publication:
    id: int
    namespace: str
    publisher: Principal
    broadcaster: Principal
    config: ICRC16Map
    replay: bool = False
    capable: bool = False
    per_event: int = 0
    currency: str = ""
    head: int = 0


@dataclass
class Subscription:
    id: int
    namespace: str
    subscriber: Principal
    config: ICRC16Map


@dataclass
class Replay:
    id: int
    subscriber: Principal
    namespace: str
    start: int
    end: int | None
    config: ICRC16Map
    publisher: Principal
    broadcaster: Principal
    expected: int
    cost: int
    created: int
    status: ReplayState = PENDING
    filter: Filter | None = None
    skip: Skip | None = None
    cancel_requested: bool = False
    sent: int = 0
    relay: Principal | None = None
    job: bool = False
    """Procured by a Spark job (its Broadcaster delivers from the job's output)."""
    job_output: str | None = None
    job_selected: int = 0

    def to_status(self) -> ReplayStatus:
        # the publisher reports progress every few thousand events; its final count is the
        # status itself, so a short replay read "completed(2000)" beside "sent 0"
        final = self.status.value if self.status.tag in ("completed", "canceled") else 0
        sent = max(self.sent, final) if isinstance(final, int) else self.sent
        stats: ICRC16Map = [
            ("icrc77:replay:subscriber", {"Principal": self.subscriber}),
            ("icrc77:replay:publisher", {"Principal": self.publisher}),
            ("icrc77:replay:broadcaster", {"Principal": self.broadcaster}),
            *(
                [("icrc77:replay:relay", {"Principal": self.relay})]
                if self.relay is not None
                else []
            ),
            ("icrc77:replay:expected", {"Nat": self.expected}),
            ("icrc77:replay:sent", {"Nat": sent}),
            ("icrc77:replay:cost", {"Nat": self.cost}),
            ("icrc77:replay:created", {"Nat": self.created}),
        ]
        return ReplayStatus(
            self.id, self.namespace, self.config, stats, self.start, self.end, self.status
        )


class ReplayTable(dict[int, Replay]):
    """The replays by id, with the ids of each principal's replays (as subscriber, publisher,
    broadcaster or relay) and of each namespace's, in id order: ``icrc77_get_replays`` reads a
    page from where it starts instead of sorting and looking at every replay ever made (over
    1,000,000 replays a caller with none held the event loop 1.2 s a call). A replay's parties
    and namespace never change, and a replay is never removed; replays are added by item
    assignment only."""

    def __init__(self) -> None:
        super().__init__()
        self.by_party: dict[bytes, list[int]] = {}
        self.by_namespace: dict[str, list[int]] = {}
        self.live: set[int] = set()
        """Ids of the replays not seen in a final state yet (``active`` drops the others)."""

    def __setitem__(self, rid: int, rep: Replay) -> None:
        if rid in self:
            raise ValueError(f"replay {rid} is already recorded")
        super().__setitem__(rid, rep)
        self.live.add(rid)
        parties = (rep.subscriber, rep.publisher, rep.broadcaster, rep.relay)
        for who in {p.bytes for p in parties if p is not None}:
            _add_id(self.by_party.setdefault(who, []), rid)
        _add_id(self.by_namespace.setdefault(rep.namespace, []), rid)

    def active(self, pred: Callable[[Replay], bool]) -> int:
        """How many replays not in a final state ``pred`` holds for. Only those not seen final
        yet are looked at, and a final one is dropped from them for good (no transition leaves
        a final state): the concurrency quotas of every registration scanned every replay ever
        made, twice (100,000 finished replays: ~20 ms a registration, 100 in a call)."""
        done = [rid for rid in self.live if self[rid].status.final]
        self.live.difference_update(done)
        return sum(1 for rid in self.live if pred(self[rid]))


class SubscriptionTable(dict[tuple[str, bytes], Subscription]):
    """The subscriptions by ``(namespace, subscriber bytes)``, with each namespace's by
    subscriber (``by_namespace``): a publication's registration announces its namespace's
    subscriptions without looking at every subscription of every principal (it scanned them
    all, each item of each call: 50,000 subscriptions elsewhere held the event loop 1.5 s for
    one call of 100 publications). A subscription is never removed; added or replaced by item
    assignment only."""

    def __init__(self) -> None:
        super().__init__()
        self.by_namespace: dict[str, dict[bytes, Subscription]] = {}

    def __setitem__(self, key: tuple[str, bytes], sub: Subscription) -> None:
        super().__setitem__(key, sub)
        self.by_namespace.setdefault(key[0], {})[key[1]] = sub


def _add_id(ids: list[int], rid: int) -> None:
    if not ids or ids[-1] < rid:
        ids.append(rid)  # ids are given out in order
    else:
        insort(ids, rid)


def _generic(code: int, message: str) -> Err:
    return Err("GenericError", {"error_code": code, "message": message})


def _count(counts: dict[bytes, int], who: Principal) -> None:
    """One more held by ``who``: the counts the per-principal quotas are checked against."""
    counts[who.bytes] = counts.get(who.bytes, 0) + 1


def _principals(v: Value | None, key: str) -> set[bytes]:
    if v is None:
        return set()
    if "Array" not in v or not all("Blob" in x or "Principal" in x for x in v["Array"]):
        raise ImproperConfig(f"{key}: expected #Array([#Blob(principal)])")
    return {x["Blob"] if "Blob" in x else x["Principal"].bytes for x in v["Array"]}


class OrchestratorState:
    """Restart: the journal's records applied to a freshly constructed core."""

    # the state this part reads and writes (made by the Orchestrator's constructor)
    principal: Principal
    outbox: list[Action]
    broadcasters: list[Principal]
    homes: dict[bytes, Principal]
    relay_replays: bool
    quotas: Quotas
    ledger: Ledger | None
    sys: SysEmitter
    journal: Journal
    publications: dict[str, Publication]
    subscriptions: SubscriptionTable
    subscription_counts: dict[bytes, int]
    publication_counts: dict[bytes, int]
    replays: ReplayTable
    _next_pub: int
    _next_sub: int
    _next_replay: int
    _resend: list[int]
    resender: Resender

    if TYPE_CHECKING:  # defined by the Orchestrator, with registration

        def configure_publication(self, pub: Publication) -> None: ...

    # -- restart -------------------------------------------------------------------------------
    def restore(self, records: list[tuple[int, bytes]]) -> None:
        """Apply the journal's ``(index, data)`` records to this freshly constructed core; the
        first :meth:`pump` then resends the open replays' system messages."""
        stream = self.journal.stream
        for (i, _), op in zip(records, decode_records(stream, records), strict=True):
            try:
                self._apply_record(op)
            except JournalError:
                raise
            except Exception as e:  # a record of the wrong shape: refuse, name the record
                raise JournalError(f"{stream}[{i}]: cannot apply {op!r:.120}: {e}") from e
        self._resend = [r.id for r in self.replays.values() if not r.status.final]

    def _apply_record(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "pub":
            pub = Publication(
                op["id"],
                op["ns"],
                Principal(op["publisher"]),
                Principal(op["bc"]),
                icrc16.decode_map(op["cfg"]),
            )
            old = self.publications.get(pub.namespace)
            if old is not None:
                pub.head = old.head
            else:
                _count(self.publication_counts, pub.publisher)
            self.configure_publication(pub)
            self.publications[pub.namespace] = pub
            self._next_pub = max(self._next_pub, pub.id + 1)
        elif kind == "sub":
            s = Subscription(op["id"], op["ns"], Principal(op["sub"]), icrc16.decode_map(op["cfg"]))
            key = (s.namespace, s.subscriber.bytes)
            if key not in self.subscriptions:
                _count(self.subscription_counts, s.subscriber)
            self.subscriptions[key] = s
            self._next_sub = max(self._next_sub, s.id + 1)
        elif kind == "head":
            self.publications[op["ns"]].head = op["head"]
        elif kind == "replay":
            cfg = icrc16.decode_map(op["cfg"])
            flt, skip = parse_replay_config(cfg)
            rep = Replay(
                op["id"],
                Principal(op["sub"]),
                op["ns"],
                op["start"],
                op["end"],
                cfg,
                Principal(op["pub"]),
                Principal(op["bc"]),
                op["expected"],
                op["cost"],
                op["created"],
                filter=flt,
                skip=skip,
                relay=None if op["relay"] is None else Principal(op["relay"]),
                job=bool(op.get("job", False)),
            )
            self.replays[rep.id] = rep
            self._next_replay = max(self._next_replay, rep.id + 1)
        elif kind == "status":
            self.replays[op["id"]].status = ReplayState(op["tag"], op["value"])
        elif kind == "cancel":
            self.replays[op["id"]].cancel_requested = True
        elif kind == "job":
            rep = self.replays[op["id"]]
            rep.job_output, rep.job_selected = op["output"], op["selected"]
        elif kind == "sent":
            rep = self.replays[op["id"]]
            rep.sent = max(rep.sent, op["sent"])
        elif kind == LEASE_OP:
            pass  # a node taking the journal's lease over (streams.fence): no state in it
        else:
            raise JournalError(f"{self.journal.stream}: unknown op {kind!r}")

    def system_namespaces(self) -> set[str]:
        """Every system namespace this core may emit to (for :meth:`continue_numbering`)."""
        out = {sysmsg.broadcaster_sys(b) for b in self.broadcasters}
        out |= {sysmsg.publisher_sys(p.publisher) for p in self.publications.values()}
        out |= {sysmsg.subscriber_sys(s.subscriber) for s in self.subscriptions.values()}
        for r in self.replays.values():
            out |= {sysmsg.publisher_sys(r.publisher), sysmsg.subscriber_sys(r.subscriber)}
        return out

    def continue_numbering(self, heads: dict[str, int]) -> None:
        """After a restart: system notifications continue from each system namespace's stream
        head (``heads``: namespace → next index) — an event id is a stream index."""
        for ns, head in heads.items():
            if head:
                self.sys.next_ids[ns] = head
