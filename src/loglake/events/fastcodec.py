"""The fast encoder of the replay data plane: ``vec EventNotification`` and ``vec Event``.

Why (issue 11): end-to-end replay was bound by icp-py-core's pure-Python Candid encoder
(~15–20 µs per event per hop). A notification batch (``icrc72_handle_notification``'s argument,
what a Broadcaster sends a Subscriber) and an event batch (``icrc72_publish``'s, what a
Publisher sends a Broadcaster) are written here straight from the dataclasses of
``messages.py``: icp-py-core's own header for the argument type (so the message is byte for
byte what icp-py-core writes — tested with hypothesis on random ICRC-16 data,
``tests/events/test_fastcodec.py``), then the records' fields in Candid field-hash order, the
ICRC-16 values through ``loglake.wire.icrc16_encode`` (validated as they are written: invalid
input raises ``ICRC16Error``, never untyped), a ``RawValue``'s stored bytes spliced as they are.
@dfinity/candid decodes the same bytes to the same values (``test_candid_interop.py``).

The Spark replay path encodes notifications in executors, before the Broadcaster has given
them an id or a ``received`` time: :func:`notification_parts` writes a notification as three
byte strings around those two ``nat``s, and :func:`join_notifications` assembles a batch from
them — the same bytes as :func:`encode_notifications` on the finished notifications.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from icp_candid import Types

from loglake.events import candid_types as T
from loglake.events.messages import Event, EventNotification, ICRC16Map
from loglake.wire.candid_fast import header
from loglake.wire.icrc16 import ICRC16Error
from loglake.wire.icrc16_encode import map_items, nat, principal, text, uleb, value

H_RECEIVED = "icrc72:broadcaster:received"
"""The Broadcaster's header (candidate "Event Headers"); see broadcaster.py."""

NOTIFICATIONS_HEADER = header(Types.Vec(T.EventNotification))
"""``DIDL`` + type table + arg type of ``vec EventNotification``, as icp-py-core writes it."""


def _event_wire_type() -> Any:
    from loglake.events.codec import EventWire  # codec imports this module lazily

    return EventWire


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
if _order(T.EventNotification) != _NOTE_ORDER:  # pragma: no cover - guards the hand order
    raise ImportError(f"EventNotification field order changed: {_order(T.EventNotification)}")


class _Cache:
    """Encoded namespaces and principals of one batch (a replay batch repeats them)."""

    __slots__ = ("ns", "ns_b", "src", "src_b")

    def __init__(self) -> None:
        self.ns: Any = None
        self.ns_b = b""
        self.src: Any = None
        self.src_b = b""

    def namespace(self, ns: Any) -> bytes:
        if ns is not self.ns:
            out = bytearray()
            text(ns, out, "namespace")
            self.ns, self.ns_b = ns, bytes(out)
        return self.ns_b

    def source(self, p: Any) -> bytes:
        if p is not self.src:
            out = bytearray()
            principal(p, out, "source")
            self.src, self.src_b = p, bytes(out)
        return self.src_b


def _opt_nat(n: int | None, out: bytearray, what: str) -> None:
    if n is None:
        out.append(0)
    else:
        out.append(1)
        nat(n, out, what)


def _headers(h: ICRC16Map | None, out: bytearray, cache: dict[int, bytes]) -> None:
    if h is None:
        out.append(0)
        return
    # the replay headers list is shared by every event of a procured batch: encode it once
    b = cache.get(id(h))
    if b is None:
        buf = bytearray(b"\x01")
        map_items(h, buf)
        b = cache[id(h)] = bytes(buf)
    out += b


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
    if not isinstance(notes, list | tuple):
        raise ICRC16Error("a notification batch is a list of EventNotification")
    out = bytearray(NOTIFICATIONS_HEADER)
    uleb(len(notes), out)
    c = _Cache()
    hc: dict[int, bytes] = {}
    keep = []  # header lists stay alive while their id() is a cache key
    for n in notes:
        if type(n) is not EventNotification:
            raise ICRC16Error(f"not an EventNotification: {n!r:.80}")
        keep.append(n.headers)
        nat(n.event_id, out, "eventId")
        out += c.source(n.source)
        value(n.data, out)
        _headers(n.headers, out, hc)
        _opt_nat(n.prev_event_id, out, "prevEventId")
        if n.filter is None:
            out.append(0)
        else:
            out.append(1)
            text(n.filter, out, "filter")
        nat(n.timestamp, out, "timestamp")
        nat(n.notification_id, out, "notificationId")
        out += c.namespace(n.namespace)
    return bytes(out)


def encode_events(events: Sequence[Event]) -> bytes:
    """The Candid message of ``vec Event`` (``icrc72_publish``, data may be a RawValue)."""
    if not isinstance(events, list | tuple):
        raise ICRC16Error("an event batch is a list of Event")
    out = bytearray(_events_header())
    uleb(len(events), out)
    c = _Cache()
    hc: dict[int, bytes] = {}
    keep = []
    for e in events:
        if type(e) is not Event:
            raise ICRC16Error(f"not an Event: {e!r:.80}")
        keep.append(e.headers)
        nat(e.event_id, out, "eventId")
        out += c.source(e.source)
        value(e.data, out)
        _headers(e.headers, out, hc)
        _opt_nat(e.prev_event_id, out, "prevEventId")
        nat(e.timestamp, out, "timestamp")
        out += c.namespace(e.namespace)
    return bytes(out)


_EV_HEADER: list[bytes] = []


def _events_header() -> bytes:
    if not _EV_HEADER:
        t = _event_wire_type()
        if _order(t) != _EVENT_ORDER:  # pragma: no cover - guards the hand order
            raise ImportError(f"Event field order changed: {_order(t)}")
        _EV_HEADER.append(header(Types.Vec(t)))
    return _EV_HEADER[0]


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
    (``headers`` are the event's, without it).
    """
    a = bytearray()
    nat(event_id, a, "eventId")
    principal(source, a, "source")
    value(data, a)
    hs = list(headers or [])
    a.append(1)
    uleb(len(hs) + 1, a)
    for k, v in hs:
        text(k, a, "header key")
        value(v, a, 1)
    text(H_RECEIVED, a)
    a += b"\x02"  # index of #Nat among the ICRC-16 tags (checked below)
    b = bytearray()
    _opt_nat(prev_event_id, b, "prevEventId")
    if filter is None:
        b.append(0)
    else:
        b.append(1)
        text(filter, b, "filter")
    nat(timestamp, b, "timestamp")
    c = bytearray()
    text(namespace, c, "namespace")
    return bytes(a), bytes(b), bytes(c)


def join_notifications(
    parts: Sequence[tuple[bytes, bytes, bytes]], received: int, first_id: int
) -> bytes:
    """The ``vec EventNotification`` message of ``parts``, numbered from ``first_id``."""
    out = bytearray(NOTIFICATIONS_HEADER)
    uleb(len(parts), out)
    rb = bytearray()
    nat(received, rb, "received")
    recv = bytes(rb)
    nid = first_id
    for a, b, c in parts:
        out += a
        out += recv
        out += b
        uleb(nid, out)
        out += c
        nid += 1
    return bytes(out)


def _check_nat_index() -> None:
    from loglake.wire.icrc16 import TAGS

    if TAGS.index("Nat") != 2:  # pragma: no cover - guards the constant above
        raise ImportError("ICRC-16 #Nat is no longer variant index 2")


_check_nat_index()
