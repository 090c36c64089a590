"""A subscriber slow to answer its notifications holds up no other subscriber, over HTTP.

Before: the broadcaster's notification calls were ordered calls, whose replies the adapter
hands to the core in call order, so a subscriber that took each notification and answered
just before ``CALL_TIMEOUT_S`` (120 s) held every later call of the broadcaster that long:
the other subscribers of the namespace got nothing meanwhile, and the slow one, answering,
was never stalled."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from loglake.events import identity, sysmsg
from loglake.events import server as srv_mod
from loglake.events.broadcaster import Broadcaster
from loglake.events.client import HttpEventsClient
from loglake.events.identity import Identity
from loglake.events.messages import Event, EventNotification, Ok, Registration
from loglake.events.server import HttpRoleServer, RoleRunner
from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
from loglake.events.subscriber import Subscriber
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.events.served import serve
from tests.events.wait import wait_until
from tests.peers import peer_server

NS = "com.example.slow"


def _takes_and_never_answers(s: socket.socket) -> None:
    """Reads every request it is sent (its buffers never fill) and answers none."""
    while s.recv(1 << 16):
        pass


def _broadcaster(bc: Identity, orch: Identity, pub: Identity, *subs: Identity) -> Broadcaster:
    """A broadcaster of ``NS``, published by ``pub``, subscribed to by ``subs``, as its
    orchestrator would have configured it."""
    core = Broadcaster(bc.principal, orch.principal)
    for n, data in enumerate(
        [
            sysmsg.broadcaster_publication_add([(NS, pub.principal)]),
            sysmsg.broadcaster_subscriber_add([(NS, s.principal, []) for s in subs]),
        ]
    ):
        ns = sysmsg.broadcaster_sys(bc.principal)
        note = EventNotification(n, n, None, 0, ns, data, None, orch.principal, None)
        assert core.handle_notification(orch.principal, [note], 0) == 1
    return core


def _publish(url: str, pub: Identity, n: int) -> None:
    client = HttpEventsClient(url, pub, timeout=30)
    for i in range(n):  # a call each: a notification call to each subscriber each
        ev = Event(i, i - 1 if i else None, 1, NS, {"Nat": i}, pub.principal, None)
        assert [type(r) for r in client.call("icrc72_publish", [ev])] == [Ok]


def test_a_subscriber_that_does_not_answer_holds_up_no_other(monkeypatch):
    monkeypatch.setattr(srv_mod, "CALL_TIMEOUT_S", 30.0)  # the slow one answers within it
    bc, orch, pub = Identity.generate(), Identity.generate(), Identity.generate()
    slow, fast = Identity.generate(), Identity.generate()
    core = _broadcaster(bc, orch, pub, slow, fast)
    sub = Subscriber(fast.principal, orch.principal)
    sub.valid[NS] = {bc.principal.bytes}
    directory: dict[bytes, str] = {}
    stops = []
    try:
        with peer_server(_takes_and_never_answers) as slow_url:
            sub_port, stop = serve(HttpRoleServer(sub, fast, directory))
            stops.append(stop)
            bc_port, stop = serve(HttpRoleServer(core, bc, directory))
            stops.append(stop)
            directory[slow.principal.bytes] = slow_url
            directory[fast.principal.bytes] = f"http://127.0.0.1:{sub_port}"
            directory[bc.principal.bytes] = f"http://127.0.0.1:{bc_port}"
            t0 = time.monotonic()
            _publish(f"http://127.0.0.1:{bc_port}", pub, 3)
            wait_until(lambda: sub.inbox_seq == 3, 10, what="the fast subscriber's 3 events")
            took = time.monotonic() - t0
            # its confirmations went back too: nothing of it pending at the broadcaster
            wait_until(lambda: not core.unconfirmed.get(fast.principal.bytes), 10)
            assert [n.data for n in sub.take()] == [{"Nat": 0}, {"Nat": 1}, {"Nat": 2}]
            assert core.unconfirmed[slow.principal.bytes] == 3  # still held by the slow one
            assert took < 10, took
    finally:
        for stop in reversed(stops):
            stop()


@pytest.mark.parametrize("hung_role", ["subscriber", "publisher"])
def test_a_role_that_does_not_answer_holds_up_no_call_of_the_orchestrator(monkeypatch, hung_role):
    """The orchestrator tells a subscriber which broadcaster serves it, and a publisher which
    broadcaster takes its events; one that took the call and never answered held every later
    call of the orchestrator for the call timeout, and again at each resend (up to 360): here
    the broadcaster heard of the subscription, or of the next publication, only after 30 s."""
    monkeypatch.setattr(srv_mod, "CALL_TIMEOUT_S", 30.0)
    me, bc, pub, sub = (Identity.generate() for _ in range(4))
    hung = sub if hung_role == "subscriber" else pub
    store = StreamsStore(LocalStreams(MemoryLog()))
    orch = open_orchestrator(store, me.principal, [bc.principal], None, open_ledger(store, fee=1))
    bc_core = Broadcaster(bc.principal, me.principal)
    directory: dict[bytes, str] = {}
    stops = []
    try:
        with peer_server(_takes_and_never_answers) as hung_url:
            directory[hung.principal.bytes] = hung_url  # the other has no address: dropped
            for core, ident, st in ((orch, me, store), (bc_core, bc, None)):
                port, stop = serve(HttpRoleServer(core, ident, directory, st))
                stops.append(stop)
                directory[ident.principal.bytes] = f"http://127.0.0.1:{port}"
            url = directory[me.principal.bytes]

            def register(who: Identity, method: str, ns: str) -> None:
                got = HttpEventsClient(url, who, timeout=30).call(method, [Registration(ns)])
                assert type(got[0]) is Ok, got

            register(sub, "icrc72_register_subscription", NS)
            # the broadcaster, then the publisher are told of the publication; then the
            # subscription is assigned: the broadcaster, then the subscriber are told
            t0 = time.monotonic()
            register(pub, "icrc72_register_publication", NS)
            wait_until(lambda: NS in bc_core.routes, 10, what="the broadcaster told of bob")
            other = NS + ".2"
            register(pub, "icrc72_register_publication", other)
            wait_until(lambda: other in bc_core.publishers, 10, what="the next publication")
            assert time.monotonic() - t0 < 10
    finally:
        for stop in reversed(stops):
            stop()


class _SlowSubscriberServer(HttpRoleServer):
    """Takes ``SLOW_S`` to handle each notification call (one at a time on a connection)."""

    SLOW_S = 0.8

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["method"] == "icrc72_handle_notification":
            await asyncio.sleep(self.SLOW_S)
        return await super().handle(request)


def test_lane_calls_answered_in_time_are_never_reached_expired():
    """The worst case the bound allows: the last of ``LANE_DEPTH`` calls signed at once is
    reached after the others each took ``CALL_TIMEOUT_S``; it must still be valid."""
    wait = (srv_mod.LANE_DEPTH - 1) * srv_mod.CALL_TIMEOUT_S * 1e9
    assert wait < identity.MAX_EXPIRY_NS // 2


def test_a_subscriber_slow_to_answer_gets_every_notification(monkeypatch):
    """8 notification calls to a subscriber that handles one each 0.8 s, each answered within
    the call timeout (1.5 s), calls good for 2 s. Before, every queued unordered call was
    signed and written at once (then 4 at a time), so the subscriber reached the later ones
    after they had expired: refused (401, final), their notifications given up and the
    subscriber stalled, though it answered every call. Now ``LANE_DEPTH`` (2) at a time,
    each signed as it leaves."""
    monkeypatch.setattr(identity, "MAX_EXPIRY_NS", 4_000_000_000)  # a call is good for 2 s
    monkeypatch.setattr(srv_mod, "CALL_TIMEOUT_S", 1.5)
    bc, orch, pub, me = (Identity.generate() for _ in range(4))
    core = _broadcaster(bc, orch, pub, me)
    sub = Subscriber(me.principal, orch.principal)
    sub.valid[NS] = {bc.principal.bytes}
    directory: dict[bytes, str] = {}
    stops = []
    try:
        port, stop = serve(_SlowSubscriberServer(sub, me, directory))
        stops.append(stop)
        directory[me.principal.bytes] = f"http://127.0.0.1:{port}"
        port, stop = serve(HttpRoleServer(core, bc, directory))
        stops.append(stop)
        directory[bc.principal.bytes] = f"http://127.0.0.1:{port}"
        _publish(f"http://127.0.0.1:{port}", pub, 8)
        wait_until(lambda: sub.inbox_seq == 8, 30, what="every notification handled")
        wait_until(lambda: not core.unconfirmed.get(me.principal.bytes), 10)
        assert core.stats.notify_dropped == 0 and me.principal.bytes not in core.stalled
    finally:
        for stop in reversed(stops):
            stop()


def test_a_hung_subscriber_is_sent_no_more_once_a_call_times_out(monkeypatch):
    """A subscriber that reads every call and answers none: once a call times out, the calls
    behind it on its connection fail as timed out too, and so do those still queued for it,
    unsent (a hung subscriber is stalled, not retried). Before, they failed as a closed
    connection and were sent again, each round (105 requests for 20 notification calls in
    16 s); then the queued ones still went out, a few every call timeout."""
    monkeypatch.setattr(srv_mod, "CALL_TIMEOUT_S", 1.0)
    bc, orch, pub, hung = (Identity.generate() for _ in range(4))
    core = _broadcaster(bc, orch, pub, hung)
    posts = []

    def count(s: socket.socket) -> None:
        while data := s.recv(1 << 16):
            posts.append(data.count(b"POST /api/icrc72_handle_notification"))

    directory: dict[bytes, str] = {}
    stops = []
    try:
        with peer_server(count) as hung_url:
            directory[hung.principal.bytes] = hung_url
            port, stop = serve(HttpRoleServer(core, bc, directory))
            stops.append(stop)
            directory[bc.principal.bytes] = f"http://127.0.0.1:{port}"
            _publish(f"http://127.0.0.1:{port}", pub, 12)
            wait_until(lambda: core.stats.notify_dropped == 12, 10, what="all given up")
            time.sleep(1.5)  # a resend would have left by now
            assert sum(posts) == srv_mod.LANE_DEPTH  # those sent before the first timed out
            assert hung.principal.bytes in core.stalled and not len(core.notify_resender)
    finally:
        for stop in reversed(stops):
            stop()


@pytest.mark.timeout(60, method="thread")  # before, the stop hung for good
def test_a_broadcaster_stops_at_once_with_notifications_pending():
    """Stopping (what SIGTERM does in ``serve_role``) while notification calls are pending, to
    a subscriber that never reads and one with no address. A reply already failed when the
    stop's cancel landed made ``asyncio.wait_for`` (Python 3.11) swallow the cancel; the task
    then woke the pumper, which swallowed its own, and the stop never ended."""
    bc, orch, pub, hung, gone = (Identity.generate() for _ in range(5))

    async def stop_with_calls_pending(url: str) -> bool:
        core = _broadcaster(bc, orch, pub, hung, gone)
        server = HttpRoleServer(core, bc, {hung.principal.bytes: url})  # `gone`: no address
        runner = RoleRunner(server.app)
        await runner.setup()
        for i in range(8):
            ev = Event(i, i - 1 if i else None, 1, NS, {"Text": "x" * 900_000}, pub.principal)
            core.publish(pub.principal, [ev], 0)
            server.drain()
        for _ in range(4):
            await asyncio.sleep(0)
        stopping = asyncio.ensure_future(runner.cleanup())
        done, _ = await asyncio.wait([stopping], timeout=10)
        return bool(done)

    with peer_server() as never_reads:
        assert all(asyncio.run(stop_with_calls_pending(never_reads)) for _ in range(3))
