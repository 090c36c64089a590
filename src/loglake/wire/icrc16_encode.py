"""A fast Candid encoder of ICRC-16 values, straight from loglake's Python form.

Why (hand-written): icp-py-core encodes an ICRC-72 event or notification in about 15–20 µs (it
walks its type objects for every value, and our form must first be converted with
``icrc16.validate`` + ``icrc16.to_candid``); on the replay path that was the bulk of the time.
This module writes the *value bytes* of an ICRC-16 value directly from our form
(``loglake.wire.icrc16``: ``{Tag: payload}``), validating as it goes, into a ``bytearray``.
The type table is not written here: callers put the one encoder's header in front
(``candid.header``), so a whole message is byte for byte what ``candid.encode`` (and
icp-py-core) writes for the same value (tested with hypothesis,
``tests/wire/test_icrc16_encode.py``).

Invalid input raises :class:`~loglake.wire.icrc16.ICRC16Error` (the caller's fault), as
``icrc16.validate`` does, for the same values. A :class:`~loglake.wire.icrc16.RawValue` is
spliced as it is (stored value bytes, already Candid).

Layout: Candid spec, "Binary format" → "Memory" (M) encodings; the variant index is the tag's
rank among the field hashes (``icrc16.TAGS`` is in that order).
"""

from __future__ import annotations

import struct
from typing import Any

from icp_principal import Principal

from loglake.wire.icrc16 import _INT_RANGES, MAX_DEPTH, TAGS, ICRC16Error, Property, RawValue
from loglake.wire.varint import encode_sleb, encode_uleb

_IDX = {t: i for i, t in enumerate(TAGS)}
_ONE = tuple(bytes((i,)) for i in range(256))
_F64 = struct.Struct("<d")
_FIXED = {
    "Int8": struct.Struct("<b"),
    "Int16": struct.Struct("<h"),
    "Int32": struct.Struct("<i"),
    "Int64": struct.Struct("<q"),
    "Nat8": struct.Struct("<B"),
    "Nat16": struct.Struct("<H"),
    "Nat32": struct.Struct("<I"),
    "Nat64": struct.Struct("<Q"),
}
_TAG_BYTE = {t: _ONE[i] for t, i in _IDX.items()}  # every index < 128: one LEB128 octet


def uleb(n: int, out: bytearray) -> None:
    """Append the unsigned LEB128 of ``n >= 0`` (any size) to ``out`` (``wire.varint``)."""
    if n < 0x80:
        out.append(n)  # the common case, without a call
    else:
        out += encode_uleb(n)


def sleb(n: int, out: bytearray) -> None:
    """Append the signed LEB128 of ``n`` to ``out`` (``wire.varint``)."""
    out += encode_sleb(n)


def nat(n: Any, out: bytearray, what: str = "nat") -> None:
    """A Candid ``nat`` (``bool`` and negatives refused, as icrc16.validate does)."""
    if type(n) is not int and (not isinstance(n, int) or isinstance(n, bool)):
        raise ICRC16Error(f"{what} must be a nat, not {n!r:.80}")
    if n < 0:
        raise ICRC16Error(f"{what} must be a nat, not {n!r}")
    uleb(n, out)


def text(s: Any, out: bytearray, what: str = "text") -> None:
    if not isinstance(s, str):
        raise ICRC16Error(f"{what} must be a str, not {s!r:.80}")
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ICRC16Error(f"{what} is not encodable as UTF-8: {e}") from None
    uleb(len(b), out)
    out += b


