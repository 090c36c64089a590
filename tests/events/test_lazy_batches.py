"""Lazy batches of the replay data plane (issue 11, third pass): ``EventBatch``,
``NotificationBatch`` and ``PublishResults`` (loglake.events.fastcodec) give exactly what the
full readers and writers give — the same values, the same bytes, the same typed errors — and a
Broadcaster or Subscriber fed a lazy batch ends in the same state, with the same messages out,
as one fed the same events as a list."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_principal import Principal

from loglake.events.broadcaster import Broadcaster, ReplayRoute, Route
from loglake.events.codec import METHODS
from loglake.events.fastcodec import (
    PUBLISH_RESULTS_HEADER,
    EncodedNotifications,
    EventBatch,
    NotificationBatch,
    PublishResults,
    decode_event_batch,
    decode_events,
    decode_notification_batch,
    decode_notifications,
    decode_publish_results,
    encode_events,
    encode_notifications,
    encode_publish_results,
    event_batch,
)
from loglake.events.filters import Skip
from loglake.events.messages import H_REPLAY_ID, Event, EventNotification
from loglake.events.subscriber import Subscriber
from loglake.wire.icrc16 import ICRC16DecodeError, RawValue, value_bytes
from loglake.wire.varint import CANDID_MAX_OCTETS
from tests.events.test_fastcodec import fast, header_maps, mutated, names, nats, principals
from tests.wire.test_icrc16 import values

P = [Principal(bytes([k]) * 10) for k in range(6)]


def same(a, b) -> bool:
    """Equal results of two readers: the same items (compared by ``repr``: a NaN read twice is
    two unequal floats), the same ``"error"``, or both None (not our encoder's header)."""
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    return repr(list(a)) == repr(list(b))


@st.composite
def uniform_events(draw, min_size=1):
    """Events sharing source, headers and namespace (a replay batch's shape)."""
    src, hs, ns = draw(principals), draw(header_maps), draw(names)
    rows = draw(
        st.lists(
            st.tuples(nats, st.one_of(st.none(), nats), nats, values), min_size=min_size, max_size=5
        )
    )
    return [Event(i, p, t, ns, d, src, hs) for i, p, t, d in rows]


@settings(max_examples=150, deadline=None)
@given(uniform_events())
def test_a_uniform_event_batch_reads_lazily_to_the_same_events(evs):
    data = encode_events(evs)
    got = decode_event_batch(data)
    assert type(got) is EventBatch and len(got) == len(evs)
    assert got == decode_events(data)
    assert list(got) == decode_events(data) and got[-1] == decode_events(data)[-1]
    assert encode_events(got) == data  # a batch as read is its message


@settings(max_examples=100, deadline=None)
@given(uniform_events(min_size=2), principals, names)
def test_a_mixed_batch_is_read_into_a_list(evs, other_src, other_ns):
    e = evs[-1]
    evs[-1] = Event(e.event_id, e.prev_event_id, e.timestamp, other_ns, e.data, other_src, [])
    data = encode_events(evs)
    got = decode_event_batch(data)
    assert got == decode_events(data)
    if other_src != evs[0].source or other_ns != evs[0].namespace or evs[0].headers != []:
        assert type(got) is list


@settings(max_examples=250, deadline=None)
@given(
    uniform_events(),
    st.integers(0, 10**6),
    st.integers(0, 255),
    st.integers(0, 3),
)
def test_damaged_event_batches_read_as_the_full_reader_does(evs, pos, byte, cut):
    bad = mutated(encode_events(evs), pos, byte, cut)
    assert same(fast(bad, decode_event_batch), fast(bad, decode_events))


@settings(max_examples=150, deadline=None)
@given(uniform_events(), header_maps, st.one_of(st.none(), names), nats, st.integers(1, 3))
def test_spliced_notifications_equal_the_encoded_ones(evs, hs, flt, first, step):
    batch = decode_event_batch(encode_events(evs))
    assert type(batch) is EventBatch
    for count in (len(evs), len(evs) // 2):
        notes = [
            EventNotification(
                first + k * step,
                e.event_id,
                e.prev_event_id,
                e.timestamp,
                e.namespace,
                RawValue(value_bytes(e.data)),
                hs,
                e.source,
                flt,
            )
            for k, e in enumerate(evs[:count])
        ]
        assert batch.notifications(hs, flt, first, step, count) == encode_notifications(notes)


@st.composite
def uniform_notes(draw):
    src, hs, ns, flt = draw(principals), draw(header_maps), draw(names), draw(st.none() | names)
    rows = draw(st.lists(st.tuples(nats, nats, st.none() | nats, nats, values), min_size=1))
    return [EventNotification(n, i, p, t, ns, d, hs, src, flt) for n, i, p, t, d in rows[:5]]


@settings(max_examples=150, deadline=None)
@given(uniform_notes(), st.integers(0, 10**6), st.integers(0, 255), st.integers(0, 3))
def test_a_uniform_notification_batch_reads_lazily(notes, pos, byte, cut):
    data = encode_notifications(notes)
    got = decode_notification_batch(data)
    assert type(got) is NotificationBatch and got == notes == decode_notifications(data)
    assert got.event_ids == [n.event_id for n in notes]
    assert got.notification_ids == [n.notification_id for n in notes]
    assert got.namespace == notes[0].namespace and got.headers == notes[0].headers
    bad = mutated(data, pos, byte, cut)
    assert same(fast(bad, decode_notification_batch), fast(bad, decode_notifications))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 6), st.integers(0, 6), nats, st.integers(0, 3))
