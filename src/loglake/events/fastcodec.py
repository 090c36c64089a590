"""The replay data plane's batches: ``vec Event`` and ``vec EventNotification`` (and the
replies and confirmations that go with them) read and written through the one Candid codec
(``loglake.wire.candid``), plus lazy batches that carry a long batch without an object per
item: the codec's batch executor (``loglake.wire.candid_vec``) reads where each item's fields
are, and this module only maps them to the ICRC types — it parses no Candid bytes itself, and
writes none: vector lengths and numbers come from the codec's writers, and the fixed bytes of
an item (an ``Ok`` result before its ids, the headers before the Broadcaster's ``received``)
are what the codec's writer of that type writes (``candid_vec.write_head``), never spelled
out.

What is ICRC-specific here, and nothing else: how the batch items map to the dataclasses of
``messages.py`` — :data:`EVENTS` and :data:`NOTIFICATIONS` are the Candid types of the two
batches shaped (``candid.shaped``) so that the codec's plan builds ``Event`` /
``EventNotification`` directly and writes them from their fields, ICRC-16 values in
``loglake.wire.icrc16``'s form, ``opt`` fields as None, and a batch's repeated namespace,
source and headers read and written once per message. Any encoder's type table decodes through
the same plan compiler (another table gets its own plan, with the spec's subtyping).

The Spark replay path encodes notifications in executors, before the Broadcaster has given
them an id or a ``received`` time: :func:`notification_parts` writes a notification as three
byte strings around those two ``nat``s, and :func:`join_notifications` assembles a batch from
them — the same bytes as :func:`encode_notifications` on the finished notifications.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from icp_candid import Types

from loglake.events import candid_types as T
from loglake.events.messages import Err, Event, EventNotification, ICRC16Map, InboxPage, Ok
from loglake.wire import candid, candid_vec
from loglake.wire import candid_batch as kernels
from loglake.wire.icrc16 import (
    ICRC16DecodeError,
    ICRC16Error,
    candid_decode,
    loglake_form,
    write_value,
)

H_RECEIVED = "icrc72:broadcaster:received"
"""The Broadcaster's header (candidate "Event Headers"); see broadcaster.py."""


def _order(t: Any) -> list[str]:
    return [t._field_map[h][0] for h in t._sorted_hashes]


_NOTE_ORDER = [
    "eventId",
    "source",
    "data",
    "headers",
    "prevEventId",
    "filter",
    "timestamp",
    "notificationId",
    "namespace",
]
_EVENT_ORDER = ["eventId", "source", "data", "headers", "prevEventId", "timestamp", "namespace"]
if _order(T.EventNotification) != _NOTE_ORDER:  # pragma: no cover - guards the forms below
    raise ImportError(f"EventNotification field order changed: {_order(T.EventNotification)}")
if _order(T.EventWire) != _EVENT_ORDER:  # pragma: no cover - guards the forms below
    raise ImportError(f"Event field order changed: {_order(T.EventWire)}")

_EVENT = candid.RecordForm(
    Event,
    lambda eid, src, data, hs, prev, ts, ns: Event(eid, prev, ts, ns, data, src, hs),
    lambda e: (e.event_id, e.source, e.data, e.headers, e.prev_event_id, e.timestamp, e.namespace),
)
_NOTE = candid.RecordForm(
    EventNotification,
    lambda eid, src, data, hs, prev, flt, ts, nid, ns: EventNotification(
        nid, eid, prev, ts, ns, data, hs, src, flt
    ),
    lambda n: (
        n.event_id,
        n.source,
        n.data,
        n.headers,
        n.prev_event_id,
        n.filter,
        n.timestamp,
        n.notification_id,
        n.namespace,
    ),
)
_REPEATED = {"source", "namespace", "headers"}
"""What every item of a replay batch repeats."""


def _batch_form(item: Any, form: candid.RecordForm) -> Callable[[Any], None]:
    def shape(find: Callable[[Any], candid.Node]) -> None:
        loglake_form(find)
        rec = find(item)
        rec.form = form
        for _, name, n in rec.fields:
            n.optional = n.op == candid.OPT
            n.repeats = name in _REPEATED

    return shape


