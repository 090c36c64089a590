"""The storage contract every loglake part programs against.

A record is ``(stream, partition, index, timestamp_ns, key, headers, data)``. The index is
assigned by the log, per partition, from 0, strictly increasing by one (the Ockam stream rules:
unique, monotonic, scoped per stream and not per publisher). Readers may see gaps only at the
front, where retention removed history.

``Log`` is an ABC so another engine (NATS JetStream, later) can stand behind the stream service
and behind every part unchanged. ``tests/log/test_conformance.py`` holds the behaviour each
backend must show.
"""

from __future__ import annotations

import operator
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Self

from loglake.errors import DecodeError, LocalProtocolError, LoglakeError, shown

if TYPE_CHECKING:
    import pyarrow as pa

Durability = Literal["always", "batch", "none"]
"""``always``: fsync each append before acknowledging it. ``batch`` (default): group commit,
an append is acknowledged only after the fsync that covers it. ``none``: the OS decides."""

STREAM_NAME_RE = re.compile(r"^[A-Za-z0-9:\-][A-Za-z0-9_.:\-]{0,199}$")
"""A stream name: it names folders (``streams/<name>``, ``lake/<name>``), so not one starting
with ``_`` or ``.``: those are the data dir's own (``lake/_jetstream.json``, hidden files), and
the lake's listings skip them. Use ``fullmatch``: ``$`` also matches before a final newline."""
Headers = tuple[tuple[str, bytes], ...]


class LogError(LoglakeError):
    """Base of the storage errors."""


class UnknownStream(LogError, KeyError):
    def __init__(self, stream: str) -> None:
        super().__init__(f"unknown stream {stream!r}")
        self.stream = stream

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


class UnknownPartition(LogError, KeyError):
    def __init__(self, stream: str, partition: int, partitions: int | None = None) -> None:
        # ``partitions`` None: not known here (a remote service's reply named the partition)
        has = f"partitions 0..{partitions - 1}" if partitions is not None else "no such partition"
        super().__init__(f"stream {stream!r} has {has}, not {partition}")
        self.stream, self.partition = stream, partition

    def __str__(self) -> str:
        return self.args[0]


class InvalidStreamName(LogError, LocalProtocolError, ValueError):
    pass


class StreamExists(LogError):
    """create_stream with a config that contradicts the existing stream (e.g. partitions)."""


class QuotaExceeded(LogError, LocalProtocolError):
    """``create_stream`` would pass a partition quota of the log (``max_partitions_per_stream``,
    ``max_partitions_total``): nothing was created. Quotas bound what one careless or hostile
    client can make the node hold (folders, and descriptors once the partitions are used)."""


class CreateFailed(LogError):
    """``create_stream`` failed on the disk (e.g. out of descriptors): what it had made was
    removed again, so a retry starts clean. The cause chain holds the ``OSError``."""


class CorruptSegment(LogError):
    """Corruption found where the log cannot repair it (not a torn tail)."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt record at byte {offset}: {reason}")
        self.path, self.offset, self.reason = path, offset, reason

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:
        # pickled with its own arguments (a seal in the sealing child raises it)
        return (CorruptSegment, (self.path, self.offset, self.reason))


class LogLocked(LogError):
    """Another writer holds the data directory (one writer per data dir; readers use
    ``readonly=True``)."""

    def __init__(self, data_dir: str) -> None:
        super().__init__(
            f"data directory {data_dir} is locked by another writer; "
            "open it with readonly=True to read it"
        )
        self.data_dir = data_dir


STREAMS_DIR = "streams"
"""The folder of a data dir's streams, made by the first writer that opens it (``SegmentLog``):
what tells a loglake data dir from any other folder."""


class NotADataDir(LogError):
    """A command that reads a data dir, or publishes to a stream in one, was given a folder that
    is not one (a typo, most often): refused rather than made into a new, empty log."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} is not a loglake data directory (no {STREAMS_DIR}/ folder in it)")
        self.path = path


