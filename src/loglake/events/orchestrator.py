"""The ICRC-72 Orchestrator with the ICRC-77 replay API (sans-I/O).

Follows ``specs/icrc-77-event-replay.txt`` "Replay Life Cycle" steps 1-4 and 7-8: validate a
registration (authorisation, publication, subscription, range, config, quotas, payment), assign
the publication's Broadcaster and its ICRC-77-capable Publisher and a replay id, then emit the
system message to the Broadcaster *before* the one to the Publisher (the text: Broadcasters
"MUST be alerted to their responsibilities before the Publisher is notified"). The Publisher
reports through ``icrc77_replay_status``; a cancel emits the remove messages and stops the
Publisher enqueuing (sent notifications stay sent).

The ICRC-72 part (publication / subscription registration, assignment of one Broadcaster per
publication) follows the candidate's "Publisher Life Cycle"; the Motoko orchestrator
(PanIndustrial-Org/icrc72-orchestrator-mo) assigns broadcasters the same way, one per
namespace. Every system message is also appended to a loglake stream named for its system
namespace, so control traffic is auditable like any other stream.

Relay tier (ICRC-77 "Control Plane", ``replay_relay`` / ``replay_relayer``): a replay's
*target* broadcaster is the one serving its subscriber — the subscriber's home broadcaster
(``homes``, operator configuration), or, with ``relay_replays``, the next broadcaster after the
publication's (isolates replay traffic from the live path, ICRC-77 step 6). When the target is
not the publication's broadcaster, the publication's broadcaster becomes the replay's relay:
the subscriber is told to accept the target (``icrc72:subscriber:broadcaster:add``), then the
target gets ``icrc77:broadcaster:replay:add`` (relay = the relay) and
``icrc77:broadcaster:replay_relayer:add``, then the relay gets
``icrc77:broadcaster:replay_relay:add`` — all before the Publisher's
``icrc77:publisher:replay:add``, whose broadcaster is the relay. Events flow Publisher → relay →
target → Subscriber. Live events stay on the publication's broadcaster (one tier).

Durability (``journal.py``): publications, subscriptions, heads and replays (with their
status, cancel and progress) are journalled to ``loglake.events.orchestrator.<name>`` before
they take effect — the core queues ``JournalWrite`` actions, and its adapter performs them before
the reply or any later call leaves — and :meth:`Orchestrator.restore` rebuilds them from the
stream's records (``store.open_orchestrator`` reads them). After a restart, the first
:meth:`pump` sends the system messages of every open replay again (adds, or removes for a
requested cancel): the receivers treat a repeated add or remove as a no-op, so a crash between
journalling and sending loses no control message. The core performs no I/O.

Validation order, and which variant each check yields (each reached by a test):

=============================  =================================================
batch longer than max_batch    every item ``GenericBatchError``
anonymous caller               ``Unauthorized``
over the request rate          ``GenericError`` code 2
unknown namespace              ``PublicationNotFound``
caller denied by allow/deny    ``UnauthorizedSubscriber``
caller has no subscription     ``SubscriptionNotFound``
memo > 32 B, bad config,       ``ImproperConfig``
from > to
no icrc77-capable publisher    ``GenericError`` code 3
more events than the cap       ``RangeTooLarge``
concurrent replays quota       ``GenericError`` code 1
price not covered              ``PaymentRequired``
=============================  =================================================
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any

from icp_principal import Principal

from loglake.events import sysmsg
from loglake.events.actions import (
    AppendEvents,
    Call,
    CancelReplayJob,
    ReplayJobSpec,
    StartReplayJob,
)
from loglake.events.filters import (
    Filter,
    ImproperConfig,
    Skip,
    parse_replay_config,
    parse_subscription_config,
)
from loglake.events.identity import ANONYMOUS
from loglake.events.journal import Journal, JournalError, decode_records
from loglake.events.ledger import Ledger, LedgerError, account
from loglake.events.messages import (
    C_CAPABLE,
    C_PRICING,
    C_REPLAY,
    C_SUBS_ALLOWED,
    C_SUBS_DISALLOWED,
    PENDING,
    Err,
    GetReplays,
    ICRC16Map,
    Ok,
    OrchestrationFilter,
    Registration,
    ReplayRegistration,
    ReplayState,
    ReplayStatus,
    ReplayStatusUpdate,
)
from loglake.events.role import Role, SysEmitter
from loglake.streams.api import check_stream_name
from loglake.wire import icrc16
from loglake.wire.icrc16 import Value, map_get

E_QUOTA, E_RATE, E_NOT_CAPABLE, E_LEDGER = 1, 2, 3, 4
E_NOT_ASSIGNED, E_NOT_FOUND, E_TRANSITION = 401, 404, 409
HEAD_KEY = "loglake:publication:head"
"""Config key a Publisher sends with ``icrc72_update_publication``: the namespace's next event
id, so the orchestrator can bound open-ended ranges without reading the Publisher's log."""
DEFAULT_JOB_THRESHOLD = 1_000_000
"""Replays of more events than this are procured by a Spark job, when the orchestrator's
adapter has a job runner (``job_threshold``)."""
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
    max_requests_per_window: int = 100
    window_ns: int = 60 * 1_000_000_000


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


