"""Streams and consumers: list, info, partition stats, create, read a range, consumer lag.

Records come back raw: ``data`` (and ``key``, header values) base64, with index, timestamp and
size; decoding a protocol's bytes is the console's job. A range read is bounded twice (``limit``
records, ``MAX_RANGE_BYTES`` of data) so one request cannot pull a partition into memory.

A stream whose stats cannot be read for damage on disk (``DAMAGED``) is listed with its
``error`` (and, in ``/metrics``, ``loglake_stream_unreadable``), not left out and not failing the
rest. Found from outside: one partition with a bad record inside its fsynced bytes turned
``GET /api/streams`` and the whole ``/metrics`` scrape into 500s (the first ``CorruptSegment``
of a ``stream_info`` aborted both), hiding every healthy stream.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Response
from pydantic import BaseModel, Field

from loglake.log import (
    CorruptSegment,
    CorruptStore,
    Log,
    StreamConfig,
    StreamExists,
    StreamInfo,
    UnknownPartition,
    UnknownStream,
)
from loglake.log.api import INT64_MAX, MAX_RETENTION_MS, STREAM_NAME_RE
from loglake.node.api.context import Node, NodeContext
from loglake.structured_logging import log_event

_logger = logging.getLogger(__name__)

DAMAGED: tuple[type[BaseException], ...] = (CorruptSegment, CorruptStore)
"""Damage on disk the log will not repair (not a torn tail): the stream's stats cannot be read
until an operator repairs it (``loglake log verify --repair``), whoever asks."""

router = APIRouter(tags=["streams"])

MAX_RANGE_RECORDS = 1000
MAX_RANGE_BYTES = 4 * 1024 * 1024
"""A range read stops once this much record data is collected (at least one record)."""
MAX_PARTITIONS = 256
PAGE_ROWS = 500
"""Rows a list (streams, consumers) answers when ``limit`` is not given."""
MAX_PAGE_ROWS = 5000
"""The largest ``limit`` of a list."""
TOTAL_HEADER = "X-Total-Count"
NEXT_HEADER = "X-Next-After"

Limit = Annotated[
    int, Query(ge=1, le=MAX_PAGE_ROWS, description=f"Rows at most (default {PAGE_ROWS})")
]
PAGE_HEADERS = {
    TOTAL_HEADER: {
        "description": "Rows in the whole list (every page)",
        "schema": {"type": "integer"},
    },
    NEXT_HEADER: {
        "description": "Pass as `after` for the next page; absent on the last page",
        "schema": {"type": "string"},
    },
}
"""The paged lists' headers, in the OpenAPI document."""
MAX_FILTER = 200
"""The longest ``contains`` filter of a list (a stream name is at most 200 characters)."""
Contains = Annotated[
    str | None,
    Query(
        max_length=MAX_FILTER,
        description="Only rows whose name holds this text (case-insensitive); the total and "
        "the pages are of the filtered list",
    ),
]

StreamName = Annotated[str, Path(description="Stream name", max_length=200)]
PartitionNo = Annotated[int, Path(ge=0, le=2**31 - 1, description="Partition number")]


class StreamConfigOut(BaseModel):
    partitions: int
    durability: str
    segment_bytes: int
    retention_ms: int | None
    retention_bytes: int | None
    retention_records: int | None
    seal_to_lake: bool


class PartitionStats(BaseModel):
    partition: int
    first_index: int
    next_index: int
    durable_next: int | None
    records: int
    bytes: int
    fsyncs: int | None = None
    """Group-commit fsyncs run by this partition since the node opened it."""
    storage_failed: str | None = None
    seal_failure: str | None = None
    retention_error: str | None = None


class StreamSummary(BaseModel):
    name: str
    partitions: int
    records: int | None
    """None: unreadable (``error``)."""
    bytes: int | None
    durability: str | None
    error: str | None = None
    """Why the stream's stats could not be read: damage on disk (``CorruptSegment``, naming
    the file and byte). None: readable."""
    pushed_records: int | None = None
    """Records pushed through this node since it started (None: metrics off)."""
    pulled_records: int | None = None
    push_rate: float | None = None
    """Records/s pushed over the last few seconds (None: metrics off)."""
    pull_rate: float | None = None


class StreamDetail(StreamSummary):
    config: StreamConfigOut
    partition_stats: list[PartitionStats]


