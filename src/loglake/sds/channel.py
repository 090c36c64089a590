"""SDS bound to loglake: a stream is the broadcast channel, the log is the store node.

Spec "Design Assumptions": messages are broadcast by the transport, and high-availability caches
(store nodes) keep the full history and give back missed messages; a ``retrieval_hint`` helps a
participant fetch a message from such a cache. Here both roles are one loglake stream, used only
through the ``Streams`` protocol (``loglake.streams.api``), so the same code runs on
``LocalStreams`` in a test and on ``StreamClient`` against ``loglake serve``:

- broadcast = ``push`` to the stream; receive = ``pull`` from the participant's cursor;
- the retrieval hint of a message is its stream position, so a participant that detects a
  missing dependency (``MessagesMissing``) pulls exactly that record.

Retrieval hint bytes (loglake's definition; SDS leaves the hint application-specific)::

    0x01                      version
    u16 big-endian            length of the stream name in bytes (n)
    n bytes                   stream name, UTF-8
    u32 big-endian            partition
    u64 big-endian            index

``decode_hint`` returns None for hints that are not loglake's (another transport's hints
pass through untouched). This module does I/O; the participant it drives does not.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable

from loglake.sds.errors import DropReason
from loglake.sds.events import MessageDelivered, MessageDropped, MessagesMissing, Output
from loglake.sds.participant import Participant, ParticipantOptions
from loglake.streams.api import Streams, warn_gap

log = logging.getLogger(__name__)

HINT_VERSION = 1
_TAIL = struct.Struct(">IQ")


def encode_hint(stream: str, partition: int, index: int) -> bytes:
    name = stream.encode()
    if len(name) > 0xFFFF:
        raise ValueError("stream name too long for a retrieval hint")
    head = bytes([HINT_VERSION]) + struct.pack(">H", len(name))
    return head + name + _TAIL.pack(partition, index)


def decode_hint(hint: bytes | None) -> tuple[str, int, int] | None:
    """(stream, partition, index), or None if ``hint`` is not a loglake hint."""
    if not hint or hint[0] != HINT_VERSION or len(hint) < 3:
        return None
    (n,) = struct.unpack_from(">H", hint, 1)
    if len(hint) != 3 + n + _TAIL.size:
        return None
    try:
        name = hint[3 : 3 + n].decode()
    except UnicodeDecodeError:
        return None
    partition, index = _TAIL.unpack_from(hint, 3 + n)
    return name, partition, index


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def stream_for(channel_id: str) -> str:
    """The stream that carries an SDS channel."""
    return f"sds.{channel_id}"


class SdsChannel:
    """One participant on one channel over a ``Streams`` implementation."""

    def __init__(
        self,
        streams: Streams,
        channel_id: str,
        participant_id: str,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        options: ParticipantOptions | None = None,
        stream: str | None = None,
        partition: int = 0,
        from_index: int | None = 0,
        max_fetch_rounds: int = 1000,
        sync_interval_ms: int | None = None,
        sync_only_when_needed: bool = False,
    ) -> None:
        self.streams = streams
        self.stream = streams.create_stream(stream or stream_for(channel_id))
        self.partition = partition
        self.participant = Participant(channel_id, participant_id, clock, options)
        self.max_fetch_rounds = max_fetch_rounds
        if from_index is None:  # live tail: start after what is there now
            from_index = self._end_index()
        self.next_index = from_index
        self.fetched: set[int] = set()
        # spec "Periodic Sync Message", with its back-off option: a sync goes out only when
        # nothing was sent or heard on the channel for a whole interval.
        self.clock = clock
        self.sync_interval_ms = sync_interval_ms
        self.last_activity = clock()
        # With ``sync_only_when_needed`` (a long-running node), a due sync goes out only while
        # it carries something a peer lacks: our messages not yet acknowledged, dependencies we
        # miss, or deliveries since our last broadcast that the senders await our ack for. A
        # settled channel is then quiet instead of storing a bloom-filter-sized sync record
        # (~19 kB by default) every interval forever; the spec's sync is a SHOULD with
        # back-off allowed, and every case above still gets its periodic sync.
        self.sync_only_when_needed = sync_only_when_needed
        self.owe_acks = False

    def _end_index(self) -> int:
        index = 0
        while batch := self.streams.pull(self.stream, index, 1000, self.partition):
            index = batch[-1].index + 1
        return index

    def hint(self, index: int) -> bytes:
        return encode_hint(self.stream, self.partition, index)

    def _broadcast(self, out: Output) -> Output:
        if out.to_send:
            self.last_activity = self.clock()
            self.owe_acks = False  # every message carries our causal history and bloom filter
        for o in out.to_send:
            index = self.streams.push(self.stream, o.data, self.partition)
            if o.reason == "send":
                self.participant.set_retrieval_hint(o.message_id, self.hint(index))
        return out

    def send(self, content: bytes) -> Output:
        return self._broadcast(self.participant.send(content))

    def send_ephemeral(self, content: bytes) -> Output:
        return self._broadcast(self.participant.send_ephemeral(content))

    def sync(self) -> Output:
        return self._broadcast(self.participant.make_sync())

    def tick(self) -> Output:
        """Participant sweeps (resends, SDS-R responses, lost messages), then a periodic sync
        if one is due (or if an SDS-R request is due, spec "SDS-R Periodic Sync Message")."""
        out = self.participant.tick()
        now = self.clock()
        if self.sync_interval_ms and (
            (now - self.last_activity >= self.sync_interval_ms and self._sync_needed())
            or self.participant.repair_request_due(now)
        ):
            self.last_activity = now
            out.extend(self.participant.make_sync())
        return self._broadcast(out)

    def _sync_needed(self) -> bool:
        if not self.sync_only_when_needed:
            return True
        p = self.participant
        return bool(self.owe_acks or p.unacked or p.possibly_acked or p.missing or p.pending)

    def _receive(self, data: bytes, index: int, out: Output) -> None:
        got = self.participant.receive(data, self.hint(index))
        if any(
            isinstance(e, MessageDropped) and e.reason is DropReason.OWN_MESSAGE for e in got.events
        ):
            # our own message back from the stream: already in the log, unless this state
            # was resumed from the stream after another one sent it (``restore_own``)
            got.extend(self.participant.restore_own(data, self.hint(index)))
        if any(isinstance(e, MessageDelivered) for e in got.events):
            self.owe_acks = True
        out.to_send.extend(got.to_send)
        out.events.extend(
            e
            for e in got.events
            if not (isinstance(e, MessageDropped) and e.reason is DropReason.OWN_MESSAGE)
        )

    def poll(self, limit: int = 1000) -> Output:
        """Receive what the stream has past our cursor, then fetch missing messages by hint."""
        out = Output()
        got = self.streams.pull(self.stream, self.next_index, limit, self.partition)
        warn_gap(log, self.next_index, got, stream=self.stream, partition=self.partition)
        for m in got:
            self.next_index = m.index + 1
            self._receive(m.data, m.index, out)
            self.last_activity = self.clock()
        self.fetch_missing(out)
        return self._broadcast(out)

    def fetch_missing(self, out: Output) -> None:
        """Store-node retrieval: pull each missing dependency at its hinted position."""
        seen = 0
        for _ in range(self.max_fetch_rounds):
            missing = [e for ev in out.of(MessagesMissing)[seen:] for e in ev.entries]
            seen = len(out.of(MessagesMissing))
            wanted = []
            for entry in missing:
                pos = decode_hint(entry.retrieval_hint)
                if pos is None or entry.message_id not in self.participant.missing:
                    continue
                stream, partition, index = pos
                if (stream, partition) != (self.stream, self.partition) or index in self.fetched:
                    continue
                wanted.append(index)
            if not wanted:
                return
            for index in sorted(set(wanted)):
                self.fetched.add(index)
                for m in self.streams.pull(self.stream, index, 1, self.partition):
                    if m.index == index:
                        self._receive(m.data, m.index, out)
