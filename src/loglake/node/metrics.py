"""Prometheus metrics of a node, by composition: nothing in the parts knows about them.

Two sources, each at the cheapest place:

- **Traffic** (push/pull records, bytes, latency per stream) is counted on the way in:
  ``InstrumentedLog`` wraps the node's ``Log`` and times ``append_payloads`` /
  ``append_many`` / ``read_payloads`` / ``read``. The stream service performs its actions on
  that wrapper (``StreamService(InstrumentedLog(log))``), and so do the in-process parts
  (``LocalStreams`` over it), so every push and pull through the node is seen once. The stream
  service groups pushes (one ``Append`` per partition per batch), so the cost is per batch, not
  per record; latency is the batch's (it includes the group-commit fsync).
- **State** (records, bytes, fsyncs, lake files, consumer lag, seal failures, replays, archive
  and SDS figures) is read at scrape time by ``NodeCollector`` from the log and the parts'
  handles: nothing is kept up to date between scrapes.

Consumer lag is bounded: any client may save an index under any id (up to ``[limits]
max_client_id`` bytes), so one ``loglake_consumer_lag`` series per index let a client make every
scrape as large as it liked (an earlier review measured 20,000 ids of ~1 KB: over 20 MB a scrape,
and as many series kept by Prometheus). Only the ``consumer_series`` most behind consumers
(``[http] metrics_consumers``) get their own series, with ids cut to
``CONSUMER_LABEL_CHARS``; ``loglake_consumers*`` count, sum and take the maximum over every
consumer, and say how many were left out, so alerts on lag still see them all.

Names follow Prometheus conventions (``loglake_`` prefix, ``_total`` counters, base units:
seconds, bytes). ``docs/operations.md`` lists them, and a test keeps that list equal to
the series registered here.
"""

from __future__ import annotations

import collections
import hashlib
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.responses import Response

from loglake.errors import Unavailable
from loglake.log import Entry, Log, Record, StreamConfig, StreamInfo
from loglake.log.api import IndexOp
from loglake.node.config import CONSUMER_SERIES
from loglake.structured_logging import log_event

if TYPE_CHECKING:
    from loglake.node.api.context import NodeContext

_logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
"""Seconds: a group commit on this kind of disk takes ~0.1 ms; a slow one, tens of ms."""

CONSUMER_LABEL_CHARS = 128
"""Longest ``consumer`` label of ``loglake_consumer_lag``: a longer client id is shown as its
first characters, ``…`` and 16 hex digits of its SHA-256 (``consumer_label``), so a cut id stays
its own series and ``GET /api/consumers?contains=`` with the shown start finds the whole id."""

RATE_WINDOW_S = 10.0
"""``push_rate``/``pull_rate`` in the API are averaged over at most this many seconds."""


class _Traffic:
    """Cumulative per-stream counts, plus a few timed snapshots to give rates."""

    __slots__ = ("pull_bytes", "pulled", "push_bytes", "pushed", "samples")

    def __init__(self) -> None:
        self.pushed = self.push_bytes = self.pulled = self.pull_bytes = 0
        self.samples: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=64)


