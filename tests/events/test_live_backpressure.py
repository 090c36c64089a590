"""Live events under back-pressure: a subscriber that stops confirming, or whose calls fail.

Before: the Publisher ignored the replies to live ``icrc72_publish`` calls, so events answered
``Busy`` reached no subscriber; ``Busy`` for one subscriber's full window held the event back
from every subscriber (bob stuck, ``max_unconfirmed=100``: alice got 100 of 300 live events);
a failed notification call was not sent again, and its notifications stayed in the window for
good (a subscriber down a moment filled its window and was then held back for ever).
"""

from __future__ import annotations

import logging

from loglake.events.broadcaster import NOTIFY_ATTEMPTS, STALL_NS
from loglake.events.live import CAP_NS
from loglake.events.subscriber import Subscriber
from tests.events.world import NS, World


class Flaky(Subscriber):
    """A subscriber that can be *stuck* (takes notifications, confirms none: its
    confirmations are held until :meth:`unstick`) or *down* (its calls fail)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.stuck = False
        self.down = False
        self.held: list = []

    def handle_notification(self, caller, notes, now):
        if self.down:
            raise ConnectionError("subscriber restarting")
        return super().handle_notification(caller, notes, now)

    def take_outbox(self):
        out = super().take_outbox()
        if self.stuck:
            self.held += [c for c in out if c.method == "icrc72_confirm_notifications"]
            out = [c for c in out if c.method != "icrc72_confirm_notifications"]
        return out

    def unstick(self) -> None:
        self.stuck = False
        self.outbox.extend(self.held)
        self.held.clear()


def _world(*subscribers: str, **kw) -> World:
    w = World(subscriber=Flaky, **kw)
    w.register_publication()
    for s in subscribers:
        w.subscribe(s)
    return w


def _got(sub) -> list[int]:
    """The event ids a subscriber was given, in the order it got them."""
    return [n.event_id for n in sub.take()]


def _later(w: World, seconds: float, rounds: int = 1) -> None:
    for _ in range(rounds):
        w.clock.now += int(seconds * 1e9)
        w.net.run()


def test_busy_live_events_are_sent_again_once_the_subscriber_confirms():
    w = _world("alice", max_unconfirmed=100)
    w.alice.stuck = True
    w.publish(300)
    assert _got(w.alice) == list(range(100))
    assert len(w.pub.live[NS].events) == 200  # held by the publisher, not dropped
    _later(w, 1)
    assert _got(w.alice) == [] and len(w.pub.live[NS].events) == 200  # still Busy
    w.publish(300, start=300)  # new events queue behind the held ones
    assert len(w.pub.live[NS].events) == 500
    w.alice.unstick()
    _later(w, CAP_NS / 1e9, rounds=12)
    assert _got(w.alice) == list(range(100, 600))  # in order, each once
    assert w.alice.duplicates == 0 and not w.pub.live[NS].holding()
    assert w.bc.unconfirmed[w.p["alice"].bytes] == 0


def test_a_stuck_subscriber_stops_holding_back_the_others(caplog):
    w = _world("alice", "bob", max_unconfirmed=100)
    w.bob.stuck = True
    w.publish(300)
    assert _got(w.alice) == list(range(100)) and _got(w.bob) == list(range(100))
    _later(w, 1)
    assert _got(w.alice) == []  # bob's window is full, not yet for long
    with caplog.at_level(logging.WARNING, "loglake.events"):
        _later(w, STALL_NS / 1e9, rounds=2)
    assert _got(w.alice) == list(range(100, 300))  # bob stalled: live events go on without it
    assert _got(w.bob) == [] and w.bc.stats.stalled_skips == 200
    assert [r.message for r in caplog.records].count(
        next(m for m in (r.message for r in caplog.records) if "stalled" in m)
    ) == 1  # warned once, not per event
    w.bob.unstick()  # bob confirms again: live events reach it again
    w.net.run()
    w.publish(10, start=300)
    assert _got(w.bob) == list(range(300, 310)) and _got(w.alice) == list(range(300, 310))
    assert not w.bc.stalled


def test_failed_notification_calls_are_sent_again():
    w = _world("alice")
    w.alice.down = True
    w.publish(50)
    assert _got(w.alice) == [] and w.bc.unconfirmed[w.p["alice"].bytes] == 50
    w.alice.down = False
    _later(w, 1)
    assert _got(w.alice) == list(range(50))
    assert w.bc.unconfirmed[w.p["alice"].bytes] == 0 and not w.bc.pending


def test_notifications_of_a_subscriber_down_for_good_leave_its_window():
    w = _world("alice", "bob", max_unconfirmed=100)
    w.alice.down = True
    w.publish(60)
    assert w.bc.unconfirmed[w.p["alice"].bytes] == 60
    _later(w, 10, rounds=NOTIFY_ATTEMPTS + 1)
    assert w.bc.unconfirmed[w.p["alice"].bytes] == 0 and w.bc.stats.notify_dropped == 60
    assert not [p for p in w.bc.pending.values() if p.subscriber == w.p["alice"]]
    assert _got(w.bob) == list(range(60))
    w.publish(100, start=60)  # alice's window is free: bob is not held back at 100
    assert _got(w.bob) == list(range(60, 160))


def test_the_live_backlog_is_bounded(caplog):
    w = _world("alice", max_unconfirmed=10)
    w.pub.max_live_backlog = 50
    w.alice.stuck = True
    with caplog.at_level(logging.WARNING, "loglake.events"):
        w.publish(200)
    backlog = w.pub.live[NS]
    assert [e.event_id for e in backlog.events] == list(range(150, 200))  # the newest kept
    assert backlog.dropped == 140
    assert sum("dropped from the publisher's backlog" in r.message for r in caplog.records) == 1


def test_refused_live_events_are_not_sent_again(caplog):
    w = _world("alice")
    w.bc.publishers[NS] = w.p["bob"]  # the broadcaster now takes NS from bob only
    with caplog.at_level(logging.WARNING, "loglake.events"):
        w.publish(20)
    _later(w, 10, rounds=3)
    assert _got(w.alice) == [] and w.pub.live_refused == 20
    assert not w.pub.live[NS].holding()
    assert any("refused by the broadcaster" in r.message for r in caplog.records)


def test_a_subscriber_down_for_good_holds_the_others_back_once():
    """After its calls were given up, a dead subscriber's window is free and fills again; it
    is left out at once then, not after another 30 s of the others waiting."""
    w = _world("alice", "bob", max_unconfirmed=100)
    w.alice.down = True
    w.publish(150)
    _later(w, STALL_NS / 1e9, rounds=2)  # alice stalled: bob gets the 50 held back
    assert _got(w.bob) == list(range(150))
    _later(w, 10, rounds=NOTIFY_ATTEMPTS)  # alice's 100 notifications given up
    assert w.bc.unconfirmed[w.p["alice"].bytes] == 0 and w.bc.stats.notify_dropped == 100
    w.publish(150, start=150)  # alice's window fills again at 100 of these
    _later(w, 0.5, rounds=4)
    assert _got(w.bob) == list(range(150, 300))


def test_the_backlog_keeps_event_id_order():
    from loglake.events.live import LiveBacklog
    from loglake.events.messages import Event

    def evs(ids):
        return [Event(i, None, 0, NS, {"Nat": i}, None, None) for i in ids]

    b = LiveBacklog(NS)
    b.hold(evs([0, 1]), 0)  # one call answered Busy
    b.queue(evs([4, 5]))  # newer events published meanwhile
    b.hold(evs([2, 3]), 0)  # a call sent before them, answered after: goes before 4
    assert [e.event_id for e in b.events] == [0, 1, 2, 3, 4, 5]
    assert b.ready(10**9) and b.calls(4) == 1  # backing off: one call tries
    out = b.take(3, 10**6)
    assert [e.event_id for e in out] == [0, 1, 2]
    b.hold(out[1:], 10**9, front=True)  # a resend partly Busy: ahead of what waits
    assert [e.event_id for e in b.events] == [1, 2, 3, 4, 5]


def test_a_lost_confirmation_is_sent_again():
    """A confirmation whose call failed was not sent again: its notifications stayed in the
    window for good, so a subscriber losing a few filled it, held the namespace back 30 s and
    was then left out of live events for good though it was up."""
    w = _world("alice", max_unconfirmed=100)
    real = w.bc.methods["icrc72_confirm_notifications"]
    lost = []

    def flaky(caller, ids, now):
        if not lost:
            lost.append(ids)
            raise ConnectionError("reply timed out")
        return real(caller, ids, now)

    w.bc.methods["icrc72_confirm_notifications"] = flaky
    w.publish(100)
    assert lost and w.bc.unconfirmed[w.p["alice"].bytes] == 100
    _later(w, 1)
    assert w.bc.unconfirmed[w.p["alice"].bytes] == 0
    w.publish(100, start=100)
    assert _got(w.alice) == list(range(200))


class Hung(Flaky):
    """A subscriber whose calls time out (``hung``): it takes nothing and answers nothing."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.hung = False
        self.calls = 0

    def handle_notification(self, caller, notes, now):
        self.calls += 1
        if self.hung:
            raise TimeoutError("no reply in 120 s")
        return super().handle_notification(caller, notes, now)


