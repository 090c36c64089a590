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

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from icp_candid import Types
from icp_principal import Principal

from loglake.events import candid_types as T
from loglake.events.messages import Err, Event, EventNotification, ICRC16Map, Ok
from loglake.wire.candid_fast import compile_reader, header
from loglake.wire.icrc16 import (
    ICRC16,
    MAX_DEPTH,
    TAGS,
    ICRC16DecodeError,
    ICRC16Error,
    Property,
    RawValue,
)
from loglake.wire.icrc16_encode import map_items, nat, principal, text, uleb, value
from loglake.wire.varint import decode_uleb, encode_uleb

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
    if type(events) is EventBatch:
        return events.raw  # a batch as it was read: its message
    if not isinstance(events, list | tuple):
        raise ICRC16Error("an event batch is a list of Event")
    out = bytearray(_events_header())
    uleb(len(events), out)
    c = _Cache()
    hc: dict[int, bytes] = {}
    keep = []
    last_ts: Any = None
    last_tb = b""
    for e in events:
        if type(e) is not Event:
            raise ICRC16Error(f"not an Event: {e!r:.80}")
        keep.append(e.headers)
        nat(e.event_id, out, "eventId")
        out += c.source(e.source)
        value(e.data, out)
        _headers(e.headers, out, hc)
        _opt_nat(e.prev_event_id, out, "prevEventId")
        ts = e.timestamp
        if ts != last_ts or type(ts) is not int:  # a batch's events often share it
            tb = bytearray()
            nat(ts, tb, "timestamp")
            last_ts, last_tb = ts, bytes(tb)
        out += last_tb
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


# --- decoding straight into the dataclasses ---------------------------------------------------
# Why (issue 11): decoding a batch through the generic path builds icp_candid's value form
# (a dict per record, a list per opt, a dict per variant) and then converts it to ours
# (``codec.notification_from``, ``icrc16.from_candid``) — twice the objects, and the bulk of a
# subscriber's time per event. When a message's header is exactly our encoder's (as for
# ``candid_fast``), the readers below build ``EventNotification`` / ``Event`` / ``Ok`` directly;
# the output equals the generic path's (tested on random values, ``test_fastcodec.py``) and
# every malformed input raises ``ICRC16DecodeError``. Any other header: the generic path.
_ICRC16_T = ICRC16.get_type()
_uleb_r = decode_uleb


def _take(b: bytes, i: int, n: int) -> tuple[bytes, int]:
    j = i + n
    if j > len(b):
        raise ValueError("read past the end")
    return b[i:j], j


def _count(b: bytes, i: int) -> tuple[int, int]:
    """A vector's length (every element of our types takes at least one byte)."""
    n, i = _uleb_r(b, i)
    if n > len(b) - i:
        raise ValueError("vector longer than the message")
    return n, i


def _text_r(b: bytes, i: int) -> tuple[str, int]:
    n, i = _uleb_r(b, i)
    raw, i = _take(b, i, n)
    return raw.decode("utf-8"), i


