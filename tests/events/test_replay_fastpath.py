"""The replay data plane's batch-at-once paths (issue 11, fourth pass: numpy rows and the
chain scan in ``loglake.events.fastcodec``) give exactly what the per-event paths give: the
same message bytes, the same offsets and ids, the same fallbacks — on batches of thousands
of events whose ids, timestamps and data lengths change along the batch (LEB128 lengths
crossing 128, 16,384, 2**63), whose data hold the headers' bytes, whose values are not all
``#Blob``s, damaged or not."""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_candid import Types
from icp_principal import Principal

from loglake.events import fastcodec as F
from loglake.events.codec import METHODS, _convert
from loglake.events.fastcodec import (
    EventBatch,
    NotificationBatch,
    PublishResults,
    decode_nats,
    encode_events,
    encode_nats,
    encode_notifications,
    event_batch,
)
from loglake.events.messages import H_REPLAY_END_ID, H_REPLAY_ID, Event, EventNotification
from loglake.events.publisher import procure, procure_batch, stored_event
from loglake.streams.api import StreamMessage
from loglake.wire import candid, candid_vec
from loglake.wire.icrc16 import ICRC16DecodeError, RawValue, candid_decode, value_bytes
from tests.events.test_fastcodec import mutated
from tests.events.test_lazy_batches import uniform_events, uniform_notes

SRC = Principal(bytes(range(29)))
HS = [(H_REPLAY_ID, {"Nat": 3}), (H_REPLAY_END_ID, {"Nat": 10**6})]
RECEIVED = ("icrc72:broadcaster:received", {"Nat": 1_764_000_000_000_000_000})


@contextmanager
def at_once_from(n: int):
    """Batches of ``n`` events and more take the batch paths (the tests' batches are small)."""
    old, F.AT_ONCE = F.AT_ONCE, n
    old_vec, candid_vec.AT_ONCE = candid_vec.AT_ONCE, n
    try:
        yield
    finally:
        F.AT_ONCE = old
        candid_vec.AT_ONCE = old_vec


def key(x):
    """What a scan found (None: the full reader decides)."""
    if x is None:
        return None
    if isinstance(x, NotificationBatch):
        return ("notes", x.event_ids, x.notification_ids, repr(x.headers), x.namespace, x.raw)
    return ("events", x.spans, repr(x.headers), x.namespace, x.raw, x.source)


def scanned(f, data: bytes):
    try:
        return key(f(data))
    except Exception:  # the decoder then runs the full reader, which reports it
        return None


def walked(f, data: bytes):
    """What ``f`` finds when the codec's executor walks item by item with the plan's readers
    (its reference for the whole-vector kernels)."""
    with at_once_from(10**9):
        return scanned(f, data)


def plan_or_none(f, data: bytes):
    try:
        return f(data)
    except ICRC16DecodeError:
        return None


def agrees(scan, plan, data: bytes) -> None:
    """The executor's batch, where it takes one, is what the plan reads; where the plan
    refuses the bytes, the executor does not take them; the kernels find what the walk finds."""
    got = scanned(scan, data)
    assert got == walked(scan, data)
    want = plan_or_none(plan, data)
    if got is not None:
        assert want is not None, "the executor took bytes the plan refuses"
        assert scan(data) == want


def events(ids, timestamps, values, hs=HS, ns="bench.replay"):
    return [
        Event(i, i - 1 if i else None, t, ns, RawValue(value_bytes(v)), SRC, hs)
        for i, t, v in zip(ids, timestamps, values, strict=True)
    ]