def check_data_dir(path: str | os.PathLike[str]) -> None:
    """``NotADataDir`` unless ``path`` holds a loglake data dir. Why: a command that only reads
    (``loglake log info``, ``archives follow``) or publishes to an existing stream (``archives
    build --publish``) opened a mistyped ``--data-dir`` as a new log: a writer left ``LOCK``,
    ``consumers.*`` and ``streams/`` behind before failing "unknown stream", a reader printed
    an empty log. Commands that create streams (``serve``, ``cardinal produce``) do not ask."""
    if not os.path.isdir(os.path.join(path, STREAMS_DIR)):
        raise NotADataDir(str(path))


def in_use_by_writer(data_dir: str, command: str) -> str:
    """What a ``loglake log`` command that needs the writer lock says when a writer holds the
    data dir: ``LogLocked``'s own text speaks to a programmer (``readonly=True``), the user
    needs to know who has it and what to do (``verify --repair``'s ``RepairRefused``,
    ``retention``)."""
    return (
        f"data directory {data_dir} is in use by a writer (a running `loglake serve`?): "
        f"stop it, then run `{command}` again"
    )


class CorruptStore(LogError, DecodeError):
    """A metadata file of the data dir (stream config, consumer index store) is damaged in a
    way a crash cannot cause; the log refuses to guess."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class StorageFailed(LogError):
    """The disk refused an fsync (or the write of the durable watermark): what was written
    since the last good fsync may be lost, so the appends waiting for it fail and the partition
    refuses appends until it reopens. Retrying the fsync could report success for pages the
    kernel already dropped, so ``SegmentLog`` instead reopens the partition from disk (the
    recovery of ``open_log``), automatically, on an append once a back-off has passed; an
    append before that, or while reopening keeps failing, gets this error too, saying when the
    next attempt is. The cause chain holds the ``OSError`` (ENOSPC, EIO)."""

    retriable = True  # the reopen after the back-off may succeed (space freed, a disk back)


class RetentionFailed(LogError):
    """``enforce_retention`` failed for some partitions; every other partition was still
    trimmed. ``dropped`` counts what was trimmed, ``errors`` holds ``(stream, partition,
    exception)`` per failed partition."""

    def __init__(self, dropped: int, errors: list[tuple[str, int, BaseException]]) -> None:
        first = "; ".join(f"{s}/{p}: {e}" for s, p, e in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        super().__init__(f"retention failed for {len(errors)} partition(s): {first}{more}")
        self.dropped, self.errors = dropped, errors


class LogClosed(LogError, LocalProtocolError):
    """The log was closed."""


class ReadOnlyLog(LogError, LocalProtocolError):
    """A write was asked of a log opened with ``readonly=True``."""


def ascii_digits(text: str | bytes) -> bool:
    """Whether ``text`` is ASCII digits alone, as every number in a name, an address or a
    stored key is: ``isdigit`` alone also takes "²" (which ``int`` refuses: a foreign file so
    named failed the log's open) and any script's digits, "٣" or "３" (which ``int`` reads)."""
    return text.isascii() and text.isdigit()


def check_stream_name(name: str) -> str:
    if not isinstance(name, str) or not STREAM_NAME_RE.fullmatch(name):
        raise InvalidStreamName(
            f"invalid stream name {shown(name)}: use 1-200 characters from A-Z a-z 0-9 _ . : -, "
            "not starting with _ or ."
        )
    return name


INDEX_MAX = 2**64 - 1
"""The largest consumer index (a uint64, as the Ockam stream service carries it)."""


class InvalidIndex(LogError, LocalProtocolError, ValueError):
    """A consumer index outside ``0..INDEX_MAX``."""


def check_index(index: int) -> int:
    """``index`` if it can be saved as a consumer index, else ``InvalidIndex`` (before, the
    log on disk raised a bare ``struct.error`` and the in-memory one stored it)."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= INDEX_MAX:
        raise InvalidIndex(f"consumer index {index!r} is not in 0..2^64-1")
    return index


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
TIMESTAMP_MIN, TIMESTAMP_MAX = INT64_MIN, INT64_MAX
"""A record's ``timestamp_ns`` is an int64 (the segment frame's ``timestamp_ns:i64``, the
lake's ``timestamp_ns`` column)."""


class InvalidTimestamp(LogError, LocalProtocolError, ValueError):
    """An ``Entry.timestamp_ns`` that is not an int64 of nanoseconds."""


def check_timestamp(timestamp_ns: int) -> int:
    """``timestamp_ns`` if a record can carry it, else ``InvalidTimestamp`` (the log on disk
    raised a bare ``struct.error`` and the in-memory one stored it). An ``int`` or another
    integer type (``operator.index``: numpy's), not ``bool``."""
    try:
        if isinstance(timestamp_ns, bool):
            raise TypeError
        value = operator.index(timestamp_ns)
    except TypeError:
        raise InvalidTimestamp(f"timestamp_ns {timestamp_ns!r} is not an integer") from None
    if not TIMESTAMP_MIN <= value <= TIMESTAMP_MAX:
        raise InvalidTimestamp(f"timestamp_ns {value} is not in -2^63..2^63-1")
    return value


def check_timestamps(entries: Sequence[Entry]) -> None:
    """``check_timestamp`` for every entry that carries a timestamp, before the log writes
    any of them: a batch is refused whole, never half-written (``SegmentLog`` writes a large
    batch a chunk at a time)."""
    for e in entries:
        ts = e.timestamp_ns
        # inline for the common case (an int in range): this runs once per appended entry
        if ts is not None and not (type(ts) is int and TIMESTAMP_MIN <= ts <= TIMESTAMP_MAX):
            check_timestamp(ts)


class NotOwner(LogError):
    """A save of a consumer index another identity owns (``Log.save_index_as``)."""

    def __init__(self, key: tuple[str, str, int], owner: str, who: str) -> None:
        self.owner, self.who = owner, who
        client, stream, partition = key
        super().__init__(
            f"consumer {client!r} of {stream}/{partition} belongs to {owner}; "
            f"{who} may not save its index (needs the owner, or a consume grant)"
        )


class UnsupportedByBackend(LogError, LocalProtocolError):
    """This log backend cannot do what was asked (e.g. keep consumer owners)."""


@dataclass(frozen=True, slots=True)
class Record:
    stream: str
    partition: int
    index: int
    timestamp_ns: int
    key: bytes | None
    headers: Headers
    data: bytes


@dataclass(frozen=True, slots=True)
class Entry:
    """What a writer hands to ``append``; the log assigns index (and timestamp if None)."""

    data: bytes
    key: bytes | None = None
    headers: Headers = ()
    timestamp_ns: int | None = None


MAX_RETENTION_MS = INT64_MAX // 1_000_000
"""``retention_ms`` and ``lake_retention_ms`` at most (292 years): each becomes int64
nanoseconds (the horizon against records' timestamps, JetStream's ``max_age``), which a longer
one overflows. ``retention_bytes`` and ``retention_records`` are int64 (JetStream's
``max_bytes`` and ``max_msgs``)."""
RETENTION_BOUNDS = {
    "retention_ms": MAX_RETENTION_MS,
    "retention_bytes": INT64_MAX,
    "retention_records": INT64_MAX,
    "lake_retention_ms": MAX_RETENTION_MS,
}
"""Each retention field of ``StreamConfig`` and the most it holds."""


@dataclass(frozen=True, slots=True)
class StreamConfig:
    partitions: int = 1
    durability: Durability = "batch"
    segment_bytes: int = 64 * 1024 * 1024
    retention_ms: int | None = None
    retention_bytes: int | None = None
    retention_records: int | None = None
    seal_to_lake: bool = True
    """Write each rolled segment as Parquet under ``<data_dir>/lake/``."""
    lake_retention_ms: int | None = None
    """Lake files whose newest record is older than this are deleted by ``enforce_retention``;
    None (default): the lake keeps sealed history forever."""

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise LocalProtocolError(f"partitions must be >= 1, got {self.partitions}")
        if self.durability not in ("always", "batch", "none"):
            raise LocalProtocolError(
                f"durability must be always|batch|none, not {self.durability!r}"
            )
        if self.segment_bytes < 1:
            raise LocalProtocolError(f"segment_bytes must be >= 1, got {self.segment_bytes}")
        for name, most in RETENTION_BOUNDS.items():
            value = getattr(self, name)
            if value is not None and not 0 <= value <= most:
                raise LocalProtocolError(f"{name} must be 0..{most} or None, got {value}")


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    first_index: int
    """Lowest index still readable (segments or lake); equals next_index when empty."""
    next_index: int
    """The index the next append gets (for a read-only log: one past what it can read)."""
    bytes: int = 0
    durable_next: int | None = None
    """One past the newest record known to be on disk, which is as far as readers see
    (``SegmentLog``; a ``durability="none"`` stream says ``next_index``). None: the backend
    does not tell (``MemoryLog``: every record is readable at once)."""


@dataclass(frozen=True, slots=True)
class SealFailure:
    """A rolled segment the lake could not take yet (it is retried with back-off; retention
    of the partition waits for it)."""

    segment: str
    """The segment file."""
    error: str
    attempts: int
    since_ns: int
    """When the first failed attempt for this segment ended (wall clock)."""


@dataclass(frozen=True, slots=True)
class StorageFailure:
    """A partition whose fsync (or durable-watermark write) failed: its pending appends failed
    and it refuses appends until it is reopened from disk, which the log tries on an append
    once a back-off has passed (0.1 s, doubling up to 30 s while reopening fails)."""

    error: str
    """What failed the partition (e.g. ``fsync failed ([Errno 5] …)``)."""
    since_ns: int
    """When it failed (wall clock)."""
    reopen_attempts: int = 0
    """Reopen attempts that failed since."""
    reopen_error: str | None = None
    """Why the last reopen attempt failed."""


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    """What is wrong with one partition, for ``loglake log info`` and a metrics endpoint."""

    stream: str
    partition: int
    storage_failed: str | None = None
    """Why appends are refused until the partition reopens (a failed fsync), or None."""
    seal_failure: SealFailure | None = None
    retention_error: str | None = None
    """The last ``enforce_retention`` failure of this partition, or None."""
    storage_failure: StorageFailure | None = None
    """The details of ``storage_failed``: since when, reopen attempts, the last one's error."""
    reopens: int = 0
    """Times this partition was reopened after a storage failure since the log was opened
    (the writer's count; a read-only log says 0)."""

    @property
    def ok(self) -> bool:
        return not (self.storage_failed or self.seal_failure or self.retention_error)


@dataclass(frozen=True, slots=True)
class IndexOp:
    """One consumer-index request of a group (``Log.index_ops``): a get when ``index`` is
    None, else a save (by ``owner`` when it is not None: ``save_index_as``)."""

    client_id: str
    stream: str
    partition: int = 0
    index: int | None = None
    owner: str | None = None
    override: bool = False


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    config: StreamConfig
    partitions: tuple[PartitionInfo, ...] = field(default=())

    @property
    def records(self) -> int:
        return sum(p.next_index - p.first_index for p in self.partitions)


class Log(ABC):
    """A set of named, partitioned, append-only streams plus durable consumer indexes."""

    # -- streams ------------------------------------------------------------------------
    @abstractmethod
    def create_stream(self, name: str, config: StreamConfig | None = None) -> StreamInfo:
        """Create ``name``, or return the existing stream (Ockam: CREATE on an existing stream
        answers INIT). Raises ``StreamExists`` if ``config.partitions`` contradicts it."""

    def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        """Give ``name`` at least ``partitions`` partitions: new, empty ones after the existing
        ones, whose records, indexes and consumer indexes are untouched (asking for no more
        than it has changes nothing). Why: the Ockam reference answers a CREATE for more
        partitions than a stream has by starting workers for the missing ones
        (``stream/workers/service.ex``, ``ensure_streams``). ``UnknownStream`` if there is no
        such stream; the partition quotas of ``create_stream`` apply (``QuotaExceeded``). A
        backend that cannot grow a stream raises ``UnsupportedByBackend``."""
        raise UnsupportedByBackend(f"{type(self).__name__} cannot add partitions to a stream")

    @abstractmethod
    def streams(self) -> list[str]: ...

    @abstractmethod
    def stream_info(self, name: str) -> StreamInfo: ...

    def has_stream(self, name: str) -> bool:
        return name in self.streams()

    def partition_count(self, stream: str) -> int:
        """How many partitions ``stream`` has (``UnknownStream``). A log that opens partitions
        lazily answers without opening any, so routing a request never costs descriptors."""
        return len(self.stream_info(stream).partitions)

    # -- writing --------------------------------------------------------------------------
    @abstractmethod
    def append_many(
        self, stream: str, entries: Sequence[Entry], *, partition: int = 0
    ) -> list[int]:
        """Append in order; return the assigned indexes once durable per the stream's policy."""

    def append_payloads(
        self, stream: str, datas: Sequence[bytes], *, partition: int = 0
    ) -> list[int]:
        """``append_many`` of records that are only data (no key, no headers, the log's
        timestamp): the stream service's push path. A backend may encode these without building
        an ``Entry`` per record; the records stored are the same."""
        return self.append_many(stream, [Entry(d) for d in datas], partition=partition)

    def append_payloads_then(
        self,
        stream: str,
        datas: Sequence[bytes],
        done: Callable[[BaseException | None], None],
        *,
        partition: int = 0,
    ) -> list[int]:
        """``append_payloads`` split in two: return the indexes once the records are written,
        and call ``done(None)`` once they are durable per the stream's policy, or
        ``done(error)`` if making them durable failed (then they must not be acknowledged).
        ``done`` may run on another thread (the one whose fsync covered them): it must be
        quick and must not block. An error before anything was written is raised here and
        ``done`` is not called. Why: a server can write its next batch while this one is
        fsynced. This default waits (``append_payloads``) and then calls ``done``."""
        indexes = self.append_payloads(stream, datas, partition=partition)
        done(None)
        return indexes

    def append(
        self,
        stream: str,
        data: bytes,
        *,
        partition: int = 0,
        key: bytes | None = None,
        headers: Headers = (),
        timestamp_ns: int | None = None,
    ) -> int:
        return self.append_many(
            stream, [Entry(data, key, headers, timestamp_ns)], partition=partition
        )[0]

    # -- reading --------------------------------------------------------------------------
    @abstractmethod
    def read(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        end: int | None = None,
        *,
        partition: int = 0,
    ) -> list[Record]:
        """Records with ``start <= index < end``, at most ``limit`` of them, in index order.
        A start below ``first_index`` begins at ``first_index`` (Ockam: indexes returned MAY
        NOT start at the requested one, but MUST NOT be lower). Past the end → ``[]``."""

    def read_payloads(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        *,
        partition: int = 0,
        max_bytes: int | None = None,
    ) -> list[tuple[int, bytes]]:
        """``(index, data)`` of what ``read`` returns (the stream service's pull, which carries
        nothing else): a backend may skip building a ``Record`` per row. ``max_bytes``: only
        the first rows whose data fits in it (the first row always): the stream service's
        ``max_pull_bytes``, which a backend should stop reading at (``SegmentLog`` does)."""
        rows = [
            (r.index, r.data) for r in self.read(stream, start, limit=limit, partition=partition)
        ]
        return rows if max_bytes is None else cap_bytes(rows, max_bytes)

    def iter_records(
        self,
        stream: str,
        start: int = 0,
        end: int | None = None,
        batch: int = 4096,
        *,
        partition: int = 0,
    ) -> Iterator[Record]:
        """Stream a range in bounded memory."""
        pos = start
        while end is None or pos < end:
            chunk = self.read(stream, pos, limit=batch, end=end, partition=partition)
            if not chunk:
                return
            yield from chunk
            pos = chunk[-1].index + 1

    def read_tables(
        self, stream: str, start: int = 0, end: int | None = None, *, partition: int = 0
    ) -> Iterator[pa.Table]:
        """The records of ``iter_records`` as ``pyarrow`` tables in the lake's schema
        (``loglake.log.lake_schema.LAKE_SCHEMA``: what a sealed Parquet file holds), for readers
        that want columns (Spark tasks). A backend may build them without a ``Record`` per row
        (``SegmentLog`` does)."""
        from loglake.log.lake import records_table

        pos = start
        while end is None or pos < end:
            chunk = self.read(stream, pos, limit=8192, end=end, partition=partition)
            if not chunk:
                return
            yield records_table(chunk, stream, partition)
            pos = chunk[-1].index + 1

    def next_index(self, stream: str, *, partition: int = 0) -> int:
        return self.stream_info(stream).partitions[partition].next_index

    # -- consumer indexes (the Ockam index service) ----------------------------------------
    # One vocabulary with ``loglake.streams.Streams``: ``get_index`` / ``save_index(client_id,
    # stream, index, partition=0)``, and one rule for a lower save: the stored index is not
    # changed and is returned (Ockam: "it MUST NOT be changed"; the index service answers with
    # the stored value). ``get_index`` returns None where ``Streams.get_index`` answers 0
    # (the service's job, not the storage's; no record is written for it).
    @abstractmethod
    def get_index(self, client_id: str, stream: str, *, partition: int = 0) -> int | None:
        """The stored index, or None if this client never saved one."""

    @abstractmethod
    def save_index(self, client_id: str, stream: str, index: int, *, partition: int = 0) -> int:
        """Store ``index`` monotonically and durably; return the stored value (the old one,
        unchanged, when ``index`` is lower — nothing is written then)."""

    def consumer_indexes(self) -> dict[tuple[str, str, int], int]:
        """Every saved consumer index, ``(client_id, stream, partition) → index`` (what an
        operator lists to see consumers and their lag). A backend that cannot list its
        consumers returns none."""
        return {}

    # Consumers that belong to someone: under authentication the first identity to save a
    # client id's index owns it, and only the owner (or a ``consume`` grant: ``override``) may
    # save it again; an operator may reset or delete any. A backend that cannot keep owners
    # refuses with ``UnsupportedByBackend`` rather than save without the check.
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
        """``save_index`` by ``owner``: a consumer nobody owns becomes ``owner``'s (durably, in
        the same write); one another identity owns raises ``NotOwner`` unless ``override``."""
        raise UnsupportedByBackend(f"{type(self).__name__} cannot keep consumer owners")

    def index_owner(self, client_id: str, stream: str, *, partition: int = 0) -> str | None:
        """The identity that owns the consumer, or None (never saved under authentication)."""
        return None

    def reset_index(
        self, client_id: str, stream: str, index: int | None, *, partition: int = 0
    ) -> int | None:
        """An operator's reset: set the consumer's index to ``index`` even if lower (its owner
        stays), or with None delete the consumer and its owner. Returns the index before."""
        raise UnsupportedByBackend(f"{type(self).__name__} cannot reset consumer indexes")

    def index_ops(self, ops: Sequence[IndexOp]) -> list[int | Exception | None]:
        """Perform ``ops`` in order, as ``get_index`` / ``save_index`` / ``save_index_as``
        would one by one, and give each one's value or the exception it raised (the others
        go on). A backend that writes to disk makes the group one write and one fsync (the
        index service's group commit: a client's thousands of pipelined saves are not
        thousands of fsyncs); no save is visible to a get outside the group before that fsync."""
        out: list[int | Exception | None] = []
        for op in ops:
            try:
                if op.index is None:
                    out.append(self.get_index(op.client_id, op.stream, partition=op.partition))
                elif op.owner is None:
                    out.append(
                        self.save_index(op.client_id, op.stream, op.index, partition=op.partition)
                    )
                else:
                    out.append(
                        self.save_index_as(
                            op.client_id,
                            op.stream,
                            op.index,
                            op.owner,
                            op.override,
                            partition=op.partition,
                        )
                    )
            except Exception as e:
                out.append(e)
        return out

    # -- maintenance ----------------------------------------------------------------------
    def enforce_retention(self, now_ns: int | None = None) -> int:
        """Apply each stream's retention; return how many records were dropped."""
        return 0

    def truncate_before(self, stream: str, index: int, *, partition: int = 0) -> int:
        """Drop records with index < ``index`` from the live log; return how many were dropped.

        A backend may work at its own granularity (whole segments) but never drops a record
        whose index is >= ``index``. Records a backend also keeps elsewhere (the lake of a
        ``seal_to_lake`` stream) stay readable there; without ``seal_to_lake``, what is
        dropped is gone. Consumer indexes are not changed."""
        raise NotImplementedError(f"{type(self).__name__} does not implement truncate_before")

    def flush(self) -> None:
        """Make everything appended so far durable."""

    def close(self) -> None:
        """Release files; the log is unusable afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cap_bytes(rows: list[tuple[int, bytes]], max_bytes: int) -> list[tuple[int, bytes]]:
    """The first of ``(index, data)`` ``rows`` whose data fits in ``max_bytes`` together (the
    first always): what a pull capped at ``max_bytes`` sends (``Log.read_payloads``)."""
    size = 0
    for k, (_, data) in enumerate(rows):
        size += len(data)
        if size > max_bytes and k:
            return rows[:k]
    return rows
