"""LEB128 varints: the one implementation every loglake codec uses.

Five wire formats loglake speaks write integers as little-endian base-128 groups (7 bits per
octet, least significant group first, the top bit of an octet saying "more follows"):

- BARE ``uint`` (``wire/bare.py``, the Ockam stream payloads): unsigned LEB128, at most 10
  octets, minimal, at most 2**64-1 (draft-devault-bare §3.1); BARE ``int`` is zig-zag first.
- Protocol Buffers varints (``archives/layout.py``, ``sds/codec.py``): unsigned LEB128, at most
  10 octets ("Encoding" → "Base 128 Varints" of the protobuf docs).
- Candid ``nat`` / ``int`` and the type table (``wire/candid.py``):
  unsigned and *signed* LEB128, unbounded (Candid spec, "Binary format" → "Notation": ``leb128``
  and ``sleb128``).
- Avro ``int`` / ``long`` (``cardinal/avro.py``): zig-zag, then unsigned LEB128 of at most 10
  octets (Avro spec, "Binary Encoding" → "Primitive Types").

Why hand-written: neither the standard library nor the runtimes loglake depends on expose one
(protobuf's ``google.protobuf.internal.encoder`` is private; icp_candid's ``LEB128`` class is slow
and raises bare exceptions). The functions are written for CPython speed: the one-octet case —
by far the most common — returns before any loop, and small encodings come from a table.

Decoders raise :class:`VarintError` (a ``ValueError``) naming what went wrong (``kind``) and the
offset of the varint; each codec turns it into its own typed error (``BareDecodeError``,
``ICRC16DecodeError``, ``CardinalDecodeError``, …) with its own wording.
"""

from __future__ import annotations

import re
import types
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import numpy as np

MAX_OCTETS_64: Final = 10
"""The longest encoding of a 64-bit value (BARE §3.1, protobuf, Avro): ceil(64 / 7)."""
UINT64_MAX: Final = (1 << 64) - 1
CANDID_MAX_OCTETS: Final = 1024
"""loglake's bound on a Candid ``leb128``/``sleb128`` (values below 2**7168). The Candid spec
sets none, so a hostile ``nat`` could fill a whole request body; 1,024 octets is far above any
value an ICRC-72/77 call carries (ids, timestamps, ICRC-16 ``Nat``/``Int``) and keeps the
worst case at microseconds. Longer encodings are ``TOO_LONG``."""

TRUNCATED: Final = "truncated"
TOO_LONG: Final = "too long"
NON_MINIMAL: Final = "non-minimal"
OVERFLOW: Final = "overflow"

Buffer = bytes | bytearray | memoryview


class VarintError(ValueError):
    """Bytes that are not a varint of the kind asked for; ``kind`` is one of ``TRUNCATED``,
    ``TOO_LONG``, ``NON_MINIMAL``, ``OVERFLOW``; ``offset`` is where the varint starts."""

    def __init__(self, kind: str, offset: int) -> None:
        super().__init__(f"varint {kind} at byte {offset}")
        self.kind, self.offset = kind, offset


_ONE_OCTET: Final = tuple(bytes((i,)) for i in range(0x80))