def _generic(code: int, message: str) -> Err:
    return Err("GenericError", {"error_code": code, "message": message})


def _principals(v: Value | None, key: str) -> set[bytes]:
    if v is None:
        return set()
    if "Array" not in v or not all("Blob" in x or "Principal" in x for x in v["Array"]):
        raise ImproperConfig(f"{key}: expected #Array([#Blob(principal)])")
    return {x["Blob"] if "Blob" in x else x["Principal"].bytes for x in v["Array"]}


class Orchestrator(Role):
    def __init__(
        self,
        principal: Principal,
        broadcasters: list[Principal],
        quotas: Quotas | None = None,
        ledger: Ledger | None = None,
        homes: dict[bytes, Principal] | None = None,
        relay_replays: bool = False,
        journal_name: str = "main",
        job_threshold: int | None = None,
    ) -> None:
        super().__init__(principal)
        self.job_threshold = job_threshold
        """Replays of more events go to a Spark job; None: never (no job runner)."""
        if not broadcasters:
            raise ValueError("an orchestrator needs at least one broadcaster")
        self.homes = dict(homes or {})
        """Subscriber principal bytes → the broadcaster serving that subscriber's replays."""
        for b in self.homes.values():
            if b not in broadcasters:
                raise ValueError(f"home broadcaster {b} is not one of the broadcasters")
        self.relay_replays = relay_replays
        self.broadcasters = list(broadcasters)
        self.quotas = quotas or Quotas()
        self.ledger = ledger
        if ledger is not None:  # its records join our outbox, in the order they are made
            self.outbox.extend(ledger.writes)
            ledger.writes = self.outbox
        self.sys = SysEmitter(principal)
        self.publications: dict[str, Publication] = {}
        self.subscriptions: dict[tuple[str, bytes], Subscription] = {}
        self.replays: dict[int, Replay] = {}
        self._requests: dict[bytes, deque[int]] = {}
        self._next_pub = self._next_sub = self._next_replay = 1
        self.journal = Journal(self.outbox, journal_name)
        self._resend: list[int] = []
        self.methods = {
            "icrc72_register_publication": self.register_publication,
            "icrc72_register_subscription": self.register_subscription,
            "icrc72_update_publication": self.update_publication,
            "icrc77_register_replay": self.register_replay,
            "icrc77_cancel_replay": self.cancel_replay,
            "icrc77_replay_status": self.replay_status,
            "icrc77_get_replays": self.get_replays,
            "icrc1_balance_of": self.icrc1_balance_of,
            "icrc2_approve": self.icrc2_approve,
        }

    # -- the embedded ledger (ICRC-1 / ICRC-2) ---------------------------------------------------
    def icrc1_balance_of(self, caller: Principal, acct: Any, now: int) -> int:
        owner, sub = acct
        return 0 if self.ledger is None else self.ledger.balance_of(account(owner, sub))

    def icrc2_approve(self, caller: Principal, arg: Any, now: int) -> Ok | Err:
        spender, amount = arg
        if self.ledger is None:
            return _generic(E_LEDGER, "no ledger configured")
        try:
            return Ok(self.ledger.approve(account(caller), account(spender), amount, now))
        except LedgerError as e:
            if e.kind == "InsufficientFunds":
                return Err(
                    "InsufficientFunds", {"balance": self.ledger.balance_of(account(caller))}
                )
            return _generic(E_LEDGER, str(e))

    # -- system messages ---------------------------------------------------------------------
    def _emit(self, target: Principal, namespace: str, data: Value, now: int) -> None:
        n = self.sys.notification(namespace, data, now)
        self.outbox.append(AppendEvents(namespace, [icrc16.encode(data)]))  # the audit copy
        self.outbox.append(Call(target, "icrc72_handle_notification", [n]))

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
            self.configure_publication(pub)
            self.publications[pub.namespace] = pub
            self._next_pub = max(self._next_pub, pub.id + 1)
        elif kind == "sub":
            s = Subscription(op["id"], op["ns"], Principal(op["sub"]), icrc16.decode_map(op["cfg"]))
            self.subscriptions[(s.namespace, s.subscriber.bytes)] = s
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

    def _rate_ok(self, caller: Principal, now: int) -> bool:
        q = self._requests.setdefault(caller.bytes, deque())
        while q and q[0] <= now - self.quotas.window_ns:
            q.popleft()
        if len(q) >= self.quotas.max_requests_per_window:
            return False
        q.append(now)
        return True

    # -- ICRC-72 -----------------------------------------------------------------------------
    def register_publication(
        self, caller: Principal, regs: list[Registration], now: int
    ) -> list[Ok | Err | None]:
        if len(regs) > self.quotas.max_batch:
            return [Err("GenericBatchError", "batch too large")] * len(regs)
        return [self._register_publication(caller, r, now) for r in regs]

    def _register_publication(self, caller: Principal, r: Registration, now: int) -> Ok | Err:
        if caller == ANONYMOUS:
            return Err("Unauthorized")
        if sysmsg.is_system(r.namespace):
            return Err("ImproperConfig", "icrc72:/icrc77: namespaces are reserved for the system")
        try:
            check_stream_name(r.namespace)
            replay = map_get(r.config, C_REPLAY)
            capable = map_get(r.config, C_CAPABLE)
            for key, v in ((C_REPLAY, replay), (C_CAPABLE, capable)):
                if v is not None and "Bool" not in v:
                    raise ImproperConfig(f"{key} must be #Bool")
            self._pricing(map_get(r.config, C_PRICING))
            _principals(map_get(r.config, C_SUBS_ALLOWED), C_SUBS_ALLOWED)
            _principals(map_get(r.config, C_SUBS_DISALLOWED), C_SUBS_DISALLOWED)
        except (ImproperConfig, ValueError) as e:
            return Err("ImproperConfig", str(e))
        existing = self.publications.get(r.namespace)
        if existing is not None and existing.publisher != caller:
            return Err("UnauthorizedPublisher", {"namespace": r.namespace})
        if existing is None:
            bc = self.broadcasters[len(self.publications) % len(self.broadcasters)]
            pub = Publication(self._next_pub, r.namespace, caller, bc, r.config)
            self._next_pub += 1
        else:
            pub = existing
            pub.config = r.config
        self.journal.publication(pub, now)
        self.configure_publication(pub)
        self.publications[r.namespace] = pub
        bc = pub.broadcaster
        self._emit(
            bc,
            sysmsg.broadcaster_sys(bc),
            sysmsg.broadcaster_publication_add([(pub.namespace, caller)]),
            now,
        )
        self._emit(
            caller,
            sysmsg.publisher_sys(caller),
            sysmsg.publisher_broadcaster_add([(pub.id, bc)]),
            now,
        )
        for s in self.subscriptions.values():
            if s.namespace == pub.namespace:
                self._assign_subscription(s, pub, now)
        return Ok(pub.id)

    def configure_publication(self, pub: Publication) -> None:
        """Derive the publication's replay settings from its (validated) config."""
        replay = map_get(pub.config, C_REPLAY)
        capable = map_get(pub.config, C_CAPABLE)
        pub.replay = bool(replay and replay["Bool"])
        # Capability: advertised by `icrc77:capable`, or implied by `icrc77:replay` (the
        # orchestrator aggregates publisher metadata from the registration; ICRC-77
        # "Publisher Capabilities Metadata").
        pub.capable = bool(capable["Bool"]) if capable is not None else pub.replay
        pub.per_event, pub.currency = self._pricing(map_get(pub.config, C_PRICING))

    @staticmethod
    def _pricing(v: Value | None) -> tuple[int, str]:
        if v is None:
            return 0, ""
        if "Class" not in v:
            raise ImproperConfig(f"{C_PRICING} must be #Class([perEvent, currency])")
        props = {p.name: p.value for p in v["Class"]}
        per = props.get("perEvent")
        cur = props.get("currency", {"Text": ""})
        if per is None or "Nat" not in per or "Text" not in cur:
            raise ImproperConfig(f"{C_PRICING}: perEvent #Nat and currency #Text required")
        return per["Nat"], cur["Text"]

    def update_publication(self, caller: Principal, updates: list[Any], now: int) -> list[Any]:
        """``icrc72_update_publication``: :data:`HEAD_KEY` and :data:`PROGRESS_KEY` only."""
        out: list[Any] = []
        for ns, key, value in updates:
            pub = self.publications.get(ns)
            if pub is None or pub.publisher != caller:
                out.append(Err("Unauthorized"))
            elif key == HEAD_KEY and "Nat" in value:
                if value["Nat"] > pub.head:
                    self.journal.append({"op": "head", "ns": ns, "head": value["Nat"]}, now)
                    pub.head = value["Nat"]
                out.append(Ok(True))
            elif key == PROGRESS_KEY and self._progress(caller, ns, value, now):
                out.append(Ok(True))
            else:
                out.append(Err("ImproperConfig", f"unsupported update key {key!r}"))
        return out

    def _progress(self, caller: Principal, ns: str, value: Value, now: int) -> bool:
        items = value.get("Array") if isinstance(value, dict) else None
        if not items or len(items) != 2 or not all("Nat" in i for i in items):
            return False
        rep = self.replays.get(items[0]["Nat"])
        if rep is None or rep.publisher != caller or rep.namespace != ns:
            return False
        if items[1]["Nat"] > rep.sent:
            self.journal.append({"op": "sent", "id": rep.id, "sent": items[1]["Nat"]}, now)
            rep.sent = items[1]["Nat"]
        return True

    def register_subscription(
        self, caller: Principal, regs: list[Registration], now: int
    ) -> list[Ok | Err | None]:
        if len(regs) > self.quotas.max_batch:
            return [Err("GenericBatchError", "batch too large")] * len(regs)
        return [self._register_subscription(caller, r, now) for r in regs]

    def _register_subscription(self, caller: Principal, r: Registration, now: int) -> Ok | Err:
        if caller == ANONYMOUS:
            return Err("Unauthorized")
        try:
            check_stream_name(r.namespace)
            parse_subscription_config(r.config)
        except (ImproperConfig, ValueError) as e:
            return Err("ImproperConfig", str(e))
        pub = self.publications.get(r.namespace)
        if pub is not None and not self._allowed(pub, caller):
            return Err("UnauthorizedSubscriber", {"namespace": r.namespace})
        key = (r.namespace, caller.bytes)
        sub = self.subscriptions.get(key)
        if sub is None:
            sub = Subscription(self._next_sub, r.namespace, caller, r.config)
            self._next_sub += 1
        else:
            sub.config = r.config
        self.journal.subscription(sub, now)
        self.subscriptions[key] = sub
        if pub is not None:
            self._assign_subscription(sub, pub, now)
        return Ok(sub.id)

    def _assign_subscription(self, sub: Subscription, pub: Publication, now: int) -> None:
        bc = pub.broadcaster
        self._emit(
            bc,
            sysmsg.broadcaster_sys(bc),
            sysmsg.broadcaster_subscriber_add([(sub.namespace, sub.subscriber, sub.config)]),
            now,
        )
        self._emit(
            sub.subscriber,
            sysmsg.subscriber_sys(sub.subscriber),
            sysmsg.subscriber_broadcaster_add([(sub.namespace, bc)]),
            now,
        )

    @staticmethod
    def _allowed(pub: Publication, who: Principal) -> bool:
        allowed = _principals(map_get(pub.config, C_SUBS_ALLOWED), C_SUBS_ALLOWED)
        denied = _principals(map_get(pub.config, C_SUBS_DISALLOWED), C_SUBS_DISALLOWED)
        if who.bytes in denied:
            return False
        return not allowed or who.bytes in allowed

    # -- ICRC-77 -----------------------------------------------------------------------------
    def register_replay(
        self, caller: Principal, regs: list[ReplayRegistration], now: int
    ) -> list[Ok | Err | None]:
        if len(regs) > self.quotas.max_batch:
            return [
                Err("GenericBatchError", f"at most {self.quotas.max_batch} registrations a call")
            ] * len(regs)
        return [self._register_replay(caller, r, now) for r in regs]

    def _active(self, pred: Any) -> int:
        return sum(1 for r in self.replays.values() if not r.status.final and pred(r))

    def _register_replay(self, caller: Principal, r: ReplayRegistration, now: int) -> Ok | Err:
        q = self.quotas
        if caller == ANONYMOUS:
            return Err("Unauthorized")
        if not self._rate_ok(caller, now):
            return _generic(E_RATE, f"more than {q.max_requests_per_window} requests a window")
        pub = self.publications.get(r.namespace)
        if pub is None:
            return Err("PublicationNotFound")
        if not self._allowed(pub, caller):
            return Err("UnauthorizedSubscriber", {"namespace": r.namespace})
        if (r.namespace, caller.bytes) not in self.subscriptions:
            return Err("SubscriptionNotFound")
        if len(r.memo) > 32:
            return Err("ImproperConfig", "memo is at most 32 bytes")
        try:
            flt, skip = parse_replay_config(r.config)
        except ImproperConfig as e:
            return Err("ImproperConfig", str(e))
        if r.end is not None and r.start > r.end:
            return Err("ImproperConfig", f"range start {r.start} > end {r.end}")
        if not (pub.replay and pub.capable):
            return _generic(E_NOT_CAPABLE, "no ICRC-77 capable publisher for this namespace")
        stop = pub.head if r.end is None else min(r.end, pub.head)
        expected = max(0, stop - r.start)
        if expected > q.max_events_per_replay:
            return Err(
                "RangeTooLarge",
                f"{expected} events requested; at most {q.max_events_per_replay} a replay",
            )
        if self._active(lambda x: x.subscriber == caller) >= q.max_concurrent_per_subscriber:
            return _generic(E_QUOTA, "too many concurrent replays for this subscriber")
        if self._active(lambda x: x.namespace == r.namespace) >= q.max_concurrent_per_namespace:
            return _generic(E_QUOTA, "too many concurrent replays for this namespace")
        cost = pub.per_event * expected
        if cost:
            if self.ledger is None:
                return Err("PaymentRequired", f"{cost} {pub.currency}; no ledger configured")
            try:
                self.ledger.transfer_from(
                    account(self.principal), account(caller), account(pub.publisher), cost, now
                )
            except LedgerError as e:
                return Err(
                    "PaymentRequired",
                    f"replay costs {cost} {pub.currency} ({pub.per_event} per event) plus fee "
                    f"{self.ledger.fee}: approve the orchestrator as spender ({e})",
                )
        rep = Replay(
            self._next_replay,
            caller,
            r.namespace,
            r.start,
            r.end,
            r.config,
            pub.publisher,
            pub.broadcaster,
            expected,
            cost,
            now,
            PENDING,
            flt,
            skip,
        )
        self._next_replay += 1
        target = self._target(caller, pub.broadcaster)
        if target != pub.broadcaster:
            rep.broadcaster, rep.relay = target, pub.broadcaster
        elif self.job_threshold is not None and expected > self.job_threshold:
            rep.job = True  # relayed replays stay with the Publisher
        self.journal.replay(rep, now)
        self.replays[rep.id] = rep
        self._emit_replay_add(rep, now)
        return Ok(rep.id)

    def _emit_replay_add(self, rep: Replay, now: int) -> None:
        caller, target = rep.subscriber, rep.broadcaster
        bc = rep.relay if rep.relay is not None else rep.broadcaster
        flt, skip = rep.filter, rep.skip
        ftext = flt.text if flt else None
        if target != bc:
            self._emit(
                caller,
                sysmsg.subscriber_sys(caller),
                sysmsg.subscriber_broadcaster_add([(rep.namespace, target)]),
                now,
            )
        add = sysmsg.BroadcasterReplayAdd(
            rep.id, rep.namespace, bc, caller, ftext, skip, rep.publisher
        )
        tsys = sysmsg.broadcaster_sys(target)
        self._emit(target, tsys, sysmsg.broadcaster_replay_add([add]), now)
        if target != bc:
            self._emit(
                target,
                tsys,
                sysmsg.broadcaster_relayer_add(sysmsg.RelayerAdd(rep.id, rep.namespace, bc)),
                now,
            )
            radd = sysmsg.RelayAdd(rep.id, rep.namespace, target, rep.publisher, ftext, skip)
            self._emit(bc, sysmsg.broadcaster_sys(bc), sysmsg.broadcaster_relay_add([radd]), now)
        if rep.job:
            self._start_job(rep, now)
            return
        padd = sysmsg.PublisherReplayAdd(rep.id, rep.namespace, rep.start, rep.end, bc)
        self._emit(
            rep.publisher,
            sysmsg.publisher_sys(rep.publisher),
            sysmsg.publisher_replay_add([padd]),
            now,
        )

    # -- procurement by a Spark job (ranges too large to procure in process) ----------------
    def _start_job(self, rep: Replay, now: int) -> None:
        """The broadcaster knows the replay (its add went first): start the job, or, after a
        restart, hand the finished job's output to the broadcaster again."""
        if rep.job_output is not None:
            self._emit_job_add(rep, now)
            return
        pub = self.publications[rep.namespace]
        end = pub.head if rep.end is None else min(rep.end, pub.head)
        spec = ReplayJobSpec(
            rep.id,
            rep.namespace,
            rep.start,
            max(end, rep.start),
            rep.publisher.bytes,
            rep.filter.text if rep.filter else None,
            (rep.skip.mod, rep.skip.offset) if rep.skip else None,
            rep.end is None,
        )
        self.outbox.append(StartReplayJob(spec))
        if rep.status.tag == "pending":
            self._set_status(rep, ReplayState("running"), now)

    def _emit_job_add(self, rep: Replay, now: int) -> None:
        assert rep.job_output is not None
        self._emit(
            rep.broadcaster,
            sysmsg.broadcaster_sys(rep.broadcaster),
            sysmsg.broadcaster_replay_job_add([(rep.id, rep.job_output, rep.job_selected)]),
            now,
        )

    def _set_status(self, rep: Replay, state: ReplayState, now: int) -> None:
        if state != rep.status:
            self.journal.append(
                {"op": "status", "id": rep.id, "tag": state.tag, "value": state.value}, now
            )
        rep.status = state

    def job_finished(self, replay_id: int, result: Any, now: int) -> None:
        """The adapter reports a replay job's end: an object with ``output`` and ``selected``
        (the job's notifications are ready), or the exception it ended with."""
        rep = self.replays.get(replay_id)
        if rep is None or rep.status.final or rep.job_output is not None:
            return
        if rep.cancel_requested:
            self._set_status(rep, ReplayState("canceled", 0), now)
        elif isinstance(result, BaseException):
            self._set_status(rep, ReplayState("errored", f"replay job failed: {result}"), now)
        else:
            rep.job_output, rep.job_selected = str(result.output), int(result.selected)
            self.journal.append(
                {"op": "job", "id": rep.id, "output": rep.job_output, "selected": rep.job_selected},
                now,
            )
            self._emit_job_add(rep, now)

    def pump(self, now: int) -> bool:
        """After a restart: send the open replays' system messages again (idempotent)."""
        if not self._resend:
            return False
        for rid in self._resend:
            rep = self.replays[rid]
            if rep.job and rep.cancel_requested and rep.job_output is None:
                # its job died with the old process before handing anything over
                self._set_status(rep, ReplayState("canceled", 0), now)
                continue
            if rep.cancel_requested:
                self._emit_replay_remove(rep, now)
            else:
                self._emit_replay_add(rep, now)
        self._resend = []
        return True

    def _target(self, subscriber: Principal, publication_bc: Principal) -> Principal:
        home = self.homes.get(subscriber.bytes)
        if home is not None:
            return home
        if self.relay_replays and len(self.broadcasters) > 1:
            i = self.broadcasters.index(publication_bc)
            return self.broadcasters[(i + 1) % len(self.broadcasters)]
        return publication_bc

    def cancel_replay(self, caller: Principal, ids: list[int], now: int) -> list[Ok | Err | None]:
        if len(ids) > self.quotas.max_batch:
            return [Err("GenericBatchError", "batch too large")] * len(ids)
        return [self._cancel(caller, i, now) for i in ids]

    def _cancel(self, caller: Principal, rid: int, now: int) -> Ok | Err:
        if not self._rate_ok(caller, now):
            return _generic(E_RATE, "request rate exceeded")
        rep = self.replays.get(rid)
        if rep is None:
            return Err("NotFound")
        if rep.subscriber != caller:
            return Err("Unauthorized")
        if rep.status.final:
            return Err("CannotCancel", f"replay is already {rep.status}")
        if rep.cancel_requested:
            return Err("CannotCancel", "cancel already requested")
        # The status becomes canceled(n) when the publisher reports how many it sent.
        self.journal.append({"op": "cancel", "id": rid}, now)
        rep.cancel_requested = True
        self._emit_replay_remove(rep, now)
        return Ok(rid)

    def _emit_job_remove(self, rep: Replay, now: int) -> None:
        """A job replay: stop the job, and the broadcaster's delivery (which then reports
        ``canceled(n)``; a job stopped before its output was handed over: ``canceled(0)``)."""
        self.outbox.append(CancelReplayJob(rep.id))
        tsys = sysmsg.broadcaster_sys(rep.broadcaster)
        self._emit(rep.broadcaster, tsys, sysmsg.broadcaster_replay_remove([rep.id]), now)

    def _emit_replay_remove(self, rep: Replay, now: int) -> None:
        rid = rep.id
        if rep.job:
            self._emit_job_remove(rep, now)
            return
        # Publisher first: it stops enqueuing (ICRC-77 step 8); then the broadcaster drops
        # whatever is still in flight for this replay.
        self._emit(
            rep.publisher,
            sysmsg.publisher_sys(rep.publisher),
            sysmsg.publisher_replay_remove([rid]),
            now,
        )
        tsys = sysmsg.broadcaster_sys(rep.broadcaster)
        if rep.relay is not None:
            self._emit(
                rep.relay,
                sysmsg.broadcaster_sys(rep.relay),
                sysmsg.broadcaster_relay_remove([rid]),
                now,
            )
        self._emit(rep.broadcaster, tsys, sysmsg.broadcaster_replay_remove([rid]), now)
        if rep.relay is not None:
            self._emit(rep.broadcaster, tsys, sysmsg.broadcaster_relayer_remove([rid]), now)

    def replay_status(
        self, caller: Principal, updates: list[ReplayStatusUpdate], now: int
    ) -> list[Ok | Err]:
        return [self._status(caller, u, now) for u in updates]

    def _status(self, caller: Principal, u: ReplayStatusUpdate, now: int) -> Ok | Err:
        rep = self.replays.get(u.replay_id)
        if rep is None:
            return _generic(E_NOT_FOUND, f"no replay {u.replay_id}")
        if rep.publisher != caller and not (rep.job and rep.broadcaster == caller):
            return _generic(E_NOT_ASSIGNED, "only the assigned publisher reports status")
        cur, new = rep.status.tag, u.status.tag
        allowed = {
            "pending": {"running", "completed", "errored", "canceled"},
            "running": {"running", "completed", "errored", "canceled"},
        }
        if new not in allowed.get(cur, set()):
            return _generic(E_TRANSITION, f"replay {rep.id} is {rep.status}; cannot become {new}")
        if u.status != rep.status:
            self.journal.append(
                {"op": "status", "id": rep.id, "tag": new, "value": u.status.value}, now
            )
        rep.status = u.status
        return Ok(None)

    def get_replays(self, caller: Principal, args: GetReplays, now: int) -> list[Any]:
        """The caller's replays in id order, a page of at most ``take`` (≤ ``MAX_TAKE``) after
        ``prev``, with the stats ``filter.statistics`` asks for.

        ICRC-77 types ``prev`` as a principal without saying what it names. A replay is named
        by its id, so loglake's page cursor is ``replay_cursor(last id)``, an opaque principal
        holding that id (``next_replays_cursor`` builds it from a page); any other principal
        is a caller's mistake, answered with no replays rather than with the first page again."""
        take = min(args.take or DEFAULT_TAKE, MAX_TAKE)
        after = -1
        if args.prev is not None:
            cursor = cursor_replay_id(args.prev)
            if cursor is None:
                return []
            after = cursor
        out: list[Any] = []
        for rid in sorted(self.replays):
            if rid <= after:
                continue
            rep = self.replays[rid]
            if caller not in (rep.subscriber, rep.publisher, rep.broadcaster, rep.relay):
                continue
            if args.filter is not None and not all(
                self._slice_ok(rep, k, v) for k, v in args.filter.slices
            ):
                continue
            out.append(_with_statistics(rep.to_status(), args.filter))
            if len(out) >= take:
                break
        return out

    @staticmethod
    def _slice_ok(rep: Replay, kind: str, v: Any) -> bool:
        return {
            "BySubscriber": lambda: rep.subscriber == v,
            "ByPublisher": lambda: rep.publisher == v,
            "ByBroadcaster": lambda: v in (rep.broadcaster, rep.relay),
            "ByNamespace": lambda: rep.namespace == v,
        }.get(kind, lambda: False)()


