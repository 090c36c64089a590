"""What a call costs the role that serves it, against what the role holds.

Each role does its work on its event loop, so a call's time in the core is a stall for every
other caller. Five calls any signed principal can make cost in proportion to state other
principals made (review 9):

- a publication's registration scanned every subscription of every principal, and one that
  registered an existing publication again announced each of the namespace's subscriptions
  again, two calls each, for every item of the batch (1,000 subscriptions, one call of 100
  re-registrations: 200,200 calls queued, 47 s);
- a stranger's ``icrc72_publish`` made the Broadcaster look at every replay it holds for each
  distinct replay-id header (2,000 replays, 20,000 events: 24 s);
- ``icrc77_get_replays`` checked every slice of a filter of any size against each listed
  replay, and made a set of its statistics names for each (20,000 slices: 8 s);
- a stranger's notifications on a Subscriber's own system namespace each looked through every
  namespace's broadcasters (1,000 namespaces, 60,000 notifications: 9 s).

Each test serves the real roles over HTTP on 127.0.0.1 and compares the CPU seconds of the
same call against a small and a large state (the fewest of 3 tries: a loaded machine slows a
try, never speeds one up), with a margin wide enough for noise; and checks that honest use
still works: subscriptions announced to a new publication's broadcaster, relayers accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from icp_principal import Principal

from loglake.events import orchestrator_replays, sysmsg
from loglake.events.actions import Call
from loglake.events.broadcaster import Broadcaster
from loglake.events.client import CallRejected, HttpEventsClient
from loglake.events.identity import Identity
from loglake.events.messages import (
    H_REPLAY_ID,
    Err,
    Event,
    EventNotification,
    GetReplays,
    Ok,
    OrchestrationFilter,
    Registration,
    ReplayRegistration,
    ReplayState,
    ReplayStatusUpdate,
)
from loglake.events.orchestrator import HEAD_KEY, Orchestrator, Quotas, Subscription
from loglake.events.publisher import Publisher, publication_config
from loglake.events.role import Role
from loglake.events.server import HttpRoleServer
from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
from loglake.events.subscriber import Subscriber
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.events.served import serve
from tests.waiting import wait_until

NS = "com.example.orders"
QUOTAS = Quotas(max_requests_per_window=10_000, max_publications_per_publisher=10_000)


def _cpu(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()`` and the fewest CPU seconds this process (the servers run here) spent on it in
    3 tries."""
    best, out = float("inf"), None
    for _ in range(3):
        t = time.process_time()
        out = call()
        best = min(best, time.process_time() - t)
    return out, best


def _key(k: int) -> Principal:
    return Principal(k.to_bytes(4, "big") + b"\x07" * 24 + b"\x02")


@contextmanager
def _served(
    roles: list[tuple[Role, Identity, StreamsStore | None]],
) -> Iterator[dict[bytes, str]]:
    """``roles`` on loopback, each in the others' directory: the directory."""
    directory: dict[bytes, str] = {}
    servers = [HttpRoleServer(role, ident, directory, st) for role, ident, st in roles]
    stops = []
    try:
        for server, (_, ident, _) in zip(servers, roles, strict=True):
            port, stop = serve(server)
            directory[ident.principal.bytes] = f"http://127.0.0.1:{port}"
            stops.append(stop)
        yield directory
    finally:
        for stop in stops:
            stop()


def _orchestrator(bc: Identity) -> tuple[Orchestrator, Identity, StreamsStore, LocalStreams]:
    me = Identity.generate()
    streams = LocalStreams(MemoryLog())
    store = StreamsStore(streams)
    core = open_orchestrator(store, me.principal, [bc.principal], QUOTAS, open_ledger(store, 1))
    return core, me, store, streams


def _settle(core: Role, store: StreamsStore) -> None:
    """The setup's storage actions performed, its calls dropped (before the core is served)."""
    store.perform_many([a for a in core.take_outbox() if not isinstance(a, Call)])


def _length(streams: LocalStreams, name: str) -> int:
    try:
        return streams.bounds(name)[1]
    except Exception:  # not made yet: nothing was ever sent on it
        return 0


