"""``SegmentLog``: the embedded, crash-safe ``Log`` on local files (issue 3 §2).

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
from collections.abc import Callable, Sequence
from pathlib import Path

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
from loglake.log.partition import Partition
from loglake.log.sealer import Sealer
from loglake.logs import log_event

logger = logging.getLogger(__name__)

STREAMS_DIR = "streams"
CONFIG_FILE = "config.json"
LOCK_FILE = "LOCK"


CONFIG_CHECKSUM = "crc32c"
"""Key of the CRC32C (of the other keys, compact JSON with sorted keys) in ``config.json``."""


def _config_crc(d: dict) -> int:
    return crc32c(json.dumps(d, sort_keys=True, separators=(",", ":")).encode())


def config_to_json(config: StreamConfig) -> bytes:
    """``config.json``: the config's fields and a CRC32C over them, so bit rot that leaves
    valid JSON (a flipped digit, a key name no longer known) is detected, not read as another
    config (issue 17: a flipped key name once silently turned 2 partitions into 1)."""
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
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.readonly = readonly
        self.default_config = default_config or StreamConfig()
        self._lock = threading.RLock()
        self._streams: dict[str, _Stream] = {}
        self._lock_fd: int | None = None
        self._closed = False
        self._sealer = Sealer()
        if not readonly:
            fs.makedirs_durable(self.data_dir / STREAMS_DIR)
            self._take_lock()
        consumers: ConsumerStore | None = None
        try:
            consumers = ConsumerStore(self.data_dir, readonly)
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
        return [
            Partition(
                name,
                p,
                self._stream_dir(name) / str(p),
                lake_partition_dir(self.data_dir, name, p),
                config,
                self.readonly,
                self._sealer,
            )
            for p in range(config.partitions)
        ]

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
        with self._lock:
            part = self._partition(stream, partition)
        return part.append_many(entries, part.config.durability)

    def append_payloads(self, stream: str, partition: int, datas: Sequence[bytes]) -> list[int]:
        if self.readonly:
            raise ReadOnlyLog(f"cannot append to {stream!r}: the log is read-only")
        with self._lock:
            part = self._partition(stream, partition)
        return part.append_payloads(datas, part.config.durability)

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
        return part.append_payloads_then(datas, done)

    # -- reading ----------------------------------------------------------------------------
    def read(
        self,
        stream: str,
        partition: int,
        start: int,
        limit: int | None = None,
        end: int | None = None,
    ) -> list[Record]:
        with self._lock:
            part = self._partition(stream, partition)
        return part.read(start, limit, end)

    def read_payloads(
        self, stream: str, partition: int, start: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        with self._lock:
            part = self._partition(stream, partition)
        return part.read(start, limit, None, pairs=True)

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

    # -- maintenance ------------------------------------------------------------------------
    def enforce_retention(self, now_ns: int | None = None) -> int:
        if self.readonly:
            raise ReadOnlyLog("cannot enforce retention: the log is read-only")
        now_ns = time.time_ns() if now_ns is None else now_ns
        self._sealer.drain()  # segments rolled so far may be deleted once in the lake
        with self._lock:
            self._check_open()
            parts = [p for s in self._streams.values() for p in s.partitions]
        dropped = 0
        errors: list[tuple[str, int, BaseException]] = []
        for p in parts:  # one failing partition must not stop the others
            try:
                dropped += p.enforce_retention(now_ns)
                p.retention_error = None
            except Exception as e:
                p.retention_error = f"{type(e).__name__}: {e}"
                log_event(
                    logger,
                    logging.ERROR,
                    "retention failed for a partition",
                    stream=p.stream,
                    partition=p.partition,
                    error=p.retention_error,
                )
                errors.append((p.stream, p.partition, e))
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
        return part.truncate_before(index)

    def flush(self) -> None:
        if self.readonly:
            return
        with self._lock:
            for s in self._streams.values():
                for p in s.partitions:
                    p.flush()

    def health(self) -> list[PartitionHealth]:
        """Every opened partition's failures (seal failures being retried, a failed fsync,
        the last retention error): for ``loglake log info`` and a metrics endpoint."""
        with self._lock:
            self._check_open()
            if self.readonly:
                self._load_streams()
            parts = [p for s in self._streams.values() for p in s.partitions]
        return [p.health() for p in parts]

    def verify(self) -> list[tuple[str, int, int, int, int]]:
        """Check every byte the log holds: each segment read whole (CRC, framing, index
        sequence) and each lake file's schema and index range. Returns
        ``(stream, partition, segments, records, lake_files)`` rows; damage raises
        ``CorruptSegment`` naming the file and offset. Changes nothing."""
        self._sealer.drain()
        out = []
        for name in self.streams():
            with self._lock:
                parts = list(self._stream(name).partitions)
            for p in parts:
                out.append((name, p.partition, *p.verify()))
        return out

    def wait_for_seals(self) -> None:
        """Block until every rolled segment handed to the background sealer is in the lake."""
        self._sealer.drain()

    def fsync_count(self, stream: str, partition: int = 0) -> int:
        """How many data fsyncs made a partition's appends durable: group commits (``batch``)
        and one per ``always`` append (metrics, benchmarks and tests)."""
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
) -> Log:
    """Open (creating if needed) the embedded log at ``data_dir``.

    One writer per data dir (a second one gets ``LogLocked``); any number of ``readonly``
    readers, in any process, alongside it."""
    return SegmentLog(data_dir, readonly=readonly, default_config=default_config)