# -- unsigned ----------------------------------------------------------------------------------
def encode_uleb(n: int) -> bytes:
    """Unsigned LEB128 of ``n`` (minimal; any size). A negative ``n`` is a ``ValueError``."""
    if n < 0x80:
        if n >= 0:  # (two tests: 3 ns faster than ``0 <= n < 0x80``, measured)
            return _ONE_OCTET[n]
        raise ValueError(f"unsigned LEB128 of a negative number: {n}")
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def uleb_size(n: int) -> int:
    """How many octets ``encode_uleb(n)`` takes."""
    return max(1, (n.bit_length() + 6) // 7)


def decode_uleb(
    buf: Buffer,
    pos: int,
    max_octets: int | None = None,
    minimal: bool = False,
    max_value: int | None = None,
) -> tuple[int, int]:
    """Read an unsigned LEB128 at ``pos``: ``(value, next_pos)``.

    ``max_octets``: an encoding whose ``max_octets``-th octet still says "more" is ``TOO_LONG``
    (None: unbounded). ``minimal``: a last octet of 0 after others is ``NON_MINIMAL``.
    ``max_value``: a larger value is ``OVERFLOW``. Bytes ending mid-varint are ``TRUNCATED``.
    """
    try:
        b = buf[pos]
    except IndexError:
        raise VarintError(TRUNCATED, pos) from None
    if b < 0x80:
        return b, pos + 1
    end = len(buf)
    if pos + 1 < end:
        c = buf[pos + 1]
        if 0 < c < 0x80:  # two octets (minimal): the next most common case, values < 16384
            value = (b & 0x7F) | (c << 7)
            if max_value is None or value <= max_value:
                return value, pos + 2
    start = pos
    stop = end if max_octets is None or start + max_octets > end else start + max_octets
    if stop - start > _SHORT:
        return _decode_long(buf, start, stop, minimal, max_value, max_octets)
    value = b & 0x7F
    shift = 7
    pos += 1
    while pos < stop:
        b = buf[pos]
        pos += 1
        if b < 0x80:
            if minimal and b == 0:
                raise VarintError(NON_MINIMAL, start)
            value |= b << shift
            if max_value is not None and value > max_value:
                raise VarintError(OVERFLOW, start)
            return value, pos
        value |= (b & 0x7F) << shift
        shift += 7
    if max_octets is not None and pos - start >= max_octets:
        raise VarintError(TOO_LONG, start)
    raise VarintError(TRUNCATED, start)


_SHORT: Final = 12
"""Up to this many octets the octet-by-octet loop is fastest; beyond it, ``value |= x << shift``
on a growing integer costs time proportional to its size, so the loop would be quadratic in the
varint's length (500 kB of ``ff`` took 21 s): :func:`_decode_long` is linear instead."""
_CONTINUED: Final = re.compile(rb"[\x80-\xff]*")


def _decode_long(
    buf: Buffer, start: int, stop: int, minimal: bool, max_value: int | None, max_octets: int | None
) -> tuple[int, int]:
    """The general case of :func:`decode_uleb` in linear time: the end is found by a regular
    expression (C speed), and the 7-bit groups become one binary numeral that ``int(s, 2)``
    reads in linear time (powers of two need no division)."""
    m = _CONTINUED.match(buf, start, stop)
    last = m.end() if m is not None else start
    if last >= stop:
        if max_octets is not None and stop - start >= max_octets:
            raise VarintError(TOO_LONG, start)
        raise VarintError(TRUNCATED, start)
    b = buf[last]
    if minimal and b == 0:
        raise VarintError(NON_MINIMAL, start)
    groups = bytes(buf[start : last + 1]).translate(_LOW7)
    value = int("".join(map(_BITS7.__getitem__, reversed(groups))), 2)
    if max_value is not None and value > max_value:
        raise VarintError(OVERFLOW, start)
    return value, last + 1


_LOW7: Final = bytes(i & 0x7F for i in range(256))
_BITS7: Final = tuple(format(i, "07b") for i in range(128))


# -- unsigned, vectorised (numpy) ----------------------------------------------------------------
def decode_uleb_batch_uniform(
    data: np.ndarray, pos: np.ndarray, values: bool = True
) -> tuple[int, np.ndarray | None] | None:
    """``(width, values)`` when every unsigned LEB128 at ``pos`` is exactly as long as the
    first, at most 10 octets and 64 bits, and all lie inside ``data`` — most batches: ids and
    sizes of one order of magnitude. One column of bytes per octet and a check that the
    continuation bits say so, no masking. None when they do not (``decode_uleb_batch``
    decides those). ``values=False`` only checks and measures (a scan stepping over numbers
    it does not need). Bounded: reads are inside ``data`` whatever ``pos`` holds."""
    import numpy as np

    p0 = int(pos[0])
    head = data[p0 : p0 + MAX_OCTETS_64] if p0 >= 0 else data[:0]
    stops = head < 0x80
    if not stops.any() or int(pos.min()) < 0:
        return None
    w = int(stops.argmax()) + 1
    if int(pos.max()) + w > len(data):
        return None
    if w == 1:  # the commonest width (tags, small lengths): one gather
        one = data[pos]
        if not bool((one < 0x80).all()):
            return None
        return 1, one.astype(np.uint64) if values else None
    # one gather per octet: measured faster than fancy-indexing a strided window view of
    # ``data`` at every batch size (500 varints of 2 octets: 5 µs against 32 µs)
    cols = []
    for j in range(w):
        c = data[pos + j]
        if not bool(((c < 0x80) if j == w - 1 else (c >= 0x80)).all()):
            return None
        cols.append(c)
    if w == MAX_OCTETS_64 and bool((cols[-1] > 1).any()):
        return None  # a tenth octet above 1 is past 64 bits
    if not values:
        return w, None
    value = cols[0].astype(np.uint64) & np.uint64(0x7F)
    for j in range(1, w):
        value |= (cols[j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return w, value


def decode_uleb_batch(
    data: np.ndarray, pos: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One unsigned LEB128 of at most 10 octets and 64 bits (protobuf's, BARE ``uint``'s, Avro's
    bound) at each position ``pos[i]`` of the byte array ``data``, none reaching ``end[i]``:
    ``(value uint64, next position int64, ok bool)``, all rows at once.

    Row ``i`` is ok exactly when ``decode_uleb(data[:end[i]], pos[i], max_octets=10,
    max_value=UINT64_MAX)`` returns, and then holds its value and next position (the tests
    compare the two on random and edge inputs); a row that is not ok (truncated at its end,
    longer than 10 octets, above 64 bits, ``pos`` at or past ``end``) holds meaningless
    value and position, for the caller to take the scalar path or name the error.

    Why vectorised: a columnar decoder (``archives/columnar.py``) reads the same field of a
    million records at once; one Python call per varint was most of its time. Bounded: ten
    passes over the rows at most (byte k of every varint per pass, most rows stop after one or
    two), every read clamped inside ``data``, whatever the bytes and positions. numpy is
    imported here, not at the top: every codec imports this module, few need numpy."""
    import numpy as np

    pos = np.asarray(pos, dtype=np.int64)
    end = np.minimum(np.asarray(end, dtype=np.int64), len(data))
    n = len(pos)
    uniform = decode_uleb_batch_uniform(data, pos) if n else None
    if uniform is not None:
        w, first = uniform
        assert first is not None
        return first, pos + w, pos + w <= end
    value = np.zeros(n, dtype=np.uint64)
    size = np.zeros(n, dtype=np.int64)
    going = np.ones(n, dtype=bool)
    top = len(data) - 1
    start = np.maximum(pos, 0)  # (once: np.clip per pass cost a tenth of the decode)
    b = np.zeros(n, dtype=np.uint8)
    for k in range(MAX_OCTETS_64):
        if top < 0 or not going.any():
            break
        b = data[np.minimum(start + k, top)]
        value |= ((b & 0x7F).astype(np.uint64) << np.uint64(7 * k)) * going
        size += going
        going &= b >= 0x80
    # refused: still going after 10 octets, past the row's end, or above 64 bits (a tenth
    # octet above 1)
    ok = ~going & (pos >= 0) & (pos + size <= end) & ~((size == MAX_OCTETS_64) & (b > 1))
    return value, pos + size, ok


# -- signed (Candid sleb128) ---------------------------------------------------------------------
def encode_sleb(n: int) -> bytes:
    """Signed LEB128 (two's complement, sign bit = bit 6 of the last octet), minimal."""
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if (n == 0 and not low & 0x40) or (n == -1 and low & 0x40):
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def decode_sleb(buf: Buffer, pos: int, max_octets: int | None = None) -> tuple[int, int]:
    """Read a signed LEB128 at ``pos``: ``(value, next_pos)``; errors as ``decode_uleb``."""
    value, end = decode_uleb(buf, pos, max_octets)
    bits = 7 * (end - pos)
    if value >> (bits - 1):  # the sign bit: bit 6 of the last octet
        value -= 1 << bits
    return value, end


def _with_bound(f: Any, name: str, bound: int) -> Any:
    """``f`` with ``max_octets`` defaulting to ``bound``: the same code object, another default.
    Why not a wrapper or ``functools.partial``: these sit on the replay decoders' hot path, where
    an extra Python call (or a keyword dict per call) costs 2-3x the one-octet decode."""
    g = types.FunctionType(f.__code__, f.__globals__, name, (bound, *f.__defaults__[1:]))
    g.__doc__ = f"{f.__name__} with ``max_octets={bound}`` (``CANDID_MAX_OCTETS``) by default."
    return g


decode_candid_uleb = _with_bound(decode_uleb, "decode_candid_uleb", CANDID_MAX_OCTETS)
"""A Candid ``leb128`` (``nat``, lengths, counts) of at most ``CANDID_MAX_OCTETS``."""
decode_candid_sleb = _with_bound(decode_sleb, "decode_candid_sleb", CANDID_MAX_OCTETS)
"""A Candid ``sleb128`` (``int``, type-table opcodes) of at most ``CANDID_MAX_OCTETS``."""


# -- zig-zag (BARE int, Avro int/long) ---------------------------------------------------------
def zigzag(n: int) -> int:
    """0, -1, 1, -2, … → 0, 1, 2, 3, … (``(n << 1) ^ (n >> 63)`` for any size of ``n``)."""
    return n << 1 if n >= 0 else ((-n) << 1) - 1


def unzigzag(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


def encode_zigzag(n: int) -> bytes:
    """Zig-zag then unsigned LEB128: an Avro ``long``, a BARE ``int``."""
    return encode_uleb(n << 1 if n >= 0 else ((-n) << 1) - 1)