DEFAULT_TAKE = 100
MAX_TAKE = 1000
"""``icrc77_get_replays`` answers at most this many a call; ``prev`` pages through the rest."""
_CURSOR_TAG = b"loglake:replay:"
_OPAQUE = b"\x01"  # the IC's opaque-id principal class (its last byte)


def replay_cursor(replay_id: int) -> Principal:
    """The ``prev`` that continues a listing after ``replay_id`` (see ``get_replays``)."""
    return Principal(_CURSOR_TAG + replay_id.to_bytes(8, "big") + _OPAQUE)


def cursor_replay_id(p: Principal) -> int | None:
    raw = p.bytes
    n = len(_CURSOR_TAG)
    if len(raw) != n + 9 or not raw.startswith(_CURSOR_TAG) or raw[-1:] != _OPAQUE:
        return None
    return int.from_bytes(raw[n : n + 8], "big")


def next_replays_cursor(page: list[Any]) -> Principal | None:
    """The ``prev`` for the page after ``page`` (None when it was empty)."""
    ids = [s.replay_id for s in page if s is not None]
    return replay_cursor(max(ids)) if ids else None


def _with_statistics(st: ReplayStatus, flt: OrchestrationFilter | None) -> ReplayStatus:
    """ICRC-72's ``OrchestrationFilter.statistics``: ``None`` no stats, ``All`` every one,
    ``List`` only those named. Without a filter a status carries every stat."""
    if flt is None or flt.statistics == "All":
        return st
    keep = set(flt.statistics_list) if flt.statistics == "List" else set()
    return dataclasses.replace(st, stats=[(k, v) for k, v in st.stats if k in keep])