EVENTS = candid.shaped(Types.Vec(T.EventWire), _batch_form(T.EventWire, _EVENT))
"""``vec Event`` (``icrc72_publish``'s argument) read as ``Event``s, data kept as the stored
bytes (``RawValue``) where the wire type is ICRC-16's."""
NOTIFICATIONS = candid.shaped(
    Types.Vec(T.EventNotification), _batch_form(T.EventNotification, _NOTE)
)
"""``vec EventNotification`` (``icrc72_handle_notification``'s argument) as dataclasses."""
NOTIFICATIONS_HEADER = candid.header(NOTIFICATIONS)
"""``DIDL`` + type table + arg type of ``vec EventNotification``, as icp-py-core writes it."""
EVENTS_HEADER = candid.header(EVENTS)
_write_nat = candid_vec.write_nat
_write_text = candid.own_writer(Types.Text)
_write_principal = candid.own_writer(Types.Principal)
_write_opt_nat = candid.own_writer(EVENTS.inner.fields[4][2])  # type: ignore[union-attr]


_NOTE_WRITERS = {name: candid.own_writer(n) for _, name, n in NOTIFICATIONS.inner.fields}  # type: ignore[union-attr]
_OPT_MAP = Types.Opt(T.ICRC16Map)


def _optional_map(find: Callable[[Any], candid.Node]) -> None:
    loglake_form(find)
    find(_OPT_MAP).optional = True


_write_headers = candid.own_writer(candid.shaped(_OPT_MAP, _optional_map))
"""A notification's ``opt ICRC16Map`` headers, as the batch writes them but not marked
``repeats`` (each notification of :func:`notification_parts` has its own)."""
_RECEIVED_0 = (H_RECEIVED, {"Nat": 0})
"""The Broadcaster's header with its nat as 0: :func:`notification_parts` writes the headers
up to that nat."""


def _encoded(field: str, v: Any) -> bytes:
    """One notification field's bytes (``filter``: ``opt text``, ``headers``: ``opt
    ICRC16Map``), written by the codec."""
    out = bytearray()
    _NOTE_WRITERS[field](v, out)
    return bytes(out)


def _opt_text(s: str | None) -> bytes:
    return _encoded("filter", s)


def _opt_headers(h: ICRC16Map | None) -> bytes:
    return _encoded("headers", h)


@dataclass(frozen=True)
class EncodedNotifications:
    """A notification batch already encoded (:func:`join_notifications`): a Broadcaster
    delivering a replay job's output sends it as the ``icrc72_handle_notification`` argument."""

    data: bytes
    count: int


def encode_notifications(notes: Sequence[EventNotification] | EncodedNotifications) -> bytes:
    """The Candid message of ``vec EventNotification`` (``icrc72_handle_notification``)."""
    if isinstance(notes, EncodedNotifications):
        return notes.data
    return candid.encode([NOTIFICATIONS], [notes])


INBOX_PAGE = candid.shaped(
    Types.Tuple(Types.Nat, Types.Vec(T.EventNotification)),
    _batch_form(T.EventNotification, _NOTE),
)
"""``loglake_inbox``'s result (:class:`InboxPage`), its notifications as dataclasses."""
INBOX_PAGE_HEADER = candid.header(INBOX_PAGE)
_write_note = candid.own_writer(NOTIFICATIONS.inner)


def notification_bytes(n: EventNotification) -> bytes:
    """One notification as a ``vec EventNotification`` holds it (no header, no length): what it
    adds to a message. The inbox counts its reply's budget in these, then sends them as they
    are (:class:`EncodedNotes`), so a notification is written once."""
    out = bytearray()
    _write_note(n, out)
    return bytes(out)


@dataclass(frozen=True)
class EncodedNotes:
    """Notifications already written one by one (:func:`notification_bytes`), in order."""

    parts: list[bytes]

    def __len__(self) -> int:
        return len(self.parts)


def encode_inbox_page(page: tuple[int, Sequence[EventNotification] | EncodedNotes]) -> bytes:
    """The Candid message of ``loglake_inbox``'s result (an :class:`InboxPage`, or its
    notifications as :class:`EncodedNotes`)."""
    cursor, notes = page
    parts = notes.parts if isinstance(notes, EncodedNotes) else map(notification_bytes, notes)
    out = bytearray(INBOX_PAGE_HEADER)
    _write_nat(cursor, out)
    _write_nat(len(notes), out)
    for b in parts:
        out += b
    return bytes(out)


