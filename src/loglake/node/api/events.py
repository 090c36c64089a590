"""ICRC-72/77 in the node: the roles on one in-process network, and their routes.

Why in process: the four role cores are sans-I/O, and ``events.InProcessNetwork`` is the
adapter that runs them together (the same Candid round trip per call as over HTTP). The node
drives that network from one pump thread; API calls take the same lock, so the cores only ever
see one caller at a time. The orchestrator's journal and ledger and the publisher's namespaces
are streams of the node's own log (``StreamsStore`` over ``LocalStreams``), so they show in the
streams API and survive a restart: ``open_orchestrator`` rebuilds the core from its journal.
Roles that must run in other processes still use ``loglake events serve``.

Each in-node role has a key in ``<data dir>/events/<role>.key`` (mode 0600, made on first
start), so principals are stable across restarts. The API acts as the in-node publisher
(publish) and subscriber (subscribe, register and cancel replays); cancelling a replay is an
``icrc77_cancel_replay`` call on behalf of the replay's subscriber, which the orchestrator
checks like any other.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from loglake.errors import LocalProtocolError, LoglakeError
from loglake.node.api.context import Node, NodeContext, PartDisabled, part

router = APIRouter(tags=["events"])

PUMP_INTERVAL_S = 0.05
MAX_STEPS_PER_PUMP = 20_000
"""Steps one pump round runs before letting API calls in."""


class UnknownReplay(LoglakeError, KeyError):
    def __init__(self, replay_id: int) -> None:
        super().__init__(f"no replay {replay_id}")

    def __str__(self) -> str:
        return str(self.args[0])


class EventsCallFailed(LocalProtocolError):
    """The orchestrator answered a call with an ICRC error (its text says which)."""


def _identity(folder: Path, role: str) -> Any:
    from loglake.events import Identity

    path = folder / f"{role}.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return Identity.from_seed(bytes.fromhex(path.read_text().strip()))
    ident = Identity.generate()
    with os.fdopen(fd, "w") as f:
        f.write(ident.seed.hex())
        f.flush()
        os.fsync(f.fileno())
    return ident


class EventsHandle:
    """The in-process ICRC roles of a node (any subset that includes the orchestrator and a
    broadcaster; ``node/config.py`` checks it)."""

    def __init__(self, ctx: NodeContext, roles: tuple[str, ...], namespaces: tuple[str, ...]):
        from loglake.events import (
            C_REPLAY,
            Broadcaster,
            InProcessNetwork,
            Publisher,
            Quotas,
            StreamsStore,
            Subscriber,
            open_ledger,
            open_orchestrator,
        )
        from loglake.streams import LocalStreams

        self.lock = threading.RLock()
        self.net = InProcessNetwork(time.time_ns)
        folder = ctx.data_dir / "events"
        folder.mkdir(exist_ok=True)
        self.ids = {r: _identity(folder, r) for r in roles}
        p = {r: i.principal for r, i in self.ids.items()}
        self.principals = p
        streams = LocalStreams(ctx.log)  # never closed here: the node closes its log
        self.orchestrator: Any = None
        self.publisher: Any = None
        self.subscriber: Any = None
        self.received: Counter[str] = Counter()
        self.inbox_tail: list[dict[str, Any]] = []
        if "orchestrator" in roles:
            store = StreamsStore(streams)
            ledger = open_ledger(store, fee=1)
            store.perform_many(ledger.writes)
            ledger.writes.clear()
            self.orchestrator = self.net.add(
                open_orchestrator(store, p["orchestrator"], [p["broadcaster"]], Quotas(), ledger),
                store,
            )
        orch = p["orchestrator"]
        if "broadcaster" in roles:
            self.net.add(Broadcaster(p["broadcaster"], orch))
        if "publisher" in roles:
            self.publisher = self.net.add(
                Publisher(p["publisher"], orch, batch_size=500), StreamsStore(streams)
            )
            for ns in namespaces:
                self.publisher.register(ns, [(C_REPLAY, {"Bool": True})])
        if "subscriber" in roles:
            self.subscriber = self.net.add(Subscriber(p["subscriber"], orch))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="loglake-events", daemon=True)

    @classmethod
    def start(cls, ctx: NodeContext, section: Any) -> EventsHandle:
        handle = cls(ctx, tuple(section.roles), tuple(section.namespaces))
        handle.settle()
        handle._thread.start()
        return handle

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # -- driving the network --------------------------------------------------------------------
    def settle(self, max_steps: int = MAX_STEPS_PER_PUMP) -> int:
        """Deliver what is queued (under the lock); the subscriber's inbox is counted."""
        with self.lock:
            steps = self.net.run(max_steps)
            self._drain_inbox()
            return steps

    def _pump(self) -> None:
        while not self._stop.wait(PUMP_INTERVAL_S):
            try:
                while self.settle() and not self._stop.is_set():
                    pass
            except Exception as e:  # a core failing must not end the node; it shows in logs
                import logging

                from loglake.logs import log_event

                log_event(logging.getLogger(__name__), logging.ERROR, "events pump", error=repr(e))

    def _drain_inbox(self) -> None:
        if self.subscriber is None:
            return
        got = self.subscriber.take()
        for n in got:
            self.received[n.namespace] += 1
        for n in got[-50:]:
            self.inbox_tail.append(
                {"namespace": n.namespace, "event_id": n.event_id, "timestamp": n.timestamp}
            )
        del self.inbox_tail[:-50]

    def _need(self, role: str) -> Any:
        core = {
            "orchestrator": self.orchestrator,
            "publisher": self.publisher,
            "subscriber": self.subscriber,
        }[role]
        if core is None:
            raise PartDisabled(f"an ICRC {role}")
        return core

    def _call(self, who: str, method: str, arg: Any) -> Any:
        self._need(who)
        orch = self._need("orchestrator")
        with self.lock:
            out = self.net.call(self.principals[who], orch.principal, method, arg)
        self.settle()
        return out

    @staticmethod
    def _ok(result: Any, what: str) -> int:
        from loglake.events import Ok

        if isinstance(result, list):
            result = result[0] if result else None
        if isinstance(result, Ok):
            return int(result.value) if result.value is not None else 0
        if isinstance(result, int) and not isinstance(result, bool):
            return result
        raise EventsCallFailed(f"{what}: {result}")

    # -- what the routes do -----------------------------------------------------------------
    def register(self, namespace: str) -> None:
        from loglake.events import C_REPLAY

        pub = self._need("publisher")
        with self.lock:
            pub.register(namespace, [(C_REPLAY, {"Bool": True})])
        self.settle()

    def publish(self, namespace: str, texts: list[str]) -> list[int]:
        pub = self._need("publisher")
        with self.lock:
            if namespace not in pub.publication_ids:
                raise LocalProtocolError(
                    f"namespace {namespace!r} is not registered by this node's publisher"
                )
            action = pub.publish(namespace, [({"Text": t}, None) for t in texts], time.time_ns())
            self.net.run(MAX_STEPS_PER_PUMP)
        self.settle()
        head = self.orchestrator.publications[namespace].head if self.orchestrator else None
        n = len(action.payloads)
        return list(range(head - n, head)) if head is not None and head >= n else []

    def subscribe(self, namespace: str) -> int:
        from loglake.events import Registration

        out = self._call("subscriber", "icrc72_register_subscription", [Registration(namespace)])
        return self._ok(out, "icrc72_register_subscription")

    def replay(self, namespace: str, start: int, end: int | None) -> int:
        from loglake.events import ReplayRegistration

        reg = ReplayRegistration(namespace, start, end)
        out = self._call("subscriber", "icrc77_register_replay", [reg])
        return self._ok(out, "icrc77_register_replay")

    def cancel(self, replay_id: int) -> int:
        orch = self._need("orchestrator")
        with self.lock:
            rep = orch.replays.get(replay_id)
            if rep is None:
                raise UnknownReplay(replay_id)
            out = self.net.call(rep.subscriber, orch.principal, "icrc77_cancel_replay", [replay_id])
        self.settle()
        return self._ok(out, "icrc77_cancel_replay")

    def read_orchestrator(self, fn: Any) -> Any:
        """``fn(orchestrator core)``, with no role running meanwhile."""
        orch = self._need("orchestrator")
        with self.lock:
            return fn(orch)

    def replay_rows(self) -> list[dict[str, Any]]:
        return replay_rows(self)

    def roles_view(self) -> dict[str, Any]:
        with self.lock:
            return {
                "roles": {r: p.to_str() for r, p in self.principals.items()},
                "received": dict(self.received),
                "recent": list(self.inbox_tail),
            }

    def metric_families(self) -> Iterator[Any]:
        return metric_families(self, self.orchestrator is not None)