def _compile_value() -> Callable[[bytes, int, int], tuple[Any, int]]:
    """A reader of ICRC-16 values into loglake's form (what ``icrc16.from_candid`` returns)."""
    cases: list[tuple[str, Callable[[bytes, int, int], tuple[Any, int]]]] = []

    def leaf(t: Any) -> Callable[[bytes, int, int], tuple[Any, int]]:
        rd = compile_reader(t)  # text, nat, int, fixed, float, bool, principal, blob, vec nat…
        return lambda b, i, d: rd(b, i)

    def read(b: bytes, i: int, d: int) -> tuple[Any, int]:
        if d > MAX_DEPTH:
            raise ICRC16DecodeError(f"ICRC-16 value nested deeper than {MAX_DEPTH}")
        k = b[i]
        if k < 0x80:
            i += 1
        else:
            k, i = _uleb_r(b, i)
        if k >= len(cases):
            raise ValueError("variant index out of range")
        tag, rd = cases[k]
        v, i = rd(b, i, d + 1)
        return {tag: v}, i

    def items(b: bytes, i: int, d: int) -> tuple[list[Any], int]:  # Array, Set
        n, i = _count(b, i)
        out = []
        for _ in range(n):
            v, i = read(b, i, d)
            out.append(v)
        return out, i

    def map_(b: bytes, i: int, d: int) -> tuple[list[Any], int]:  # vec record { text; ICRC16 }
        n, i = _count(b, i)
        out = []
        for _ in range(n):
            k, i = _text_r(b, i)
            v, i = read(b, i, d)
            out.append((k, v))
        return out, i

    def value_map(b: bytes, i: int, d: int) -> tuple[list[Any], int]:
        n, i = _count(b, i)
        out = []
        for _ in range(n):
            k, i = read(b, i, d)
            v, i = read(b, i, d)
            out.append((k, v))
        return out, i

    def option(b: bytes, i: int, d: int) -> tuple[Any, int]:
        flag = b[i]
        if flag == 0:
            return None, i + 1
        if flag != 1:
            raise ValueError("opt flag must be 0 or 1")
        return read(b, i + 1, d)

    read_bool = compile_reader(Types.Bool)

    def class_(
        b: bytes, i: int, d: int
    ) -> tuple[list[Any], int]:  # record {value; name; immutable}
        n, i = _count(b, i)
        out = []
        for _ in range(n):
            v, i = read(b, i, d)
            name, i = _text_r(b, i)
            imm, i = read_bool(b, i)
            out.append(Property(name, v, imm))
        return out, i

    special = {
        "Array": items,
        "Set": items,
        "Map": map_,
        "ValueMap": value_map,
        "Option": option,
        "Class": class_,
    }
    for h in _ICRC16_T._sorted_hashes:
        tag, t = _ICRC16_T._field_map[h]
        cases.append((tag, special.get(tag) or leaf(t)))
    if [c[0] for c in cases] != list(TAGS):  # pragma: no cover - guards the tag order
        raise ImportError("ICRC-16 variant order changed")
    if _order(_ICRC16_T._field_map[_tag_hash("Class")][1]._type) != ["value", "name", "immutable"]:
        raise ImportError("ICRC16Property field order changed")  # pragma: no cover
    return read


def _tag_hash(tag: str) -> int:
    return next(h for h in _ICRC16_T._sorted_hashes if _ICRC16_T._field_map[h][0] == tag)


_read_value = _compile_value()


class _HeaderCache:
    """The last ``opt ICRC16Map`` read in a batch: a replay batch's events repeat their headers,
    so bytes equal to the last ones are not read again (a deterministic reader consumes equal
    bytes to the same value) and the list is shared, as ``procure``'s is (nobody mutates it)."""

    __slots__ = ("raw", "value")

    def __init__(self) -> None:
        self.raw = b""
        self.value: ICRC16Map | None = None

    def read(self, b: bytes, i: int) -> tuple[ICRC16Map | None, int]:
        flag = b[i]
        if flag == 0:
            return None, i + 1
        if flag != 1:
            raise ValueError("opt flag must be 0 or 1")
        start = i + 1
        raw = self.raw
        if raw and b.startswith(raw, start):
            return self.value, start + len(raw)
        n, i = _count(b, start)
        out = []
        for _ in range(n):
            k, i = _text_r(b, i)
            v, i = _read_value(b, i, 0)
            out.append((k, v))
        self.raw, self.value = b[start:i], out
        return out, i


def _opt_nat_r(b: bytes, i: int) -> tuple[int | None, int]:
    flag = b[i]
    if flag == 0:
        return None, i + 1
    if flag != 1:
        raise ValueError("opt flag must be 0 or 1")
    return _uleb_r(b, i + 1)


