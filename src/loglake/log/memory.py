"""A volatile ``Log`` held in process memory.

Why it exists: fast unit tests of the protocol parts, simulations that run thousands of nodes,
and ephemeral relays that need no durability. It follows every rule of ``loglake.log.api``
except that nothing survives the process (``durability`` is accepted and ignored).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from loglake.log.api import (
    Entry,
    Log,
    NotOwner,
    PartitionInfo,
    Record,
    StreamConfig,
    StreamExists,
    StreamInfo,
    UnknownPartition,
    UnknownStream,
    check_index,
    check_stream_name,
    check_timestamps,
)


class MemoryLog(Log):
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._configs: dict[str, StreamConfig] = {}
        self._parts: dict[str, list[list[Record]]] = {}
        self._first: dict[tuple[str, int], int] = {}
        self._consumers: dict[tuple[str, str, int], int] = {}
        self._owners: dict[tuple[str, str, int], str] = {}

    def create_stream(self, name: str, config: StreamConfig | None = None) -> StreamInfo:
        check_stream_name(name)
        with self._lock:
            if name in self._configs:
                existing = self._configs[name]
                if config is not None and config.partitions != existing.partitions:
                    raise StreamExists(
                        f"stream {name!r} exists with {existing.partitions} partitions, "
                        f"not {config.partitions}"
                    )
                return self.stream_info(name)
            config = config or StreamConfig()
            self._configs[name] = config
            self._parts[name] = [[] for _ in range(config.partitions)]
            for p in range(config.partitions):
                self._first[(name, p)] = 0
            return self.stream_info(name)

    def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        with self._lock:
            if name not in self._configs:
                raise UnknownStream(name)
            have = self._configs[name].partitions
            if partitions > have:
                self._configs[name] = replace(self._configs[name], partitions=partitions)
                self._parts[name] += [[] for _ in range(partitions - have)]
                for p in range(have, partitions):
                    self._first[(name, p)] = 0
            return self.stream_info(name)

    def streams(self) -> list[str]:
        with self._lock:
            return sorted(self._configs)

    def _partition(self, stream: str, partition: int) -> list[Record]:
        try:
            parts = self._parts[stream]
        except KeyError:
            raise UnknownStream(stream) from None
        if not 0 <= partition < len(parts):
            raise UnknownPartition(stream, partition, len(parts))
        return parts[partition]

    def stream_info(self, name: str) -> StreamInfo:
        with self._lock:
            if name not in self._configs:
                raise UnknownStream(name)
            infos = []
            for p, recs in enumerate(self._parts[name]):
                first = self._first[(name, p)]
                infos.append(
                    PartitionInfo(p, first, first + len(recs), sum(len(r.data) for r in recs))
                )
            return StreamInfo(name, self._configs[name], tuple(infos))

    def append_many(
        self, stream: str, entries: Sequence[Entry], *, partition: int = 0
    ) -> list[int]:
        check_timestamps(entries)
        with self._lock:
            recs = self._partition(stream, partition)
            nxt = self._first[(stream, partition)] + len(recs)
            out = []
            for e in entries:
                ts = e.timestamp_ns if e.timestamp_ns is not None else time.time_ns()
                recs.append(
                    Record(stream, partition, nxt, ts, e.key, tuple(e.headers), bytes(e.data))
                )
                out.append(nxt)
                nxt += 1
            return out

    def read(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        end: int | None = None,
        *,
        partition: int = 0,
    ) -> list[Record]:
        with self._lock:
            recs = self._partition(stream, partition)
            first = self._first[(stream, partition)]
            lo = max(start, first) - first
            hi = len(recs) if end is None else max(0, min(len(recs), end - first))
            if limit is not None:
                hi = min(hi, lo + max(0, limit))
            return recs[lo:hi] if lo < hi else []

    def get_index(self, client_id: str, stream: str, *, partition: int = 0) -> int | None:
        with self._lock:
            self._partition(stream, partition)
            return self._consumers.get((client_id, stream, partition))

    def consumer_indexes(self) -> dict[tuple[str, str, int], int]:
        with self._lock:
            return dict(self._consumers)

    def save_index(self, client_id: str, stream: str, index: int, *, partition: int = 0) -> int:
        check_index(index)
        with self._lock:
            self._partition(stream, partition)
            key = (client_id, stream, partition)
            stored = self._consumers.get(key)
            if stored is not None and index < stored:
                return stored  # monotonic: a lower save leaves the stored index
            self._consumers[key] = index
            return index

    def save_index_as(
        self,
        client_id: str,
        stream: str,
        index: int,
        owner: str,
        override: bool = False,
        *,
        partition: int = 0,
    ) -> int:
        check_index(index)
        with self._lock:
            self._partition(stream, partition)
            key = (client_id, stream, partition)
            had = self._owners.get(key)
            if had is not None and had != owner and not override:
                raise NotOwner(key, had, owner)
            if had is None and owner:
                self._owners[key] = owner
        return self.save_index(client_id, stream, index, partition=partition)

    def index_owner(self, client_id: str, stream: str, *, partition: int = 0) -> str | None:
        with self._lock:
            return self._owners.get((client_id, stream, partition))

    def reset_index(
        self, client_id: str, stream: str, index: int | None, *, partition: int = 0
    ) -> int | None:
        if index is not None:
            check_index(index)
        with self._lock:
            self._partition(stream, partition)
            key = (client_id, stream, partition)
            before = self._consumers.get(key)
            if index is None:
                self._consumers.pop(key, None)
                self._owners.pop(key, None)
            else:
                self._consumers[key] = index
            return before

    def truncate_before(self, stream: str, index: int, *, partition: int = 0) -> int:
        """Exact: every record below ``index`` goes (there is no lake to keep them)."""
        with self._lock:
            recs = self._partition(stream, partition)
            first = self._first[(stream, partition)]
            cut = max(0, min(len(recs), index - first))
            if cut:
                del recs[:cut]
                self._first[(stream, partition)] = first + cut
            return cut

    def enforce_retention(self, now_ns: int | None = None) -> int:
        now_ns = time.time_ns() if now_ns is None else now_ns
        dropped = 0
        with self._lock:
            for name, cfg in self._configs.items():
                for p, recs in enumerate(self._parts[name]):
                    cut = 0
                    if cfg.retention_records is not None:
                        cut = max(cut, len(recs) - cfg.retention_records)
                    if cfg.retention_ms is not None:
                        horizon = now_ns - cfg.retention_ms * 1_000_000
                        while cut < len(recs) and recs[cut].timestamp_ns < horizon:
                            cut += 1
                    if cfg.retention_bytes is not None:
                        total = sum(len(r.data) for r in recs[cut:])
                        while cut < len(recs) and total > cfg.retention_bytes:
                            total -= len(recs[cut].data)
                            cut += 1
                    if cut:
                        del recs[:cut]
                        self._first[(name, p)] += cut
                        dropped += cut
        return dropped
