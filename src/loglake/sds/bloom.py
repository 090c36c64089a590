"""The SDS bloom filter, bit- and byte-identical to @waku/sds 0.0.8.

Followed: @waku/sds ``src/bloom_filter/bloom.ts`` (sizing, bit layout, ``toBytes``/``fromBytes``)
and ``dist/nim_hashn/nim_hashn.mjs`` (the hash: Nim's ``hashes.hash`` on a string, which is
MurmurHash3_x86_32 with seed 0, read as a signed int32, combined by Kirsch–Mitzenmacher double
hashing). Spec: "Participant state" asks for a bloom filter of received message IDs.

Why hand-written: no kept Python bloom-filter library lays its bits out like @waku/sds, and the
bytes are on the wire. The hash itself comes from ``mmh3`` (a kept C implementation).

Facts checked against the reference source:
- sizing (``BloomFilter`` constructor, no ``kHashes`` given): bits/element =
  ``ceil(-ln(p) / ln(2)^2)`` = 15 for p = 0.001, ``k = round(ln 2 * 15)`` = 10,
  ``m = capacity * 15`` = 150,000 bits, stored as ``1 + floor(m / 64)`` = 2,344 uint64 words.
- bit ``h`` lives in word ``h >> 6`` at bit ``h & 63``; ``toBytes`` writes each word big-endian
  (18,752 bytes), so bit ``h`` is byte ``(h >> 6) * 8 + 7 - ((h & 63) >> 3)``, bit ``h & 7``.
- ``hashN(item, n, m) = |hashA + n * hashB| mod m`` with ``hashA = |H(item)| mod m`` and
  ``hashB = |H(item + " b")| mod m``.
- ``H`` runs over ``Array.from(item).map(c => c.charCodeAt(0))``: one value per code point, the
  UTF-16 unit (the high surrogate for astral characters), OR-ed into the block after an 8-bit
  shift. For code points below 256 that is MurmurHash3 over the Latin-1 bytes; above 255 the
  values overlap and ``_js_nim_hash`` replays the JS arithmetic exactly.

Here the words are kept directly as the serialised bytearray, so an insert flips 10 bits in
place and ``to_bytes`` is one copy: no re-serialisation per message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import mmh3

DEFAULT_CAPACITY = 10_000  # @waku/sds message_channel.ts DEFAULT_BLOOM_FILTER_OPTIONS.capacity
DEFAULT_ERROR_RATE = 0.001  # @waku/sds message_channel.ts DEFAULT_BLOOM_FILTER_OPTIONS.errorRate

_MASK32 = 0xFFFFFFFF


def _imul(a: int, b: int) -> int:
    return (a * b) & _MASK32


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _js_nim_hash(values: list[int]) -> int:
    """nim_hashn.mjs ``murmurHash__pureZhashes_u373`` over per-code-point values (any size)."""
    size = len(values)
    h1 = 0
    i = 0
    for _ in range(size // 4):
        k1 = 0
        for j in (3, 2, 1, 0):
            k1 = ((k1 << 8) & _MASK32) | (values[i + j] & _MASK32)
        i += 4
        k1 = _imul(k1, 0xCC9E2D51)
        k1 = _rotl(k1, 15)
        k1 = _imul(k1, 0x1B873593)
        h1 ^= k1
        h1 = _rotl(h1, 13)
        h1 = (h1 * 5 + 0xE6546B64) & _MASK32
    k1 = 0
    for rem in range(size % 4 - 1, -1, -1):
        k1 = ((k1 << 8) & _MASK32) | (values[i + rem] & _MASK32)
    k1 = _imul(k1, 0xCC9E2D51)
    k1 = _rotl(k1, 15)
    k1 = _imul(k1, 0x1B873593)
    h1 ^= k1
    h1 ^= size & _MASK32
    h1 ^= h1 >> 16
    h1 = _imul(h1, 0x85EBCA6B)
    h1 ^= h1 >> 13
    h1 = _imul(h1, 0xC2B2AE35)
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def _code_units(item: str) -> list[int]:
    out = []
    for ch in item:
        c = ord(ch)
        out.append(c if c < 0x10000 else 0xD800 + ((c - 0x10000) >> 10))
    return out


def nim_hash(item: str) -> int:
    """Nim ``hash(string)`` as @waku/sds's JS build computes it: a signed int32."""
    try:
        data = item.encode("latin-1")
    except UnicodeEncodeError:
        return _js_nim_hash(_code_units(item))
    return mmh3.hash(data, 0, True)


