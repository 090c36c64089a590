"""A subscriber's memory of delivered event ids is bounded (review 9, ICRC §2): it kept every
id ever delivered, one set entry each, while its inbox was empty (+227 MiB after 3 million
events). The ids are stream indexes, kept as runs; dedup stays exact for live resends,
replays overlapping what was delivered, and backfill of a gap."""

from __future__ import annotations

import tracemalloc

import pytest

from loglake.events import subscriber as subscriber_mod
from loglake.events.codec import METHODS
from loglake.events.fastcodec import encode_notifications
from loglake.events.identity import Identity
from loglake.events.messages import EventNotification
from loglake.events.subscriber import Subscriber

P = [Identity.generate().principal for _ in range(4)]
B = 1_000
RECENT = 4_096


@pytest.fixture(autouse=True)
def small_fold(monkeypatch):
    """Folds every 4,096 ids (65,536 by default), so a bounded test crosses many."""
    monkeypatch.setattr(subscriber_mod, "SEEN_RECENT", RECENT, raising=False)


def batch(first: int, n: int = B, step: int = 1):
    notes = [
        EventNotification(first + k + 1, first + k * step, None, 1, "ns", {"Nat": 0}, None, P[3])
        for k in range(n)
    ]
    return METHODS["icrc72_handle_notification"].decode_arg(encode_notifications(notes))


def deliver(sub: Subscriber, b) -> None:
    sub.handle_notification(P[2], b, 1)
    sub.take()  # the reader takes everything: the inbox stays empty
    sub.take_outbox()


def subscriber() -> Subscriber:
    sub = Subscriber(P[0], P[1])
    sub.valid["ns"] = {P[2].bytes}
    return sub


def test_delivered_ids_do_not_grow_with_the_events_delivered():
    sub = subscriber()
    one = batch(0)  # one decoded batch, its ids moved on each time (as new calls arrive)
    start = 1_000_000  # joined mid-stream
    for k in range(10):  # warm up past the first fold
        one.event_ids = list(range(start + k * B, start + (k + 1) * B))
        deliver(sub, one)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(10, 110):  # 100,000 more events
            one.event_ids = list(range(start + k * B, start + (k + 1) * B))
            deliver(sub, one)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 2**20, grown  # a set of 100,000 ids is ~5 MiB
    ids = sub.seen["ns"]
    assert len(ids.recent) <= RECENT + B and len(ids.starts) <= 2
    assert len(ids) == 110 * B and sub.duplicates == 0


def test_dedup_stays_exact_across_folds():
    sub = subscriber()
    for k in range(200, 300):  # live: events 200,000..299,999 (folded into runs)
        deliver(sub, batch(k * B))
    assert sub.seen["ns"].starts  # (some are in runs now)
    deliver(sub, batch(245 * B))  # a resend of delivered ones: all duplicates
    assert sub.duplicates == B
    sub.handle_notification(P[2], batch(195_000, 10_000), 1)  # a replay across the start
    got = sub.take()
    assert [n.event_id for n in got] == list(range(195_000, 200_000))  # the backfill only
    assert sub.duplicates == B + 5_000
    sub.handle_notification(P[2], batch(250_000, 10, step=2), 1)  # one by one in order too
    assert sub.take() == [] and sub.duplicates == B + 5_010
    for k, eid in enumerate((150_000, 150_000, 299_999)):  # the per-notification path
        n = EventNotification(9_000_000 + k, eid, None, 1, "ns", {"Nat": 0}, None, P[3])
        sub.handle_notification(P[2], [n], 1)
    assert [n.event_id for n in sub.take()] == [150_000]
    assert sub.duplicates == B + 5_012