# -- the orchestrator: publication registration -----------------------------------------------
def test_registering_a_publication_again_announces_its_subscriptions_once():
    S = 200
    bc, pub, alice = Identity.generate(), Identity.generate(), Identity.generate()
    core, me, store, streams = _orchestrator(bc)
    now = time.time_ns()
    for k in range(S):  # subscribed before the publication exists; nobody serves these keys
        assert isinstance(core.register_subscription(_key(k), [Registration(NS)], now)[0], Ok)
    assert isinstance(core.register_subscription(alice.principal, [Registration(NS)], now)[0], Ok)
    _settle(core, store)
    bcore = Broadcaster(bc.principal, me.principal)
    sub = Subscriber(alice.principal, me.principal)
    pcore = Publisher(pub.principal, me.principal)
    roles: list[tuple[Role, Identity, StreamsStore | None]] = [
        (core, me, store),
        (bcore, bc, None),
        (sub, alice, None),
        (pcore, pub, StreamsStore(LocalStreams(MemoryLog()))),
    ]
    with _served(roles) as directory:
        client = HttpEventsClient(directory[me.principal.bytes], pub, timeout=60)
        reg = Registration(NS, publication_config(0))
        [r] = client.call("icrc72_register_publication", [reg])
        assert isinstance(r, Ok), r
        # new: every subscription goes to its broadcaster, and alice learns her broadcaster
        wait_until(lambda: len(bcore.routes.get(NS, ())) == S + 1, what="subscriptions announced")
        wait_until(lambda: sub.valid.get(NS) == {bc.principal.bytes}, what="alice told")
        bsys, asys = sysmsg.broadcaster_sys(bc.principal), sysmsg.subscriber_sys(alice.principal)
        before = _length(streams, bsys), _length(streams, asys)
        # the same publication again, 20 times in one call: its broadcaster is told of the
        # publication once, and no subscription is announced again (it sent 20 x 201 x 2)
        t = time.process_time()
        out = client.call("icrc72_register_publication", [reg] * 20)
        cpu = time.process_time() - t
        assert out == [Ok(r.value)] * 20
        assert (_length(streams, bsys), _length(streams, asys)) == (before[0] + 1, before[1])
        assert cpu < 1.0, cpu  # was ~2 CPU-s (8,040 system messages and calls)


def test_a_publications_registration_costs_its_namespace_not_every_subscription():
    """Subscriptions to namespaces nobody publishes (any principal may make them): a call of
    100 new publications cost ~100 x all of them."""

    def cpu_with(subscriptions: int) -> float:
        bc = Identity.generate()
        core, me, store, _ = _orchestrator(bc)
        for k in range(subscriptions):  # planted: only the table's size matters here
            key, ns = _key(k), f"elsewhere.{k % 1000}"
            core.subscriptions[(ns, key.bytes)] = Subscription(k + 1, ns, key, [])
        _settle(core, store)
        pubs = [Identity.generate() for _ in range(3)]
        roles: list[tuple[Role, Identity, StreamsStore | None]] = [
            (core, me, store),
            (Broadcaster(bc.principal, me.principal), bc, None),
        ]
        roles += [
            (Publisher(p.principal, me.principal), p, StreamsStore(LocalStreams(MemoryLog())))
            for p in pubs
        ]
        with _served(roles) as directory:
            url = directory[me.principal.bytes]
            clients = iter([HttpEventsClient(url, p, timeout=60) for p in pubs])

            def register() -> None:
                c = next(clients)  # 100 new namespaces each try
                regs = [Registration(f"{c.identity.principal}.{i}") for i in range(100)]
                assert all(isinstance(r, Ok) for r in c.call("icrc72_register_publication", regs))

            return _cpu(register)[1]

    small, large = cpu_with(1_000), cpu_with(150_000)
    assert large < 2 * small + 0.15, (small, large)  # was ~1.5 CPU-s more at 150,000