def decode_inbox_page(data: bytes) -> InboxPage:
    """``loglake_inbox``'s result → an :class:`InboxPage` (any encoder's type table)."""
    cursor, notes = _decoding("inbox page", _inbox_page, bytes(data))
    return InboxPage(cursor, notes)


def _inbox_page(b: bytes) -> Any:
    return candid_decode(b, [INBOX_PAGE])[0]


def encode_events(events: Sequence[Event]) -> bytes:
    """The Candid message of ``vec Event`` (``icrc72_publish``, data may be a RawValue)."""
    if type(events) is EventBatch:
        return events.raw  # a batch as it was read: its message
    return candid.encode([EVENTS], [events])


def _events_header() -> bytes:
    return EVENTS_HEADER


# --- notifications in parts (the Spark replay path) -------------------------------------------
def notification_parts(
    event_id: int,
    prev_event_id: int | None,
    timestamp: int,
    namespace: str,
    data: Any,
    headers: ICRC16Map | None,
    source: Any,
    filter: str | None,
) -> tuple[bytes, bytes, bytes]:
    """A notification without its id and ``received`` time, as ``(a, b, c)``.

    The Broadcaster's notification is ``a · nat(received) · b · nat(notificationId) · c``:
    ``a`` ends inside the headers, whose last entry is ``(H_RECEIVED, #Nat received)``
    (``headers`` are the event's, without it): the codec's writer of the headers writes them
    with that entry's nat as 0, which ``candid_vec.write_head`` leaves out.
    """
    a = bytearray()
    _write_nat(event_id, a)
    _write_principal(source, a)
    write_value(data, a)
    candid_vec.write_head(_write_headers, [*(headers or []), _RECEIVED_0], 1, a)
    b = bytearray()
    _write_opt_nat(prev_event_id, b)
    b += _opt_text(filter)
    _write_nat(timestamp, b)
    c = bytearray()
    _write_text(namespace, c)
    return bytes(a), bytes(b), bytes(c)


def join_notifications(
    parts: Sequence[tuple[bytes, bytes, bytes]], received: int, first_id: int
) -> bytes:
    """The ``vec EventNotification`` message of ``parts``, numbered from ``first_id``."""
    out = candid_vec.start(NOTIFICATIONS_HEADER, len(parts))
    rb = bytearray()
    _write_nat(received, rb)
    recv = bytes(rb)
    nid = first_id
    for a, b, c in parts:
        out += a
        out += recv
        out += b
        _write_nat(nid, out)
        out += c
        nid += 1
    return bytes(out)


# --- reading: the one codec's plans -----------------------------------------------------------
def _decoding(what: str, f: Callable[[bytes], Any], data: bytes) -> Any:
    try:
        return f(data)
    except ICRC16DecodeError:
        raise
    except RecursionError as e:
        raise ICRC16DecodeError("Candid value nested too deeply") from e
    except Exception as e:  # ValueError, IndexError, UnicodeDecodeError, struct.error…
        raise ICRC16DecodeError(f"malformed Candid {what}: {type(e).__name__}: {e}") from e


def _notes(b: bytes) -> list[EventNotification]:
    return candid_decode(b, [NOTIFICATIONS])[0]


def _events(b: bytes) -> list[Event]:
    return candid_decode(b, [EVENTS])[0]


def decode_notifications(data: bytes) -> list[EventNotification]:
    """``vec EventNotification`` → the notifications (any encoder's type table)."""
    return _notes(bytes(data))


def decode_events(data: bytes) -> list[Event]:
    """``vec Event`` (``icrc72_publish``; data kept as ``RawValue`` where the wire type is
    ICRC-16's) → the events (any encoder's type table)."""
    return _events(bytes(data))


# --- icrc72_publish's results and icrc72_confirm_notifications' ids -----------------------------
PUBLISH_RESULTS_HEADER = candid.header(Types.Vec(T.PublishResult))
"""``DIDL`` + type table + arg type of ``vec PublishResult``, as icp-py-core writes it."""
NATS_HEADER = candid.header(Types.Vec(Types.Nat))
_write_result = candid.own_writer(T.PublishResult)


def encode_publish_results(results: Sequence[Any]) -> bytes | None:
    """``vec PublishResult`` (``icrc72_publish``'s reply) of a :class:`PublishResults` run;
    None for anything else (the codec writes it from the converted values)."""
    if type(results) is PublishResults:
        return _encode_results_run(results)
    return None


