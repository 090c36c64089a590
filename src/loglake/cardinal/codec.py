"""Cardinal message keys and values ↔ ``messages`` dataclasses.

Keys follow the spec's "Messages" section exactly ($PrefixByte.$BlockHash[.$BatchId[.$Index]]
or $PrefixByte.$BlockHash.$Key) and the reference's ``MessageType.GetKey`` (plain
concatenation). Values: Avro (``loglake.cardinal.avro``) for Batch and SubBatchMsg, an Avro
``int`` for SubBatchHeader, Reorg and ReorgComplete (``delivery/types.go: AvroInt``; also the
SubBatchMsg index inside its key), raw bytes for BatchMsg, empty for BatchDeleteMsg.

``decode`` raises ``CardinalDecodeError(message_type, problem)`` for any malformed key or value
and has no side effects, so a consumer can drop the message and keep every other block's state.
"""

from __future__ import annotations

from loglake.cardinal import avro
from loglake.cardinal.errors import CardinalDecodeError, ProducerError
from loglake.cardinal.messages import (
    BATCH,
    BATCH_DELETE_MSG,
    BATCH_MSG,
    HASH_SIZE,
    PING,
    REORG,
    REORG_COMPLETE,
    SUB_BATCH_HEADER,
    SUB_BATCH_MSG,
    TYPE_NAMES,
    Batch,
    BatchDeleteMsg,
    BatchMsg,
    Message,
    Ping,
    Reorg,
    ReorgComplete,
    SubBatchHeader,
    SubBatchMsg,
)

_H1 = 1 + HASH_SIZE  # end of $BlockHash
MAX_AVRO_INT = avro.INT32_MAX
_H2 = 1 + 2 * HASH_SIZE  # end of $BatchId
MAX_WEIGHT = 2**256 - 1