class NodeMetrics:
    """The node's registry: traffic counted by ``InstrumentedLog``, state read by
    ``NodeCollector`` at scrape time, and histograms parts' adapters feed (``sds_ack``)."""

    def __init__(self, consumer_series: int | None = None) -> None:
        """``consumer_series``: consumers with their own ``loglake_consumer_lag`` series, the
        most behind (``[http] metrics_consumers``; None: its default)."""
        self.consumer_series = CONSUMER_SERIES if consumer_series is None else consumer_series
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._traffic: dict[str, _Traffic] = {}
        self.push_latency = Histogram(
            "loglake_push_latency_seconds",
            "Time to append one batch of pushes to a partition (includes its fsync).",
            ["stream"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.pull_latency = Histogram(
            "loglake_pull_latency_seconds",
            "Time to read one pull's records from a partition.",
            ["stream"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.sds_ack_latency = Histogram(
            "loglake_sds_ack_latency_seconds",
            "From sending an SDS message to seeing it acknowledged by another participant.",
            ["channel"],
            buckets=(*LATENCY_BUCKETS, 5.0, 10.0, 30.0, 60.0),
            registry=self.registry,
        )
        self.archive_bytes: collections.Counter[str] = collections.Counter()
        """``build`` / ``seed`` / ``fetch`` bytes, added by the archives handle."""
        self.node: NodeContext | None = None

    def attach(self, node: NodeContext) -> None:
        """Read state from ``node`` at scrape time (call once the node is built)."""
        self.node = node
        self.registry.register(NodeCollector(self))

    # -- traffic ------------------------------------------------------------------------------
    def _of(self, stream: str) -> _Traffic:
        t = self._traffic.get(stream)
        if t is None:
            with self._lock:
                t = self._traffic.setdefault(stream, _Traffic())
        return t

    def pushed(self, stream: str, records: int, nbytes: int, seconds: float) -> None:
        t = self._of(stream)
        with self._lock:
            t.pushed += records
            t.push_bytes += nbytes
        self.push_latency.labels(stream).observe(seconds)

    def pulled(self, stream: str, records: int, nbytes: int, seconds: float) -> None:
        t = self._of(stream)
        with self._lock:
            t.pulled += records
            t.pull_bytes += nbytes
        self.pull_latency.labels(stream).observe(seconds)

    def traffic(self) -> dict[str, tuple[int, int, int, int]]:
        """stream → (pushed records, push bytes, pulled records, pull bytes)."""
        with self._lock:
            return {
                s: (t.pushed, t.push_bytes, t.pulled, t.pull_bytes)
                for s, t in self._traffic.items()
            }

    def stream_activity(self, stream: str) -> dict[str, Any]:
        """Counts and rates for the API (``GET /api/streams``): each call keeps a snapshot at
        most once a second, and the rate is taken against the oldest snapshot in the window,
        so a console polling every second or two sees rates without a sampler thread."""
        now = time.monotonic()
        t = self._of(stream)
        with self._lock:
            pushed, pulled = t.pushed, t.pulled
            while t.samples and now - t.samples[0][0] > RATE_WINDOW_S:
                t.samples.popleft()
            if not t.samples or now - t.samples[-1][0] >= 1.0:
                t.samples.append((now, pushed, pulled))
            then, pushed0, pulled0 = t.samples[0]
        dt = now - then
        return {
            "pushed_records": pushed,
            "pulled_records": pulled,
            "push_rate": round((pushed - pushed0) / dt, 1) if dt > 0.5 else 0.0,
            "pull_rate": round((pulled - pulled0) / dt, 1) if dt > 0.5 else 0.0,
        }

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def metrics_route(metrics: NodeMetrics) -> Callable[[], Response]:
    def scrape() -> Response:
        """Prometheus text exposition of the node's metrics."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return scrape


class InstrumentedLog(Log):
    """A ``Log`` that counts and times pushes and pulls into ``NodeMetrics``, then delegates.

    Everything else (``health``, ``fsync_count``, ``wait_for_seals``, ``data_dir``) reaches the
    wrapped log through ``__getattr__``."""

    def __init__(self, inner: Log, metrics: NodeMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create_stream(self, name: str, config: StreamConfig | None = None) -> StreamInfo:
        return self.inner.create_stream(name, config)

    def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        return self.inner.grow_stream(name, partitions)

    def streams(self) -> list[str]:
        return self.inner.streams()

    def stream_info(self, name: str) -> StreamInfo:
        return self.inner.stream_info(name)

    def has_stream(self, name: str) -> bool:
        return self.inner.has_stream(name)

    def partition_count(self, stream: str) -> int:
        return self.inner.partition_count(stream)

    def append_many(
        self, stream: str, entries: Sequence[Entry], *, partition: int = 0
    ) -> list[int]:
        t0 = time.perf_counter()
        out = self.inner.append_many(stream, entries, partition=partition)
        dt = time.perf_counter() - t0
        self.metrics.pushed(stream, len(out), sum(len(e.data) for e in entries), dt)
        return out

    def append_payloads(
        self, stream: str, datas: Sequence[bytes], *, partition: int = 0
    ) -> list[int]:
        t0 = time.perf_counter()
        out = self.inner.append_payloads(stream, datas, partition=partition)
        dt = time.perf_counter() - t0
        self.metrics.pushed(stream, len(out), sum(map(len, datas)), dt)
        return out

    def append_payloads_then(
        self,
        stream: str,
        datas: Sequence[bytes],
        done: Callable[[BaseException | None], None],
        *,
        partition: int = 0,
    ) -> list[int]:
        """Forwarded, not left to ``Log``'s blocking default: the stream server writes its next
        batch while this one is fsynced. A push is counted, with its latency to durable, when
        ``done`` reports it durable (a failed one is not a push)."""
        t0 = time.perf_counter()
        size = sum(map(len, datas))

        def timed(error: BaseException | None) -> None:
            if error is None:
                self.metrics.pushed(stream, len(datas), size, time.perf_counter() - t0)
            done(error)

        return self.inner.append_payloads_then(stream, datas, timed, partition=partition)

    def read(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        end: int | None = None,
        *,
        partition: int = 0,
    ) -> list[Record]:
        t0 = time.perf_counter()
        out = self.inner.read(stream, start, limit, end, partition=partition)
        dt = time.perf_counter() - t0
        self.metrics.pulled(stream, len(out), sum(len(r.data) for r in out), dt)
        return out

    def read_payloads(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        *,
        partition: int = 0,
        max_bytes: int | None = None,
    ) -> list[tuple[int, bytes]]:
        t0 = time.perf_counter()
        out = self.inner.read_payloads(
            stream, start, limit, partition=partition, max_bytes=max_bytes
        )
        dt = time.perf_counter() - t0
        self.metrics.pulled(stream, len(out), sum(len(d) for _, d in out), dt)
        return out

    def next_index(self, stream: str, *, partition: int = 0) -> int:
        return self.inner.next_index(stream, partition=partition)

    def get_index(self, client_id: str, stream: str, *, partition: int = 0) -> int | None:
        return self.inner.get_index(client_id, stream, partition=partition)

    def save_index(self, client_id: str, stream: str, index: int, *, partition: int = 0) -> int:
        return self.inner.save_index(client_id, stream, index, partition=partition)

    def consumer_indexes(self) -> dict[tuple[str, str, int], int]:
        return self.inner.consumer_indexes()

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
        return self.inner.save_index_as(
            client_id, stream, index, owner, override, partition=partition
        )

    def index_ops(self, ops: Sequence[IndexOp]) -> list[int | Exception | None]:
        return self.inner.index_ops(ops)

    def index_owner(self, client_id: str, stream: str, *, partition: int = 0) -> str | None:
        return self.inner.index_owner(client_id, stream, partition=partition)

    def reset_index(
        self, client_id: str, stream: str, index: int | None, *, partition: int = 0
    ) -> int | None:
        return self.inner.reset_index(client_id, stream, index, partition=partition)

    def enforce_retention(self, now_ns: int | None = None) -> int:
        return self.inner.enforce_retention(now_ns)

    def truncate_before(self, stream: str, index: int, *, partition: int = 0) -> int:
        return self.inner.truncate_before(stream, index, partition=partition)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()


def unwrap(log: Log) -> Log:
    while isinstance(log, InstrumentedLog):
        log = log.inner
    return log


class NodeCollector(Collector):
    """Reads the node's state at scrape time (see the module docstring)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list:
        return []  # unchecked collector: the families depend on what the node runs

    def collect(self) -> Iterator[Any]:
        node = self.metrics.node
        if node is None:
            return
        yield from self._traffic()
        cluster = node.cluster
        if cluster is not None:
            yield from cluster.metric_families()
        if cluster is None or cluster.log_readable():
            # a JetStream cluster that just failed to answer is not asked again for each
            # partition: the scrape answers (loglake_jetstream_reachable 0) instead of
            # failing whole, and in seconds rather than after every request's deadline
            try:
                yield from [*self._log(node), *self._consumers(node)]
            except Unavailable as e:
                log_event(_logger, logging.WARNING, "metrics: log state unavailable", error=str(e))
        for handle in (node.events, node.archives, node.sds, node.jobs):
            families = getattr(handle, "metric_families", None)
            if families is not None:
                yield from families()
        archive = CounterMetricFamily(
            "loglake_archive_bytes",
            "Archive bytes built by the control node, seeded and fetched by members.",
            labels=["kind"],
        )
        for kind in ("build", "seed", "fetch"):
            archive.add_metric([kind], self.metrics.archive_bytes[kind])
        yield archive

    def _traffic(self) -> Iterator[Any]:
        fams = [
            CounterMetricFamily("loglake_push_records", "Records pushed.", labels=["stream"]),
            CounterMetricFamily("loglake_push_bytes", "Bytes of data pushed.", labels=["stream"]),
            CounterMetricFamily("loglake_pull_records", "Records pulled.", labels=["stream"]),
            CounterMetricFamily("loglake_pull_bytes", "Bytes of data pulled.", labels=["stream"]),
        ]
        for stream, values in sorted(self.metrics.traffic().items()):
            for fam, v in zip(fams, values, strict=True):
                fam.add_metric([stream], v)
        yield from fams

    def _log(self, node: NodeContext) -> Iterator[Any]:
        from loglake.log.lake import list_lake_files, visible_lake_files
        from loglake.log.lake_schema import lake_partition_dir
        from loglake.node.api.streams import Unreadable, stream_infos

        log = node.log
        records = GaugeMetricFamily(
            "loglake_partition_records", "Records readable.", labels=["stream", "partition"]
        )
        nbytes = GaugeMetricFamily(
            "loglake_partition_bytes", "Bytes in live segments.", labels=["stream", "partition"]
        )
        next_index = GaugeMetricFamily(
            "loglake_partition_next_index",
            "Index the next append gets.",
            labels=["stream", "partition"],
        )
        fsyncs = CounterMetricFamily(
            "loglake_fsyncs", "Group-commit fsyncs run.", labels=["stream", "partition"]
        )
        lake_files = GaugeMetricFamily(
            "loglake_lake_files", "Sealed Parquet files.", labels=["stream", "partition"]
        )
        sealed = GaugeMetricFamily(
            "loglake_sealed_records", "Records sealed to the lake.", labels=["stream", "partition"]
        )
        unhealthy = GaugeMetricFamily(
            "loglake_partition_failing",
            "1 when a partition has a storage failure, a seal being retried or a failed retention.",
            labels=["stream", "partition", "kind"],
        )
        unreadable = GaugeMetricFamily(
            "loglake_stream_unreadable",
            "1 when a stream's stats cannot be read for damage on disk (CorruptSegment: the "
            "node's log and GET /api/streams name the file and byte); its partitions are left "
            "out of the other families.",
            labels=["stream"],
        )
        fsync_count = getattr(log, "fsync_count", None)
        data_dir = getattr(unwrap(log), "data_dir", None)
        for info in stream_infos(log):
            name = info.name
            unreadable.add_metric([name], 1 if isinstance(info, Unreadable) else 0)
            if isinstance(info, Unreadable):
                continue
            for p in info.partitions:
                labels = [name, str(p.partition)]
                records.add_metric(labels, p.next_index - p.first_index)
                nbytes.add_metric(labels, p.bytes)
                next_index.add_metric(labels, p.next_index)
                if fsync_count is not None:
                    fsyncs.add_metric(labels, fsync_count(name, p.partition))
                if data_dir is not None and info.config.seal_to_lake:
                    files = visible_lake_files(
                        list_lake_files(lake_partition_dir(data_dir, name, p.partition))
                    )
                    lake_files.add_metric(labels, len(files))
                    sealed.add_metric(labels, sum(f.last - f.first + 1 for f in files))
        reopens = CounterMetricFamily(
            "loglake_partition_reopens",
            "Times a partition was reopened from disk after a storage failure.",
            labels=["stream", "partition"],
        )
        reopen_attempts = GaugeMetricFamily(
            "loglake_partition_reopen_attempts",
            "Failed reopen attempts of a partition that is failed now (0 when it is not).",
            labels=["stream", "partition"],
        )
        health = getattr(log, "health", None)
        if health is not None:
            for h in health():
                labels = [h.stream, str(h.partition)]
                unhealthy.add_metric([*labels, "storage"], 1 if h.storage_failed else 0)
                unhealthy.add_metric([*labels, "seal"], 1 if h.seal_failure else 0)
                unhealthy.add_metric([*labels, "retention"], 1 if h.retention_error else 0)
                failure = h.storage_failure
                reopens.add_metric(labels, h.reopens)
                reopen_attempts.add_metric(labels, failure.reopen_attempts if failure else 0)
        yield from (records, nbytes, next_index, fsyncs, lake_files, sealed, unhealthy, unreadable)
        yield from (reopens, reopen_attempts)

    def _consumers(self, node: NodeContext) -> Iterator[Any]:
        """``loglake_consumer_lag`` of the most behind consumers (ties: by client, stream,
        partition, so the same consumers keep their series), listed by client as before the
        bound; and the ``loglake_consumers*`` aggregates over every consumer."""
        from loglake.node.api.streams import consumer_lags

        # None: its stream is unreadable (loglake_stream_unreadable), left out of every family
        known = [(lag, c, s, p) for c, s, p, lag in consumer_lags(node) if lag is not None]
        top = heapq.nsmallest(
            self.metrics.consumer_series, known, key=lambda k: (-k[0], k[1], k[2], k[3])
        )
        lag = GaugeMetricFamily(
            "loglake_consumer_lag",
            "Records between a consumer's saved index and its partition's end (the most "
            "behind consumers only: loglake_consumers_omitted counts the others).",
            labels=["consumer", "stream", "partition"],
        )
        shown: set[tuple[str, str, str]] = set()
        for behind, client, stream, partition in sorted(top, key=lambda k: k[1:]):
            labels = (consumer_label(client), stream, str(partition))
            if labels not in shown:  # an id of CONSUMER_LABEL_CHARS made to equal a cut one
                shown.add(labels)
                lag.add_metric(list(labels), behind)
        yield lag
        count = GaugeMetricFamily(
            "loglake_consumers", "Saved consumer indexes whose lag is known (every one)."
        )
        count.add_metric([], len(known))
        most = GaugeMetricFamily(
            "loglake_consumers_lag_max", "The largest lag of any consumer (0: none)."
        )
        most.add_metric([], max((k[0] for k in known), default=0))
        total = GaugeMetricFamily(
            "loglake_consumers_lag", "Records all consumers are behind, together."
        )
        total.add_metric([], sum(k[0] for k in known))
        omitted = GaugeMetricFamily(
            "loglake_consumers_omitted",
            "Consumers without a loglake_consumer_lag series ([http] metrics_consumers).",
        )
        omitted.add_metric([], len(known) - len(shown))
        yield from (count, most, total, omitted)


def consumer_label(client_id: str) -> str:
    """``client_id`` as the ``consumer`` label shows it: as it is up to
    ``CONSUMER_LABEL_CHARS`` characters, else cut to that many with its hash at the end."""
    if len(client_id) <= CONSUMER_LABEL_CHARS:
        return client_id
    digest = hashlib.sha256(client_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{client_id[: CONSUMER_LABEL_CHARS - 17]}…{digest}"