def test_a_hung_subscriber_is_left_out_at_its_first_timeout_until_heard_from(caplog):
    """Over HTTP every call of the broadcaster waits behind one to a hung subscriber (120 s):
    its timed-out notification call is not sent again, and no live event goes to it (no
    probe) until it confirms or subscribes again."""
    w = World(subscriber=Hung)
    w.register_publication()
    w.subscribe("alice")
    w.subscribe("bob")
    w.alice.hung = True
    with caplog.at_level("WARNING", "loglake.events"):
        w.publish(10)
    calls = w.alice.calls
    assert _got(w.bob) == list(range(10)) and w.bc.unconfirmed[w.p["alice"].bytes] == 0
    assert any("timed out" in r.getMessage() for r in caplog.records)
    _later(w, STALL_NS / 1e9, rounds=3)
    w.publish(10, start=10)
    assert w.alice.calls == calls and _got(w.bob) == list(range(10, 20))  # no resend, no probe
    w.alice.hung = False
    w.subscribe("alice")  # subscribed again: heard from
    w.publish(10, start=20)
    assert _got(w.alice) == list(range(20, 30)) and not w.bc.stalled


def test_an_unreachable_subscriber_is_probed_and_comes_back():
    w = _world("alice", "bob")
    w.alice.down = True
    w.publish(10)
    _later(w, 10, rounds=NOTIFY_ATTEMPTS)  # its calls failed for a minute: given up, stalled
    assert w.p["alice"].bytes in w.bc.stalled
    w.publish(10, start=10)  # not a probe yet: alice left out
    assert w.bc.unconfirmed[w.p["alice"].bytes] == 0
    w.alice.down = False
    _later(w, STALL_NS / 1e9)
    w.publish(10, start=20)  # the probe: alice takes it and confirms
    assert _got(w.alice) == list(range(20, 30)) and not w.bc.stalled
    w.publish(5, start=30)
    assert _got(w.alice) == list(range(30, 35))


