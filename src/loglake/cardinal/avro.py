"""Avro binary for the three Cardinal shapes, byte for byte as the reference writes them.

The reference marshals with hamba/avro v1.6.6 (``delivery/types.go``: ``avro.Marshal``), raw
binary with no container. hamba writes every non-empty map/array block as a *negative* item
count followed by the block's byte size (``writer.go: WriteBlockHeader``), in blocks of at most
100 items (``config.go: getBlockLength``), then a zero count. fastavro's ``schemaless_writer``
writes positive counts without sizes — valid Avro, different bytes — so the writer is written
here (about 60 lines). The reader is written here too: it accepts both block forms (Avro spec
"Complex Types / Maps"), bounds every length by the bytes present, and raises
``CardinalDecodeError`` naming the message type; the tests cross-check both directions against
fastavro's ``schemaless_writer``/``schemaless_reader`` with the spec's schemas (``*.avsc``).
A Batch, read once a block by the block job, is read in C where the install built ``_avro.c``
(``decode_batch``): the same fields and the same errors, word for word, as the reader here
(``decode_batch_reference``), which stays the reference and the fallback.

Map order: Go iterates maps randomly, so the reference's bytes for a multi-entry map vary run to
run; we write keys sorted, which is one of the orders Go may produce.
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Callable, Iterator
from typing import Any

from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import HASH_SIZE, BatchRecord
from loglake.wire.varint import (
    MAX_OCTETS_64,
    TRUNCATED,
    VarintError,
    decode_uleb,
    encode_uleb,
    encode_zigzag,
    unzigzag,
)

_avro: Any
try:  # the Batch decode in C, built by the install where a compiler is (setup.py)
    _avro = importlib.import_module("loglake.cardinal._avro")
except ImportError:  # the same fields and errors, read in Python below
    _avro = None

BLOCK_LENGTH = 100  # hamba/avro config.go getBlockLength default
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# -- writing ----------------------------------------------------------------------------------
def write_long(out: bytearray, n: int) -> None:
    # One and two octets inline (counts, flags, lengths: a 32-byte hash's is 0x80 0x01), the
    # shared LEB128 beyond: a Batch writes a dozen longs, and calling it for each cost 13% of
    # encoding (benchmarks/cardinal, one update per block, measured).
    z = n << 1 if n >= 0 else ((-n) << 1) - 1
    if z < 0x80:
        out.append(z)
    elif z < 0x4000:
        out.append((z & 0x7F) | 0x80)
        out.append(z >> 7)
    else:
        out += encode_uleb(z)


long_bytes = encode_zigzag
"""Avro ``long``: zig-zag, then unsigned LEB128 (loglake.wire.varint)."""


def int_bytes(n: int) -> bytes:
    """Avro ``int`` (delivery/types.go ``AvroInt``); refuses values outside int32."""
    if not INT32_MIN <= n <= INT32_MAX:
        raise OverflowError(f"{n} does not fit an Avro int (int32)")
    return long_bytes(n)


def write_bytes(out: bytearray, b: bytes) -> None:
    write_long(out, len(b))
    out += b


def _write_blocks(
    out: bytearray, items: list[Any], write_item: Callable[[bytearray, Any], None]
) -> None:
    for start in range(0, len(items), BLOCK_LENGTH):
        block = bytearray()
        chunk = items[start : start + BLOCK_LENGTH]
        for item in chunk:
            write_item(block, item)
        write_long(out, -len(chunk))
        write_long(out, len(block))
        out += block
    out.append(0)


def _write_batch_record(out: bytearray, kv: tuple[str, BatchRecord]) -> None:
    key, rec = kv
    write_bytes(out, key.encode("utf-8", "surrogateescape"))
    write_bytes(out, rec.value)
    write_long(out, rec.count)
    out.append(1 if rec.delete else 0)
    out += rec.subbatch


def encode_batch(
    number: int, weight: bytes, parent: bytes, updates: dict[str, BatchRecord]
) -> bytes:
    """Record ``cloud.rivet.cardinal.batch``: num long, weight bytes, parent fixed(32),
    updates map<update{value bytes, count int, delete boolean, subbatch fixed(32)}>."""
    out = bytearray()
    write_long(out, number)
    write_bytes(out, weight)
    out += parent
    _write_blocks(out, sorted(updates.items()), _write_batch_record)
    return bytes(out)


def _write_string(out: bytearray, s: str) -> None:
    write_bytes(out, s.encode("utf-8", "surrogateescape"))


def _write_str_bytes(out: bytearray, kv: tuple[str, bytes]) -> None:
    _write_string(out, kv[0])
    write_bytes(out, kv[1])


def encode_update(deletes: tuple[str, ...] | list[str], updates: dict[str, bytes]) -> bytes:
    """Record ``update``: delete array<string>, updates map<bytes> (SubBatchMsg value)."""
    out = bytearray()
    _write_blocks(out, list(deletes), _write_string)
    _write_blocks(out, sorted(updates.items()), _write_str_bytes)
    return bytes(out)


# -- reading ----------------------------------------------------------------------------------
class Reader:
    """A cursor over Avro binary that names ``what`` it is reading in every error."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str, pos: int = 0) -> None:
        self.data, self.pos, self.what = data, pos, what

    def fail(self, problem: str) -> CardinalDecodeError:
        return CardinalDecodeError(self.what, problem)

    def long(self, field: str = "long") -> int:
        data, pos = self.data, self.pos
        # one and two octets inline (the common cases: a 32-byte hash's length is 0x80 0x01),
        # the shared LEB128 beyond; the call cost 3-4% of decoding (benchmarks/cardinal)
        if pos < len(data) and data[pos] < 0x80:
            b = data[pos]
            self.pos = pos + 1
            return (b >> 1) ^ -(b & 1)
        if pos + 1 < len(data) and 0 < data[pos + 1] < 0x80:
            z = (data[pos] & 0x7F) | (data[pos + 1] << 7)
            self.pos = pos + 2
            return (z >> 1) ^ -(z & 1)
        try:
            z, self.pos = decode_uleb(data, pos, MAX_OCTETS_64)
        except VarintError as e:
            if e.kind == TRUNCATED:
                raise self.fail(f"{field}: varint runs past the end") from None
            raise self.fail(f"{field}: varint longer than 10 bytes") from None
        n = unzigzag(z)
        if not INT64_MIN <= n <= INT64_MAX:
            raise self.fail(f"{field}: {n} overflows a long")
        return n

    def int(self, field: str = "int") -> int:
        n = self.long(field)
        if not INT32_MIN <= n <= INT32_MAX:
            raise self.fail(f"{field}: {n} overflows an int")
        return n

    def raw(self, size: builtins.int, field: str) -> bytes:  # (``int`` is the method above)
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise self.fail(f"{field}: needs {size} bytes, {len(self.data) - self.pos} left")
        b = bytes(self.data[self.pos : end])
        self.pos = end
        return b

    def bytes_(self, field: str) -> bytes:
        n = self.long(field)
        if n < 0:
            raise self.fail(f"{field}: negative length {n}")
        return self.raw(n, field)

    def string(self, field: str) -> str:
        return self.bytes_(field).decode("utf-8", "surrogateescape")

    def boolean(self, field: str) -> bool:
        b = self.raw(1, field)[0]
        if b > 1:
            raise self.fail(f"{field}: boolean byte {b} is neither 0 nor 1")
        return b == 1

    def blocks(self, field: str) -> Iterator[None]:
        """Yield once per item of a map/array, whichever block form the writer used."""
        while True:
            count = self.long(f"{field} block count")
            if count == 0:
                return
            if count < 0:
                count = -count
                size = self.long(f"{field} block size")
                if size < 0 or self.pos + size > len(self.data):
                    raise self.fail(f"{field}: block size {size} runs past the end")
            if count > len(self.data) - self.pos:
                raise self.fail(f"{field}: {count} items cannot fit in the bytes left")
            for _ in range(count):
                yield

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} trailing bytes")