def _ok_head(per: int) -> bytes:
    """A ``PublishResult`` of ``Ok`` with ``per`` ids, before the ids, as the codec writes it."""
    return candid_vec.head_of(_write_result, [{"Ok": [0] * per}], per)


def _written(write: candid.Writer, v: Any) -> bytes:
    out = bytearray()
    write(v, out)
    return bytes(out)


_OK_ONE = _ok_head(1)
_BUSY = _written(_write_result, [{"Err": {"Busy": None}}])
"""``Err(#Busy)``, as the codec writes it."""


def decode_publish_results(data: bytes) -> Sequence[Any] | None:
    """``vec PublishResult`` → ``Ok([id])``… then ``Busy``… read at once by the codec's run
    kernel (a Broadcaster's answer to a replay batch); None: the plan reads it."""
    got = candid_vec.runs(bytes(data), PUBLISH_RESULTS_HEADER, _OK_ONE, _BUSY)
    if got is None:
        return None
    return _ReadResults(*got)


def encode_nats(ids: Sequence[Any]) -> bytes | None:
    """``vec nat`` (``icrc72_confirm_notifications``' argument) of a long batch, its LEB128
    written at once; None for a short one or anything unusual (the codec writes it)."""
    return candid_vec.write_nat_vec(NATS_HEADER, ids)


# --- lazy batches: the replay data plane without a dataclass per event ----------------------
# Why: a Broadcaster that turns a replay's ``icrc72_publish`` batch into notifications needs no
# event as an object: a notification is the event's bytes with the Broadcaster's headers, the
# filter and the notification id put in between (``eventId source data`` · headers ·
# ``prevEventId`` · filter · ``timestamp`` · notificationId · ``namespace``). The codec's batch
# executor (``wire.candid_vec``) finds where each field of each item starts in a batch whose
# items repeat source, headers and namespace (every batch ``procure`` makes), every byte checked
# as the plan checks it; the batch keeps its bytes and those offsets, and an ``Event`` is built
# only when asked for (``EventBatch[k]``, iteration: the plan then runs once). Any other batch,
# and any batch the executor does not take (damaged bytes included: the plan then raises the
# typed error), is read by the plan into a list.
AT_ONCE = 64
"""Batches of fewer events are written event by event: numpy's fixed cost per call (5–10 µs)
would cost a short batch (a live publish of one event) more than its loop does."""
_EVENT_VEC = candid_vec.RecordVec(EVENTS)
_NOTE_VEC = candid_vec.RecordVec(NOTIFICATIONS, frozenset({"filter"}))


def decode_nats(data: bytes) -> list[int] | None:
    """``vec nat`` (``icrc72_confirm_notifications``' argument) → the ids, read at once by the
    codec's kernel; None for a short vector or anything unusual: the plan decides."""
    return candid_vec.nat_vec(bytes(data), NATS_HEADER)


_Item = TypeVar("_Item")