class _Interned:
    """The last namespace / principal read in a batch (a replay batch repeats them): bytes equal
    to the last ones' encoding are skipped, and the same ``str`` / ``Principal`` returned."""

    __slots__ = ("ns", "ns_enc", "p", "p_enc")

    def __init__(self) -> None:
        self.ns_enc = b""
        self.ns = ""
        self.p_enc = b""
        self.p: Any = None

    def namespace(self, b: bytes, i: int) -> tuple[str, int]:
        enc = self.ns_enc
        if enc and b.startswith(enc, i):
            return self.ns, i + len(enc)
        n, j = _uleb_r(b, i)
        raw, j = _take(b, j, n)
        self.ns, self.ns_enc = raw.decode("utf-8"), b[i:j]
        return self.ns, j

    def principal(self, b: bytes, i: int) -> tuple[Any, int]:
        enc = self.p_enc
        if enc and b.startswith(enc, i):
            return self.p, i + len(enc)
        if b[i] != 1:
            raise ValueError("principal must be a reference (0x01)")
        n, j = _uleb_r(b, i + 1)
        if n > 29:
            raise ValueError(f"principal of {n} bytes (at most 29)")
        raw, j = _take(b, j, n)
        self.p, self.p_enc = Principal(raw), b[i:j]
        return self.p, j


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
    i = len(NOTIFICATIONS_HEADER)
    n, i = _count(b, i)
    out = []
    c = _Interned()
    hc = _HeaderCache()
    rv, uleb_r, text_r, blob, size = _read_value, _uleb_r, _text_r, _BLOB, len(b)
    note = EventNotification
    for _ in range(n):
        eid, i = uleb_r(b, i)
        src, i = c.principal(b, i)
        if b[i] == blob and b[i + 1] < 0x80:  # the common case inlined: a short #Blob
            j = i + 2 + b[i + 1]
            if j > size:
                raise ValueError("read past the end")
            data, i = {"Blob": b[i + 2 : j]}, j
        else:
            data, i = rv(b, i, 0)
        hs, i = hc.read(b, i)
        flag = b[i]
        if flag == 0:
            prev, i = None, i + 1
        elif flag == 1:
            prev, i = uleb_r(b, i + 1)
        else:
            raise ValueError("opt flag must be 0 or 1")
        flag = b[i]
        if flag == 0:
            flt, i = None, i + 1
        elif flag == 1:
            flt, i = text_r(b, i + 1)
        else:
            raise ValueError("opt flag must be 0 or 1")
        ts, i = uleb_r(b, i)
        nid, i = uleb_r(b, i)
        ns, i = c.namespace(b, i)
        out.append(note(nid, eid, prev, ts, ns, data, hs, src, flt))
    if i != size:
        raise ValueError(f"{size - i} bytes after the value")
    return out


def decode_notifications(data: bytes) -> list[EventNotification] | None:
    """``vec EventNotification`` → the notifications, or None when the header is not our
    encoder's (then decode generically)."""
    if not data.startswith(NOTIFICATIONS_HEADER):
        return None
    return _decoding("notification batch", _notes, bytes(data))


def _events(b: bytes) -> list[Event]:
    i = len(_events_header())
    n, i = _count(b, i)
    out = []
    c = _Interned()
    hc = _HeaderCache()
    rv, uleb_r = _read_value, _uleb_r
    for _ in range(n):
        eid, i = uleb_r(b, i)
        src, i = c.principal(b, i)
        j = i
        if b[i] == _BLOB:  # the replay's common case: check the length, keep the bytes
            m, j = uleb_r(b, i + 1)
            j += m
            if j > len(b):
                raise ValueError("read past the end")
        else:
            _, j = rv(b, i, 0)  # every byte checked, as the generic reader does
        data = RawValue(b[i:j])
        hs, i = hc.read(b, j)
        prev, i = _opt_nat_r(b, i)
        ts, i = uleb_r(b, i)
        ns, i = c.namespace(b, i)
        out.append(Event(eid, prev, ts, ns, data, src, hs))
    if i != len(b):
        raise ValueError(f"{len(b) - i} bytes after the value")
    return out


_BLOB = TAGS.index("Blob")


def decode_events(data: bytes) -> list[Event] | None:
    """``vec Event`` (``icrc72_publish``, data kept as ``RawValue``) → the events, or None when
    the header is not our encoder's."""
    if not data.startswith(_events_header()):
        return None
    return _decoding("event batch", _events, bytes(data))


