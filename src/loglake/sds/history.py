"""The local log: message records ordered by (lamport timestamp, message id).

Spec: "Participant state" (a local log ordered by Lamport timestamp), "Deliver Message" and
"Resolve Conflicts" (same timestamp → ascending message id). @waku/sds 0.0.8
(``mem_local_history.ts``) re-sorts the whole array on every push, keyed by the string
``<lamport padded to 16 digits>_<message id>`` compared with ``localeCompare``; for lamport values
below 10^16 and lowercase-hex ids (what ``getMessageId`` makes) that is the (lamport, id) order
used here. Records arrive nearly in order, so inserting with ``bisect`` on a key list is an
append in the common case (amortised O(1) moves) and O(log n) to find the spot.

Each record keeps what SDS-R needs to answer a repair ("Augmented local history log": the full
message, here its original bytes, for the newest ``raw_cache`` messages, at most
``raw_cache_bytes`` of them) and its causal-history encoding (so a send concatenates cached
bytes).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from loglake.sds.codec import encode_history_entry
from loglake.sds.messages import HistoryEntry


@dataclass(slots=True)
class LogRecord:
    lamport_timestamp: int
    message_id: str
    sender_id: str
    retrieval_hint: bytes | None
    raw: bytes | None  # the message as received/sent, while in the repair cache
    entry_bytes: bytes = b""

    def __post_init__(self) -> None:
        self.entry_bytes = encode_history_entry(self.entry())

    def entry(self) -> HistoryEntry:
        return HistoryEntry(self.message_id, self.retrieval_hint, self.sender_id)


class LocalLog:
    def __init__(
        self, tail: int = 200, raw_cache: int = 1000, raw_cache_bytes: int = 64 * 1024 * 1024
    ) -> None:
        self._keys: list[tuple[int, str]] = []
        self.records: dict[str, LogRecord] = {}
        # Original bytes are kept for the newest ``raw_cache`` inserted messages only: SDS-R is
        # for recent gaps (spec: "repairing relatively recent missed dependencies"), and a
        # message is ~37 KB with @waku/sds's defaults (most of it the bloom filter). They are
        # at most ``raw_cache_bytes`` together (the oldest go first), and a message longer
        # than that is not kept at all. Why: a count alone let a member's messages, padded
        # with an unknown protobuf field to ``Limits.max_message_bytes`` (4 MiB, valid, and
        # delivered), hold ~4 GiB in every participant's 1,000 entries.
        self.raw_cache = raw_cache
        self.raw_cache_bytes = raw_cache_bytes
        self._raw_order: deque[tuple[str, int]] = deque()  # (message id, bytes), oldest first
        self.raw_bytes = 0
        """Bytes of the messages whose ``raw`` is kept."""
        # The encoded causal history of the newest ``tail`` records, kept incrementally: an
        # append drops the oldest entry from the front (O(1) on a bytearray) and adds one.
        self.tail = tail
        self._tail = bytearray()
        self._tail_ids: deque[tuple[str, int]] = deque()  # (message id, encoded length)
        self._tail_valid = True

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, message_id: str) -> bool:
        return message_id in self.records

    def get(self, message_id: str) -> LogRecord | None:
        return self.records.get(message_id)

    def raw(self, message_id: str) -> bytes | None:
        rec = self.records.get(message_id)
        return None if rec is None else rec.raw

    def insert(self, rec: LogRecord) -> bool:
        """Insert in order; False if the id is already there (the first one stays)."""
        if rec.message_id in self.records:
            return False
        key = (rec.lamport_timestamp, rec.message_id)
        keys = self._keys
        self.records[rec.message_id] = rec
        if rec.raw is not None:
            size = len(rec.raw)
            if size > self.raw_cache_bytes:
                rec.raw = None  # would evict every other one and still not fit
            else:
                order = self._raw_order
                order.append((rec.message_id, size))
                self.raw_bytes += size
                while len(order) > self.raw_cache or self.raw_bytes > self.raw_cache_bytes:
                    old_id, old_size = order.popleft()
                    self.raw_bytes -= old_size
                    old = self.records.get(old_id)
                    if old is not None:
                        old.raw = None
        if not keys or keys[-1] < key:
            keys.append(key)
            if self._tail_valid and self.tail > 0:
                if len(self._tail_ids) >= self.tail:
                    _, n = self._tail_ids.popleft()
                    del self._tail[:n]
                self._tail += rec.entry_bytes
                self._tail_ids.append((rec.message_id, len(rec.entry_bytes)))
        else:
            bisect.insort(keys, key)
            if self.tail > 0 and key >= keys[max(0, len(keys) - self.tail)]:
                self._tail_valid = False
        return True

    def set_hint(self, message_id: str, hint: bytes | None) -> None:
        rec = self.records[message_id]
        old = rec.entry_bytes
        rec.retrieval_hint = hint
        rec.entry_bytes = encode_history_entry(rec.entry())
        if self._tail_valid and self._tail_ids and self._tail_ids[-1][0] == message_id:
            del self._tail[len(self._tail) - len(old) :]
            self._tail += rec.entry_bytes
            self._tail_ids[-1] = (message_id, len(rec.entry_bytes))
        elif any(mid == message_id for mid, _ in self._tail_ids):
            self._tail_valid = False

    def _rebuild_tail(self) -> None:
        recs = [self.records[k[1]] for k in self._keys[-self.tail :]] if self.tail > 0 else []
        self._tail = bytearray(b"".join(r.entry_bytes for r in recs))
        self._tail_ids = deque((r.message_id, len(r.entry_bytes)) for r in recs)
        self._tail_valid = True

    def last(self, n: int) -> list[LogRecord]:
        recs = self.records
        return [recs[k[1]] for k in self._keys[-n:]] if n > 0 else []

    def causal_history_bytes(self, n: int | None = None) -> bytes | bytearray:
        """The encoded ``causal_history`` of a new message: the newest ``n`` entries, oldest
        first (message_channel.ts: ``localHistory.slice(-causalHistorySize)``)."""
        if n is None or n == self.tail:
            if not self._tail_valid:
                self._rebuild_tail()
            return self._tail
        recs = self.records
        return b"".join([recs[k[1]].entry_bytes for k in self._keys[-n:]]) if n > 0 else b""

    def ids(self) -> list[str]:
        """Message ids in log order."""
        return [k[1] for k in self._keys]
