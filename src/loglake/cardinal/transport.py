"""Transports: how Cardinal messages travel, and the loglake-stream transport.

Spec "Transport Layer" leaves each broker's details to the transport; the reference's Kafka
transport (``transports/kafka.go``) is what this follows on a partitioned log:

- a topic is a loglake stream, its partitions the stream's partitions;
- a message goes to the partition its *key* hashes to, as sarama's default ``HashPartitioner``
  does for the reference producer: FNV-1a 32-bit of the key, ``int32(h) % n``, negated if
  negative (sarama ``partitioner.go``). No hashing library here offers FNV-1a, hence the four
  lines below;
- a reorg past the threshold gets its own one-partition stream ``<default>-re-<ancestor hex>``
  (``%s-re-%x``), which guarantees the in-order delivery the spec asks of the reorg channel;
  the Reorg message also goes on the default topic, where consumers find it;
- a consumer's position is saved through the Ockam index service (``save_index``/
  ``get_index``, per topic and partition, under the consumer's client id), so a restarted
  consumer resumes; the chain window it resumes from (the reference's LastHash/LastNumber/
  LastWeight, stored by the application there) is kept in a checkpoint stream
  ``cardinal.ckpt.<client id>``, committed by saving its index.

Over the Ockam wire a stream message is only ``(index, data)``, so a record's data is the
envelope ``varint(len(key)) key value`` (Avro long for the length).

``Transport`` is the interface a JetStream transport implements later.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from loglake.cardinal import avro
from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
from loglake.cardinal.codec import decode, encode
from loglake.cardinal.consumer import DEFAULT_REORG_THRESHOLD
from loglake.cardinal.errors import (
    CardinalDecodeError,
    CheckpointError,
    PartitionMismatch,
    UndeliveredUpdates,
    UnknownAncestor,
    UpdatesLost,
)
from loglake.cardinal.messages import REORG, REORG_COMPLETE, Batch, Message, Reorg
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Emission, Producer, reorg_channel_name
from loglake.errors import LoglakeError
from loglake.log.api import UnknownPartition, UnknownStream
from loglake.streams.api import StreamMessage, Streams, warn_gap
from loglake.streams.fence import UNFENCED, Fence, is_claim
from loglake.structured_logging import log_event

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 4
STALL_ROUNDS = 8
"""Rounds in a row with blocks waiting for a parent and the head not moving before
``StreamConsumer`` says so (then after twice as many, and so on, while it lasts)."""
CLAIMS_LOOKED_AT = 256
"""Records of a checkpoint stream ``load_checkpoint`` reads, at most, to find its newest
checkpoint record when no index was committed (lease claims stored after it are skipped)."""
PAUSED_ROUNDS = 16
"""Rounds a Reorg out of every source's reach waits for its ancestor while the others move
(``StreamConsumer._give_up_reorgs``)."""
FNV32_OFFSET, FNV32_PRIME = 0x811C9DC5, 0x01000193


def fnv1a32(data: bytes) -> int:
    h = FNV32_OFFSET
    for b in data:
        h = ((h ^ b) * FNV32_PRIME) & 0xFFFFFFFF
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """sarama ``hashPartitioner.Partition``: ``int32(fnv1a(key)) % n``, absolute value."""
    h = fnv1a32(key)
    if h >= 0x80000000:
        h -= 0x100000000
    return abs(h) % partitions  # Go's truncated % then negation == abs(h) % n


def envelope(key: bytes, value: bytes) -> bytes:
    return avro.long_bytes(len(key)) + key + value


def open_envelope(data: bytes) -> tuple[bytes, bytes]:
    r = avro.Reader(data, "envelope")
    n = r.long("key length")
    if n < 0 or r.pos + n > len(data):
        raise CardinalDecodeError("envelope", f"key length {n} does not fit {len(data)} bytes")
    return data[r.pos : r.pos + n], data[r.pos + n :]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as read from a transport: where from (``topic:partition``) and at which
    offset, with its key and value."""

    source: str
    offset: int
    key: bytes
    value: bytes


@dataclass(slots=True)
class _Follow:
    """A reorg channel being read to its ReorgComplete (``StreamConsumer._follow_reorg``)."""

    source: str
    """The channel's one ``topic:partition``."""
    pos: int
    """The next offset to read."""
    reorg: Delivery | None
    """The default topic's Reorg that named the channel, applied from itself if the channel
    does not exist; None when resumed from a checkpoint (the Reorg was applied before it)."""
    waiting: bool = False
    """Read to the channel's end without a ReorgComplete: the next round reads on (``commit``
    may go ahead: a checkpoint taken now resumes the channel, ``_resume_follow``)."""
    checked: bool = False
    """A later segment of a channel followed before was told apart (``channel_segment``)."""


BATCH_KEY, REORG_KEY, REORG_COMPLETE_KEY = b"\x00", bytes((REORG,)), bytes((REORG_COMPLETE,))