# --- icrc72_publish's results and icrc72_confirm_notifications' ids -----------------------------
PUBLISH_RESULTS_HEADER = header(Types.Vec(T.PublishResult))
"""``DIDL`` + type table + arg type of ``vec PublishResult``, as icp-py-core writes it."""
NATS_HEADER = header(Types.Vec(Types.Nat))
_RESULT = T.PublishResult._type
if _order(_RESULT) != ["Ok", "Err"]:  # pragma: no cover - guards the hand order
    raise ImportError(f"PublishResult variant order changed: {_order(_RESULT)}")
_PUBLISH_ERRORS = _order(T.PublishError)
_NULL_ERRORS = {"Unauthorized", "Busy"}
_TEXT_ERRORS = {"ImproperId", "GenericBatchError"}
if set(_PUBLISH_ERRORS) != _NULL_ERRORS | _TEXT_ERRORS | {"GenericError"}:  # pragma: no cover
    raise ImportError(f"PublishError cases changed: {_PUBLISH_ERRORS}")
_ERR_INDEX = {tag: k for k, tag in enumerate(_PUBLISH_ERRORS)}


def encode_publish_results(results: Sequence[Any]) -> bytes | None:
    """``vec PublishResult`` (``icrc72_publish``'s reply) from ``[Ok(ids) | Err | None]``; None
    when a result is one this writer leaves to the generic encoder (a ``GenericError``, or
    anything malformed — the generic encoder reports it)."""
    if type(results) is PublishResults:
        return _encode_results_run(results)
    if not isinstance(results, list | tuple):
        return None
    out = bytearray(PUBLISH_RESULTS_HEADER)
    uleb(len(results), out)
    for r in results:
        if r is None:
            out.append(0)
        elif type(r) is Ok:
            ids = r.value
            if type(ids) is not list:
                return None
            out += b"\x01\x00"
            uleb(len(ids), out)
            for x in ids:
                if type(x) is not int or x < 0:
                    return None
                uleb(x, out)
        elif type(r) is Err:
            tag, payload = r.tag, r.payload
            if tag in _NULL_ERRORS and payload is None:
                out += b"\x01\x01"
                out.append(_ERR_INDEX[tag])
            elif tag in _TEXT_ERRORS and type(payload) is str:
                out += b"\x01\x01"
                out.append(_ERR_INDEX[tag])
                try:
                    text(payload, out)
                except ICRC16Error:
                    return None
            else:
                return None
        else:
            return None
    return bytes(out)


class _Generic(Exception):
    """A value the fast reader leaves to the generic decoder."""


def _publish_results(b: bytes) -> list[Any]:
    i = len(PUBLISH_RESULTS_HEADER)
    n, i = _count(b, i)
    out: list[Any] = []
    uleb_r = _uleb_r
    for _ in range(n):
        flag = b[i]
        if flag == 0:
            out.append(None)
            i += 1
            continue
        if flag != 1:
            raise ValueError("opt flag must be 0 or 1")
        k = b[i + 1]
        i += 2
        if k == 0:
            m, i = _count(b, i)
            ids = []
            for _ in range(m):
                x, i = uleb_r(b, i)
                ids.append(x)
            out.append(Ok(ids))
        elif k == 1:
            e = b[i]
            i += 1
            if e >= len(_PUBLISH_ERRORS):
                raise ValueError("variant index out of range")
            tag = _PUBLISH_ERRORS[e]
            if tag in _NULL_ERRORS:
                out.append(Err(tag))
            elif tag in _TEXT_ERRORS:
                s, i = _text_r(b, i)
                out.append(Err(tag, s))
            else:
                raise _Generic
        else:
            raise ValueError("variant index out of range")
    if i != len(b):
        raise ValueError(f"{len(b) - i} bytes after the value")
    return out