class StreamCreate(BaseModel):
    name: str = Field(pattern=STREAM_NAME_RE.pattern, max_length=200)
    partitions: int = Field(1, ge=1, le=MAX_PARTITIONS)
    durability: Literal["always", "batch", "none"] | None = None
    segment_bytes: int | None = Field(None, ge=4096, le=2**40)
    retention_ms: int | None = Field(None, ge=0, le=MAX_RETENTION_MS)  # int64 ns downstream
    retention_bytes: int | None = Field(None, ge=0, le=INT64_MAX)
    retention_records: int | None = Field(None, ge=0, le=INT64_MAX)


class Header(BaseModel):
    key: str
    value: str
    """base64"""


class RecordOut(BaseModel):
    index: int
    timestamp_ns: int
    size: int
    """Bytes of ``data`` (decoded)."""
    data: str
    """base64 of the record's bytes."""
    key: str | None
    """base64, or None."""
    headers: list[Header]


class RecordRange(BaseModel):
    stream: str
    partition: int
    start: int
    first_index: int
    next_index: int
    records: list[RecordOut]
    next: int
    """Where the following page starts (``start`` when nothing was returned)."""
    truncated: bool
    """True when ``MAX_RANGE_BYTES`` cut the page short of ``limit``."""


class ConsumerOut(BaseModel):
    client_id: str
    stream: str
    partition: int
    index: int
    """The saved index: the next record this consumer will read."""
    next_index: int | None
    lag: int | None
    """Records between the saved index and the partition's end (None: the stream is
    unreadable, see ``GET /api/streams``)."""
    owner: str | None = None
    """The identity that owns the consumer (the first to save it under the stream service's
    access file); None: nobody."""


class ConsumerReset(BaseModel):
    client_id: str = Field(min_length=1, max_length=65_535)
    partition: int = Field(0, ge=0, le=2**31 - 1)
    index: int = Field(0, ge=0, le=2**64 - 1, description="The index to set, lower or not")


class ConsumerDelete(BaseModel):
    client_id: str = Field(min_length=1, max_length=65_535)
    partition: int = Field(0, ge=0, le=2**31 - 1)


class ConsumerChange(BaseModel):
    client_id: str
    stream: str
    partition: int
    before: int | None
    """The index before the change (None: there was none)."""
    index: int | None
    """The index now stored (None: deleted)."""


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _health(log: Log) -> dict[tuple[str, int], tuple[str | None, str | None, str | None]]:
    health = getattr(log, "health", None)
    if health is None:
        return {}
    out = {}
    for h in health():
        seal = (
            f"{h.seal_failure.segment}: {h.seal_failure.error} ({h.seal_failure.attempts} tries)"
            if h.seal_failure
            else None
        )
        out[(h.stream, h.partition)] = (h.storage_failed, seal, h.retention_error)
    return out


def _summary(node: NodeContext, info: StreamInfo) -> dict:
    out = {
        "name": info.name,
        "partitions": info.config.partitions,
        "records": info.records,
        "bytes": sum(p.bytes for p in info.partitions),
        "durability": info.config.durability,
    }
    if node.metrics is not None:
        out.update(node.metrics.stream_activity(info.name))
    return out


