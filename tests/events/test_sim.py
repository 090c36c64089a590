"""The events simulation (tests/events/sim.py): a seed sweep under faults, the regressions it
found (each replayed by its seed), and the fault mode and checker themselves."""

from __future__ import annotations

import pytest

from loglake.events import sysmsg
from loglake.events.actions import Call
from loglake.events.messages import Ok, ReplayState
from loglake.events.network import Faults
from tests.events.sim import SimConfig, SimFailure, Simulation, simulate
from tests.events.world import World

SWEEP = range(100, 108)
"""Eight seeds: ~20 s here. benchmarks/events_sim.py sweeps more, and longer."""


@pytest.mark.parametrize("seed", SWEEP)
def test_seed_sweep(seed):
    r = simulate(SimConfig(seed))
    assert r.replays and r.crashes >= 0 and sum(r.faults.values()) > 0


@pytest.mark.parametrize("seed", range(200, 203))
def test_seed_sweep_paid(seed):
    r = simulate(SimConfig(seed, price=2))
    assert r.replays


# -- what the checker found (each seed failed before its fix) --------------------------------
def test_seed_5_a_lost_replay_add_is_sent_again():
    """The publisher's replay add was dropped: the replay stayed pending forever. (Seed 8
    found it; since unordered calls may overtake, the faults fall otherwise, and seed 5 is one
    that loses an add.)"""
    sim = Simulation(SimConfig(5))
    r = sim.run()
    lost = [
        c
        for c in sim.w.net.dropped
        if c.method == "icrc72_handle_notification"
        and c.target == sim.w.p["pub"]
        and any(k == sysmsg.PUBLISHER_REPLAY_ADD for n in c.arg for k, _ in sysmsg.entries(n.data))
    ]
    assert lost
    assert r.completed + r.errored + r.canceled == r.replays


def test_seed_11_a_cancel_after_a_crash_that_lost_the_add_ends():
    """The orchestrator crashed before its add left; after the restart only the remove was
    sent, which the publisher (never having heard of the replay) ignored: pending forever."""
    r = simulate(SimConfig(11))
    assert r.canceled >= 1


def test_seed_16_a_lost_final_status_is_sent_again():
    """The publisher's completed(n) report was lost: the replay stayed running forever. (Seed
    24 found it; the faults fall otherwise since unordered calls may overtake, and seed 16 is
    one that loses such a report.) Each replay whose report was lost ends completed."""
    sim = Simulation(SimConfig(16))
    sim.run()
    lost = [
        u.replay_id
        for c in sim.w.net.dropped
        if c.method == "icrc77_replay_status" and c.target == sim.w.p["orch"]
        for u in c.arg
        if u.status.tag == "completed"
    ]
    assert lost
    assert all(sim.w.orch.replays[rid].status.tag == "completed" for rid in lost)


def test_a_lost_replay_add_alone():
    w = World()
    w.register_publication()
    w.publish(30)
    w.subscribe("bob")
    w.net.faults = Faults(0)
    rid = w.replay("bob", 0, 30).value
    # lose the orchestrator's calls to the publisher once
    lost = [(s, c) for s, c in w.net.queue if c.target == w.p["pub"]]
    assert lost
    w.net.queue = type(w.net.queue)((s, c) for s, c in w.net.queue if (s, c) not in lost)
    for _, c in lost:
        w.orch.on_reply(c, ConnectionError("lost"), w.clock())
    w.net.run()
    w.clock.now += 1_000_000_000
    w.net.run()
    assert w.status("bob", rid).status == ReplayState("completed", 30)
    assert [n.event_id for n in w.bob.take()] == list(range(30))


# -- the fault mode ----------------------------------------------------------------------------
def test_same_seed_same_run():
    a, b = simulate(SimConfig(5, steps=150)), simulate(SimConfig(5, steps=150))
    assert a == b
    assert simulate(SimConfig(6, steps=150)) != a


def test_a_dropped_call_fails_at_the_caller_and_reaches_no_one():
    w = World()
    w.register_publication()
    w.net.faults = Faults(1, drop=1.0)
    before = w.net.delivered
    replies = []
    w.pub.on_reply = lambda c, r, now: replies.append(r)  # type: ignore[method-assign]
    w.net.queue.append((w.pub, Call(w.p["orch"], "icrc77_get_replays", _get())))
    w.net.step()
    assert isinstance(replies[0], ConnectionError) and w.net.delivered == before


def test_a_lost_reply_runs_the_call_and_a_duplicate_runs_it_twice():
    w = World()
    w.register_publication()
    w.net.faults = Faults(2, drop_reply=1.0, duplicate=1.0)
    before = w.net.delivered
    replies = []
    w.pub.on_reply = lambda c, r, now: replies.append(r)  # type: ignore[method-assign]
    w.net.queue.append((w.pub, Call(w.p["orch"], "icrc77_get_replays", _get())))
    w.net.run(10)
    assert w.net.delivered == before + 2  # the copy was handled too
    assert len(replies) == 1 and isinstance(replies[0], ConnectionError)  # its reply: nowhere


def test_delay_never_reorders_one_senders_ordered_calls():
    w = World()
    w.net.faults = Faults(3, delay=1.0)
    got = []
    w.orch.methods["icrc77_get_replays"] = lambda caller, arg, now: (
        got.append((caller.bytes, arg.take)) or []
    )
    for k in range(20):
        for who in (w.pub, w.alice, w.bob):
            w.net.queue.append((who, Call(w.p["orch"], "icrc77_get_replays", _get(k))))
    w.net.run(100)
    for who in ("pub", "alice", "bob"):
        mine = [k for b, k in got if b == w.p[who].bytes]
        assert mine == list(range(20))
    queued = [(w.p[who].bytes, k) for k in range(20) for who in ("pub", "alice", "bob")]
    assert got != queued  # senders did overtake one another


def _get(k: int = 0):
    from loglake.events.messages import GetReplays

    return GetReplays(None, k, None)


# -- the checker can fail ------------------------------------------------------------------
def test_the_checker_sees_state_the_journal_does_not_keep(monkeypatch):
    """A planted defect — cancel requests not journalled — is caught as restored ≠ live."""
    from loglake.events.journal import Journal

    real = Journal.append

    def forgetful(self, op, now):
        if op.get("op") != "cancel":
            real(self, op, now)

    monkeypatch.setattr(Journal, "append", forgetful)
    with pytest.raises(SimFailure, match=r"restored replays\[3\] differ"):
        simulate(SimConfig(2, crash=0.0, steps=200))


def test_the_checker_sees_an_event_delivered_twice():
    s = Simulation(SimConfig(4, steps=10))
    s.run()
    s.w.bob.seen.clear()  # a subscriber that forgot what it had: the next replay repeats
    rid = s.w.replay("bob", 0, 5)
    assert isinstance(rid, Ok)
    s.w.net.run()
    with pytest.raises(SimFailure, match="twice"):
        s.check()
