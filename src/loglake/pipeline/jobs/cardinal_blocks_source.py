"""The micro-batch's ranges, not its records: the streaming source of ``cardinal-blocks``.

Why: the job assembles and orders blocks on the driver, so every record of a micro-batch must
reach the driver. Through the ``loglake`` source each record travelled executor Python →
Arrow → JVM rows → Arrow → driver Python; that hand-off alone cost about half the job's CPU a
message. Here Structured Streaming still plans every micro-batch and checkpoints its offsets —
exactly the ``loglake`` source's offsets (``{"<partition>": next index}``, the same
``latestOffset``, ``maxRecordsPerTrigger`` sharing and ``availableNow`` target, by
inheritance) — but a micro-batch's rows are its index ranges, one per log partition, and the
driver reads the records of those ranges where they lie (``read_records``: lake Parquet through
pyarrow, the live tail through the log's read-only view, the cover rule of ``read_range``).
A micro-batch run again after a crash has the same offsets, so the same ranges and records.

This relies on the driver reading ``data_dir``, as the job's reorg channels already do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from loglake.pipeline.datasource import (
    LoglakeDataSource,
    LoglakeStreamReader,
    RangeSplit,
    read_range,
)
from loglake.pipeline.errors import BadOption
from loglake.pipeline.options import parse_options

FORMAT = "loglake-ranges"
RANGES_SCHEMA = StructType(
    [
        StructField("partition", IntegerType(), True),
        StructField("start", LongType(), True),
        StructField("end", LongType(), True),
    ]
)
"""One row per log partition with records in the micro-batch: ``start <= index < end``.
Nullable because the rows ``read`` yields are Arrow batches with nullable fields, which Spark
checks against this schema field by field."""


@dataclass
class Ranges(InputPartition):
    """All of a micro-batch's ranges of one stream, in one Spark partition (one small task)."""

    ranges: tuple[tuple[int, int, int], ...]

    def __init__(self, ranges: tuple[tuple[int, int, int], ...]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


class RangesStreamReader(LoglakeStreamReader):
    """``LoglakeStreamReader``'s offsets; a micro-batch reads as its ranges."""

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = tuple(
            (int(p), start.get(p, 0), e)
            for p, e in sorted(end.items(), key=lambda kv: int(kv[0]))
            if e > start.get(p, 0)
        )
        return [Ranges(ranges)] if ranges else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Ranges)
        p, s, e = zip(*partition.ranges, strict=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array(p, pa.int32()), pa.array(s, pa.int64()), pa.array(e, pa.int64())],
            names=RANGES_SCHEMA.fieldNames(),
        )


class RangesDataSource(LoglakeDataSource):
    """``spark.readStream.format("loglake-ranges")``: the ``loglake`` source's options and
    offsets, a micro-batch's index ranges as its rows. Streaming only."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        self._resolve()  # a bad option fails load() itself, as for ``loglake``
        return RANGES_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        raise BadOption("format", FORMAT, "streaming only (readStream); use format loglake")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RangesStreamReader(*self._resolve())


IN_SCHEMA = pa.schema(
    [
        ("data", pa.binary()),
        ("t", pa.int32()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("ts", pa.int64()),
    ]
)
"""The assembler's input (``cardinal_blocks._IN_COLUMNS``): the record, its topic as an index
into the job's topics, partition, index, log time in ns (-1 if none)."""


def read_records(data_dir: str, topics: Sequence[str], ranges: pa.Table) -> pa.Table:
    """The records of a micro-batch's ``ranges`` (columns ``t``, ``partition``, ``start``,
    ``end``) as ``IN_SCHEMA``, topic by topic in the order of ``ranges``, each range in index
    order (the order the records came in through the ``loglake`` source)."""
    cols: list[list[pa.Array]] = [[] for _ in IN_SCHEMA]
    opts = {}
    for t, p, s, e in zip(
        *(ranges.column(c).to_pylist() for c in ("t", "partition", "start", "end")), strict=True
    ):
        if t not in opts:
            opts[t] = parse_options({"data_dir": data_dir, "stream": topics[t]})
        for b in read_range(opts[t], RangeSplit(p, s, e)):
            n = b.num_rows
            cols[0].append(b.column("data"))
            cols[1].append(pa.array(np.full(n, t, np.int32)))
            cols[2].append(b.column("partition"))
            cols[3].append(b.column("index"))
            cols[4].append(b.column("timestamp_ns").fill_null(-1))
    if not cols[0]:
        return IN_SCHEMA.empty_table()
    return pa.Table.from_arrays(
        [pa.chunked_array(c, type=f.type) for c, f in zip(cols, IN_SCHEMA, strict=True)],
        schema=IN_SCHEMA,
    )
