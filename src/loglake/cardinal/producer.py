"""Cardinal producer: a block payload plus the application's prefixes → the spec's messages.

Spec: specs/cardinal-streams.txt "Batch/Producers", "SubBatchHeader/Producers",
"SubBatchMsg/Producers", "BatchMsg/Producers", "Reorg/Producers". Reference:
``delivery/producer.go`` (``NewProducer``, ``AddBlock``, ``SendBatch``, ``Reorg``,
``ReorgDone``), followed rule for rule:

- schema: regex → topic; a regex without ``^`` is anchored; two regex strings where one starts
  with the other are refused (``ErrPrefixOverlap``).
- an update/delete key whose prefix regex matches goes out as a BatchMsg/BatchDeleteMsg on that
  prefix's topic and counts under the *matched text* (``FindString``); a key no regex matches
  is carried inside the Batch (value or delete record).
- each sub-batch becomes a Batch record ``{subbatch: id}``; ``send_batch`` emits the
  SubBatchHeader (item count), then the deletes (if any) as one SubBatchMsg at index 0, then one
  SubBatchMsg per update key in sorted key order.
- the Batch message is last on the default topic.

Go iterates maps randomly; we iterate keys sorted so output is deterministic (Go may produce the
same order). Pure functions of their inputs apart from the pending sub-batch table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from loglake.cardinal.codec import encode
from loglake.cardinal.errors import ProducerError
from loglake.cardinal.messages import (
    ZERO_HASH,
    Batch,
    BatchDeleteMsg,
    BatchMsg,
    BatchRecord,
    Message,
    Reorg,
    ReorgComplete,
    SubBatchHeader,
    SubBatchMsg,
)


@dataclass(frozen=True, slots=True)
class SubBatch:
    """A sub-batch of a block: its 32-byte id and its contents."""

    id: bytes
    deletes: tuple[str, ...] = ()
    updates: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BlockPayload:
    """Spec "Message Payloads": hash, number, parent, weight, updates (+ deletes, sub-batches
    keyed by the prefix they are announced under)."""

    number: int
    hash: bytes
    parent: bytes
    weight: int
    updates: Mapping[str, bytes] = field(default_factory=dict)
    deletes: frozenset[str] = frozenset()
    batches: Mapping[str, SubBatch] = field(default_factory=dict)


def reorg_channel_name(default_topic: str, ancestor_hash: bytes) -> str:
    """The in-order channel of one reorg (reference transports/kafka.go: ``%s-re-%x``)."""
    return f"{default_topic}-re-{ancestor_hash.hex()}"


TopicMessages = dict[str, list[Message]]


class Producer:
    def __init__(self, default_topic: str, schema: Mapping[str, str] | None = None) -> None:
        schema = dict(schema or {})
        for i in schema:
            for j in schema:
                if i != j and i.startswith(j):
                    raise ProducerError(f"prefixes {i!r} and {j!r} overlap")
        self.default_topic = default_topic
        self._schema: list[tuple[re.Pattern[str], str]] = []
        for pattern, topic in sorted(schema.items()):
            try:
                rx = re.compile(pattern if pattern.startswith("^") else "^" + pattern)
            except re.error as e:
                raise ProducerError(f"prefix regex {pattern!r}: {e}") from None
            self._schema.append((rx, topic))
        self._pending: dict[bytes, tuple[str, bytes]] = {}  # batch id -> (topic, block hash)

    @property
    def topics(self) -> list[str]:
        return sorted({self.default_topic, *(t for _, t in self._schema)})

    def _match(self, key: str) -> tuple[str, str] | None:
        for rx, topic in self._schema:
            m = rx.match(key)
            if m and m.group(0):
                return m.group(0), topic
        return None

    def add_block(
        self,
        number: int,
        hash_: bytes,
        parent: bytes,
        weight: int,
        updates: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        batches: Mapping[str, bytes] | None = None,
    ) -> TopicMessages:
        """Messages for one block except its sub-batch contents (reference ``AddBlock``)."""
        records: dict[str, BatchRecord] = {}
        out: TopicMessages = {self.default_topic: []}
        counts: dict[str, int] = {}
        for k in sorted(updates):
            hit = self._match(k)
            if hit is None:
                records[k] = BatchRecord(value=bytes(updates[k]))
                continue
            prefix, topic = hit
            counts[prefix] = counts.get(prefix, 0) + 1
            out.setdefault(topic, []).append(BatchMsg(hash_, k, bytes(updates[k])))
        for k in sorted(deletes):
            hit = self._match(k)
            if hit is None:
                records[k] = BatchRecord(delete=True)
                continue
            prefix, topic = hit
            counts[prefix] = counts.get(prefix, 0) + 1
            out.setdefault(topic, []).append(BatchDeleteMsg(hash_, k))
        for k, bid in sorted((batches or {}).items()):
            if bid == ZERO_HASH or len(bid) != 32:
                raise ProducerError(f"sub-batch id for {k!r} must be 32 non-zero bytes")
            if k in records:
                raise ProducerError(f"sub-batch key {k!r} conflicts with an update or delete")
            records[k] = BatchRecord(subbatch=bytes(bid))
            hit = self._match(k)
            self._pending[bytes(bid)] = (hit[1] if hit else self.default_topic, bytes(hash_))
        for prefix, c in counts.items():
            if prefix in records:
                raise ProducerError(f"prefix {prefix!r} conflicts with an update or sub-batch")
            records[prefix] = BatchRecord(count=c)
        batch = Batch(bytes(hash_), number, weight, bytes(parent), records)
        out[self.default_topic].append(batch)
        return out

    def send_batch(
        self,
        batch_id: bytes,
        deletes: Iterable[str] = (),
        updates: Mapping[str, bytes] | None = None,
    ) -> TopicMessages:
        """SubBatchHeader + SubBatchMsgs of an announced sub-batch (reference ``SendBatch``)."""
        try:
            topic, block = self._pending.pop(bytes(batch_id))
        except KeyError:
            raise ProducerError(f"unknown sub-batch 0x{bytes(batch_id).hex()}") from None
        deletes = tuple(deletes)
        updates = updates or {}
        msgs: list[Message] = []
        index = 0
        if deletes:
            msgs.append(SubBatchMsg(block, batch_id, index, deletes, {}))
            index += 1
        for k in sorted(updates):
            msgs.append(SubBatchMsg(block, batch_id, index, (), {k: bytes(updates[k])}))
            index += 1
        return {topic: [SubBatchHeader(block, bytes(batch_id), index), *msgs]}

    def block_messages(self, block: BlockPayload) -> TopicMessages:
        """Every message of a payload: ``add_block`` then ``send_batch`` for each sub-batch."""
        out = self.add_block(
            block.number,
            block.hash,
            block.parent,
            block.weight,
            block.updates,
            block.deletes,
            {k: sb.id for k, sb in block.batches.items()},
        )
        for _, sb in sorted(block.batches.items()):
            for topic, msgs in self.send_batch(sb.id, sb.deletes, sb.updates).items():
                out.setdefault(topic, []).extend(msgs)
        return out

    def reorg(self, number: int, hash_: bytes) -> Reorg:
        """Start of a reorg past the threshold: (number, hash) of the common ancestor.
        ``ProducerError`` if the number is not a block number the wire can carry."""
        msg = Reorg(bytes(hash_), number)
        encode(msg)  # checks the number's range and the hash's length before anything is sent
        return msg

    def reorg_done(self, number: int, hash_: bytes) -> ReorgComplete:
        msg = ReorgComplete(bytes(hash_), number)
        encode(msg)
        return msg

    def reorg_channel(
        self, ancestor_number: int, ancestor_hash: bytes, blocks: Iterable[BlockPayload]
    ) -> tuple[str, list[Message]]:
        """The in-order reorg channel (spec "Reorg/Producers"): Reorg, every message of every
        block after the ancestor in chain order, ReorgComplete. The caller also sends the Reorg
        message on the default topic so consumers learn of the channel."""
        msgs: list[Message] = [self.reorg(ancestor_number, ancestor_hash)]
        for b in blocks:
            for _, topic_msgs in sorted(self.block_messages(b).items()):
                msgs.extend(topic_msgs)
        msgs.append(self.reorg_done(ancestor_number, ancestor_hash))
        return reorg_channel_name(self.default_topic, ancestor_hash), msgs


@dataclass(slots=True)
class Emission:
    """What one branch produces: messages per topic, or (a reorg past the threshold) the
    in-order channel's messages plus the Reorg for the default topic."""

    topics: TopicMessages = field(default_factory=dict)
    channel: str | None = None
    channel_messages: list[Message] = field(default_factory=list)