def _detail(node: NodeContext, info: StreamInfo) -> StreamDetail:
    fsync_count = getattr(node.log, "fsync_count", None)
    health = _health(node.log)
    stats = []
    for p in info.partitions:
        failed, seal, retention = health.get((info.name, p.partition), (None, None, None))
        stats.append(
            PartitionStats(
                partition=p.partition,
                first_index=p.first_index,
                next_index=p.next_index,
                durable_next=p.durable_next,
                records=p.next_index - p.first_index,
                bytes=p.bytes,
                fsyncs=fsync_count(info.name, p.partition) if fsync_count else None,
                storage_failed=failed,
                seal_failure=seal,
                retention_error=retention,
            )
        )
    c = info.config
    config = StreamConfigOut(
        partitions=c.partitions,
        durability=c.durability,
        segment_bytes=c.segment_bytes,
        retention_ms=c.retention_ms,
        retention_bytes=c.retention_bytes,
        retention_records=c.retention_records,
        seal_to_lake=c.seal_to_lake,
    )
    return StreamDetail(**_summary(node, info), config=config, partition_stats=stats)


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A stream whose ``stream_info`` failed with damage (``DAMAGED``)."""

    name: str
    partitions: int
    error: str


_reported: dict[str, str] = {}
"""The damage last logged per stream: each is logged once, not at every poll and scrape."""


def info_or_damage(log: Log, name: str) -> StreamInfo | Unreadable:
    """``log.stream_info(name)``, or what makes it unreadable (logged once per stream and
    error). Any other error propagates (``UnknownStream``, a closed log)."""
    try:
        info = log.stream_info(name)
    except DAMAGED as e:
        error = f"{type(e).__name__}: {e}"
        if _reported.get(name) != error:
            _reported[name] = error
            log_event(_logger, logging.ERROR, "stream unreadable", stream=name, error=error)
        try:
            partitions = log.partition_count(name)
        except DAMAGED:
            partitions = 0
        return Unreadable(name, partitions, error)
    _reported.pop(name, None)
    return info


def stream_infos(log: Log) -> list[StreamInfo | Unreadable]:
    """Every stream's info, a damaged one as ``Unreadable``: one damaged partition does not
    hide the others (a stream gone since ``streams()`` is left out)."""
    out: list[StreamInfo | Unreadable] = []
    for name in sorted(log.streams()):
        try:
            out.append(info_or_damage(log, name))
        except UnknownStream:
            continue
    return out


def _page_headers(response: Response, total: int, more: bool, last: str | None) -> None:
    response.headers[TOTAL_HEADER] = str(total)
    if more and last is not None:
        response.headers[NEXT_HEADER] = last


@router.get(
    "/streams",
    response_model=list[StreamSummary],
    summary="Streams, by name, a page at a time (total and next page in headers)",
    responses={200: {"headers": PAGE_HEADERS}},
)
def list_streams(
    node: Node,
    response: Response,
    limit: Limit = PAGE_ROWS,
    after: Annotated[
        str | None, Query(max_length=200, description="Only streams named after this one")
    ] = None,
    contains: Contains = None,
) -> list[dict]:
    """Stats are read for the page's streams only. Found from outside: anyone on the stream
    service may create streams, and the console polls this every second; ``contains`` finds a
    stream however many others sort before it (500 named ``0…`` hid every real one from the
    console's first page)."""
    names = sorted(node.log.streams())
    if contains:
        names = [n for n in names if _holds(n, contains)]
    total = len(names)
    if after is not None:
        names = [n for n in names if n > after]
    out: list[dict] = []
    rest = 0
    for i, name in enumerate(names):
        if len(out) == limit:
            rest = len(names) - i
            break
        try:
            x = info_or_damage(node.log, name)
        except UnknownStream:  # gone since streams()
            continue
        out.append(_summary(node, x) if isinstance(x, StreamInfo) else _unreadable(node, x))
    _page_headers(response, total, rest > 0, out[-1]["name"] if out else None)
    return out


def _holds(text: str, part: str) -> bool:
    """``part`` in ``text``, case-insensitive: a console filter."""
    return part.casefold() in text.casefold()


def _unreadable(node: NodeContext, x: Unreadable) -> dict:
    out = {"name": x.name, "partitions": x.partitions, "records": None, "bytes": None}
    out.update(durability=None, error=x.error)
    if node.metrics is not None:
        out.update(node.metrics.stream_activity(x.name))
    return out


@router.post(
    "/streams",
    response_model=StreamDetail,
    status_code=201,
    summary="Create a stream (200 with the stream if it exists, grown to `partitions` if fewer)",
    responses={200: {"model": StreamDetail}},
)
def create_stream(body: StreamCreate, node: Node, response: Response) -> StreamDetail:
    """An existing stream is answered as the stream service answers a CREATE over TCP: with
    fewer partitions than asked it is grown (``Log.grow_stream``, as the Ockam reference's
    ``ensure_streams``), with as many or more it is left as it is; 200 either way."""
    if node.log.has_stream(body.name):
        response.status_code = 200
    base = getattr(node.log, "default_config", None) or StreamConfig()
    changes = {
        k: v
        for k, v in body.model_dump().items()
        if k != "name" and v is not None and k in StreamConfig.__dataclass_fields__
    }
    try:
        info = node.log.create_stream(body.name, replace(base, **changes))
    except StreamExists:  # it exists with another partition count
        response.status_code = 200
        info = node.log.grow_stream(body.name, body.partitions)
    return _detail(node, info)


@router.get("/streams/{stream}", response_model=StreamDetail, summary="One stream, with stats")
def stream_info(stream: StreamName, node: Node) -> StreamDetail:
    return _detail(node, node.log.stream_info(stream))


@router.get(
    "/streams/{stream}/partitions",
    response_model=list[PartitionStats],
    summary="Partition stats: indexes, bytes, fsyncs, health",
)
def partitions(stream: StreamName, node: Node) -> list[PartitionStats]:
    return _detail(node, node.log.stream_info(stream)).partition_stats


@router.get(
    "/streams/{stream}/partitions/{partition}/records",
    response_model=RecordRange,
    summary="Read a range of records (raw, base64)",
)
def read_range(
    stream: StreamName,
    partition: PartitionNo,
    node: Node,
    start: Annotated[int, Query(ge=0, le=2**62, description="First index wanted")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_RANGE_RECORDS)] = 100,
) -> RecordRange:
    info = node.log.stream_info(stream)
    if partition >= len(info.partitions):
        raise UnknownPartition(stream, partition, len(info.partitions))
    p = info.partitions[partition]
    records: list[RecordOut] = []
    used, truncated = 0, False
    for r in node.log.read(stream, start, limit=limit, partition=partition):
        if records and used + len(r.data) > MAX_RANGE_BYTES:
            truncated = True
            break
        used += len(r.data)
        records.append(
            RecordOut(
                index=r.index,
                timestamp_ns=r.timestamp_ns,
                size=len(r.data),
                data=_b64(r.data),
                key=_b64(r.key) if r.key is not None else None,
                headers=[Header(key=k, value=_b64(v)) for k, v in r.headers],
            )
        )
    return RecordRange(
        stream=stream,
        partition=partition,
        start=start,
        first_index=p.first_index,
        next_index=p.next_index,
        records=records,
        next=records[-1].index + 1 if records else start,
        truncated=truncated,
    )


