"""A subscriber slow to answer its notifications holds up no other subscriber, over HTTP.

Before: the broadcaster's notification calls were ordered calls, whose replies the adapter
hands to the core in call order, so a subscriber that took each notification and answered
just before ``CALL_TIMEOUT_S`` (120 s) held every later call of the broadcaster that long:
the other subscribers of the namespace got nothing meanwhile, and the slow one, answering,
was never stalled."""

from __future__ import annotations

import socket
import time

from loglake.events import server as srv_mod
from loglake.events import sysmsg
from loglake.events.broadcaster import Broadcaster
from loglake.events.client import HttpEventsClient
from loglake.events.identity import Identity
from loglake.events.messages import Event, EventNotification, Ok, Registration
from loglake.events.server import HttpRoleServer
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


def test_a_subscriber_that_does_not_answer_holds_up_no_other(monkeypatch):
    monkeypatch.setattr(srv_mod, "CALL_TIMEOUT_S", 30.0)  # the slow one answers within it
    bc, orch, pub = Identity.generate(), Identity.generate(), Identity.generate()
    slow, fast = Identity.generate(), Identity.generate()
    core = Broadcaster(bc.principal, orch.principal)
    for n, data in enumerate(
        [
            sysmsg.broadcaster_publication_add([(NS, pub.principal)]),
            sysmsg.broadcaster_subscriber_add([(NS, slow.principal, []), (NS, fast.principal, [])]),
        ]
    ):  # what the orchestrator tells it
        ns = sysmsg.broadcaster_sys(bc.principal)
        note = EventNotification(n, n, None, 0, ns, data, None, orch.principal, None)
        assert core.handle_notification(orch.principal, [note], 0) == 1
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
            client = HttpEventsClient(f"http://127.0.0.1:{bc_port}", pub, timeout=30)
            t0 = time.monotonic()
            for i in range(3):  # three publish calls: three notification calls to each
                ev = Event(i, i - 1 if i else None, 1, NS, {"Nat": i}, pub.principal, None)
                assert [type(r) for r in client.call("icrc72_publish", [ev])] == [Ok]
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


def test_a_subscriber_that_does_not_answer_holds_up_no_call_of_the_orchestrator(monkeypatch):
    """The orchestrator tells a subscriber which broadcaster serves it; one that took the call
    and never answered held every later call of the orchestrator for the call timeout, and
    again at each resend (up to 360): here the next publication's broadcaster heard of it only
    after 30 s."""
    monkeypatch.setattr(srv_mod, "CALL_TIMEOUT_S", 30.0)
    me, bc, pub, slow = (Identity.generate() for _ in range(4))
    store = StreamsStore(LocalStreams(MemoryLog()))
    orch = open_orchestrator(store, me.principal, [bc.principal], None, open_ledger(store, fee=1))
    bc_core = Broadcaster(bc.principal, me.principal)
    directory: dict[bytes, str] = {}
    stops = []
    try:
        with peer_server(_takes_and_never_answers) as slow_url:
            directory[slow.principal.bytes] = slow_url  # the publisher has no address: dropped
            for core, ident, st in ((orch, me, store), (bc_core, bc, None)):
                port, stop = serve(HttpRoleServer(core, ident, directory, st))
                stops.append(stop)
                directory[ident.principal.bytes] = f"http://127.0.0.1:{port}"
            url = directory[me.principal.bytes]

            def register(who: Identity, method: str, ns: str) -> None:
                got = HttpEventsClient(url, who, timeout=30).call(method, [Registration(ns)])
                assert type(got[0]) is Ok, got

            register(slow, "icrc72_register_subscription", NS)
            # the subscription is assigned: the broadcaster, then the subscriber are told
            register(pub, "icrc72_register_publication", NS)
            wait_until(lambda: NS in bc_core.routes, 10, what="the broadcaster told of bob")
            t0 = time.monotonic()
            other = NS + ".2"
            register(pub, "icrc72_register_publication", other)
            wait_until(lambda: other in bc_core.publishers, 10, what="the next publication")
            assert time.monotonic() - t0 < 10
    finally:
        for stop in reversed(stops):
            stop()