class _LazyBatch(Sequence[_Item]):
    """A message's items read on first use: the scan that made the batch checked every byte,
    so the full reader (``_decode``) runs only when a caller takes the items themselves."""

    __slots__ = ("_items", "headers", "namespace", "raw")
    raw: bytes
    namespace: str
    _items: list[_Item] | None
    _what = "batch"
    """What the message is, for errors and ``repr``."""

    def __init__(self, raw: bytes, headers: ICRC16Map | None, namespace: str) -> None:
        self.raw = raw
        self.headers = headers
        self.namespace = namespace
        self._items = None

    def _read(self, raw: bytes) -> list[_Item]:
        """The full reader of the message (every item built)."""
        raise NotImplementedError

    def _decode(self) -> list[_Item]:
        return _decoding(self._what, self._read, self.raw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} items of {self.namespace!r})"

    def _list(self) -> list[_Item]:
        if self._items is None:
            self._items = self._decode()
        return self._items

    def __getitem__(self, k: Any) -> Any:
        return self._list()[k]

    def __iter__(self) -> Any:
        yield from self._list()  # built at the first next(), not by iter() (zip calls it)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, type(self) | list | tuple):
            return self._list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class EventBatch(_LazyBatch[Event]):
    """``vec Event`` as read from an ``icrc72_publish`` message: the message's bytes and each
    event's offsets; the events share ``source``, ``headers`` and ``namespace``. A sequence of
    ``Event`` (built on first use, equal to what :func:`decode_events` returns)."""

    __slots__ = ("_sp", "headers_enc", "source")

    def __init__(
        self,
        raw: bytes,
        spans: list[int] | np.ndarray,
        source: Any,
        headers: ICRC16Map | None,
        headers_enc: bytes,
        namespace: str,
    ) -> None:
        super().__init__(raw, headers, namespace)
        self._sp = np.asarray(spans, dtype=np.int64).reshape(-1, 4)
        """Per event (a row): start, end of ``data``, start of ``timestamp``, end."""
        self.source = source
        self.headers_enc = headers_enc
        """The events' ``opt ICRC16Map`` as encoded (flag included)."""

    _what = "event batch"

    def _read(self, raw: bytes) -> list[Event]:
        return _events(raw)

    @property
    def spans(self) -> list[int]:
        """Per event: start, end of ``data``, start of ``timestamp``, end (4 ints an event)."""
        return list(self._sp.ravel().tolist())

    def __len__(self) -> int:
        return len(self._sp)

    def event_bytes(self) -> np.ndarray:
        """Each event's length in the message (its data, headers and other fields)."""
        return self._sp[:, 3] - self._sp[:, 0]

    def notifications(
        self,
        headers: ICRC16Map | None,
        filter: str | None,
        first_id: int,
        step: int,
        count: int,
        start: int = 0,
    ) -> bytes:
        """The ``vec EventNotification`` message of ``count`` events from the ``start``-th,
        with ``headers`` and ``filter``, notification ids ``first_id``, ``first_id + step``, …
        — each event's id, source, data, previous id and timestamp copied as they are."""
        ns = bytearray()
        _write_text(self.namespace, ns)
        hdr, flt, nsb = _opt_headers(headers), _opt_text(filter), bytes(ns)
        skip_h = len(self.headers_enc)
        skip_ns = len(nsb)
        if count >= AT_ONCE and first_id >= 0 and step >= 0 and first_id + step * count < 1 << 63:
            # every event's bytes up to its data end, then a row of the fields after it
            rows = self._sp[start : start + count]
            b = self.raw
            S, D, T, E = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
            heads = [b[s:d] for s, d in zip(S.tolist(), D.tolist(), strict=True)]
            B = np.frombuffer(b, np.uint8)
            nids = np.arange(count, dtype=np.uint64) * np.uint64(step) + np.uint64(first_id)
            prev_at = D + skip_h
            tails = kernels.rows(
                count,
                [
                    hdr,
                    ("copy", B, prev_at, T - prev_at),
                    flt,
                    ("copy", B, T, E - skip_ns - T),
                    ("leb", nids),
                    nsb,
                ],
            )
            out0 = candid_vec.start(NOTIFICATIONS_HEADER, count)
            return bytes(out0) + kernels.interleave(heads, tails)
        b, sp = self.raw, self._sp[start : start + count].ravel().tolist()
        out = candid_vec.start(NOTIFICATIONS_HEADER, count)
        nid = first_id
        for k in range(0, count << 2, 4):
            s, d, t, e = sp[k], sp[k + 1], sp[k + 2], sp[k + 3]
            out += b[s:d]
            out += hdr
            out += b[d + skip_h : t]
            out += flt
            out += b[t : e - skip_ns]
            _write_nat(nid, out)
            out += nsb
            nid += step
        return bytes(out)


def decode_event_batch(data: bytes) -> EventBatch | list[Event]:
    """``vec Event`` (``icrc72_publish``) → an :class:`EventBatch` (events sharing source,
    headers and namespace: read lazily), else the list :func:`decode_events` reads."""
    return _lazy_or_full(data, _events_header(), _scan_events, "event batch", _events)


def _scan_events(b: bytes) -> EventBatch | None:
    """The :class:`EventBatch` of ``b``, if the codec's batch executor takes it."""
    run = candid_vec.scan(_EVENT_VEC, b)
    if run is None:
        return None
    c, cols, first = _EVENT_VEC.column, run.cols, run.first
    h = c["headers"]
    sp = np.stack([cols[0], cols[h], cols[c["timestamp"]], cols[-1]], axis=1)
    headers_enc = b[int(cols[h][0]) : int(cols[h + 1][0])]
    return EventBatch(b, sp, first[c["source"]], first[h], headers_enc, first[c["namespace"]])


