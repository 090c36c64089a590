"""``cardinal-blocks``' source (``cardinal_blocks_source``): a micro-batch's index ranges as rows,
planned with the ``loglake`` source's offsets, and the driver's read of those ranges — every
record once, in index order, from sealed lake files and the live tail alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from loglake.pipeline.errors import BadOption
from loglake.pipeline.jobs.cardinal_blocks_source import (
    IN_SCHEMA,
    RangesDataSource,
    RangesStreamReader,
    read_records,
)
from tests.pipeline.helpers import make_log_stream


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, dict[tuple[int, int], bytes]]:
    d = tmp_path / "data"
    return d, make_log_stream(d, "s", partitions=3, records=200)


def reader(data_dir: Path, stream: str = "s", **more: str) -> RangesStreamReader:
    r = RangesDataSource({"data_dir": str(data_dir), "stream": stream, **more}).streamReader(
        RangesDataSource.schema  # type: ignore[arg-type]  # unused by the reader
    )
    assert isinstance(r, RangesStreamReader)
    return r


def ranges_of(r: RangesStreamReader, start: dict, end: dict, t: int = 0) -> pa.Table:
    batches = [b for p in r.partitions(start, end) for b in r.read(p)]
    table = pa.Table.from_batches(batches) if batches else None
    cols = {"partition": [], "start": [], "end": []} if table is None else table.to_pydict()
    return pa.table({"t": [t] * len(cols["partition"]), **cols})


def cols(t: pa.Table) -> list[list]:
    return [t.column(c).to_pylist() for c in ("partition", "offset", "data")]


def test_the_data_has_lake_files_and_a_live_tail(data):
    d, _ = data
    assert list((d / "lake").rglob("*.parquet")), "nothing sealed: the lake path is untested"


def test_a_micro_batch_reads_every_record_once_in_index_order(data):
    d, expected = data
    r = reader(d)
    start = r.initialOffset()
    end = r.latestOffset(start, None)
    assert end == {"0": 200, "1": 200, "2": 200}
    got = read_records(str(d), ["s"], ranges_of(r, start, end))
    assert got.schema == IN_SCHEMA
    rows = list(zip(*cols(got), strict=True))
    assert {(p, i): v for p, i, v in rows} == expected
    assert [(p, i) for p, i, _ in rows] == sorted(expected), "partition by partition, in order"
    assert set(got.column("t").to_pylist()) == {0}
    assert min(got.column("ts").to_pylist()) == 10_000


def test_max_records_per_trigger_splits_into_consecutive_ranges(data):
    d, expected = data
    r = reader(d, maxRecordsPerTrigger="130")
    start = r.initialOffset()
    seen: dict[tuple[int, int], bytes] = {}
    for _ in range(10):
        end = r.latestOffset(start, ReadMaxRows(130))
        if end == start:
            break
        got = read_records(str(d), ["s"], ranges_of(r, start, end))
        assert got.num_rows == sum(end[p] - start[p] for p in end) <= 130
        for p, i, v in zip(*cols(got), strict=True):
            assert (p, i) not in seen
            seen[(p, i)] = v
        start = end
    assert seen == expected


def test_an_empty_micro_batch_has_no_ranges_and_no_records(data):
    d, _ = data
    r = reader(d)
    end = r.latestOffset(r.initialOffset(), None)
    assert r.partitions(end, end) == []
    got = read_records(str(d), ["s"], ranges_of(r, end, end))
    assert got.num_rows == 0 and got.schema == IN_SCHEMA


def test_topics_keep_their_index(data, tmp_path):
    d, _ = data
    make_log_stream(d, "u", partitions=1, records=30, seed=2)
    a, b = reader(d, "s"), reader(d, "u")
    ranges = pa.concat_tables(
        [
            ranges_of(a, a.initialOffset(), a.latestOffset(a.initialOffset(), None), 0),
            ranges_of(b, b.initialOffset(), b.latestOffset(b.initialOffset(), None), 1),
        ]
    )
    got = read_records(str(d), ["s", "u"], ranges)
    t = got.column("t").to_pylist()
    assert t == [0] * 600 + [1] * 30


def test_bad_options_fail_before_anything_runs(tmp_path):
    with pytest.raises(BadOption):
        RangesDataSource({"data_dir": str(tmp_path), "stream": "nope"}).schema()
    with pytest.raises(BadOption, match="streaming only"):
        RangesDataSource({"data_dir": str(tmp_path), "stream": "s"}).reader(None)  # type: ignore[arg-type]


def test_the_source_runner_plans_without_the_nats_client(data):
    """Spark runs the source's offsets in a Python process of its own for every query: what it
    imports is paid again each time. Planning a data dir with no JetStream note needs neither
    the sealer nor the NATS client (they were most of that process's start)."""
    d, _ = data
    code = (
        "import sys\n"
        "from loglake.pipeline.jobs.cardinal_blocks_source import RangesDataSource\n"
        f"r = RangesDataSource({{'data_dir': {str(d)!r}, 'stream': 's'}}).streamReader(None)\n"
        "assert r.latestOffset(r.initialOffset(), None)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('nats', 'loglake.streams.jet'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
