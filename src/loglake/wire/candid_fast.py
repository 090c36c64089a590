"""A fast Candid value decoder for messages whose type table is exactly our own.

Why (hand-written): icp-py-core decodes about 28 µs per ICRC-72 event (it re-checks every
value's wire type against the expected type as it goes), which makes Candid decoding the bulk of
end-to-end replay time. When a message's ``DIDL`` header — type table and argument types — is
byte-for-byte what our own encoder writes for the expected type, the wire types *are* the
expected types, so the values can be read by closures compiled once per type, with no type
checks. Anything else (another encoder's table, a subtype) goes through icp_candid as before.

Output is exactly icp_candid's value form (records as dicts, tuples as lists, ``opt`` as
``[]``/``[v]``, blobs as bytes, principals as ``icp_principal.Principal``, variants as one-key
dicts), so the same converters apply; ``tests/wire/test_icrc16_fast.py`` checks both decoders
agree. One exception: an ``icrc16.ICRC16_RAW_AWARE`` slot (an ``icrc72_publish`` Event's data)
is read — every byte checked — and returned as an ``icrc16.RawValue`` of its bytes, so whoever
passes it on (the Broadcaster) splices it instead of converting and re-encoding it.
Value layout: Candid spec, "Binary format" → "Memory" (M) encodings.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from icp_candid import candid as C
from icp_principal import Principal

from loglake.wire.varint import decode_candid_sleb, decode_candid_uleb

Reader = Callable[[bytes, int], tuple[Any, int]]

MAX_PRINCIPAL_BYTES = 29
"""IC interface specification, "Principals": a principal is a blob of at most 29 bytes. The
encoder refuses longer ones (``icrc16.validate``), so the decoder does too: a value that decodes
always encodes again (found by ``tests/fuzz/fuzz_icrc16.py``)."""


# Candid ``leb128``/``sleb128`` may exceed 64 bits; loglake bounds them (``CANDID_MAX_OCTETS``)
# so a hostile one is rejected in linear time. A truncated or too long one is a ``VarintError``
# (a ValueError), which ``icrc16.candid_decode`` reports as malformed Candid.
_uleb = decode_candid_uleb
_sleb = decode_candid_sleb


def _take(b: bytes, i: int, n: int) -> tuple[bytes, int]:
    j = i + n
    if j > len(b):
        raise ValueError("read past the end")
    return b[i:j], j


def _fixed(fmt: str) -> Reader:
    s = struct.Struct(fmt)

    def read(b: bytes, i: int) -> tuple[Any, int]:
        return s.unpack_from(b, i)[0], i + s.size

    return read


def _text(b: bytes, i: int) -> tuple[str, int]:
    n, i = _uleb(b, i)
    raw, i = _take(b, i, n)
    return raw.decode("utf-8"), i


def _bool(b: bytes, i: int) -> tuple[bool, int]:
    c = b[i]
    if c > 1:
        raise ValueError("bool byte must be 0 or 1")
    return c == 1, i + 1


def _null(b: bytes, i: int) -> tuple[None, int]:
    return None, i


def _principal(b: bytes, i: int) -> tuple[Principal, int]:
    if b[i] != 1:
        raise ValueError("principal must be a reference (0x01)")
    n, i = _uleb(b, i + 1)
    if n > MAX_PRINCIPAL_BYTES:
        raise ValueError(f"principal of {n} bytes (at most {MAX_PRINCIPAL_BYTES})")
    raw, i = _take(b, i, n)
    return Principal(raw), i


def _blob(b: bytes, i: int) -> tuple[bytes, int]:
    n, i = _uleb(b, i)
    return _take(b, i, n)


def compile_reader(t: Any, _memo: dict[int, Reader] | None = None) -> Reader:
    """A reader of values of the icp_candid type ``t`` (recursive types supported)."""
    memo = {} if _memo is None else _memo
    from loglake.wire.icrc16 import ICRC16_RAW_AWARE, RawValue

    if t is ICRC16_RAW_AWARE:  # an Event's data: checked, then kept as its bytes (RawValue)
        value = compile_reader(t.get_type(), memo)

        def raw(b: bytes, i: int) -> tuple[Any, int]:
            _, j = value(b, i)
            return RawValue(b[i:j]), j

        return raw
    if isinstance(t, C.RecClass):
        target = t.get_type()
        key = id(target)
        if key in memo:
            return memo[key]
        slot: list[Reader] = []

        def lazy(b: bytes, i: int) -> tuple[Any, int]:
            return slot[0](b, i)

        memo[key] = lazy
        slot.append(compile_reader(target, memo))
        return lazy
    if isinstance(t, C.NatClass):
        return _uleb
    if isinstance(t, C.IntClass):
        return _sleb
    if isinstance(t, C.FixedNatClass):
        return _fixed({8: "<B", 16: "<H", 32: "<I", 64: "<Q"}[t._bits])
    if isinstance(t, C.FixedIntClass):
        return _fixed({8: "<b", 16: "<h", 32: "<i", 64: "<q"}[t._bits])
    if isinstance(t, C.FloatClass):
        return _fixed("<f" if t._bits == 32 else "<d")
    if isinstance(t, C.TextClass):
        return _text
    if isinstance(t, C.BoolClass):
        return _bool
    if isinstance(t, C.NullClass):
        return _null
    if isinstance(t, C.PrincipalClass):
        return _principal
    if isinstance(t, C.VecClass):
        if t._is_blob:
            return _blob
        elem = compile_reader(t._type, memo)

        def vec(b: bytes, i: int) -> tuple[list[Any], int]:
            n, i = _uleb(b, i)
            if n > len(b) - i:  # every element of our types takes at least one byte
                raise ValueError("vector longer than the message")
            out = []
            for _ in range(n):
                v, i = elem(b, i)
                out.append(v)
            return out, i

        return vec
    if isinstance(t, C.OptClass):
        inner = compile_reader(t._type, memo)

        def opt(b: bytes, i: int) -> tuple[list[Any], int]:
            flag = b[i]
            if flag == 0:
                return [], i + 1
            if flag != 1:
                raise ValueError("opt flag must be 0 or 1")
            v, i = inner(b, i + 1)
            return [v], i

        return opt
    if isinstance(t, C.RecordClass):
        fields = [
            (t._field_map[h][0], compile_reader(t._field_map[h][1], memo)) for h in t._sorted_hashes
        ]
        as_tuple = t.tryAsTuple()

        def record(b: bytes, i: int) -> tuple[Any, int]:
            d = {}
            for name, rd in fields:
                d[name], i = rd(b, i)
            if as_tuple:
                return [d[str(k)] for k in range(len(d))], i
            return d, i

        return record
    if isinstance(t, C.VariantClass):
        cases = [
            (t._field_map[h][0], compile_reader(t._field_map[h][1], memo)) for h in t._sorted_hashes
        ]

        def variant(b: bytes, i: int) -> tuple[dict[str, Any], int]:
            k, i = _uleb(b, i)
            if k >= len(cases):
                raise ValueError("variant index out of range")
            name, rd = cases[k]
            v, i = rd(b, i)
            return {name: v}, i

        return variant
    raise TypeError(f"no fast reader for {t!r}")


def header(t: Any) -> bytes:
    """What icp_candid's encoder writes before the value of one argument of type ``t``."""
    tt = C.TypeTable()
    t.buildTypeTable(tt)
    return b"DIDL" + tt.encode() + C.LEB128.encode_u(1) + t.encodeType(tt)


class FastDecoder:
    """Decode one argument of type ``t``; None when the header is not our own."""

    def __init__(self, t: Any) -> None:
        self.header = header(t)
        self.read = compile_reader(t)

    def decode(self, data: bytes) -> list[Any] | None:
        if not data.startswith(self.header):
            return None
        v, i = self.read(data, len(self.header))
        if i != len(data):
            raise ValueError(f"{len(data) - i} bytes after the value")
        return [v]