class ChainProducer:
    """Decides, as the spec's producer must ("Reorg/Producers"), when a branch is a reorg past
    ``reorg_threshold``: it tracks the chain it has produced (within the window) and, for a
    branch forking deeper than the threshold, emits Reorg … batches … ReorgComplete on a reorg
    channel instead of the topics. Reorgs within the threshold go out as plain blocks; the
    consumers' ordered layer handles them.
    """

    def __init__(self, producer: Producer, reorg_threshold: int) -> None:
        self.producer = producer
        self.reorg_threshold = reorg_threshold
        self._chain: list[BlockPayload] = []  # produced canonical chain, oldest first

    @property
    def head(self) -> BlockPayload | None:
        return self._chain[-1] if self._chain else None

    def branch(self, blocks: list[BlockPayload]) -> Emission:
        """Messages for ``blocks`` (a chain segment, parent first); the chain follows the
        branch when its last block outweighs the current head."""
        if not blocks:
            return Emission()
        first, head = blocks[0], self.head
        depth = 0
        keep = len(self._chain)
        if head is not None and first.parent != head.hash:
            for i in range(len(self._chain) - 1, -1, -1):
                if self._chain[i].hash == first.parent:
                    keep = i + 1
                    depth = head.number - self._chain[i].number
                    break
            else:
                depth = head.number - (first.number - 1)
                keep = sum(1 for b in self._chain if b.number < first.number)
        if depth > self.reorg_threshold:
            channel, msgs = self.producer.reorg_channel(first.number - 1, first.parent, blocks)
            out = Emission(channel=channel, channel_messages=msgs)
            out.topics = {self.producer.default_topic: [msgs[0]]}
        else:
            out = Emission()
            for b in blocks:
                for topic, msgs in self.producer.block_messages(b).items():
                    out.topics.setdefault(topic, []).extend(msgs)
        if head is None or blocks[-1].weight > head.weight or first.parent == head.hash:
            self._chain[keep:] = blocks
            floor = self._chain[-1].number - self.reorg_threshold - 1
            while len(self._chain) > 1 and self._chain[0].number < floor:
                self._chain.pop(0)
        return out
