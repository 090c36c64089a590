"""BARE (Binary Application Record Encoding) — the codec of Ockam stream payloads.

Why hand-written: the only BARE package on PyPI, ``bare`` 0.7.0, was last released in June 2020
(unmaintained since; the BARE draft kept changing until 2024). BARE is small, so this module
implements the subset the Ockam stream spec uses, strictly, with typed ``DecodeError``s. It is
cross-checked against an independent, maintained implementation, @bare-ts/lib (npm), in
``tests/streams/test_bare_ts_interop.py``.

Followed:
- the BARE specification (draft-devault-bare, §3 "Types"): ``uint`` is LEB128 (7 bits per octet,
  least significant group first, MSB = "more"), at most 10 octets for a 64-bit value, encoded
  minimally — a decoder here rejects non-minimal encodings (a trailing ``0x00`` group) and values
  above 2**64-1; ``int`` is zig-zag then ``uint``; ``string`` is ``uint`` length + UTF-8;
  ``data`` is ``uint`` length + bytes; ``optional<T>`` is one octet 0 (absent) or 1 (present,
  then T) and any other octet is an error; ``[]T`` is ``uint`` count + items; an ``enum`` is a
  ``uint`` that must be one of the declared values; a tagged union ``(A | B)`` is ``uint`` tag
  (declaration order from 0) + the member; a struct is its fields in order, nothing between.
- Ockam's use of it: ``implementations/elixir/ockam/ockam/lib/ockam/protocol/bare_extended.ex``
  (a union ``[get: A, save: B]`` tags members by declaration order) and ``protocol.ex``
  (``@base_schema {:struct, [protocol: :string, data: :data]}``).

The LEB128 and zig-zag arithmetic is ``loglake.wire.varint`` (shared with Candid, protobuf and
Avro framing); this module adds BARE's rules on top (10 octets, minimal, 64 bits).

A schema is declared once with the type objects below (``Struct`` binds a dataclass), then
``encode(schema, value)`` / ``decode(schema, buf)``; ``decode`` requires that the whole buffer is
consumed (trailing bytes are an error, as ``Ockam.Bare.Extended.decode`` treats them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from loglake.errors import DecodeError
from loglake.wire import varint
from loglake.wire.varint import VarintError, decode_uleb, encode_uleb, unzigzag, zigzag

UINT_MAX = varint.UINT64_MAX
"""BARE §3.1: uint has at most 64 bits of precision."""
UINT_MAX_OCTETS = varint.MAX_OCTETS_64
"""BARE §3.1: the longest uint encoding is 10 octets."""


class BareDecodeError(DecodeError):
    """Bytes that are not a valid BARE encoding of the expected schema."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"BARE: {reason} at byte {offset}")
        self.reason, self.offset = reason, offset


class BareEncodeError(ValueError):
    """A value that the schema cannot encode (caller's fault)."""


# -- primitives --------------------------------------------------------------------------------


def encode_uint(value: int) -> bytes:
    if not 0 <= value <= UINT_MAX:
        raise BareEncodeError(f"uint out of range: {value}")
    return encode_uleb(value)


_UINT_ERRORS = {
    varint.TRUNCATED: "truncated uint",
    varint.TOO_LONG: "uint longer than 10 octets",
    varint.NON_MINIMAL: "non-minimal uint encoding",
    varint.OVERFLOW: "uint exceeds 64 bits",
}