def _lazy_or_full(
    data: bytes,
    header: bytes,
    scan: Callable[[bytes], Any],
    what: str,
    full: Callable[[bytes], list[Any]],
) -> Any:
    """The lazy batch ``scan`` makes of a message with our ``header``, else the items ``full``
    reads (any encoder's table; it reports any damage)."""
    b = bytes(data)
    if not b.startswith(header):
        return _decoding(what, full, b)
    try:
        batch = scan(b)
    except Exception:  # any failure: the full reader below reports it
        batch = None
    if batch is not None:
        return batch
    return _decoding(what, full, b)


class PublishResults(Sequence[Any]):
    """``icrc72_publish``'s results for a batch a Broadcaster notified in one go: the first
    ``delivered`` events ``Ok`` with ``per_event`` notification ids each (``first_id + k *
    per_event + j``), the rest ``Busy``. A sequence of ``Ok`` / ``Err`` (built on use); the
    encoder writes it without them."""

    __slots__ = ("delivered", "first_id", "length", "per_event")

    def __init__(self, count: int, delivered: int, first_id: int, per_event: int) -> None:
        self.length, self.delivered = count, delivered
        self.first_id, self.per_event = first_id, per_event

    def __len__(self) -> int:
        return self.length

    def _item(self, k: int) -> Ok | Err:
        if k < self.delivered:
            base = self.first_id + k * self.per_event
            return Ok(list(range(base, base + self.per_event)))
        return Err("Busy")

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self._item(j) for j in range(*k.indices(self.length))]
        if k < 0:
            k += self.length
        if not 0 <= k < self.length:
            raise IndexError(k)
        return self._item(k)

    def __iter__(self) -> Any:
        return (self._item(k) for k in range(self.length))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PublishResults | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PublishResults({self.delivered} of {self.length} Ok)"


def _encode_results_run(r: PublishResults) -> bytes:
    per = r.per_event
    head = _OK_ONE if per == 1 else _ok_head(per)
    busy = r.length - r.delivered
    return candid_vec.write_runs(
        PUBLISH_RESULTS_HEADER, head, r.first_id, r.delivered, per, _BUSY, busy
    )


class _ReadResults(PublishResults):
    """Publish results as read: every ``Ok`` holds one id (kept as its bytes until asked
    for), then ``Busy``."""

    __slots__ = ("ids",)

    def __init__(self, ids: list[bytes], busy: int) -> None:
        super().__init__(len(ids) + busy, len(ids), 0, 1)
        self.ids = ids

    def _item(self, k: int) -> Ok | Err:
        if k < self.delivered:
            return Ok([candid_vec.nat(self.ids[k])])
        return Err("Busy")


class NotificationBatch(_LazyBatch[EventNotification]):
    """``vec EventNotification`` as read from an ``icrc72_handle_notification`` message whose
    notifications share source, headers, filter and namespace (a Broadcaster's batch): the
    bytes, and each notification's event id and notification id — what a Subscriber needs to
    route, deduplicate and confirm. A sequence of ``EventNotification`` (built on first use,
    equal to what :func:`decode_notifications` returns)."""

    __slots__ = ("event_ids", "notification_ids")

    def __init__(
        self,
        raw: bytes,
        event_ids: list[int],
        notification_ids: list[int],
        headers: ICRC16Map | None,
        namespace: str,
    ) -> None:
        super().__init__(raw, headers, namespace)
        self.event_ids = event_ids
        self.notification_ids = notification_ids

    _what = "notification batch"

    def _read(self, raw: bytes) -> list[EventNotification]:
        return _notes(raw)

    def __len__(self) -> int:
        return len(self.event_ids)


def decode_notification_batch(data: bytes) -> NotificationBatch | list[EventNotification]:
    """``vec EventNotification`` → a :class:`NotificationBatch` (notifications sharing source,
    headers, filter and namespace: read lazily), else the list :func:`decode_notifications`
    reads."""
    return _lazy_or_full(data, NOTIFICATIONS_HEADER, _scan_notes, "notification batch", _notes)


def _scan_notes(b: bytes) -> NotificationBatch | None:
    """The :class:`NotificationBatch` of ``b``, if the codec's batch executor takes it."""
    run = candid_vec.scan(_NOTE_VEC, b, ("eventId", "notificationId"))
    if run is None:
        return None
    c, first = _NOTE_VEC.column, run.first
    return NotificationBatch(
        b,
        run.nats["eventId"],
        run.nats["notificationId"],
        first[c["headers"]],
        first[c["namespace"]],
    )


