"""A replay for a subscriber that cannot be reached is refused (``GenericError`` 5).

Found from outside (review of the ICRC-72/77 part): four freshly generated keys, in no
directory, each subscribed to ``orders`` and registered 4 replays of ``[0, null)`` of a
300,100-event namespace. The namespace's 16 concurrent replays were theirs: an honest
subscriber's ``icrc77_register_replay`` got ``GenericError`` 1 ("too many concurrent replays
for this namespace") for 30-40 s, again with new keys each time, and the Publisher read and
sent 16 × 300,100 events that nobody could receive. ICRC-77 is silent on where a subscriber is
reached; here a subscriber is reached through the adapter (the HTTP server's directory, the
in-process network's roles), and a replay to one it cannot reach is pure waste.
"""

from __future__ import annotations

from loglake.events.client import HttpEventsClient
from loglake.events.identity import Identity
from loglake.events.messages import (
    C_REPLAY,
    Err,
    Ok,
    Registration,
    ReplayRegistration,
    ReplayState,
)
from loglake.events.orchestrator_state import E_NO_ADDRESS
from tests.events.served import serve_orchestrator
from tests.events.world import NS, World


def _code(r: Ok | Err) -> int | None:
    return r.payload["error_code"] if isinstance(r, Err) and r.tag == "GenericError" else None


def test_a_replay_for_a_subscriber_nobody_can_reach_is_refused():
    w = World()
    w.register_publication()
    w.publish(3_000)
    squatters = [Identity.generate().principal for _ in range(4)]
    for p in squatters:
        [sub] = w.call(p, "icrc72_register_subscription", [Registration(NS)])
        assert isinstance(sub, Ok), sub
        got = w.call(p, "icrc77_register_replay", [ReplayRegistration(NS, 0, None)] * 4)
        assert [_code(r) for r in got] == [E_NO_ADDRESS] * 4, got
        assert "no delivery address" in got[0].payload["message"]
    assert len(w.orch.replays) == 0  # nothing registered, nothing for the Publisher to send
    w.subscribe("alice")  # a subscriber the network reaches: served as before
    rid = w.replay("alice", 0, 3)
    assert isinstance(rid, Ok), rid
    w.settle()
    assert w.status("alice", rid.value).status == ReplayState("completed", 3)


def test_the_http_orchestrator_refuses_a_replay_for_a_key_its_directory_lacks():
    listed = Identity.generate()
    _, url, stop = serve_orchestrator(publishers=(listed,))  # listed: in the directory
    try:
        fresh = HttpEventsClient(url, Identity.generate(), timeout=30)
        cfg = [(C_REPLAY, {"Bool": True})]
        assert isinstance(
            fresh.call("icrc72_register_publication", [Registration("x", cfg)])[0], Ok
        )
        assert isinstance(fresh.call("icrc72_register_subscription", [Registration("x")])[0], Ok)
        [r] = fresh.call("icrc77_register_replay", [ReplayRegistration("x", 0, None)])
        assert _code(r) == E_NO_ADDRESS, r
        assert "directory does not list" in r.payload["message"]
        ok = HttpEventsClient(url, listed, timeout=30)
        assert isinstance(ok.call("icrc72_register_subscription", [Registration("x")])[0], Ok)
        [r] = ok.call("icrc77_register_replay", [ReplayRegistration("x", 0, None)])
        assert _code(r) != E_NO_ADDRESS, r  # past the address check
    finally:
        stop()