# -- the broadcaster: a stranger's publish ----------------------------------------------------
def _replay_adds(bc: Identity, orch: Identity, pub: Identity, n: int) -> EventNotification:
    adds = [
        sysmsg.BroadcasterReplayAdd(i, NS, bc.principal, _key(i), None, None, pub.principal)
        for i in range(1, n + 1)
    ]
    data = sysmsg.broadcaster_replay_add(adds)
    return _sys_note(bc, orch, data, 0)


def _sys_note(bc: Identity, orch: Identity, data: Any, eid: int) -> EventNotification:
    ns = sysmsg.broadcaster_sys(bc.principal)
    return EventNotification(eid + 1, eid, None, 1, ns, data, None, orch.principal)


def test_a_strangers_publish_costs_its_events_not_the_replays_held():
    N = 2_000

    def cpu_with(replays: int) -> float:
        bc, orch, pub = Identity.generate(), Identity.generate(), Identity.generate()
        core = Broadcaster(bc.principal, orch.principal)
        core.publishers[NS] = pub.principal
        assert core.handle_notification(orch.principal, [_replay_adds(bc, orch, pub, replays)], 1)
        core.take_outbox()  # the subscribers' replay adds: nobody serves them
        with _served([(core, bc, None)]) as directory:
            stranger = Identity.generate()
            client = HttpEventsClient(directory[bc.principal.bytes], stranger, timeout=60)
            p = stranger.principal
            events = [  # each its own headers and an unknown replay id
                Event(i, None, 1, NS, {"Nat": 0}, p, [(H_REPLAY_ID, {"Nat": 10**9 + i})])
                for i in range(N)
            ]
            out, cpu = _cpu(lambda: client.call("icrc72_publish", events))
            assert out == [Err("Unauthorized")] * N
            return cpu

    small, large = cpu_with(10), cpu_with(3_000)
    assert large < 2 * small + 0.15, (small, large)  # was ~1 CPU-s more at 3,000


def test_a_named_relayer_is_still_told_apart_from_a_stranger():
    """The relayer index: a relayer's event for a replay gone is dropped (``Ok([])``), not
    refused; once the orchestrator removes it as relayer, or removes the replay, it is a
    stranger again."""
    bc, orch, pub, relay = (Identity.generate() for _ in range(4))
    core = Broadcaster(bc.principal, orch.principal)
    core.publishers[NS] = pub.principal
    with _served([(core, bc, None)]) as directory:
        url = directory[bc.principal.bytes]
        control = HttpEventsClient(url, orch, timeout=30)
        eid = iter(range(1, 100))

        def tell(data: Any) -> None:
            note = _sys_note(bc, orch, data, next(eid))
            assert control.call("icrc72_handle_notification", [note]) == 1

        tell(sysmsg.broadcaster_replay_add([
            sysmsg.BroadcasterReplayAdd(r, NS, relay.principal, _key(r), None, None, pub.principal)
            for r in (1, 2)
        ]))  # fmt: skip
        for r in (1, 2):
            tell(sysmsg.broadcaster_relayer_add(sysmsg.RelayerAdd(r, NS, relay.principal)))
        tell(sysmsg.broadcaster_relayer_add(sysmsg.RelayerAdd(1, NS, relay.principal)))  # again

        def late(who: Identity) -> Any:
            e = Event(0, None, 1, NS, {"Nat": 0}, who.principal, [(H_REPLAY_ID, {"Nat": 77})])
            [r] = HttpEventsClient(url, who, timeout=30).call("icrc72_publish", [e])
            return r

        stranger = Identity.generate()
        assert late(relay) == Ok([]) and late(stranger) == Err("Unauthorized")
        tell(sysmsg.broadcaster_relayer_remove([1]))
        assert late(relay) == Ok([])  # still relayer of replay 2
        tell(sysmsg.broadcaster_replay_remove([2]))
        assert late(relay) == Err("Unauthorized")
        assert core.relayer_routes == {}