Candidate = tuple[str, str, int, int, int | None]
"""(client, stream, partition, index, partition end or None) of one saved consumer index."""


def _consumer_candidates(
    node: NodeContext, stream: str | None, contains: str | None = None
) -> list[Candidate]:
    """Every saved consumer index (of ``stream``; whose client id, or stream name when no
    ``stream`` is given, holds ``contains``) on a partition that exists, with its partition's
    end (None: the stream is unreadable); owners are not read here."""
    infos: dict[str, StreamInfo | Unreadable] = {}
    out: list[Candidate] = []
    for (client, name, partition), index in node.log.consumer_indexes().items():
        if stream is not None and name != stream:
            continue
        if contains and not (
            _holds(client, contains) or (stream is None and _holds(name, contains))
        ):
            continue
        if name not in infos:
            if not node.log.has_stream(name):
                continue
            infos[name] = info_or_damage(node.log, name)
        info = infos[name]
        if partition >= (info.partitions if isinstance(info, Unreadable) else len(info.partitions)):
            continue
        end = None if isinstance(info, Unreadable) else info.partitions[partition].next_index
        out.append((client, name, partition, index, end))
    return out


def _lag(c: Candidate) -> int | None:
    return None if c[4] is None else max(0, c[4] - c[3])


def consumer_lags(node: NodeContext) -> Iterator[tuple[str, str, int, int | None]]:
    """(client, stream, partition, lag) of every saved consumer index on a partition that
    exists (lag None: its stream is unreadable), in no order and without owners: ``/metrics``
    reads them all at every scrape, and keeps a bounded number (``node/metrics.py``)."""
    for c in _consumer_candidates(node, None):
        yield c[0], c[1], c[2], _lag(c)


def _row(node: NodeContext, c: Candidate) -> ConsumerOut:
    client, name, partition, index, end = c
    return ConsumerOut(
        client_id=client,
        stream=name,
        partition=partition,
        index=index,
        next_index=end,
        lag=_lag(c),
        owner=node.log.index_owner(client, name, partition=partition),
    )


ConsumerOrder = Literal["client", "lag"]
AFTER_CURSOR = "The X-Next-After header of the page before (order=client only)"
ORDER_DOC = (
    "client: by client id, stream, partition, paged with `after`; lag: the most behind first, "
    "one page (a top-N view: lags move between two requests, so a cursor would skip rows; "
    "`after` with it is a 400)"
)
LAG_AFTER = (
    "after: order=lag is one page, the most behind (lags move between two requests, so a "
    "cursor in lag order skips or repeats rows); page through every consumer with order=client"
)
_ORDER_KEYS: dict[str, Callable[[Candidate], tuple[Any, ...]]] = {
    "client": lambda c: (c[0], c[1], c[2]),
    # most behind first; an unreadable stream's (lag unknown) after every known lag
    "lag": lambda c: (-(lag if (lag := _lag(c)) is not None else -1), c[0], c[1], c[2]),
}


def _cursor(key: tuple[Any, ...]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, separators=(",", ":")).encode()).decode()


