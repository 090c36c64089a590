"""The ``loglake`` Spark data source (PySpark's Python Data Source API, ``pyspark.sql.datasource``).

Follows apache/spark ``python/pyspark/sql/datasource.py`` (4.3): ``DataSource`` with ``reader``,
``streamReader`` and ``writer``; a batch ``DataSourceReader`` with ``pushFilters`` (4.1+,
needs ``spark.sql.python.filterPushdown.enabled``, which ``register`` sets), ``partitions``,
``read``; a ``DataSourceStreamReader`` with ``initialOffset``, ``latestOffset(start, limit)``,
``partitions``, ``read``, ``commit``; a ``DataSourceArrowWriter``.

* Batch read: one Spark partition per (log partition, index range of at most ``splitRecords``).
  Each split resolves on the executor into the visible lake files overlapping it (read with
  pyarrow, index-filtered) and the uncovered rest from the live log (``livelog.py``), so a split
  survives a compaction that swapped files after planning. Filters on ``partition`` and ``index``
  are absorbed into the plan; ``timestamp_ns`` ranges prune rows here and are re-checked by Spark.
  Every row of this source crosses a Python worker; ``loglake.pipeline.read`` sends sealed
  files to Spark's native Parquet reader instead and uses this source only for the live tail
  (``spark.read.format("loglake")`` is this source alone: nothing in Spark is patched).
* Streaming read: offsets are ``{"<partition>": next index to read}``; ``startingOffsets`` is
  ``earliest``, ``latest`` or JSON (Kafka's -2/-1 allowed). A micro-batch ``[start, end)`` is the
  same deterministic range read as a batch split, so Spark's checkpoint + the Parquet sink's
  log give exactly-once output across restarts.
* Write: executors stage their rows as Parquet under ``<data_dir>/_pipeline/staging/<id>/``;
  ``commit`` on the driver appends them to the stream partition by partition; ``abort`` (any task
  failed) deletes the staging files, so a failed write leaves the stream unchanged.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from loglake.log.api import CorruptSegment
from loglake.log.lake import LakeFile, check_index_run, typed_lake_errors
from loglake.log.lake_schema import LAKE_SCHEMA, parse_lake_file_name
from loglake.pipeline.errors import (
    BadOption,
    LiveHistoryGone,
    SchemaMismatch,
    StreamBehindCheckpoint,
)
from loglake.pipeline.lake import (
    chunk,
    lake_file_rows,
    overlaps,
    subtract,
    visible_lake_files,
)
from loglake.pipeline.livelog import LiveSource
from loglake.pipeline.options import (
    EARLIEST,
    LATEST,
    SourceOptions,
    StreamLayout,
    parse_offsets_json,
    parse_options,
    resolve_stream,
)
from loglake.structured_logging import log_event

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "loglake"
_logger = logging.getLogger(__name__)
# Nullable throughout: Spark reads every Parquet column as nullable, and the native and Python
# halves of ``read()`` must union by name without casts. Values follow ``LAKE_SCHEMA``.
HEADER_TYPE = StructType(
    [StructField("key", StringType(), True), StructField("value", BinaryType(), True)]
)
RECORD_SCHEMA = StructType(
    [
        StructField("stream", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("index", LongType(), True),
        StructField("timestamp_ns", LongType(), True),
        StructField("key", BinaryType(), True),
        StructField("headers", ArrayType(HEADER_TYPE, True), True),
        StructField("data", BinaryType(), True),
    ]
)
COLUMNS = tuple(RECORD_SCHEMA.fieldNames())


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(RECORD_SCHEMA, timezone="UTC")


# -- range reading (runs on executors) -------------------------------------------------------


@dataclass(frozen=True)
class RowFilter:
    """Row predicates applied while reading: what ``pushFilters`` absorbed about timestamps."""

    ts_lo: int | None = None
    ts_hi: int | None = None  # exclusive

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.ts_lo is None and self.ts_hi is None:
            return batch
        ts = batch.column("timestamp_ns")
        mask = pc.is_valid(ts)
        if self.ts_lo is not None:
            mask = pc.and_(mask, pc.greater_equal(ts, self.ts_lo))
        if self.ts_hi is not None:
            mask = pc.and_(mask, pc.less(ts, self.ts_hi))
        return batch.filter(mask)


@dataclass
class RangeSplit(InputPartition):
    """One Spark partition: ``start <= index < end`` of log partition ``partition``."""

    partition: int
    start: int
    end: int
    lake_only: bool = False
    live_only: bool = False

    def __init__(
        self,
        partition: int,
        start: int,
        end: int,
        lake_only: bool = False,
        live_only: bool = False,
    ) -> None:
        super().__init__((partition, start, end))
        self.partition, self.start, self.end = partition, start, end
        self.lake_only, self.live_only = lake_only, live_only


def _read_lake_file(path: str, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
    """``[lo, hi)`` of a lake file; a damaged or foreign one is ``CorruptSegment`` naming it
    (``lake_file_rows``; a damaged page by its CRC, as the storage engine reads lake files), a
    removed one stays ``FileNotFoundError`` (``read_range`` re-lists)."""
    lake_file_rows(path)
    with typed_lake_errors(path):
        table = pq.read_table(
            path,
            filters=[("index", ">=", lo), ("index", "<", hi)],
            page_checksum_verification=True,
        )
    named = parse_lake_file_name(os.path.basename(path))
    if named is not None:  # the rows themselves agree with the name (``check_lake_footer``)
        start, end = max(lo, named[0]), min(hi, named[1] + 1)
        if check_index_run(path, table.column("index"), start) != end:
            raise CorruptSegment(path, 0, f"index column does not hold {start}..{end - 1}")
    yield from table.to_batches(max_chunksize=8192)


def read_range(
    opts: SourceOptions,
    split: RangeSplit,
    row_filter: RowFilter = RowFilter(),
    target: pa.Schema | None = None,
) -> Iterator[pa.RecordBatch]:
    """Records of ``split`` in index order: visible lake files first where they cover, the live
    log for the rest. The cover is listed here, on the executor, not when the query was
    planned, so a range the sealer or a compaction moved in between is still read once. If a
    listed file was removed (compaction) or the live log no longer holds a range
    (``LiveHistoryGone``: JetStream's retention dropped it, usually just after the sealer
    copied it), the rest of the split is read again from a fresh listing, once. A range in
    neither then fails the read, or with ``failOnDataLoss=false`` is skipped: a warning names
    it and the read goes on from the first index still held (``skip_lost``)."""
    target = target or _arrow_schema()
    live: LiveSource = opts.live()
    done = split.start  # every index below this one has been yielded (or filtered out)
    attempt = 0
    while done < split.end:
        files = []
        # a live-only split (``read()``'s tail) looks in the lake only when the live log lost
        # its range: the sealer copied it there after the plan was made
        if opts.data_dir and (not split.live_only or attempt):
            files = [
                f
                for f in visible_lake_files(opts.data_dir, opts.stream, split.partition)
                if overlaps(f, done, split.end)
            ]
        covered = [(f.first, f.last + 1) for f in files]
        pieces: list[tuple[int, LakeFile | tuple[int, int]]] = [(f.first, f) for f in files]
        if not split.lake_only:
            pieces += [(a, (a, b)) for a, b in subtract(done, split.end, covered)]
        pieces.sort(key=lambda p: p[0])
        try:
            for _, piece in pieces:
                if isinstance(piece, tuple):
                    a, b = piece
                    batches = live.read(opts.stream, split.partition, a, b)
                else:
                    lo, hi = max(done, piece.first), min(split.end, piece.last + 1)
                    batches = _read_lake_file(str(piece.path), lo, hi)
                for batch in batches:
                    if batch.num_rows:
                        done = batch.column("index")[-1].as_py() + 1
                    batch = row_filter.apply(batch)
                    if batch.num_rows:
                        yield batch.cast(target)
            return
        except FileNotFoundError:
            if attempt:
                raise
            attempt = 1
        except LiveHistoryGone as gone:
            if not attempt:
                attempt = 1
                continue
            if opts.fail_on_data_loss or gone.first_held <= done:
                raise
            done = skip_lost(gone, done, split.end)
            attempt = 0  # what follows the lost range gets its own fresh look


def skip_lost(gone: LiveHistoryGone, done: int, end: int) -> int:
    """``failOnDataLoss=false``: log the range ``gone`` names as lost (WARNING, naming the
    stream, the partition and the indexes, within ``[done, end)``) and return where reading
    goes on — the first index still held. Kafka's source does the same (a warning naming the
    lost offsets, then the earliest offset still available) and says it may be a false alarm:
    ours is not, the range was looked for in the lake and the live log both."""
    lost = (max(done, gone.missing), min(gone.first_held, end))
    log_event(
        _logger,
        logging.WARNING,
        f"stream {gone.stream!r} partition {gone.partition}: indexes {lost[0]}..{lost[1] - 1} "
        "are in neither the lake nor the live log (removed by retention); skipped "
        "(failOnDataLoss=false)",
        stream=gone.stream,
        partition=gone.partition,
        lost_first=lost[0],
        lost_last=lost[1] - 1,
    )
    return gone.first_held


def reset_behind(behind: StreamBehindCheckpoint, first: int) -> int:
    """``failOnDataLoss=false``: log (WARNING) that the checkpoint's offset of a partition is
    past its end — the records the checkpoint counted are gone and the indexes now mean
    others — and return where the query goes on: the partition's current end,
    ``behind.next_index``, so the records it holds now (``first``..end-1) are not read.

    Kafka's source does this: a partition whose latest offset is below the batch's start
    offset is data loss ("Partition ...'s offset was changed from X to Y", Spark's
    ``KafkaOffsetReaderAdmin.getOffsetRangesFromResolvedOffsets``); with ``failOnDataLoss=false``
    that is a warning, the range (negative size) is dropped (``KafkaOffsetRangeCalculator
    .getRanges``) and the batch ends at the latest offset, where the next one starts. Not its
    start: what the stream holds below its end now may be the old records restored (an older
    copy of the data dir) that the query's sink already holds."""
    end = behind.next_index
    unread = f"{first}..{end - 1} held now are not read" if first < end else "none is held below"
    log_event(
        _logger,
        logging.WARNING,
        f"stream {behind.stream!r} partition {behind.partition} ends at index {end}, below the "
        f"checkpoint's offset {behind.offset} (made again or restored from an older copy); "
        f"going on from index {end}, its end: indexes {end}..{behind.offset - 1} the checkpoint "
        f"counted are gone and {unread} (failOnDataLoss=false)",
        stream=behind.stream,
        partition=behind.partition,
        checkpoint_offset=behind.offset,
        next_index=behind.next_index,
        unread_first=first,
    )
    return behind.next_index


