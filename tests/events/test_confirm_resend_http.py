"""A subscriber's failed confirmation is sent again over HTTP: its server pumps it.

Before: ``HttpRoleServer`` pumped publishers, broadcasters and orchestrators only, so the
Subscriber's resends of failed ``icrc72_confirm_notifications`` calls waited for ever and the
notifications stayed in the broadcaster's window."""

from __future__ import annotations

from loglake.events.broadcaster import Broadcaster
from loglake.events.client import HttpEventsClient
from loglake.events.identity import Identity
from loglake.events.messages import EventNotification
from loglake.events.server import HttpRoleServer
from loglake.events.subscriber import Subscriber
from tests.events.served import serve
from tests.events.wait import wait_until
from tests.procs import free_port

NS = "com.example.confirm"


def test_a_confirmation_refused_while_the_broadcaster_was_down_reaches_it_later():
    me, bc, orch = Identity.generate(), Identity.generate(), Identity.generate()
    sub = Subscriber(me.principal, orch.principal)
    sub.valid[NS] = {bc.principal.bytes}
    directory = {bc.principal.bytes: f"http://127.0.0.1:{free_port()}"}  # nobody listens
    port, stop = serve(HttpRoleServer(sub, me, directory))
    stops = [stop]
    try:
        note = EventNotification(7, 0, None, 0, NS, {"Nat": 1}, None, bc.principal, None)
        client = HttpEventsClient(f"http://127.0.0.1:{port}", bc, timeout=30)
        assert client.call("icrc72_handle_notification", [note]) == 1
        wait_until(lambda: sub.resender._attempts, what="the confirmation refused once")
        core = Broadcaster(bc.principal, orch.principal)
        confirmed = []
        real = core.methods["icrc72_confirm_notifications"]
        core.methods["icrc72_confirm_notifications"] = lambda c, ids, now: (
            confirmed.append((c, list(ids))) or real(c, ids, now)
        )
        bc_port, bc_stop = serve(HttpRoleServer(core, bc, {}))
        stops.append(bc_stop)
        directory[bc.principal.bytes] = f"http://127.0.0.1:{bc_port}"
        wait_until(lambda: confirmed, what="the confirmation sent again", timeout=30)
        assert confirmed == [(me.principal, [7])]
        wait_until(lambda: not sub.resender.waiting and not sub.resender._attempts)
    finally:
        for s in stops:
            s()
