"""The SDS participant: a sans-I/O state machine for one channel (spec: "Protocol Steps", SDS-R).

``Participant(channel_id, participant_id, clock, options)`` takes calls — ``send``,
``send_ephemeral``, ``make_sync``, ``receive(bytes, retrieval_hint)``, ``tick`` — and returns an
``Output``: the bytes to broadcast and the events to surface. ``clock`` is a function returning
milliseconds that the caller controls (a virtual clock in the simulator, wall time in an adapter);
nothing here reads the wall clock, sleeps, or touches a socket.

Behaviour follows specs/sds-scalable-data-sync.txt and, on the wire and in defaults,
@waku/sds 0.0.8 (``src/message_channel/message_channel.ts``). Differences from @waku/sds, all
off the wire and noted where they happen:

1. A content message whose dependency is still in the incoming buffer waits for it (spec:
   dependencies are met when they are in the *local log*); @waku/sds counts buffered messages as
   available and delivers the dependent first. Such a dependency is not reported missing
   (as in @waku/sds).
2. Duplicates of content messages already in the log are dropped before any processing
   (``DropReason.DUPLICATE``), after cancelling a queued repair response for them (SDS-R
   suppression); @waku/sds only catches duplicates still in its incoming buffer and otherwise
   re-runs ack review (counting a second possible ack) and re-emits "delivered".
3. Irretrievably lost: a missing dependency not repaired within
   ``timeout_for_lost_messages_ms`` of its detection is reported lost and then counts as met, so
   the messages waiting on it are delivered; @waku/sds drops the waiting message instead.
4. The bloom filter rolls over (spec: "SHOULD be rolled over ... once it reaches a predefined
   capacity"): at capacity it is rebuilt from the newest half of the ids. @waku/sds never rolls
   over (past 10,000 ids its filter saturates). ``bloom_rollover=False`` restores that.
5. Sync message ids are ``sync-`` + a token derived from (participant, lamport) instead of
   ``Math.random`` (sync ids are not persisted, spec "Periodic Sync Message").
6. Retrieval hints: a sent message's hint is attached after the transport assigned it
   (``set_retrieval_hint``), as @waku/sds's send callback returns it.
7. Received messages that are not valid (see ``DropReason``) are dropped with an event before
   any state changes; @waku/sds reports some of them as task errors after partial processing.
8. A content message's id must be the SHA-256 of its content (``verify_message_ids``), the id
   @waku/sds's ``getMessageId`` gives every message it sends; @waku/sds does not check it on
   receipt. Why: any member could otherwise send other content under a message's id (ids are
   public: they are in every causal history and repair request), and whoever lacked the
   message took the forgery and then dropped the real one as a duplicate, for good, while
   those holding the real one cancelled their repair responses for it. The spec only says the
   id is "likely based on a message hash"; set it False for a channel whose ids are not.
9. Only a content message stands down the SDS-R request and response queued for its id (spec
   "SDS-R receive message": entries "matching the received message ID"); @waku/sds does it
   for sync messages too. Why: a sync carries no message and its id MAY repeat (spec
   "Periodic Sync Message"), so a sync under a missing message's id, ~100 bytes from any
   member, cancelled every participant's request and response for it.
10. A received bloom filter with more bits set than ``bloom_capacity`` ids set
    (``bloom.max_honest_bits``) acknowledges nothing, not even possibly (spec "Review ACK
    Status": acknowledge "taking into account the bloom filter size and hash number");
    @waku/sds counts any filter. Why: two syncs with every bit set acknowledged a whole
    outgoing buffer, so messages nobody had received were never resent. A @waku/sds peer's
    filter past 10,000 ids (it never rolls over) is such a filter; its causal history still
    acknowledges.
11. A delivered message moves the Lamport clock to its timestamp only up to
    ``max_lamport_lead_ms`` (a day) past the wall clock; the message itself is logged at its
    own timestamp. The spec says the clock MUST match it and @waku/sds does; neither bounds
    it. Why: one message at 2^64 - 1 pinned every receiver's clock there for good (sends are
    held at the uint64's largest value), so every later message of the channel had the same
    timestamp, the log ordered them by id, and an answer could precede its question. The
    spec's aim is a clock "staying close to the current epoch time"; with the bound, honest
    messages keep counting up past each other and only the far-future message sorts last.
12. Of a received ``repair_request`` only the first ``max_repair_requests_per_message`` (3,
    the spec's RECOMMENDed maximum per message, what @waku/sds sends) entries are answered
    (every entry still cancels this participant's own request for it: the spec's MUST), and
    one requester has at most ``RepairConfig.max_responses_per_requester`` responses, of
    ``max_response_bytes_per_requester`` bytes, queued per ``T_min``, and at most
    ``RepairConfig.max_response_bytes`` are rebroadcast per ``T_min`` whoever asked (the rest
    wait for the next window); @waku/sds reads every entry (up to
    ``Limits.max_repair_request`` here) and answers them all. Why: each answered entry
    rebroadcasts a whole message (its bloom filter alone is 18,752 bytes with the defaults, and
    an unknown field can pad it to ``Limits.max_message_bytes``) for ~70 bytes of request; 19
    syncs of 100 entries (143 KB) had one participant rebroadcast 5.3 MB, and 13 KB of syncs
    from made-up requesters 600 MiB of padded messages. The spec says how many entries to
    send, not how many to read, nor how much to rebroadcast; nothing is lost for @waku/sds
    peers, which send 3.
13. ``send`` of content whose id is already in the local log (or the incoming buffer), from
    anyone, raises ``DuplicateContent`` and changes nothing; @waku/sds sends a new message
    under that id (only content still in its outgoing buffer is a retry: the same bytes
    again, as here, and what ``tests/sds/test_participant.py`` checks). Why: the spec says a
    message id MUST be globally unique, and the id is the content's SHA-256 (difference 8),
    so every peer holding the earlier message drops the new one as a duplicate: a second
    "ok" in a chat was silently lost, and any member could block a predictable payload by
    sending it first. Nothing changes on the wire: that message was never delivered anyway.
14. The incoming buffer's ``max_pending_bytes`` counts what each held message costs beyond
    its bytes (``WAITING_COST`` per dependency it waits for, ``PENDING_MESSAGE_COST``), and
    the SDS-R repair cache keeps at most ``repair_cache_bytes`` of messages (besides
    ``repair_cache_messages``); neither the spec nor @waku/sds bounds either.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from loglake.sds.bloom import (
    DEFAULT_CAPACITY,
    DEFAULT_ERROR_RATE,
    BloomFilter,
    bits_set,
    contains,
    max_honest_bits,
)
from loglake.sds.codec import (
    DEFAULT_LIMITS,
    TAG_REPAIR_REQUEST,
    UINT64_MAX,
    Limits,
    encode_fast,
    encode_history_entry,
    parse,
    parse_entry,
)
from loglake.sds.errors import DropReason, DuplicateContent, SdsDecodeError, SdsLocalError
from loglake.sds.events import (
    EphemeralReceived,
    MessageAcknowledged,
    MessageDelivered,
    MessageDropped,
    MessagePossiblyAcknowledged,
    MessageSent,
    MessagesLost,
    MessagesMissing,
    Outgoing,
    Output,
    RepairRequestQueued,
    RepairRequestReceived,
    RepairRequestSent,
    RepairResponseQueued,
    RepairResponseSent,
    SyncReceived,
    SyncSent,
)
from loglake.sds.history import LocalLog, LogRecord
from loglake.sds.messages import HistoryEntry, MessageKind, message_id_of
from loglake.sds.repair import MAX_REPAIR_REQUESTS_PER_MESSAGE, RepairConfig, RepairManager

DEFAULT_CAUSAL_HISTORY_SIZE = 200  # message_channel.ts (the spec recommends 2)
DEFAULT_POSSIBLE_ACKS_THRESHOLD = 2  # message_channel.ts
# What ``max_pending_bytes`` counts for a message in the incoming buffer besides its bytes,
# measured with tracemalloc (a member's messages each naming the same 1,000 ids, 10 to 1,000
# of them): 68-118 bytes for each dependency it waits for (a slot in its ``waiting`` set and
# one in the id's set in ``_waiters``, tables that grow 4x at a time), ~1,400 for the message
# (its ``_Pending``, record and sets). Why: counting its bytes only, 5,000 such messages of
# 6 KB held 1 GB with 29 MiB counted.
WAITING_COST = 120
PENDING_MESSAGE_COST = 1500


@dataclass(frozen=True, slots=True)
class ParticipantOptions:
    causal_history_size: int = DEFAULT_CAUSAL_HISTORY_SIZE
    possible_acks_threshold: int = DEFAULT_POSSIBLE_ACKS_THRESHOLD
    timeout_for_lost_messages_ms: int | None = None  # @waku/sds: disabled unless set
    enable_repair: bool = True  # @waku/sds default
    repair: RepairConfig = field(default_factory=RepairConfig)
    max_repair_requests_per_message: int = MAX_REPAIR_REQUESTS_PER_MESSAGE  # put in one
    # message we send, and read from one we receive (difference 12)
    bloom_capacity: int = DEFAULT_CAPACITY
    bloom_error_rate: float = DEFAULT_ERROR_RATE
    bloom_rollover: bool = True
    resend_unacked_ms: int | None = None  # spec "Periodic Outgoing Buffer Sweep"; None: off
    resend_possibly_acked_ms: int | None = None
    limits: Limits = DEFAULT_LIMITS
    repair_cache_messages: int = 1000  # newest messages kept whole to answer SDS-R requests
    repair_cache_bytes: int = 64 * 1024 * 1024  # and at most their bytes (history.LocalLog)
    max_pending: int = 10_000  # messages in the incoming buffer (past it the oldest is given up)
    max_pending_bytes: int = 64 * 1024 * 1024  # and their bytes
    max_missing: int = 100_000  # dependencies sought (past it the oldest is reported lost)
    max_lost: int = 100_000  # ids remembered as lost
    verify_message_ids: bool = True  # a content message's id must be its content's SHA-256
    max_lamport_lead_ms: int | None = 24 * 3600 * 1000  # how far past the wall clock a peer's
    # timestamp moves ours (difference 11); None: as far as it says (the spec's rule)


@dataclass(slots=True)
class _Unacked:
    data: bytes
    positions: tuple[int, ...]
    last_sent: int
    possible_acks: int = 0


@dataclass(slots=True)
class _Pending:
    """A content message in the incoming buffer, waiting for dependencies."""

    record: LogRecord
    content: bytes
    waiting: set[str]
    received_at: int
    size: int
    """Bytes it holds, counted in ``max_pending_bytes``: its wire bytes, its content,
    ``PENDING_MESSAGE_COST`` and ``WAITING_COST`` for each dependency it still waits for."""


class Participant:
    def __init__(
        self,
        channel_id: str,
        participant_id: str,
        clock: Callable[[], int],
        options: ParticipantOptions | None = None,
    ) -> None:
        if not participant_id:
            raise SdsLocalError("participant_id must not be empty")
        self.channel_id = channel_id
        self.participant_id = participant_id
        self.clock = clock
        self.options = opts = options or ParticipantOptions()
        # spec "Participant state": lamport initialised to the current epoch time in ms.
        self.lamport: int = int(clock())
        self.bloom = BloomFilter(opts.bloom_capacity, opts.bloom_error_rate)
        self._max_bloom_bits = max_honest_bits(opts.bloom_capacity, opts.bloom_error_rate)
        self._bloom_ids: deque[tuple[str, tuple[int, ...]]] = deque()
        self.log = LocalLog(
            opts.causal_history_size, opts.repair_cache_messages, opts.repair_cache_bytes
        )
        # outgoing buffer, split by state; each dict is ordered by last send time
        self.unacked: dict[str, _Unacked] = {}
        self.possibly_acked: dict[str, _Unacked] = {}
        # incoming buffer
        self.pending: dict[str, _Pending] = {}
        self._waiters: dict[str, set[str]] = {}  # dependency id -> pending ids
        self.missing: dict[str, tuple[HistoryEntry, int]] = {}  # id -> (entry, detected at)
        self._pending_bytes = 0
        self.lost: dict[str, None] = {}
        """Ids reported lost (their dependents no longer wait for them), the newest
        ``max_lost``: an insertion-ordered set."""
        # encoded history entries seen before whose message is in the log (see receive)
        self._known_bodies: set[bytes] = set()
        self._known_limit = max(10_000, 20 * opts.causal_history_size)
        self.repair = RepairManager(participant_id, opts.repair) if opts.enable_repair else None

    # -- helpers ----------------------------------------------------------------------------
    def _now(self, now: int | None = None) -> int:
        return int(self.clock()) if now is None else int(now)

    def _bloom_insert(self, message_id: str, positions: tuple[int, ...]) -> None:
        bloom = self.bloom
        if self.options.bloom_rollover:
            if bloom.count >= bloom.capacity:
                keep = list(self._bloom_ids)[-(bloom.capacity // 2) :]
                bloom.clear()
                self._bloom_ids = deque(keep)
                for mid, pos in keep:
                    bloom.insert(mid, pos)
            self._bloom_ids.append((message_id, positions))
        bloom.insert(message_id, positions)

    def _increment_lamport(self, now: int) -> int:
        # spec "Send Message": max(timeNowInMs, current + 1) (message_channel.ts
        # lamportTimestampIncrement), held at the field's largest value: a peer may send
        # lamport 2^64 - 1 (a valid uint64), delivery raises the clock to it, and one more
        # would not fit the uint64 field (written anyway, readers would cut it to 0 and order
        # every later message of ours first, while our log kept it last). The spec and the
        # reference are silent on it; held there, every peer reads the value we log, and ties
        # are ordered by message id as any others.
        self.lamport = min(max(now, self.lamport + 1), UINT64_MAX)
        return self.lamport

    def _follow_lamport(self, received: int) -> None:
        """Spec "Deliver Message": the clock moves up to a delivered message's timestamp, here
        to no more than ``max_lamport_lead_ms`` past the wall clock (difference 11)."""
        lead = self.options.max_lamport_lead_ms
        if lead is not None:
            received = min(received, max(self.lamport, self._now() + lead))
        self.lamport = max(self.lamport, received)

    def _repair_requests(self, now: int) -> list[HistoryEntry]:
        if self.repair is None:
            return []
        return self.repair.repair_requests(now, self.options.max_repair_requests_per_message)

    # -- sending ----------------------------------------------------------------------------
    def send(self, content: bytes) -> Output:
        """Spec "Send Message": a content message, added to the log and the outgoing buffer."""
        if not content:
            raise SdsLocalError("only messages with content can be sent (use make_sync)")
        mid = message_id_of(bytes(content))
        retry = self.unacked.get(mid) or self.possibly_acked.get(mid)
        if retry is None:  # difference 13: not a message every peer drops as a duplicate
            known = self.log.records.get(mid)
            if known is None and mid in self.pending:
                known = self.pending[mid].record
            if known is not None:
                raise DuplicateContent(mid, known.sender_id)
        now = self._now()
        out = Output()
        lamport = self._increment_lamport(now)
        if retry is not None:
            # message_channel.ts: the same id in the outgoing buffer is a retry; resend the
            # same bytes rather than make a new message.
            retry.last_sent = now
            out.to_send.append(Outgoing(retry.data, mid, MessageKind.CONTENT, "resend"))
            return out
        requests = self._repair_requests(now)
        data = encode_fast(
            self.participant_id,
            mid,
            self.channel_id,
            lamport,
            self.log.causal_history_bytes(),
            self.bloom._data,
            b"".join(encode_history_entry(e, TAG_REPAIR_REQUEST) for e in requests),
            bytes(content),
        )
        positions = self.bloom.positions(mid)
        self.unacked[mid] = _Unacked(data, positions, now)
        self._bloom_insert(mid, positions)
        self.log.insert(LogRecord(lamport, mid, self.participant_id, None, data))
        out.to_send.append(Outgoing(data, mid, MessageKind.CONTENT))
        out.events.append(MessageSent(mid, lamport))
        if requests:
            out.events.append(RepairRequestSent(tuple(e.message_id for e in requests), mid))
        return out

    def set_retrieval_hint(self, message_id: str, hint: bytes | None) -> None:
        """Attach the transport's hint for an own message (used in later causal histories)."""
        if message_id not in self.log:
            raise SdsLocalError(f"no message {message_id} in the local log")
        self.log.set_hint(message_id, hint)

    def send_ephemeral(self, content: bytes) -> Output:
        """Spec "Ephemeral Messages": no lamport, causal history or bloom filter; not buffered."""
        if not content:
            raise SdsLocalError("an ephemeral message must have content")
        mid = message_id_of(bytes(content))
        data = encode_fast(
            self.participant_id, mid, self.channel_id, None, b"", None, b"", bytes(content)
        )
        return Output([Outgoing(data, mid, MessageKind.EPHEMERAL, "ephemeral")])

    def make_sync(self, message_id: str | None = None) -> Output:
        """Spec "Periodic Sync Message" (+ "SDS-R Periodic Sync Message").

        As @waku/sds, nothing is sent when there is neither causal history nor a repair request
        to carry."""
        now = self._now()
        out = Output()
        lamport = self._increment_lamport(now)
        requests = self._repair_requests(now)
        history = self.log.causal_history_bytes()
        if not history and not requests:
            return out
        if message_id is None:
            token = hashlib.sha256(f"{self.participant_id}:{lamport}".encode()).digest()[:8]
            message_id = "sync-" + _base36(int.from_bytes(token, "big"))
        data = encode_fast(
            self.participant_id,
            message_id,
            self.channel_id,
            lamport,
            history,
            self.bloom._data,
            b"".join(encode_history_entry(e, TAG_REPAIR_REQUEST) for e in requests),
            None,
        )
        out.to_send.append(Outgoing(data, message_id, MessageKind.SYNC, "sync"))
        out.events.append(SyncSent(message_id, lamport))
        if requests:
            out.events.append(RepairRequestSent(tuple(e.message_id for e in requests), message_id))
        return out

    # -- receiving --------------------------------------------------------------------------
    def receive(self, data: bytes, retrieval_hint: bytes | None = None) -> Output:
        """Spec "Receive Message" (+ "SDS-R receive message")."""
        out = Output()
        limits = self.options.limits
        mid = None
        try:
            pb = parse(data, limits)
            mid = pb.message_id
            if pb.channel_id != self.channel_id:
                raise SdsDecodeError(DropReason.WRONG_CHANNEL, f"channel {pb.channel_id!r}")
            if retrieval_hint is not None and len(retrieval_hint) > limits.max_hint_bytes:
                raise SdsDecodeError(DropReason.OVERSIZED, "retrieval hint from the transport")
            has_lamport = pb.HasField("lamport_timestamp")
            content = pb.content
            if not has_lamport:  # ephemeral: delivered at once, nothing else (spec)
                if pb.sender_id == self.participant_id:
                    raise SdsDecodeError(DropReason.OWN_MESSAGE, "own message")
                out.events.append(EphemeralReceived(mid, pb.sender_id, content))
                return out
            is_content = bool(content)
            bloom = pb.bloom_filter if pb.HasField("bloom_filter") else None
            if bloom is not None and len(bloom) != self.bloom.n_bytes:
                raise SdsDecodeError(
                    DropReason.BAD_BLOOM_FILTER,
                    f"bloom filter of {len(bloom)} bytes, expected {self.bloom.n_bytes}",
                )
            requests = [parse_entry(b, limits) for b in pb.repair_request]
            if is_content and self.options.verify_message_ids and mid != message_id_of(content):
                # Before the duplicate check: a copy under the id with other content must
                # not pass for the message (nor cancel a repair response queued for it).
                raise SdsDecodeError(
                    DropReason.BAD_MESSAGE_ID, "message_id is not the SHA-256 of the content"
                )
            log = self.log
            if pb.sender_id == self.participant_id:
                if self.repair is not None and is_content:
                    self.repair.mark_received(mid)
                raise SdsDecodeError(DropReason.OWN_MESSAGE, "own message")
            if is_content and (mid in log.records or mid in self.pending):
                if self.repair is not None:
                    self.repair.mark_received(mid)  # SDS-R: someone answered; stand down
                raise SdsDecodeError(DropReason.DUPLICATE, "already received")
            # History entries whose exact bytes were seen before and named a message in the
            # log are known; only the others are decoded (and checked) here.
            known = self._known_bodies
            bodies = list(pb.causal_history)
            fresh_set = set(bodies).difference(known) if bodies else set()
            if len(fresh_set) <= 1:
                fresh = list(fresh_set)
            else:  # keep history order (MessagesMissing lists entries in it)
                fresh = [b for b in bodies if b in fresh_set]
            fresh_entries = [(b, parse_entry(b, limits)) for b in fresh]
        except SdsDecodeError as e:
            out.events.append(MessageDropped(e.reason, e.detail, mid))
            return out
        records = log.records
        lost = self.lost
        ids = []  # ids of fresh entries (acks: a known entry was reviewed when first seen)
        absent_entries = []
        if len(known) > self._known_limit:
            known.clear()  # only recent entries recur in histories; re-learn them
        for body, entry in fresh_entries:
            m = entry.message_id
            ids.append(m)
            if m in records:
                known.add(body)
            elif m not in lost and m != mid:  # a message cannot wait for itself
                absent_entries.append(entry)

        now = self._now()
        sender = pb.sender_id
        if not is_content:
            out.events.append(SyncReceived(mid, sender))
        repair = self.repair
        if repair is not None:
            if is_content:  # a sync's id names no message (difference 9 above)
                repair.mark_received(mid)
            if requests:
                out.events.append(
                    RepairRequestReceived(tuple(r.message_id for r in requests), sender)
                )
                answered = self.options.max_repair_requests_per_message  # difference 12
                for rid, due in repair.on_repair_requests(
                    requests, sender, self._sender_of, now, answered, self._raw_size
                ):
                    out.events.append(RepairResponseQueued(rid, due))
        self._review_acks(ids, bloom, out)
        if is_content:
            self._bloom_insert(mid, self.bloom.positions(mid))
            self.missing.pop(mid, None)
        # dependencies: missing (to fetch/repair) or still in the incoming buffer (wait).
        # ``waiting`` holds the one str object the participant already keeps for each id (the
        # pending message's, or the one first sought), not this message's copy: a member's
        # messages naming the same ids would otherwise each keep a copy of every id.
        waiting = set()
        newly_missing = []
        pending, missing = self.pending, self.missing
        for entry in absent_entries:
            dep = entry.message_id
            held = pending.get(dep)
            if held is not None:
                waiting.add(held.record.message_id)
                continue
            newly_missing.append(entry)
            sought = missing.get(dep)
            if sought is None:
                missing[dep] = (entry, now)
            else:
                dep = sought[0].message_id
            waiting.add(dep)
        if newly_missing:
            out.events.append(MessagesMissing(tuple(newly_missing)))
            if repair is not None:
                for rid, due in repair.mark_missing(newly_missing, now):
                    out.events.append(RepairRequestQueued(rid, due))
        if not is_content:
            self._bound_buffers(out)
            return out
        rec = LogRecord(pb.lamport_timestamp, mid, sender, retrieval_hint, bytes(data))
        if waiting:
            size = len(data) + len(content) + PENDING_MESSAGE_COST + WAITING_COST * len(waiting)
            held = _Pending(rec, content, waiting, now, size)
            pending[mid] = held
            self._pending_bytes += size
            waiters = self._waiters
            for dep in waiting:
                who = waiters.get(dep)
                if who is None:
                    waiters[dep] = {mid}
                else:
                    who.add(mid)
        else:
            self._deliver(rec, content, out)
        self._bound_buffers(out)
        return out

    def restore_own(self, data: bytes, retrieval_hint: bytes | None = None) -> Output:
        """An own content message read back from the channel's store, put back into the local
        log (``receive`` ignores own messages, as the spec says it SHOULD): what a participant
        resumed on a new state (a node taking it over after its former node died) does with
        the messages its former state sent. Why: they are its history (the spec's local log
        holds every message of the channel); without them a message naming one waits for a
        dependency this participant would drop as its own when fetched, until marked lost,
        and its own next messages would not name them. The Lamport timestamp moves past
        theirs (the new node's clock may be behind), and the messages that waited for one are
        delivered. Not put in the outgoing buffer: whether others acknowledged it is not known
        here, and resending is the former state's work. Anything else (not own, no content,
        already in the log, not decodable) is left as it is: an empty output."""
        out = Output()
        try:
            pb = parse(data, self.options.limits)
        except SdsDecodeError:
            return out
        mid = pb.message_id
        if (
            pb.sender_id != self.participant_id
            or pb.channel_id != self.channel_id
            or not pb.HasField("lamport_timestamp")
            or not pb.content
            or mid in self.log.records
            or (self.options.verify_message_ids and mid != message_id_of(pb.content))
        ):
            return out
        lamport = pb.lamport_timestamp
        self._follow_lamport(lamport)
        self._bloom_insert(mid, self.bloom.positions(mid))
        self.missing.pop(mid, None)
        self.lost.pop(mid, None)
        self.log.insert(LogRecord(lamport, mid, self.participant_id, retrieval_hint, bytes(data)))
        woken: list[tuple[LogRecord, bytes]] = []
        self._wake(mid, woken)
        for rec, content in woken:
            self._deliver(rec, content, out)
        return out

    def _review_acks(self, ids: list[str], bloom: bytes | None, out: Output) -> None:
        """Spec "Review ACK Status"."""
        unacked, possibly = self.unacked, self.possibly_acked
        if not unacked and not possibly:
            return
        for m in ids:
            if m in unacked or m in possibly:
                unacked.pop(m, None) or possibly.pop(m, None)
                out.events.append(MessageAcknowledged(m))
        if bloom is None or bits_set(bloom) > self._max_bloom_bits:
            return  # over-full: no evidence of receipt (bloom.max_honest_bits)
        threshold = self.options.possible_acks_threshold
        hits = [
            (buf, m)
            for buf in (unacked, possibly)
            for m, u in buf.items()
            if contains(bloom, u.positions)
        ]
        for buf, m in hits:
            u = buf[m]
            u.possible_acks += 1
            if u.possible_acks < threshold:
                out.events.append(MessagePossiblyAcknowledged(m, u.possible_acks))
                if buf is unacked:
                    del unacked[m]
                    possibly[m] = u
            else:
                del buf[m]
                out.events.append(MessageAcknowledged(m, by_bloom_filter=True))

    def _deliver(self, rec: LogRecord, content: bytes, out: Output) -> None:
        """Spec "Deliver Message", then wake the messages that waited on it."""
        stack = [(rec, content)]
        while stack:
            rec, content = stack.pop()
            if rec.lamport_timestamp > self.lamport:
                self._follow_lamport(rec.lamport_timestamp)
            if self.log.insert(rec):
                out.events.append(
                    MessageDelivered(
                        rec.message_id,
                        rec.sender_id,
                        rec.lamport_timestamp,
                        content,
                        rec.retrieval_hint,
                    )
                )
            self._wake(rec.message_id, stack)

    def _sender_of(self, message_id: str) -> str | None:
        """Who sent ``message_id``, if this participant can rebroadcast it (its bytes are in
        the repair cache), else None."""
        rec = self.log.records.get(message_id)
        return None if rec is None or rec.raw is None else rec.sender_id

    def _raw_size(self, message_id: str) -> int | None:
        """The bytes a repair of ``message_id`` rebroadcasts, None if it cannot be sent."""
        rec = self.log.records.get(message_id)
        return None if rec is None or rec.raw is None else len(rec.raw)

    def _lose(self, entries: list[HistoryEntry], out: Output) -> None:
        """Spec: missing dependencies "MAY [be marked] as irretrievably lost"; the messages
        that waited only for them are delivered."""
        for entry in entries:
            del self.missing[entry.message_id]
            self._mark_lost(entry.message_id)
        out.events.append(MessagesLost(tuple(entries)))
        self._deliver_waiting_on(entries, out)

    def _give_up(self, pid: str, out: Output) -> None:
        """Deliver pending message ``pid`` without the dependencies it still waits for,
        reported lost (those not themselves in the incoming buffer), and the messages that
        waited only for those."""
        held = self.pending.pop(pid, None)
        if held is None:
            return  # delivered meanwhile
        self._pending_bytes -= held.size
        gone = []
        for dep in held.waiting:
            self._waiters.get(dep, set()).discard(pid)
            if dep not in self.pending:
                item = self.missing.pop(dep, None)
                self._mark_lost(dep)
                gone.append(item[0] if item else HistoryEntry(dep))
        if gone:
            out.events.append(MessagesLost(tuple(gone)))
        held.waiting.clear()
        self._deliver(held.record, held.content, out)
        # the others that waited for what is now lost wait no more (a later message naming
        # it does not wait either)
        self._deliver_waiting_on(gone, out)

    def _deliver_waiting_on(self, entries: list[HistoryEntry], out: Output) -> None:
        """Deliver the messages that waited only for ``entries`` (now lost)."""
        stack: list[tuple[LogRecord, bytes]] = []
        for entry in entries:
            self._wake(entry.message_id, stack)
        for rec, content in stack:
            self._deliver(rec, content, out)

    def _mark_lost(self, mid: str) -> None:
        self.lost[mid] = None
        if len(self.lost) > self.options.max_lost:
            del self.lost[next(iter(self.lost))]  # the one noted longest ago
        if self.repair is not None:
            self.repair.outgoing.remove(mid)

    def _bound_buffers(self, out: Output) -> None:
        """At most ``max_pending`` messages (``max_pending_bytes``) wait in the incoming
        buffer and ``max_missing`` dependencies are sought: past either, the oldest is given
        up as the timeout would (delivered without its dependencies; reported lost). Why: a
        peer naming up to 1,000 made-up ids a message filled both without end when no timeout
        was set (20,000 ids sought after 20 messages)."""
        opts = self.options
        while self.pending and (
            len(self.pending) > opts.max_pending or self._pending_bytes > opts.max_pending_bytes
        ):
            self._give_up(next(iter(self.pending)), out)
        if len(self.missing) > opts.max_missing:
            over = len(self.missing) - opts.max_missing
            self._lose([e for e, _ in itertools.islice(self.missing.values(), over)], out)

    def _wake(self, dep: str, stack: list[tuple[LogRecord, bytes]]) -> None:
        for pid in sorted(self._waiters.pop(dep, ())):
            p = self.pending.get(pid)
            if p is None:
                continue
            p.waiting.discard(dep)
            p.size -= WAITING_COST
            self._pending_bytes -= WAITING_COST
            if not p.waiting:
                del self.pending[pid]
                self._pending_bytes -= p.size
                stack.append((p.record, p.content))

    # -- time -------------------------------------------------------------------------------
    def tick(self, now: int | None = None) -> Output:
        """Periodic sweeps: lost dependencies, SDS-R responses, outgoing resends."""
        now = self._now(now)
        out = Output()
        timeout = self.options.timeout_for_lost_messages_ms
        if timeout:
            lost = []
            for entry, since in self.missing.values():
                if now - since <= timeout:
                    break  # insertion order is detection order
                lost.append(entry)
            if lost:
                self._lose(lost, out)
            # A message waiting longer than the timeout is delivered anyway (its absent
            # dependencies reported lost); this also breaks dependency cycles a peer forged.
            stuck = []
            for pid, pend in self.pending.items():
                if now - pend.received_at <= timeout:
                    break  # insertion order is arrival order
                stuck.append(pid)
            for pid in stuck:
                self._give_up(pid, out)
        if self.repair is not None:
            for entry in self.repair.responses_due(now, self._raw_size):
                logged = self.log.get(entry.message_id)
                if logged is None or logged.raw is None:
                    continue
                out.to_send.append(
                    Outgoing(logged.raw, logged.message_id, MessageKind.CONTENT, "repair")
                )
                out.events.append(RepairResponseSent(logged.message_id))
        for buf, period in (
            (self.unacked, self.options.resend_unacked_ms),
            (self.possibly_acked, self.options.resend_possibly_acked_ms),
        ):
            if not period:
                continue
            due = []
            for mid, u in buf.items():
                if u.last_sent + period > now:
                    break
                due.append(mid)
            for mid in due:
                u = buf.pop(mid)
                u.last_sent = now
                buf[mid] = u  # move to the end: dicts stay ordered by last send
                out.to_send.append(Outgoing(u.data, mid, MessageKind.CONTENT, "resend"))
        return out

    def repair_request_due(self, now: int | None = None) -> bool:
        """Spec "SDS-R Periodic Sync Message": a sync is due regardless of others' syncs when
        the outgoing repair buffer has an eligible entry."""
        if self.repair is None:
            return False
        due = self.repair.outgoing.next_due()
        return due is not None and due <= self._now(now)

    # -- views ------------------------------------------------------------------------------
    def log_ids(self) -> list[str]:
        return self.log.ids()

    def outgoing_ids(self) -> list[str]:
        return list(self.unacked) + list(self.possibly_acked)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        n, r = divmod(n, 36)
        s = digits[r] + s
        if not n:
            return s
