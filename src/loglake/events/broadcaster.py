"""The ICRC-72 Broadcaster, with its ICRC-77 replay routing (sans-I/O).

ICRC-72 candidate "Broadcaster Update Functions": ``icrc72_publish`` takes events from the
namespace's Publisher and fans each out as an ``EventNotification`` to every subscriber whose
subscription is not stopped and whose filter and skip keep it (loglake.events.filters);
``icrc72_confirm_notifications`` records confirmations. Headers are append-only: we add
``icrc72:broadcaster:received`` (candidate "Event Headers") and keep the Publisher's.

ICRC-77 step 6: an event carrying ``icrc77:replay:id`` is a replayed event; it goes to that
replay's subscriber only, through the replay's filter and skip, and is dropped when the replay
is unknown or removed (cancel). Replay assignments arrive as ``icrc77:broadcaster:replay:add``
/ ``…:remove`` on ``icrc72:broadcaster:sys:<principal>`` from the orchestrator (and we tell the
subscriber with ``icrc77:subscriber:replay:add`` / ``…:remove``).

Relay tier (ICRC-77 "Control Plane": ``icrc77:broadcaster:replay_relay:add|remove``,
``…:replay_relayer:add|remove``): when the subscriber is served by another broadcaster than the
publication's, the orchestrator makes the publication's broadcaster the replay's *relay*.
Events flow Publisher → relay → target broadcaster → Subscriber. The relay accepts the replay's
events from its Publisher only, applies the replay's filter and skip (so dropped events do not
cross the second hop), answers the Publisher ``Ok([])`` and forwards them with
``icrc72_publish`` to the target, unchanged (headers are append-only and the target adds its own
``received``). The target accepts a replay's events from the relay the orchestrator named in
``replay_relayer:add`` (or from the Publisher when there is no relay). Back-pressure crosses the
hop: the relay keeps at most ``relay_window`` forwarded events unanswered per replay and answers
``Busy`` beyond that; events the target answers ``Busy`` are resent by the relay's ``pump``.

Back-pressure: a subscriber with more than ``max_unconfirmed`` unconfirmed notifications makes
``icrc72_publish`` answer ``Busy`` for events that would go to it; the Publisher sends them again
later (live events too: ``loglake.events.live``). ICRC-72 says no more, and a subscriber that
stopped confirming would then hold every other subscriber of its namespaces back for good; so a
subscriber whose window has been full for ``stall_ns`` (30 s) is *stalled*: live events skip it
(a warning says so, once) until it is heard from again (a confirmation, its subscription
registered again), and it gets what it missed with an ICRC-77 replay (its event ids show the
gap). Replays to it still wait for it (``Busy``).

Notification calls that fail (the subscriber restarting) are sent again with back-off for about
a minute (``NOTIFY_ATTEMPTS``), then given up: their notifications leave the subscriber's window
(it gets the events with a replay) and it is stalled, one publish tried on it each ``stall_ns``
(a probe: it comes back when it takes one). A call that timed out is not sent again and its
subscriber is stalled at once, without probes: it is hung, and each call to it would wait
``server.CALL_TIMEOUT_S``. Notification calls are unordered (``Call.ordered``): a subscriber
slow to answer holds up no call to anyone else. A resent call may arrive twice; the subscriber
deduplicates by event id.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from icp_principal import Principal

from loglake.events import sysmsg
from loglake.events.actions import ReadJobOutput, StorageAction
from loglake.events.fastcodec import (
    EncodedNotifications,
    EventBatch,
    PublishResults,
    join_notifications,
)
from loglake.events.filters import Filter, Skip, parse_subscription_config
from loglake.events.messages import (
    EVENT_OVERHEAD,
    H_REPLAY_ID,
    MAX_MESSAGE_BYTES,
    Err,
    Event,
    EventNotification,
    Ok,
    ReplayState,
    ReplayStatusUpdate,
    by_size,
    size_slices,
)
from loglake.events.resend import CAP_NS, FIRST_NS, Resender
from loglake.events.role import Call, Role, SysEmitter, check_positive
from loglake.wire.icrc16 import RawValue, Value, map_get

log = logging.getLogger("loglake.events")

H_RECEIVED = "icrc72:broadcaster:received"
MAX_NOTIFY_BYTES = 2 * MAX_MESSAGE_BYTES
"""An ``icrc72_handle_notification`` call of a publish's events is cut at this many bytes of
them (each counted with ``EVENT_OVERHEAD`` besides its bytes in the publish). Why: the
notifications of a call are ~60% longer than its events (id, ``received``) and a publisher
other than loglake's may send up to the body limit (8 MiB); the subscriber refused the whole
call (413). Twice the Publisher's 1 MB budget, the IC's message cap: its calls stay one each."""


@dataclass
class Route:
    subscriber: Principal
    filter: Filter | None = None
    skip: Skip | None = None
    stopped: bool = False

    def keeps(self, e: Event) -> bool:
        if self.stopped:
            return False
        if self.skip is not None and not self.skip.keeps(e.event_id):
            return False
        return self.filter is None or self.filter.matches(e.data)


@dataclass
class JobDelivery:
    """A replay procured by a Spark job: its notifications are read from ``output`` in order."""

    output: str
    selected: int
    offset: int = 0
    reading: bool = False
    done: bool = False


@dataclass
class ReplayRoute(Route):
    namespace: str = ""
    publisher: Principal | None = None
    delivered: int = 0
    relay: Principal | None = None
    """The relay the events come through; ``None`` or this broadcaster: from the Publisher."""
    relayers: set[bytes] = field(default_factory=set)
    job: JobDelivery | None = None


@dataclass
class RelayRoute:
    """This broadcaster relays replay ``replay_id`` from ``publisher`` to ``target``."""

    replay_id: int
    namespace: str
    target: Principal
    publisher: Principal
    filter: Filter | None = None
    skip: Skip | None = None
    inflight: int = 0
    retry: deque[Event] = field(default_factory=deque)
    forwarded: int = 0
    failures: int = 0
    """Rounds of forwards that failed in a row (the target unreachable; the calls in flight
    when it went fail together, one round); reset by one answered."""
    due: int = 0
    """After failures or a reply all ``Busy``: the clock time (ns) before which ``retry`` is
    not resent."""
    busy_delay: int = 0
    """The next back-off after a reply all ``Busy`` (0: none yet; doubles to ``CAP_NS``)."""

    def keeps(self, e: Event) -> bool:
        if self.skip is not None and not self.skip.keeps(e.event_id):
            return False
        return self.filter is None or self.filter.matches(e.data)


@dataclass(slots=True)
class Pending:
    """An unconfirmed notification's subscriber (one object may stand for every notification
    of a batch to that subscriber: only the subscriber is checked on confirmation)."""

    subscriber: Principal
    namespace: str


@dataclass
class BroadcasterStats:
    published: int = 0
    notified: int = 0
    confirmed: int = 0
    dropped_replay: int = 0
    busy: int = 0
    relayed: int = 0
    relay_failed: int = 0
    stalled_skips: int = 0
    """Live events a stalled subscriber was not notified of (one per event and subscriber)."""
    notify_dropped: int = 0
    """Notifications whose call failed on every attempt (left the subscriber's window)."""
    routes: dict[str, int] = field(default_factory=dict)


STALL_NS = 30_000_000_000
"""A subscriber whose window of unconfirmed notifications has been full this long is stalled:
live events stop waiting for it (module docstring)."""
NOTIFY_ATTEMPTS = 12
"""Sends of a notification call at most: 11 resends after 0.1 s doubling to 10 s, ~53 s."""
RELEASE_AFTER_STALLS = 10
"""A stalled subscriber whose window has stayed full this many ``stall_ns`` (5 minutes: it
confirms nothing, crashed after taking its notifications, say) has them given up
(``notify_dropped``): its replays, which wait for room in its window, can then run (it gets
the gap with one)."""
RELAY_ATTEMPTS = 12
"""Failed forwards in a row a relay resends its events after (the same back-off), then gives
them up (``relay_failed``, a warning): the Publisher was answered ``Ok`` for them already."""


class Broadcaster(Role):
    def __init__(
        self,
        principal: Principal,
        orchestrator: Principal,
        max_unconfirmed: int = 200_000,
        relay_window: int = 10_000,
        relay_batch: int = 500,
        stall_ns: int = STALL_NS,
    ) -> None:
        super().__init__(principal)
        check_positive(relay_window=relay_window, relay_batch=relay_batch, stall_ns=stall_ns)
        self.stall_ns = stall_ns
        self.full_since: dict[bytes, int] = {}
        """subscriber → when an event was first held back by its full window (cleared when it
        confirms)."""
        self.stalled: dict[bytes, int | None] = {}
        """Subscribers live events skip, until they confirm (warned of once a stall) → when a
        publish may go to it again as a probe (None: not before it confirms)."""
        self.notify_resender = Resender(max_attempts=NOTIFY_ATTEMPTS)
        self.orchestrator = orchestrator
        self.max_unconfirmed = max_unconfirmed
        self.relay_window = relay_window
        self.relay_batch = relay_batch
        self.relays: dict[int, RelayRoute] = {}
        self.sys = SysEmitter(principal)
        self.publishers: dict[str, Principal] = {}
        self.routes: dict[str, dict[bytes, Route]] = {}
        self.replays: dict[int, ReplayRoute] = {}
        self.relayer_routes: dict[bytes, int] = {}
        """Relay principal → how many routes of ``replays`` name it among their ``relayers``
        (``_relayer_of`` without looking at every replay held)."""
        self.pending: dict[int, Pending] = {}
        self.unconfirmed: dict[bytes, int] = {}
        self.next_notification = 1
        self.stats = BroadcasterStats()
        self.resender = Resender(max_attempts=None)
        """A job replay's status reports that failed, sent again until they pass (a lost
        final one left the replay running at the orchestrator for good), as the Publisher's."""
        self.methods = {
            "icrc72_publish": self.publish,
            "icrc72_confirm_notifications": self.confirm_notifications,
            "icrc72_handle_notification": self.handle_notification,
        }

    # -- control plane ---------------------------------------------------------------------
    def handle_notification(
        self, caller: Principal, notes: list[EventNotification], now: int
    ) -> int:
        accepted = 0
        for n in notes:
            if caller != self.orchestrator or n.namespace != sysmsg.broadcaster_sys(self.principal):
                continue  # only the orchestrator configures us, only on our namespace
            for key, payload in sysmsg.entries(n.data):
                self._apply(key, payload, now)
            accepted += 1
        return accepted

    def _apply(self, key: str, payload: Any, now: int) -> None:
        if key == sysmsg.BROADCASTER_PUBLICATION_ADD:
            for ns, pub in sysmsg.read_pairs(payload, key, "Text"):
                self.publishers[ns] = pub
        elif key == sysmsg.BROADCASTER_SUBSCRIBER_ADD:
            for ns, sub, cfg in sysmsg.read_subscriber_add(payload):
                f, s, stopped = parse_subscription_config(cfg)
                self.routes.setdefault(ns, {})[sub.bytes] = Route(sub, f, s, stopped)
                self._unstalled(sub.bytes)  # subscribed again: heard from
        elif key == sysmsg.BROADCASTER_REPLAY_ADD:
            for a in sysmsg.read_broadcaster_replay_add(payload):
                if a.replay_id in self.replays:
                    continue  # repeated (an orchestrator resends after a restart): keep state
                f = Filter.parse(a.filter) if a.filter is not None else None
                self.replays[a.replay_id] = ReplayRoute(
                    a.subscriber, f, a.skip, False, a.namespace, a.publisher, relay=a.relay
                )
                self._to_subscriber(
                    a.subscriber,
                    sysmsg.subscriber_replay_add([(a.replay_id, self.principal)]),
                    now,
                )
        elif key == sysmsg.BROADCASTER_REPLAY_REMOVE:
            for rid in sysmsg.read_nested_ids(payload, key):
                r = self.replays.pop(rid, None)
                if r is not None:
                    self._drop_relayers(r)
                    self._to_subscriber(r.subscriber, sysmsg.subscriber_replay_remove([rid]), now)
                    if r.job is not None and not r.job.done:  # we were delivering: report
                        r.job.done = True
                        self._report(rid, ReplayState("canceled", r.delivered))
        elif key == sysmsg.BROADCASTER_REPLAY_JOB_ADD:
            for rid, output, selected in sysmsg.read_replay_job_add(payload):
                route = self.replays.get(rid)
                if route is not None and route.job is None:  # a repeated add: keep going
                    route.job = JobDelivery(output, selected)
        elif key == sysmsg.BROADCASTER_RELAY_ADD:
            for ra in sysmsg.read_relay_add(payload):
                f = Filter.parse(ra.filter) if ra.filter is not None else None
                self.relays.setdefault(
                    ra.replay_id,
                    RelayRoute(ra.replay_id, ra.namespace, ra.target, ra.publisher, f, ra.skip),
                )
        elif key == sysmsg.BROADCASTER_RELAY_REMOVE:
            for rid in sysmsg.read_ids(payload, key):
                self.relays.pop(rid, None)  # in-flight forwards are answered and dropped
        elif key == sysmsg.BROADCASTER_RELAYER_ADD:
            ra2 = sysmsg.read_relayer_add(payload)
            route = self.replays.get(ra2.replay_id)
            if route is None or route.namespace != ra2.namespace:
                raise sysmsg.SysMessageError(
                    f"{key}: replay {ra2.replay_id} on {ra2.namespace!r} is not assigned here"
                )
            if ra2.relay.bytes not in route.relayers:
                route.relayers.add(ra2.relay.bytes)
                n = self.relayer_routes
                n[ra2.relay.bytes] = n.get(ra2.relay.bytes, 0) + 1
        elif key == sysmsg.BROADCASTER_RELAYER_REMOVE:
            for rid in sysmsg.read_ids(payload, key):
                route = self.replays.get(rid)
                if route is not None:
                    self._drop_relayers(route)
        else:
            raise sysmsg.SysMessageError(f"unknown broadcaster system key {key!r}")

    def _to_subscriber(self, sub: Principal, data: Value, now: int) -> None:
        n = self.sys.notification(sysmsg.subscriber_sys(sub), data, now)
        self._notify(sub, [n], ())

    def _notify(self, sub: Principal, notes: Any, ids: Sequence[int]) -> None:
        """An ``icrc72_handle_notification`` call of ``notes`` (their notification ids ``ids``:
        released from the window if the call fails for good). Unordered: a subscriber slow to
        answer holds up no other call of this broadcaster (``Call.ordered``)."""
        call = Call(sub, "icrc72_handle_notification", notes, token=("notify", ids), ordered=False)
        self.outbox.append(call)

    # -- data plane ------------------------------------------------------------------------
    def publish(
        self, caller: Principal, events: Sequence[Event], now: int
    ) -> Sequence[Ok | Err | None]:
        if type(events) is EventBatch:
            fast = self._publish_batch(caller, events, now)
            if fast is not None:
                return fast
        batches: dict[bytes, tuple[Principal, list[EventNotification]]] = {}
        forwards: dict[int, list[Event]] = {}
        out: list[Ok | Err | None] = []
        # A batch's events share their headers list (the decoder, procure) and namespace: where
        # they go depends only on those, the caller and routing state a publish does not change,
        # so it is worked out once per (headers, namespace), and the notifications share one
        # headers list (the encoder then writes it once).
        resolved: dict[tuple[int, str], tuple[Any, ...]] = {}
        keep = []  # header lists stay alive while their id() is part of a key of resolved
        for e in events:
            k = (id(e.headers), e.namespace)
            r = resolved.get(k)
            if r is None:
                keep.append(e.headers)
                r = resolved[k] = self._resolve(caller, e, now)
            kind = r[0]
            if kind == "route":
                out.append(self._deliver(e, r[1], r[2], r[3], batches, now, r[4]))
            elif kind == "relay":
                out.append(self._relay_one(r[1], e, forwards))
            elif kind == "drop":
                self.stats.dropped_replay += 1
                out.append(Ok([]))  # canceled or unknown replay: nothing more is enqueued
            else:
                out.append(r[1])
        for sub, notes in batches.values():
            for chunk in by_size(notes, MAX_NOTIFY_BYTES):
                self._notify(sub, chunk, [n.notification_id for n in chunk])
        for rid, evs in forwards.items():
            self._forward(self.relays[rid], evs)
        return out

    def _publish_batch(
        self, caller: Principal, batch: EventBatch, now: int
    ) -> PublishResults | list[Ok | Err | None] | None:
        """A batch whose events share source, headers and namespace (a replay's, as
        ``procure`` makes them) goes where its first event goes, so it is routed once; to
        targets that keep every event its notifications are spliced from the batch's bytes
        (:meth:`EventBatch.notifications`: no event decoded, none re-encoded) — the same
        messages, numbers and state as event by event. None: go event by event (a relay, a
        filter, a skip, a stopped target)."""
        n = len(batch)
        proto = Event(0, None, 0, batch.namespace, _NO_DATA, batch.source, batch.headers)
        r = self._resolve(caller, proto, now)
        kind = r[0]
        if kind == "err":
            return [r[1]] * n
        if kind == "drop":
            self.stats.dropped_replay += n
            return [Ok([]) for _ in range(n)]
        if kind != "route" or not r[2]:
            return None
        targets: list[Route] = r[1]
        unconfirmed = self.unconfirmed
        room = min(
            (self.max_unconfirmed - unconfirmed.get(t.subscriber.bytes, 0) for t in targets),
            default=n,
        )
        delivered = max(0, min(n, room))
        if delivered < n:
            self._held_back(targets, now)
        self.stats.busy += n - delivered
        self.stats.published += delivered
        self.stats.stalled_skips += delivered * r[4]
        per = len(targets)
        first = self.next_notification
        self.next_notification += delivered * per
        if delivered:
            sizes = batch.event_bytes()[:delivered] + EVENT_OVERHEAD
            cuts = (
                [(0, delivered)]
                if sizes.sum() <= MAX_NOTIFY_BYTES
                else size_slices(sizes, MAX_NOTIFY_BYTES)
            )
            for j, t in enumerate(targets):
                for lo, hi in cuts:
                    data = batch.notifications(r[3], None, first + j + lo * per, per, hi - lo, lo)
                    ids = range(first + j + lo * per, first + j + hi * per, per)
                    self._notify(t.subscriber, EncodedNotifications(data, hi - lo), ids)
                p = Pending(t.subscriber, batch.namespace)
                self.pending.update(
                    dict.fromkeys(range(first + j, first + delivered * per, per), p)
                )
                key = t.subscriber.bytes
                unconfirmed[key] = unconfirmed.get(key, 0) + delivered
                if unconfirmed[key] >= self.max_unconfirmed:  # full from now: the stall clock
                    self.full_since.setdefault(key, now)
                if isinstance(t, ReplayRoute):
                    t.delivered += delivered
        self.stats.notified += delivered * per
        return PublishResults(n, delivered, first, per)

    def _resolve(self, caller: Principal, e: Event, now: int) -> tuple[Any, ...]:
        """Where events with ``e``'s headers and namespace go: ``("err", Err)``, ``("drop",)``,
        ``("relay", RelayRoute)`` or ``("route", targets, plain, headers, stalled)`` (``plain``:
        every target keeps every event — no stop, skip or filter; ``stalled``: subscribers of
        the namespace left out, ``_live_targets``)."""
        rid_v = map_get(e.headers, H_REPLAY_ID)
        if rid_v is None and self.publishers.get(e.namespace) != caller:
            return ("err", Err("Unauthorized"))
        if rid_v is not None:
            if "Nat" not in rid_v:
                return ("err", Err("ImproperId", f"{H_REPLAY_ID} must be #Nat"))
            rid = rid_v["Nat"]
            relay = self.relays.get(rid)
            if relay is not None and relay.namespace == e.namespace and relay.publisher == caller:
                return ("relay", relay)
            route = self.replays.get(rid)
            if (
                route is None
                or route.namespace != e.namespace
                or not self._replay_source(route, caller)
            ):
                if self.publishers.get(e.namespace) != caller and not self._relayer_of(caller):
                    return ("err", Err("Unauthorized"))
                return ("drop",)
            targets: list[Route] = [route]
            stalled = 0
        else:
            targets = self._live_targets(e.namespace, now)
            stalled = len(self.routes.get(e.namespace, ())) - len(targets)
        plain = all(not t.stopped and t.skip is None and t.filter is None for t in targets)
        headers = [*(e.headers or []), (H_RECEIVED, {"Nat": now})]
        return ("route", targets, plain, headers, stalled)

    def _deliver(
        self,
        e: Event,
        targets: list[Route],
        plain: bool,
        headers: list[Any],
        batches: dict[bytes, tuple[Principal, list[EventNotification]]],
        now: int,
        stalled: int,
    ) -> Ok | Err:
        if not plain:
            targets = [t for t in targets if t.keeps(e)]
        unconfirmed = self.unconfirmed
        for t in targets:
            if unconfirmed.get(t.subscriber.bytes, 0) >= self.max_unconfirmed:
                self.stats.busy += 1
                self._held_back(targets, now)
                return Err("Busy")
        self.stats.published += 1
        self.stats.stalled_skips += stalled
        ids = []
        for t in targets:
            nid = self.next_notification
            self.next_notification += 1
            n = EventNotification(
                nid,
                e.event_id,
                e.prev_event_id,
                e.timestamp,
                e.namespace,
                e.data,
                headers,
                e.source,
                t.filter.text if t.filter else None,
            )
            key = t.subscriber.bytes
            batches.setdefault(key, (t.subscriber, []))[1].append(n)
            self.pending[nid] = Pending(t.subscriber, e.namespace)
            unconfirmed[key] = unconfirmed.get(key, 0) + 1
            if unconfirmed[key] >= self.max_unconfirmed:  # full from now: the stall clock
                self.full_since.setdefault(key, now)
            if isinstance(t, ReplayRoute):
                t.delivered += 1
            ids.append(nid)
        self.stats.notified += len(ids)
        return Ok(ids)

    def _held_back(self, targets: list[Route], now: int) -> None:
        """An event was answered ``Busy``: the targets at their window are full since now
        (unless they were already)."""
        for t in targets:
            key = t.subscriber.bytes
            if self.unconfirmed.get(key, 0) >= self.max_unconfirmed:
                self.full_since.setdefault(key, now)

    def _live_targets(self, namespace: str, now: int) -> list[Route]:
        """The namespace's subscribers live events go to: all but the stalled ones (a stalled
        one with room in its window is tried once each ``stall_ns``: a probe)."""
        routes = self.routes.get(namespace, {})
        if not self.full_since and not self.stalled:
            return list(routes.values())
        out = []
        for t in routes.values():
            key = t.subscriber.bytes
            if key in self.stalled:
                probe = self.stalled[key]
                full = self.unconfirmed.get(key, 0) >= self.max_unconfirmed
                if probe is not None and now >= probe and not full:
                    self.stalled[key] = now + self.stall_ns
                    out.append(t)
                continue
            since = self.full_since.get(key)
            if since is not None and now - since >= self.stall_ns:
                why = f"its window has been full for {(now - since) / 1e9:.0f} s"
                self._stall(t.subscriber, why, now + self.stall_ns)
                continue
            out.append(t)
        return out

    def _stall(self, sub: Principal, why: str, probe: int | None) -> None:
        """Leave ``sub`` out of live events until it confirms; ``probe``: when a publish may go
        to it again (None: not before it confirms)."""
        key = sub.bytes
        if key not in self.stalled:
            self.stalled[key] = probe
            log.warning(
                "subscriber %s stalled (%s): live events go on without it until it confirms "
                "(it can replay the gap)",
                sub, why,
            )  # fmt: skip
        elif probe is None:
            self.stalled[key] = None

    def _unstalled(self, key: bytes) -> None:
        """The subscriber was heard from (a confirmation, its subscription again)."""
        self.full_since.pop(key, None)
        if self.stalled.pop(key, False) is not False:
            log.info("subscriber %s heard from again: live events go to it", Principal(key))

    def _replay_source(self, route: ReplayRoute, caller: Principal) -> bool:
        if route.relay is None or route.relay == self.principal:
            return route.publisher == caller
        return caller.bytes in route.relayers

    def _relayer_of(self, caller: Principal) -> bool:
        """``caller`` is named relay of some replay here (its late events are dropped, not
        refused). From ``relayer_routes``: looking at every replay held, once per headers list
        of a publish, let a stranger's call of 20,000 events with distinct replay ids hold the
        event loop 24 s over 2,000 replays."""
        return caller.bytes in self.relayer_routes

    def _drop_relayers(self, route: ReplayRoute) -> None:
        n = self.relayer_routes
        for who in route.relayers:
            if n[who] == 1:
                del n[who]
            else:
                n[who] -= 1
        route.relayers.clear()

    # -- relay tier --------------------------------------------------------------------------
    def _relay_one(self, relay: RelayRoute, e: Event, forwards: dict[int, list[Event]]) -> Ok | Err:
        if not relay.keeps(e):
            return Ok([])
        if relay.inflight + len(relay.retry) >= self.relay_window:
            self.stats.busy += 1
            return Err("Busy")
        relay.inflight += 1
        forwards.setdefault(relay.replay_id, []).append(e)
        return Ok([])

    def _forward(self, relay: RelayRoute, events: list[Event]) -> None:
        """``events`` to the target in calls of at most ``relay_batch`` events and of
        ``MAX_MESSAGE_BYTES`` of their data, as the Publisher cuts its own. Why the size too:
        events held back by ``Busy`` from several of the Publisher's calls are resent together,
        and 500 of 20 kB were one 10 MB call, refused (413) by the target's 8 MiB body limit;
        a failed forward is not resent, so none of them arrived."""
        for i in range(0, len(events), self.relay_batch):
            for chunk in by_size(events[i : i + self.relay_batch], MAX_MESSAGE_BYTES):
                self.outbox.append(
                    Call(relay.target, "icrc72_publish", chunk, token=("relay", relay.replay_id))
                )

    # -- replays procured by a Spark job (ranges too large to procure in process) ------------
    def _report(self, rid: int, state: ReplayState) -> None:
        self.outbox.append(
            Call(self.orchestrator, "icrc77_replay_status", [ReplayStatusUpdate(rid, state)])
        )

    def _pump_jobs(self) -> bool:
        queued = False
        for rid, route in self.replays.items():
            j = route.job
            if j is None or j.done or j.reading:
                continue
            room = self.max_unconfirmed - self.unconfirmed.get(route.subscriber.bytes, 0)
            if room <= 0:
                continue  # back-pressure: wait for confirmations
            j.reading = True
            limit = min(self.relay_batch, room)
            self.outbox.append(ReadJobOutput(j.output, j.offset, limit, token=rid))
            queued = True
        return queued

    def on_result(self, action: StorageAction, result: Any, now: int) -> None:
        if not isinstance(action, ReadJobOutput):
            return
        rid = action.token
        route = self.replays.get(rid)
        if route is None or route.job is None or route.job.done:
            return  # removed (cancel) while reading
        j = route.job
        j.reading = False
        if not result:
            j.done = True
            self._report(rid, ReplayState("completed", route.delivered))
            return
        first = self.next_notification
        self.next_notification += len(result)
        key = route.subscriber.bytes
        p = Pending(route.subscriber, route.namespace)
        self.pending.update(dict.fromkeys(range(first, first + len(result)), p))
        self.unconfirmed[key] = self.unconfirmed.get(key, 0) + len(result)
        route.delivered += len(result)
        j.offset += len(result)
        self.stats.notified += len(result)
        self.stats.published += len(result)
        sizes = [len(a) + len(b) + len(c) + 20 for _, a, b, c in result]  # 20: id, received
        for lo, hi in size_slices(sizes, MAX_MESSAGE_BYTES):
            data = join_notifications([(a, b, c) for _, a, b, c in result[lo:hi]], now, first + lo)
            notes = EncodedNotifications(data, hi - lo)
            self._notify(route.subscriber, notes, range(first + lo, first + hi))

    def _release(self, key: bytes, ids: Sequence[int]) -> None:
        """Notifications whose call failed for good leave the subscriber's window (those it
        confirmed meanwhile, from an earlier attempt that did arrive, are gone already)."""
        freed = 0
        for nid in ids:
            p = self.pending.get(nid)
            if p is not None and p.subscriber.bytes == key:
                del self.pending[nid]
                freed += 1
        if freed:
            self.unconfirmed[key] -= freed
            self.stats.notify_dropped += freed
            self.full_since.pop(key, None)  # room again (the caller stalls it)

    def _release_stalled(self, now: int) -> None:
        for key, since in list(self.full_since.items()):
            if key not in self.stalled or now - since < self.stall_ns * RELEASE_AFTER_STALLS:
                continue
            mine = [nid for nid, p in self.pending.items() if p.subscriber.bytes == key]
            log.warning(
                "subscriber %s confirmed nothing for %.0f s: its %d unconfirmed notifications "
                "are given up (it gets them with a replay)",
                Principal(key), (now - since) / 1e9, len(mine),
            )  # fmt: skip
            self._release(key, mine)

    def pump(self, now: int) -> bool:
        """Send failed status reports and notification calls again when due; resend relayed
        events the target answered ``Busy`` (when nothing else is queued); read on from replay
        jobs' outputs."""
        again = self.resender.due(now) + self.notify_resender.due(now)
        self.outbox.extend(again)
        if self.full_since:
            self._release_stalled(now)
        queued = self._pump_jobs() or bool(again)
        for relay in self.relays.values():
            if relay.retry and now >= relay.due:
                evs = list(relay.retry)
                relay.retry.clear()
                relay.inflight += len(evs)
                self._forward(relay, evs)
                queued = True
        return queued

    def on_reply(self, call: Call, reply: Any, now: int) -> None:
        if call.method == "icrc72_handle_notification" and call.token:
            if not isinstance(reply, BaseException):
                self.notify_resender.succeeded(call)
            elif isinstance(reply, TimeoutError):
                # the subscriber is hung: each call to it waits CALL_TIMEOUT_S, so it is
                # neither sent again nor probed: left out of live events until it confirms or
                # subscribes again
                self.notify_resender.forget(call)
                self._release(call.target.bytes, call.token[1])
                self._stall(call.target, "its notification call timed out", None)
            elif not self.notify_resender.failed(call, now, reply):
                self._release(call.target.bytes, call.token[1])
                # unreachable for a minute: probed each stall_ns rather than sent every event
                why = "its notification calls failed for a minute"
                self._stall(call.target, why, now + self.stall_ns)
            return
        if call.method == "icrc77_replay_status":
            if isinstance(reply, BaseException):
                self.resender.failed(call, now, reply)
            else:
                self.resender.succeeded(call)
            return
        if not call.token or call.token[0] != "relay":
            return
        relay = self.relays.get(call.token[1])
        if relay is None:
            return  # removed (cancel): whatever was in flight is dropped
        relay.inflight -= len(call.arg)
        if isinstance(reply, BaseException):
            # the target restarting, a timeout: sent again with back-off (it deduplicates
            # nothing, its subscriber does by event id); given up after RELAY_ATTEMPTS
            if now >= relay.due:  # one failure a round: the calls in flight fail together
                relay.failures += 1
            if getattr(reply, "retriable", True) and relay.failures < RELAY_ATTEMPTS:
                relay.retry.extend(call.arg)
                wait = min(FIRST_NS << (relay.failures - 1), CAP_NS)
                relay.due = now + wait
            else:
                self.stats.relay_failed += len(call.arg)
                log.warning(
                    "replay %d: %d relayed events given up after %d failed forwards to %s: %s",
                    relay.replay_id, len(call.arg), relay.failures, relay.target, reply,
                )  # fmt: skip
            return
        relay.failures = 0
        took = 0
        for e, res in zip(call.arg, reply, strict=False):
            if isinstance(res, Ok):
                took += 1
            elif isinstance(res, Err) and res.tag == "Busy":
                relay.retry.append(e)
            else:
                self.stats.relay_failed += 1
        relay.forwarded += took
        self.stats.relayed += took
        if took or not relay.retry:
            relay.busy_delay = 0
        else:  # all Busy: back off, as the Publisher does (resent at once, the two spun)
            relay.busy_delay = min(max(2 * relay.busy_delay, FIRST_NS), CAP_NS)
            relay.due = now + relay.busy_delay

    def confirm_notifications(
        self, caller: Principal, ids: list[int], now: int
    ) -> list[Ok | Err | None] | None:
        pending = self.pending
        key = caller.bytes
        held = self.unconfirmed.get(key, 0)
        if len(ids) > held + CONFIRM_SLACK:
            # Why: every id a subscriber may confirm is one of its own notifications pending
            # here, so a batch longer than those and the slack holds ids that are not; answered
            # item by item, a body of millions of ids any signed caller sends cost seconds on
            # the event loop and ~580 bytes of reply objects an id. Refused whole: every item
            # ``Unauthorized`` (one shared object, written once by the codec,
            # ``codec.uniform_results``: 3 octets an item), nothing confirmed.
            return [_REFUSED] * len(ids)
        results: list[Ok | Err | None] | None = None  # itemized only once one is refused
        done = 0
        for k, nid in enumerate(ids):
            p = pending.get(nid)
            if p is None or p.subscriber.bytes != key:
                if results is None:
                    results = [_OK] * k
                results.append(Err("NotFound") if p is None else Err("Unauthorized"))
                continue
            del pending[nid]
            done += 1
            if results is not None:
                results.append(_OK)
        if done:
            self.unconfirmed[key] -= done
            self.stats.confirmed += done
        if ids and (key in self.stalled or key in self.full_since):
            # heard from (even when every id was given up on here already: it was hung)
            self._unstalled(key)
        return results


CONFIRM_SLACK = 1024
"""Ids a confirmation may hold past the caller's pending notifications and still be answered
item by item. Why: a subscriber whose confirmation's reply was lost sends the batch again,
with new ids beside the ones already confirmed; those are answered ``NotFound`` each and the
new ones confirmed, not refused whole. The per-item work stays bounded by the broadcaster's
unconfirmed window (``--max-unconfirmed``) plus this."""
_OK = Ok(None)
_REFUSED = Err("Unauthorized")
_NO_DATA = RawValue(b"")
