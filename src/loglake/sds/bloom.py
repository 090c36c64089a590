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
from typing import Any

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


def max_honest_bits(capacity: int, error_rate: float) -> int:
    """The most bits a filter of ``capacity`` ids sets, with room to spare: the expected
    count ``m·(1 − e^(−k·capacity/m))`` plus 4·√m (over ten standard deviations of that count).
    Why: the error rate a filter is sized for holds only up to that fill; a filter any fuller
    (every bit set, say) is no evidence of receipt, yet with @waku/sds's rule it counted as a
    possible acknowledgement of every id, so two such syncs from one member acknowledged a
    whole outgoing buffer nobody had received. At this bound a forged filter matches an id
    with about the design's error rate (0.5^10 ≈ 0.001 with the defaults: m = 150,000,
    k = 10, at most 74,537 bits)."""
    k, m_bits, _ = sizing(capacity, error_rate)
    return math.ceil(m_bits * -math.expm1(-k * capacity / m_bits) + 4 * math.sqrt(m_bits))


def bits_set(data: bytes | bytearray) -> int:
    return int.from_bytes(data, "big").bit_count()


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


# -- a batch of ids at once (the sds-audit job checks every pending id against a filter) --------

_C1, _C2 = 0xCC9E2D51, 0x1B873593


def _murmur3_rows(rows: Any) -> Any:
    """MurmurHash3_x86_32, seed 0, of each row of ``rows`` (an (n, L) uint8 array: n keys of
    L bytes), as signed int32 values in an int64 array: ``mmh3.hash`` a row at a time, in
    numpy over all rows at once (uint32 arithmetic wraps as the C code's does)."""
    import numpy as np

    n, size = rows.shape
    h = np.zeros(n, dtype=np.uint32)
    c1, c2 = np.uint32(_C1), np.uint32(_C2)

    def rotl(x: Any, r: int) -> Any:
        return (x << np.uint32(r)) | (x >> np.uint32(32 - r))

    nblocks = size // 4
    if nblocks:
        blocks = np.ascontiguousarray(rows[:, : nblocks * 4]).view("<u4")
        for i in range(nblocks):
            k1 = rotl(blocks[:, i] * c1, 15) * c2
            h = rotl(h ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)
    tail = size & 3
    if tail:
        k1 = np.zeros(n, dtype=np.uint32)
        for j in range(tail - 1, -1, -1):
            k1 = (k1 << np.uint32(8)) | rows[:, nblocks * 4 + j].astype(np.uint32)
        h ^= rotl(k1 * c1, 15) * c2
    h ^= np.uint32(size & 0xFFFFFFFF)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h.view(np.int32).astype(np.int64)


def positions_batch(
    items: Any, capacity: int = DEFAULT_CAPACITY, error_rate: float = DEFAULT_ERROR_RATE
) -> Any:
    """``BloomFilter(capacity, error_rate).positions`` of every id in ``items`` (a pyarrow
    string array, or a sequence of str) as an (n, k) int64 array, row i the positions of id i.
    Why: the audit checks thousands of ids against each message's filter; the hash of an ASCII
    id is MurmurHash3 over its bytes (as ``nim_hash``), computed here for every id of a length
    at once; any other id (a null counts as the empty id) goes through ``positions``, the
    reference this is tested equal to."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from loglake.wire.arrow_offsets import value_offsets

    k, m_bits, _ = sizing(capacity, error_rate)
    arr = items if isinstance(items, pa.Array) else pa.array(list(items), pa.string())
    arr = pc.fill_null(arr.cast(pa.string()), "")
    n = len(arr)
    out = np.empty((n, k), dtype=np.int64)
    if n == 0:
        return out
    offs = value_offsets(arr).astype(np.int64)
    data = np.frombuffer(arr.buffers()[2] or b"", dtype=np.uint8)
    lens = np.diff(offs)
    high = np.zeros(n, dtype=bool)  # a byte >= 0x80: not ASCII, the reference's way
    if len(data):
        hi_at = np.flatnonzero(data[offs[0] : offs[-1]] >= 0x80) + offs[0]
        high[np.searchsorted(offs, hi_at, side="right") - 1] = True
    suffix = np.frombuffer(b" b", dtype=np.uint8)
    steps = np.arange(k, dtype=np.int64)
    for size in np.unique(lens[~high]).tolist():
        at = np.flatnonzero((lens == size) & ~high)
        keys = data[offs[at][:, None] + np.arange(size, dtype=np.int64)]
        hash_a = np.abs(_murmur3_rows(keys)) % m_bits
        with_b = np.concatenate([keys, np.broadcast_to(suffix, (len(at), 2))], axis=1)
        hash_b = np.abs(_murmur3_rows(with_b)) % m_bits
        out[at] = (hash_a[:, None] + steps[None, :] * hash_b[:, None]) % m_bits
    if high.any():
        f = BloomFilter(capacity, error_rate)
        for i in np.flatnonzero(high).tolist():
            out[i] = f.positions(arr[i].as_py())
    return out


def contains_batch(filters: Any, rows: Any, positions: Any) -> Any:
    """``contains(filters[rows[i]], positions[i])`` for every i at once: ``filters`` an
    (f, n_bytes) uint8 array of serialised filters (one a row), ``rows`` which filter each
    check reads, ``positions`` an (n, k) array (``positions_batch``). A bool array of n."""
    import numpy as np

    pos = np.asarray(positions, dtype=np.int64)
    byte = ((pos >> 6) << 3) + 7 - ((pos & 63) >> 3)
    bit = (np.uint8(1) << (pos & 7).astype(np.uint8)).astype(np.uint8)
    got = filters[np.asarray(rows, dtype=np.int64)[:, None], byte]
    return np.all((got & bit) != 0, axis=1)