def replay_rows(h: Any) -> list[dict[str, Any]]:
    return list(
        h.read_orchestrator(
            lambda o: [_replay_row(r) for r in sorted(o.replays.values(), key=lambda r: r.id)]
        )
    )


def namespace_rows(h: Any) -> list[dict[str, Any]]:
    def rows(orch: Any) -> list[dict[str, Any]]:
        subs = Counter(ns for ns, _ in orch.subscriptions)
        return [
            {
                "id": p.id,
                "namespace": p.namespace,
                "publisher": p.publisher.to_str(),
                "broadcaster": p.broadcaster.to_str(),
                "replay": p.replay,
                "head": p.head,
                "per_event": p.per_event,
                "subscriptions": subs[p.namespace],
            }
            for p in sorted(orch.publications.values(), key=lambda p: p.id)
        ]

    return list(h.read_orchestrator(rows))


def subscription_rows(h: Any) -> list[dict[str, Any]]:
    return list(
        h.read_orchestrator(
            lambda orch: [
                {"id": s.id, "namespace": s.namespace, "subscriber": s.subscriber.to_str()}
                for s in sorted(orch.subscriptions.values(), key=lambda s: s.id)
            ]
        )
    )


def metric_families(h: Any, has_orchestrator: bool) -> Iterator[Any]:
    """Replay progress (when the orchestrator is in this node) and the subscriber's counts."""
    from prometheus_client.core import CounterMetricFamily

    if has_orchestrator:
        yield from _replay_families(h.replay_rows())
    received = CounterMetricFamily(
        "loglake_events_received",
        "Notifications the node's subscriber received.",
        labels=["namespace"],
    )
    for ns, n in sorted(h.roles_view()["received"].items()):
        received.add_metric([ns], n)
    yield received