# -- the orchestrator: icrc77_get_replays filters -----------------------------------------------
def test_replay_filters_are_bounded_and_still_list_the_same():
    bc, pub, sub = Identity.generate(), Identity.generate(), Identity.generate()
    core, me, store, _ = _orchestrator(bc)
    now = time.time_ns()
    reg = Registration(NS, publication_config(0))
    assert isinstance(core.register_publication(pub.principal, [reg], now)[0], Ok)
    core.update_publication(pub.principal, [(NS, HEAD_KEY, {"Nat": 100})], now)
    assert isinstance(core.register_subscription(sub.principal, [Registration(NS)], now)[0], Ok)
    for k in range(3):
        [r] = core.register_replay(sub.principal, [ReplayRegistration(NS, 0, 10)], now + k)
        assert isinstance(r, Ok), r
        done = ReplayStatusUpdate(r.value, ReplayState("completed", 10))
        core.replay_status(pub.principal, [done], now + k)
    _settle(core, store)
    MAX_FILTER_SLICES, MAX_FILTER_STATISTICS = 16, 64  # docs/events.md
    assert orchestrator_replays.MAX_FILTER_SLICES == MAX_FILTER_SLICES
    assert orchestrator_replays.MAX_FILTER_STATISTICS == MAX_FILTER_STATISTICS
    with _served([(core, me, store)]) as directory:
        client = HttpEventsClient(directory[me.principal.bytes], sub, timeout=60)
        mine = ("BySubscriber", sub.principal)
        names = ("icrc77:replay:broadcaster",) * MAX_FILTER_STATISTICS
        at_limit = OrchestrationFilter("List", names, (mine,) * MAX_FILTER_SLICES)
        page = client.call("icrc77_get_replays", GetReplays(None, None, at_limit))
        assert [s.replay_id for s in page] == [1, 2, 3]
        one = [("icrc77:replay:broadcaster", {"Principal": bc.principal})]
        assert all(s.stats == one for s in page)
        other = OrchestrationFilter("All", (), (mine, ("ByNamespace", "com.example.none")))
        assert client.call("icrc77_get_replays", GetReplays(None, None, other)) == []
        for flt in (
            OrchestrationFilter("None", (), (mine,) * (MAX_FILTER_SLICES + 1)),
            OrchestrationFilter("List", ("x",) * (MAX_FILTER_STATISTICS + 1), ()),
        ):
            with pytest.raises(CallRejected) as e:
                client.call("icrc77_get_replays", GetReplays(None, None, flt))
            assert e.value.status == 400 and "FilterTooLarge" in e.value.reason, e.value.reason
        assert len(client.call("icrc77_get_replays", GetReplays())) == 3  # no filter: as before


# -- the subscriber: a stranger on its system namespace ---------------------------------------
def test_a_strangers_system_notifications_cost_their_count_not_the_namespaces():
    N = 3_000

    def cpu_with(namespaces: int) -> float:
        me, orch = Identity.generate(), Identity.generate()
        core = Subscriber(me.principal, orch.principal)
        for i in range(namespaces):  # what the orchestrator's broadcaster:add messages leave
            core.valid[f"ns.{i}"] = {_key(i).bytes}
        with _served([(core, me, None)]) as directory:
            stranger = Identity.generate()
            client = HttpEventsClient(directory[me.principal.bytes], stranger, timeout=60)
            my_sys = sysmsg.subscriber_sys(me.principal)
            notes = [
                EventNotification(i, i, None, 1, my_sys, {"Nat": 0}, None, stranger.principal)
                for i in range(N)
            ]
            out, cpu = _cpu(lambda: client.call("icrc72_handle_notification", notes))
            assert out == 0 and core.rejected == 3 * N
            # a broadcaster of one of its namespaces is still heard on it
            bc = HttpEventsClient(directory[me.principal.bytes], Identity.generate(), timeout=60)
            core.valid["ns.mine"] = {bc.identity.principal.bytes}
            add = sysmsg.subscriber_replay_add([(5, bc.identity.principal)])
            note = EventNotification(N, N, None, 1, my_sys, add, None, bc.identity.principal)
            assert bc.call("icrc72_handle_notification", [note]) == 1
            assert 5 in core.replays
            return cpu

    small, large = cpu_with(1), cpu_with(5_000)
    assert large < 2 * small + 0.15, (small, large)  # was ~1.5 CPU-s more at 5,000
