"""``icrc72_register_subscription`` from a hostile caller: bounded per subscriber and rated.

A namespace need not exist to be subscribed to (a subscription waits for its publication), and
every subscription is kept in memory and journalled. Without a bound one principal registered
20,000 subscriptions to made-up namespaces in ~2 s (100 a call, no request rate), and every
later ``icrc72_register_publication`` scanned them all. Now a subscriber holds at most
``Quotas.max_subscriptions_per_subscriber`` (``GenericError`` 1, as the replay quotas), and
each registration counts toward the request rate (``GenericError`` 2), as replays do.
"""

from __future__ import annotations

from loglake.events.messages import Ok, Registration
from loglake.events.orchestrator import Quotas
from tests.events.test_orchestrator_restart import restart
from tests.events.world import NS, World


def _subscribe(w: World, who: str, names: list[str]) -> list:
    return w.call(who, "icrc72_register_subscription", [Registration(n) for n in names])


def _codes(results: list) -> list:
    return [r.value if isinstance(r, Ok) else r.payload["error_code"] for r in results]


def test_subscriptions_count_toward_the_request_rate():
    w = World()  # 100 requests a window
    out = []
    for k in range(3):  # was 300 subscriptions, every one kept
        out += _subscribe(w, "bob", [f"made.up.{k}.{i}" for i in range(100)])
    assert all(isinstance(r, Ok) for r in out[:100])
    assert set(_codes(out[100:])) == {2}
    assert len(w.orch.subscriptions) == 100
    assert isinstance(_subscribe(w, "alice", ["made.up.x"])[0], Ok)  # others are not held up


def test_a_subscriber_holds_at_most_its_quota_of_subscriptions():
    w = World(quotas=Quotas(max_subscriptions_per_subscriber=5, max_requests_per_window=10**6))
    got = _subscribe(w, "bob", [f"made.up.{i}" for i in range(8)])
    assert all(isinstance(r, Ok) for r in got[:5])
    assert [r.payload["error_code"] for r in got[5:]] == [1, 1, 1]
    assert "at most 5 subscriptions" in got[5].payload["message"]
    assert isinstance(_subscribe(w, "bob", ["made.up.0"])[0], Ok)  # an existing one: updated
    assert isinstance(_subscribe(w, "alice", [NS])[0], Ok)  # per subscriber
    assert sum(1 for _, who in w.orch.subscriptions if who == w.p["bob"].bytes) == 5
    new = restart(w)  # the count is rebuilt from the journal
    assert _subscribe(w, "bob", ["made.up.9"])[0].payload["error_code"] == 1
    assert new.subscription_counts[w.p["bob"].bytes] == 5
