"""The one stream API every other part uses (DESIGN.md: "Every other part uses a stream through
this one API").

It is the Ockam stream service's operations — create (plain or partitioned), push, pull(index,
limit), and the index service's get/save — as a ``typing.Protocol``. Two things satisfy it:
``LocalStreams`` (in-process, straight on a ``Log``) and the TCP client in
``loglake.streams.client`` (over the wire to ``loglake serve``). A part written against
``Streams`` runs embedded in a test and against a remote node unchanged.

Over the Ockam wire a message is only ``(index, data)``: anything else a part needs (keys,
headers) travels inside ``data``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from loglake.log.api import Log, StreamConfig, StreamExists, UnknownPartition, UnknownStream
from loglake.log.api import check_stream_name as check_stream_name  # re-exported: the name rule
from loglake.structured_logging import log_event


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """``StreamMessage {index: uint, data: data}`` of the Ockam spec."""

    index: int
    data: bytes


def warn_gap(
    logger: logging.Logger, start: int, got: Sequence[StreamMessage], **where: object
) -> None:
    """A warning when a pull from ``start`` began later: retention removed the records
    between, and a reader that moves its cursor past them would skip them without a word (the
    data is gone; the report is what is left to give)."""
    if got and got[0].index > start:
        log_event(
            logger,
            logging.WARNING,
            "records no longer kept (retention) skipped",
            **where,
            first_missing=start,
            next_kept=got[0].index,
        )


@runtime_checkable
class Streams(Protocol):
    def create_stream(self, name: str | None = None, partitions: int = 1) -> str:
        """Create (or open) a stream; return its name (random if ``name`` is None)."""
        ...

    def partitions(self, stream: str) -> int:
        """How many partitions ``stream`` has; ``UnknownStream`` if there is no such stream."""
        ...

    def push(self, stream: str, data: bytes, partition: int = 0) -> int:
        """Store ``data``; return its index once acknowledged."""
        ...

    def push_many(self, stream: str, datas: Sequence[bytes], partition: int = 0) -> list[int]: ...

    def pull(self, stream: str, index: int, limit: int, partition: int = 0) -> list[StreamMessage]:
        """At most ``limit`` messages with index >= ``index``."""
        ...

    def bounds(self, stream: str, partition: int = 0) -> tuple[int, int]:
        """``(first index kept, next index)`` of a partition: what a reader can pull is
        ``range(*bounds)`` (equal when it holds nothing). ``UnknownStream``/``UnknownPartition``
        if there is no such partition."""
        ...

    def get_index(self, client_id: str, stream: str, partition: int = 0) -> int:
        """The consumer's saved index; 0 when it never saved one (Ockam: "a new record MUST be
        created with an index 0": a record of 0 answers every get and save as no record does,
        so none is written — docs/streams.md, deviation 4)."""
        ...

    def save_index(self, client_id: str, stream: str, index: int, partition: int = 0) -> int:
        """Save monotonically; a lower index leaves the stored one unchanged and returns it."""
        ...

    def truncate_before(self, stream: str, index: int, partition: int = 0) -> int:
        """Drop messages below ``index`` from the live stream where the implementation can
        (``Log.truncate_before``'s rules); ``NotImplementedError`` where it cannot — the Ockam
        protocol has no deletion API (the spec leaves "stream cleanup/deletion" as a TODO)."""
        ...


class LocalStreams:
    """``Streams`` on an in-process ``Log``."""

    def __init__(self, log: Log, default_config: StreamConfig | None = None) -> None:
        self.log = log
        self.default_config = default_config or StreamConfig()

    @classmethod
    def open(cls, data_dir: str | Path, **log_options: Any) -> LocalStreams:
        """``Streams`` on the embedded, crash-safe log in ``data_dir`` (``open_log``'s
        options), so a part needs nothing from ``log`` to keep durable state; ``close()`` it."""
        from loglake.log import open_log

        return cls(open_log(data_dir, **log_options))

    def close(self) -> None:
        self.log.close()

    def create_stream(self, name: str | None = None, partitions: int = 1) -> str:
        """Create ``name``, or open it if it exists: with fewer partitions than asked it is
        grown (``Log.grow_stream``), with as many or more it is left as it is. Why: that is what
        the stream service answers a CREATE over TCP (``StreamService``, after the Ockam
        reference's ``ensure_streams``), so a part runs the same on ``LocalStreams`` and on a
        ``StreamClient``. A backend that cannot grow raises ``UnsupportedByBackend``."""
        import uuid

        name = name or f"stream-{uuid.uuid4().hex}"
        config = replace(self.default_config, partitions=partitions)  # refuses partitions < 1
        try:
            self.log.create_stream(name, config)
        except StreamExists:  # it exists with another count
            self.log.grow_stream(name, partitions)
        return name

    def partitions(self, stream: str) -> int:
        return self.log.stream_info(stream).config.partitions

    def push(self, stream: str, data: bytes, partition: int = 0) -> int:
        return self.log.append(stream, data, partition=partition)

    def push_many(self, stream: str, datas: Sequence[bytes], partition: int = 0) -> list[int]:
        return self.log.append_payloads(stream, datas, partition=partition)

    def pull(self, stream: str, index: int, limit: int, partition: int = 0) -> list[StreamMessage]:
        return [
            StreamMessage(i, d)
            for i, d in self.log.read_payloads(stream, index, limit, partition=partition)
        ]

    def bounds(self, stream: str, partition: int = 0) -> tuple[int, int]:
        parts = self.log.stream_info(stream).partitions
        if not 0 <= partition < len(parts):
            raise UnknownPartition(stream, partition, len(parts))
        p = parts[partition]
        # what a pull returns: the durable prefix (``durable_next``), not ``next_index``, which
        # counts records another thread has written and not yet fsynced. Why: a part that read
        # ``range(*bounds)`` stopped short of the end it was given (a replay opened during an
        # import completed without the import's last records)
        return p.first_index, p.next_index if p.durable_next is None else p.durable_next

    def get_index(self, client_id: str, stream: str, partition: int = 0) -> int:
        if not self.log.has_stream(stream):
            raise UnknownStream(stream)
        stored = self.log.get_index(client_id, stream, partition=partition)
        # never saved: 0, and no record written (as the index service answers it)
        return 0 if stored is None else stored

    def save_index(self, client_id: str, stream: str, index: int, partition: int = 0) -> int:
        return self.log.save_index(client_id, stream, index, partition=partition)

    def truncate_before(self, stream: str, index: int, partition: int = 0) -> int:
        return self.log.truncate_before(stream, index, partition=partition)
