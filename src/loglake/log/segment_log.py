"""``SegmentLog``: the embedded, crash-safe ``Log`` on local files.

Layout under ``data_dir``::

    LOCK                                   flock'ed by the one writer process
    consumers.log                          consumer indexes (consumer_store.py)
    streams/<stream>/config.json           the stream's StreamConfig (temp + fsync + rename)
    streams/<stream>/<p>/<first:020d>.seg  segment files of partition p (segment.py)
    streams/<stream>/<p>/<first:020d>.idx  their sparse indexes (sparse_index.py)
    lake/<stream>/partition=<p>/<first>-<last>.parquet   sealed history (lake.py, lake_schema.py)

A stream exists once its ``config.json`` does; ``create_stream`` writes only its folder and
that file (a failure removes the folder again), and a partition's folder is made when the
partition is first opened. Partitions open on first use and at most ``max_open_partitions`` are
open at once (least recently used closed first), so the descriptors a log holds are bounded
whatever the number of partitions on disk; ``max_partitions_per_stream`` and
``max_partitions_total`` bound what ``create_stream`` accepts (``QuotaExceeded``).

``readonly=True`` is for other processes reading a data dir a writer is using (Spark executors,
CLI inspection): no lock, no file is created, changed or truncated, a torn tail is simply where
reading stops, and every call looks again at the files to follow the writer.

A partition whose fsync failed (``StorageFailed``) is never fsynced again (fsyncgate): on an
append at least ``reopen.REOPEN_FIRST_S`` after the failure the log reopens it from disk — a new
``Partition``, the recovery of opening the log — and the append goes to it; while reopening
fails, attempts back off up to ``REOPEN_MAX_S`` (``_reopen``). Time comes from ``clock``, so tests
drive it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import resource
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from crc32c import crc32c

from loglake.errors import LoglakeError
from loglake.log import fs, recovery
from loglake.log.api import (
    RETENTION_BOUNDS,
    STREAMS_DIR,
    CorruptStore,
    CreateFailed,
    Entry,
    IndexOp,
    Log,
    LogClosed,
    LogLocked,
    PartitionHealth,
    PartitionInfo,
    QuotaExceeded,
    ReadOnlyLog,
    Record,
    RetentionFailed,
    StorageFailed,
    StreamConfig,
    StreamExists,
    StreamInfo,
    UnknownPartition,
    UnknownStream,
    ascii_digits,
    check_index,
    check_stream_name,
    check_timestamps,
)
from loglake.log.consumer_store import ConsumerStore
from loglake.log.lake_schema import lake_partition_dir
from loglake.log.partition import Partition, PartitionRetired
from loglake.log.sealer import Sealer
from loglake.structured_logging import log_event

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
LOCK_FILE = "LOCK"


T = TypeVar("T")

CONFIG_CHECKSUM = "crc32c"
"""Key of the CRC32C (of the other keys, compact JSON with sorted keys) in ``config.json``."""


def _config_crc(d: dict) -> int:
    return crc32c(json.dumps(d, sort_keys=True, separators=(",", ":")).encode())


def config_to_json(config: StreamConfig) -> bytes:
    """``config.json``: the config's fields and a CRC32C over them, so bit rot that leaves
    valid JSON (a flipped digit, a key name no longer known) is detected, not read as another
    config (a flipped key name once silently turned 2 partitions into 1)."""
    d = dataclasses.asdict(config)
    return json.dumps({**d, CONFIG_CHECKSUM: _config_crc(d)}, indent=2, sort_keys=True).encode()


def config_from_json(raw: bytes, path: str = "config.json") -> StreamConfig:
    """A stream's config; damage → ``CorruptStore`` (it is written temp + fsync + rename, so
    a crash never leaves it half written). A file written before the checksum existed is read
    if every key is a known field (an unknown key is damage either way)."""
    try:
        d = json.loads(raw)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        if CONFIG_CHECKSUM in d:
            crc = d.pop(CONFIG_CHECKSUM)
            if crc != _config_crc(d):
                raise ValueError(f"{CONFIG_CHECKSUM} mismatch")
        names = {f.name for f in dataclasses.fields(StreamConfig)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        # stored before the config's bounds: the longest (292 years, int64 bytes or records)
        # keeps every record the stored one kept
        for k, most in RETENTION_BOUNDS.items():
            if isinstance(d.get(k), int) and d[k] > most:
                d[k] = most
        return StreamConfig(**d)
    except (ValueError, TypeError, AttributeError, LoglakeError) as e:
        raise CorruptStore(path, f"not a stream config: {e}") from None


class _Stream:
    """A stream's config and its partitions, each opened on first use (``SegmentLog._slot``)
    and closed again when the log's budget of open partitions needs its descriptors."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.slots: list[Partition | None] = [None] * config.partitions
        self.stamp: tuple[int, int, int] | None = None
        """``(mtime_ns, size, inode)`` of the config a read-only log last read
        (``_follow_growth``)."""
        self.closed_info: dict[int, tuple[int, int, int, int]] = {}
        """``snapshot()`` of partitions closed to free descriptors, taken as they closed (all
        written and fsynced, so exact until they open again): ``stream_info`` answers for
        them without reopening each."""

    @property
    def opened(self) -> list[Partition]:
        """The partitions open now."""
        return [p for p in self.slots if p is not None]