def check_batch(evs: list[Event], first_id: int = 500, step: int = 1) -> None:
    """Publisher's message, the Broadcaster's scan and splice, the Subscriber's scan: each
    equal to the per-event path's."""
    ids = [e.event_id for e in evs]
    tss = [e.timestamp for e in evs]
    vals = [e.data.value_bytes for e in evs]
    hs, ns = evs[0].headers, evs[0].namespace
    data = encode_events(evs)
    batch = event_batch(ids, tss, vals, ns, SRC, hs)
    loop = candid_vec.start(F.EVENTS_HEADER, len(ids))  # the per-event writer
    spans = F._event_rows(loop, ids, tss, vals, F._shared_parts(SRC, ns, hs))
    assert batch.raw == bytes(loop) == data and batch.spans == spans
    agrees(F._scan_events, F.decode_events, data)
    got = METHODS["icrc72_publish"].decode_arg(data)
    assert type(got) is EventBatch and got.spans == spans
    hdr = [*(hs or []), RECEIVED]
    for flt in (None, "sel == 0"):
        notes = got.notifications(hdr, flt, first_id, step, len(evs))
        want = encode_notifications(
            [
                EventNotification(
                    first_id + k * step,
                    e.event_id,
                    e.prev_event_id,
                    e.timestamp,
                    e.namespace,
                    e.data,
                    hdr,
                    e.source,
                    flt,
                )
                for k, e in enumerate(evs)
            ]
        )
        assert notes == want
        agrees(F._scan_notes, F.decode_notifications, notes)
        nb = METHODS["icrc72_handle_notification"].decode_arg(notes)
        assert type(nb) is NotificationBatch
        assert nb.event_ids == ids
        assert nb.notification_ids == [first_id + k * step for k in range(len(evs))]


BLOB = {"Blob": bytes(range(200))}


def test_short_batches_take_the_per_event_paths_with_the_same_bytes():
    ids = list(range(120, 140))
    for n in (1, 5, 20):
        check_batch(events(ids[:n], ids[:n], [BLOB] * n))
        with at_once_from(1):
            check_batch(events(ids[:n], ids[:n], [BLOB] * n))


@pytest.mark.parametrize(
    "ids",
    [
        range(0, 300),  # id 0 (no previous id), then 1- and 2-byte LEB128 ids
        range(16_000, 17_000),  # 2- to 3-byte ids inside the batch
        range(2**21 - 40, 2**21 + 40),
        range(2**63 - 40, 2**63 + 40),  # past 63 bits: the per-event way, same bytes
    ],
)
def test_batches_whose_ids_change_length(ids):
    ids = list(ids)
    check_batch(events(ids, [1_764_000_000_000_000_000 + i for i in ids], [BLOB] * len(ids)))


def test_timestamps_and_data_of_every_length():
    rng = random.Random(11)
    n = 1500
    ids = list(range(40_000, 40_000 + n))
    tss = [rng.choice([0, 127, 128, 2**40, 2**62, 2**63 + 5, 2**64 - 1]) for _ in ids]
    vals = [{"Blob": rng.randbytes(rng.choice([0, 1, 127, 128, 300, 20_000]))} for _ in ids]
    check_batch(events(ids, tss, vals))
    check_batch(events(ids, [7] * n, vals), first_id=2**62, step=3)


def test_the_headers_bytes_inside_data_and_values_that_are_not_blobs():
    hs_enc = F._opt_headers(HS)
    ids = list(range(100, 400))
    vals = [BLOB] * len(ids)
    vals[7] = {"Blob": b"x" + hs_enc + b"y"}  # a false split point
    check_batch(events(ids, ids, vals))
    vals[7] = {"Blob": hs_enc}
    check_batch(events(ids, ids, vals))
    vals[200] = {"Map": [("a", {"Nat": 1})]}  # not a #Blob: the walk
    check_batch(events(ids, ids, vals))
    check_batch(events(ids, ids, [{"Text": str(i)} for i in ids]))
    check_batch(events(ids, ids, [BLOB] * len(ids), hs=[]))  # headers too short to split on
    check_batch(events(ids, ids, [BLOB] * len(ids), hs=None))


@settings(max_examples=120, deadline=None)
@given(uniform_events(), st.integers(0, 10**6), st.integers(0, 255), st.integers(0, 3))
def test_scans_of_random_event_batches_read_as_the_plan(evs, pos, byte, cut):
    data = encode_events(evs)
    with at_once_from(1):
        for b in (data, mutated(data, pos, byte, cut)):
            agrees(F._scan_events, F.decode_events, b)


