"""ICRC-72/77 in the node: the roles on one in-process network, and their routes.

Why in process: the four role cores are sans-I/O, and ``events.InProcessNetwork`` is the
adapter that runs them together (the same Candid round trip per call as over HTTP). One pump
thread drives that network, a slice at a time (steps until ``SLICE_S`` has passed, often one:
a step that carries 500 replayed events is tens of ms of Candid), under the lock; between
slices it lets API calls waiting for the lock in first. API calls never step the network
themselves: a call that changes a core (subscribe, register a replay, cancel) takes the lock,
makes its one core call, wakes the pump and returns; what the call set going (a replay's
thousands of events) runs on the pump, so ``POST /api/events/replays`` returns while the
replay is pending, and reads answer within one slice while it runs. A publish waits (not under
the lock) for the pump to have stored its events and the orchestrator to know the new head, so
its reply has the ids and a replay registered right after it covers them. Why a thread and not
a task on the node's event loop: the steps are CPU-bound, and on the loop each would stall the
API and the stream service for its whole length.

The orchestrator's journal and ledger and the publisher's namespaces are streams of the node's
own log (``StreamsStore`` over ``LocalStreams``), so they show in the streams API and survive a
restart: ``open_orchestrator`` rebuilds the core from its journal. Roles that must run in other
processes still use ``loglake events serve``.

Each in-node role has a key in ``<data dir>/events/<role>.key`` (mode 0600, made on first
start), so principals are stable across restarts. The API acts as the in-node publisher
(publish) and subscriber (subscribe, register and cancel replays); cancelling a replay is an
``icrc77_cancel_replay`` call on behalf of the replay's subscriber, which the orchestrator
checks like any other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from loglake.errors import LocalProtocolError, LoglakeError, Unavailable
from loglake.node.api.context import Node, NodeContext, PartDisabled, fence_of, part
from loglake.node.backend import EVENTS_JOURNAL
from loglake.structured_logging import log_event

router = APIRouter(tags=["events"])

PUMP_INTERVAL_S = 0.05
"""How long the idle pump sleeps (an API call that queued work wakes it at once)."""
SLICE_S = 0.02
"""A pump slice steps the network until this has passed (a step is not cut: one carrying 500
replayed events takes tens of ms), then lets waiting API calls in."""
MAX_YIELD_S = 0.05
"""How long the pump waits between slices for API calls to take the lock."""
CALL_TIMEOUT_S = 60.0
"""How long a publish waits for the pump to store its events."""


class UnknownReplay(LoglakeError, KeyError):
    def __init__(self, replay_id: int) -> None:
        super().__init__(f"no replay {replay_id}")

    def __str__(self) -> str:
        return str(self.args[0])


class EventsCallFailed(LocalProtocolError):
    """The orchestrator answered a call with an ICRC error (its text says which)."""


class EventsElsewhere(Unavailable):
    """Another node on the shared cluster runs the ICRC orchestrator now (it holds the
    journal's lease): a call that would change its state is refused here (503), not written
    twice."""


class EventsTimeout(LoglakeError):
    """The events pump did not do what an API call waits for in time (a fault: it is logged)."""


def _identity(folder: Path, role: str, keys: Any = None) -> Any:
    """The role's identity: its seed (hex) from ``keys`` (``node.keys.NodeKeys``: the cluster's
    key bucket on a shared cluster, so every node is the same principals), else from
    ``<folder>/<role>.key``; made on first use."""
    from loglake.events import Identity
    from loglake.node.keys import NodeKeyError, NodeKeys

    keys = keys if keys is not None else NodeKeys()
    path = folder / f"{role}.key"
    text = keys.text(f"events.{role}", path, lambda: Identity.generate().seed.hex())
    try:
        return Identity.from_seed(bytes.fromhex(text))
    except ValueError as e:
        raise NodeKeyError(f"the {role} key in {keys.where(path)} is not a hex seed: {e}") from None


class EventsHandle:
    """The in-process ICRC roles of a node (any subset that includes the orchestrator and a
    broadcaster; ``node/config.py`` checks it)."""

    def __init__(
        self,
        ctx: NodeContext,
        roles: tuple[str, ...],
        namespaces: tuple[str, ...],
        replay_rate: float = 0.0,
    ):
        from loglake.events import (
            C_REPLAY,
            Broadcaster,
            InProcessNetwork,
            Publisher,
            StreamsStore,
            Subscriber,
        )
        from loglake.streams import LocalStreams

        self.lock = threading.RLock()
        """Held while a core runs (a pump slice, an API call's core call or read)."""
        self._waiting = 0
        """API calls waiting for ``lock``: the pump lets them in between slices."""
        self._waiting_lock = threading.Lock()
        self._kick = threading.Event()
        """Set when an API call queued work, so the pump does not sleep out its interval."""
        self._progress = threading.Condition()
        """Notified after every pump slice (a publish waits on it for its ids)."""
        self.net = InProcessNetwork(time.time_ns)
        folder = ctx.data_dir / "events"
        self.ids = {r: _identity(folder, r, ctx.keys) for r in roles}
        p = {r: i.principal for r, i in self.ids.items()}
        self.principals = p
        self.namespaces = namespaces
        streams = LocalStreams(ctx.log)  # never closed here: the node closes its log
        self.orchestrator: Any = None
        self.publisher: Any = None
        self.publisher_store: Any = None
        self.subscriber: Any = None
        self.received: Counter[str] = Counter()
        self.inbox_tail: list[dict[str, Any]] = []
        self.fence = fence_of(ctx, EVENTS_JOURNAL)
        """The journal's lease on a cluster shared by several nodes (``UNFENCED`` alone)."""
        self._tenure: int | None = None
        """The fence's tenure the orchestrator core was rebuilt under."""
        self._orch_store: Any = None
        if "orchestrator" in roles:
            from loglake.events.store import orchestrator_streams

            self._orch_store = StreamsStore(streams, self.fence, orchestrator_streams())
            self._tenure = self.fence.tenure()
            if self._tenure is not None:
                self.fence.claim()  # before reading the journal: nothing lands after the read
            self._open_orchestrator()
        orch = p["orchestrator"]
        if "broadcaster" in roles:
            self.net.add(Broadcaster(p["broadcaster"], orch))
        if "publisher" in roles:
            self.publisher_store = _publisher_store(streams)
            self.publisher = self.net.add(
                Publisher(p["publisher"], orch, batch_size=500, replay_rate=replay_rate or None),
                self.publisher_store,
            )
            for ns in namespaces:
                self.publisher.register(ns, [(C_REPLAY, {"Bool": True})])
        if "subscriber" in roles:
            self.subscriber = self.net.add(Subscriber(p["subscriber"], orch))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="loglake-events", daemon=True)

    def _open_orchestrator(self) -> None:
        """(Re)build the orchestrator core from its journal and ledger streams and route the
        network's calls to it (at start, and when this node takes the journal's lease over
        from another: its replays, still open, are resent from here)."""
        from loglake.events import Quotas, open_ledger, open_orchestrator

        store, p = self._orch_store, self.principals
        ledger = open_ledger(store, fee=1)
        store.perform_many(ledger.writes)
        ledger.writes.clear()
        self.orchestrator = self.net.add(
            open_orchestrator(store, p["orchestrator"], [p["broadcaster"]], Quotas(), ledger),
            store,
        )

    def _writes_here(self) -> bool:
        """Whether this node's ICRC roles may run now: always, unless the orchestrator is here
        and another node on the cluster holds its journal's lease. On taking the lease over,
        the orchestrator is rebuilt from the journal first (the other node wrote it)."""
        if self._orch_store is None:
            return True
        tenure = self.fence.tenure()
        if tenure is None:
            return False
        if tenure != self._tenure:
            self.fence.claim()
            self.net.queue.clear()  # calls of the stale core; the rebuilt one resends
            self._open_orchestrator()
            self._tenure = tenure
            self._step_until_registered()
            log_event(
                logging.getLogger(__name__),
                logging.INFO,
                "took the ICRC journal over",
                token=tenure,
                replays=len(self.orchestrator.replays),
            )
        return True

    def _need_lease(self) -> None:
        if not self._writes_here():
            raise EventsElsewhere(
                "another node on the cluster holds the ICRC orchestrator's journal lease "
                "now; send this to that node, or retry: this node takes over within the "
                "lease TTL if that node dies"
            )

    @classmethod
    def start(cls, ctx: NodeContext, section: Any) -> EventsHandle:
        handle = cls(ctx, tuple(section.roles), tuple(section.namespaces), section.replay_rate)
        handle._register_namespaces()
        handle._thread.start()
        return handle

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # -- driving the network --------------------------------------------------------------------
    def _register_namespaces(self) -> None:
        """At start, before the API serves: step until the configured namespaces are the
        publisher's (so a publish right after start finds them), or the network is idle. Not
        "until idle": after a restart the orchestrator resends its open replays, which run on
        the pump like any other."""
        with self.lock:
            if not self._writes_here():
                return  # another node writes the journal: registered on takeover
            self._step_until_registered()
            self._drain_inbox()

    def _step_until_registered(self) -> None:
        """Step (under the lock) until the publisher's namespaces are registered or the
        network is idle: at start, and when this node takes the journal over (so a publish
        right after finds them)."""
        pub = self.publisher
        while (
            pub is not None and not all(ns in pub.registration_results for ns in self.namespaces)
        ) and self.net.step():
            pass

    def _slice(self) -> bool:
        """Steps until ``SLICE_S`` has passed or nothing is left (under the lock)."""
        deadline = time.monotonic() + SLICE_S
        stepped = False
        with self.lock:
            if not self._writes_here():
                return False
            while self.net.step():
                stepped = True
                if time.monotonic() >= deadline or self._stop.is_set():
                    break
            self._drain_inbox()
        return stepped

    def _pump(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self._slice()
            except Exception as e:  # a core failing must not end the node; it shows in logs
                import logging

                from loglake.structured_logging import log_event

                log_event(logging.getLogger(__name__), logging.ERROR, "events pump", error=repr(e))
                busy = False
            with self._progress:
                self._progress.notify_all()
            if busy:
                self._yield_to_api()
            else:
                self._kick.wait(PUMP_INTERVAL_S)
                self._kick.clear()

    def _yield_to_api(self) -> None:
        """Let API calls waiting for the lock take it before the next slice (a lock is not
        fair: without this the pump would take it back at once, every time)."""
        deadline = time.monotonic() + MAX_YIELD_S
        while self._waiting and time.monotonic() < deadline:
            time.sleep(0.0005)

    @contextmanager
    def _cores(self) -> Iterator[None]:
        """The lock, for an API call: the pump lets it in at its next slice boundary."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            self.lock.acquire()
        finally:
            with self._waiting_lock:
                self._waiting -= 1
        try:
            yield
        finally:
            self.lock.release()
            self._kick.set()

    def _wait_for(self, pred: Any, what: str) -> Any:
        """Wait (not holding the lock) until the pump made ``pred()`` truthy."""
        with self._progress:
            got = self._progress.wait_for(pred, timeout=CALL_TIMEOUT_S)
        if not got:
            raise EventsTimeout(f"{what}: not done by the events pump within {CALL_TIMEOUT_S} s")
        return got

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
        """One call to the orchestrator; what it queues runs on the pump."""
        self._need(who)
        orch = self._need("orchestrator")
        with self._cores():
            self._need_lease()
            orch = self.orchestrator
            return self.net.call(self.principals[who], orch.principal, method, arg)

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
        with self._cores():
            self._need_lease()
            pub.register(namespace, [(C_REPLAY, {"Bool": True})])

    def publish(self, namespace: str, texts: list[str]) -> list[int]:
        """Queue the append; answer once the pump stored it (its ids) and, with the
        orchestrator here, once the orchestrator's head covers it."""
        pub = self._need("publisher")
        store = self.publisher_store
        assert store is not None  # made with the publisher
        with self._cores():
            self._need_lease()
            if namespace not in pub.publication_ids:
                raise LocalProtocolError(
                    f"namespace {namespace!r} is not registered by this node's publisher"
                )
            action = pub.publish(namespace, [({"Text": t}, None) for t in texts], time.time_ns())
            store.watch(action)
        try:
            ids: list[int] = self._wait_for(lambda: store.appended.get(id(action)), "publish")
        finally:
            store.forget(action)
        orch = self.orchestrator
        if orch is not None:
            self._wait_for(
                lambda: (
                    (p := orch.publications.get(namespace)) is not None and p.head >= ids[-1] + 1
                ),
                "the orchestrator's head after a publish",
            )
        return ids

    def subscribe(self, namespace: str) -> int:
        from loglake.events import Registration

        out = self._call("subscriber", "icrc72_register_subscription", [Registration(namespace)])
        return self._ok(out, "icrc72_register_subscription")

    def replay(self, namespace: str, start: int, end: int | None) -> int:
        """Registers the replay and returns: it runs on the pump (pending, then running)."""
        from loglake.events import ReplayRegistration

        reg = ReplayRegistration(namespace, start, end)
        out = self._call("subscriber", "icrc77_register_replay", [reg])
        return self._ok(out, "icrc77_register_replay")

    def cancel(self, replay_id: int) -> int:
        """The orchestrator accepts the cancel; the replay turns ``canceled`` on the pump,
        once the publisher has stopped and reported how many it sent."""
        self._need("orchestrator")
        with self._cores():
            self._need_lease()
            orch = self.orchestrator
            rep = orch.replays.get(replay_id)
            if rep is None:
                raise UnknownReplay(replay_id)
            out = self.net.call(rep.subscriber, orch.principal, "icrc77_cancel_replay", [replay_id])
        return self._ok(out, "icrc77_cancel_replay")

    def read_orchestrator(self, fn: Any) -> Any:
        """``fn(orchestrator core)``, with no role running meanwhile."""
        orch = self._need("orchestrator")
        with self._cores():
            return fn(orch)

    def replay_rows(self) -> list[dict[str, Any]]:
        """The orchestrator's replays; with the publisher in this node, ``expected`` and
        ``sent`` come from what it counts on the namespace's stream (see ``_stream_counts``)."""
        orch = self._need("orchestrator")
        with self._cores():
            return [
                _replay_row(r, *self._stream_counts(r))
                for r in sorted(orch.replays.values(), key=lambda r: r.id)
            ]

    def _stream_counts(self, r: Any) -> tuple[int | None, int | None]:
        """``(expected, sent)`` of replay ``r`` as the in-node publisher sees them, or Nones
        (see ``publisher_counts``)."""
        return publisher_counts(r, self.publisher, self.publisher_store)

    def roles_view(self) -> dict[str, Any]:
        with self._cores():
            return {
                "roles": {r: p.to_str() for r, p in self.principals.items()},
                "received": dict(self.received),
                "recent": list(self.inbox_tail),
                "registrations": registration_rows(self.publisher),
            }

    def metric_families(self) -> Iterator[Any]:
        return metric_families(self, self.orchestrator is not None)


def registration_rows(pub: Any) -> dict[str, dict[str, Any]]:
    """Namespace → where the node's publisher's registration stands (``pending``,
    ``retrying``, ``registered``, ``refused``), its attempts and last error; call it where
    ``pub`` runs."""
    if pub is None:
        return {}
    return {
        ns: {"state": st.state, "attempts": st.attempts, "error": st.last_error}
        for ns, st in sorted(pub.registrations.items())
    }


def publisher_counts(r: Any, pub: Any, store: Any) -> tuple[int | None, int | None]:
    """``(expected, sent)`` of replay ``r`` as the node's publisher ``pub`` sees them (its
    stream read through ``store``), or Nones when ``pub`` is absent or not ``r``'s publisher.

    The orchestrator's ``expected`` is ``end - start`` (``head - start`` for an open end),
    by the head the publisher reports: after its publishes, and from reading its stream
    every second (``Publisher._poll_heads``), so events that reached the namespace's stream
    another way (pushed over the stream service, an import) count once it has read them.
    The publisher's span is ``[start, end)`` cut at the stream's head when the replay opened
    (what it will send; an open end is the head the orchestrator priced it at); before it
    opens, the stream's bounds say the same. Its ``sent`` is live (the orchestrator's moves
    every 5,000). Call it where ``pub`` runs (its thread or loop), so its ``replays`` are not
    read half-updated."""
    if pub is None or store is None or r.publisher != pub.principal:
        return None, None
    active = pub.replays.get(r.id)
    if active is not None:
        return active.end - active.start, active.sent
    if r.status.final:
        return None, None  # finished (or before a restart): the orchestrator's figures
    first, head = store.bounds(r.namespace)
    stop = min(r.start + r.expected if r.end is None else r.end, head)  # as Publisher._opened
    return max(0, stop - max(r.start, first)), None


def _publisher_store(streams: Any) -> Any:
    """The publisher's store, keeping the ids of the appends an API publish waits for (a
    class made here: importing ``loglake.events`` takes seconds, and a node without ICRC
    never pays it)."""
    from loglake.events import StreamsStore

    class PublisherStore(StreamsStore):
        def __init__(self, streams: Any) -> None:
            super().__init__(streams)
            self._watched: dict[int, Any] = {}
            self.appended: dict[int, list[int]] = {}
            """``id(action)`` → the ids its events got (watched actions only)."""

        def watch(self, action: Any) -> None:
            self._watched[id(action)] = action  # held, so its id is not reused meanwhile

        def forget(self, action: Any) -> None:
            self._watched.pop(id(action), None)
            self.appended.pop(id(action), None)

        def perform_many(self, actions: Any) -> list[Any]:
            out = super().perform_many(actions)
            for a, result in zip(actions, out, strict=True):
                if id(a) in self._watched:
                    self.appended[id(a)] = result
            return out

    return PublisherStore(streams)


def replay_rows(h: Any, pub: Any = None, store: Any = None) -> list[dict[str, Any]]:
    """The orchestrator's replays, read by ``h.read_orchestrator`` (where the cores run); with
    the node's publisher ``pub`` (and a ``store`` on its streams) the figures it knows better
    (``publisher_counts``)."""
    return list(
        h.read_orchestrator(
            lambda o: [
                _replay_row(r, *publisher_counts(r, pub, store))
                for r in sorted(o.replays.values(), key=lambda r: r.id)
            ]
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
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if has_orchestrator:
        yield from _replay_families(h.replay_rows())
        dropped = CounterMetricFamily(
            "loglake_events_system_messages_dropped",
            "System messages the orchestrator gave up sending: to a principal with no address "
            "at the first failure, others after 360 sends (about an hour).",
        )
        dropped.add_metric([], h.read_orchestrator(lambda o: o.resender.dropped))
        yield dropped
    received = CounterMetricFamily(
        "loglake_events_received",
        "Notifications the node's subscriber received.",
        labels=["namespace"],
    )
    view = h.roles_view()
    for ns, n in sorted(view["received"].items()):
        received.add_metric([ns], n)
    yield received
    registered = GaugeMetricFamily(
        "loglake_publication_registered",
        "1 when the node's publisher registered the namespace with the orchestrator; 0 while "
        "it is pending, retrying (the orchestrator did not answer) or was refused.",
        labels=["namespace", "state"],
    )
    for ns, r in view.get("registrations", {}).items():
        registered.add_metric([ns, r["state"]], 1 if r["state"] == "registered" else 0)
    yield registered


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


def _replay_row(r: Any, expected: int | None = None, sent_now: int | None = None) -> dict[str, Any]:
    """One replay as the API shows it; ``expected`` / ``sent_now``, when the caller knows them
    better than the orchestrator (the in-node publisher's counts), replace its figures."""
    sent = max(r.sent, sent_now or 0)
    if r.status.final and isinstance(r.status.value, int):  # completed(n) / canceled(n)
        sent = max(sent, r.status.value)
    if expected is None:
        expected = r.expected
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
        "expected": expected,
        "sent": sent,
        "progress": min(1.0, sent / expected) if expected else 1.0,
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
    registrations: dict[str, dict[str, Any]] = {}
    """Namespace → the node's publisher's registration: state (pending | retrying |
    registered | refused), attempts, error."""


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
