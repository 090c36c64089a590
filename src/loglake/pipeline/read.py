"""``read(spark, data_dir, stream, ...)``: a stream as one DataFrame, sealed history read natively.

Why: the Python Data Source API moves every row through a Python worker (a
minimal source reached 15–30% of a native Parquet scan here), so a batch read hands the sealed
lake files — pruned to the partitions and index range asked for, by file name, before Spark
lists anything — to Spark's own Parquet reader, and sends only what the lake does not hold (the
live, unsealed tail) through the ``loglake`` Python source, as exact planned ranges. The two are
unioned by name into the record schema. Both halves come from one plan made on the driver from
one listing, so each index is read once even while the log seals or a compaction swaps files.
Filters applied later on the DataFrame still reach the Parquet scan (row-group statistics on
``partition``/``index``/``timestamp_ns``) and the Python source (``pushFilters``).

This fast path is taken only by an explicit call — ``read(...)`` or ``read_options(spark,
options)`` — never by patching Spark. ``spark.read.format("loglake")`` is the
registered Python source alone: the same rows, every one through a Python worker (~3× slower on
sealed history). Why not route the format too: PySpark's Python Data Source API has no way for a
source to hand its scan to a native reader, and the only way to make ``format("loglake")``
native was replacing ``DataFrameReader.format/option/options/load`` for the whole process —
every reader of every session, a dependence on PySpark internals, and nothing for Spark Connect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loglake.pipeline.datasource import (
    COLUMNS,
    FORMAT,
    RECORD_SCHEMA,
    check_start_index,
    kept_bounds,
)
from loglake.pipeline.lake import (
    VERIFY_PAGES,
    ReadPlan,
    lake_file_rows,
    plan_partition,
    visible_lake_files,
)
from loglake.pipeline.options import (
    SourceOptions,
    StreamLayout,
    TlsFiles,
    parse_options,
    resolve_stream,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from loglake.log.lake import LakeFile

LIVE_RANGES_OPTION = "_liveRanges"


def make_plan(opts: SourceOptions, layout: StreamLayout) -> ReadPlan:
    """Split the asked range of every chosen partition into lake files and live ranges; a
    ``startIndex`` below a partition's first kept index is data loss (``check_start_index``),
    as in the ``loglake`` source's plan."""
    parts = []
    for p in layout.partitions:
        files = visible_lake_files(opts.data_dir, opts.stream, p) if opts.data_dir else []
        check_start_index(opts, p, kept_bounds(files, layout.live.get(p))[0])
        first, nxt = layout.live.get(p, (None, None))
        parts.append(
            plan_partition(
                p, files, first, nxt, opts.start_index, opts.end_index, opts.split_records
            )
        )
    return ReadPlan(opts.stream, parts)


def read(
    spark: SparkSession,
    data_dir: str | None = None,
    stream: str | None = None,
    *,
    partitions: list[int] | None = None,
    start_index: int | None = None,
    end_index: int | None = None,
    url: str | None = None,
    partition_count: int | None = None,
    split_records: int | None = None,
    driver_tail_records: int | None = None,
    tls: TlsFiles | None = None,
    backend: str | None = None,
    nats_prefix: str | None = None,
    nats_creds: str | None = None,
    fail_on_data_loss: bool | None = None,
) -> DataFrame:
    """The records of ``stream`` (optionally some partitions and ``start <= index < end``):
    sealed lake files through Spark's native Parquet reader, the live tail through the
    ``loglake`` source (or, up to ``driver_tail_records`` records, read here on the driver).
    ``tls``: how the ``url`` client speaks TLS (``TlsFiles()`` alone trusts the system's CAs).
    ``backend`` (``nats://h1,h2,h3``, with ``nats_prefix``/``nats_creds``): the stream is kept in
    NATS JetStream by a node; its unsealed part is read from there, the lake from ``data_dir``.
    ``fail_on_data_loss=False`` (option ``failOnDataLoss``): a planned range retention removed
    before the read, or a ``start_index`` below the first index kept, is skipped with a warning
    instead of failing with ``LiveHistoryGone``."""
    options: dict[str, Any] = {
        "data_dir": data_dir,
        "stream": stream,
        "partitions": ",".join(map(str, partitions)) if partitions is not None else None,
        "startIndex": start_index,
        "endIndex": end_index,
        "url": url,
        "partitionCount": partition_count,
        "splitRecords": split_records,
        "driverTailRecords": driver_tail_records,
        "backend": backend,
        "natsPrefix": nats_prefix,
        "natsCreds": nats_creds,
        "failOnDataLoss": None if fail_on_data_loss is None else str(fail_on_data_loss).lower(),
    }
    if tls is not None:
        options.update(tls.as_options())
    return read_options(spark, {k: str(v) for k, v in options.items() if v is not None})


def read_options(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """``read`` from the ``loglake`` format's options (``docs/pipeline.md``); option
    ``nativeSealed=false`` reads everything through the Python source instead (the reference
    path, what ``spark.read.format("loglake")`` does)."""
    if str(options.get("nativeSealed", "true")).lower() == "false":
        return spark.read.format(FORMAT).options(**options).load()
    opts = parse_options(options)
    layout = resolve_stream(opts)
    plan = make_plan(opts, layout)
    frames = []
    files = plan.files
    if files:
        frames.append(_native(spark, opts, files))
    live_records = sum(r.records for r in plan.live)
    if plan.live and live_records <= opts.driver_tail_records:
        frames.append(_driver_tail(spark, opts, plan))
    elif plan.live:
        ranges: dict[str, list[list[int]]] = {}
        for r in plan.live:
            ranges.setdefault(str(r.partition), []).append([r.start, r.end])
        reader = spark.read.format(FORMAT).options(**opts.raw)
        frames.append(reader.option(LIVE_RANGES_OPTION, json.dumps(ranges)).load())
    if not frames:
        return spark.createDataFrame([], RECORD_SCHEMA)
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _driver_tail(spark: SparkSession, opts: SourceOptions, plan: ReadPlan) -> DataFrame:
    """A small live tail read here and handed to Spark as Arrow: no Python worker to start."""
    import pyarrow as pa

    from loglake.pipeline.datasource import RangeSplit, _arrow_schema, read_range

    target = _arrow_schema()
    batches = [
        b
        for r in plan.live
        for b in read_range(
            opts, RangeSplit(r.partition, r.start, r.end, live_only=True), target=target
        )
    ]
    return spark.createDataFrame(pa.Table.from_batches(batches, schema=target), RECORD_SCHEMA)


def _native(spark: SparkSession, opts: SourceOptions, files: Sequence[LakeFile]) -> DataFrame:
    from pyspark.sql import functions as F

    # each file's footer checked here, on the driver: Spark's reader would read a column a
    # foreign file lacks as nulls and fail on a truncated one with a JVM trace at the action
    for f in files:
        lake_file_rows(f.path)
    # a damaged page (the footer whole) fails the action on its CRC, and ``task_error`` gives
    # that as ``CorruptSegment`` naming the file: checking every page here would read it twice
    reader = spark.read.schema(RECORD_SCHEMA).option(*VERIFY_PAGES)
    df = reader.parquet(*[str(f.path) for f in files])
    lo, hi = opts.start_index, opts.end_index
    if any(f.first < lo for f in files):
        df = df.where(F.col("index") >= lo)
    if hi is not None and any(f.last >= hi for f in files):
        df = df.where(F.col("index") < hi)
    return df.select(*COLUMNS)