@settings(max_examples=120, deadline=None)
@given(uniform_notes(), st.integers(0, 10**6), st.integers(0, 255), st.integers(0, 3))
def test_scans_of_random_notification_batches_read_as_the_plan(notes, pos, byte, cut):
    data = encode_notifications(notes)
    with at_once_from(1):
        for b in (data, mutated(data, pos, byte, cut)):
            agrees(F._scan_notes, F.decode_notifications, b)


def test_damaged_long_batches_read_as_the_plan_reads_them():
    rng = random.Random(5)
    ids = list(range(16_300, 16_500))
    data = encode_events(events(ids, ids, [BLOB] * len(ids)))
    for _ in range(300):
        bad = mutated(data, rng.randrange(len(data)), rng.randrange(256), rng.randrange(3))
        agrees(F._scan_events, F.decode_events, bad)
    batch = METHODS["icrc72_publish"].decode_arg(data)
    notes = batch.notifications([*HS, RECEIVED], None, 16_000, 1, len(ids))
    for _ in range(300):
        bad = mutated(notes, rng.randrange(len(notes)), rng.randrange(256), rng.randrange(3))
        agrees(F._scan_notes, F.decode_notifications, bad)


def generic_nats(data: bytes):
    m = METHODS["icrc72_confirm_notifications"]
    try:
        return _convert(m.arg_from, candid_decode(data, [m.arg_type])[0])
    except ICRC16DecodeError:
        return "error"


@pytest.mark.parametrize(
    "ids",
    [
        [],
        [5],
        list(range(100, 3000)),
        [0, 127, 128, 16_383, 16_384, 2**21, 2**40, 2**63 - 1],
        [2**63, 2**64, 2**70 + 1] * 10,  # past 63 bits: the generic reader
    ],
)
def test_confirmation_ids_read_and_write_as_the_generic_codec(ids):
    with at_once_from(1):
        check_nats(ids)
    check_nats(ids)


def check_nats(ids):
    data = METHODS["icrc72_confirm_notifications"].encode_arg(ids)
    assert encode_nats(ids) in (data, None)  # the batch kernel, where it takes the ids
    assert data == candid.encode([Types.Vec(Types.Nat)], [ids])  # the codec's bytes
    assert METHODS["icrc72_confirm_notifications"].decode_arg(data) == ids == generic_nats(data)
    rng = random.Random(len(ids))
    for _ in range(50):
        bad = mutated(data, rng.randrange(len(data)), rng.randrange(256), rng.randrange(3))
        got = decode_nats(bad)
        assert got is None or got == generic_nats(bad)


@pytest.mark.parametrize(
    ("ok", "busy", "first"), [(2000, 0, 16_000), (300, 17, 0), (20, 3, 2**63 - 5)]
)
def test_results_runs_write_as_the_per_event_writer(ok, busy, first):
    r = PublishResults(ok + busy, ok, first, 1)
    assert F.encode_publish_results(r) == METHODS["icrc72_publish"].encode_ret(list(r))


def test_procure_batch_of_many_records_equals_procure():
    msgs = [
        StreamMessage(i, stored_event({"Blob": bytes([i % 256]) * (i % 300)}, None, 10**18 + i))
        for i in range(16_000, 17_500)
    ]
    got = procure_batch(msgs, "ns", 3, SRC, True, 99_999)
    want = procure(msgs, "ns", 3, SRC, True, 99_999)
    assert type(got) is EventBatch and encode_events(got) == encode_events(want)
    assert got == want


def test_a_last_event_shorter_than_the_first_is_still_read_at_once():
    """The stride guess (every event as long as the first) then runs past the end of the
    message: the executor must go on to its next guess, not give the batch up."""
    ids = list(range(1000, 1300))
    vals = [BLOB] * (len(ids) - 1) + [{"Blob": bytes(140)}]
    check_batch(events(ids, ids, vals))
