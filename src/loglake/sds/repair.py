"""SDS-R: repair request and response buffers, back-off timestamps and response groups.

Spec: specs/sds-scalable-data-sync.txt, "SDS Repair (SDS-R)". Where the spec leaves ``hash``
open this follows @waku/sds 0.0.8 (``src/message_channel/repair/utils.ts`` and ``repair.ts``):

- ``hash(x)`` = the first 8 bytes of SHA-256(UTF-8 x), big-endian, as an unsigned 64-bit int;
  ``hash(a, b)`` = ``hash(a + b)`` (plain concatenation, ``combinedHash``).
- ``T_req = now + hash(participant_id, message_id) % (T_max - T_min) + T_min``.
- ``T_resp = now + (hash(participant_id) XOR hash(sender_id)) * hash(message_id) % T_max``
  (the XOR of the hashed ids: @waku/sds notes this is "not per spec" since string ids have no
  XOR; the product is an exact big integer before the modulo).
- response group: with ``num_response_groups <= 1`` everyone responds; otherwise
  ``hash(participant_id, message_id) % n == hash(sender_id, message_id) % n``; an entry without
  ``sender_id`` gets no response.
- defaults ``T_min`` 30 s, ``T_max`` 120 s, one response group, 1,000 entries per buffer
  (``DEFAULT_REPAIR_CONFIG``); when a buffer is full the entry with the furthest timestamp is
  evicted (``buffers.ts``); an outgoing entry is put in at most one ``repair_request`` and then
  kept (marked requested) until the message arrives; at most 3 entries per message
  (``MAX_REPAIR_REQUESTS_PER_MESSAGE``).

Bounds on what others' requests make this participant send, which neither the spec nor
@waku/sds sets (@waku/sds answers every entry of every request): a message's first 3 entries
are answered (the spec's number for what a message carries; all still cancel our own), a
message rebroadcast less than ``T_min`` ago is not sent again, one requester has at most
``max_responses_per_requester`` responses, of at most ``max_response_bytes_per_requester``
bytes together, queued per ``T_min`` window, and at most ``max_response_bytes`` are
rebroadcast per ``T_min`` window whoever asked (the rest wait for the next window).

@waku/sds keeps its buffers as arrays it re-sorts on every insert; here each buffer is a dict
plus two heaps (earliest due first, for the sweep; furthest first, for the eviction), so insert,
evict, remove and sweep are O(log n) amortised.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from loglake.sds.messages import HistoryEntry

PARTICIPANTS_PER_RESPONSE_GROUP = 128  # spec "SDS-R global state"; repair.ts
MAX_REPAIR_REQUESTS_PER_MESSAGE = 3  # spec "SDS-R send message" (RECOMMEND 3); message_channel.ts


@dataclass(frozen=True, slots=True)
class RepairConfig:
    t_min_ms: int = 30_000  # repair.ts DEFAULT_REPAIR_CONFIG.tMin
    t_max_ms: int = 120_000  # repair.ts DEFAULT_REPAIR_CONFIG.tMax
    num_response_groups: int = 1  # repair.ts DEFAULT_REPAIR_CONFIG.numResponseGroups
    buffer_size: int = 1000  # repair.ts DEFAULT_REPAIR_CONFIG.bufferSize
    max_responses_per_requester: int = 30
    """Responses queued for one requester's requests per ``t_min_ms`` window (not in the spec
    nor @waku/sds, which answers them all). Why: each answered entry is a rebroadcast of a
    whole message (its bloom filter alone is 18,752 bytes with the defaults) for ~70 bytes of
    request; 143 KB of a member's requests had 5.3 MB rebroadcast. 30 is ten messages of the
    spec's 3 entries; honest peers in ``loglake sds sim`` runs without a store node (30% loss,
    partitions, participants offline for a third of the run) had at most 17 queued per
    window."""

    max_response_bytes_per_requester: int = 4 * 1024 * 1024
    """Bytes of the responses queued for one requester's requests per ``t_min_ms`` window (not
    in the spec nor @waku/sds). Why: the count above bounds answers, not bytes, and a message
    may be padded with an unknown protobuf field up to ``Limits.max_message_bytes`` (4 MiB, the
    default here: one such message a window): 30 answers were 120 MiB. An honest message is
    ~37 KB with @waku/sds's defaults, so the count binds first (30 are ~1.1 MB)."""
    max_response_bytes: int = 16 * 1024 * 1024
    """Bytes rebroadcast as repairs per ``t_min_ms`` window, whoever asked; a due response
    past it waits for the next window, one larger than it is never sent. Why: a requester id
    is any ``sender_id`` a member puts in a sync, so budgets per requester add up without
    bound: 13 KB of syncs from fresh ids had one participant rebroadcast 600 MiB of padded
    messages. 16 MiB is ~450 honest messages (~37 KB) a window; honest peers in
    ``loglake sds sim`` runs without a store node (30% loss, partitions, a third of them
    offline for a third of the run; 30-100 participants) sent at most 26 repairs in one."""

    def __post_init__(self) -> None:
        if self.t_max_ms <= self.t_min_ms or self.t_min_ms < 0:
            raise ValueError("SDS-R needs 0 <= T_min < T_max")
        if self.num_response_groups < 1 or self.buffer_size < 1:
            raise ValueError("num_response_groups and buffer_size must be >= 1")
        if self.max_responses_per_requester < 1:
            raise ValueError("max_responses_per_requester must be >= 1")
        if self.max_response_bytes_per_requester < 1 or self.max_response_bytes < 1:
            raise ValueError("max_response_bytes_per_requester and max_response_bytes must be >= 1")