def decode_uint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Read a uint at ``pos``; return ``(value, next_pos)``."""
    if pos < len(buf):  # one octet inline: most uints (tags, counts); saves a call (10 ns)
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    try:
        return decode_uleb(buf, pos, UINT_MAX_OCTETS, True, UINT_MAX)
    except VarintError as e:
        raise BareDecodeError(_UINT_ERRORS[e.kind], e.offset) from None


def _encode_len_bytes(b: bytes) -> bytes:
    return encode_uint(len(b)) + b


def _decode_len_bytes(buf: bytes | memoryview, pos: int) -> tuple[bytes, int]:
    n, pos = decode_uint(buf, pos)
    end = pos + n
    if end > len(buf):
        raise BareDecodeError(f"length {n} runs past the end ({len(buf) - pos} left)", pos)
    return bytes(buf[pos:end]), end


# -- schema types ----------------------------------------------------------------------------


class BareType:
    """One BARE type: ``enc(value, out)`` appends, ``dec(buf, pos)`` returns (value, pos)."""

    def enc(self, value: Any, out: bytearray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:  # pragma: no cover
        raise NotImplementedError


class _UInt(BareType):
    def enc(self, value: Any, out: bytearray) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BareEncodeError(f"uint needs an int, got {type(value).__name__}")
        out += encode_uint(value)

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        return decode_uint(buf, pos)

    def __repr__(self) -> str:
        return "uint"


class _Int(BareType):
    """Signed ``int``: zig-zag (``(n << 1) ^ (n >> 63)``) then uint (BARE §3.1)."""

    def enc(self, value: Any, out: bytearray) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BareEncodeError(f"int needs an int, got {type(value).__name__}")
        if not -(1 << 63) <= value < (1 << 63):
            raise BareEncodeError(f"int out of range: {value}")
        out += encode_uleb(zigzag(value))

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        u, pos = decode_uint(buf, pos)
        return unzigzag(u), pos

    def __repr__(self) -> str:
        return "int"


class _Str(BareType):
    def enc(self, value: Any, out: bytearray) -> None:
        if not isinstance(value, str):
            raise BareEncodeError(f"string needs a str, got {type(value).__name__}")
        out += _encode_len_bytes(value.encode("utf-8"))

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        raw, end = _decode_len_bytes(buf, pos)
        try:
            return raw.decode("utf-8"), end
        except UnicodeDecodeError as e:
            raise BareDecodeError(f"invalid UTF-8 in string ({e.reason})", pos) from None

    def __repr__(self) -> str:
        return "string"


class _Data(BareType):
    def enc(self, value: Any, out: bytearray) -> None:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise BareEncodeError(f"data needs bytes, got {type(value).__name__}")
        out += encode_uint(len(value))
        out += value

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        return _decode_len_bytes(buf, pos)

    def __repr__(self) -> str:
        return "data"


UINT: BareType = _UInt()
INT: BareType = _Int()
STRING: BareType = _Str()
DATA: BareType = _Data()


class Optional(BareType):
    """``optional<T>``: 0x00 → None, 0x01 → T; any other octet is malformed."""

    def __init__(self, inner: BareType) -> None:
        self.inner = inner

    def enc(self, value: Any, out: bytearray) -> None:
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.inner.enc(value, out)

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        if pos >= len(buf):
            raise BareDecodeError("truncated optional", pos)
        flag = buf[pos]
        if flag == 0:
            return None, pos + 1
        if flag != 1:
            raise BareDecodeError(f"optional flag must be 0 or 1, got {flag}", pos)
        return self.inner.dec(buf, pos + 1)

    def __repr__(self) -> str:
        return f"optional<{self.inner!r}>"


class Array(BareType):
    """``[]T``: uint count then the items."""

    def __init__(self, inner: BareType) -> None:
        self.inner = inner

    def enc(self, value: Any, out: bytearray) -> None:
        out += encode_uint(len(value))
        for item in value:
            self.inner.enc(item, out)

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        n, pos = decode_uint(buf, pos)
        if n > len(buf) - pos:  # every item takes at least one octet
            raise BareDecodeError(f"array count {n} runs past the end", pos)
        items = []
        for _ in range(n):
            item, pos = self.inner.dec(buf, pos)
            items.append(item)
        return tuple(items), pos

    def __repr__(self) -> str:
        return f"[]{self.inner!r}"


class Enum(BareType):
    """``enum``: a uint that must be a declared value. Values are the member names (str)."""

    def __init__(self, name: str, members: Sequence[str]) -> None:
        self.name = name
        self.members = tuple(members)
        self._value = {m: i for i, m in enumerate(self.members)}

    def enc(self, value: Any, out: bytearray) -> None:
        try:
            out += encode_uint(self._value[value])
        except KeyError:
            raise BareEncodeError(f"{value!r} is not a member of enum {self.name}") from None

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        v, end = decode_uint(buf, pos)
        if v >= len(self.members):
            raise BareDecodeError(f"value {v} is not a member of enum {self.name}", pos)
        return self.members[v], end

    def __repr__(self) -> str:
        return self.name


class Struct(BareType):
    """A struct bound to a dataclass: fields encoded in declaration order."""

    def __init__(self, cls: type, *fields: tuple[str, BareType]) -> None:
        self.cls = cls
        self.fields = fields
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names.symmetric_difference(n for n, _ in fields)
        if missing:
            raise TypeError(f"schema of {cls.__name__} does not match its fields: {missing}")

    def enc(self, value: Any, out: bytearray) -> None:
        if not isinstance(value, self.cls):
            raise BareEncodeError(f"expected {self.cls.__name__}, got {type(value).__name__}")
        for name, typ in self.fields:
            typ.enc(getattr(value, name), out)

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        kwargs = {}
        for name, typ in self.fields:
            kwargs[name], pos = typ.dec(buf, pos)
        return self.cls(**kwargs), pos

    def __repr__(self) -> str:
        return self.cls.__name__


class Union(BareType):
    """A tagged union ``(A | B | ...)``: uint tag (declaration order from 0), then the member.

    Members are ``Struct`` types; the value's class picks the tag (classes must be distinct).
    """

    def __init__(self, name: str, members: Sequence[Struct]) -> None:
        self.name = name
        self.members = tuple(members)
        self._tag = {m.cls: i for i, m in enumerate(self.members)}
        if len(self._tag) != len(self.members):
            raise TypeError(f"union {name}: member classes must be distinct")

    def enc(self, value: Any, out: bytearray) -> None:
        tag = self._tag.get(type(value))
        if tag is None:
            raise BareEncodeError(f"{type(value).__name__} is not a member of union {self.name}")
        out += encode_uint(tag)
        self.members[tag].enc(value, out)

    def dec(self, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
        tag, body = decode_uint(buf, pos)
        if tag >= len(self.members):
            raise BareDecodeError(f"union {self.name} has no tag {tag}", pos)
        return self.members[tag].dec(buf, body)

    def __repr__(self) -> str:
        return f"({' | '.join(repr(m) for m in self.members)})"


def encode(schema: BareType, value: Any) -> bytes:
    out = bytearray()
    schema.enc(value, out)
    return bytes(out)


def decode(schema: BareType, buf: bytes | bytearray | memoryview) -> Any:
    """Decode exactly one value of ``schema`` from ``buf`` (all of it) or raise ``DecodeError``."""
    try:
        value, pos = schema.dec(buf, 0)
    except BareDecodeError:
        raise
    except (TypeError, ValueError) as e:  # a dataclass __post_init__ may validate
        raise BareDecodeError(f"invalid {schema!r}: {e}", 0) from None
    if pos != len(buf):
        raise BareDecodeError(f"{len(buf) - pos} trailing bytes after {schema!r}", pos)
    return value