def test_a_subscriber_that_never_confirms_has_its_window_released(caplog):
    """Crashed after taking its notifications, a subscriber confirms none: its window stayed
    full for good, and its replays (which wait for room there) were Busy for ever."""
    w = _world("alice", "bob", max_unconfirmed=100)
    w.bob.stuck = True
    w.publish(150)
    with caplog.at_level("WARNING", "loglake.events"):
        _later(w, STALL_NS / 1e9, rounds=11)
    assert w.bc.unconfirmed[w.p["bob"].bytes] == 0 and w.bc.stats.notify_dropped == 100
    assert any("confirmed nothing" in r.getMessage() for r in caplog.records)
    assert _got(w.alice) == list(range(150))


def test_a_live_event_over_the_body_limit_is_refused_and_the_rest_flow():
    """Over HTTP a 413 was a plain ConnectionError, resent for ever with every later live
    event queued behind it; a 4xx is final (``CallRefused.retriable``)."""
    w = World(subscriber=Flaky, max_body_bytes=64 * 1024)
    w.register_publication()
    w.subscribe("alice")
    w._publish_call([({"Blob": b"x" * 100_000}, None)])
    w.publish(20, start=1)
    _later(w, 1, rounds=3)
    assert _got(w.alice) == list(range(1, 21)) and w.pub.live_refused == 1
    assert not w.pub.live[NS].holding()


def test_the_stall_clock_starts_when_the_window_fills():
    """It started at the first event answered ``Busy``: a subscriber that filled its window
    and went quiet held the next publish back another 30 s from then."""
    w = _world("alice", "bob", max_unconfirmed=100)
    w.bob.stuck = True
    w.publish(100)  # fills bob's window exactly: nothing Busy yet
    assert _got(w.alice) == list(range(100)) and w.bc.stats.busy == 0
    _later(w, STALL_NS / 1e9)
    w.publish(10, start=100)
    assert _got(w.alice) == list(range(100, 110))  # bob left out at once