def _uncursor(after: str) -> tuple[Any, ...]:
    try:
        key = json.loads(base64.urlsafe_b64decode(after.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error, RecursionError):  # "[[[[…": deep JSON
        key = None
    if not isinstance(key, list):
        raise HTTPException(400, "after: not a cursor this list gave (its X-Next-After header)")
    return tuple(key)


def consumer_rows(
    node: NodeContext,
    stream: str | None = None,
    *,
    limit: int | None = None,
    after: str | None = None,
    order: ConsumerOrder = "client",
    contains: str | None = None,
) -> tuple[list[ConsumerOut], int, str | None]:
    """Saved consumer indexes (of ``stream``; whose client id or stream name holds
    ``contains``) with their lag behind the partition's end, in ``order`` (client, stream,
    partition; or most lag first): ``(the rows after the cursor ``after``, at most ``limit``;
    how many there are in all; the next page's cursor or None)``. Owners are read for the
    page's rows only.

    ``order="lag"`` is a top-N view, one page: no cursor is given and ``after`` is refused
    (400). Found from outside: its key (the lag) moves as records are pushed and indexes saved,
    so a keyset cursor skipped the rows whose lag rose past it between two pages."""
    if order == "lag" and after is not None:
        raise HTTPException(400, LAG_AFTER)
    key = _ORDER_KEYS[order]
    cands = sorted(_consumer_candidates(node, stream, contains), key=key)
    total = len(cands)
    if after is not None:
        start = _uncursor(after)
        try:
            cands = [c for c in cands if list(key(c)) > list(start)]
        except TypeError:  # a cursor of another order (or a forged one): its parts compare
            raise HTTPException(400, "after: not a cursor of this order") from None
    page: Sequence[Candidate] = cands if limit is None else cands[:limit]
    more = bool(page) and len(page) < len(cands) and order == "client"
    nxt = _cursor(key(page[-1])) if more else None
    return [_row(node, c) for c in page], total, nxt


@router.get(
    "/consumers",
    response_model=list[ConsumerOut],
    summary="Consumers and lag, a page at a time (total and next page in headers)",
    responses={200: {"headers": PAGE_HEADERS}},
)
def list_consumers(
    node: Node,
    response: Response,
    limit: Limit = PAGE_ROWS,
    after: Annotated[str | None, Query(max_length=16384, description=AFTER_CURSOR)] = None,
    order: Annotated[ConsumerOrder, Query(description=ORDER_DOC)] = "client",
    contains: Contains = None,
) -> list[ConsumerOut]:
    rows, total, nxt = consumer_rows(node, limit=limit, after=after, order=order, contains=contains)
    _page_headers(response, total, nxt is not None, nxt)
    return rows


@router.get(
    "/streams/{stream}/consumers",
    response_model=list[ConsumerOut],
    summary="A stream's consumers and their lag, a page at a time",
    responses={200: {"headers": PAGE_HEADERS}},
)
def stream_consumers(
    stream: StreamName,
    node: Node,
    response: Response,
    limit: Limit = PAGE_ROWS,
    after: Annotated[str | None, Query(max_length=16384, description=AFTER_CURSOR)] = None,
    order: Annotated[ConsumerOrder, Query(description=ORDER_DOC)] = "client",
    contains: Contains = None,
) -> list[ConsumerOut]:
    node.log.stream_info(stream)  # 404 for an unknown stream
    rows, total, nxt = consumer_rows(
        node, stream, limit=limit, after=after, order=order, contains=contains
    )
    _page_headers(response, total, nxt is not None, nxt)
    return rows


# An operator's way out for a consumer stuck too high (indexes otherwise only go up: a bug or a
# hostile save of 2^64-1 would hold it forever) or one to replay; under the node's token.
@router.post(
    "/streams/{stream}/consumers/reset",
    response_model=ConsumerChange,
    summary="Set a consumer's index, lower or not (its owner stays)",
)
def reset_consumer(stream: StreamName, body: ConsumerReset, node: Node) -> ConsumerChange:
    before = node.log.reset_index(body.client_id, stream, body.index, partition=body.partition)
    return ConsumerChange(
        client_id=body.client_id,
        stream=stream,
        partition=body.partition,
        before=before,
        index=body.index,
    )


@router.post(
    "/streams/{stream}/consumers/delete",
    response_model=ConsumerChange,
    summary="Forget a consumer's index and owner",
)
def delete_consumer(stream: StreamName, body: ConsumerDelete, node: Node) -> ConsumerChange:
    before = node.log.reset_index(body.client_id, stream, None, partition=body.partition)
    return ConsumerChange(
        client_id=body.client_id, stream=stream, partition=body.partition, before=before, index=None
    )
