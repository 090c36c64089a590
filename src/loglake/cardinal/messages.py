"""The seven Cardinal message types (plus the reference's ping) as immutable dataclasses.

Spec: specs/cardinal-streams.txt, "Messages"; reference: openrelayxyz/cardinal-streams
``delivery/types.go`` (``MessageType`` constants, ``Batch``, ``BatchRecord``,
``SubBatchRecord``). Every message is a partition key and a value; ``loglake.cardinal.codec``
turns these objects into exactly those bytes and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Prefix bytes, spec "Messages" and delivery/types.go (iota order).
BATCH = 0x00  # Batch: \x00.$BlockHash
SUB_BATCH_HEADER = 0x01  # SubBatchHeader: \x01.$BlockHash.$BatchId
SUB_BATCH_MSG = 0x02  # SubBatchMsg: \x02.$BlockHash.$BatchId.$Index
BATCH_MSG = 0x03  # BatchMsg: \x03.$BlockHash.$Key
BATCH_DELETE_MSG = 0x04  # BatchDeleteMsg: \x04.$BlockHash.$Key
REORG = 0x05  # Reorg: \x05.$Hash
REORG_COMPLETE = 0x06  # ReorgComplete: \x06.$Hash
PING = 0xFF  # delivery/types.go PingType: heartbeats of the Kafka producer (not in the spec)

HASH_SIZE = 32  # spec "Message Payloads": BlockHash is 32 bytes; parent/subbatch are fixed 32
ZERO_HASH = bytes(HASH_SIZE)

TYPE_NAMES = {
    BATCH: "Batch",
    SUB_BATCH_HEADER: "SubBatchHeader",
    SUB_BATCH_MSG: "SubBatchMsg",
    BATCH_MSG: "BatchMsg",
    BATCH_DELETE_MSG: "BatchDeleteMsg",
    REORG: "Reorg",
    REORG_COMPLETE: "ReorgComplete",
    PING: "Ping",
}


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One entry of the Batch ``updates`` map (Avro record ``update``): exactly one of a raw
    value, a count of BatchMsg/BatchDeleteMsg for this prefix, a delete, or a sub-batch id."""

    value: bytes = b""
    count: int = 0
    delete: bool = False
    subbatch: bytes = ZERO_HASH


@dataclass(frozen=True, slots=True)
class Batch:
    """``\\x00`` — what a consumer needs to reassemble one block payload."""

    hash: bytes
    number: int
    weight: int
    """256-bit unsigned; on the wire Go's ``big.Int.Bytes()`` (big-endian, minimal, 0 → b'')."""
    parent: bytes
    updates: dict[str, BatchRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SubBatchHeader:
    """``\\x01`` — the number of SubBatchMsg that make up sub-batch ``batch_id``."""

    hash: bytes
    batch_id: bytes
    item_count: int


@dataclass(frozen=True, slots=True)
class SubBatchMsg:
    """``\\x02`` — item ``index`` of a sub-batch (Avro record ``update``)."""

    hash: bytes
    batch_id: bytes
    index: int
    deletes: tuple[str, ...] = ()
    updates: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BatchMsg:
    """``\\x03`` — set application key ``key`` to ``value``."""

    hash: bytes
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class BatchDeleteMsg:
    """``\\x04`` — delete application key ``key`` (empty value)."""

    hash: bytes
    key: str


@dataclass(frozen=True, slots=True)
class Reorg:
    """``\\x05`` — revert to common ancestor (``number``, ``hash``); a reorg channel follows."""

    hash: bytes
    number: int


@dataclass(frozen=True, slots=True)
class ReorgComplete:
    """``\\x06`` — the last message of a reorg channel."""

    hash: bytes
    number: int


@dataclass(frozen=True, slots=True)
class Ping:
    """``\\xff`` + 32-byte producer id; value is opaque (Go ``time.MarshalBinary``)."""

    producer_id: bytes
    value: bytes = b""


Message = (
    Batch | SubBatchHeader | SubBatchMsg | BatchMsg | BatchDeleteMsg | Reorg | ReorgComplete | Ping
)
"""Any decoded Cardinal message."""
