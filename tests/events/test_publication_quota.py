"""``icrc72_register_publication`` from a hostile caller: bounded per publisher and rated.

Any signed caller may register a publication to a namespace nobody has claimed, and each one
is kept in memory, journalled, and announced with two system messages (to its broadcaster and
to the publisher). Without a bound one principal registered 1,600-2,900 publications to
made-up namespaces in ~2 s over HTTP (100 a call), ~5.6 KB each in the orchestrator's memory,
and left 4,769 system messages queued behind them that took 6.4 s more to send, ahead of
every other client's. Now a publisher holds at most ``Quotas.max_publications_per_publisher``
(``GenericError`` 1), and each registration counts toward the request rate (``GenericError``
2), as subscriptions do (``test_subscription_quota``). A publisher told to slow down
registers again later rather than giving up.
"""

from __future__ import annotations

from loglake.events.client import HttpEventsClient
from loglake.events.identity import Identity
from loglake.events.messages import Ok, Registration
from loglake.events.orchestrator import Quotas
from tests.events.served import serve_orchestrator
from tests.events.test_orchestrator_restart import restart
from tests.events.test_subscription_quota import _codes
from tests.events.world import NS, World


def _publish(w: World, who: str, names: list[str]) -> list:
    return w.call(who, "icrc72_register_publication", [Registration(n) for n in names])


def test_publications_count_toward_the_request_rate_over_http():
    attacker = Identity.generate()
    orch, url, stop = serve_orchestrator(publishers=(attacker,))  # 100 requests a window
    try:
        client = HttpEventsClient(url, attacker, timeout=30)
        out = []
        for k in range(3):  # was 300 publications, every one kept and announced
            names = [f"made.up.{k}.{i}" for i in range(100)]
            out += client.call("icrc72_register_publication", [Registration(n) for n in names])
        assert all(isinstance(r, Ok) for r in out[:100])
        assert set(_codes(out[100:])) == {2}
        assert "requests a window" in out[100].payload["message"]
        other = HttpEventsClient(url, Identity.generate(), timeout=30)
        assert isinstance(other.call("icrc72_register_publication", [Registration(NS)])[0], Ok)
        assert len(orch.publications) == 101
    finally:
        stop()


def test_a_publisher_holds_at_most_its_quota_of_publications():
    w = World(quotas=Quotas(max_publications_per_publisher=5, max_requests_per_window=10**6))
    got = _publish(w, "bob", [f"made.up.{i}" for i in range(8)])
    assert all(isinstance(r, Ok) for r in got[:5])
    assert _codes(got[5:]) == [1, 1, 1]
    assert "at most 5 publications" in got[5].payload["message"]
    assert isinstance(_publish(w, "bob", ["made.up.0"])[0], Ok)  # an existing one: updated
    assert isinstance(_publish(w, "alice", [NS])[0], Ok)  # per publisher
    bob = w.p["bob"]
    assert sum(1 for p in w.orch.publications.values() if p.publisher == bob) == 5
    new = restart(w)  # the count is rebuilt from the journal
    assert _publish(w, "bob", ["made.up.9"])[0].payload["error_code"] == 1
    assert new.publication_counts[bob.bytes] == 5


def test_a_publisher_told_to_slow_down_registers_later():
    w = World(quotas=Quotas(max_requests_per_window=1))
    w.register_publication()  # the publisher's one request this window
    w.pub.register("com.example.second", [], w.clock())
    w.net._collect(w.pub)
    w.net.run()
    st = w.pub.registrations["com.example.second"]
    assert st.state == "retrying" and "GenericError" in (st.last_error or ""), st
    w.clock.now += w.quotas.window_ns  # the window passes; the publisher's back-off too
    w.net.run()
    assert w.pub.registrations["com.example.second"].state == "registered"
