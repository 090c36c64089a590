"""ICRC-16 generic values, Candid-typed through icp-py-core's ``icp_candid``.

Why: every ICRC-72 event's ``data`` and ``headers``, and every ICRC-77 ``config``/``stats``, is an
ICRC-16 value. The variant list follows the ICRC-72 candidate
(icdevs/ICEventsWG ``draft_proposals_current/candidate-ICRC72-20240924.md``, "Event Data"), which
is the ICRC-16 list the Motoko implementations use (no ``Ints``, see FIELD-NOTES "ICRC-72/77").
``ICRC16Property`` is ``{name; value; immutable}`` as ICRC-16 writes it (the ICRC-77 text drops
``value``; FIELD-NOTES "Candid": follow ICRC-16).

Python form of a value: a one-key ``dict`` ``{Tag: payload}``, the shape both ``icp_candid`` and
``@dfinity/candid`` use for variants, with these payloads:

- ``Nat``/``Int``/fixed-width ints: ``int`` (``bool`` rejected); ``Float``: ``float``;
  ``Floats``: ``list[float]``; ``Nats``: ``list[int]``; ``Bool``: ``bool``; ``Text``: ``str``;
  ``Blob``/``Bytes``: ``bytes``; ``Principal``: ``icp_principal.Principal``;
- ``Array``/``Set``: ``list[value]``; ``Map``: ``list[(str, value)]``;
  ``ValueMap``: ``list[(value, value)]``; ``Class``: ``list[Property]``;
- ``Option``: ``value`` or ``None``.

icp-py-core's encoder accepts values @dfinity/candid rejects (``True`` as a nat, ``None`` as an
opt, a two-key variant: FIELD-NOTES), so :func:`validate` checks every value before encoding and
:func:`decode` normalises icp_candid's output (``opt`` as ``[]``/``[v]``, tuples as lists) back to
this form. Decoding failures of any kind become :class:`ICRC16DecodeError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from icp_candid import Types
from icp_candid.candid import RecClass
from icp_principal import Principal

from loglake.errors import DecodeError, LocalProtocolError
from loglake.wire import candid
from loglake.wire.candid import MAX_PRINCIPAL_BYTES, CandidError

Value = dict[str, Any]


class ICRC16Error(LocalProtocolError, ValueError):
    """A Python value is not a valid ICRC-16 value (the caller's fault)."""


class ICRC16DecodeError(DecodeError):
    """Bytes are not a Candid-encoded value of the expected type (the peer's fault)."""


class ICRC16TooLarge(ICRC16DecodeError):
    """A value with more elements than :func:`decode_bounded` was given (it was not built)."""


@dataclass(frozen=True, slots=True)
class Property:
    """``ICRC16Property = record { name : text; value : ICRC16; immutable : bool }`` (ICRC-16)."""

    name: str
    value: Value
    immutable: bool = False


# --- the Candid types ------------------------------------------------------------------------
ICRC16 = Types.Rec()
ICRC16MapItem = Types.Tuple(Types.Text, ICRC16)
ICRC16Map = Types.Vec(ICRC16MapItem)
ICRC16ValueMapItem = Types.Tuple(ICRC16, ICRC16)
ICRC16Property = Types.Record({"name": Types.Text, "value": ICRC16, "immutable": Types.Bool})
ICRC16.fill(
    Types.Variant(
        {
            "Array": Types.Vec(ICRC16),
            "Blob": Types.Vec(Types.Nat8),
            "Bool": Types.Bool,
            "Bytes": Types.Vec(Types.Nat8),
            "Class": Types.Vec(ICRC16Property),
            "Float": Types.Float64,
            "Floats": Types.Vec(Types.Float64),
            "Int": Types.Int,
            "Int16": Types.Int16,
            "Int32": Types.Int32,
            "Int64": Types.Int64,
            "Int8": Types.Int8,
            "Map": ICRC16Map,
            "ValueMap": Types.Vec(ICRC16ValueMapItem),
            "Nat": Types.Nat,
            "Nat16": Types.Nat16,
            "Nat32": Types.Nat32,
            "Nat64": Types.Nat64,
            "Nat8": Types.Nat8,
            "Nats": Types.Vec(Types.Nat),
            "Option": Types.Opt(ICRC16),
            "Principal": Types.Principal,
            "Set": Types.Vec(ICRC16),
            "Text": Types.Text,
        }
    )
)

TAGS = tuple(ICRC16.get_type()._field_map[h][0] for h in ICRC16.get_type()._sorted_hashes)
MAX_DEPTH = 64
"""Nesting limit on values we accept, so a hostile value cannot exhaust the Python stack."""
_PROPERTY_ORDER = [ICRC16Property._field_map[h][0] for h in ICRC16Property._sorted_hashes]
if _PROPERTY_ORDER != ["value", "name", "immutable"]:  # pragma: no cover - guards the form
    raise ImportError(f"ICRC16Property field order changed: {_PROPERTY_ORDER}")
_PROPERTY = candid.RecordForm(
    Property, lambda v, n, m: Property(n, v, m), lambda p: (p.value, p.name, p.immutable)
)


def loglake_form(find: Any) -> None:
    """Give the ICRC-16 types among a :func:`candid.shaped` graph loglake's Python form (the
    module docstring): ``Option`` as the value or None, map items as tuples, ``Class`` as
    :class:`Property`, a :class:`RawValue` written as its bytes anywhere a value goes, and
    :data:`MAX_DEPTH` levels at most, counted the same way when reading and writing."""
    root = find(ICRC16)
    find(ICRC16MapItem).form = candid.TUPLE
    find(ICRC16ValueMapItem).form = candid.TUPLE
    find(ICRC16Property).form = _PROPERTY
    variant = ICRC16.get_type()
    find(variant._field_map[_tag_hash("Option")][1]).optional = True
    candid.make_family(root, MAX_DEPTH)
    root.splice = True


def _tag_hash(tag: str) -> int:
    t = ICRC16.get_type()
    return next(h for h in t._sorted_hashes if t._field_map[h][0] == tag)


VALUE = candid.shaped(ICRC16, loglake_form)
"""ICRC16 with values in loglake's form: what :func:`encode` writes and :func:`decode` reads,
through the one Candid codec (same type table as :data:`ICRC16`)."""
MAP = candid.shaped(ICRC16Map, loglake_form)
"""ICRC16Map in loglake's form (a list of ``(str, value)``)."""


def _counted_form(find: Any) -> None:
    loglake_form(find)
    find(ICRC16).counted = False  # the variant itself; its vecs below are marked by the walk
    seen: set[int] = set()
    stack = [find(ICRC16)]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op == candid.VEC and not n.blob:
            n.counted = True
        stack += [k for k in (n.inner, n.alias, *(t for _, _, t in n.fields)) if k is not None]


VALUE_COUNTED = candid.shaped(ICRC16, _counted_form)
""":data:`VALUE` whose vecs (arrays, sets, maps, classes) are charged to
``candid.element_budget`` (:func:`decode_bounded`); same form and type table."""
MAP_COUNTED = candid.shaped(ICRC16Map, _counted_form)
_INT_RANGES = {
    "Int8": (-(2**7), 2**7 - 1),
    "Int16": (-(2**15), 2**15 - 1),
    "Int32": (-(2**31), 2**31 - 1),
    "Int64": (-(2**63), 2**63 - 1),
    "Nat8": (0, 2**8 - 1),
    "Nat16": (0, 2**16 - 1),
    "Nat32": (0, 2**32 - 1),
    "Nat64": (0, 2**64 - 1),
}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate(v: Any, _depth: int = 0) -> Value:
    """Check ``v`` is an ICRC-16 value in the Python form above; return it or raise."""
    if _depth > MAX_DEPTH:
        raise ICRC16Error(f"ICRC-16 value nested deeper than {MAX_DEPTH}")
    if not isinstance(v, dict) or len(v) != 1:
        raise ICRC16Error(f"an ICRC-16 value is a one-key dict {{Tag: payload}}, not {v!r:.80}")
    ((tag, x),) = v.items()
    d = _depth + 1
    if tag in ("Nat", "Int"):
        if not _is_int(x) or (tag == "Nat" and x < 0):
            raise ICRC16Error(f"#{tag} needs an {'unsigned ' if tag == 'Nat' else ''}int: {x!r}")
    elif tag in _INT_RANGES:
        lo, hi = _INT_RANGES[tag]
        if not _is_int(x) or not lo <= x <= hi:
            raise ICRC16Error(f"#{tag} needs an int in [{lo}, {hi}]: {x!r}")
    elif tag == "Float":
        if not isinstance(x, float):
            raise ICRC16Error(f"#Float needs a float: {x!r}")
    elif tag == "Floats":
        if not isinstance(x, list) or not all(isinstance(f, float) for f in x):
            raise ICRC16Error("#Floats needs a list of floats")
    elif tag == "Nats":
        if not isinstance(x, list) or not all(_is_int(n) and n >= 0 for n in x):
            raise ICRC16Error("#Nats needs a list of unsigned ints")
    elif tag == "Bool":
        if not isinstance(x, bool):
            raise ICRC16Error(f"#Bool needs a bool: {x!r}")
    elif tag == "Text":
        if not isinstance(x, str):
            raise ICRC16Error(f"#Text needs a str: {x!r}")
    elif tag in ("Blob", "Bytes"):
        if not isinstance(x, bytes | bytearray):
            raise ICRC16Error(f"#{tag} needs bytes: {x!r:.80}")
    elif tag == "Principal":
        if not isinstance(x, Principal) or len(x.bytes) > MAX_PRINCIPAL_BYTES:
            raise ICRC16Error(f"#Principal needs an icp_principal.Principal: {x!r}")
    elif tag in ("Array", "Set"):
        if not isinstance(x, list):
            raise ICRC16Error(f"#{tag} needs a list")
        for item in x:
            validate(item, d)
    elif tag == "Map":
        if not isinstance(x, list):
            raise ICRC16Error("#Map needs a list of (text, value)")
        for item in x:
            if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
                raise ICRC16Error(f"#Map item must be (str, value): {item!r:.80}")
            validate(item[1], d)
    elif tag == "ValueMap":
        if not isinstance(x, list):
            raise ICRC16Error("#ValueMap needs a list of (value, value)")
        for item in x:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise ICRC16Error(f"#ValueMap item must be (value, value): {item!r:.80}")
            validate(item[0], d)
            validate(item[1], d)
    elif tag == "Class":
        if not isinstance(x, list) or not all(isinstance(p, Property) for p in x):
            raise ICRC16Error("#Class needs a list of Property")
        for p in x:
            if not isinstance(p.name, str) or not isinstance(p.immutable, bool):
                raise ICRC16Error(f"bad #Class property {p!r:.80}")
            validate(p.value, d)
    elif tag == "Option":
        if x is not None:
            validate(x, d)
    else:
        raise ICRC16Error(f"unknown ICRC-16 tag {tag!r}")
    return v


# --- Python form <-> icp_candid form ---------------------------------------------------------
def to_candid(v: Value) -> Any:
    """Our form → the form ``icp_candid.encode`` takes (after :func:`validate`)."""
    ((tag, x),) = v.items()
    if tag in ("Array", "Set"):
        return {tag: [to_candid(i) for i in x]}
    if tag == "Map":
        return {tag: [[k, to_candid(i)] for k, i in x]}
    if tag == "ValueMap":
        return {tag: [[to_candid(k), to_candid(i)] for k, i in x]}
    if tag == "Class":
        return {
            tag: [
                {"name": p.name, "value": to_candid(p.value), "immutable": p.immutable} for p in x
            ]
        }
    if tag == "Option":
        return {tag: [] if x is None else [to_candid(x)]}
    if tag in ("Blob", "Bytes"):
        return {tag: bytes(x)}
    return {tag: x}


def from_candid(v: Any, _depth: int = 0) -> Value:
    """The form ``icp_candid.decode`` returns → ours. Raises ICRC16DecodeError on surprises."""
    if _depth > MAX_DEPTH:
        raise ICRC16DecodeError(f"ICRC-16 value nested deeper than {MAX_DEPTH}")
    if not isinstance(v, dict) or len(v) != 1:
        raise ICRC16DecodeError(f"not an ICRC-16 variant: {v!r:.80}")
    ((tag, x),) = v.items()
    d = _depth + 1
    if tag in ("Array", "Set"):
        return {tag: [from_candid(i, d) for i in x]}
    if tag == "Map":
        return {tag: [(k, from_candid(i, d)) for k, i in x]}
    if tag == "ValueMap":
        return {tag: [(from_candid(k, d), from_candid(i, d)) for k, i in x]}
    if tag == "Class":
        return {tag: [Property(p["name"], from_candid(p["value"], d), p["immutable"]) for p in x]}
    if tag == "Option":
        return {tag: from_candid(x[0], d) if x else None}
    if tag in ("Blob", "Bytes"):
        return {tag: bytes(x)}
    if tag == "Principal" and (not isinstance(x, Principal) or len(x.bytes) > MAX_PRINCIPAL_BYTES):
        # icp_candid reads any length; the fast reader and validate() refuse over 29 bytes
        raise ICRC16DecodeError(f"#Principal of more than {MAX_PRINCIPAL_BYTES} bytes")
    if tag == "Nat8" and isinstance(x, bytes):  # pragma: no cover - defensive
        return {tag: x[0]}
    if tag not in TAGS:
        raise ICRC16DecodeError(f"unknown ICRC-16 tag {tag!r}")
    return {tag: x}


def map_to_candid(m: list[tuple[str, Value]]) -> list[list[Any]]:
    return [[k, to_candid(v)] for k, v in m]


def map_from_candid(m: Any) -> list[tuple[str, Value]]:
    return [(k, from_candid(v)) for k, v in m]


def validate_map(m: Any) -> list[tuple[str, Value]]:
    if not isinstance(m, list):
        raise ICRC16Error("an ICRC16Map is a list of (text, value)")
    validate({"Map": m})
    return m


# --- bytes -----------------------------------------------------------------------------------
def encode(v: Value) -> bytes:
    """One ICRC-16 value as a complete Candid message (``DIDL`` + type table + value);
    :class:`ICRC16Error` for what :func:`validate` refuses (checked as it is written)."""
    return candid.encode([VALUE], [v])


def decode(data: bytes) -> Value:
    """Inverse of :func:`encode`; any malformed input raises :class:`ICRC16DecodeError`."""
    return candid_decode(data, [VALUE])[0]


def decode_bounded(data: bytes, max_elements: int, *, as_map: bool = False) -> Any:
    """:func:`decode` (or :func:`decode_map`) building at most ``max_elements`` elements of
    arrays, sets, maps and classes, all levels together; :class:`ICRC16TooLarge` before the
    vec that would pass it is built. For a caller that shows values (the node's console): a
    few MB of ``{"Array": [{"Nat": 0}, …]}`` is millions of values, hundreds of MB decoded."""
    with candid.element_budget(max_elements):
        try:
            return candid_decode(data, [MAP_COUNTED if as_map else VALUE_COUNTED])[0]
        except ICRC16TooLarge:
            why = f"an ICRC-16 value of more than {max_elements:,} elements"
            raise ICRC16TooLarge(why) from None


def encode_map(m: list[tuple[str, Value]]) -> bytes:
    return candid.encode([MAP], [m])


def decode_map(data: bytes) -> list[tuple[str, Value]]:
    return candid_decode(data, [MAP])[0]


def candid_decode(data: bytes | bytearray | memoryview, types: list[Any]) -> list[Any]:
    """The values of a Candid message as ``types`` (``loglake.wire.candid``: spec-strict, with
    the spec's subtyping, for any encoder's type table); every failure is
    :class:`ICRC16DecodeError`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ICRC16DecodeError("Candid input must be bytes")
    try:
        return candid.decode(data, types)
    except candid.CandidTooLarge as e:
        raise ICRC16TooLarge(str(e)) from None
    except CandidError as e:
        raise ICRC16DecodeError(f"malformed Candid: {e}") from None


# --- helpers for building and reading values -------------------------------------------------
def nat(n: int) -> Value:
    return validate({"Nat": n})


def text(s: str) -> Value:
    return validate({"Text": s})


def blob(b: bytes) -> Value:
    return validate({"Blob": bytes(b)})


def array(items: list[Value]) -> Value:
    return {"Array": list(items)}


def map_get(m: list[tuple[str, Value]] | None, key: str) -> Value | None:
    """The first value under ``key`` in an ICRC16Map (ICRC-72 maps are association lists)."""
    for k, v in m or ():
        if k == key:
            return v
    return None


def equal(a: Value, b: Value) -> bool:
    """Structural equality that treats NaN floats as equal to themselves."""
    ((ta, xa),) = a.items()
    ((tb, xb),) = b.items()
    if ta != tb:
        return False
    if ta == "Float":
        return xa == xb or (math.isnan(xa) and math.isnan(xb))
    return a == b


# --- values kept as bytes ----------------------------------------------------------------------
MESSAGE_PREFIX = candid.header(ICRC16)
"""What :func:`encode` writes before the value bytes (magic, type table, one arg of ICRC16)."""


@dataclass(frozen=True, slots=True)
class RawValue:
    """An ICRC-16 value kept as its Candid value bytes (no type table).

    Why: replay republishes stored events; decoding each value only to encode it again would
    cost more than reading it. A stored value written by :func:`encode` is
    ``MESSAGE_PREFIX + value bytes``; the Candid encoder splices the value bytes into an
    ``Event`` as they are (:data:`ICRC16_RAW_AWARE`).
    """

    value_bytes: bytes

    @classmethod
    def from_message(cls, msg: bytes) -> RawValue | None:
        if msg.startswith(MESSAGE_PREFIX):
            return cls(msg[len(MESSAGE_PREFIX) :])
        return None

    def decode(self) -> Value:
        return decode(MESSAGE_PREFIX + self.value_bytes)


class _RawAwareICRC16(RecClass):  # an icp_candid recursive type resolving to ICRC16
    raw_aware = True
    """``wire.candid`` reads a slot of this type as a RawValue (when the wire type is ICRC16's)
    and writes a RawValue as its bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.fill(ICRC16)

    def encodeValue(self, val: Any) -> bytes:  # icp_candid's encoder (tests compare with it)
        if isinstance(val, RawValue):
            return val.value_bytes
        return super().encodeValue(val)


ICRC16_RAW_AWARE = _RawAwareICRC16()
"""The ICRC16 Candid type, whose encoder also takes :class:`RawValue` (same type table)."""


write_value = candid.own_writer(VALUE)
"""``write_value(v, out)``: append the Candid value bytes of ``v`` (loglake's form, or a
:class:`RawValue`) to the bytearray ``out`` — what :func:`encode` writes after its header."""
write_map = candid.own_writer(MAP)
"""``write_map(m, out)``: the same for an ``ICRC16Map``."""
read_value = candid.own_reader(VALUE)
"""``read_value(b, i, depth) -> (value, next)``: one value at ``b[i:]`` under our own table."""


def value_bytes(v: Value | RawValue) -> bytes:
    """The Candid value bytes of one ICRC-16 value (no header)."""
    out = bytearray()
    write_value(v, out)
    return bytes(out)


if candid.header(VALUE) != MESSAGE_PREFIX:  # pragma: no cover - a shaped graph keeps the table
    raise ImportError("the loglake-form ICRC16 has another type table")