def default_max_open_partitions() -> int:
    """An eighth of the process's soft descriptor limit (at least 16): an open partition
    holds up to four descriptors (active segment, its index, its read fd, the watermark), and
    half the limit stays for connections, lake files and sealed segments being read."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 65_536
    return max(16, soft // 8)


class SegmentLog(Log):
    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        readonly: bool = False,
        default_config: StreamConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        seal_processes: bool = False,
        max_open_partitions: int | None = None,
        max_partitions_per_stream: int | None = None,
        max_partitions_total: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.max_open_partitions = (
            default_max_open_partitions() if max_open_partitions is None else max_open_partitions
        )
        """How many partitions may be open at once (each holds up to four descriptors); the
        least recently used one is closed to open another. None: ``default_max_open_partitions``."""
        if self.max_open_partitions < 1:
            raise ValueError(f"max_open_partitions must be >= 1, not {self.max_open_partitions}")
        self.max_partitions_per_stream = max_partitions_per_stream
        """``create_stream`` refuses a stream with more partitions (``QuotaExceeded``); None:
        no quota."""
        self.max_partitions_total = max_partitions_total
        """``create_stream`` refuses a stream that would bring the partitions of all streams
        past this (``QuotaExceeded``); None: no quota."""
        self._open_lru: OrderedDict[tuple[str, int], Partition] = OrderedDict()
        """Open partitions, least recently used first (``_slot``, ``_touch``)."""
        self._opened_once: set[tuple[str, int]] = set()
        """Partitions this log has opened (writer): only the first open removes lake temp
        files. Why: the temp files of a crashed writer are all there before this log opens a
        partition, while a later open (after an LRU eviction or a failed partition's reopen)
        can run while the sealer writes the partition's ``.tmp-`` file. Found from outside:
        with ``max_open_partitions`` and ``seal_to_lake``, reopening an evicted partition
        unlinked it mid-seal (~20 failed seals and a failed append in 20 s)."""
        self.readonly = readonly
        self.default_config = default_config or StreamConfig()
        self._clock = clock
        """Seconds, monotonic: when a failed partition may be reopened (tests pass their own)."""
        self._reopen_lock = threading.Lock()
        """One reopen at a time (they are rare and rate-limited)."""
        self._lock = threading.RLock()
        self._streams: dict[str, _Stream] = {}
        self._lock_fd: int | None = None
        self._closed = False
        self._sealer = Sealer(processes=seal_processes)
        if not readonly:
            fs.makedirs_durable(self.data_dir / STREAMS_DIR)
            self._take_lock()
        consumers: ConsumerStore | None = None
        try:
            if not readonly:
                self._sync_folders()
            consumers = ConsumerStore(self.data_dir, readonly, clock)
            self._consumers = consumers
            self._load_streams()
        except BaseException:
            # Each step is attempted whatever the others raise: a partition whose close fails
            # (a failed fsync) must not keep the LOCK held for the rest of the process; the
            # error that stopped the open is the one raised.
            with contextlib.suppress(Exception), contextlib.ExitStack() as cleanup:
                cleanup.callback(self._release_lock)
                if consumers is not None:
                    cleanup.callback(consumers.close)
                for p in self._open_lru.values():
                    cleanup.callback(p.close)
                cleanup.callback(self._sealer.stop)
            raise

    def _sync_folders(self) -> None:
        """fsync the data dir, ``streams/`` and every stream's folder before trusting what they
        list. After a failed folder fsync (a stream created, a config or the consumer file
        renamed into place) the entries seen may not be durable yet, and nothing acknowledged
        from now on may depend on them — as recovery rewrites a segment's unsynced tail before
        trusting it. Partition folders fsync themselves when they open."""
        streams = self.data_dir / STREAMS_DIR
        fs.fsync_dir(self.data_dir)
        fs.fsync_dir(streams)
        for name in sorted(fs.listdir(streams)):
            if (streams / name).is_dir():
                fs.fsync_dir(streams / name)

    # -- lock -------------------------------------------------------------------------------
    def _take_lock(self) -> None:
        try:
            self._lock_fd = fs.lock_file(self.data_dir / LOCK_FILE)
        except fs.LockHeld:
            raise LogLocked(str(self.data_dir)) from None

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            fs.close(self._lock_fd)
            self._lock_fd = None

    # -- streams ----------------------------------------------------------------------------
    def _stream_dir(self, name: str) -> Path:
        return self.data_dir / STREAMS_DIR / name

    def _slot(self, name: str, s: _Stream, p: int) -> Partition:
        """Partition ``p`` of stream ``s``, opened now if it is not (caller holds the lock).

        Partitions open on first use, not with the log: a data dir of tens of thousands of
        partitions starts at once and holds descriptors only for the partitions in use. Opening
        one past ``max_open_partitions`` closes the least recently used healthy one (an fsync
        and its descriptors); calls that took it without the lock raise ``PartitionRetired``
        and run again on a newly opened one (``_on``), as after a reopen."""
        part = s.slots[p]
        if part is not None:
            self._touch(name, p)
            return part
        while len(self._open_lru) >= self.max_open_partitions and self._evict_one():
            pass
        part = self._open_partition(name, s.config, p)
        s.slots[p] = part
        s.closed_info.pop(p, None)  # appends go on from here: the snapshot is stale
        self._open_lru[(name, p)] = part
        return part

    def _touch(self, name: str, p: int) -> None:
        with contextlib.suppress(KeyError):  # evicted meanwhile: the next lookup reopens it
            self._open_lru.move_to_end((name, p))

    def _evict_one(self) -> bool:
        """Close the least recently used healthy partition (caller holds the lock); False if
        every open one has failed (a failed partition stays until an append reopens it, so its
        back-off and counters are kept)."""
        # a copy: ``_touch`` reorders the dict without the lock (the lock-free push path)
        for key, part in list(self._open_lru.items()):  # noqa: B007 -- the one it stops at
            if part.reopen.error is None:
                break
        else:
            return False
        self._open_lru.pop(key, None)
        s = self._streams.get(key[0])
        if s is not None and s.slots[key[1]] is part:
            s.slots[key[1]] = None
        try:
            part.retire()
            if s is not None and not self.readonly and part.reopen.error is None:
                s.closed_info[key[1]] = part.snapshot()
        except StorageFailed as e:  # its waiters failed with it; the next open recovers it
            log_event(
                logger,
                logging.ERROR,
                "closing a partition to free descriptors failed",
                stream=key[0],
                partition=key[1],
                error=str(e),
            )
        return True

    def _open_partition(self, name: str, config: StreamConfig, p: int) -> Partition:
        part = Partition(
            name,
            p,
            self._stream_dir(name) / str(p),
            lake_partition_dir(self.data_dir, name, p),
            config,
            self.readonly,
            self._sealer,
            self._clock,
            sweep_lake_temps=(name, p) not in self._opened_once,
        )
        self._opened_once.add((name, p))
        return part

    def _load_streams(self) -> None:
        root = self.data_dir / STREAMS_DIR
        try:
            names = sorted(fs.listdir(root))
        except FileNotFoundError:
            return
        for name in names:
            if name in self._streams:
                continue
            path = root / name / CONFIG_FILE
            try:
                raw = fs.read_file(path)
            except (FileNotFoundError, NotADirectoryError):
                continue  # half-created (crash before config.json) or foreign
            self._streams[name] = _Stream(config_from_json(raw, str(path)))

    def create_stream(self, name: str, config: StreamConfig | None = None) -> StreamInfo:
        check_stream_name(name)
        with self._lock:
            self._check_open()
            if self.readonly:
                self._load_streams()
            existing = self._streams.get(name)
            if existing is not None:
                if config is not None and config.partitions != existing.config.partitions:
                    raise StreamExists(
                        f"stream {name!r} exists with {existing.config.partitions} partitions, "
                        f"not {config.partitions}"
                    )
                return self.stream_info(name)
            if self.readonly:
                raise ReadOnlyLog(f"cannot create stream {name!r}: the log is read-only")
            config = config or self.default_config
            self._check_quota(name, config.partitions)
            sdir = self._stream_dir(name)
            # Only the stream's folder and config: partition folders are made when a partition
            # is first opened, so a create costs the same for 1 or 4,096 partitions and a
            # failed one has one folder to take back.
            existed = sdir.exists()
            try:
                fs.makedirs_durable(sdir)
                fs.replace_file_atomic(sdir / CONFIG_FILE, config_to_json(config))
                fs.fsync_dir(sdir.parent)
            except OSError as e:
                if not existed:
                    shutil.rmtree(sdir, ignore_errors=True)
                if e.errno in (*fs.DISK_FULL_ERRNOS, errno.EIO):
                    raise  # a storage fault: the callers' "disk full" / failed-disk answers
                raise CreateFailed(f"cannot create stream {name!r}: {e}") from e
            self._streams[name] = _Stream(config)
            return self.stream_info(name)

    def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        """``Log.grow_stream``: the count lives in the stream's ``config.json`` alone, so growing
        rewrites that file (temp + fsync + rename, as ``create_stream`` writes it) and nothing
        else — existing partitions' segments, sparse indexes and lake files, and the consumer
        store, are keyed by partition number and stay as they are; a new partition's folder is
        made when it is first used. A crash leaves the old count or the new one, whole."""
        check_stream_name(name)
        with self._lock:
            s = self._stream(name)
            have = s.config.partitions
            if partitions <= have:
                return self.stream_info(name)
            if self.readonly:
                raise ReadOnlyLog(f"cannot grow stream {name!r}: the log is read-only")
            self._check_quota(name, partitions, partitions - have, "grow")
            config = dataclasses.replace(s.config, partitions=partitions)
            try:
                fs.replace_file_atomic(self._stream_dir(name) / CONFIG_FILE, config_to_json(config))
            except OSError as e:
                if e.errno in (*fs.DISK_FULL_ERRNOS, errno.EIO):
                    raise  # a storage fault: the callers' "disk full" / failed-disk answers
                raise CreateFailed(f"cannot grow stream {name!r}: {e}") from e
            s.config = config
            s.slots += [None] * (partitions - have)
            return self.stream_info(name)

    def _check_quota(
        self, name: str, partitions: int, new: int | None = None, verb: str = "create"
    ) -> None:
        """Whether a stream of ``partitions`` partitions, ``new`` of them not counted yet
        (default: all), fits the quotas."""
        new = partitions if new is None else new
        per = self.max_partitions_per_stream
        if per is not None and partitions > per:
            raise QuotaExceeded(
                f"cannot {verb} stream {name!r} with {partitions} partitions: "
                f"at most {per} per stream (max_partitions_per_stream)"
            )
        total = self.max_partitions_total
        if total is not None:
            have = sum(s.config.partitions for s in self._streams.values())
            if have + new > total:
                raise QuotaExceeded(
                    f"cannot {verb} stream {name!r} with {partitions} partitions: the log "
                    f"holds {have} of at most {total} (max_partitions_total)"
                )

    def streams(self) -> list[str]:
        with self._lock:
            self._check_open()
            if self.readonly:
                self._load_streams()
            return sorted(self._streams)

    def _stream(self, name: str) -> _Stream:
        self._check_open()
        s = self._streams.get(name)
        if s is None and self.readonly:
            self._load_streams()
            s = self._streams.get(name)
        if s is None:
            raise UnknownStream(name)
        if self.readonly:
            self._follow_growth(name, s)
        return s

    def _follow_growth(self, name: str, s: _Stream) -> None:
        """A read-only log takes up partitions the writer added (``grow_stream``) since it
        read the stream's config: it looks again when the file changed (one ``stat``)."""
        path = self._stream_dir(name) / CONFIG_FILE
        try:
            st = os.stat(path)
        except OSError:
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == s.stamp:
            return
        with self._lock:
            try:
                config = config_from_json(fs.read_file(path), str(path))
            except OSError:
                return
            s.stamp = stamp
            if config.partitions > s.config.partitions:
                s.slots += [None] * (config.partitions - s.config.partitions)
                s.config = config

    def _partition(self, stream: str, partition: int) -> Partition:
        s = self._stream(stream)
        n = s.config.partitions
        if not isinstance(partition, int) or not 0 <= partition < n:
            raise UnknownPartition(stream, partition, n)
        return self._slot(stream, s, partition)

    def _on(self, stream: str, partition: int, call: Callable[[Partition], T], write: bool) -> T:
        """``call`` on the partition; a ``write`` to a failed one reopens it first (or raises
        ``StorageFailed``). A partition replaced by a reopen between the lookup and the call
        raises ``PartitionRetired`` before doing anything: the call runs on the new one.

        An open, healthy partition is taken without the log's lock (the stream service's
        path, a push at a time, must not wait on it); anything else — a closed log, a stream or
        partition not known or not opened yet, a failed partition to write to — is looked up
        under the lock, which answers each case."""
        while True:
            part = self._opened_partition(stream, partition)
            if part is None or (write and part.reopen.error is not None):
                with self._lock:
                    part = self._partition(stream, partition)
                if write and part.reopen.error is not None:
                    part = self._reopen(stream, partition, part)
            try:
                return call(part)
            except PartitionRetired:
                continue

    def _opened_partition(self, stream: str, partition: int) -> Partition | None:
        """The partition if the log is open and it is already opened, else None (no lock:
        a dict read and a list read; a partition replaced by a reopen meanwhile raises
        ``PartitionRetired`` when called)."""
        s = self._streams.get(stream)
        if s is None or self._closed or type(partition) is not int:
            return None
        slots = s.slots
        part = slots[partition] if 0 <= partition < len(slots) else None
        if part is not None:
            self._touch(stream, partition)
        return part

    def _reopen(self, stream: str, partition: int, old: Partition) -> Partition:
        """Replace the failed partition ``old`` by one opened from disk, if its back-off has
        passed; else raise ``StorageFailed`` saying when the next attempt is.

        ``open_log``'s recovery is what makes this safe after a failed fsync: it trusts only
        the bytes below the durable watermark and writes the bytes past it again (dirtying
        pages the failed fsync may have left clean) before the fsync that publishes them. The
        old partition writes nothing after its failure (an append still writing finishes
        first: ``quiesce``); once the new one is in place the old one is retired: calls still
        reaching it run again on the new one, and its read descriptors close when the last
        read using them ends."""
        now = self._clock()
        if now < old.reopen.next_at:
            raise recovery.refusal(old, now)
        with self._reopen_lock:
            with self._lock:
                s = self._stream(stream)
                if s.slots[partition] is not old:  # reopened (it may have failed too) or closed
                    return self._slot(stream, s, partition)
            now = self._clock()
            if now < old.reopen.next_at:
                raise recovery.refusal(old, now)
            old.quiesce()
            try:
                new = self._open_partition(stream, s.config, partition)
            except Exception as e:
                raise recovery.reopen_failed(old, now, e) from e
            new.took_over(old)
            with self._lock:
                if self._closed:
                    new.close()
                    raise LogClosed("the log is closed")
                s.slots[partition] = new
                self._open_lru.pop((stream, partition), None)
                self._open_lru[(stream, partition)] = new
        old.retire()
        assert old.reopen.error is not None
        log_event(
            logger,
            logging.WARNING,
            "reopened a failed partition from disk",
            stream=stream,
            partition=partition,
            error=str(old.reopen.error),
            failed_attempts=old.reopen.attempts,
            down_s=round(now - old.reopen.failed_at, 3),
            next_index=new.next_index,
        )
        return new

    def stream_info(self, name: str) -> StreamInfo:
        """Every partition's indexes and size, opening as few as it can: an open partition
        answers itself, one closed to free descriptors answers with the snapshot taken as it
        closed, one never used (no folder, no lake files) is empty. Only the rest — on disk
        from an earlier run and not used since — are opened, through the same LRU, so the
        descriptors stay bounded however many partitions there are."""
        with self._lock:
            s = self._stream(name)
            written = self._written(name)
            infos = []
            for i in range(s.config.partitions):
                infos.append(PartitionInfo(i, *self._partition_snapshot(name, s, i, written)))
            return StreamInfo(name, s.config, tuple(infos))

    def _partition_snapshot(
        self, name: str, s: _Stream, i: int, written: set[int]
    ) -> tuple[int, int, int, int]:
        part = s.slots[i]
        if part is None and not self.readonly:
            known = s.closed_info.get(i)
            if known is not None:
                return known
            if i not in written:
                return (0, 0, 0, 0)
        if part is None:
            part = self._slot(name, s, i)
        return part.snapshot()

    def _written(self, name: str) -> set[int]:
        """Partitions of stream ``name`` with a folder or lake files (the others were never
        written): two directory listings, not a path lookup per partition."""
        out: set[int] = set()
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            out.update(int(n) for n in fs.listdir(self._stream_dir(name)) if ascii_digits(n))
        lake = lake_partition_dir(self.data_dir, name, 0).parent
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for n in fs.listdir(lake):
                key, _, num = n.partition("=")
                if key == "partition" and ascii_digits(num):
                    out.add(int(num))
        return out

    def _on_disk(self, name: str, i: int) -> bool:
        """Partition ``i`` has a folder or lake files (else it was never written)."""
        return (self._stream_dir(name) / str(i)).exists() or lake_partition_dir(
            self.data_dir, name, i
        ).exists()

    # -- writing ----------------------------------------------------------------------------
    def append_many(
        self, stream: str, entries: Sequence[Entry], *, partition: int = 0
    ) -> list[int]:
        if self.readonly:
            raise ReadOnlyLog(f"cannot append to {stream!r}: the log is read-only")
        check_timestamps(entries)
        return self._on(
            stream, partition, lambda p: p.append_many(entries, p.config.durability), True
        )

    def append_payloads(
        self, stream: str, datas: Sequence[bytes], *, partition: int = 0
    ) -> list[int]:
        if self.readonly:
            raise ReadOnlyLog(f"cannot append to {stream!r}: the log is read-only")
        return self._on(
            stream, partition, lambda p: p.append_payloads(datas, p.config.durability), True
        )

    def append_payloads_then(
        self,
        stream: str,
        datas: Sequence[bytes],
        done: Callable[[BaseException | None], None],
        *,
        partition: int = 0,
    ) -> list[int]:
        if self.readonly:
            raise ReadOnlyLog(f"cannot append to {stream!r}: the log is read-only")
        with self._lock:
            part = self._partition(stream, partition)
        if part.config.durability != "batch":
            return super().append_payloads_then(stream, datas, done, partition=partition)
        return self._on(stream, partition, lambda p: p.append_payloads_then(datas, done), True)

    # -- reading ----------------------------------------------------------------------------
    def read(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        end: int | None = None,
        *,
        partition: int = 0,
    ) -> list[Record]:
        return self._on(stream, partition, lambda p: p.read(start, limit, end), False)

    def read_payloads(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        *,
        partition: int = 0,
        max_bytes: int | None = None,
    ) -> list[tuple[int, bytes]]:
        return self._on(
            stream, partition, lambda p: p.read(start, limit, None, True, max_bytes), False
        )

    def read_tables(
        self, stream: str, start: int = 0, end: int | None = None, *, partition: int = 0
    ) -> Iterator[pa.Table]:
        pos = start
        while True:
            with self._lock:
                part = self._partition(stream, partition)
            hi = part.snapshot()[1] if end is None else end
            try:
                for table in part.read_tables(pos, hi):
                    yield table
                    pos = table["index"][-1].as_py() + 1
                return
            except PartitionRetired:  # reopened after a failure: go on from the new one
                continue

    def next_index(self, stream: str, *, partition: int = 0) -> int:
        with self._lock:
            part = self._partition(stream, partition)
        return part.snapshot()[1]

    # -- consumer indexes -------------------------------------------------------------------
    def get_index(self, client_id: str, stream: str, *, partition: int = 0) -> int | None:
        with self._lock:
            self._partition(stream, partition)
        return self._consumers.get(client_id, stream, partition)

    def consumer_indexes(self) -> dict[tuple[str, str, int], int]:
        return self._consumers.all()

    def save_index(self, client_id: str, stream: str, index: int, *, partition: int = 0) -> int:
        check_index(index)
        if self.readonly:
            raise ReadOnlyLog("cannot save a consumer index: the log is read-only")
        with self._lock:
            self._partition(stream, partition)
        return self._consumers.save(client_id, stream, partition, index)

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
        if self.readonly:
            raise ReadOnlyLog("cannot save a consumer index: the log is read-only")
        with self._lock:
            self._partition(stream, partition)
        return self._consumers.save(client_id, stream, partition, index, owner, override)

    def index_ops(self, ops: Sequence[IndexOp]) -> list[int | Exception | None]:
        """The group's saves in one write and one fsync (``ConsumerStore.apply``)."""
        out: list[int | Exception | None] = [None] * len(ops)
        valid: list[int] = []
        for k, op in enumerate(ops):
            try:
                if op.index is not None:
                    check_index(op.index)
                    if self.readonly:
                        raise ReadOnlyLog("cannot save a consumer index: the log is read-only")
                with self._lock:
                    self._partition(op.stream, op.partition)
            except Exception as e:
                out[k] = e
                continue
            valid.append(k)
        if valid:
            done = self._consumers.apply(ops if len(valid) == len(ops) else [ops[k] for k in valid])
            for k, value in zip(valid, done, strict=True):
                out[k] = value
        return out

    def index_owner(self, client_id: str, stream: str, *, partition: int = 0) -> str | None:
        return self._consumers.owner(client_id, stream, partition)

    def reset_index(
        self, client_id: str, stream: str, index: int | None, *, partition: int = 0
    ) -> int | None:
        if index is not None:
            check_index(index)
        if self.readonly:
            raise ReadOnlyLog("cannot reset a consumer index: the log is read-only")
        with self._lock:
            self._partition(stream, partition)
        return self._consumers.reset(client_id, stream, partition, index)

    # -- maintenance ------------------------------------------------------------------------
    def enforce_retention(self, now_ns: int | None = None) -> int:
        """Trim every partition; a failed one (``StorageFailed``, in ``health()``) is skipped
        until an append reopens it."""
        if self.readonly:
            raise ReadOnlyLog("cannot enforce retention: the log is read-only")
        now_ns = time.time_ns() if now_ns is None else now_ns
        self._sealer.drain()  # segments rolled so far may be deleted once in the lake
        dropped = 0
        errors: list[tuple[str, int, BaseException]] = []
        for name, i in self._all_slots():  # one failing partition must not stop the others
            error = None
            try:
                dropped += self._on(name, i, lambda p: p.enforce_retention(now_ns), False)
            except StorageFailed:
                pass  # failed: it deletes nothing until an append reopens it (see health())
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                log_event(
                    logger,
                    logging.ERROR,
                    "retention failed for a partition",
                    stream=name,
                    partition=i,
                    error=error,
                )
                errors.append((name, i, e))
            with self._lock:
                part = self._opened_partition(name, i)
                if part is not None or error is not None:
                    (part or self._partition(name, i)).retention_error = error
        if errors:
            raise RetentionFailed(dropped, errors)
        return dropped

    def truncate_before(self, stream: str, index: int, *, partition: int = 0) -> int:
        """Segment-granular (see ``Partition.truncate_before``): whole segments below ``index``
        go; the segment holding ``index`` stays whole."""
        if self.readonly:
            raise ReadOnlyLog("cannot truncate: the log is read-only")
        with self._lock:
            part = self._partition(stream, partition)
        if part.config.seal_to_lake:
            self._sealer.drain()  # rolled segments may go once they are in the lake
        return self._on(stream, partition, lambda p: p.truncate_before(index), True)

    def flush(self) -> None:
        """fsync every partition; a failed one is reopened first if its back-off has passed
        (else ``StorageFailed``)."""
        if self.readonly:
            return
        for name, i in self._slots():
            self._on(name, i, lambda p: p.flush(), True)

    def _slots(self) -> list[tuple[str, int]]:
        """``(stream, partition)`` of every open partition (a closed one has nothing unsynced)."""
        with self._lock:
            self._check_open()
            return list(self._open_lru)

    def _all_slots(self) -> list[tuple[str, int]]:
        """``(stream, partition)`` of every partition of every stream that is open or on
        disk: one never written holds nothing to trim or check, and is not opened for it (the
        others are opened one by one through the LRU, so descriptors stay bounded)."""
        with self._lock:
            self._check_open()
            out = []
            for n, s in self._streams.items():
                written = self._written(n)
                out += [
                    (n, i)
                    for i in range(s.config.partitions)
                    if s.slots[i] is not None or i in written
                ]
            return out

    def partition_count(self, stream: str) -> int:
        """How many partitions ``stream`` has, without opening any (``UnknownStream``)."""
        with self._lock:
            if self.readonly:
                self._load_streams()
            return self._stream(stream).config.partitions

    def open_partitions(self) -> int:
        """How many partitions are open now (at most ``max_open_partitions``)."""
        return len(self._open_lru)

    def health(self) -> list[PartitionHealth]:
        """Every opened partition's failures (a reader: every partition on disk's) (seal
        failures being retried, a failed fsync,
        the last retention error): for ``loglake log info`` and a metrics endpoint. Once the
        consumer index store has failed (a save's fsync) the list also holds an entry for it,
        named by its file (``stream="consumers.log"``, partition 0): failed until it reopens
        from disk, then ok with its count of reopens."""
        with self._lock:
            self._check_open()
            if self.readonly:
                self._load_streams()
            parts = list(self._open_lru.values())
        if self.readonly:  # an inspector: what each partition's files record, one at a time
            out = [self._on(n, i, lambda p: p.health(), False) for n, i in self._all_slots()]
        else:  # a partition not opened since the log opened has not failed in this process
            out = [p.health() for p in parts]
        consumers = self._consumers.health()
        if consumers is not None:
            out.append(consumers)
        return out

    def verify(self) -> list[tuple[str, int, int, int, int]]:
        """Check every byte the log holds: each segment read whole (CRC, framing, index
        sequence) and each lake file's schema and index range. Returns
        ``(stream, partition, segments, records, lake_files)`` rows; damage raises
        ``CorruptSegment`` naming the file and offset. Changes nothing."""
        self._sealer.drain()
        out = []
        for name in self.streams():
            with self._lock:
                n = self._stream(name).config.partitions
            for i in range(n):
                if (
                    self.readonly
                    or self._opened_partition(name, i) is not None
                    or self._on_disk(name, i)
                ):
                    out.append((name, i, *self._on(name, i, lambda p: p.verify(), False)))
                else:
                    out.append((name, i, 0, 0, 0))  # never written: nothing to check
        return out

    def wait_for_seals(self) -> None:
        """Block until every rolled segment handed to the background sealer is in the lake."""
        self._sealer.drain()

    def fsync_count(self, stream: str, partition: int = 0) -> int:
        """How many data fsyncs made a partition's appends durable: group commits (``batch``)
        and one per ``always`` append (metrics, benchmarks and tests); reopens carry it on."""
        return self._partition(stream, partition).fsyncs

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed("the log is closed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._sealer.drain()
            self._sealer.stop()
            failed: list[BaseException] = []
            try:
                for p in self._open_lru.values():
                    try:
                        p.close()
                    except StorageFailed as e:
                        failed.append(e)
                self._consumers.close()
            finally:
                self._release_lock()
            if failed:
                raise failed[0]


def open_log(
    data_dir: str | os.PathLike[str],
    *,
    readonly: bool = False,
    default_config: StreamConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
    seal_processes: bool = False,
    max_open_partitions: int | None = None,
    max_partitions_per_stream: int | None = None,
    max_partitions_total: int | None = None,
) -> Log:
    """Open (creating if needed) the embedded log at ``data_dir``.

    One writer per data dir (a second one gets ``LogLocked``); any number of ``readonly``
    readers, in any process, alongside it. ``clock``: monotonic seconds, for the back-off of
    reopening a failed partition (tests drive it). ``seal_processes``: rolled segments are
    sealed to the lake in a child process, off this process's GIL (for a server: ``loglake
    serve`` and ``loglake node`` ask for it; ``log.sealer``). ``max_open_partitions``,
    ``max_partitions_per_stream``, ``max_partitions_total``: see ``SegmentLog``."""
    return SegmentLog(
        data_dir,
        readonly=readonly,
        default_config=default_config,
        clock=clock,
        seal_processes=seal_processes,
        max_open_partitions=max_open_partitions,
        max_partitions_per_stream=max_partitions_per_stream,
        max_partitions_total=max_partitions_total,
    )