def _replay_families(rows: list[dict[str, Any]]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    sent = CounterMetricFamily(
        "loglake_replay_events_sent",
        "Events a replay has delivered (ICRC-77 icrc77:replay:sent).",
        labels=["replay", "namespace"],
    )
    expected = GaugeMetricFamily(
        "loglake_replay_events_expected",
        "Events a replay will deliver.",
        labels=["replay", "namespace"],
    )
    states = GaugeMetricFamily("loglake_replays", "Replays by state.", labels=["state"])
    by_state: Counter[str] = Counter()
    for r in rows:
        sent.add_metric([str(r["id"]), r["namespace"]], r["sent"])
        expected.add_metric([str(r["id"]), r["namespace"]], r["expected"])
        by_state[r["status"]] += 1
    for s in ("pending", "running", "completed", "canceled", "errored"):
        states.add_metric([s], by_state[s])
    yield from (sent, expected, states)


def _replay_row(r: Any) -> dict[str, Any]:
    sent = r.sent
    if r.status.final and isinstance(r.status.value, int):  # completed(n) / canceled(n)
        sent = max(sent, r.status.value)
    return {
        "id": r.id,
        "namespace": r.namespace,
        "subscriber": r.subscriber.to_str(),
        "publisher": r.publisher.to_str(),
        "broadcaster": r.broadcaster.to_str(),
        "start": r.start,
        "end": r.end,
        "status": r.status.tag,
        "status_value": None if r.status.value is None else str(r.status.value),
        "expected": r.expected,
        "sent": sent,
        "progress": min(1.0, sent / r.expected) if r.expected else 1.0,
        "cost": r.cost,
        "created_ns": r.created,
        "cancel_requested": r.cancel_requested,
        "job": r.job,
    }


# -- routes ------------------------------------------------------------------------------------
NamespaceName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+$")]
ReplayId = Annotated[int, PathParam(ge=0, le=2**63 - 1)]


class NamespaceOut(BaseModel):
    id: int
    namespace: str
    publisher: str
    broadcaster: str
    replay: bool
    head: int
    """Next event id: events 0..head-1 exist."""
    per_event: int
    subscriptions: int


class SubscriptionOut(BaseModel):
    id: int
    namespace: str
    subscriber: str


class ReplayOut(BaseModel):
    id: int
    namespace: str
    subscriber: str
    publisher: str
    broadcaster: str
    start: int
    end: int | None
    status: str
    """pending | running | completed | canceled | errored (ICRC-77 ReplayState)."""
    status_value: str | None
    expected: int
    sent: int
    progress: float
    """sent / expected, 0..1."""
    cost: int
    created_ns: int
    cancel_requested: bool
    job: bool


class RolesOut(BaseModel):
    roles: dict[str, str]
    """Role → principal (text)."""
    urls: dict[str, str] = {}
    """Role → URL, when the roles are served over HTTP (``transport = "http"``)."""
    received: dict[str, int]
    """Namespace → notifications the node's subscriber received."""
    recent: list[dict[str, Any]]


class NamespaceIn(BaseModel):
    namespace: NamespaceName


class PublishIn(BaseModel):
    texts: list[Annotated[str, Field(max_length=4096)]] = Field(min_length=1, max_length=1000)


class PublishOut(BaseModel):
    ids: list[int]


class ReplayIn(BaseModel):
    namespace: NamespaceName
    start: int = Field(0, ge=0, le=2**63 - 1)
    end: int | None = Field(None, ge=0, le=2**63 - 1)


class IdOut(BaseModel):
    id: int


def _events(node: NodeContext) -> Any:
    """The node's events handle: ``EventsHandle`` (in process) or ``EventsHttpHandle``."""
    return part(node.events, "ICRC events")


@router.get("/events", response_model=RolesOut, summary="ICRC roles in this node, inbox")
def roles(node: Node) -> RolesOut:
    return RolesOut(**_events(node).roles_view())


@router.get("/events/namespaces", response_model=list[NamespaceOut], summary="ICRC-72 namespaces")
def namespaces(node: Node) -> list[dict[str, Any]]:
    return namespace_rows(_events(node))


@router.post(
    "/events/namespaces",
    status_code=202,
    summary="Register a namespace with the node's publisher (replay on)",
)
def register_namespace(body: NamespaceIn, node: Node) -> dict[str, str]:
    _events(node).register(body.namespace)
    return {"namespace": body.namespace}


@router.post(
    "/events/namespaces/{namespace}/events",
    response_model=PublishOut,
    summary="Publish #Text events through the node's publisher",
)
def publish(
    namespace: Annotated[str, PathParam(max_length=200)], body: PublishIn, node: Node
) -> PublishOut:
    return PublishOut(ids=_events(node).publish(namespace, body.texts))


@router.get(
    "/events/subscriptions", response_model=list[SubscriptionOut], summary="ICRC-72 subscriptions"
)
def subscriptions(node: Node) -> list[dict[str, Any]]:
    return subscription_rows(_events(node))


@router.post(
    "/events/subscriptions",
    response_model=IdOut,
    status_code=201,
    summary="Subscribe the node's subscriber to a namespace",
)
def subscribe(body: NamespaceIn, node: Node) -> IdOut:
    return IdOut(id=_events(node).subscribe(body.namespace))


@router.get("/events/replays", response_model=list[ReplayOut], summary="ICRC-77 replays")
def replays(
    node: Node,
    status: Annotated[str | None, Query(max_length=20, description="Only this state")] = None,
) -> list[dict[str, Any]]:
    rows = _events(node).replay_rows()
    return [r for r in rows if status is None or r["status"] == status]


@router.get("/events/replays/{replay_id}", response_model=ReplayOut, summary="One replay")
def replay(replay_id: ReplayId, node: Node) -> dict[str, Any]:
    for r in _events(node).replay_rows():
        if r["id"] == replay_id:
            return r
    raise UnknownReplay(replay_id)


@router.post(
    "/events/replays",
    response_model=IdOut,
    status_code=201,
    summary="Register a replay for the node's subscriber ([start, end) of a namespace)",
)
def register_replay(body: ReplayIn, node: Node) -> IdOut:
    return IdOut(id=_events(node).replay(body.namespace, body.start, body.end))


@router.post(
    "/events/replays/{replay_id}/cancel",
    response_model=IdOut,
    summary="Cancel a replay (on behalf of its subscriber)",
)
def cancel_replay(replay_id: ReplayId, node: Node) -> IdOut:
    return IdOut(id=_events(node).cancel(replay_id))