def hash_n(item: str, n: int, max_value: int) -> int:
    """``hashN`` of nim_hashn.mjs: the n-th double hash of ``item`` in ``[0, max_value)``."""
    hash_a = abs(nim_hash(item)) % max_value
    hash_b = abs(nim_hash(item + " b")) % max_value
    return abs(hash_a + n * hash_b) % max_value


def sizing(capacity: int, error_rate: float) -> tuple[int, int, int]:
    """(k, m bits, words) exactly as the BloomFilter constructor of bloom.ts computes them."""
    bits_per_elem = math.ceil(-1.0 * (math.log(error_rate) / math.pow(math.log(2), 2)))
    # JS Math.round rounds .5 up; ln2 * integer is never exactly .5 in practice.
    k = math.floor(math.log(2) * bits_per_elem + 0.5)
    m_bits = capacity * bits_per_elem
    m_ints = 1 + m_bits // 64
    return k, m_bits, m_ints


class BloomFilter:
    """A set of message ids with no false negatives, serialised as @waku/sds does."""

    __slots__ = ("_data", "capacity", "count", "error_rate", "k", "m_bits", "n_bytes")

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, error_rate: float = DEFAULT_ERROR_RATE
    ) -> None:
        self.capacity = capacity
        self.error_rate = error_rate
        self.k, self.m_bits, words = sizing(capacity, error_rate)
        self.n_bytes = words * 8
        self._data = bytearray(self.n_bytes)
        self.count = 0  # insertions (an upper bound on distinct ids)

    def positions(self, item: str) -> tuple[int, ...]:
        """The k bit positions of ``item`` (``computeHashes`` in bloom.ts)."""
        m = self.m_bits
        hash_a = abs(nim_hash(item)) % m
        hash_b = abs(nim_hash(item + " b")) % m
        # hash_a, hash_b >= 0, so |hash_a + n * hash_b| needs no abs()
        return tuple([(hash_a + n * hash_b) % m for n in range(self.k)])

    def insert(self, item: str, positions: Iterable[int] | None = None) -> None:
        data = self._data
        for h in positions if positions is not None else self.positions(item):
            data[((h >> 6) << 3) + 7 - ((h & 63) >> 3)] |= 1 << (h & 7)
        self.count += 1

    def lookup(self, item: str, positions: Iterable[int] | None = None) -> bool:
        return contains(self._data, positions if positions is not None else self.positions(item))

    def __contains__(self, item: str) -> bool:
        return self.lookup(item)

    def to_bytes(self) -> bytes:
        return bytes(self._data)

    def clear(self) -> None:
        self._data = bytearray(self.n_bytes)
        self.count = 0

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        capacity: int = DEFAULT_CAPACITY,
        error_rate: float = DEFAULT_ERROR_RATE,
    ) -> BloomFilter:
        f = cls(capacity, error_rate)
        if len(data) != f.n_bytes:
            raise ValueError(f"bloom filter is {len(data)} bytes, expected {f.n_bytes}")
        f._data = bytearray(data)
        return f


def contains(data: bytes | bytearray, positions: Iterable[int]) -> bool:
    """Lookup on serialised filter bytes without building a ``BloomFilter``."""
    return all(data[(h >> 6 << 3) + 7 - ((h & 63) >> 3)] & 1 << (h & 7) for h in positions)