def heaviest_batch(records: Iterable[tuple[bytes, bytes]]) -> int:
    """The greatest weight of the Batches among a reorg channel's (key, value)s; -1 if none
    (an undecodable one counts for nothing)."""
    heaviest = -1
    for k, v in records:
        if k[:1] == BATCH_KEY:
            try:
                msg = decode(k, v)
            except CardinalDecodeError:
                continue
            assert isinstance(msg, Batch)
            heaviest = max(heaviest, msg.weight)
    return heaviest


def channel_segment(heaviest: int, records: Iterable[tuple[int, bytes, bytes]]) -> str | int:
    """A later segment of a reorg channel (the name is keyed by the ancestor only, so every
    reorg to that ancestor goes there), its (offset, key, value)s from its Reorg on, against
    ``heaviest``, the heaviest Batch of the channel before it: ``"new"`` once it brings a block
    heavier than that (a new reorg: the spec's producer sends blocks "up to the block with a
    Weight heavier than the heaviest block on the removed chain", and weights grow along a
    chain), the offset after its ReorgComplete if it brings none (a redundant producer's copy
    of a segment before it, maybe one it replaced since: A→B→A′ then B again from a producer
    lagging behind), ``"open"`` if the records end before either (still being written). A
    function of the channel alone: a restarted consumer, and the Spark job, decide alike."""
    for offset, k, v in records:
        t = k[:1]
        if t == BATCH_KEY and heaviest_batch(((k, v),)) > heaviest:
            return "new"
        if t == REORG_COMPLETE_KEY:
            return offset + 1
    return "open"


