"""The orchestrator's request-rate windows are forgotten once they end, and bounded.

Every principal that ever registered, subscribed or listed replays kept its window (a deque of
call times) for the life of the process: a caller minting fresh keys grew the orchestrator's
memory without limit. Now a window whose last counted call is older than ``window_ns`` is
dropped (swept from the oldest, amortised O(1) a call), and past ``Quotas.max_rate_principals``
the oldest goes first (its principal's budget starts over, as a fresh key's would)."""

from __future__ import annotations

from loglake.events.identity import Identity
from loglake.events.messages import GetReplays, Ok, Registration
from loglake.events.orchestrator import Quotas
from tests.events.world import World


def _principals(n: int, base: int = 1000) -> list:
    return [Identity.from_seed((base + i).to_bytes(32, "big")).principal for i in range(n)]


def _calls(w: World, who) -> None:
    assert isinstance(w.call(who, "icrc72_register_subscription", [Registration("x.y")])[0], Ok)
    assert w.call(who, "icrc77_get_replays", GetReplays(None, 10, None)) == []


def test_windows_of_principals_that_stopped_calling_are_forgotten():
    w = World()
    window = w.quotas.window_ns
    for p in _principals(300):  # one window's callers
        _calls(w, p)
    assert len(w.orch._requests) == len(w.orch._queries) == 300
    w.clock.now += window  # their windows end
    active = _principals(5, base=5000)
    for p in active:
        _calls(w, p)
    # was 305 and 305: every principal that ever called, kept for good
    assert len(w.orch._requests) == len(w.orch._queries) == 5
    w.clock.now += window // 2
    _calls(w, active[0])  # still active
    w.clock.now += window // 2 + 1
    _calls(w, _principals(1, base=9000)[0])
    assert len(w.orch._requests) == 2  # active[0] and the newcomer


def test_the_windows_held_at_once_are_bounded():
    w = World(quotas=Quotas(max_rate_principals=50))
    for p in _principals(300):  # all within one window
        _calls(w, p)
    assert len(w.orch._requests) == len(w.orch._queries) == 50  # was 300


def test_a_principal_over_its_rate_is_still_refused_while_others_come_and_go():
    w = World(quotas=Quotas(max_requests_per_window=3, max_rate_principals=10))
    me = _principals(1, base=7000)[0]
    for k in range(3):
        assert isinstance(
            w.call(me, "icrc72_register_subscription", [Registration(f"a.{k}")])[0], Ok
        )
    for p in _principals(5):  # fewer than the bound: my window stays
        _calls(w, p)
    refused = w.call(me, "icrc72_register_subscription", [Registration("a.9")])[0]
    assert refused.payload["error_code"] == 2, refused
    w.clock.now += w.quotas.window_ns
    assert isinstance(w.call(me, "icrc72_register_subscription", [Registration("a.9")])[0], Ok)