def decode_publish_results(data: bytes) -> Sequence[Any] | None:
    """``vec PublishResult`` → ``[Ok(ids) | Err | None]``, or None: decode generically (another
    encoder's header, or a ``GenericError`` result)."""
    if not data.startswith(PUBLISH_RESULTS_HEADER):
        return None
    try:
        run = _read_results_run(bytes(data))
    except Exception:  # any failure: the full reader below reports it
        run = None
    if run is not None:
        return run
    try:
        return _decoding("publish results", _publish_results, bytes(data))
    except ICRC16DecodeError as e:
        if isinstance(e.__cause__, _Generic):
            return None
        raise


def encode_nats(ids: Sequence[Any]) -> bytes:
    """``vec nat`` (``icrc72_confirm_notifications``' argument); a non-nat → ``ICRC16Error``."""
    if not isinstance(ids, list | tuple):
        raise ICRC16Error("a vec nat is a list of nats")
    out = bytearray(NATS_HEADER)
    uleb(len(ids), out)
    for x in ids:
        if type(x) is int and 0 <= x < 0x200000:  # LEB128 inline: the usual ids
            if x < 0x80:
                out.append(x)
            elif x < 0x4000:
                out.append(x & 0x7F | 0x80)
                out.append(x >> 7)
            else:
                out.append(x & 0x7F | 0x80)
                out.append(x >> 7 & 0x7F | 0x80)
                out.append(x >> 14)
        else:
            nat(x, out, "id")
    return bytes(out)


# --- lazy batches: the replay data plane without a dataclass per event (issue 11, third pass) --
# Why: a Broadcaster that turns a replay's ``icrc72_publish`` batch into notifications needs no
# event as an object: a notification is the event's bytes with the Broadcaster's headers, the
# filter and the notification id put in between (``eventId source data`` · headers ·
# ``prevEventId`` · filter · ``timestamp`` · notificationId · ``namespace``). A batch whose
# events share source, headers and namespace (every batch ``procure`` makes) is scanned once —
# every byte checked as the full reader checks it (compiled patterns for the fixed parts and the
# LEB128 numbers; a ``#Blob`` by its length, any other value by the full value reader) — and
# kept as its bytes and the events' offsets; an ``Event`` is built only when asked for
# (``EventBatch[k]``, iteration: the full reader then runs once). Any other batch, and any batch
# the scan does not accept (damaged bytes included: the full reader then raises the typed
# error), is read as before into a list.
_ULEB = rb"[\x80-\xff]*[\x00-\x7f]"
_BLOB_TAG = bytes([TAGS.index("Blob")])


def _uleb_value(raw: bytes) -> int:
    """The value of one LEB128 number, ``raw`` being exactly its bytes (checked by a pattern)."""
    n = len(raw)
    if n == 1:
        return raw[0]
    if n == 2:
        return raw[0] & 0x7F | raw[1] << 7
    if n == 3:
        return raw[0] & 0x7F | (raw[1] & 0x7F) << 7 | raw[2] << 14
    v = 0
    for c in reversed(raw):
        v = (v << 7) | (c & 0x7F)
    return v


_Item = TypeVar("_Item")