def source_name(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def split_source(source: str) -> tuple[str, int]:
    topic, _, part = source.rpartition(":")
    return topic, int(part)


class Transport(ABC):
    """What the Cardinal producer and consumer need from a broker."""

    @abstractmethod
    def send(self, topic: str, messages: Sequence[tuple[bytes, bytes]]) -> None:
        """Append (key, value) pairs to ``topic``, each to the partition its key selects, in
        order within a partition."""

    @abstractmethod
    def send_channel(self, channel: str, messages: Sequence[tuple[bytes, bytes]]) -> None:
        """Append to an in-order, single-partition channel (a reorg channel)."""

    @abstractmethod
    def sources(self, topic: str) -> list[str]:
        """The ``topic:partition`` sources of ``topic``; none while it does not exist."""

    @abstractmethod
    def fetch(self, source: str, offset: int, limit: int) -> list[Delivery]:
        """Up to ``limit`` deliveries of ``source`` from ``offset`` on."""

    @abstractmethod
    def save_checkpoint(self, client_id: str, checkpoint: Checkpoint) -> bool:
        """Store ``checkpoint``; return whether anything new was written."""

    @abstractmethod
    def load_checkpoint(self, client_id: str) -> Checkpoint | None: ...


class StreamTransport(Transport):
    """``Transport`` on the loglake ``Streams`` protocol (``LocalStreams`` or ``StreamClient``).

    A topic's partition count is the stream's own (``Streams.partitions``), as a Kafka client
    reads it from the broker's metadata. ``partitions`` is what a producer creates a missing
    topic with (``DEFAULT_PARTITIONS`` if None); when given, an existing topic with another
    count raises ``PartitionMismatch``. A consumer never creates a topic: an absent one has no
    sources until it appears.

    ``fence``: a consumer-group member that runs on one of several nodes at a time holds a
    lease for its client id (``streams.fence``); its checkpoint records go through the fence,
    so a member that lost the lease (paused, partitioned away) cannot commit: its append is
    refused (``LeaseLost``/``FencedOut``) before its offsets are saved, and the member that
    took over resumes from the last checkpoint it did not write itself — each block once.
    """

    def __init__(
        self, streams: Streams, partitions: int | None = None, fence: Fence = UNFENCED
    ) -> None:
        self.streams = streams
        self.partitions = partitions
        self.fence = fence
        self._created: dict[str, int] = {}
        self._last_shape: dict[str, tuple[tuple, frozenset[str], tuple]] = {}

    def _ensure(self, topic: str, partitions: int) -> None:
        """Create (or open) a stream of our own: a reorg channel or a checkpoint stream."""
        if topic not in self._created:
            self.streams.create_stream(topic, partitions)
            self._created[topic] = partitions

    def partitions_of(self, topic: str) -> int | None:
        """``topic``'s partition count as the stream has it; None if there is no such stream.
        ``PartitionMismatch`` if it differs from the configured count."""
        n = self._created.get(topic)
        if n is None:
            try:
                n = self.streams.partitions(topic)
            except UnknownStream:
                return None
            if self.partitions is not None and n != self.partitions:
                raise PartitionMismatch(topic, self.partitions, n)
            self._created[topic] = n
        return n

    def _topic(self, topic: str) -> int:
        """Producer side: the partition count, creating the topic if it is absent."""
        n = self.partitions_of(topic)
        if n is None:
            try:
                self.streams.create_stream(topic, self.partitions or DEFAULT_PARTITIONS)
            except LoglakeError:  # another producer created it first (maybe otherwise)
                if self.partitions_of(topic) is None:
                    raise
            n = self.partitions_of(topic)
            if n is None:
                raise UnknownStream(topic)
        return n

    def send(self, topic: str, messages: Sequence[tuple[bytes, bytes]]) -> None:
        n = self._topic(topic)
        by_part: dict[int, list[bytes]] = {}
        for k, v in messages:
            by_part.setdefault(partition_for(k, n), []).append(envelope(k, v))
        for p, datas in sorted(by_part.items()):
            self.streams.push_many(topic, datas, p)

    def send_channel(self, channel: str, messages: Sequence[tuple[bytes, bytes]]) -> None:
        self._ensure(channel, 1)
        self.streams.push_many(channel, [envelope(k, v) for k, v in messages], 0)

    def sources(self, topic: str) -> list[str]:
        n = self.partitions_of(topic)
        return [source_name(topic, p) for p in range(n or 0)]

    def fetch(self, source: str, offset: int, limit: int) -> list[Delivery]:
        """An absent stream or partition reads as no deliveries. Found from outside: one
        well-formed Reorg naming a reorg channel nobody created made this raise
        ``UnknownStream``, so ``cardinal consume`` stopped for good (the Reorg sat before the
        committed offset, read again at every restart), and the "no channel: apply the Reorg
        itself" path never ran. A topic deleted under a consumer likewise just brings
        nothing."""
        topic, part = split_source(source)
        out = []
        try:
            got = self.streams.pull(topic, offset, limit, part)
        except (UnknownStream, UnknownPartition):
            return []
        warn_gap(log, offset, got, source=source)
        for m in got:
            try:
                k, v = open_envelope(m.data)
            except CardinalDecodeError as e:
                log_event(
                    log,
                    logging.WARNING,
                    "dropping undecodable record",
                    source=source,
                    offset=m.index,
                    error=str(e),
                )
                k, v = b"", b""
            out.append(Delivery(source, m.index, k, v))
        return out

    @staticmethod
    def _ckpt_stream(client_id: str) -> str:
        return f"cardinal.ckpt.{client_id}"

    def save_checkpoint(self, client_id: str, checkpoint: Checkpoint) -> bool:
        """Store ``checkpoint``; return whether a record was appended.

        The checkpoint stream is bounded two ways. A record is appended only when the window
        (chain) or the set of sources differs from the last record: a record with the same
        window and older offsets is still a valid resumption point (a restart re-reads a little
        more, and recognises those blocks), so an idle or duplicate-only round writes nothing.
        And each record is a whole checkpoint, so only the last one is needed: on an embedded
        log (``LocalStreams``) the records below it are dropped with ``Log.truncate_before``.
        The per-partition offsets always go to the index service (it overwrites, not grows).

        Under a lease (``fence``) a round with nothing new for the checkpoint stream saves its
        offsets only while this process's view says it holds the lease, ``LeaseLost`` otherwise
        (a member resumed after SIGSTOP past its TTL sees it at once: the view is its own
        monotonic clock). The cluster does not fence the index service, so a former holder can
        still save offsets in the instant between that look and the write; those cannot cost a
        block twice: ``load_checkpoint`` resumes from the lower of the record's offsets and the
        index's, and a lower one only re-reads blocks the record's window recognises.
        """
        name = self._ckpt_stream(client_id)
        self._ensure(name, 1)
        shape = (checkpoint.chain, frozenset(checkpoint.offsets), checkpoint.reorgs)
        appended = False
        if self._last_shape.get(client_id) != shape:
            self.fence.guard(name)
            (idx,) = self.fence.append(self.streams, name, [checkpoint.to_bytes()])
            self.streams.save_index(client_id, name, idx + 1)  # the commit point
            self._last_shape[client_id] = shape
            self._truncate(name, idx)
            appended = True
        elif not self.fence.holds():
            from loglake.streams.lease import LeaseLost

            raise LeaseLost(self.fence.name, "its ttl ran out before this commit; nothing saved")
        for source, offset in checkpoint.offsets.items():
            topic, part = split_source(source)
            # a topic deleted since it was read (JetStream: from outside loglake): nothing to
            # resume there
            with contextlib.suppress(UnknownStream, UnknownPartition):
                self.streams.save_index(client_id, topic, offset, part)
        return appended

    def _truncate(self, name: str, keep_from: int) -> None:
        """Drop the checkpoint records below ``keep_from`` where the streams can (an embedded
        log; over the wire the Ockam protocol has no deletion, so the node's retention must)."""
        if keep_from == 0:
            return
        with contextlib.suppress(NotImplementedError):
            self.streams.truncate_before(name, keep_from)

    def _newest_record(self, name: str) -> StreamMessage | None:
        """The newest checkpoint record of stream ``name`` among its last ``CLAIMS_LOOKED_AT``
        records, skipping the claim records a fenced member appends as it takes the lease
        (``Fence.claim``); None if the stream holds only claims (or nothing).
        ``CheckpointError`` if those are all claims and older records are kept (which they
        are could not be told without reading them all)."""
        first, end = self.streams.bounds(name)
        start = max(first, end - CLAIMS_LOOKED_AT)
        got: list[StreamMessage] = []
        while start < end:
            batch = self.streams.pull(name, start, end - start)
            if not batch:
                break
            got += batch
            start = batch[-1].index + 1
        for m in reversed(got):
            if not is_claim(m.data):
                return m
        if first < end - CLAIMS_LOOKED_AT:
            raise CheckpointError(
                f"{name}: no committed checkpoint, and its last {CLAIMS_LOOKED_AT} records are "
                "lease claims; start this consumer under another client id"
            )
        return None

    def load_checkpoint(self, client_id: str) -> Checkpoint | None:
        name = self._ckpt_stream(client_id)
        self._ensure(name, 1)
        self.fence.guard(name)
        if self.fence.holds():
            self.fence.claim()  # before the read: a former holder's commit cannot follow it
        idx = self.streams.get_index(client_id, name)
        if idx == 0:
            # Found from outside: with the index service's files lost (consumers.* deleted or
            # emptied) index 0 read as "never committed", and the consumer re-emitted the whole
            # chain although this stream held its checkpoints. Its newest record is resumed
            # from: every record holds what the application had been handed when it was
            # written (``StreamConsumer.commit`` refuses while updates are undelivered), so it
            # skips nothing, and it is the newest such state, so it repeats nothing — also
            # when a crash came between the record and its index (a first commit).
            newest = self._newest_record(name)
            if newest is None:
                return None  # never committed: a fresh consumer (lease claims aside)
            ckpt = Checkpoint.from_bytes(newest.data)
            log_event(
                log,
                logging.WARNING,
                "no committed checkpoint index: resuming from the newest checkpoint record",
                stream=name,
                record=newest.index,
                client_id=client_id,
            )
            self._last_shape[client_id] = (ckpt.chain, frozenset(ckpt.offsets), ckpt.reorgs)
            return ckpt  # the index service's offsets went with its index: the record's hold
        msgs = self.streams.pull(name, idx - 1, 1)
        if not msgs or msgs[0].index != idx - 1:
            # the committed record is gone (a node's retention, a truncation): the next one
            # kept, if any, was never committed; resuming from it, or from nothing, would
            # deliver blocks twice or skip some
            kept = f"#{msgs[0].index} is the first kept" if msgs else "none is kept"
            raise CheckpointError(
                f"{name}: the committed checkpoint #{idx - 1} is no longer stored ({kept}); "
                "restore the stream, or start this consumer under another client id"
            )
        ckpt = Checkpoint.from_bytes(msgs[0].data)
        self._last_shape[client_id] = (ckpt.chain, frozenset(ckpt.offsets), ckpt.reorgs)
        # The index service holds the offsets too; it only moves forward, so where the record
        # is lower (blocks moved back onto a fork by a reorg) the record wins.
        offsets = {}
        for source, offset in ckpt.offsets.items():
            topic, part = split_source(source)
            try:
                offsets[source] = min(offset, self.streams.get_index(client_id, topic, part))
            except (UnknownStream, UnknownPartition):  # deleted since (JetStream: from outside)
                offsets[source] = offset
        return replace(ckpt, offsets=offsets)  # reverted and done kept as stored


class StreamProducer:
    """Sends blocks to streams (I/O): a ``Producer``'s messages for each block go through the
    transport to their topics (and reorg channels)."""

    def __init__(self, transport: Transport, producer: Producer) -> None:
        self.transport = transport
        self.producer = producer
        self.sent = 0

    def _send_topics(self, topic_msgs: dict[str, list[Message]]) -> None:
        for topic, msgs in sorted(topic_msgs.items()):
            if msgs:
                self.transport.send(topic, [encode(m) for m in msgs])
                self.sent += len(msgs)

    def send_block(self, block: BlockPayload) -> None:
        self._send_topics(self.producer.block_messages(block))

    def send_blocks(self, blocks: Iterable[BlockPayload]) -> None:
        """Several blocks in one append per topic partition (one durable write, not one per
        block)."""
        merged: dict[str, list[Message]] = {}
        for b in blocks:
            for topic, msgs in self.producer.block_messages(b).items():
                merged.setdefault(topic, []).extend(msgs)
        self._send_topics(merged)

    def send_emission(self, emission: Emission) -> None:
        """A ``ChainProducer.branch`` result: the reorg channel first, then the topics."""
        if emission.channel:
            self.transport.send_channel(
                emission.channel, [encode(m) for m in emission.channel_messages]
            )
            self.sent += len(emission.channel_messages)
        self._send_topics(emission.topics)

    def send_reorg(
        self, ancestor_number: int, ancestor_hash: bytes, blocks: Iterable[BlockPayload]
    ) -> str:
        """A reorg past the threshold: the channel first, then the Reorg on the default topic."""
        channel, msgs = self.producer.reorg_channel(ancestor_number, ancestor_hash, blocks)
        self.transport.send_channel(channel, [encode(m) for m in msgs])
        self.transport.send(self.producer.default_topic, [encode(msgs[0])])
        self.sent += len(msgs) + 1
        return channel


class StreamConsumer:
    """Reads blocks from streams (I/O): an ``OrderedConsumer`` fed by polling every partition of
    the topics through the transport; follows reorg channels, and checkpoints through the index
    service under ``client_id``."""

    def __init__(
        self,
        transport: Transport,
        topics: Sequence[str],
        client_id: str,
        reorg_threshold: int = DEFAULT_REORG_THRESHOLD,
        tracked_prefixes: Iterable[str] = (".*",),
        start: Checkpoint | None = None,
        default_topic: str | None = None,
    ) -> None:
        self.transport = transport
        self.client_id = client_id
        self.default_topic = default_topic or topics[0]
        ckpt = transport.load_checkpoint(client_id) or start
        self.core = OrderedConsumer(reorg_threshold, tracked_prefixes, ckpt)
        self.positions: dict[str, int] = {}
        self._start: dict[str, int] = {}  # checkpoint offsets of topic partitions
        self._channels: dict[str, int] = {}
        """Reorg channel source -> the offset after the last ReorgComplete read there (or
        where a later Reorg superseded it): a Reorg naming it again reads on from there."""
        self._following: _Follow | None = None
        """A reorg channel half read: a round raised while following it (a broker error), or
        the checkpoint resumed from was taken in the middle of one. The next round reads the
        rest first; ``commit`` refuses until then."""
        if ckpt:
            for source, offset in ckpt.offsets.items():
                if source.startswith(f"{self.default_topic}-re-"):
                    self._channels[source] = offset
                else:
                    self._start[source] = offset
            self._resume_follow(ckpt)
        self._missing = list(topics)
        self._discover()
        self.errors = 0
        self._paused: dict[str, Delivery] = {}
        self._paused_rounds: dict[str, int] = {}
        """Paused source -> rounds its Reorg waited for an ancestor nothing has read, while the
        other sources made progress (``_give_up_reorgs``)."""
        self._undelivered: list[ChainUpdate | ReorgEvent] = []
        self.read_any = False
        """Whether the last round read anything (a round that read and then went back to read
        a shed block again can end where it began)."""
        self._stall = (self.core.head, 0, STALL_ROUNDS)
        """(head, rounds it has not moved with orphans held, the count to warn at next)."""
        self._lost = False
        """An exception escaped while the core applied a message (an interrupt between its
        state change and the round's list): what it assembled may never reach the
        application, so this consumer neither commits nor polls any more (``UpdatesLost``)."""

    def _resume_follow(self, ckpt: Checkpoint) -> None:
        """Found from outside: a checkpoint taken while a reorg channel was half read (its
        Reorg applied, its ReorgComplete not yet: the newest of ``ckpt.reorgs`` not complete,
        its channel among the offsets) counted the channel as followed, so a restart never
        read the rest of it (a 200-block branch that read as ending at its 64th message: the
        app's head stayed at #66 for good). Such checkpoints come from a channel that read as
        ending before its ReorgComplete (a replica behind, a channel still being written), and
        came, before ``commit`` refused mid-follow, from a round that raised inside one. The
        channel is read on from its offset (blocks on the stored chain are recognised, as on a
        topic), before anything else."""
        if not ckpt.reorgs:
            return
        _number, ancestor, complete = ckpt.reorgs[-1]
        source = source_name(reorg_channel_name(self.default_topic, ancestor), 0)
        if not complete and source in self._channels:
            self._following = _Follow(source, self._channels.pop(source), None)

    def _discover(self) -> None:
        """Add the partitions of topics that exist now (their count is the stream's)."""
        still = []
        for t in self._missing:
            found = self.transport.sources(t)
            if not found:
                still.append(t)
            for s in found:
                self.positions[s] = self._start.get(s, 0)
        self._missing = still

    def _feed(self, d: Delivery, out: list[ChainUpdate | ReorgEvent]) -> None:
        """Apply one delivery, its updates onto ``out`` (the round's list). Found from outside:
        an interrupt (a second Ctrl-C) landing after the core applied a message but before its
        updates reached the round's list lost them, and the commit on ``consume``'s way out,
        seeing nothing undelivered, checkpointed past them (the restart skipped block #20).
        Any exception that escapes here now marks the consumer (``UpdatesLost``)."""
        try:
            out += self.core.receive(d.key, d.value, d.source, d.offset)
        except (CardinalDecodeError, UnknownAncestor) as e:  # the core's state is unchanged
            self.errors += 1
            log_event(
                log,
                logging.WARNING,
                "dropping message",
                source=d.source,
                offset=d.offset,
                error=str(e),
            )
        except BaseException:
            self._lost = True
            raise

    def _follow_reorg(self, out: list[ChainUpdate | ReorgEvent], limit: int) -> None:
        """Read the reorg channel ``_following`` to its ReorgComplete (spec "Reorg/Consumers"),
        its updates onto the round's list ``out``. Found from outside: they went to a list of
        its own, lost when a fetch raised, and the channel counted as followed after its first
        batch, so its rest was never read (a 200-block branch: the app's head stayed on the
        old chain, and a commit then checkpointed the core's #66 the app never saw). Now the
        follow stays in ``_following`` until its ReorgComplete, and the next round resumes it
        (``waiting`` when it read to the channel's end)."""
        f = self._following
        assert f is not None
        was_waiting, f.waiting = f.waiting, False
        if f.reorg is not None and f.pos > 0 and not f.checked:
            verdict = self._later_segment(f, limit)
            if verdict == "open":
                f.waiting = True
                return
            if isinstance(verdict, int):  # a copy of the installed branch: nothing to apply
                f.pos = verdict
                self._channels[f.source] = f.pos
                self._following = None
                return
        f.checked = True
        while True:
            batch = self.transport.fetch(f.source, f.pos, limit)
            if not batch:
                if f.pos == 0 and f.reorg is not None:  # no channel: apply the Reorg itself
                    self._feed(f.reorg, out)
                    break
                # Found from outside: the follow ended here, so the rest of a channel still
                # being written (the spec's own order: Reorg, then the batches, then
                # ReorgComplete) was never read by this process. It stays open: every round
                # reads on from here first, then the topics as usual (their blocks that build
                # on the new branch wait as orphans until the channel brings it).
                if not was_waiting:
                    log_event(
                        log,
                        logging.WARNING,
                        "reorg channel read to its end before ReorgComplete: reading on",
                        channel=split_source(f.source)[0],
                        offset=f.pos,
                    )
                f.waiting = True
                return
            done = False
            for m in batch:
                self._feed(m, out)
                f.pos = m.offset + 1
                if m.key[:1] == bytes((REORG_COMPLETE,)):
                    done = True  # a redundant producer may have appended its own copy after
                    break
            if done:
                break
        self._channels[f.source] = f.pos
        self._following = None

    def _later_segment(self, f: _Follow, limit: int) -> str | int:
        """A Reorg named channel ``f.source``, followed before up to ``f.pos``: what comes
        there. Found from outside: a second deep reorg to the same ancestor (A→B→A′, from an
        honest ``ChainProducer``) goes on the same channel (its name is keyed by the ancestor
        only, as the reference's ``%s-re-%x``) and was never read: the chain stayed on B.
        A segment (Reorg … ReorgComplete) there is a new reorg, applied again
        (``OrderedConsumer.expect_new_reorg``), when it brings a block heavier than any before
        it on the channel, else a redundant producer's copy (``channel_segment``); anything
        else (the rest of a segment, after a restart) is read on as it is."""
        first = self.transport.fetch(f.source, f.pos, 1)
        if not first or first[0].key[:1] != REORG_KEY:
            return "new" if first else f.pos

        def records(start: int, end: int | None) -> Iterator[tuple[int, bytes, bytes]]:
            at = start
            while end is None or at < end:
                n = limit if end is None else min(limit, end - at)
                got = self.transport.fetch(f.source, at, n)
                if not got:
                    return
                yield from ((d.offset, d.key, d.value) for d in got)
                at = got[-1].offset + 1

        heaviest = heaviest_batch((k, v) for o, k, v in records(0, f.pos) if o < f.pos)
        verdict = channel_segment(heaviest, records(f.pos, None))
        if verdict == "new":
            self.core.expect_new_reorg(first[0].key[1:], f.source, f.pos)
        return verdict

    def _is_main_reorg(self, d: Delivery) -> bool:
        return d.key[:1] == bytes((REORG,)) and not d.source.startswith(f"{self.default_topic}-re-")

    def _reorg_ready(self, d: Delivery) -> bool:
        """A Reorg on the default topic waits until the chain has reached its ancestor (or
        passed it by more than the window): blocks produced before the Reorg may still be in
        other partitions, and in-order delivery holds only within one partition."""
        try:
            msg = decode(d.key, d.value)
        except CardinalDecodeError:
            return True  # let _feed log and drop it
        if not isinstance(msg, Reorg):  # (a main reorg's key says Reorg; decode agrees)
            return True
        head = self.core.head
        return self.core.ordering.on_chain(msg.hash) or (
            head is not None and head.number - self.core.ordering.reorg_threshold > msg.number
        )

    def _take_reorg(self, d: Delivery, limit: int, out: list[ChainUpdate | ReorgEvent]) -> None:
        channel = source_name(reorg_channel_name(self.default_topic, d.key[1:]), 0)
        f = self._following
        if f is not None and f.source != channel:
            # a channel read to its end before its ReorgComplete: a later Reorg on the default
            # topic means its producer moved on, so the rest will not come
            log_event(
                log,
                logging.WARNING,
                "reorg channel ended before ReorgComplete: a later Reorg supersedes it",
                channel=split_source(f.source)[0],
                offset=f.pos,
            )
            self._channels[f.source] = f.pos
            f = self._following = None
        if f is None:  # (else: another producer's Reorg for the channel being read)
            # noted before the Reorg's offset counts as read: a round cut short past this
            # point resumes the channel, and commit refuses until it is read. A channel
            # followed before is read on from where it was left: a later segment there is
            # another producer's copy, or a new reorg to the same ancestor
            self._following = _Follow(channel, self._channels.get(channel, 0), d)
        self.positions[d.source] = d.offset + 1
        self.core.consumer.note_offset(d.source, d.offset)
        if self._following is not None:
            self._follow_reorg(out, limit)

    def poll(self, limit: int = 64) -> list[ChainUpdate | ReorgEvent]:
        """One round over every source, at most ``limit`` messages from each, so partitions
        advance together (the reference bounds their spread with a drumline); returns what the
        application must apply, in order. A source stops at a Reorg until it can be applied.
        Past half of the assembler's caps, sources read ahead wait (``_held_back``), and a
        source whose Batch was shed goes back to read it again (``_rewind``).

        What a round assembles is kept on the consumer until it is returned: if the round
        raises partway (a broker error, a stream gone), the updates already assembled — the
        core moved its head past them — come first from the next ``poll``. Found from outside:
        they were lost (the application's head stayed at #5 while the core's was #10; the next
        block came as #11 on top of #5, and a later commit checkpointed past #6..#10). A reorg
        channel the round was following is read on first (``_following``). After an exception
        that escaped while a message was applied, ``UpdatesLost``: make a new consumer."""
        if self._lost:
            raise UpdatesLost()
        out = self._undelivered
        self._round(out, limit)  # if it raises, ``out`` stays on the consumer
        self._undelivered = []
        self._watch_stall()
        return out

    def _watch_stall(self) -> None:
        """Warn when blocks wait for a parent and the head has not moved for ``STALL_ROUNDS``
        rounds (again after twice as many, and so on: a log line per doubling). Found from
        outside: a fresh consumer on topics whose start retention removed held 481 blocks, none
        of whose parents would ever come, emitted nothing and said nothing."""
        head, rounds, warn_at = self._stall
        ordering = self.core.ordering
        if self.core.head != head or not ordering.orphans:
            self._stall = (self.core.head, 0, STALL_ROUNDS)
            return
        rounds += 1
        if rounds >= warn_at:
            warn_at *= 2
            missing = ordering.missing_parent()
            log_event(
                log,
                logging.WARNING,
                "the chain is not moving: held blocks wait for a parent that has not come "
                "(removed by retention, lost, or refused)",
                head=-1 if head is None else head.number,
                head_hash=None if head is None else head.hash.hex(),
                rounds=rounds,
                waiting=ordering.orphans,
                missing_parent=None if missing is None else missing[0].hex(),
                child=None if missing is None else missing[1].number,
                child_hash=None if missing is None else missing[1].hash.hex(),
            )
        self._stall = (head, rounds, warn_at)

    def _round(self, out: list[ChainUpdate | ReorgEvent], limit: int) -> None:
        if self._following is not None:  # a channel half read comes before anything else
            self._follow_reorg(out, limit)
        if self._missing:
            self._discover()
        held = self._held_back()
        progressed = False
        for source in list(self.positions):
            if source not in held:
                progressed |= self._read_source(source, limit, out)
        if held and not progressed:  # held back, but nothing else moves: read them too
            for source in list(self.positions):
                if source in held:
                    progressed |= self._read_source(source, limit, out)
        if not progressed and self._paused:  # nothing else will come: apply the oldest
            source, d = next(iter(self._paused.items()))
            del self._paused[source]
            self._take_reorg(d, limit, out)
            self._rewind()
        elif self._paused:
            self._give_up_reorgs(limit, out)
        self.read_any = progressed

    def _read_source(self, source: str, limit: int, out: list[ChainUpdate | ReorgEvent]) -> bool:
        """One source's turn in a round: whether it read anything."""
        progressed = False
        waiting = self._paused.get(source)
        if waiting is not None:
            if not self._reorg_ready(waiting):
                return False
            del self._paused[source]
            self._paused_rounds.pop(source, None)
            self._take_reorg(waiting, limit, out)
            progressed = True
        batch = self.transport.fetch(source, self.positions[source], limit)
        for d in batch:
            progressed = True
            if self._is_main_reorg(d):
                if not self._reorg_ready(d):
                    self._paused[source] = d
                    break
                self._take_reorg(d, limit, out)
                continue
            self.positions[source] = d.offset + 1
            self._feed(d, out)
        self._rewind()
        return progressed

    def _held_back(self) -> set[str]:
        """Sources not read this round (unless nothing else moves): those read ahead of the
        others while the assembler holds many blocks. Found from outside: every source was read
        ``limit`` messages a round, so with ten messages a block on one topic and one (the
        Batch) on the default topic, the Batch partitions ran thousands of blocks ahead until
        the pending batches passed ``max_pending``, and the mirror case (the default topic
        the heavy one) queued messages past ``max_queued``: both shed, and the consumer
        stopped for good. Past half of a cap:

        - pending batches: a source whose last Batch is above the block after the head has
          read (an in-order producer writes a partition block by block) every message of
          its own the next block needs; it waits while the others bring the rest.
        - messages waiting for their Batch: only the default topic's partitions (where
          Batches are) are read.

        Below both marks nothing is held back: a round reads as it always did."""
        asm = self.core.consumer
        held: set[str] = set()
        if asm.pending >= asm.max_pending // 2:
            head = self.core.head
            nxt = (head.number if head is not None else -1) + 1
            front = asm.batch_front
            held.update(s for s in self.positions if front.get(s, nxt) > nxt)
        if asm.queued >= asm.max_queued // 2:
            held.update(s for s in self.positions if split_source(s)[0] != self.default_topic)
        return held

    def _rewind(self) -> None:
        """Read again what the assembler shed after reading it (``take_rewinds``): each such
        source goes back to the lowest offset of a shed block's messages. A Reorg it was
        stopped at, at or past that offset, is read again there too."""
        asm = self.core.consumer
        if not asm.rewinds:
            return
        for source, offset in asm.take_rewinds().items():
            pos = self.positions.get(source)
            if pos is None or offset >= pos:
                continue  # a reorg channel (followed once), or not read that far
            self.positions[source] = offset
            waiting = self._paused.get(source)
            if waiting is not None and waiting.offset >= offset:
                del self._paused[source]
                self._paused_rounds.pop(source, None)

    def _give_up_reorgs(self, limit: int, out: list[ChainUpdate | ReorgEvent]) -> None:
        """A paused Reorg whose ancestor nothing has read, numbered above every Batch read and
        the head by more than the window (plus a block per source read, of slack)
        (no honest producer sends one there: blocks up to its ancestor came before it, some
        on its own partition): after ``PAUSED_ROUNDS`` rounds in which the other sources
        moved, it is given up on (taken as when nothing else
        moves: ``UnknownAncestor`` drops it unless its channel says otherwise), with a
        warning, and its partition goes on. Found from outside: one Reorg naming an unknown
        ancestor at #1,000,000 stopped its partition as long as a steady producer kept the
        others moving (round 400 of a 27,000-block backlog), while the rest was read ahead."""
        for source, d in list(self._paused.items()):
            try:
                msg = decode(d.key, d.value)
            except CardinalDecodeError:  # pragma: no cover - _reorg_ready let it through
                continue
            assert isinstance(msg, Reorg)
            if self._ancestor_in_reach(msg):
                self._paused_rounds.pop(source, None)
                continue
            n = self._paused_rounds.get(source, 0) + 1
            if n < PAUSED_ROUNDS:
                self._paused_rounds[source] = n
                continue
            log_event(
                log,
                logging.WARNING,
                "giving up waiting for a Reorg's ancestor: nothing read reaches it",
                source=source,
                offset=d.offset,
                ancestor=msg.hash.hex(),
                number=msg.number,
                rounds=n,
            )
            del self._paused[source]
            self._paused_rounds.pop(source, None)
            self._take_reorg(d, limit, out)
            self._rewind()

    def _ancestor_in_reach(self, msg: Reorg) -> bool:
        """Whether the chain may still reach the Reorg's ancestor: its Batch was read (pending,
        done, held or on the chain), or its number is within the window (plus slack) of the
        head or of a Batch read on some source."""
        core = self.core
        if (
            core.consumer.knows(msg.hash)
            or core.ordering.on_chain(msg.hash)
            or core.ordering.holds(msg.hash)
        ):
            return True
        head = core.head
        top = max(core.consumer.batch_front.values(), default=-1)
        if head is not None:
            top = max(top, head.number)
        slack = core.ordering.reorg_threshold + len(self.positions)
        return msg.number <= top + slack

    def give_back(self, updates: Sequence[ChainUpdate | ReorgEvent]) -> None:
        """Hand back updates ``poll`` returned that the application did not apply (it failed
        or was interrupted while applying them): the next ``poll`` returns them first, and until
        then ``commit`` refuses (``UndeliveredUpdates``)."""
        self._undelivered[:0] = list(updates)

    def run(self, max_rounds: int = 1_000_000) -> list[ChainUpdate | ReorgEvent]:
        """Poll until a round brings nothing new (bounded by ``max_rounds``)."""
        out: list[ChainUpdate | ReorgEvent] = []
        try:
            for _ in range(max_rounds):
                before = dict(self.positions)
                out += self.poll()
                if self.positions == before and not self._paused and not self.read_any:
                    break
        except BaseException:
            self.give_back(out)  # the rounds before the one that failed: not lost either
            raise
        return out

    @property
    def missing_topics(self) -> list[str]:
        """Topics that do not exist (yet): nothing to read from them so far."""
        return list(self._missing)

    @property
    def paused(self) -> int:
        """Sources stopped at a Reorg whose ancestor the chain has not reached yet."""
        return len(self._paused)

    def commit(self) -> Checkpoint:
        """Save the checkpoint; ``UndeliveredUpdates`` while updates assembled are not handed
        over (a round that raised, or ``give_back``) or a reorg channel is half read (a round
        that raised while following it): the checkpoint would lie past them, and a restart
        would skip them; ``UpdatesLost`` for good once an exception escaped while a message was
        applied (its updates may be gone). The previous commit then stands (a restart hands
        the blocks since it again). Why not save the checkpoint from before that round instead:
        taking one every round cost 14% of a consume's time (measured: 0.39 s of 2.8 s)."""
        if self._lost:
            raise UpdatesLost()
        if self._undelivered or (self._following is not None and not self._following.waiting):
            # mid-follow the checkpoint holds the Reorg as read, and the channel's rest unread
            raise UndeliveredUpdates(
                len(self._undelivered),
                None if self._following is None else split_source(self._following.source)[0],
            )
        ckpt = self.core.checkpoint()
        self.transport.save_checkpoint(self.client_id, ckpt)
        return ckpt