def principal(p: Any, out: bytearray, what: str = "principal") -> None:
    if not isinstance(p, Principal):
        raise ICRC16Error(f"{what} must be an icp_principal.Principal, not {p!r:.80}")
    b = p.bytes
    if len(b) > 29:
        raise ICRC16Error(f"{what} longer than 29 bytes")
    out.append(1)
    uleb(len(b), out)
    out += b


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def value(v: Any, out: bytearray, depth: int = 0) -> None:
    """Append the Candid value bytes of the ICRC-16 value ``v`` (our form, or a RawValue)."""
    if type(v) is RawValue:
        out += v.value_bytes
        return
    if depth > MAX_DEPTH:
        raise ICRC16Error(f"ICRC-16 value nested deeper than {MAX_DEPTH}")
    if type(v) is not dict or len(v) != 1:
        raise ICRC16Error(f"an ICRC-16 value is a one-key dict {{Tag: payload}}, not {v!r:.80}")
    ((tag, x),) = v.items()
    tb = _TAG_BYTE.get(tag)
    if tb is None:
        raise ICRC16Error(f"unknown ICRC-16 tag {tag!r}")
    out += tb
    if tag == "Blob" or tag == "Bytes":
        if not isinstance(x, bytes | bytearray):
            raise ICRC16Error(f"#{tag} needs bytes: {x!r:.80}")
        uleb(len(x), out)
        out += x
    elif tag == "Text":
        text(x, out, "#Text")
    elif tag == "Nat":
        if not _is_int(x) or x < 0:
            raise ICRC16Error(f"#Nat needs an unsigned int: {x!r}")
        uleb(x, out)
    elif tag == "Int":
        if not _is_int(x):
            raise ICRC16Error(f"#Int needs an int: {x!r}")
        sleb(x, out)
    elif tag in _FIXED:
        lo, hi = _INT_RANGES[tag]
        if not _is_int(x) or not lo <= x <= hi:
            raise ICRC16Error(f"#{tag} needs an int in [{lo}, {hi}]: {x!r}")
        out += _FIXED[tag].pack(x)
    elif tag == "Bool":
        if not isinstance(x, bool):
            raise ICRC16Error(f"#Bool needs a bool: {x!r}")
        out.append(1 if x else 0)
    elif tag == "Float":
        if not isinstance(x, float):
            raise ICRC16Error(f"#Float needs a float: {x!r}")
        out += _F64.pack(x)
    elif tag == "Map":
        if not isinstance(x, list):
            raise ICRC16Error("#Map needs a list of (text, value)")
        map_items(x, out, depth + 1)
    elif tag == "Array" or tag == "Set":
        if not isinstance(x, list):
            raise ICRC16Error(f"#{tag} needs a list")
        uleb(len(x), out)
        for item in x:
            value(item, out, depth + 1)
    elif tag == "Option":
        if x is None:
            out.append(0)
        else:
            out.append(1)
            value(x, out, depth + 1)
    elif tag == "Nats":
        if not isinstance(x, list) or not all(_is_int(n) and n >= 0 for n in x):
            raise ICRC16Error("#Nats needs a list of unsigned ints")
        uleb(len(x), out)
        for n in x:
            uleb(n, out)
    elif tag == "Floats":
        if not isinstance(x, list) or not all(isinstance(f, float) for f in x):
            raise ICRC16Error("#Floats needs a list of floats")
        uleb(len(x), out)
        for f in x:
            out += _F64.pack(f)
    elif tag == "Principal":
        principal(x, out, "#Principal")
    elif tag == "ValueMap":
        if not isinstance(x, list):
            raise ICRC16Error("#ValueMap needs a list of (value, value)")
        uleb(len(x), out)
        for item in x:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise ICRC16Error(f"#ValueMap item must be (value, value): {item!r:.80}")
            value(item[0], out, depth + 1)
            value(item[1], out, depth + 1)
    else:  # Class: record { value; name; immutable } in field-hash order
        if not isinstance(x, list) or not all(isinstance(p, Property) for p in x):
            raise ICRC16Error("#Class needs a list of Property")
        uleb(len(x), out)
        for p in x:
            if not isinstance(p.name, str) or not isinstance(p.immutable, bool):
                raise ICRC16Error(f"bad #Class property {p!r:.80}")
            value(p.value, out, depth + 1)
            text(p.name, out)
            out.append(1 if p.immutable else 0)


def map_items(m: Any, out: bytearray, depth: int = 1) -> None:
    """Append an ``ICRC16Map`` (``vec record { text; ICRC16 }``) from a list of (str, value)."""
    if not isinstance(m, list):
        raise ICRC16Error("an ICRC16Map is a list of (text, value)")
    uleb(len(m), out)
    for item in m:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ICRC16Error(f"#Map item must be (str, value): {item!r:.80}")
        k, x = item
        if not isinstance(k, str):
            raise ICRC16Error(f"#Map item must be (str, value): {item!r:.80}")
        text(k, out)
        value(x, out, depth)


def value_bytes(v: Any) -> bytes:
    """The Candid value bytes of one ICRC-16 value (no header)."""
    out = bytearray()
    value(v, out)
    return bytes(out)
