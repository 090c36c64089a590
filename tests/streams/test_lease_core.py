"""The lease state machine on a fake clock: acquire, renew, lose, hand over — no cluster."""

from __future__ import annotations

import pytest

from loglake.streams.lease import (
    Acquired,
    Create,
    Delete,
    LeaseCore,
    LeaseState,
    Lost,
    Renew,
)


def core(**kw) -> LeaseCore:
    return LeaseCore("sealer", "node-a", ttl=3, retry=0.5, margin=0.2, **kw)


def acquire(c: LeaseCore, now: float, revision: int) -> None:
    actions, _ = c.poll(now)
    assert actions == [Create("lease.sealer", b"node-a", 3)]
    assert c.succeeded(revision, now + 0.01) == [Acquired(revision)]


def test_an_idle_node_creates_the_key_and_holds_with_the_revision_as_token():
    c = core()
    acquire(c, 0.0, 7)
    assert c.state is LeaseState.HELD and c.token == 7 and c.revision == 7
    assert c.holds(1.0)


def test_a_taken_key_is_tried_again_after_retry_not_before():
    c = core()
    c.poll(0.0)
    assert c.conflict(0.1) == []
    assert c.state is LeaseState.IDLE and not c.holds(0.2)
    assert c.poll(0.5) == ([], [])
    actions, _ = c.poll(0.6)
    assert isinstance(actions[0], Create)


def test_renewal_every_third_of_the_ttl_carries_the_last_revision():
    c = core()
    acquire(c, 0.0, 7)
    assert c.poll(0.9) == ([], [])
    actions, _ = c.poll(1.0)
    assert actions == [Renew("lease.sealer", b"node-a", 3, 7)]
    assert c.poll(1.1) == ([], [])  # one action outstanding at a time
    assert c.succeeded(12, 1.05) == []
    assert c.token == 7 and c.revision == 12  # the token stays; fences use the newest revision
    assert c.holds(1.0 + 3 * 0.8 - 0.01)


def test_valid_until_counts_from_sending_not_from_the_answer():
    c = core()
    c.poll(0.0)
    c.succeeded(7, 1.5)  # a slow answer: the server stored it somewhere in [0, 1.5]
    assert c.valid_until == pytest.approx(3 * 0.8)


def test_an_answer_after_the_ttl_is_not_believed():
    c = core()
    c.poll(0.0)
    events = c.succeeded(7, 2.5)
    assert events == [Acquired(7), Lost(7, "the write was acknowledged after its ttl")]
    assert c.state is LeaseState.IDLE and not c.holds(2.5)


def test_a_refused_renewal_loses_the_lease():
    c = core()
    acquire(c, 0.0, 7)
    c.poll(1.0)
    assert c.conflict(1.1) == [Lost(7, "another node holds it (renewal refused)")]
    assert c.state is LeaseState.IDLE and c.token is None and c.revision is None


def test_an_unanswered_renewal_keeps_the_lease_until_valid_until_then_loses_it():
    c = core()
    acquire(c, 0.0, 7)
    c.poll(1.0)
    assert c.failed(1.5) == []
    assert c.holds(2.0)
    actions, _ = c.poll(2.0)  # tried again after retry
    assert isinstance(actions[0], Renew)
    c.failed(2.2)
    actions, events = c.poll(2.5)  # past 0.0 + 3 × 0.8
    assert events == [Lost(7, "not renewed within its ttl")]
    assert not c.holds(2.5)
    assert actions == []
    actions, _ = c.poll(3.0)  # contends again after retry
    assert isinstance(actions[0], Create)


def test_a_paused_holder_sees_its_lease_gone_when_it_wakes():
    c = core()
    acquire(c, 0.0, 7)
    _, events = c.poll(60.0)  # the process was stopped for a minute
    assert events == [Lost(7, "not renewed within its ttl")]
    assert not c.holds(60.0)


def test_release_deletes_with_compare_and_set_and_stops_contending():
    c = core()
    acquire(c, 0.0, 7)
    c.poll(1.0)
    c.succeeded(9, 1.0)
    actions, events = c.release(1.2)
    assert actions == [Delete("lease.sealer", 9)] and events == [Lost(7, "released")]
    assert not c.holds(1.2)
    c.succeeded(10, 1.3)
    assert c.state is LeaseState.CLOSED
    assert c.poll(100.0) == ([], [])


def test_release_when_not_holding_sends_nothing():
    c = core()
    assert c.release(0.0) == ([], [])
    assert c.state is LeaseState.CLOSED


@pytest.mark.parametrize(
    "kw",
    [
        {"ttl": 0},
        {"ttl": 2.5},
        {"margin": 1.0},
        {"name": "has space"},
        {"name": "a..b"},
        {"name": ""},
        {"name": "lease*"},
    ],
)
def test_bad_settings_are_refused_with_a_readable_error(kw):
    args = {"name": "sealer", "holder": "node-a", **kw}
    with pytest.raises(ValueError, match="lease"):
        LeaseCore(**args)


@pytest.mark.parametrize("bucket", ["", "a.b", "a b", "a*", "$KV"])
def test_a_bad_bucket_name_is_refused_before_any_request(bucket):
    import asyncio

    from loglake.streams.lease import JetStreamLease

    async def make():
        return JetStreamLease(None, bucket, "sealer", "node-a")

    with pytest.raises(ValueError, match="lease bucket"):
        asyncio.run(make())