class _LazyBatch(Sequence[_Item]):
    """A message's items read on first use: the scan that made the batch checked every byte,
    so the full reader (``_decode``) runs only when a caller takes the items themselves."""

    __slots__ = ("_items", "headers", "namespace", "raw")
    raw: bytes
    namespace: str
    _items: list[_Item] | None

    def _decode(self) -> list[_Item]:
        raise NotImplementedError

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

    __slots__ = ("headers_enc", "source", "spans")

    def __init__(
        self,
        raw: bytes,
        spans: list[int],
        source: Any,
        headers: ICRC16Map | None,
        headers_enc: bytes,
        namespace: str,
    ) -> None:
        self.raw = raw
        self.spans = spans
        """Per event: start, end of ``data``, start of ``timestamp``, end (4 ints an event)."""
        self.source = source
        self.headers = headers
        self.headers_enc = headers_enc
        """The events' ``opt ICRC16Map`` as encoded (flag included)."""
        self.namespace = namespace
        self._items = None

    def _decode(self) -> list[Event]:
        return _decoding("event batch", _events, self.raw)

    def __len__(self) -> int:
        return len(self.spans) >> 2

    def __repr__(self) -> str:
        return f"EventBatch({len(self)} events of {self.namespace!r})"

    def notifications(
        self, headers: ICRC16Map | None, filter: str | None, first_id: int, step: int, count: int
    ) -> bytes:
        """The ``vec EventNotification`` message of the first ``count`` events, with
        ``headers`` and ``filter``, notification ids ``first_id``, ``first_id + step``, … —
        each event's id, source, data, previous id and timestamp copied as they are."""
        hb = bytearray()
        _headers(headers, hb, {})
        fb = bytearray()
        if filter is None:
            fb.append(0)
        else:
            fb.append(1)
            text(filter, fb, "filter")
        ns = bytearray()
        text(self.namespace, ns, "namespace")
        hdr, flt, nsb = bytes(hb), bytes(fb), bytes(ns)
        skip_h = len(self.headers_enc)
        skip_ns = len(nsb)
        b, sp = self.raw, self.spans
        out = bytearray(NOTIFICATIONS_HEADER)
        uleb(count, out)
        nid = first_id
        for k in range(0, count << 2, 4):
            s, d, t, e = sp[k], sp[k + 1], sp[k + 2], sp[k + 3]
            out += b[s:d]
            out += hdr
            out += b[d + skip_h : t]
            out += flt
            out += b[t : e - skip_ns]
            if nid < 0x4000:  # LEB128 inline: one to three bytes for the usual ids
                if nid < 0x80:
                    out.append(nid)
                else:
                    out.append(nid & 0x7F | 0x80)
                    out.append(nid >> 7)
            elif nid < 0x200000:
                out.append(nid & 0x7F | 0x80)
                out.append(nid >> 7 & 0x7F | 0x80)
                out.append(nid >> 14)
            else:
                out += encode_uleb(nid)
            out += nsb
            nid += step
        return bytes(out)


def _scan_events(b: bytes) -> EventBatch | None:
    """The batch's offsets if its events share source, headers and namespace and every byte
    reads; None otherwise (the full reader decides)."""
    i = len(_events_header())
    n, i = _count(b, i)
    size = len(b)
    if n == 0:
        return None
    # the first event, field by field: what the others must repeat
    s0 = i
    _, i = _uleb_r(b, i)
    src_at = i
    source, i = _Interned().principal(b, i)
    src_enc = b[src_at:i]
    _, i = _read_value(b, i, 0)
    h_at = i
    headers, i = _HeaderCache().read(b, i)
    headers_enc = b[h_at:i]
    _, i = _opt_nat_r(b, i)
    _, i = _uleb_r(b, i)
    ns_at = i
    namespace, i = _Interned().namespace(b, i)
    ns_enc = b[ns_at:i]
    head = re.compile(_ULEB + re.escape(src_enc) + re.escape(_BLOB_TAG) + b"(" + _ULEB + b")")
    head_any = re.compile(_ULEB + re.escape(src_enc))
    tail = re.compile(
        re.escape(headers_enc) + rb"(\x00|\x01" + _ULEB + b")" + _ULEB + re.escape(ns_enc)
    )
    hm, hm_any, tm = head.match, head_any.match, tail.match
    spans: list[int] = []
    add = spans.extend
    i = s0
    for _ in range(n):
        m = hm(b, i)
        if m is not None:
            d = m.end() + _uleb_value(m.group(1))
            if d > size:
                return None
        else:
            m = hm_any(b, i)
            if m is None:
                return None
            _, d = _read_value(b, m.end(), 0)
        t = tm(b, d)
        if t is None:
            return None
        e = t.end()
        add((i, d, t.end(1), e))
        i = e
    if i != size:
        return None
    return EventBatch(b, spans, source, headers, headers_enc, namespace)


