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
caller has no address          ``GenericError`` code 5
memo > 32 B, bad config,       ``ImproperConfig``
from > to
no icrc77-capable publisher    ``GenericError`` code 3
more events than the cap       ``RangeTooLarge``
concurrent replays quota       ``GenericError`` code 1
price not covered              ``PaymentRequired``
=============================  =================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from icp_principal import Principal

from loglake.events import sysmsg
from loglake.events.actions import (
    AppendEvents,
    Call,
)
from loglake.events.filters import (
    ImproperConfig,
    parse_replay_config,
    parse_subscription_config,
)
from loglake.events.identity import ANONYMOUS
from loglake.events.journal import Journal
from loglake.events.ledger import Ledger, LedgerError, account
from loglake.events.messages import (
    C_CAPABLE,
    C_PRICING,
    C_REPLAY,
    C_SUBS_ALLOWED,
    C_SUBS_DISALLOWED,
    PENDING,
    Err,
    Ok,
    Registration,
    ReplayRegistration,
)
from loglake.events.orchestrator_replays import (
    DEFAULT_TAKE,
    MAX_TAKE,
    ReplayScheduling,
    cursor_replay_id,
    next_replays_cursor,
    replay_cursor,
)
from loglake.events.orchestrator_state import (
    DEFAULT_JOB_THRESHOLD,
    E_LEDGER,
    E_NO_ADDRESS,
    E_NOT_CAPABLE,
    E_QUOTA,
    E_RATE,
    HEAD_KEY,
    PROGRESS_KEY,
    Publication,
    Quotas,
    RateWindows,
    Replay,
    ReplayTable,
    Subscription,
    SubscriptionTable,
    _count,
    _generic,
    _principals,
)
from loglake.events.resend import Resender
from loglake.events.role import RateLimited, Role, SysEmitter
from loglake.streams.api import check_stream_name
from loglake.wire import icrc16
from loglake.wire.icrc16 import Value, map_get

__all__ = [
    "DEFAULT_JOB_THRESHOLD",
    "DEFAULT_TAKE",
    "HEAD_KEY",
    "MAX_TAKE",
    "PROGRESS_KEY",
    "Orchestrator",
    "Publication",
    "Quotas",
    "Replay",
    "Subscription",
    "cursor_replay_id",
    "next_replays_cursor",
    "replay_cursor",
]


MAX_HEAD = 2**64
"""The largest head a Publisher may report: one past the last u64 stream index."""


def _anyone(p: Principal) -> bool:
    return True


