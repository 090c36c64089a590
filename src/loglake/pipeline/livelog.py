"""Adapters from a live loglake stream to Arrow batches: the part of a read that is not sealed.

Three places hold live records: a local data dir (the storage engine, opened read-only with
``loglake.log.open_log(data_dir, readonly=True)``, which shows only what the writer fsynced),
a running node (the Ockam stream protocol through ``loglake.streams.client.StreamClient``,
option ``url``) and a NATS JetStream cluster that a node keeps its streams in (option
``backend``, ``NatsSource``). All answer the same two
questions — which partitions with which ``[first_index, next_index)``, and the records of a range —
so the data source and ``read()`` do not care where the tail lives.

Over the Ockam wire a message is only ``(index, data)`` (``StreamMessage`` in the spec), so rows
read through ``url`` have no key, no headers and ``timestamp_ns`` = null. Partitions and their
``[first_index, next_index)`` come from loglake's stream-info extension of the protocol
(``StreamClient.info``); against a server without it, ``partitionCount`` gives the partition count
and ``next_index`` is found by a binary search of one-record pulls ("pull returns messages with
index >= i" is monotone in ``i``): O(log n) round trips that do not read the data.

Through ``backend`` the reader goes to JetStream itself, not through a node: a loglake index is
the JetStream sequence − 1 (``streams/jetstream.py``), so the offsets a streaming query
checkpoints are stream sequences, and rows carry keys, headers and timestamps as pushed. The
sealer copies the same records, with the same indexes, into the data dir's lake, so a range is
read from whichever holds it (``datasource.read_range``): the lake's files where they cover,
JetStream for the rest.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa

from loglake.log import open_log
from loglake.log.api import Log, UnknownStream
from loglake.log.lake_schema import LAKE_SCHEMA
from loglake.pipeline.errors import BadOption, LiveHistoryGone, check_dir

if TYPE_CHECKING:
    from loglake.streams import JetStreamLog, StreamClient, StreamMessage

READ_BATCH = 8192
_T = TypeVar("_T")


class LiveSource(Protocol):
    def partitions(self, stream: str) -> dict[int, tuple[int, int]] | None:
        """``{partition: (first_index, next_index)}``, or None if this source has no stream."""
        ...

    def read(
        self, stream: str, partition: int, start: int, end: int
    ) -> Iterator[pa.RecordBatch]: ...


def open_log_readonly(data_dir: str) -> Log:
    """The storage engine's read-only view of ``data_dir``. It never takes the writer's lock,
    and each partition shows only its durable prefix — the records below the writer's ``DURABLE``
    watermark, i.e. covered by an fsync — so a query never reads (and a streaming query never
    commits) a record a writer crash could still take back and whose index a later append would
    reuse. A stream whose policy is ``none`` is never known durable: readers
    see its whole records as they land (``loglake.log``'s rule)."""
    return open_log(data_dir, readonly=True)


@dataclass
class DirSource:
    """The live log of a local data dir."""

    data_dir: str

    def partitions(self, stream: str) -> dict[int, tuple[int, int]] | None:
        log = open_log_readonly(self.data_dir)
        try:
            if not log.has_stream(stream):
                return None
            info = log.stream_info(stream)
            return {p.partition: (p.first_index, p.next_index) for p in info.partitions}
        finally:
            log.close()

    def read(self, stream: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """``tables``, in batches of at most ``READ_BATCH`` records."""
        for table in self.tables(stream, partition, start, end):
            yield from table.to_batches(max_chunksize=READ_BATCH)

    def tables(self, stream: str, partition: int, start: int, end: int) -> Iterator[pa.Table]:
        """``[start, end)`` in index order, as the log's tables (``Log.read_tables``: columns
        from the segments' bytes, no Record per row). A head the log no longer holds
        (retention removed it after the plan, or before a streaming query resumed from a
        checkpoint) raises ``LiveHistoryGone``, as ``NatsSource.read`` does: the log reads from
        its first index, and those rows alone were a silent gap in the output."""
        log = open_log_readonly(self.data_dir)
        try:
            checked = start >= end
            for table in log.read_tables(stream, start, end, partition=partition):
                if not checked and table.num_rows:
                    first = table.column("index")[0].as_py()
                    if first != start:
                        raise LiveHistoryGone(stream, partition, start, first, self.data_dir)
                    checked = True
                yield table
            if not checked:  # nothing at all: below the first index, or not written yet
                first = log.stream_info(stream).partitions[partition].first_index
                if first > start:
                    raise LiveHistoryGone(stream, partition, start, min(first, end), self.data_dir)
        finally:
            log.close()


def parse_url(url: str) -> tuple[str, int]:
    """``loglake://host:port``, ``tcp://host:port`` or ``host:port``."""
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    if parts.scheme not in ("loglake", "tcp") or not parts.hostname:
        raise BadOption("url", url, "expected loglake://HOST:PORT")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not port:
        raise BadOption("url", url, "expected loglake://HOST:PORT (no port)")
    return parts.hostname, port


@dataclass
class UrlSource:
    """A stream on a running node, over the Ockam stream protocol."""

    url: str
    partition_count: int = 1

    def client(self) -> StreamClient:
        host, port = parse_url(self.url)
        from loglake.streams import StreamClient  # lazily: the client is optional

        return StreamClient(host, port)

    def partitions(self, stream: str) -> dict[int, tuple[int, int]] | None:
        # every partition's ``Streams.bounds`` in one round trip (loglake's stream-info)
        with self.client() as client:
            try:
                summaries = client.info(stream)
            except UnknownStream:
                return None
        return {p.partition: (p.first_index, p.next_index) for p in summaries[0].partitions}

    def read(self, stream: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """``[start, end)`` in index order. A head the server no longer holds (its retention
        removed it after the plan, before a streaming query resumed from a checkpoint, or
        between two pulls of this read)
        raises ``LiveHistoryGone``, as ``DirSource.read`` does: a pull answers from the first
        index it keeps, and those rows alone were a silent gap in the output."""
        client = self.client()
        try:
            pos = start
            while pos < end:
                msgs = client.pull(stream, pos, min(READ_BATCH, end - pos), partition=partition)
                # every pull: retention can overtake the read between two pulls, too
                self._check_head(client, stream, partition, pos, end, msgs)
                msgs = [m for m in msgs if m.index < end]
                if not msgs:
                    return
                yield pa.RecordBatch.from_pydict(
                    {
                        "stream": [stream] * len(msgs),
                        "partition": [partition] * len(msgs),
                        "index": [m.index for m in msgs],
                        "timestamp_ns": [None] * len(msgs),
                        "key": [None] * len(msgs),
                        "headers": [[] for _ in msgs],
                        "data": [bytes(m.data) for m in msgs],
                    },
                    schema=LAKE_SCHEMA.set(3, pa.field("timestamp_ns", pa.int64(), nullable=True)),
                )
                pos = msgs[-1].index + 1
        finally:
            close = getattr(client, "close", None)
            if close:
                close()

    def _check_head(
        self,
        client: StreamClient,
        stream: str,
        partition: int,
        start: int,
        end: int,
        msgs: list[StreamMessage],
    ) -> None:
        """``LiveHistoryGone`` if a pull from ``start`` (of ``[start, end)``) did not begin there:
        the first message is past it, or there is none and the server's first kept index
        (``Streams.bounds``) is (the whole range removed)."""
        first = msgs[0].index if msgs else client.bounds(stream, partition)[0]
        if first > start:
            first = min(first, end)
            raise LiveHistoryGone(stream, partition, start, first, self.url)


NATS_READ_BATCH = 1000
"""Records per JetStream read: one batched direct get each, bounded in memory."""

NATS_FAILOVER_WAIT = 30.0
"""Seconds a read keeps asking while the cluster answers nothing before it fails with
``ClusterUnavailable``. A stream leader's SIGKILL took ~6 s to the next answer here (FIELD-NOTES);
failing a micro-batch for it would stop a streaming query that the next answer would let go on."""

_nats_logs: dict[tuple[str, str, str | None], JetStreamLog] = {}
_nats_lock = threading.Lock()


def _nats_log(backend: str, prefix: str, credentials: str | None) -> JetStreamLog:
    """One read-only connection per cluster and process, kept for the process's life: a Python
    worker is reused across tasks and micro-batches (``spark.python.worker.reuse``), and a
    connection (a thread, a connect, a handshake per server) costs more than a small batch."""
    from loglake.streams import JetStreamLog

    class ReadOnlyJetStreamLog(JetStreamLog):
        async def _bucket(self) -> None:
            # a reader never saves a consumer index: it must not create the index bucket
            # (with the wrong replica count) on a cluster whose node has not made it yet
            return None

    key = (backend, prefix, credentials)
    with _nats_lock:
        log = _nats_logs.get(key)
        if log is not None and not log._closed and not log.nc.is_closed:
            return log
        log = ReadOnlyJetStreamLog(backend, prefix=prefix, credentials=credentials)
        _nats_logs[key] = log
        return log


@dataclass(frozen=True)
class NatsSource:
    """The unsealed part of a stream kept in NATS JetStream (``loglake node --backend``).

    Frozen, small and picklable: it is what a task needs to reach the cluster (the servers, the
    prefix, the ``.creds`` path), so it travels to executors inside a plan (``units.Unit``);
    the connection itself is made there, once per process (``_nats_log``)."""

    backend: str
    prefix: str = "loglake"
    credentials: str | None = None

    def log(self) -> JetStreamLog:
        return _nats_log(self.backend, self.prefix, self.credentials)

    def _patient(self, what: Callable[[], _T]) -> _T:
        """``what()``, asked again while the cluster is unavailable (a failover), for up to
        ``NATS_FAILOVER_WAIT`` seconds."""
        import time

        from loglake.streams import ClusterUnavailable

        deadline = time.monotonic() + NATS_FAILOVER_WAIT
        while True:
            try:
                return what()
            except ClusterUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def streams(self) -> list[str]:
        """The loglake streams the cluster holds under this prefix."""
        log = self.log()
        return self._patient(log.streams)

    def partitions(self, stream: str) -> dict[int, tuple[int, int]] | None:
        log = self.log()  # no server reachable at all: fail now, no failover to wait for
        try:
            info = self._patient(lambda: log.stream_info(stream))
        except UnknownStream:
            return None
        return {p.partition: (p.first_index, p.next_index) for p in info.partitions}

    def read(self, stream: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """``[start, end)`` in index order, ``NATS_READ_BATCH`` records per round trip. A range
        JetStream no longer holds (its retention dropped the head) raises ``LiveHistoryGone``:
        the reader then looks for it in the lake again (the sealer may have just written it),
        and never skips it silently."""
        import time

        from loglake.log.lake import records_table
        from loglake.streams import ClusterUnavailable

        log = self.log()
        pos, deadline = start, None
        while pos < end:
            read = functools.partial(
                log.read,
                stream,
                pos,
                limit=min(NATS_READ_BATCH, end - pos),
                partition=partition,
                lake=False,
            )
            recs = self._patient(read)
            if recs:
                if recs[0].index != pos:
                    raise LiveHistoryGone(stream, partition, pos, recs[0].index)
                yield from records_table(recs, stream, partition).to_batches()
                pos, deadline = recs[-1].index + 1, None
                continue
            # Nothing from ``pos``, though the plan saw it below ``next_index``: either the head
            # was purged (say so), or the replica that answered has not applied it yet (a direct
            # get is served by any replica): ask again, within the cluster's request timeout.
            lo = (self.partitions(stream) or {}).get(partition, (pos, pos))[0]
            if lo > pos:
                raise LiveHistoryGone(stream, partition, pos, lo)
            wait = log.options.request_timeout
            if deadline is None:
                deadline = time.monotonic() + wait
            elif time.monotonic() > deadline:
                raise ClusterUnavailable(
                    f"read of {stream!r}/{partition} from index {pos}", wait, "no replica has it"
                )
            time.sleep(0.01)


def data_dir_option(value: str | None) -> str:
    """Validate the ``data_dir`` option and make it absolute (executors run elsewhere)."""
    if not value:
        raise BadOption("data_dir", value, "required (the loglake data directory)")
    path = Path(value).expanduser()
    check_dir("data_dir", value, path)
    return str(path.resolve())