def decode_event_batch(data: bytes) -> EventBatch | list[Event] | None:
    """``vec Event`` (``icrc72_publish``) → an :class:`EventBatch` (events sharing source,
    headers and namespace: read lazily), else the list :func:`decode_events` reads; None when
    the header is not our encoder's."""
    if not data.startswith(_events_header()):
        return None
    b = bytes(data)
    try:
        batch = _scan_events(b)
    except Exception:  # any failure: the full reader below reports it
        batch = None
    if batch is not None:
        return batch
    return _decoding("event batch", _events, b)


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
    out = bytearray(PUBLISH_RESULTS_HEADER)
    uleb(r.length, out)
    per, nid = r.per_event, r.first_id
    if per == 1:
        for x in range(nid, nid + r.delivered):
            out += b"\x01\x00\x01"
            if x < 0x80:
                out.append(x)
            elif x < 0x200000:  # LEB128 inline
                out.append(x & 0x7F | 0x80)
                if x < 0x4000:
                    out.append(x >> 7)
                else:
                    out.append(x >> 7 & 0x7F | 0x80)
                    out.append(x >> 14)
            else:
                out += encode_uleb(x)
    else:
        for _ in range(r.delivered):
            out += b"\x01\x00"
            uleb(per, out)
            for x in range(nid, nid + per):
                uleb(x, out)
            nid += per
    out += bytes([1, 1, _ERR_INDEX["Busy"]]) * (r.length - r.delivered)
    return bytes(out)


class _ReadResults(PublishResults):
    """Publish results as read: every ``Ok`` holds one id (kept as its bytes until asked
    for), then ``Busy``."""

    __slots__ = ("ids",)

    def __init__(self, ids: list[bytes], busy: int) -> None:
        super().__init__(len(ids) + busy, len(ids), 0, 1)
        self.ids = ids

    def _item(self, k: int) -> Ok | Err:
        if k < self.delivered:
            return Ok([_uleb_r(self.ids[k], 3)[0]])
        return Err("Busy")


_OK_ONE = re.compile(rb"\x01\x00\x01" + _ULEB)
_BUSY = bytes([1, 1, _ERR_INDEX["Busy"]])
_OKS_THEN_BUSY = re.compile(
    b"((?:" + _OK_ONE.pattern + b")*)(?:" + re.escape(_BUSY) + b")*", re.DOTALL
)


def _read_results_run(b: bytes) -> _ReadResults | None:
    """``Ok([id])``… then ``Busy``… (a Broadcaster's answer to a replay batch), else None."""
    n, i = _count(b, len(PUBLISH_RESULTS_HEADER))
    m = _OKS_THEN_BUSY.fullmatch(b, i)
    if m is None:
        return None
    ids = _OK_ONE.findall(b, i, m.end(1))  # the Ok entries tile [i, end(1))
    busy, extra = divmod(len(b) - m.end(1), len(_BUSY))
    if extra or len(ids) + busy != n:
        return None
    return _ReadResults(ids, busy)


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
        self.raw = raw
        self.event_ids = event_ids
        self.notification_ids = notification_ids
        self.headers = headers
        self.namespace = namespace
        self._items = None

    def _decode(self) -> list[EventNotification]:
        return _decoding("notification batch", _notes, self.raw)

    def __len__(self) -> int:
        return len(self.event_ids)

    def __repr__(self) -> str:
        return f"NotificationBatch({len(self)} notifications of {self.namespace!r})"