def _shared_parts(source: Any, namespace: str, headers: ICRC16Map | None) -> tuple[bytes, ...]:
    """A batch's shared fields as encoded: source, namespace, ``opt`` headers."""
    src = bytearray()
    _write_principal(source, src)
    ns = bytearray()
    _write_text(namespace, ns)
    return bytes(src), bytes(ns), _opt_headers(headers)


def event_batch(
    ids: Sequence[int] | np.ndarray,
    timestamps: Sequence[int] | np.ndarray,
    values: Sequence[bytes],
    namespace: str,
    source: Any,
    headers: ICRC16Map | None,
) -> EventBatch:
    """Events ``ids[k]`` (previous id ``ids[k] - 1``, none for 0) with ``timestamps[k]`` and
    the ICRC-16 value bytes ``values[k]`` (spliced as a ``RawValue`` is), sharing namespace,
    source and headers, written as the ``icrc72_publish`` message and kept as an
    :class:`EventBatch` — what a Publisher sends for a replay batch, without an ``Event``
    each (same bytes as :func:`encode_events` on those events).

    Each event is ``LEB128(id) · source`` · its value · ``headers · opt prevEventId ·
    LEB128(timestamp) · namespace``; a long batch's ids, previous ids and timestamps are
    written at once (:func:`_rows`). Ids or timestamps that are not all nats below 2**64 go
    the per-event way (:func:`_event_rows`, which raises the typed error)."""
    src, nsb, hdr = _shared_parts(source, namespace, headers)
    out = candid_vec.start(_events_header(), len(ids))
    n = len(values)
    ida = kernels.nat_array(ids) if len(ids) == n and n >= AT_ONCE else None
    tsa = kernels.nat_array(timestamps) if ida is not None and len(timestamps) == n else None
    if n == 0 or ida is None or tsa is None:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else ids
        timestamps = timestamps.tolist() if isinstance(timestamps, np.ndarray) else timestamps
        spans = _event_rows(out, ids, timestamps, values, (src, nsb, hdr))
        return EventBatch(bytes(out), spans, source, headers, hdr, namespace)
    pre = kernels.rows(n, [("leb", ida), src])
    post = kernels.rows(n, [hdr, ("opt", ida - np.uint64(1), ida > 0), ("leb", tsa), nsb])
    body = kernels.interleave(pre, list(values), post)
    # offsets: each event is its pre row, its value, its post row
    lens = np.empty((n, 3), np.int64)
    lens[:, 0] = kernels.leb_widths(ida) + len(src)
    lens[:, 1] = np.fromiter(map(len, values), np.int64, n)
    lens[:, 2] = np.where(ida > 0, 1 + kernels.leb_widths(ida - np.uint64(1)), 1)
    lens[:, 2] += len(hdr) + kernels.leb_widths(tsa) + len(nsb)
    ends = np.cumsum(lens.ravel()).reshape(n, 3) + len(out)
    S = ends[:, 2] - lens.sum(axis=1)
    D = ends[:, 1]
    E = ends[:, 2]
    T = E - len(nsb) - kernels.leb_widths(tsa)
    return EventBatch(
        bytes(out) + body, np.stack([S, D, T, E], axis=1), source, headers, hdr, namespace
    )


def _event_rows(
    out: bytearray, ids: Any, timestamps: Any, values: Sequence[bytes], shared: tuple[bytes, ...]
) -> list[int]:
    """:func:`event_batch` event by event into ``out``; per event its start, data end,
    timestamp start and end."""
    src, nsb, hdr = shared
    spans: list[int] = []
    add = spans.extend
    last_ts: Any = None
    tsb = b""
    for i, ts, vb in zip(ids, timestamps, values, strict=True):
        if type(i) is not int or i < 0:
            raise ICRC16Error(f"eventId must be a nat, not {i!r:.80}")
        s = len(out)
        _write_nat(i, out)
        out += src
        out += vb
        d = len(out)
        out += hdr
        _write_opt_nat(i - 1 if i else None, out)
        t = len(out)
        if ts != last_ts or type(ts) is not int:
            tb = bytearray()
            _write_nat(ts, tb)
            last_ts, tsb = ts, bytes(tb)
        out += tsb
        out += nsb
        add((s, d, t, len(out)))
    return spans
