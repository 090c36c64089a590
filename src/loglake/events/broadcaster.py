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

Back-pressure: a subscriber with more than ``max_unconfirmed`` unconfirmed notifications makes
``icrc72_publish`` answer ``Busy`` for events that would go to it; the Publisher retries later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from icp_principal import Principal

from loglake.events import sysmsg
from loglake.events.filters import Filter, Skip, parse_subscription_config
from loglake.events.messages import H_REPLAY_ID, Err, Event, EventNotification, Ok
from loglake.events.role import Call, Role, SysEmitter
from loglake.wire.icrc16 import map_get

H_RECEIVED = "icrc72:broadcaster:received"


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
class ReplayRoute(Route):
    namespace: str = ""
    publisher: Principal | None = None
    delivered: int = 0


@dataclass
class Pending:
    subscriber: Principal
    namespace: str
    event_id: int


@dataclass
class BroadcasterStats:
    published: int = 0
    notified: int = 0
    confirmed: int = 0
    dropped_replay: int = 0
    busy: int = 0
    routes: dict[str, int] = field(default_factory=dict)


class Broadcaster(Role):
    def __init__(
        self, principal: Principal, orchestrator: Principal, max_unconfirmed: int = 200_000
    ) -> None:
        super().__init__(principal)
        self.orchestrator = orchestrator
        self.max_unconfirmed = max_unconfirmed
        self.sys = SysEmitter(principal)
        self.publishers: dict[str, Principal] = {}
        self.routes: dict[str, dict[bytes, Route]] = {}
        self.replays: dict[int, ReplayRoute] = {}
        self.pending: dict[int, Pending] = {}
        self.unconfirmed: dict[bytes, int] = {}
        self.next_notification = 1
        self.stats = BroadcasterStats()
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

    def _apply(self, key: str, payload: object, now: int) -> None:
        if key == sysmsg.BROADCASTER_PUBLICATION_ADD:
            for ns, pub in sysmsg.read_pairs(payload, key, "Text"):
                self.publishers[ns] = pub
        elif key == sysmsg.BROADCASTER_SUBSCRIBER_ADD:
            for ns, sub, cfg in sysmsg.read_subscriber_add(payload):
                f, s, stopped = parse_subscription_config(cfg)
                self.routes.setdefault(ns, {})[sub.bytes] = Route(sub, f, s, stopped)
        elif key == sysmsg.BROADCASTER_REPLAY_ADD:
            for a in sysmsg.read_broadcaster_replay_add(payload):
                f = Filter.parse(a.filter) if a.filter is not None else None
                self.replays[a.replay_id] = ReplayRoute(
                    a.subscriber, f, a.skip, False, a.namespace, a.publisher
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
                    self._to_subscriber(r.subscriber, sysmsg.subscriber_replay_remove([rid]), now)
        else:
            raise sysmsg.SysMessageError(f"unknown broadcaster system key {key!r}")

    def _to_subscriber(self, sub: Principal, data: object, now: int) -> None:
        n = self.sys.notification(sysmsg.subscriber_sys(sub), data, now)  # type: ignore[arg-type]
        self.outbox.append(Call(sub, "icrc72_handle_notification", [n]))

    # -- data plane ------------------------------------------------------------------------
    def publish(self, caller: Principal, events: list[Event], now: int) -> list[Ok | Err | None]:
        batches: dict[bytes, tuple[Principal, list[EventNotification]]] = {}
        out: list[Ok | Err | None] = []
        for e in events:
            out.append(self._publish_one(caller, e, now, batches))
        for sub, notes in batches.values():
            self.outbox.append(Call(sub, "icrc72_handle_notification", notes))
        return out

    def _publish_one(self, caller, e: Event, now: int, batches) -> Ok | Err:
        if self.publishers.get(e.namespace) != caller:
            return Err("Unauthorized")
        rid_v = map_get(e.headers, H_REPLAY_ID)
        if rid_v is not None:
            if "Nat" not in rid_v:
                return Err("ImproperId", f"{H_REPLAY_ID} must be #Nat")
            route = self.replays.get(rid_v["Nat"])
            if route is None or route.namespace != e.namespace or route.publisher != caller:
                self.stats.dropped_replay += 1
                return Ok([])  # canceled or unknown replay: nothing more is enqueued
            targets: list[Route] = [route]
        else:
            targets = list(self.routes.get(e.namespace, {}).values())
        targets = [t for t in targets if t.keeps(e)]
        if any(
            self.unconfirmed.get(t.subscriber.bytes, 0) >= self.max_unconfirmed for t in targets
        ):
            self.stats.busy += 1
            return Err("Busy")
        self.stats.published += 1
        ids = []
        headers = [*(e.headers or []), (H_RECEIVED, {"Nat": now})]
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
            self.pending[nid] = Pending(t.subscriber, e.namespace, e.event_id)
            self.unconfirmed[key] = self.unconfirmed.get(key, 0) + 1
            if isinstance(t, ReplayRoute):
                t.delivered += 1
            ids.append(nid)
        self.stats.notified += len(ids)
        return Ok(ids)

    def confirm_notifications(self, caller: Principal, ids: list[int], now: int):
        results: list[Ok | Err | None] = []
        for nid in ids:
            p = self.pending.get(nid)
            if p is None:
                results.append(Err("NotFound"))
            elif p.subscriber != caller:
                results.append(Err("Unauthorized"))
            else:
                del self.pending[nid]
                key = caller.bytes
                self.unconfirmed[key] -= 1
                self.stats.confirmed += 1
                results.append(Ok(None))
        return None if all(isinstance(r, Ok) for r in results) else results