def test_publish_results_runs_write_and_read_as_lists(ok, busy, first, per):
    r = PublishResults(ok + busy, ok, first, per)
    items = list(r)
    assert len(items) == ok + busy and r == items and r[1:3] == items[1:3]
    data = encode_publish_results(r)
    assert data == METHODS["icrc72_publish"].encode_ret(items)  # the codec's bytes
    back = decode_publish_results(data)
    assert back is None or back == items  # None: not a run of one id each, the codec reads it
    if per == 1:
        assert isinstance(back, PublishResults) and back.delivered == ok
    assert METHODS["icrc72_publish"].decode_ret(data) == items


# --- the cores: a lazy batch in, the same state and messages out --------------------------
def wire(x):
    """A call's argument as bytes (what leaves the role)."""
    if isinstance(x, EncodedNotifications):
        return x.data
    return METHODS["icrc72_handle_notification"].encode_arg(x)


def state(b: Broadcaster):
    pend = {k: (p.subscriber.bytes, p.namespace) for k, p in b.pending.items()}
    out = [(c.target.bytes, c.method, wire(c.arg)) for c in b.take_outbox()]
    return pend, dict(b.unconfirmed), b.stats, b.next_notification, out


def replay_events(n: int, rid: int = 7, ns: str = "ns"):
    hs = [(H_REPLAY_ID, {"Nat": rid})]
    return [
        Event(i, i - 1 if i else None, 5 + i, ns, {"Blob": bytes([i % 256]) * 20}, P[0], hs)
        for i in range(n)
    ]


def both(bc: Broadcaster, evs, caller=P[0]):
    """Publish ``evs`` to a copy of ``bc`` as a lazy batch and to another as a list."""
    lazy, eager = copy.deepcopy(bc), copy.deepcopy(bc)
    data = encode_events(evs)
    batch = METHODS["icrc72_publish"].decode_arg(data)
    assert type(batch) is EventBatch
    r1 = lazy.publish(caller, batch, 100)
    r2 = eager.publish(caller, decode_events(data), 100)
    assert list(r1) == list(r2)
    assert METHODS["icrc72_publish"].encode_ret(r1) == METHODS["icrc72_publish"].encode_ret(r2)
    assert state(lazy) == state(eager)
    return r1


def test_broadcaster_replay_batch_same_as_event_by_event():
    bc = Broadcaster(P[1], P[2], max_unconfirmed=25)
    bc.replays[7] = ReplayRoute(P[3], namespace="ns", publisher=P[0])
    bc.next_notification = 300
    bc.unconfirmed[P[3].bytes] = 5
    r = both(bc, replay_events(30))  # 20 delivered, 10 Busy
    assert [type(x).__name__ for x in r].count("Ok") == 20
    bc.replays[7].skip = Skip(2, 0)  # not plain: event by event
    both(bc, replay_events(30))
    both(bc, replay_events(10, rid=8))  # unknown replay: dropped
    both(bc, replay_events(10), caller=P[5])  # not its publisher: Unauthorized