def weight_bytes(weight: int) -> bytes:
    """Go ``big.Int.Bytes()`` of a 256-bit unsigned weight: big-endian, minimal, 0 → b''."""
    if not 0 <= weight <= MAX_WEIGHT:
        raise ProducerError(f"weight {weight} is not a 256-bit unsigned integer")
    return weight.to_bytes((weight.bit_length() + 7) // 8, "big")


def _hash(h: bytes, what: str) -> bytes:
    if len(h) != HASH_SIZE:
        raise ProducerError(f"{what} must be {HASH_SIZE} bytes, got {len(h)}")
    return bytes(h)


def _avro_nat(n: int, what: str) -> bytes:
    """A non-negative Avro ``int``: the reference writes a SubBatchMsg index, an item count and
    a Reorg/ReorgComplete block number as ``delivery/types.go: AvroInt`` (int32), and none of
    them can be negative; ``decode`` refuses the same values."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_AVRO_INT:
        raise ProducerError(f"{what} {n!r} is outside 0..{MAX_AVRO_INT} (an Avro int, int32)")
    return avro.int_bytes(n)


def _key_bytes(k: str) -> bytes:
    return k.encode("utf-8", "surrogateescape")


def encode(msg: Message) -> tuple[bytes, bytes]:
    """The (partition key, value) of ``msg``."""
    if isinstance(msg, BatchMsg):  # the common case first
        return bytes((BATCH_MSG,)) + _hash(msg.hash, "hash") + _key_bytes(msg.key), msg.value
    if isinstance(msg, BatchDeleteMsg):
        return bytes((BATCH_DELETE_MSG,)) + _hash(msg.hash, "hash") + _key_bytes(msg.key), b""
    if isinstance(msg, SubBatchMsg):
        key = (
            bytes((SUB_BATCH_MSG,))
            + _hash(msg.hash, "hash")
            + _hash(msg.batch_id, "batch id")
            + _avro_nat(msg.index, "SubBatchMsg index")
        )
        return key, avro.encode_update(msg.deletes, msg.updates)
    if isinstance(msg, Batch):
        if not 0 <= msg.number <= avro.INT64_MAX:  # unsigned in the spec; decode refuses less
            raise ProducerError(f"block number {msg.number} is outside 0..{avro.INT64_MAX}")
        for k, r in msg.updates.items():
            _hash(r.subbatch, f"subbatch id of {k!r}")
            if not avro.INT32_MIN <= r.count <= avro.INT32_MAX:
                raise ProducerError(f"count {r.count} of {k!r} does not fit an int")
        value = avro.encode_batch(
            msg.number, weight_bytes(msg.weight), _hash(msg.parent, "parent"), msg.updates
        )
        return bytes((BATCH,)) + _hash(msg.hash, "hash"), value
    if isinstance(msg, SubBatchHeader):
        key = bytes((SUB_BATCH_HEADER,)) + _hash(msg.hash, "hash") + _hash(msg.batch_id, "batch id")
        return key, _avro_nat(msg.item_count, "item count")
    if isinstance(msg, Reorg | ReorgComplete):
        prefix = REORG if isinstance(msg, Reorg) else REORG_COMPLETE
        number = _avro_nat(msg.number, f"{type(msg).__name__} block number")
        return bytes((prefix,)) + _hash(msg.hash, "hash"), number
    if isinstance(msg, Ping):
        return bytes((PING,)) + _hash(msg.producer_id, "producer id"), msg.value
    raise ProducerError(f"not a Cardinal message: {msg!r}")


def decode(key: bytes, value: bytes) -> Message:
    """Parse one message; ``CardinalDecodeError`` if the key or value is malformed."""
    if not key:
        raise CardinalDecodeError("unknown", "empty key")
    t = key[0]
    name = TYPE_NAMES.get(t)
    if name is None:
        raise CardinalDecodeError("unknown", f"unknown prefix byte 0x{t:02x}")
    if t in (BATCH_MSG, BATCH_DELETE_MSG):
        if len(key) < _H1:
            raise CardinalDecodeError(name, f"key of {len(key)} bytes is shorter than 33")
        h = key[1:_H1]
        k = key[_H1:].decode("utf-8", "surrogateescape")
        if t == BATCH_MSG:
            return BatchMsg(h, k, bytes(value))
        if value:
            raise CardinalDecodeError(name, f"value must be empty, got {len(value)} bytes")
        return BatchDeleteMsg(h, k)
    if t == SUB_BATCH_MSG:
        if len(key) <= _H2:
            raise CardinalDecodeError(name, f"key of {len(key)} bytes has no index after 65")
        index = avro.decode_int(key[_H2:], name, "index in key")
        if index < 0:
            raise CardinalDecodeError(name, f"negative index {index}")
        deletes, updates = avro.decode_update(value, name)
        return SubBatchMsg(key[1:_H1], key[_H1:_H2], index, deletes, updates)
    if t == BATCH:
        if len(key) != _H1:
            raise CardinalDecodeError(name, f"key must be 33 bytes, got {len(key)}")
        number, weight, parent, records = avro.decode_batch(value)
        if number < 0:  # the spec's $Number is unsigned; an Avro long is not. The reference
            # (cardinal-streams, Go) takes it as sent, but a consumer recorded it as a done
            # block and its checkpoint, which holds block numbers >= 0, no longer loaded
            raise CardinalDecodeError(name, f"negative block number {number}")
        if len(weight) > 32:
            raise CardinalDecodeError(name, f"weight of {len(weight)} bytes exceeds 256 bits")
        return Batch(key[1:], number, int.from_bytes(weight, "big"), parent, records)
    if t == SUB_BATCH_HEADER:
        if len(key) != _H2:
            raise CardinalDecodeError(name, f"key must be 65 bytes, got {len(key)}")
        count = avro.decode_int(value, name, "item count")
        if count < 0:
            raise CardinalDecodeError(name, f"negative item count {count}")
        return SubBatchHeader(key[1:_H1], key[_H1:], count)
    if t in (REORG, REORG_COMPLETE):
        if len(key) != _H1:
            raise CardinalDecodeError(name, f"key must be 33 bytes, got {len(key)}")
        number = avro.decode_int(value, name, "number")
        if number < 0:  # a block number: -5 would revert to "before block #0"
            raise CardinalDecodeError(name, f"negative block number {number}")
        cls = Reorg if t == REORG else ReorgComplete
        return cls(key[1:], number)
    # PING
    if len(key) != _H1:
        raise CardinalDecodeError(name, f"key must be 33 bytes, got {len(key)}")
    return Ping(key[1:], bytes(value))