def decode_batch_reference(data: bytes) -> tuple[int, bytes, bytes, dict[str, BatchRecord]]:
    """Record ``cloud.rivet.cardinal.batch`` from Avro binary: ``(num, weight, parent,
    updates)``; ``CardinalDecodeError`` naming the field for anything else. The reference the
    C kernel (``_avro``) is held equal to, and the decoder where it is not built."""
    r = Reader(data, "Batch")
    number = r.long("num")
    weight = r.bytes_("weight")
    parent = r.raw(HASH_SIZE, "parent")
    updates: dict[str, BatchRecord] = {}
    for _ in r.blocks("updates"):
        key = r.string("updates key")
        value = r.bytes_("update.value")
        count = r.int("update.count")
        delete = r.boolean("update.delete")
        subbatch = r.raw(HASH_SIZE, "update.subbatch")
        updates[key] = BatchRecord(value, count, delete, subbatch)
    r.end()
    return number, weight, parent, updates


BatchFields = tuple[int, bytes, bytes, dict[str, BatchRecord]]

decode_batch: Callable[[bytes], BatchFields]
"""``decode_batch_reference``'s answer for any bytes (value, or error class and text): the C
kernel where it is built, else the reference itself."""


def _decode_batch_c_or_none(data: bytes) -> BatchFields | None:
    try:
        return _avro.decode_batch(data)
    except CardinalDecodeError:
        return None


