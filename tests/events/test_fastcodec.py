"""The fast encoder of notification and event batches (loglake.events.fastcodec) writes exactly
icp-py-core's bytes, on random ICRC-16 data (hypothesis), and refuses bad input with typed
errors. @dfinity/candid's view of the same bytes: test_candid_interop.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_candid import Types
from icp_candid import encode as icp_encode
from icp_principal import Principal

from loglake.events import candid_types as T
from loglake.events.codec import METHODS, EventWire, event_to, notification_to
from loglake.events.fastcodec import (
    H_RECEIVED,
    encode_events,
    encode_notifications,
    join_notifications,
    notification_parts,
)
from loglake.events.messages import Event, EventNotification
from loglake.wire import icrc16
from loglake.wire.icrc16 import ICRC16Error, RawValue
from loglake.wire.icrc16_encode import value_bytes
from tests.wire.test_icrc16 import values

nats = st.integers(min_value=0, max_value=2**70)
principals = st.builds(Principal, st.binary(max_size=29))
names = st.text(max_size=12)
header_maps = st.one_of(st.none(), st.lists(st.tuples(names, values), max_size=3))
notifications = st.builds(
    EventNotification,
    nats,
    nats,
    st.one_of(st.none(), nats),
    nats,
    names,
    values,
    header_maps,
    principals,
    st.one_of(st.none(), names),
)
events = st.builds(
    Event, nats, st.one_of(st.none(), nats), nats, names, values, principals, header_maps
)


def icp_notifications(notes: list[EventNotification]) -> bytes:
    return icp_encode(
        [{"type": Types.Vec(T.EventNotification), "value": [notification_to(n) for n in notes]}]
    )


def icp_events(evs: list[Event]) -> bytes:
    return icp_encode([{"type": Types.Vec(EventWire), "value": [event_to(e) for e in evs]}])


@settings(max_examples=200, deadline=None)
@given(values)
def test_icrc16_value_bytes_equal_icp_py_core(v):
    assert icrc16.MESSAGE_PREFIX + value_bytes(v) == icrc16.encode(v)


@settings(max_examples=150, deadline=None)
@given(st.lists(notifications, max_size=4))
def test_notification_batches_equal_icp_py_core_byte_for_byte(notes):
    data = encode_notifications(notes)
    assert data == icp_notifications(notes)
    assert METHODS["icrc72_handle_notification"].encode_arg(notes) == data
    assert METHODS["icrc72_handle_notification"].decode_arg(data) == notes


@settings(max_examples=150, deadline=None)
@given(st.lists(events, max_size=4))
def test_event_batches_equal_icp_py_core_byte_for_byte(evs):
    assert encode_events(evs) == icp_events(evs)


@settings(max_examples=100, deadline=None)
@given(events)
def test_raw_values_are_spliced(e):
    raw = RawValue.from_message(icrc16.encode(e.data))
    e2 = Event(e.event_id, e.prev_event_id, e.timestamp, e.namespace, raw, e.source, e.headers)
    assert encode_events([e2]) == icp_events([e])
    n = EventNotification(1, e.event_id, None, 0, e.namespace, raw, e.headers, e.source)
    decoded = EventNotification(1, e.event_id, None, 0, e.namespace, e.data, e.headers, e.source)
    assert encode_notifications([n]) == icp_notifications([decoded])


@settings(max_examples=100, deadline=None)
@given(st.lists(notifications, min_size=1, max_size=4), nats, nats)
def test_parts_assemble_to_the_same_batch(notes, received, first):
    parts = [
        notification_parts(
            n.event_id,
            n.prev_event_id,
            n.timestamp,
            n.namespace,
            n.data,
            n.headers,
            n.source,
            n.filter,
        )
        for n in notes
    ]
    whole = [
        EventNotification(
            first + i,
            n.event_id,
            n.prev_event_id,
            n.timestamp,
            n.namespace,
            n.data,
            [*(n.headers or []), (H_RECEIVED, {"Nat": received})],
            n.source,
            n.filter,
        )
        for i, n in enumerate(notes)
    ]
    assert join_notifications(parts, received, first) == icp_notifications(whole)


P = Principal(b"\x01\x02")


def note(**kw):
    base = dict(
        notification_id=1,
        event_id=2,
        prev_event_id=None,
        timestamp=3,
        namespace="ns",
        data={"Nat": 1},
        headers=None,
        source=P,
        filter=None,
    )
    base.update(kw)
    return EventNotification(**base)


@pytest.mark.parametrize(
    "bad",
    [
        dict(data={"Nat": True}),
        dict(data={"Nat": -1}),
        dict(data={"Int8": 128}),
        dict(data={"Nope": 1}),
        dict(data={"Text": 1}),
        dict(data={"Text": "\ud800"}),
        dict(data={"Nat": 1, "Int": 2}),
        dict(data={"Array": [{"Float": 1}]}),
        dict(data={"Class": [("x", {"Nat": 1})]}),
        dict(data={"Map": [("k",)]}),
        dict(data={"Principal": b"\x01"}),
        dict(data={"Principal": Principal(bytes(30))}),
        dict(event_id=-1),
        dict(notification_id=True),
        dict(timestamp=None),
        dict(namespace=b"ns"),
        dict(headers=[(1, {"Nat": 1})]),
        dict(headers={"k": {"Nat": 1}}),
        dict(source="aaaaa-aa"),
        dict(filter=3),
    ],
)
def test_malformed_input_raises_icrc16_error(bad):
    with pytest.raises(ICRC16Error):
        encode_notifications([note(**bad)])


def test_deep_values_are_refused_like_validate():
    v: dict = {"Nat": 1}
    for _ in range(icrc16.MAX_DEPTH + 2):
        v = {"Option": v}
    with pytest.raises(ICRC16Error):
        icrc16.validate(v)
    with pytest.raises(ICRC16Error):
        encode_notifications([note(data=v)])


def test_not_a_batch_is_refused():
    with pytest.raises(ICRC16Error):
        encode_notifications(note())  # type: ignore[arg-type]
    with pytest.raises(ICRC16Error):
        encode_notifications([object()])  # type: ignore[list-item]
