"""The replay job's output read back in event-id order without Spark (``iter_parts``).

Each part file the job writes is sorted by event id, but Spark does not put the files in order
(no ``orderBy``: its sampling job ran the whole input twice): the reader orders them by their
index ranges, and merges files whose ranges overlap (a Spark task may pack several small lake
files into one part)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from loglake.pipeline.jobs.replay import count_rows, iter_parts


def _part(folder: Path, name: str, ids: list[int], row_group_size: int = 3) -> None:
    table = pa.table(
        {
            "index": pa.array(ids, pa.int64()),
            "a": pa.array([b"a%d" % i for i in ids], pa.binary()),
            "b": pa.array([b"b"] * len(ids), pa.binary()),
            "c": pa.array([b"c%d" % i for i in ids], pa.binary()),
        }
    )
    pq.write_table(table, folder / f"part-{name}.parquet", row_group_size=row_group_size)


def test_parts_out_of_name_order_are_read_in_event_id_order(tmp_path: Path) -> None:
    _part(tmp_path, "00000", list(range(20, 30)))
    _part(tmp_path, "00001", list(range(0, 10)))
    _part(tmp_path, "00002", [])
    _part(tmp_path, "00003", list(range(10, 20)))
    assert [r[0] for r in iter_parts(tmp_path)] == list(range(30))
    assert [r[0] for r in iter_parts(tmp_path, 13)] == list(range(13, 30))
    assert list(iter_parts(tmp_path, 30)) == []
    assert next(iter(iter_parts(tmp_path, 5))) == (5, b"a5", b"b", b"c5")
    assert count_rows(tmp_path) == 30


def test_parts_with_overlapping_ranges_are_merged(tmp_path: Path) -> None:
    _part(tmp_path, "00000", [0, 1, 2, 10, 11, 12])  # two lake files packed in one task
    _part(tmp_path, "00001", [3, 4, 5, 6, 7, 8, 9])
    _part(tmp_path, "00002", [13, 14])
    rows = list(iter_parts(tmp_path))
    assert [r[0] for r in rows] == list(range(15))
    assert rows[10] == (10, b"a10", b"b", b"c10")
    assert [r[0] for r in iter_parts(tmp_path, 4)] == list(range(4, 15))
