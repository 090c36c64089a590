"""Cardinal consumer core: messages in any order, duplicated, from redundant producers → each
block exactly once, when it is complete.

Sans-I/O (DESIGN.md principle 1): ``receive(key, value, source, offset)`` or
``handle(message, source, offset)`` return what became complete; no clock, socket or thread.
``source`` names where a message came from (``topic:partition``) and ``offset`` its position
there, so the ordered layer can say where to resume.

Rules (spec "Batch/Consumers", "SubBatchHeader/Consumers", "SubBatchMsg/Consumers",
"BatchMsg/Consumers", "BatchDeleteMsg/Consumers", "Reorg/Consumers"; reference
``delivery/consumer.go: MessageProcessor.ProcessMessage``, ``PendingBatch.ApplyMessage``):

- a Batch starts tracking a block: its inline values/deletes, a counter per announced prefix,
  the sub-batches still expected. Messages for a block whose Batch has not arrived are queued
  by block hash and replayed when it does; SubBatchMsgs before their SubBatchHeader are queued
  in the block.
- a BatchMsg/BatchDeleteMsg whose key is already set is a duplicate and is discarded; otherwise
  it decrements the counter of the announced prefix the key starts with (the longest one; the
  reference walks ``/``-separated parents, which is the same for its prefixes).
- a SubBatchHeader seen before, a SubBatchMsg index seen before: discarded.
- tracked prefixes (regexes, searched like Go's ``MatchString``): Batch entries whose key no
  tracked regex matches are ignored, and so are their messages.
- a block is complete when every counter is zero, every SubBatchHeader arrived and every item
  of every sub-batch arrived (kept as one ``remaining`` integer, so each message is O(1)).
- completed hashes are remembered within the reorg window, so late duplicates are dropped;
  so are the hashes of blocks evicted or dropped as older than the window (the reference's
  ``oldBlocks``): their remaining messages are dropped on sight, never queued for a Batch that
  was already read (queued, they would hold their partitions' offsets back for good). A
  checkpoint carries these hashes (``done``) for the same reason across a restart.

Bounded memory, at all times: a pending block more than ``reorg_threshold`` below the window's
top (the chain head when an ordered layer drives ``advance``, else the highest completed
number) is evicted with a logged warning. Messages queued for a Batch not seen yet carry no
block number: at most ``max_queued`` are held, checked on every message queued (beyond it, the
oldest queued blocks' messages go, with a log line). SubBatchMsgs of a pending block that came
before their SubBatchHeader (which sets how many there are): at most ``max_queued`` in all too,
beyond which they are dropped with a log line (the block then completes only if another copy
comes, as for any message the window evicts). At most ``max_pending`` incomplete batches
are held (beyond it, the highest-numbered goes, and its sources are to be read again from its
first message: ``take_rewinds``), and at most ``max_done`` done hashes
(``max(8 * reorg_threshold + 16, MIN_DONE)``, the one noted longest ago goes first).
Protocol violations with well-formed bytes (index past ItemCount, a
SubBatchHeader or message for nothing announced, more messages than a prefix's count) are
logged and dropped; malformed bytes raise ``CardinalDecodeError`` from ``receive`` before any
state changes. Neither touches another block's state.

Deviation: the reference ignores a Batch value of zero length; an empty value is a value, so
it is kept here. The reference queues a BatchMsg for an untracked prefix forever; it is dropped
here.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import re
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loglake.cardinal.avro import decode_batch_or_none
from loglake.cardinal.blocks import Block, ReorgEvent
from loglake.cardinal.codec import MAX_AVRO_INT, decode
from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import (
    BATCH,
    BATCH_DELETE_MSG,
    BATCH_MSG,
    SUB_BATCH_HEADER,
    SUB_BATCH_MSG,
    ZERO_HASH,
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
from loglake.structured_logging import log_event

_Part = SubBatchHeader | SubBatchMsg | BatchMsg | BatchDeleteMsg
"""The messages that make up a block after its ``Batch``."""

log = logging.getLogger(__name__)

DEFAULT_REORG_THRESHOLD = 128  # the reference tests' ReorgThreshold
MAX_REORG_THRESHOLD = MAX_AVRO_INT
"""The deepest threshold a command takes (``cardinal consume/produce``, ``job
cardinal-blocks --reorg-threshold``): a Reorg message names its block by an Avro ``int``
(int32, ``codec.MAX_AVRO_INT``), so a reorg deeper than that cannot be told and a larger
threshold bounds nothing."""
DEFAULT_MAX_QUEUED = 100_000  # messages held for Batches not yet seen, before eviction starts
DEFAULT_MAX_PENDING = 10_000  # incomplete batches held at most (highest numbers go first)
MIN_DONE = 1_024
"""Done hashes remembered at least, whatever the threshold: a redundant producer's late copy
of a block, or a partition read ahead of the others, must find its hash still remembered;
beyond ``max(8 * reorg_threshold + 16, MIN_DONE)`` the hash noted longest ago goes."""


@dataclass(slots=True)
class _Pending:
    batch: Batch
    values: dict[str, bytes] = field(default_factory=dict)
    deletes: set[str] = field(default_factory=set)
    counters: dict[str, int] = field(default_factory=dict)
    lengths: list[int] | None = None
    """The distinct lengths of the ``counters`` prefixes, longest first, or None to scan them
    (``_lengths``, ``_prefix_of``)."""
    ignored: set[str] = field(default_factory=set)  # untracked prefixes / sub-batch keys
    ignored_batches: set[bytes] = field(default_factory=set)
    waiting_headers: set[bytes] = field(default_factory=set)
    items: dict[bytes, tuple[int, set[int]]] = field(default_factory=dict)
    """sub-batch id -> (ItemCount, indexes received): sparse, so a huge count costs nothing"""
    early_items: dict[tuple[bytes, int], SubBatchMsg] = field(default_factory=dict)
    remaining: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    seq: int = 0  # order of arrival among pending batches (``BlockAssembler._by_number``)
    raw: bytes | None = None  # the Batch's value as received, when it came as bytes
    conflicted: bool = False  # another Batch for this hash, with other contents, was seen


@dataclass(slots=True)
class ConsumerStats:
    messages: int = 0
    duplicates: int = 0
    dropped: int = 0
    ignored: int = 0
    evicted: int = 0
    blocks: int = 0
    conflicting: int = 0
    """Batches for a pending block whose contents differ from the Batch it was started from."""


SCAN_PREFIXES = 8
"""Up to this many prefixes a block, ``_longest_prefix`` scans them (the common block has one
or two: sorting their lengths cost the block job ~5% of its driver's CPU); more are looked up
by length."""


def _lengths(prefixes: Collection[str]) -> list[int] | None:
    """The distinct lengths of ``prefixes``, longest first (for ``_longest_prefix``); None for
    at most ``SCAN_PREFIXES`` of them (scanned)."""
    if len(prefixes) <= SCAN_PREFIXES:
        return None
    return sorted({len(p) for p in prefixes}, reverse=True)


def _longest_prefix(prefixes: dict[str, int], lengths: list[int] | None, key: str) -> str | None:
    """The longest of ``prefixes`` that ``key`` starts with (``lengths``: theirs, distinct,
    longest first, or None to scan a few), else None: looked up by length, as the reference
    looks its prefixes up in a map. Found from outside: a scan of every prefix of the block
    cost O(prefixes) a message, O(prefixes²) a block (schema ``acct/[0-9a-f]+/``, 4,000
    accounts in one block: 8.8 s)."""
    if lengths is None:
        best = None
        for p in prefixes:
            if key.startswith(p) and (best is None or len(p) > len(best)):
                best = p
        return best
    n = len(key)
    for length in lengths:
        if length <= n:
            p = key[:length]
            if p in prefixes:
                return p
    return None


def _note_offset(offsets: dict[str, int], source: str, offset: int) -> None:
    o = offsets.get(source)
    if o is None or offset < o:
        offsets[source] = offset


class BlockAssembler:
    """Assembles blocks from Cardinal messages; see the module docstring for the rules."""

    def __init__(
        self,
        reorg_threshold: int = DEFAULT_REORG_THRESHOLD,
        tracked_prefixes: Iterable[str] = (".*",),
        last_number: int | None = None,
        completed: Iterable[tuple[bytes, int]] = (),
        max_queued: int = DEFAULT_MAX_QUEUED,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.reorg_threshold = reorg_threshold
        patterns = list(tracked_prefixes)
        self._track_all = any(p in (".*", "") for p in patterns)
        self._tracked = [re.compile(p) for p in patterns]
        self._pending: dict[bytes, _Pending] = {}
        # Pending batches by number, highest first and lowest first, as (number, seq, hash):
        # lazy (an entry whose batch left ``_pending`` is skipped where it is met, and both are
        # compacted past twice ``_pending``'s size). Why: shedding and the window's eviction
        # scanned every pending batch, so each Batch past ``max_pending`` (10,000) cost 66x
        # an ordinary one (10,000 far-future Batches: 9.3 s instead of 0.14 s).
        self._highest: list[tuple[int, int, bytes]] = []
        self._lowest: list[tuple[int, int, bytes]] = []
        self._seq = itertools.count()
        self._early: dict[bytes, dict[tuple, tuple[Message, str, int]]] = {}
        # OrderedDicts where the oldest entry is taken: a plain dict finds its first entry by
        # skipping the slots of entries deleted before it, O(n) per call after many deletions
        # (measured: 250,000 queued messages took 14 s instead of 6 s).
        self._early_at: OrderedDict[bytes, int] = OrderedDict()
        self._early_offsets: dict[bytes, dict[str, int]] = {}
        self._queued = 0
        self._early_items = 0  # SubBatchMsgs held in pending blocks before their header
        self.max_queued = max_queued
        self.max_pending = max_pending
        self.max_done = max(8 * reorg_threshold + 16, MIN_DONE)
        self._completed: OrderedDict[bytes, int] = OrderedDict(completed)  # hash -> number
        self._high = last_number if last_number is not None else -1
        self._driven = False  # True once advance() sets the window from the chain head
        self._window_drops = 0  # Batches dropped as older than the window (``_start``)
        self.next_offsets: dict[str, int] = {}
        self.stats = ConsumerStats()
        self.batch_front: dict[str, int] = {}
        """Source -> number of the last new Batch read there: how far that source has read, in
        blocks (``StreamConsumer`` holds back sources read ahead while many batches wait)."""
        self._rewind: dict[str, int] = {}
        """Source -> lowest offset to read again: messages of pending batches shed over
        ``max_pending`` (``take_rewinds``)."""
        self._shed_at: OrderedDict[bytes, int] = OrderedDict()
        """Shed batch hash -> the window's top (``_high``) when it was shed to be read again;
        shed again at the same top (no progress since), it is dropped for good."""

    # -- input --------------------------------------------------------------------------------
    def receive(
        self, key: bytes, value: bytes, source: str = "", offset: int = -1
    ) -> list[Block | ReorgEvent]:
        """Decode and handle one message. ``CardinalDecodeError`` leaves all state as it was,
        except that ``offset`` counts as read (the message is skipped on resume)."""
        if offset >= 0 and offset >= self.next_offsets.get(source, 0):
            self.next_offsets[source] = offset + 1
        if len(key) >= 33 and key[0] <= BATCH_DELETE_MSG:
            # A copy of a block already complete (or of a Batch already tracked) is discarded
            # from its key alone: decoding its value could change nothing. A Batch copy whose
            # contents differ from the tracked one's is reported (``_conflict``).
            h = key[1:33]
            pb = self._pending.get(h) if key[0] == BATCH else None
            if h in self._completed or pb is not None:
                # Found from outside: equal Batches were reported as conflicting when their
                # bytes differed, and they do: the reference producer writes the ``updates``
                # map in Go's map order, which varies run to run (avro.py), so redundant
                # producers' copies differ. Where the bytes differ the contents are compared
                # (decoded first: a malformed copy raises, with the state as it was).
                if (
                    pb is not None
                    and pb.raw is not None
                    and pb.raw != value
                    and decode(key, value) != pb.batch
                ):
                    self._conflict(pb)
                self.stats.messages += 1
                self.stats.duplicates += 1
                return []
            out = self.handle(decode(key, value), source, offset)
            if key[0] == BATCH:
                pb = self._pending.get(h)
                if pb is not None:
                    pb.raw = bytes(value)  # what a later copy is compared with
            return out
        return self.handle(decode(key, value), source, offset)

    def note_offset(self, source: str, offset: int) -> None:
        """Count ``offset`` of ``source`` as read."""
        if offset >= 0 and offset + 1 > self.next_offsets.get(source, 0):
            self.next_offsets[source] = offset + 1

    def handle(self, msg: Message, source: str = "", offset: int = -1) -> list[Block | ReorgEvent]:
        self.stats.messages += 1
        if offset >= 0 and offset + 1 > self.next_offsets.get(source, 0):
            self.next_offsets[source] = offset + 1
        # Dispatch on ``type(msg) is`` (cheaper than isinstance on this per-message path); the
        # ``if TYPE_CHECKING`` asserts tell the type checker what each branch holds, at no cost.
        t = type(msg)
        if t is Reorg or t is ReorgComplete:
            if TYPE_CHECKING:
                assert isinstance(msg, Reorg | ReorgComplete)
            return [self._reorg(msg)]
        if t is Ping:
            self.stats.ignored += 1
            return []
        if TYPE_CHECKING:
            assert not isinstance(msg, Reorg | ReorgComplete | Ping)
        h = msg.hash
        if h in self._completed:
            self.stats.duplicates += 1
            return []
        pb = self._pending.get(h)
        if t is Batch:
            if TYPE_CHECKING:
                assert isinstance(msg, Batch)
            if pb is not None:
                if msg != pb.batch:
                    self._conflict(pb)
                self.stats.duplicates += 1
                return []
            return self._start(msg, source, offset)
        if TYPE_CHECKING:
            assert not isinstance(msg, Batch)
        if pb is None:
            self._queue(msg, source, offset)
            return []
        if offset >= 0:
            _note_offset(pb.offsets, source, offset)
        self._apply(pb, msg)
        if pb.remaining == 0:
            return [self._complete(pb)]
        return []

    # -- state transitions ---------------------------------------------------------------------
    def _tracks(self, key: str) -> bool:
        return self._track_all or any(rx.search(key) for rx in self._tracked)

    def _start(self, b: Batch, source: str, offset: int) -> list[Block | ReorgEvent]:
        if self._high >= 0 and b.number < self._high - self.reorg_threshold:
            # A block not seen before (not done, not pending), dropped: at WARNING the 1st, 2nd,
            # 4th, 8th... (a restart's or a late producer's backlog can be thousands). Found
            # from outside: at DEBUG only, a window pushed far ahead (a block numbered 10**12)
            # dropped every later block for good with nothing to see.
            self._window_drops += 1
            n = self._window_drops
            log_event(
                log,
                logging.WARNING if n & (n - 1) == 0 else logging.DEBUG,
                "dropping batch older than the reorg window",
                number=b.number,
                hash=b.hash.hex(),
                high=self._high,
                dropped_so_far=n,
            )
            self.stats.dropped += 1
            self._drop_early(b.hash)
            self._remember(b.hash, b.number)  # its other messages are dropped on sight too
            return []
        pb = _Pending(b)
        if offset >= 0:
            pb.offsets[source] = offset
        for k, rec in b.updates.items():
            if not self._tracks(k):
                if rec.count:
                    pb.ignored.add(k)
                if rec.subbatch != ZERO_HASH:
                    pb.ignored_batches.add(rec.subbatch)
                continue
            if rec.count > 0:
                pb.counters[k] = rec.count
                pb.remaining += rec.count
            elif rec.count < 0:
                log_event(
                    log,
                    logging.WARNING,
                    "negative prefix count ignored",
                    hash=b.hash.hex(),
                    prefix=k,
                    count=rec.count,
                )
            if rec.subbatch != ZERO_HASH and rec.subbatch not in pb.waiting_headers:
                pb.waiting_headers.add(rec.subbatch)
                pb.remaining += 1
            if rec.delete:
                pb.deletes.add(k)
            if rec.value or (not rec.count and not rec.delete and rec.subbatch == ZERO_HASH):
                pb.values[k] = rec.value
        pb.lengths = _lengths(pb.counters)
        if offset >= 0:
            self.batch_front[source] = b.number
        early_offsets = self._early_offsets.get(b.hash)
        if early_offsets:  # before a shed: its queued messages are read again with it
            for s, o in early_offsets.items():
                _note_offset(pb.offsets, s, o)
        self._pend(pb)
        if len(self._pending) > self.max_pending:
            self._shed_pending()
            if b.hash not in self._pending:  # it was the highest: its queued messages go too
                self._drop_early(b.hash)
                return []
        early = self._drop_early(b.hash)
        if early:
            for msg, _s, _o in early.values():
                self._apply(pb, msg)
        if pb.remaining == 0:
            return [self._complete(pb)]
        return []

    def _queue(self, msg: _Part, source: str, offset: int) -> None:
        h = msg.hash
        if isinstance(msg, BatchMsg):
            k: tuple = (3, msg.key)
        elif isinstance(msg, BatchDeleteMsg):
            k = (4, msg.key)
        elif isinstance(msg, SubBatchMsg):
            k = (2, msg.batch_id, msg.index)
        else:  # SubBatchHeader
            k = (1, msg.batch_id)
        q = self._early.get(h)
        if q is None:
            q = self._early[h] = {}
            self._early_at[h] = self._high
            self._early_offsets[h] = {}
        if k in q:
            self.stats.duplicates += 1
            return
        q[k] = (msg, source, offset)
        self._queued += 1
        if offset >= 0:
            _note_offset(self._early_offsets[h], source, offset)
        if self._queued > self.max_queued:
            self._shed_early()

    def _conflict(self, pb: _Pending) -> None:
        """A second Batch for a pending block, with other contents: the first one stays, as in
        the reference (``MessageProcessor`` keeps the first ``PendingBatch`` for a hash), and
        this is reported. Found from outside: a forged Batch (an honest block's hash, a count
        of 3 per prefix) sent before the honest one held the chain at that block for good,
        silently (``app head #5 of 300``). Keeping every candidate and completing whichever
        finishes first would need every message of the block kept (those the forged Batch
        dropped as under no prefix, too) to replay into a later candidate; so here the stall
        is made visible instead (an error line, ``stats.conflicting``, the CLI's summary)."""
        self.stats.conflicting += 1
        if pb.conflicted:
            return  # one error line a block: copies may come by the thousand
        pb.conflicted = True
        log_event(
            log,
            logging.ERROR,
            "conflicting Batch for a pending block: the first one is kept, the block may "
            "never complete if it was forged",
            hash=pb.batch.hash.hex(),
            number=pb.batch.number,
            remaining=pb.remaining,
        )

    def _drop(self, pb: _Pending, why: str, **fields: object) -> None:
        self.stats.dropped += 1
        log_event(
            log, logging.WARNING, why, hash=pb.batch.hash.hex(), number=pb.batch.number, **fields
        )

    def _prefix_of(self, pb: _Pending, key: str) -> str | None:
        return _longest_prefix(pb.counters, pb.lengths, key)

    def _count(self, pb: _Pending, key: str) -> bool:
        """Decrement the counter ``key`` falls under; False if the message must be dropped."""
        p = self._prefix_of(pb, key)
        if p is None:
            if any(key.startswith(i) for i in pb.ignored):
                self.stats.ignored += 1
            else:
                self._drop(pb, "message for a key under no announced prefix", key=key)
            return False
        if pb.counters[p] == 0:
            self._drop(pb, "more messages than the prefix count announced", key=key, prefix=p)
            return False
        pb.counters[p] -= 1
        pb.remaining -= 1
        return True

    def _apply(self, pb: _Pending, msg: Message) -> None:
        if type(msg) is BatchMsg:
            if msg.key in pb.values:
                self.stats.duplicates += 1
            elif self._count(pb, msg.key):
                pb.values[msg.key] = msg.value
        elif isinstance(msg, BatchDeleteMsg):
            if msg.key in pb.deletes:
                self.stats.duplicates += 1
            elif self._count(pb, msg.key):
                pb.deletes.add(msg.key)
        elif isinstance(msg, SubBatchMsg):
            items = pb.items.get(msg.batch_id)
            if items is None:
                if msg.batch_id in pb.waiting_headers:
                    if (msg.batch_id, msg.index) in pb.early_items:
                        self.stats.duplicates += 1
                    elif self._early_items >= self.max_queued:
                        self._drop(
                            pb,
                            "too many SubBatchMsgs held before their SubBatchHeader",
                            batch_id=msg.batch_id.hex(),
                            held=self._early_items,
                        )
                    else:
                        pb.early_items[(msg.batch_id, msg.index)] = msg
                        self._early_items += 1
                elif msg.batch_id in pb.ignored_batches:
                    self.stats.ignored += 1
                else:
                    self._drop(
                        pb,
                        "SubBatchMsg for a sub-batch the Batch did not announce",
                        batch_id=msg.batch_id.hex(),
                    )
                return
            count, received = items
            if msg.index >= count:
                self._drop(
                    pb,
                    "SubBatchMsg index past ItemCount",
                    batch_id=msg.batch_id.hex(),
                    index=msg.index,
                    item_count=count,
                )
                return
            if msg.index in received:
                self.stats.duplicates += 1
                return
            received.add(msg.index)
            pb.deletes.update(msg.deletes)
            pb.values.update(msg.updates)
            pb.remaining -= 1
        elif isinstance(msg, SubBatchHeader):
            bid = msg.batch_id
            if bid in pb.waiting_headers:
                pb.waiting_headers.discard(bid)
                pb.items[bid] = (msg.item_count, set())
                pb.remaining += msg.item_count - 1
                early = [m for (b, _i), m in pb.early_items.items() if b == bid]
                self._early_items -= len(early)
                for m in early:
                    del pb.early_items[(bid, m.index)]
                    self._apply(pb, m)
            elif bid in pb.items:
                self.stats.duplicates += 1
            elif bid in pb.ignored_batches:
                self.stats.ignored += 1
            else:
                self._drop(
                    pb,
                    "SubBatchHeader for a sub-batch the Batch did not announce",
                    batch_id=bid.hex(),
                )

    def _complete(self, pb: _Pending) -> Block:
        b = pb.batch
        del self._pending[b.hash]
        self._remember(b.hash, b.number)
        self.stats.blocks += 1
        if not self._driven and b.number > self._high:
            self._high = b.number
            self._evict()
        return Block(b.number, b.hash, b.parent, b.weight, pb.values, pb.deletes, pb.offsets)

    def advance(self, head_number: int) -> None:
        """Measure the window from the chain head (the ordered layer calls this): a block the
        chain still needs is then never evicted just because later blocks completed first."""
        self._driven = True
        if head_number > self._high:
            self._high = head_number
            self._evict()

    def _pend(self, pb: _Pending) -> None:
        pb.seq = seq = next(self._seq)
        n, h = pb.batch.number, pb.batch.hash
        self._pending[h] = pb
        heapq.heappush(self._highest, (-n, seq, h))
        heapq.heappush(self._lowest, (n, seq, h))
        if len(self._highest) + len(self._lowest) > 4 * len(self._pending) + 64:
            self._highest = [e for e in self._highest if self._is_pending(e[1], e[2])]
            self._lowest = [e for e in self._lowest if self._is_pending(e[1], e[2])]
            heapq.heapify(self._highest)
            heapq.heapify(self._lowest)

    def _is_pending(self, seq: int, h: bytes) -> bool:
        pb = self._pending.get(h)
        return pb is not None and pb.seq == seq

    def _shed_pending(self) -> None:
        """Over ``max_pending``: drop the incomplete batch with the highest number (a producer
        announcing far-future blocks must not grow memory without bound); of equals, the one
        that came first."""
        while True:
            _n, seq, h = heapq.heappop(self._highest)
            if self._is_pending(seq, h):
                break
        pb = self._unpend(h)
        self.stats.evicted += 1
        number = pb.batch.number
        if (
            pb.offsets
            and self._shed_at.get(h) != self._high
            and number <= self._high + 2 * self.max_pending
        ):
            # Found from outside: an honest backlog where one topic carries ten times the
            # messages a block of the Batch topic ran the Batch partitions thousands of blocks
            # ahead; the Batches shed here were read and forgotten, their other messages then
            # queued for good, and the consumer stopped (head #11105 of #12999). Now what it
            # read of the block is read again: its sources go back to their lowest offset
            # (``take_rewinds``), committed offsets too. Not a far-future Batch (no honest
            # block is that far ahead of a window this many batches wide), nor one shed again
            # before the window moved (a flood of forged Batches would be read over and over).
            self._shed_at[h] = self._high
            self._shed_at.move_to_end(h)
            while len(self._shed_at) > self.max_pending:
                self._shed_at.popitem(last=False)
            for s, o in pb.offsets.items():
                _note_offset(self._rewind, s, o)
                if o < self.next_offsets.get(s, o):
                    self.next_offsets[s] = o
            log_event(
                log,
                logging.WARNING,
                "too many incomplete batches: dropping the highest, to be read again",
                hash=h.hex(),
                number=number,
                pending=len(self._pending),
                rewind=dict(pb.offsets),
            )
            return
        log_event(
            log,
            logging.WARNING,
            "too many incomplete batches: dropping the highest",
            hash=h.hex(),
            number=number,
            pending=len(self._pending),
        )

    def take_rewinds(self) -> dict[str, int]:
        """Sources to read again from an earlier offset (source -> offset), cleared: the
        messages of the pending batches shed since the last call (``_shed_pending``). Their
        committed offsets (``next_offsets``) went back there already."""
        out, self._rewind = self._rewind, {}
        return out

    @property
    def rewinds(self) -> bool:
        """Whether ``take_rewinds`` has anything."""
        return bool(self._rewind)

    def knows(self, hash_: bytes) -> bool:
        """Whether block ``hash_``'s Batch was read: it is pending or done."""
        return hash_ in self._pending or hash_ in self._completed

    def remember_done(self, h: bytes, number: int) -> None:
        """Note block ``h`` as done: its messages are dropped on sight (``_remember``)."""
        self._remember(h, number)

    def forget_done(self, h: bytes) -> None:
        """Assemble block ``h`` again (a reorg channel re-sends it: ``OrderedConsumer``)."""
        self._completed.pop(h, None)

    def _remember(self, h: bytes, number: int) -> None:
        """Note ``h`` as done (complete, or too old to assemble): its messages are dropped on
        sight. Bounded: over the cap, the hash noted longest ago goes (a dict keeps insertion
        order). By age of noting, not block number: a redundant producer's late copy of an old
        block arrives together, so its Batch is noted just before its other messages come."""
        self._completed[h] = number
        if len(self._completed) > self.max_done:
            self._completed.popitem(last=False)

    def _shed_early(self) -> None:
        """Over ``max_queued`` messages waiting for a Batch: drop whole blocks' queues, oldest
        queued first (``_early_at`` keeps insertion order: O(1) per message), until
        under the cap. Memory stays bounded whatever a producer sends; a block that loses its
        queue here completes only if another copy of those messages comes, as for any message
        the window evicts."""
        while self._queued > self.max_queued and self._early_at:
            h = next(iter(self._early_at))  # OrderedDict: O(1)
            q = self._drop_early(h)
            self.stats.evicted += 1
            log_event(
                log,
                logging.INFO,  # mostly late copies from a redundant producer
                "evicting messages whose Batch never came",
                hash=h.hex(),
                messages=len(q or ()),
                high=self._high,
            )

    def _evict(self) -> None:
        floor = self._high - self.reorg_threshold
        below: list[tuple[int, bytes]] = []
        while self._lowest and self._lowest[0][0] < floor:
            _n, seq, h = heapq.heappop(self._lowest)
            if self._is_pending(seq, h):
                below.append((seq, h))
        for _seq, h in sorted(below):  # in order of arrival, as they are remembered
            pb = self._unpend(h)
            # Remembered like the reference's ``oldBlocks``: the rest of its messages are
            # dropped on sight instead of queued for a Batch that was already read (queued,
            # they would hold their partitions' offsets back for good).
            self._remember(h, pb.batch.number)
            self.stats.evicted += 1
            log_event(
                log,
                logging.WARNING,
                "evicting incomplete batch older than the reorg window",
                hash=h.hex(),
                number=pb.batch.number,
                remaining=pb.remaining,
                high=self._high,
            )

    def _unpend(self, h: bytes) -> _Pending:
        """Pending block ``h`` dropped before it completed, with the SubBatchMsgs it held."""
        pb = self._pending.pop(h)
        self._early_items -= len(pb.early_items)
        return pb

    def _drop_early(self, h: bytes) -> dict | None:
        q = self._early.pop(h, None)
        self._early_at.pop(h, None)
        self._early_offsets.pop(h, None)
        if q:
            self._queued -= len(q)
        return q

    def _reorg(self, msg: Reorg | ReorgComplete) -> ReorgEvent:
        if isinstance(msg, Reorg):
            # Reference MessageProcessor: forget completed blocks so the reorg channel's batches
            # are assembled again, and measure the window from the ancestor.
            self._completed.clear()
            self._high = msg.number
            return ReorgEvent(msg.number, msg.hash, complete=False)
        return ReorgEvent(msg.number, msg.hash, complete=True)

    # -- introspection ------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def early_items(self) -> int:
        """SubBatchMsgs held in pending blocks whose SubBatchHeader has not come."""
        return self._early_items

    def done(self) -> dict[bytes, int]:
        """Blocks whose messages are dropped on sight (complete, or too old): hash -> number.
        A checkpoint carries them, so a restarted consumer drops the messages of blocks whose
        Batch lies before its offsets instead of queueing them for good."""
        return dict(self._completed)

    def held_offsets(self) -> dict[str, int]:
        """Lowest offset per source of any message of a block not yet complete."""
        out: dict[str, int] = {}
        for pb in self._pending.values():
            for s, o in pb.offsets.items():
                _note_offset(out, s, o)
        for offs in self._early_offsets.values():
            for s, o in offs.items():
                _note_offset(out, s, o)
        return out

    def why_not_ready(self, hash_: bytes) -> str:
        pb = self._pending.get(hash_)
        if pb is None:
            return "complete" if hash_ in self._completed else "unknown"
        if pb.waiting_headers:
            return f"{len(pb.waiting_headers)} SubBatchHeader(s) missing"
        for p, c in pb.counters.items():
            if c:
                return f"{c} message(s) missing under prefix {p!r}"
        return f"{pb.remaining} sub-batch item(s) missing"


# -- one block at a time (for a Spark stateful operator keyed by block hash) -------------------

_FEED_ORDER = {BATCH: 0, SUB_BATCH_HEADER: 1, BATCH_MSG: 2, BATCH_DELETE_MSG: 2, SUB_BATCH_MSG: 3}
"""Batch first, then headers, then the rest: every message then meets the state it needs, so a
message the rules drop is the one that caused the drop (nothing is queued behind it)."""


class _ReportingAssembler(BlockAssembler):
    """A ``BlockAssembler`` that remembers why it last dropped a message."""

    problem: str | None = None

    def _drop(self, pb: _Pending, why: str, **fields: object) -> None:
        super()._drop(pb, why, **fields)
        detail = ", ".join(f"{k}={v}" for k, v in fields.items())
        self.problem = f"{why} ({detail})" if detail else why


@dataclass(frozen=True, slots=True)
class AssembledBlock:
    """What ``assemble_block`` made of one block's messages."""

    block: Block | None
    """The block, once complete; None while messages are missing."""
    kept: list[tuple[bytes, bytes, str, int]]
    """The messages to hold until more arrive (unique by key, rejected ones left out)."""
    rejected: list[tuple[str, int, str]]
    """(source, offset, reason) of messages that do not decode or that the rules drop."""


def assemble_block(
    messages: Iterable[tuple[bytes, bytes, str, int]],
    tracked_prefixes: Iterable[str] = (".*",),
) -> AssembledBlock:
    """Assemble one block from all its messages seen so far, ``(key, value, source, offset)``,
    with ``BlockAssembler``'s rules (a fresh one; no window: the caller bounds memory).

    Pure and order-independent: copies of a key with the same value are one message (the
    lowest ``(source, offset)``), and messages are fed Batch first, then SubBatchHeaders, then
    the rest, in key order. Where copies of a key differ (a corrupt or forged one beside the
    producers' own), they are tried lowest ``(source, offset)`` first until one is accepted,
    as ``BlockAssembler`` accepts the first good copy it receives: the bad one is a reject, and
    it does not hide the good one. Made for a stateful operator keyed by block hash (``loglake
    job cardinal-blocks``) that keeps ``kept`` as its state until ``block`` is set."""
    asm = _ReportingAssembler(2**62, tracked_prefixes, max_queued=2**62, max_pending=2**62)
    return _assemble_on(asm, messages, tracked_prefixes)


def assemble_blocks(
    groups: Iterable[Iterable[tuple[bytes, bytes, str, int]]],
    tracked_prefixes: Iterable[str] = (".*",),
) -> list[AssembledBlock]:
    """``[assemble_block(g, tracked_prefixes) for g in groups]``, each group the messages of
    a different block, through one assembler instead of a fresh one a block.

    Why: building a ``BlockAssembler`` (its tables, its compiled prefixes) cost about a tenth of
    assembling a small block. Sharing one changes nothing: its state is kept per block hash, and
    a fresh one's only state across blocks is the window — ``_high`` is set from the chain head
    instead (``_driven``) and stays -1, so no Batch is ever below the window, as for a fresh one,
    whose window is 2**62 blocks wide anyway."""
    tracked = tuple(tracked_prefixes)
    asm = _ReportingAssembler(2**62, tracked, max_queued=2**62, max_pending=2**62)
    asm._driven = True
    track_all = asm._track_all
    out = []
    for g in groups:
        g = list(g)
        done = _assemble_simple(g) if track_all else None
        out.append(done if done is not None else _assemble_on(asm, g, tracked))
    return out


def _assemble_simple(messages: list[tuple[bytes, bytes, str, int]]) -> AssembledBlock | None:
    """``assemble_block`` of the common block, straight to the ``Block``: a Batch whose
    entries are inline values, deletes and prefix counts (no sub-batch, no negative count),
    then BatchMsgs that each fall under an announced prefix and together make every count
    exactly, each key with one value (copies of it are one message, the lowest (source,
    offset)), every prefix tracked. None for anything else — a missing or extra message, a
    BatchDeleteMsg or sub-batch, a Batch that does not decode, two values for one key —
    which then goes through ``BlockAssembler`` message by message.

    Why: at one update a block, feeding two messages through ``receive``/``handle``/``_start``
    /``_apply``/``_complete`` cost several times building the block directly. The steps are
    those of ``BlockAssembler`` in its feed order (Batch, then keys in order), so the block,
    its offsets and ``kept`` are the same; ``tests/cardinal/test_assemble_blocks.py`` holds
    the two equal."""
    best: dict[bytes, tuple[bytes, bytes, str, int]] = {}
    for m in messages:
        prev = best.get(m[0])
        if prev is None:
            best[m[0]] = m
        elif prev[1] != m[1]:
            return None  # copies that differ: the reference tries them one by one
        elif (m[2], m[3]) < (prev[2], prev[3]):
            best[m[0]] = m
    head: tuple[bytes, bytes, str, int] | None = None
    parts: list[tuple[bytes, bytes, str, int]] = []
    for k, m in best.items():
        if m[3] < 0:
            return None  # no offset: the reference notes none
        if k[0] == BATCH and head is None:
            head = m
        elif k[0] == BATCH_MSG and len(k) >= 33:
            parts.append(m)
        else:
            return None
    if head is None or len(head[0]) != 33:
        return None  # no Batch, or a key ``decode`` refuses
    got = decode_batch_or_none(head[1])
    if got is None or len(got[1]) > 32:
        return None  # ``decode`` judges (and words) what does not decode
    number, weight, parent, updates = got
    values: dict[str, bytes] = {}
    deletes: set[str] = set()
    counters: dict[str, int] = {}
    remaining = 0
    for key, rec in updates.items():  # as ``_start`` with every prefix tracked
        if rec.count < 0 or rec.subbatch != ZERO_HASH:
            return None
        if rec.count > 0:
            counters[key] = rec.count
            remaining += rec.count
        if rec.delete:
            deletes.add(key)
        if rec.value or (not rec.count and not rec.delete):
            values[key] = rec.value
    if remaining != len(parts):
        return None  # incomplete, or more messages than announced
    offsets = {head[2]: head[3]}
    lengths = _lengths(counters)
    parts.sort(key=lambda m: m[0])
    for k, v, source, offset in parts:  # as ``_apply`` of a BatchMsg
        text = k[33:].decode("utf-8", "surrogateescape")
        if text in values:
            return None  # a duplicate of an inline value: kept, not counted
        best_p = _longest_prefix(counters, lengths, text)
        if best_p is None or counters[best_p] == 0:
            return None
        counters[best_p] -= 1
        values[text] = bytes(v)
        o = offsets.get(source)
        if o is None or offset < o:
            offsets[source] = offset
    block = Block(
        number, head[0][1:], parent, int.from_bytes(weight, "big"), values, deletes, offsets
    )
    return AssembledBlock(block, [head, *parts], [])


def _assemble_on(
    asm: _ReportingAssembler,
    messages: Iterable[tuple[bytes, bytes, str, int]],
    tracked_prefixes: Iterable[str],
) -> AssembledBlock:
    """``assemble_block``'s body on ``asm``, which holds no state for this block yet."""
    # key → value → its lowest copy: the copies of a key to try, lowest first
    tries: dict[bytes, dict[bytes, tuple[bytes, bytes, str, int]]] = {}
    for m in sorted(messages, key=lambda m: (m[2], m[3])):
        tries.setdefault(m[0], {}).setdefault(m[1], m)
    kept: list[tuple[bytes, bytes, str, int]] = []
    rejected: list[tuple[str, int, str]] = []
    block: Block | None = None
    ordered = sorted(tries, key=lambda k: (_FEED_ORDER.get(k[0], 4), k))
    for i, key in enumerate(ordered):
        if block is not None:
            # The block was complete without these: each is judged alone against the Batch and
            # headers, so an extra one is rejected whatever order the keys sort in.
            rejected += _extras(
                [next(iter(tries[k].values())) for k in ordered[i:]],
                [k for k in kept if k[0][0] <= SUB_BATCH_HEADER],
                tracked_prefixes,
            )
            break
        for m in tries[key].values():
            _, value, source, offset = m
            try:
                out = asm.receive(key, value, source, offset)
            except CardinalDecodeError as e:
                rejected.append((source, offset, str(e)))
                continue
            if asm.problem is not None:
                rejected.append((source, offset, asm.problem))
                asm.problem = None
                continue
            kept.append(m)
            for ev in out:
                if isinstance(ev, Block):
                    block = ev
            break  # accepted: the other copies of the key are duplicates
    return AssembledBlock(block, kept, rejected)


def _extras(
    extras: list[tuple[bytes, bytes, str, int]],
    heads: list[tuple[bytes, bytes, str, int]],
    tracked_prefixes: Iterable[str],
) -> list[tuple[str, int, str]]:
    """Reasons for messages a complete block did not need (ignored prefixes and copies of a
    value it has pass)."""
    out = []
    for key, value, source, offset in extras:
        probe = _ReportingAssembler(2**62, tracked_prefixes, max_queued=2**62, max_pending=2**62)
        for h in heads:
            probe.receive(*h)
        before = (probe.stats.ignored, probe.stats.duplicates)
        try:
            probe.receive(key, value, source, offset)
        except CardinalDecodeError as e:
            out.append((source, offset, str(e)))
            continue
        if probe.problem is not None:
            out.append((source, offset, probe.problem))
        elif (probe.stats.ignored, probe.stats.duplicates) == before:
            out.append(
                (source, offset, "more messages than the Batch and SubBatchHeaders announced")
            )
    return out