def test_broadcaster_live_batch_to_several_subscribers_same_as_event_by_event():
    bc = Broadcaster(P[1], P[2], max_unconfirmed=1000)
    bc.publishers["ns"] = P[0]
    bc.routes["ns"] = {P[3].bytes: Route(P[3]), P[4].bytes: Route(P[4])}
    evs = [Event(i, None, 9, "ns", {"Nat": i}, P[0], None) for i in range(12)]
    both(bc, evs)
    bc.routes["empty"] = {}
    bc.publishers["empty"] = P[0]
    both(bc, [Event(i, None, 9, "empty", {"Nat": i}, P[0], None) for i in range(3)])


def sub_state(s: Subscriber):
    out = [(c.target.bytes, c.method, list(c.arg)) for c in s.take_outbox()]
    reps = {k: vars(v) for k, v in s.replays.items()}
    return (
        s.take(),
        {(ns, e) for ns, ids in s.seen.items() for e in ids},
        s.duplicates,
        s.rejected,
        reps,
        out,
    )


@pytest.mark.parametrize(
    ("seen", "eids"),
    [
        (set(), list(range(10))),  # all new
        ({("ns", 4)}, list(range(10))),  # one seen before
        (set(), [0, 1, 2, 1, 3]),  # one twice in the batch
    ],
)
def test_subscriber_batch_same_as_one_by_one(seen, eids):
    s = Subscriber(P[3], P[2])
    s.valid["ns"] = {P[1].bytes}
    for ns, eid in seen:
        s._delivered(ns).add(eid)
    hs = [(H_REPLAY_ID, {"Nat": 7}), ("icrc77:replay:end_id", {"Nat": 9})]
    notes = [
        EventNotification(50 + k, i, None, 1, "ns", {"Nat": i}, hs, P[0])
        for k, i in enumerate(eids)
    ]
    data = encode_notifications(notes)
    for caller in (P[1], P[5]):  # the valid broadcaster; another (rejected)
        lazy, eager = copy.deepcopy(s), copy.deepcopy(s)
        batch = METHODS["icrc72_handle_notification"].decode_arg(data)
        assert type(batch) is NotificationBatch
        assert lazy.handle_notification(caller, batch, 1) == eager.handle_notification(
            caller, decode_notifications(data), 1
        )
        assert sub_state(lazy) == sub_state(eager)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(nats, nats, values), min_size=1, max_size=5),
    principals,
    names,
    header_maps,
)
def test_a_publisher_batch_is_the_encoded_events(rows, src, ns, hs):
    vb = value_bytes

    evs = [Event(i, i - 1 if i else None, t, ns, RawValue(vb(d)), src, hs) for i, t, d in rows]
    batch = event_batch(
        [i for i, _, _ in rows], [t for _, t, _ in rows], [vb(d) for _, _, d in rows], ns, src, hs
    )
    data = encode_events(evs)
    assert batch.raw == data and batch == decode_events(data)
    again = decode_event_batch(data)
    assert type(again) is EventBatch and again.spans == batch.spans


def test_procure_batch_equals_procure():
    from loglake.events.publisher import procure, procure_batch, stored_event
    from loglake.streams.api import StreamMessage

    msgs = [StreamMessage(i, stored_event({"Nat": i}, None, 10 + i)) for i in range(5)]
    for open_ended in (False, True):
        got = procure_batch(msgs, "ns", 3, P[0], open_ended, 9)
        want = procure(msgs, "ns", 3, P[0], open_ended, 9)
        assert type(got) is EventBatch and got == want
        assert encode_events(got) == encode_events(want)
    mixed = [*msgs, StreamMessage(5, stored_event({"Nat": 5}, [("h", {"Nat": 1})], 15))]
    got = procure_batch(mixed, "ns", 3, P[0], False, 9)
    assert type(got) is list and got == procure(mixed, "ns", 3, P[0], False, 9)


def test_an_over_long_id_in_publish_results_is_refused_as_the_plan_refuses_it():
    """A LEB128 id of more than ``CANDID_MAX_OCTETS`` octets inside a run of ``Ok([id])``: the
    plan refuses the reply with the typed error, so the run kernel must not take it (it once
    did, and reading the results then raised an untyped varint error)."""
    enc = encode_publish_results(PublishResults(100, 100, 7, 1))
    i = len(PUBLISH_RESULTS_HEADER) + 1
    assert enc[i : i + 4] == b"\x01\x00\x01\x07"
    bad = enc[: i + 3] + b"\x87" + b"\x80" * CANDID_MAX_OCTETS + b"\x00" + enc[i + 4 :]
    assert decode_publish_results(bad) is None
    with pytest.raises(ICRC16DecodeError, match="too long"):
        METHODS["icrc72_publish"].decode_ret(bad)