# -- filter pushdown ------------------------------------------------------------------------


@dataclass
class Pushed:
    partitions: set[int] | None = None
    lo: int = 0
    hi: int | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None

    def absorb(self, f: Filter) -> bool:
        """Fold ``f`` in; True if it is fully handled (Spark need not evaluate it again)."""
        attr: tuple[str, ...] = getattr(f, "attribute", ())  # every concrete Filter has one
        col = attr[0] if len(attr) == 1 else None
        value = getattr(f, "value", None)
        if col == "partition":
            if isinstance(f, EqualTo) and isinstance(value, int):
                wanted = {value}
            elif isinstance(f, In) and value is not None and all(isinstance(v, int) for v in value):
                wanted = set(value)
            else:
                return False
            self.partitions = wanted if self.partitions is None else self.partitions & wanted
            return True
        if col == "index" and isinstance(value, int) and not isinstance(value, bool):
            lo, hi = self._bounds(f, value)
            if lo is None and hi is None:
                return False
            if lo is not None:
                self.lo = max(self.lo, lo)
            if hi is not None:
                self.hi = hi if self.hi is None else min(self.hi, hi)
            return True
        if col == "timestamp_ns" and isinstance(value, int) and not isinstance(value, bool):
            lo, hi = self._bounds(f, value)
            if lo is not None:
                self.ts_lo = lo if self.ts_lo is None else max(self.ts_lo, lo)
            if hi is not None:
                self.ts_hi = hi if self.ts_hi is None else min(self.ts_hi, hi)
            return False  # pruned here, re-checked by Spark (cheap; keeps null semantics exact)
        return False

    @staticmethod
    def _bounds(f: Filter, v: int) -> tuple[int | None, int | None]:
        if isinstance(f, EqualTo):
            return v, v + 1
        if isinstance(f, GreaterThan):
            return v + 1, None
        if isinstance(f, GreaterThanOrEqual):
            return v, None
        if isinstance(f, LessThan):
            return None, v
        if isinstance(f, LessThanOrEqual):
            return None, v + 1
        return None, None