def _scan_notes(b: bytes) -> NotificationBatch | None:
    """The batch's ids if its notifications share source, headers, filter and namespace and
    every byte reads; None otherwise (the full reader decides)."""
    i = len(NOTIFICATIONS_HEADER)
    n, i = _count(b, i)
    size = len(b)
    if n == 0:
        return None
    s0 = i
    _, i = _uleb_r(b, i)
    src_at = i
    _, i = _Interned().principal(b, i)
    src_enc = b[src_at:i]
    _, i = _read_value(b, i, 0)
    h_at = i
    headers, i = _HeaderCache().read(b, i)
    headers_enc = b[h_at:i]
    _, i = _opt_nat_r(b, i)
    f_at = i
    if b[i] == 1:
        _, i = _text_r(b, i + 1)
    elif b[i] == 0:
        i += 1
    else:
        return None
    filter_enc = b[f_at:i]
    _, i = _uleb_r(b, i)
    _, i = _uleb_r(b, i)
    ns_at = i
    namespace, i = _Interned().namespace(b, i)
    ns_enc = b[ns_at:i]
    uleb_g = b"(" + _ULEB + b")"
    head = re.compile(uleb_g + re.escape(src_enc) + re.escape(_BLOB_TAG) + uleb_g)
    head_any = re.compile(uleb_g + re.escape(src_enc))
    tail = re.compile(
        re.escape(headers_enc)
        + rb"(?:\x00|\x01"
        + _ULEB
        + b")"
        + re.escape(filter_enc)
        + _ULEB
        + uleb_g
        + re.escape(ns_enc)
    )
    hm, hm_any, tm, val = head.match, head_any.match, tail.match, _uleb_value
    eids: list[int] = []
    nids: list[int] = []
    i = s0
    for _ in range(n):
        m = hm(b, i)
        if m is not None:
            d = m.end() + val(m.group(2))
            if d > size:
                return None
        else:
            m = hm_any(b, i)
            if m is None:
                return None
            _, d = _read_value(b, m.end(), 0)
        t = tm(b, d)
        if t is None:
            return None
        eids.append(val(m.group(1)))
        nids.append(val(t.group(1)))
        i = t.end()
    if i != size:
        return None
    return NotificationBatch(b, eids, nids, headers, namespace)


def decode_notification_batch(data: bytes) -> NotificationBatch | list[EventNotification] | None:
    """``vec EventNotification`` → a :class:`NotificationBatch` (notifications sharing source,
    headers, filter and namespace: read lazily), else the list :func:`decode_notifications`
    reads; None when the header is not our encoder's."""
    if not data.startswith(NOTIFICATIONS_HEADER):
        return None
    b = bytes(data)
    try:
        batch = _scan_notes(b)
    except Exception:  # any failure: the full reader below reports it
        batch = None
    if batch is not None:
        return batch
    return _decoding("notification batch", _notes, b)


def _leb(x: int, out: bytearray) -> None:
    if x < 0x80:
        out.append(x)
    else:
        out += encode_uleb(x)


def event_batch(
    ids: Sequence[int],
    timestamps: Sequence[int],
    values: Sequence[bytes],
    namespace: str,
    source: Any,
    headers: ICRC16Map | None,
) -> EventBatch:
    """Events ``ids[k]`` (previous id ``ids[k] - 1``, none for 0) with ``timestamps[k]`` and
    the ICRC-16 value bytes ``values[k]`` (spliced as a ``RawValue`` is), sharing namespace,
    source and headers, written as the ``icrc72_publish`` message and kept as an
    :class:`EventBatch` — what a Publisher sends for a replay batch, without an ``Event``
    each (same bytes as :func:`encode_events` on those events)."""
    c = _Cache()
    src, nsb = c.source(source), c.namespace(namespace)
    hb = bytearray()
    _headers(headers, hb, {})
    hdr = bytes(hb)
    out = bytearray(_events_header())
    uleb(len(ids), out)
    spans: list[int] = []
    add = spans.extend
    last_ts: Any = None
    tsb = b""
    for i, ts, vb in zip(ids, timestamps, values, strict=True):
        if type(i) is not int or i < 0:
            raise ICRC16Error(f"eventId must be a nat, not {i!r:.80}")
        s = len(out)
        _leb(i, out)
        out += src
        out += vb
        d = len(out)
        out += hdr
        if i:
            out.append(1)
            _leb(i - 1, out)
        else:
            out.append(0)
        t = len(out)
        if ts != last_ts or type(ts) is not int:
            tb = bytearray()
            nat(ts, tb, "timestamp")
            last_ts, tsb = ts, bytes(tb)
        out += tsb
        out += nsb
        add((s, d, t, len(out)))
    return EventBatch(bytes(out), spans, source, headers, hdr, namespace)