def num_response_groups_for(num_participants: int) -> int:
    """Spec: ``num_participants div 128 + 1``. (@waku/sds's ``updateResponseGroups`` uses
    ``max(1, num_participants div 128)``, one group fewer from 256 participants on.)"""
    return num_participants // PARTICIPANTS_PER_RESPONSE_GROUP + 1


def hash64(text: str) -> int:
    """``hashToInteger`` of utils.ts."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def combined_hash(participant_id: str, message_id: str) -> int:
    return hash64(participant_id + message_id)


def t_req(participant_id: str, message_id: str, now: int, cfg: RepairConfig) -> int:
    return (
        now
        + combined_hash(participant_id, message_id) % (cfg.t_max_ms - cfg.t_min_ms)
        + (cfg.t_min_ms)
    )


def t_resp(
    participant_id: str, sender_id: str, message_id: str, now: int, cfg: RepairConfig
) -> int:
    distance = hash64(participant_id) ^ hash64(sender_id)
    return now + (distance * hash64(message_id)) % cfg.t_max_ms


def in_response_group(participant_id: str, sender_id: str | None, message_id: str, n: int) -> bool:
    if not sender_id:
        return False
    if n <= 1:
        return True
    return combined_hash(participant_id, message_id) % n == combined_hash(sender_id, message_id) % n


class _TimedBuffer:
    """Entries keyed by message id with a due time; sweep in (due, insertion) order.

    Both heaps are lazy: an entry removed, evicted or swept stays in them until it reaches a
    top or the heap is compacted (``_compact``, once it holds ``COMPACT_FACTOR`` times the
    buffer's size), so each stays within a constant of ``max_size``. Why: a full buffer found
    its furthest entry with ``max`` over every entry, and an evicted entry stayed in the sweep's
    heap until its due time: a member's messages, each with 1,000 made-up dependencies, cost
    0.6-1.6 s of CPU apiece once the outgoing buffer was full, and its heap grew by 1,000 entries
    a message while the clock stood still."""

    COMPACT_FACTOR = 2

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self.items: dict[str, tuple[int, int, HistoryEntry]] = {}  # id -> (due, seq, entry)
        self._heap: list[tuple[int, int, str]] = []  # (due, seq, id): the sweep's order
        self._furthest: list[tuple[int, int, str]] = []  # (-due, -seq, id): eviction's order
        self._seq = itertools.count()

    def __contains__(self, message_id: str) -> bool:
        return message_id in self.items

    def __len__(self) -> int:
        return len(self.items)

    def _live(self, seq: int, message_id: str) -> bool:
        item = self.items.get(message_id)
        return item is not None and item[1] == seq

    def add(self, entry: HistoryEntry, due: int) -> bool:
        if entry.message_id in self.items:
            return False  # buffers.ts: keep the original timestamp
        if len(self.items) >= self.max_size:
            self._evict_furthest()
        seq = next(self._seq)
        self.items[entry.message_id] = (due, seq, entry)
        heapq.heappush(self._heap, (due, seq, entry.message_id))
        heapq.heappush(self._furthest, (-due, -seq, entry.message_id))
        if len(self._heap) + len(self._furthest) > 2 * self.COMPACT_FACTOR * self.max_size + 64:
            self._compact()
        return True

    def _evict_furthest(self) -> None:
        """buffers.ts: the entry with the furthest timestamp goes (the latest put in of
        equals, as ``max`` over (due, seq) found it)."""
        while self._furthest:
            _due, neg_seq, mid = heapq.heappop(self._furthest)
            if self._live(-neg_seq, mid):
                del self.items[mid]
                return

    def _compact(self) -> None:
        """Each heap without its entries that are no longer live (an entry swept off the
        sweep's heap but kept in ``items``, as a requested one, does not come back)."""
        self._heap = [x for x in self._heap if self._live(x[1], x[2])]
        self._furthest = [x for x in self._furthest if self._live(-x[1], x[2])]
        heapq.heapify(self._heap)
        heapq.heapify(self._furthest)

    def remove(self, message_id: str) -> bool:
        return self.items.pop(message_id, None) is not None

    def _live_head(self) -> tuple[int, int, str] | None:
        heap = self._heap
        while heap:
            _due, seq, mid = heap[0]
            if self._live(seq, mid):
                return heap[0]
            heapq.heappop(heap)
        return None

    def pop_due(self, now: int, limit: int | None = None) -> list[HistoryEntry]:
        """Entries with due <= now, earliest first, taken off the heap (not out of ``items``)."""
        out: list[HistoryEntry] = []
        while limit is None or len(out) < limit:
            head = self._live_head()
            if head is None or head[0] > now:
                break
            heapq.heappop(self._heap)
            out.append(self.items[head[2]][2])
        return out

    def next_due(self) -> int | None:
        head = self._live_head()
        return None if head is None else head[0]


class OutgoingRepairBuffer(_TimedBuffer):
    """Missing entries this participant may ask for, due at ``T_req``."""

    def take_eligible(self, now: int, limit: int) -> list[HistoryEntry]:
        # Taken entries stay in ``items`` (requested, as buffers.ts marks them) until received.
        return self.pop_due(now, limit)


class IncomingRepairBuffer(_TimedBuffer):
    """Requested entries this participant may answer, due at ``T_resp``."""

    def take_ready(self, now: int) -> list[HistoryEntry]:
        ready = self.pop_due(now)
        for e in ready:
            del self.items[e.message_id]
        return ready


class RepairManager:
    """SDS-R state of one participant; pure (times are passed in)."""

    def __init__(self, participant_id: str, config: RepairConfig | None = None) -> None:
        self.participant_id = participant_id
        self.config = config or RepairConfig()
        self.outgoing = OutgoingRepairBuffer(self.config.buffer_size)
        self.incoming = IncomingRepairBuffer(self.config.buffer_size)
        self._answered: dict[str, int] = {}
        """message id -> when this participant last rebroadcast it (the newest
        ``buffer_size``): a request for it within ``t_min_ms`` of that is not answered."""
        self._requesters: OrderedDict[str, list[int]] = OrderedDict()
        """requester -> [start of its window, responses queued in it, their bytes], oldest
        window first, at most ``buffer_size`` (``max_responses_per_requester``,
        ``max_response_bytes_per_requester``). An ``OrderedDict``: it is
        swept from its oldest key, which a plain dict finds by skipping the slots its
        deletions left (under churn a new requester's request took 2.7 µs at the default 1,000
        windows, 10.4 at 10,000; 1.1 at either now)."""
        self._sent_since: int | None = None
        """Start of the current window of ``max_response_bytes``: the first sweep with a
        response due ``t_min_ms`` or more after the last window's start."""
        self._sent_bytes = 0
        """Bytes rebroadcast in that window."""

    def mark_missing(self, entries: list[HistoryEntry], now: int) -> list[tuple[str, int]]:
        """Queue missing dependencies; return (message_id, T_req) for each newly queued."""
        queued = []
        outgoing = self.outgoing.items
        for e in entries:
            if e.message_id in outgoing:
                continue  # queued already (add keeps the first T_req); no hash to compute
            due = t_req(self.participant_id, e.message_id, now, self.config)
            if self.outgoing.add(e, due):
                queued.append((e.message_id, due))
        return queued

    def mark_received(self, message_id: str) -> None:
        """Spec "SDS-R receive message": drop it from both buffers (request and response)."""
        self.outgoing.remove(message_id)
        self.incoming.remove(message_id)

    def repair_requests(
        self, now: int, limit: int = MAX_REPAIR_REQUESTS_PER_MESSAGE
    ) -> list[HistoryEntry]:
        return self.outgoing.take_eligible(now, limit)

    def on_repair_requests(
        self,
        requests: list[HistoryEntry],
        requester: str,
        sender_of: Callable[[str], str | None],
        now: int,
        answered: int | None = None,
        size_of: Callable[[str], int | None] | None = None,
    ) -> list[tuple[str, int]]:
        """Process a received ``repair_request`` from ``requester``; return (message_id, T_resp)
        newly queued. Every entry cancels our own request for it; only the first ``answered``
        (all if None) are answered. ``sender_of(id)``: who sent the message, where this
        participant can rebroadcast it, else None; ``size_of(id)``: its bytes (None: no byte
        budget).

        The spec computes ``T_resp`` and the response group from the ``sender_id`` the request
        names, which a peer may make up: naming this participant (distance 0) made it answer
        at once, every time, a request listing up to ``Limits.max_repair_request`` ids (38 KB
        of requests had 11 MB rebroadcast, measured). Here the sender is the one the message
        itself came from, and a message this participant rebroadcast less than ``t_min_ms``
        ago is not sent again (a peer that still lacks it asks again no sooner: its own
        ``T_req`` backoff is at least ``t_min_ms``). Past ``max_responses_per_requester`` in
        the requester's window the entries still cancel our own requests for them (spec: MUST)
        but are not answered; nor are those past ``max_response_bytes_per_requester`` (the spec
        says which requests to answer and when, not how many: the bounds are ours)."""
        queued = []
        cfg = self.config
        budget = self._requester_window(requester, now)
        for i, r in enumerate(requests):
            self.outgoing.remove(r.message_id)  # someone else asks: we need not
            if budget[1] >= cfg.max_responses_per_requester or (
                answered is not None and i >= answered
            ):
                continue
            sender = sender_of(r.message_id)
            if sender is None:
                continue
            size = (size_of(r.message_id) or 0) if size_of is not None else 0
            if budget[2] + size > cfg.max_response_bytes_per_requester:
                continue  # a smaller one further on may still fit
            last = self._answered.get(r.message_id)
            if last is not None and now - last < self.config.t_min_ms:
                continue
            if not in_response_group(
                self.participant_id, sender, r.message_id, self.config.num_response_groups
            ):
                continue
            due = t_resp(self.participant_id, sender, r.message_id, now, self.config)
            if self.incoming.add(HistoryEntry(r.message_id, r.retrieval_hint, sender), due):
                budget[1] += 1
                budget[2] += size
                queued.append((r.message_id, due))
        return queued

    def _requester_window(self, requester: str, now: int) -> list[int]:
        """The requester's [window start, responses queued]: a new window ``t_min_ms`` after
        the start of its last one. Windows that ended are forgotten first (they are oldest
        first); past ``buffer_size`` requesters the oldest window goes too (a peer that
        changes its ``sender_id`` for each request gets a new budget either way)."""
        windows = self._requesters
        t_min = self.config.t_min_ms
        while windows:
            oldest = next(iter(windows))
            if now - windows[oldest][0] < t_min and len(windows) < self.config.buffer_size:
                break
            del windows[oldest]
        window = windows.get(requester)
        if window is None:
            window = windows[requester] = [now, 0, 0]
        return window

    def responses_due(
        self, now: int, size_of: Callable[[str], int | None] | None = None
    ) -> list[HistoryEntry]:
        """Spec "SDS-R incoming repair request buffer sweep": the responses due (``T_resp <=
        now``), earliest first. With ``size_of`` (a message's bytes, None when it can no longer
        be sent), at most ``max_response_bytes`` a ``t_min_ms`` window: a due response past
        it is put back, due when the next window starts (another participant's answer may
        still cancel it meanwhile), and one larger than the whole budget is dropped, as is one
        that can no longer be sent. The spec sends every due response; the bound is ours."""
        ready = self.incoming.take_ready(now)
        if size_of is not None and ready:
            ready = self._within_byte_budget(ready, now, size_of)
        answered = self._answered
        for e in ready:
            answered.pop(e.message_id, None)
            answered[e.message_id] = now
        while len(answered) > self.config.buffer_size:
            del answered[next(iter(answered))]
        return ready

    def _within_byte_budget(
        self, ready: list[HistoryEntry], now: int, size_of: Callable[[str], int | None]
    ) -> list[HistoryEntry]:
        cfg = self.config
        if self._sent_since is None or now - self._sent_since >= cfg.t_min_ms:
            self._sent_since, self._sent_bytes = now, 0
        limit = cfg.max_response_bytes
        send = []
        for e in ready:
            size = size_of(e.message_id)
            if size is None or size > limit:
                continue
            if self._sent_bytes + size <= limit:
                self._sent_bytes += size
                send.append(e)
            else:
                self.incoming.add(e, self._sent_since + cfg.t_min_ms)
        return send