# -- batch ----------------------------------------------------------------------------------


class LoglakeReader(DataSourceReader):
    """Batch reader; prunes by the ``partitions``/``startIndex``/``endIndex`` options only.

    It deliberately does not implement ``pushFilters``: in Spark 4.3 the planner pickles the
    data source with the pushed-down reader back into the relation, which the DataFrame it was
    filtered from shares, so ``df.where(f).count()`` followed by ``df.count()`` returns only the
    rows of ``f`` (reproduced here; see ``tests/pipeline/test_read.py``). Filter pushdown is
    available as an opt-in (option ``pushFilters=true``, ``PushdownReader``) for DataFrames
    that are not reused unfiltered."""

    def __init__(self, opts: SourceOptions, layout: StreamLayout) -> None:
        self.opts, self.layout = opts, layout
        self.pushed = Pushed(lo=opts.start_index, hi=opts.end_index)

    def partitions(self) -> Sequence[InputPartition]:
        opts, pushed = self.opts, self.pushed
        if opts.live_ranges is not None:  # read(): exactly the live tail it planned
            return [
                s
                for p, ranges in sorted(opts.live_ranges.items())
                if pushed.partitions is None or p in pushed.partitions
                for a, b in ranges
                for s in _clip_chunks(p, a, b, pushed.lo, pushed.hi, opts.split_records, True)
            ] or [RangeSplit(0, 0, 0)]
        splits: list[InputPartition] = []
        for p in self.layout.partitions:
            if pushed.partitions is not None and p not in pushed.partitions:
                continue
            first, nxt = _partition_bounds(opts, self.layout, p)
            check_start_index(opts, p, first)
            splits += _clip_chunks(p, first, nxt, pushed.lo, pushed.hi, opts.split_records, False)
        return splits or [RangeSplit(0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangeSplit)
        if partition.end <= partition.start:
            return iter(())
        return read_range(self.opts, partition, RowFilter(self.pushed.ts_lo, self.pushed.ts_hi))


class PushdownReader(LoglakeReader):
    """``LoglakeReader`` + ``pushFilters``: ``partition`` and ``index`` comparisons prune the
    splits; ``timestamp_ns`` ranges prune rows and are re-checked by Spark."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self.pushed.absorb(f):
                yield f


def _clip_chunks(
    p: int, a: int, b: int, lo: int, hi: int | None, split_records: int, live_only: bool
) -> list[RangeSplit]:
    a = max(a, lo)
    b = b if hi is None else min(b, hi)
    return [
        RangeSplit(r.partition, r.start, r.end, live_only=live_only)
        for r in chunk(p, a, b, split_records)
    ]


def _partition_bounds(opts: SourceOptions, layout: StreamLayout, p: int) -> tuple[int, int]:
    """``(first, next)`` of partition ``p`` over the lake and the live log together."""
    files = visible_lake_files(opts.data_dir, opts.stream, p) if opts.data_dir else []
    return kept_bounds(files, layout.live.get(p))


def kept_bounds(files: Sequence[LakeFile], live: tuple[int, int] | None) -> tuple[int, int]:
    """``(first, next)`` of a partition from its visible lake ``files`` and its live log's
    ``(first_index, next_index)`` (None: no live log): the first index still kept anywhere,
    and the next one to be written."""
    firsts, nexts = [], []
    if live is not None:
        lf, ln = live
        if ln > lf:
            firsts.append(lf)
        nexts.append(ln)
    if files:
        firsts.append(files[0].first)
        nexts.append(files[-1].last + 1)
    nxt = max(nexts, default=0)
    return min(firsts, default=nxt), nxt


def check_start_index(opts: SourceOptions, partition: int, first: int) -> None:
    """A batch read's ``startIndex`` below ``partition``'s first kept index ``first`` (the
    records asked for from there were removed by retention) is ``LiveHistoryGone`` naming the
    lost range, as a JSON ``startingOffsets`` below it is for a streaming query; with
    ``failOnDataLoss=false`` a warning names it (``skip_lost``) and the read starts at
    ``first``, as it did in silence before. Kafka's batch source does the same: its
    ``startingOffsets`` offsets are read as given, and the executor's consumer, finding one
    below the earliest offset still held, reports data loss (``KafkaDataConsumer.get``:
    ``reportDataLoss`` then ``getEarliestAvailableOffsetBetween``), which fails the query
    or, with ``failOnDataLoss=false``, is a warning and the read goes on from the earliest
    offset (Spark's Kafka integration docs: ``failOnDataLoss`` applies to "streaming and
    batch", SPARK PR 24932). No ``startIndex`` given is ``earliest`` (Kafka's batch default)."""
    upto = first if opts.end_index is None else min(first, opts.end_index)
    if not opts.start_index_set or opts.start_index >= upto:
        return
    gone = LiveHistoryGone(opts.stream, partition, opts.start_index, first, held_by(opts))
    if opts.fail_on_data_loss:
        raise gone
    skip_lost(gone, opts.start_index, upto)


def held_by(opts: SourceOptions) -> str:
    """Where the live log is, for ``LiveHistoryGone`` ("" names JetStream)."""
    return "" if opts.backend else opts.url or opts.data_dir or ""


# -- streaming ------------------------------------------------------------------------------


def share_budget(lags: dict[str, int], budget: int) -> dict[str, int]:
    """How many of its ``lags[p]`` records each partition reads when a micro-batch may read
    ``budget`` in all: everything if it fits, else shares in proportion to the lags (largest
    remainders first, then partition order; exactly ``budget`` in all), as Spark's Kafka source
    shares ``maxOffsetsPerTrigger``. Taking the partitions in order instead starves the later
    ones while the first has a backlog, and a reader that joins records across partitions
    (a Cardinal block's messages are spread over them) then holds half-made work."""
    total = sum(lags.values())
    if total <= budget:
        return dict(lags)
    take = {p: budget * n // total for p, n in lags.items()}
    left = budget - sum(take.values())
    # each fractional share is < 1 and they add up to ``left``: enough partitions to round up
    for p in sorted(lags, key=lambda p: (-(budget * lags[p] % total), int(p)))[:left]:
        take[p] += 1
    return take


class LoglakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, layout: StreamLayout) -> None:
        self.opts, self.layout = opts, layout
        self._target: dict[str, int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """Record what "available now" means: every partition's current ``next_index``."""
        self._target = {p: b[1] for p, b in self._current().items()}

    def _current(self) -> dict[str, tuple[int, int]]:
        layout = resolve_stream(self.opts)
        return {str(p): _partition_bounds(self.opts, layout, p) for p in layout.partitions}

    def initialOffset(self) -> dict:
        bounds = self._current()
        start = self.opts.starting_offsets
        if start == EARLIEST:
            return {p: b[0] for p, b in bounds.items()}
        if start == LATEST:
            return {p: b[1] for p, b in bounds.items()}
        explicit = parse_offsets_json(start)
        unknown = [p for p in explicit if str(p) not in bounds]
        if unknown:
            raise BadOption("startingOffsets", start, f"no partition {unknown} in the stream")
        out = {}
        for p, (first, nxt) in bounds.items():
            v = explicit.get(int(p), -2)
            if 0 <= v < first:
                # an offset retention removed: it started at the first kept index, the records
                # asked for skipped in silence. Kafka's source reports data loss here
                # (failOnDataLoss, default true); the same rule as a read of a removed range
                gone = LiveHistoryGone(self.opts.stream, int(p), v, first, held_by(self.opts))
                if self.opts.fail_on_data_loss:
                    raise gone
                v = skip_lost(gone, v, nxt)
            out[p] = first if v == -2 else nxt if v == -1 else v
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        n = self.opts.max_records_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict, limit: ReadLimit | None = None) -> dict:
        """Every partition's ``next_index``; with ``ReadMaxRows`` (``maxRecordsPerTrigger``)
        at most that many records, shared across the partitions in proportion to what each has
        to read (``share_budget``). ``ReadAllAvailable`` ignores the option, as the API requires
        (``Trigger.AvailableNow`` relies on it). A partition that ends below ``start`` is
        ``StreamBehindCheckpoint``, or with ``failOnDataLoss=false`` ends this batch at its
        ``next_index``, below ``start`` (``partitions`` plans nothing for it), so the query goes
        on from there (``reset_behind``)."""
        bounds = self._current()
        start = dict(start)
        for p, (kept, nxt) in bounds.items():
            # the durable prefix readers see never shrinks: a stream made again, or restored
            # from an older copy, under this checkpoint (Kafka's failOnDataLoss: said, not
            # skipped; reading on would skip what is appended below the checkpoint's offset)
            if start.get(p, 0) > nxt:
                behind = StreamBehindCheckpoint(self.opts.stream, int(p), start[p], nxt)
                if self.opts.fail_on_data_loss:
                    raise behind
                start[p] = reset_behind(behind, kept)
        end = {p: max(b[1], start.get(p, b[0])) for p, b in bounds.items()}
        if self._target is not None:  # Trigger.AvailableNow: never past the recorded target
            end = {p: min(e, max(self._target.get(p, e), start.get(p, 0))) for p, e in end.items()}
        budget = getattr(limit, "max_rows", None)
        if budget is not None:
            first = {p: start.get(p, bounds[p][0]) for p in end}
            take = share_budget({p: end[p] - first[p] for p in end}, budget)
            end = {p: first[p] + take[p] for p in end}
        return end

    def reportLatestOffset(self) -> dict:
        return {p: b[1] for p, b in self._current().items()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        splits: list[InputPartition] = []
        for p, e in sorted(end.items(), key=lambda kv: int(kv[0])):
            s = start.get(p, 0)
            if e > s:
                splits += [
                    RangeSplit(r.partition, r.start, r.end)
                    for r in chunk(int(p), s, e, self.opts.split_records)
                ]
        return splits

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangeSplit)
        return read_range(self.opts, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the source is read-only and Spark's checkpoint holds offsets."""


# -- write ----------------------------------------------------------------------------------

WRITABLE = {
    "data": (BinaryType, StringType),
    "key": (BinaryType, StringType),
    "headers": (ArrayType,),
    "timestamp_ns": (LongType, IntegerType),
    "partition": (IntegerType, LongType),
    "stream": (StringType,),  # ignored: the target stream is the option
    "index": (LongType, IntegerType),  # ignored: the log assigns indexes
}


def check_write_schema(schema: StructType, opts: SourceOptions) -> None:
    """Raise ``SchemaMismatch`` naming the column unless ``schema`` can be appended."""
    names = {f.name: f.dataType for f in schema.fields}
    if "data" not in names:
        raise SchemaMismatch(
            f"stream {opts.stream}: the DataFrame has no 'data' column (columns: {sorted(names)})"
        )
    for name, dtype in names.items():
        allowed = WRITABLE.get(name)
        if allowed is None:
            extra = sorted(set(names) - set(WRITABLE))
            raise SchemaMismatch(
                f"stream {opts.stream}: column {name!r} is not a record field; "
                f"unexpected columns {extra}, expected some of {sorted(WRITABLE)}"
            )
        if not isinstance(dtype, allowed):
            raise SchemaMismatch(
                f"stream {opts.stream}: column {name!r} is {dtype.simpleString()}, expected "
                + " or ".join(_type_name(t) for t in allowed)
            )
        if name == "headers" and not _is_header_array(dtype):
            raise SchemaMismatch(
                f"stream {opts.stream}: column 'headers' is {dtype.simpleString()}, expected "
                "array<struct<key:string,value:binary>>"
            )
    by = opts.partition_by
    if by and by.startswith("column:") and by[7:] not in names:
        raise BadOption("partitionBy", by, f"no column {by[7:]!r} in {sorted(names)}")


def _type_name(t: type[DataType]) -> str:
    return t.typeName() if hasattr(t, "typeName") else t.__name__


def _is_header_array(dtype: DataType) -> bool:
    e = getattr(dtype, "elementType", None)
    return (
        isinstance(e, StructType)
        and [f.name for f in e.fields] == ["key", "value"]
        and isinstance(e.fields[0].dataType, StringType)
        and isinstance(e.fields[1].dataType, BinaryType | StringType)
    )


@dataclass
class StagedFile(WriterCommitMessage):
    path: str
    rows: int


def staging_root(data_dir: str) -> Path:
    return Path(data_dir) / "_pipeline" / "staging"


STALE_STAGING_SECONDS = 3600.0


def remove_stale_staging(data_dir: str, older_than: float = STALE_STAGING_SECONDS) -> None:
    """Staging left by tasks that were still running when their write was aborted."""
    import time

    root = staging_root(data_dir)
    if not root.is_dir():
        return
    now = time.time()
    for d in root.iterdir():
        try:
            if now - d.stat().st_mtime > older_than:
                shutil.rmtree(d, ignore_errors=True)
        except FileNotFoundError:
            pass


class LoglakeWriter(DataSourceArrowWriter):
    def __init__(self, opts: SourceOptions, partition_count: int, schema: StructType) -> None:
        self.opts, self.partition_count = opts, partition_count
        self.columns = schema.fieldNames()
        self.write_id = uuid.uuid4().hex
        by = opts.partition_by
        if by is None:
            by = (
                "column:partition"
                if "partition" in self.columns
                else ("key" if "key" in self.columns else "round_robin")
            )
        self.partition_by = by

    def _stage_dir(self) -> Path:
        base = self.opts.data_dir or "/tmp/loglake-pipeline"
        return staging_root(base) / self.write_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        import mmh3

        folder = self._stage_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{uuid.uuid4().hex}.parquet"
        writer = None
        rows = 0
        n = self.partition_count
        try:
            for batch in iterator:
                if self.partition_by.startswith("column:"):
                    col = batch.column(self.partition_by[7:])
                    if col.null_count:
                        raise BadOption("partitionBy", self.partition_by, "null partition value")
                    # checked before any cast: a bigint past int32 was a pyarrow overflow
                    parts = col.to_pylist()
                    bad = [p for p in parts if not 0 <= p < n]
                    if bad:
                        raise BadOption(
                            "partitionBy",
                            self.partition_by,
                            f"partition {bad[0]} out of range 0..{n - 1} of {self.opts.stream}",
                        )
                elif self.partition_by == "key":
                    keys = batch.column("key").to_pylist()
                    parts = [
                        0 if k is None else mmh3.hash(_as_bytes(k), signed=False) % n for k in keys
                    ]
                else:
                    parts = [(rows + i) % n for i in range(batch.num_rows)]
                _check_no_nulls(batch, self.opts.stream)
                table = _normalise(batch, parts)
                if writer is None:
                    writer = pq.ParquetWriter(str(path), table.schema)
                writer.write_table(table)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        return StagedFile(str(path) if rows else "", rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            staged = [m for m in messages if isinstance(m, StagedFile) and m.path]
            append_staged(self.opts, [m.path for m in staged])
        finally:
            shutil.rmtree(self._stage_dir(), ignore_errors=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        shutil.rmtree(self._stage_dir(), ignore_errors=True)


def _as_bytes(v: bytes | str) -> bytes:
    return v.encode() if isinstance(v, str) else v


STAGE_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        LAKE_SCHEMA.field("timestamp_ns").with_nullable(True),
        LAKE_SCHEMA.field("key"),
        LAKE_SCHEMA.field("headers").with_nullable(True),
        LAKE_SCHEMA.field("data"),
    ]
)


def _check_no_nulls(batch: pa.RecordBatch, stream: str) -> None:
    """``SchemaMismatch`` naming the field if ``data`` or a header's key or value is null: a
    record has none of those (``LAKE_SCHEMA``: not null). Why here: the cast to the staged
    schema failed the task with a pyarrow error, which no typed error was read back from."""
    nulls = []
    if batch.column("data").null_count:
        nulls.append("data")
    if "headers" in batch.schema.names:
        flat = pc.list_flatten(batch.column("headers"))
        if flat.null_count:
            nulls.append("headers (a header)")
        nulls += [f"headers.{n}" for n in ("key", "value") if flat.field(n).null_count]
    if nulls:
        raise SchemaMismatch(
            f"stream {stream}: null in {', '.join(nulls)}; a record's data and its headers' "
            "keys and values cannot be null"
        )


def _normalise(batch: pa.RecordBatch, parts: list[int]) -> pa.Table:
    """The staged shape: target partition + the fields an ``Entry`` takes, lake-typed."""
    names = batch.schema.names
    cols = [pa.array(parts, pa.int32())]
    for f in STAGE_SCHEMA:
        if f.name == "partition":
            continue
        if f.name in names:
            cols.append(batch.column(f.name).cast(f.type))
        else:
            cols.append(pa.nulls(batch.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=STAGE_SCHEMA)


def append_staged(opts: SourceOptions, paths: list[str]) -> int:
    """Append every staged row, partition by partition, in staging order. Returns rows written."""
    from loglake.log.api import Entry

    per_part: dict[int, list[Entry]] = {}
    for path in paths:
        for row in pq.read_table(path).to_pylist():
            headers = tuple((h["key"], h["value"]) for h in row["headers"] or ())
            per_part.setdefault(row["partition"], []).append(
                Entry(row["data"], row["key"], headers, row["timestamp_ns"])
            )
    if not per_part:
        return 0
    if opts.url:
        # Over the Ockam wire a push carries data only: refuse, before anything is appended,
        # rather than drop keys, headers or timestamps without a word.
        carried = [
            name
            for name, present in (
                ("key", any(e.key is not None for v in per_part.values() for e in v)),
                ("headers", any(e.headers for v in per_part.values() for e in v)),
                (
                    "timestamp_ns",
                    any(e.timestamp_ns is not None for v in per_part.values() for e in v),
                ),
            )
            if present
        ]
        if carried:
            raise BadOption(
                "url",
                opts.url,
                f"a push over the stream protocol carries data only; rows have {carried} "
                "(drop those columns, or write through data_dir)",
            )
        client = opts.url_source().client()
        try:
            for p, entries in sorted(per_part.items()):
                client.push_many(opts.stream, [e.data for e in entries], partition=p)
        finally:
            close = getattr(client, "close", None)
            if close:
                close()
    else:
        from loglake.log import open_log

        assert opts.data_dir is not None  # parse_options: a url or a data dir
        log = open_log(opts.data_dir)
        try:
            for p, entries in sorted(per_part.items()):
                log.append_many(opts.stream, entries, partition=p)
            log.flush()
        finally:
            log.close()
    return sum(len(v) for v in per_part.values())


# -- the source -----------------------------------------------------------------------------


class LoglakeDataSource(DataSource):
    """``spark.read.format("loglake")`` / ``readStream`` / ``df.write.format("loglake")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        # Called once by load(): check the options here so a bad one fails load() itself,
        # before a streaming query starts.
        self._resolve()
        return RECORD_SCHEMA

    def _resolve(self) -> tuple[SourceOptions, StreamLayout]:
        opts = parse_options(self.options)
        if opts.live_ranges is not None:  # read() planned it already: no second look-up
            return opts, StreamLayout(opts.stream, tuple(sorted(opts.live_ranges)), {})
        return opts, resolve_stream(opts)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts, layout = self._resolve()
        return (PushdownReader if opts.push_filters else LoglakeReader)(opts, layout)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LoglakeStreamReader(*self._resolve())

    def writer(self, schema: StructType, overwrite: bool) -> LoglakeWriter:
        opts, layout = self._resolve()
        if overwrite:
            raise BadOption("mode", "overwrite", "streams are append-only; use mode append")
        check_write_schema(schema, opts)
        if opts.data_dir:
            remove_stale_staging(opts.data_dir)
        count = opts.partition_count or (max(layout.partitions) + 1 if layout.partitions else 1)
        return LoglakeWriter(opts, count, schema)


def register(spark: SparkSession) -> None:
    """Register the source on ``spark`` (idempotent) and enable Python filter pushdown."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(LoglakeDataSource)