class Orchestrator(ReplayScheduling, Role):
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
        self.subscriptions = SubscriptionTable()
        self.subscription_counts: dict[bytes, int] = {}
        """Subscriber principal bytes → subscriptions held, so that the quota
        (``Quotas.max_subscriptions_per_subscriber``) is checked without a scan."""
        self.publication_counts: dict[bytes, int] = {}
        """Publisher principal bytes → publications held, for
        ``Quotas.max_publications_per_publisher``."""
        self.replays = ReplayTable()
        self._announced: dict[str, Principal] = {}
        """Namespace → the broadcaster this core told of the namespace's subscriptions (on the
        publication's first registration, or its first again since this core was rebuilt from
        its journal: ``_register_publication``)."""
        q = self.quotas
        self._requests = RateWindows(q.max_requests_per_window, q.window_ns, q.max_rate_principals)
        self._queries = RateWindows(q.max_queries_per_window, q.window_ns, q.max_rate_principals)
        """Each principal's ``icrc77_get_replays`` calls in the window (``_requests``: its
        registrations and cancels); ended windows are forgotten."""
        self._next_pub = self._next_sub = self._next_replay = 1
        self.journal = Journal(self.outbox, journal_name)
        self._resend: list[int] = []
        self.resender = Resender()
        """System notifications whose call failed, sent again (a lost replay add would leave
        the replay pending for good)."""
        self.reachable: Callable[[Principal], bool] = _anyone
        """Whether the adapter can call a principal (the HTTP server: its directory lists it;
        the in-process network: it was added). A replay is refused for a subscriber it cannot
        reach (``_register_replay``). Anyone by default, as on the IC, where a principal is
        its own address."""
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
        spender, amount, expected, expires_at, fee = arg  # codec.approve_from
        ledger = self.ledger
        if ledger is None:
            return _generic(E_LEDGER, "no ledger configured")
        # ICRC-2: a fee set must be the ledger's; an approval already expired is refused; with
        # expected_allowance, the allowance must be that now (else AllowanceChanged)
        if fee is not None and fee != ledger.fee:
            return Err("BadFee", {"expected_fee": ledger.fee})
        if expires_at is not None and expires_at <= now:
            return Err("Expired", {"ledger_time": now})
        if expires_at is not None:  # refused, not dropped: it would never expire here
            return _generic(E_LEDGER, "the embedded ledger keeps no allowance expiry")
        current = ledger.allowance(account(caller), account(spender))
        if expected is not None and expected != current:
            return Err("AllowanceChanged", {"current_allowance": current})
        try:
            return Ok(ledger.approve(account(caller), account(spender), amount, now))
        except LedgerError as e:
            if e.kind == "InsufficientFunds":
                return Err("InsufficientFunds", {"balance": ledger.balance_of(account(caller))})
            return _generic(E_LEDGER, str(e))

    # -- system messages ---------------------------------------------------------------------
    def _emit(self, target: Principal, namespace: str, data: Value, now: int) -> None:
        """A system notification to ``target``, its copy kept in ``namespace``'s stream. One
        to a publisher or a subscriber is unordered but waits (``Call.waits``): it leaves once
        the calls before it are answered (the broadcaster first), and the calls queued after
        it do not wait for its answer, so they may reach their targets first (a subscriber
        that answers slowly may hear of a replay's relay after the relay's first events: it
        refuses them until then, and they stay unconfirmed). Why: a publisher or subscriber
        that took the call and answered slowly, or never (each of the resends then waiting
        the call timeout), held up every call of the orchestrator, to every role. Broadcasters
        (the operator's own) get ordered calls."""
        n = self.sys.notification(namespace, data, now)
        self.outbox.append(AppendEvents(namespace, [icrc16.encode(data)]))  # the audit copy
        apart = namespace in (sysmsg.subscriber_sys(target), sysmsg.publisher_sys(target))
        call = Call(target, "icrc72_handle_notification", [n], ordered=not apart, waits=apart)
        self.outbox.append(call)

    def _rate_ok(self, caller: Principal, now: int) -> bool:
        return self._requests.admit(caller.bytes, now)

    def _query_rate(self, caller: Principal, now: int) -> None:
        """Count an ``icrc77_get_replays`` call; :class:`RateLimited` over the caller's
        ``max_queries_per_window``."""
        q = self.quotas
        if not self._queries.admit(caller.bytes, now):
            wait = self._queries.wait_ns(caller.bytes, now)
            raise RateLimited(
                f"more than {q.max_queries_per_window} icrc77_get_replays calls a window",
                wait / 1e9,
            )

    # -- ICRC-72 -----------------------------------------------------------------------------
    def register_publication(
        self, caller: Principal, regs: list[Registration], now: int
    ) -> list[Ok | Err | None]:
        if len(regs) > self.quotas.max_batch:
            return [Err("GenericBatchError", "batch too large")] * len(regs)
        told: set[str] = set()  # the namespaces this call announced (one item a namespace)
        return [self._register_publication(caller, r, now, told) for r in regs]

    def _register_publication(
        self, caller: Principal, r: Registration, now: int, told: set[str]
    ) -> Ok | Err:
        if caller == ANONYMOUS:
            return Err("Unauthorized")
        q = self.quotas
        if not self._rate_ok(caller, now):  # each one is kept, journalled and announced twice
            return _generic(E_RATE, f"more than {q.max_requests_per_window} requests a window")
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
            if self.publication_counts.get(caller.bytes, 0) >= q.max_publications_per_publisher:
                return _generic(
                    E_QUOTA, f"at most {q.max_publications_per_publisher} publications a publisher"
                )
            _count(self.publication_counts, caller)
            bc = self.broadcasters[len(self.publications) % len(self.broadcasters)]
            pub = Publication(self._next_pub, r.namespace, caller, bc, r.config)
            self._next_pub += 1
        else:
            pub = existing
            pub.config = r.config
        self.journal.publication(pub, now)
        self.configure_publication(pub)
        self.publications[r.namespace] = pub
        if r.namespace in told:  # the same namespace again in this call: told already
            return Ok(pub.id)
        told.add(r.namespace)
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
        if self._announced.get(pub.namespace) != bc:
            # New, its broadcaster changed, or the first registration since this core was
            # rebuilt from its journal (a restarted or taken-over node's broadcaster is new and
            # knows no subscription): its subscriptions go to its broadcaster and subscribers.
            # Not on every registration: each re-registration sent every subscription again,
            # two calls each (1,000 subscriptions, one call of 100 re-registrations: 200,200
            # calls queued, 47 s of the event loop).
            self._announced[pub.namespace] = bc
            for s in self.subscriptions.by_namespace.get(pub.namespace, {}).values():
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
        """``icrc72_update_publication``: :data:`HEAD_KEY` and :data:`PROGRESS_KEY` only. A
        call journals at most one record per namespace (its head) and per replay (its sent
        count), the last value: one record per item let a call of 100 ever-larger heads write
        100 records. A head is a stream index: past 2**64 it is ``ImproperConfig`` (a head of
        ~1,000 octets made each record that long)."""
        if len(updates) > self.quotas.max_batch:  # as every other batch method
            return [Err("GenericBatchError", "batch too large")] * len(updates)
        out: list[Any] = []
        heads: dict[str, int] = {}
        sent: dict[int, Replay] = {}
        for ns, key, value in updates:
            pub = self.publications.get(ns)
            if pub is None or pub.publisher != caller:
                out.append(Err("Unauthorized"))
            elif key == HEAD_KEY and "Nat" in value and value["Nat"] <= MAX_HEAD:
                if value["Nat"] > pub.head:
                    heads[ns] = pub.head = value["Nat"]
                out.append(Ok(True))
            elif key == PROGRESS_KEY and self._progress(caller, ns, value, sent):
                out.append(Ok(True))
            else:
                out.append(Err("ImproperConfig", f"unsupported update key {key!r}"))
        for ns, head in heads.items():
            self.journal.append({"op": "head", "ns": ns, "head": head}, now)
        for rep in sent.values():
            self.journal.append({"op": "sent", "id": rep.id, "sent": rep.sent}, now)
        return out

    def _progress(self, caller: Principal, ns: str, value: Value, sent: dict[int, Replay]) -> bool:
        items = value.get("Array") if isinstance(value, dict) else None
        if not items or len(items) != 2 or not all("Nat" in i for i in items):
            return False
        rep = self.replays.get(items[0]["Nat"])
        if rep is None or rep.publisher != caller or rep.namespace != ns:
            return False
        if items[1]["Nat"] > rep.sent:
            rep.sent = items[1]["Nat"]
            sent[rep.id] = rep
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
        q = self.quotas
        if not self._rate_ok(caller, now):  # each one is kept and journalled
            return _generic(E_RATE, f"more than {q.max_requests_per_window} requests a window")
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
            if self.subscription_counts.get(caller.bytes, 0) >= q.max_subscriptions_per_subscriber:
                return _generic(
                    E_QUOTA,
                    f"at most {q.max_subscriptions_per_subscriber} subscriptions a subscriber",
                )
            _count(self.subscription_counts, caller)
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
        if not self.reachable(caller):
            # Found from outside: four fresh keys, in no directory, each subscribed and took 4
            # replays of [0, null) on a 300,100-event namespace: its 16 concurrent replays were
            # theirs for 30-40 s, an honest subscriber refused ("too many concurrent replays
            # for this namespace"), and the Publisher read and sent 4.8 M events nobody could
            # receive. ICRC-77 ("Authorization and Policy") is silent on where a subscriber is
            # reached (on the IC a principal is its address, so the reference never asks);
            # here a subscriber the directory does not list receives nothing, so its replay is
            # pure waste and is refused.
            return _generic(
                E_NO_ADDRESS,
                f"no delivery address for subscriber {caller}: the orchestrator's directory "
                "does not list it, so no replayed event could reach it",
            )
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
        if r.start > pub.head or (r.end is not None and r.end > pub.head):
            # ICRC-77: the orchestrator validates range bounds. It prices and caps a replay
            # by the events it knows of (its Publisher reports the head on registering and
            # after every publish): a range past them was delivered unpriced and uncapped
            shown = "null" if r.end is None else r.end
            have = f"its events are 0..{pub.head - 1}" if pub.head else "it has no events"
            return Err(
                "ImproperConfig",
                f"range [{r.start}, {shown}) is past the end of {r.namespace}: {have}",
            )
        stop = pub.head if r.end is None else r.end
        expected = stop - r.start
        if expected > q.max_events_per_replay:
            return Err(
                "RangeTooLarge",
                f"{expected} events requested; at most {q.max_events_per_replay} a replay",
            )
        if self.replays.active(lambda x: x.subscriber == caller) >= q.max_concurrent_per_subscriber:
            return _generic(E_QUOTA, "too many concurrent replays for this subscriber")
        if (
            self.replays.active(lambda x: x.namespace == r.namespace)
            >= q.max_concurrent_per_namespace
        ):
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
