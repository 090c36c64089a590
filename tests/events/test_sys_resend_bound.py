"""A failed system message is sent again with back-off, but not for ever.

Any caller may register a publication or a subscription from a key no directory lists; the
orchestrator then tells that principal its broadcaster, a call with nowhere to go. It was kept
and sent again every 10 s for the life of the process (a log line each time, and one entry per
such key in memory). Now a message to a principal with no address is dropped at its first
failure (the address cannot appear: the directory is read at start), and any other failure is
retried with back-off up to ``resend.MAX_ATTEMPTS`` (about an hour), then dropped; each drop is
a log line and counts in ``Resender.dropped``. Fake clock, in-process network."""

from __future__ import annotations

import logging

from loglake.events.actions import Call
from loglake.events.identity import Identity
from loglake.events.messages import Ok, Registration
from loglake.events.resend import CAP_NS, MAX_ATTEMPTS, Resender
from tests.events.world import World

SECOND = 1_000_000_000


def _run_for(w: World, seconds: int) -> int:
    """Advance the fake clock a second at a time, delivering what is due; calls delivered."""
    before = w.net.delivered + len(w.net.dropped)
    for _ in range(seconds):
        w.clock.now += SECOND
        w.net.run()
    return w.net.delivered + len(w.net.dropped) - before


def test_a_system_message_to_a_principal_with_no_address_is_dropped_once(caplog):
    w = World()
    stranger = Identity.from_seed(b"\x77" * 32).principal  # in no directory, no role
    with caplog.at_level(logging.WARNING, logger="loglake.events"):
        got = w.call(stranger, "icrc72_register_publication", [Registration("x.y")])
        assert isinstance(got[0], Ok)
        w.net.run()
        sent = _run_for(w, 120)
    assert [c.target for c in w.net.dropped] == [stranger]  # tried once
    assert sent == 0  # was 12 more attempts in these 2 minutes, and for ever after
    assert len(w.orch.resender) == 0
    assert w.orch.resender.dropped == 1
    assert any(
        "no address" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records
    )


def test_a_failing_message_is_retried_with_back_off_then_dropped(caplog):
    r = Resender()
    call = Call(Identity.from_seed(b"\x78" * 32).principal, "icrc72_handle_notification", [])
    now, attempts, gaps = 0, 0, []
    with caplog.at_level(logging.WARNING, logger="loglake.events"):
        r.failed(call, now, ConnectionError("refused"))
        while len(r):
            due = min(at for at, _ in r.waiting)
            gaps.append(due - now)
            now = due
            assert r.due(now) == [call]
            attempts += 1
            r.failed(call, now, ConnectionError("refused"))
            assert attempts <= MAX_ATTEMPTS
    assert attempts == MAX_ATTEMPTS - 1  # the first send and its resends: MAX_ATTEMPTS in all
    assert gaps[:3] == [100_000_000, 200_000_000, 400_000_000] and max(gaps) == CAP_NS
    assert 50 * 60 * SECOND < now < 70 * 60 * SECOND  # about an hour of trying
    assert r.dropped == 1 and not r._delay and not r._attempts
    assert any("dropped" in rec.getMessage() for rec in caplog.records)


def test_a_message_that_gets_through_is_forgotten():
    r = Resender()
    call = Call(Identity.from_seed(b"\x79" * 32).principal, "icrc72_handle_notification", [])
    r.failed(call, 0, ConnectionError("refused"))
    assert r.due(CAP_NS) == [call]
    r.succeeded(call)
    assert not r._delay and not r._attempts and r.dropped == 0