decode_batch = _avro.decode_batch if _avro is not None else decode_batch_reference


def _uv(data: bytes, pos: int) -> tuple[int, int]:
    """A minimal unsigned LEB128 of at most 9 octets (63 bits) at ``pos``: (value, next);
    value -1 for anything else (truncated, longer, a last octet of 0 after others)."""
    z = shift = 0
    n = len(data)
    while pos < n and shift < 63:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z if b or not shift else -1), pos
        shift += 7
    return -1, pos


def decode_batch_common(data: bytes) -> tuple[int, bytes, bytes, dict[str, BatchRecord]] | None:
    """``decode_batch`` of a well-formed Batch, or None where ``decode_batch`` must judge
    (any error, and the odd forms it accepts: non-minimal or 10-octet varints).

    Why: the block job decodes one Batch a block; ``Reader``'s method a field made that most
    of the block's assembly at one update a block. Straight-line code over the bytes, one
    helper call a varint, gives the same fields; ``tests/cardinal/test_avro_fast.py`` holds
    the two equal on encoded and on hostile bytes."""
    if type(data) is not bytes:
        data = bytes(data)
    n = len(data)
    z, pos = _uv(data, 0)
    if z < 0:
        return None
    number = (z >> 1) ^ -(z & 1)
    z, pos = _uv(data, pos)
    size = (z >> 1) ^ -(z & 1)
    if z < 0 or size < 0 or pos + size > n:
        return None
    weight = data[pos : pos + size]
    pos += size
    if pos + HASH_SIZE > n:
        return None
    parent = data[pos : pos + HASH_SIZE]
    pos += HASH_SIZE
    updates: dict[str, BatchRecord] = {}
    while True:
        z, pos = _uv(data, pos)
        if z < 0:
            return None
        count = (z >> 1) ^ -(z & 1)
        if count == 0:
            break
        if count < 0:
            count = -count
            z, pos = _uv(data, pos)
            size = (z >> 1) ^ -(z & 1)
            if z < 0 or size < 0 or pos + size > n:
                return None
        if count > n - pos:
            return None
        for _ in range(count):
            z, pos = _uv(data, pos)
            size = (z >> 1) ^ -(z & 1)
            if z < 0 or size < 0 or pos + size > n:
                return None
            key = data[pos : pos + size].decode("utf-8", "surrogateescape")
            pos += size
            z, pos = _uv(data, pos)
            size = (z >> 1) ^ -(z & 1)
            if z < 0 or size < 0 or pos + size > n:
                return None
            value = data[pos : pos + size]
            pos += size
            z, pos = _uv(data, pos)
            c = (z >> 1) ^ -(z & 1)
            if z < 0 or not INT32_MIN <= c <= INT32_MAX or pos + 1 + HASH_SIZE > n:
                return None
            flag = data[pos]
            if flag > 1:
                return None
            updates[key] = BatchRecord(value, c, flag == 1, data[pos + 1 : pos + 1 + HASH_SIZE])
            pos += 1 + HASH_SIZE
    if pos != n:
        return None
    return number, weight, parent, updates


decode_batch_or_none: Callable[[bytes], BatchFields | None]
"""The block job's Batch decode: the fields, or None where ``decode`` must judge (and word)
the bytes. With the C kernel that is any bytes it refuses; without it, ``decode_batch_common``
(which also leaves the odd varint forms to ``decode``: a block then takes the slower path, with
the same result)."""
decode_batch_or_none = _decode_batch_c_or_none if _avro is not None else decode_batch_common


def decode_update(
    data: bytes, what: str = "SubBatchMsg"
) -> tuple[tuple[str, ...], dict[str, bytes]]:
    r = Reader(data, what)
    deletes = [r.string("delete item") for _ in r.blocks("delete")]
    updates: dict[str, bytes] = {}
    for _ in r.blocks("updates"):
        key = r.string("updates key")
        updates[key] = r.bytes_("updates value")
    r.end()
    return tuple(deletes), updates


def decode_int(data: bytes, what: str, field: str) -> int:
    r = Reader(data, what)
    n = r.int(field)
    r.end()
    return n
