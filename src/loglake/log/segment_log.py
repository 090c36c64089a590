"""``SegmentLog``: the embedded, crash-safe ``Log`` on local files.

Layout under ``data_dir``::

    LOCK                                   flock'ed by the one writer process
    consumers.log                          consumer indexes (consumer_store.py)
    streams/<stream>/config.json           the stream's StreamConfig (temp + fsync + rename)
    streams/<stream>/<p>/<first:020d>.seg  segment files of partition p (segment.py)
    streams/<stream>/<p>/<first:020d>.idx  their sparse indexes (sparse_index.py)
    lake/<stream>/partition=<p>/<first>-<last>.parquet   sealed history (lake.py, lake_schema.py)

A stream exists once its ``config.json`` does; it is written last, after the partition folders,
so a crash during ``create_stream`` leaves no half stream behind (a retry completes it).

``readonly=True`` is for other processes reading a data dir a writer is using (Spark executors,
CLI inspection): no lock, no file is created, changed or truncated, a torn tail is simply where
reading stops, and every call looks again at the files to follow the writer.

A partition whose fsync failed (``StorageFailed``) is never fsynced again (fsyncgate): on an
append at least ``REOPEN_FIRST_S`` after the failure the log reopens it from disk — a new
``Partition``, the recovery of opening the log — and the append goes to it; while reopening
fails, attempts back off up to ``REOPEN_MAX_S`` (``_reopen``). Time comes from ``clock``, so tests
drive it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from crc32c import crc32c

from loglake.errors import LoglakeError
from loglake.log import fs
from loglake.log.api import (
    CorruptStore,
    Entry,
    Log,
    LogClosed,
    LogLocked,
    PartitionHealth,
    PartitionInfo,
    ReadOnlyLog,
    Record,
    RetentionFailed,
    StorageFailed,
    StreamConfig,
    StreamExists,
    StreamInfo,
    UnknownPartition,
    UnknownStream,
    check_stream_name,
)
from loglake.log.consumer_store import ConsumerStore
from loglake.log.lake_schema import lake_partition_dir
from loglake.log.partition import Partition, PartitionRetired
from loglake.log.sealer import Sealer
from loglake.structured_logging import log_event

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger(__name__)

STREAMS_DIR = "streams"
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
        return StreamConfig(**d)
    except (ValueError, TypeError, AttributeError, LoglakeError) as e:
        raise CorruptStore(path, f"not a stream config: {e}") from None


class _Stream:
    def __init__(self, config: StreamConfig, opener: Callable[[], list[Partition]]) -> None:
        self.config = config
        self._opener = opener
        self._partitions: list[Partition] | None = None

    @property
    def partitions(self) -> list[Partition]:
        """Opened on first use: a reader opening a data dir pays only for what it reads."""
        if self._partitions is None:
            self._partitions = self._opener()
        return self._partitions

    @property
    def opened(self) -> list[Partition]:
        return self._partitions or []


class SegmentLog(Log):
    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        readonly: bool = False,
        default_config: StreamConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        seal_processes: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
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
                for s in self._streams.values():
                    for p in s.opened:
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
        fd = fs.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fs.close(fd)
            raise LogLocked(str(self.data_dir)) from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            fs.close(self._lock_fd)
            self._lock_fd = None

    # -- streams ----------------------------------------------------------------------------
    def _stream_dir(self, name: str) -> Path:
        return self.data_dir / STREAMS_DIR / name

    def _open_stream(self, name: str, config: StreamConfig) -> _Stream:
        stream = _Stream(config, lambda: self._open_partitions(name, config))
        if not self.readonly:
            stream.partitions  # noqa: B018 -- a writer recovers every partition on open
        return stream

    def _open_partitions(self, name: str, config: StreamConfig) -> list[Partition]:
        """Every partition of the stream, or none: when one fails to open (a read error while
        recovering it), the ones opened before it are closed again. Nothing else holds them
        yet, so without this each failed open would keep their descriptors (watermark, active
        segment, index) for the rest of the process — found by read faults during open."""
        opened: list[Partition] = []
        try:
            for p in range(config.partitions):
                opened.append(self._open_partition(name, config, p))
        except BaseException:
            for part in opened:
                with contextlib.suppress(Exception):  # e.g. its fsync fails on the same disk
                    part.close()
            raise
        return opened

    def _open_partition(self, name: str, config: StreamConfig, p: int) -> Partition:
        return Partition(
            name,
            p,
            self._stream_dir(name) / str(p),
            lake_partition_dir(self.data_dir, name, p),
            config,
            self.readonly,
            self._sealer,
            self._clock,
        )

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
            self._streams[name] = self._open_stream(name, config_from_json(raw, str(path)))

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
            sdir = self._stream_dir(name)
            fs.makedirs_durable(sdir)
            stream = self._open_stream(name, config)
            fs.replace_file_atomic(sdir / CONFIG_FILE, config_to_json(config))
            fs.fsync_dir(sdir.parent)
            self._streams[name] = stream
            return self.stream_info(name)

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
        return s

    def _partition(self, stream: str, partition: int) -> Partition:
        s = self._stream(stream)
        n = s.config.partitions
        if not isinstance(partition, int) or not 0 <= partition < n:
            raise UnknownPartition(stream, partition, n)
        return s.partitions[partition]

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
            if part is None or (write and part.failure is not None):
                with self._lock:
                    part = self._partition(stream, partition)
                if write and part.failure is not None:
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
        parts = s.opened  # [] until first opened
        return parts[partition] if 0 <= partition < len(parts) else None

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
        if now < old.next_reopen_at:
            raise old.refusal(now)
        with self._reopen_lock:
            with self._lock:
                s = self._stream(stream)
                if s.partitions[partition] is not old:
                    return s.partitions[partition]  # reopened meanwhile (it may have failed too)
            now = self._clock()
            if now < old.next_reopen_at:
                raise old.refusal(now)
            old.quiesce()
            try:
                new = self._open_partition(stream, s.config, partition)
            except Exception as e:
                raise old.reopen_failed(now, e) from e
            new.took_over(old)
            with self._lock:
                if self._closed:
                    new.close()
                    raise LogClosed("the log is closed")
                s.partitions[partition] = new
        old.retire()
        assert old.failure is not None
        log_event(
            logger,
            logging.WARNING,
            "reopened a failed partition from disk",
            stream=stream,
            partition=partition,
            error=str(old.failure),
            failed_attempts=old.reopen_attempts,
            down_s=round(now - old.failed_at, 3),
            next_index=new.next_index,
        )
        return new

    def stream_info(self, name: str) -> StreamInfo:
        with self._lock:
            s = self._stream(name)
            infos = []
            for p in s.partitions:
                infos.append(PartitionInfo(p.partition, *p.snapshot()))
            return StreamInfo(name, s.config, tuple(infos))

    # -- writing ----------------------------------------------------------------------------
    def append_many(self, stream: str, partition: int, entries: Sequence[Entry]) -> list[int]:
        if self.readonly:
            raise ReadOnlyLog(f"cannot append to {stream!r}: the log is read-only")
        return self._on(
            stream, partition, lambda p: p.append_many(entries, p.config.durability), True
        )

    def append_payloads(self, stream: str, partition: int, datas: Sequence[bytes]) -> list[int]:
        if self.readonly:
            raise ReadOnlyLog(f"cannot append to {stream!r}: the log is read-only")
        return self._on(
            stream, partition, lambda p: p.append_payloads(datas, p.config.durability), True
        )

    def append_payloads_then(
        self,
        stream: str,
        partition: int,
        datas: Sequence[bytes],
        done: Callable[[BaseException | None], None],
    ) -> list[int]:
        if self.readonly:
            raise ReadOnlyLog(f"cannot append to {stream!r}: the log is read-only")
        with self._lock:
            part = self._partition(stream, partition)
        if part.config.durability != "batch":
            return super().append_payloads_then(stream, partition, datas, done)
        return self._on(stream, partition, lambda p: p.append_payloads_then(datas, done), True)

    # -- reading ----------------------------------------------------------------------------
    def read(
        self,
        stream: str,
        partition: int,
        start: int,
        limit: int | None = None,
        end: int | None = None,
    ) -> list[Record]:
        return self._on(stream, partition, lambda p: p.read(start, limit, end), False)

    def read_payloads(
        self, stream: str, partition: int, start: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        return self._on(stream, partition, lambda p: p.read(start, limit, None, True), False)

    def read_tables(
        self, stream: str, partition: int, start: int = 0, end: int | None = None
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

    def next_index(self, stream: str, partition: int = 0) -> int:
        with self._lock:
            part = self._partition(stream, partition)
        return part.snapshot()[1]

    # -- consumer indexes -------------------------------------------------------------------
    def get_index(self, client_id: str, stream: str, partition: int = 0) -> int | None:
        with self._lock:
            self._partition(stream, partition)
        return self._consumers.get(client_id, stream, partition)

    def consumer_indexes(self) -> dict[tuple[str, str, int], int]:
        return self._consumers.all()

    def save_index(self, client_id: str, stream: str, index: int, partition: int = 0) -> int:
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
        partition: int,
        owner: str,
        override: bool = False,
    ) -> int:
        if self.readonly:
            raise ReadOnlyLog("cannot save a consumer index: the log is read-only")
        with self._lock:
            self._partition(stream, partition)
        return self._consumers.save(client_id, stream, partition, index, owner, override)

    def index_owner(self, client_id: str, stream: str, partition: int = 0) -> str | None:
        return self._consumers.owner(client_id, stream, partition)

    def reset_index(
        self, client_id: str, stream: str, index: int | None, partition: int = 0
    ) -> int | None:
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
        for name, i in self._slots():  # one failing partition must not stop the others
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
                self._partition(name, i).retention_error = error
        if errors:
            raise RetentionFailed(dropped, errors)
        return dropped

    def truncate_before(self, stream: str, partition: int, index: int) -> int:
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
        """``(stream, partition)`` of every opened partition."""
        with self._lock:
            self._check_open()
            return [(n, p.partition) for n, s in self._streams.items() for p in s.partitions]

    def health(self) -> list[PartitionHealth]:
        """Every opened partition's failures (seal failures being retried, a failed fsync,
        the last retention error): for ``loglake log info`` and a metrics endpoint. Once the
        consumer index store has failed (a save's fsync) the list also holds an entry for it,
        named by its file (``stream="consumers.log"``, partition 0): failed until it reopens
        from disk, then ok with its count of reopens."""
        with self._lock:
            self._check_open()
            if self.readonly:
                self._load_streams()
            parts = [p for s in self._streams.values() for p in s.partitions]
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
                out.append((name, i, *self._on(name, i, lambda p: p.verify(), False)))
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
                for s in self._streams.values():
                    for p in s.opened:
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
) -> Log:
    """Open (creating if needed) the embedded log at ``data_dir``.

    One writer per data dir (a second one gets ``LogLocked``); any number of ``readonly``
    readers, in any process, alongside it. ``clock``: monotonic seconds, for the back-off of
    reopening a failed partition (tests drive it). ``seal_processes``: rolled segments are
    sealed to the lake in a child process, off this process's GIL (for a server: ``loglake
    serve`` and ``loglake node`` ask for it; ``log.sealer``)."""
    return SegmentLog(
        data_dir,
        readonly=readonly,
        default_config=default_config,
        clock=clock,
        seal_processes=seal_processes,
    )
