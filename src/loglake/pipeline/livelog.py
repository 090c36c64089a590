"""Adapters from a live loglake stream to Arrow batches: the part of a read that is not sealed.

Two places hold live records: a local data dir (the storage engine, opened read-only with
``loglake.log.open_log(data_dir, readonly=True)``, which shows only what the writer fsynced)
and a running node (the Ockam stream protocol through ``loglake.streams.client.StreamClient``,
option ``url``). Both answer the same two
questions — which partitions with which ``[first_index, next_index)``, and the records of a range —
so the data source and ``read()`` do not care where the tail lives.

Over the Ockam wire a message is only ``(index, data)`` (``StreamMessage`` in the spec), so rows
read through ``url`` have no key, no headers and ``timestamp_ns`` = null. Partitions and their
``[first_index, next_index)`` come from loglake's stream-info extension of the protocol
(``StreamClient.info``); against a server without it, ``partitionCount`` gives the partition count
and ``next_index`` is found by a binary search of one-record pulls ("pull returns messages with
index >= i" is monotone in ``i``): O(log n) round trips that do not read the data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

import pyarrow as pa

from loglake.log import open_log
from loglake.log.api import Log, UnknownStream
from loglake.log.lake_schema import LAKE_SCHEMA
from loglake.pipeline.errors import BadOption

if TYPE_CHECKING:
    from loglake.streams import StreamClient

READ_BATCH = 8192


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
        log = open_log_readonly(self.data_dir)
        try:
            # columns from the segments' bytes, no Record per row (Log.read_tables)
            for table in log.read_tables(stream, start, end, partition=partition):
                yield from table.to_batches(max_chunksize=READ_BATCH)
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
        client = self.client()
        try:
            pos = start
            while pos < end:
                msgs = client.pull(stream, pos, min(READ_BATCH, end - pos), partition=partition)
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


def data_dir_option(value: str | None) -> str:
    """Validate the ``data_dir`` option and make it absolute (executors run elsewhere)."""
    if not value:
        raise BadOption("data_dir", value, "required (the loglake data directory)")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise BadOption("data_dir", value, "no such directory")
    return str(path.resolve())
