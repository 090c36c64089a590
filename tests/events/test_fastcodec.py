"""The fast encoder of notification and event batches (loglake.events.fastcodec) writes exactly
icp-py-core's bytes, on random ICRC-16 data (hypothesis), and refuses bad input with typed
errors; its decoders give what the generic decoder gives, damaged input included.
@dfinity/candid's view of the same bytes: test_candid_interop.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_candid import Types
from icp_candid import encode as icp_encode
from icp_principal import Principal

from loglake.events import candid_types as T
from loglake.events.codec import (
    METHODS,
    EventWire,
    event_from,
    event_to,
    notification_from,
    notification_to,
    opt_results_from,
    opt_results_to,
)
from loglake.events.fastcodec import (
    H_RECEIVED,
    decode_events,
    decode_notifications,
    decode_publish_results,
    encode_events,
    encode_notifications,
    encode_publish_results,
    join_notifications,
    notification_parts,
)
from loglake.events.messages import Err, Event, EventNotification, Ok
from loglake.wire import icrc16
from loglake.wire.icrc16 import ICRC16DecodeError, ICRC16Error, RawValue, candid_decode, value_bytes
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


# --- decoding straight into the dataclasses (fastcodec.decode_*) -----------------------------
def generic(data: bytes, t, conv):
    """The generic decoder's answer: the value, or "error" for a typed error."""
    try:
        return conv(candid_decode(data, [t])[0])
    except ICRC16DecodeError:
        return "error"


def fast(data: bytes, f):
    try:
        return f(data)
    except ICRC16DecodeError:
        return "error"


def mutated(data: bytes, pos: int, byte: int, cut: int) -> bytes:
    b = bytearray(data)
    b[pos % len(b)] = byte
    return bytes(b[: len(b) - cut])


publish_results = st.one_of(
    st.none(),
    st.builds(Ok, st.lists(nats, max_size=3)),
    st.builds(Err, st.sampled_from(["Busy", "Unauthorized"])),
    st.builds(Err, st.sampled_from(["ImproperId", "GenericBatchError"]), names),
)
NOTES_T = Types.Vec(T.EventNotification)
EVENTS_T = Types.Vec(EventWire)
RESULTS_T = Types.Vec(T.PublishResult)


def from_notes(v):
    return [notification_from(x) for x in v]


def from_events(v):
    return [event_from(x) for x in v]


@settings(max_examples=150, deadline=None)
@given(st.lists(notifications, max_size=4))
def test_notifications_decode_as_the_generic_decoder_does(notes):
    data = encode_notifications(notes)
    assert decode_notifications(data) == generic(data, NOTES_T, from_notes) == notes


@settings(max_examples=150, deadline=None)
@given(st.lists(events, max_size=4))
def test_events_decode_as_the_generic_decoder_does(evs):
    data = encode_events(evs)
    got = decode_events(data)
    assert got == generic(data, EVENTS_T, from_events)
    assert got is not None and all(type(e.data) is RawValue for e in got)  # kept as bytes
    assert encode_events(got) == data


@settings(max_examples=150, deadline=None)
@given(st.lists(publish_results, max_size=5))
def test_publish_results_equal_icp_py_core_both_ways(rs):
    m = METHODS["icrc72_publish"]
    data = m.encode_ret(rs)
    assert data == icp_encode([{"type": RESULTS_T, "value": opt_results_to(rs)}])
    assert m.decode_ret(data) == generic(data, RESULTS_T, opt_results_from) == rs


def test_generic_error_results_take_the_generic_path():
    rs = [Ok([1]), Err("GenericError", {"error_code": 1, "message": "m"})]
    assert encode_publish_results(rs) is None
    data = METHODS["icrc72_publish"].encode_ret(rs)
    assert decode_publish_results(data) is None
    assert METHODS["icrc72_publish"].decode_ret(data) == rs


@settings(max_examples=100, deadline=None)
@given(st.lists(nats, max_size=6))
def test_confirmation_ids_equal_icp_py_core(ids):
    data = METHODS["icrc72_confirm_notifications"].encode_arg(ids)
    assert data == icp_encode([{"type": Types.Vec(Types.Nat), "value": ids}])


@pytest.mark.parametrize("bad", [[-1], [True], ["1"], 5])
def test_confirmation_ids_refuse_non_nats(bad):
    with pytest.raises(ICRC16Error):
        METHODS["icrc72_confirm_notifications"].encode_arg(bad)
    with pytest.raises(ICRC16Error):
        METHODS["icrc72_confirm_notifications"].encode_arg(bad * 100 if bad != 5 else bad)


@settings(max_examples=250, deadline=None)
@given(
    st.lists(notifications, min_size=1, max_size=3),
    st.lists(events, min_size=1, max_size=3),
    st.lists(publish_results, min_size=1, max_size=3),
    st.integers(0, 10**6),
    st.integers(0, 255),
    st.integers(0, 3),
)
def test_damaged_messages_decode_as_the_generic_decoder_does(notes, evs, rs, pos, byte, cut):
    """The same value or a typed error (``ICRC16DecodeError``), never anything else; a damaged
    header gets a plan of its own (publish results: None where not a run, the codec reads it)."""
    cases = [
        (encode_notifications(notes), decode_notifications, NOTES_T, from_notes),
        (encode_events(evs), decode_events, EVENTS_T, from_events),
        (
            METHODS["icrc72_publish"].encode_ret(rs),
            METHODS["icrc72_publish"].decode_ret,
            RESULTS_T,
            opt_results_from,
        ),
    ]
    for data, f, t, conv in cases:
        bad = mutated(data, pos, byte, cut)
        got = fast(bad, f)
        if got is not None:  # by repr: a damaged byte can make a NaN, unequal to itself
            assert repr(got) == repr(generic(bad, t, conv))


def test_other_types_are_decode_errors():
    nat_vec = icp_encode([{"type": Types.Vec(Types.Nat), "value": [1]}])
    with pytest.raises(ICRC16DecodeError):
        decode_notifications(nat_vec)
    with pytest.raises(ICRC16DecodeError):
        decode_events(nat_vec)
    assert decode_publish_results(nat_vec) is None  # not a run of Ok/Busy: the codec reads it
    with pytest.raises(ICRC16DecodeError):  # the generic decoder: not this method's type
        METHODS["icrc72_handle_notification"].decode_arg(nat_vec)
