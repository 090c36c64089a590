"""Lake file names and the cover rule (log/lake_schema.py, log/lake.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loglake.log.api import CorruptStore
from loglake.log.lake import LakeFile, split_covered
from loglake.log.lake_schema import lake_file_name, parse_lake_file_name


def test_names_sort_in_index_order_and_parse_back():
    names = [lake_file_name(a, b) for a, b in [(100, 199), (0, 99), (2000, 2999)]]
    assert [parse_lake_file_name(n) for n in sorted(names)] == [(0, 99), (100, 199), (2000, 2999)]


@pytest.mark.parametrize(
    "name",
    ["notes.txt", "1-2.parquet.tmp", "a-b.parquet", "12.parquet", "-1-2.parquet", "9-3.parquet"],
)
def test_anything_else_in_the_folder_is_not_a_lake_file(name):
    assert parse_lake_file_name(name) is None


def test_cover_rule_hides_contained_files_and_refuses_partial_overlap():
    def f(a, b):
        return LakeFile(a, b, Path(lake_file_name(a, b)))

    visible, covered = split_covered([f(0, 9), f(10, 19), f(0, 19), f(20, 29)])
    assert [(v.first, v.last) for v in visible] == [(0, 19), (20, 29)]
    assert sorted((c.first, by.last) for c, by in covered) == [(0, 19), (10, 19)]
    with pytest.raises(CorruptStore, match="without containing it"):
        split_covered([f(0, 9), f(5, 14)])


def test_a_lake_file_dictionary_encodes_the_repeating_columns_and_writes_payloads_plain(tmp_path):
    """Payloads, indexes and timestamps are written plain (no dictionary tried and dropped
    halfway through a row group), the columns whose values repeat with a dictionary; the
    file reads back the same records."""
    import pyarrow.parquet as pq

    from loglake.log.api import Record
    from loglake.log.lake import LAKE_DICTIONARY_COLUMNS, records_table, write_lake_table

    records = [
        Record("s", 0, i, 1_000 + i, b"k", (("h", b"v"),), bytes([i % 256]) * 300)
        for i in range(3_000)
    ]
    table = records_table(records, "s", 0)
    lake = write_lake_table(tmp_path, table)
    meta = pq.ParquetFile(lake.path).metadata.row_group(0)
    dictionary = {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}
    encodings = {
        meta.column(i).path_in_schema: set(meta.column(i).encodings)
        for i in range(meta.num_columns)
    }
    assert set(encodings) >= set(LAKE_DICTIONARY_COLUMNS) | {"index", "timestamp_ns", "data"}
    for name, used in encodings.items():
        assert bool(used & dictionary) == (name in LAKE_DICTIONARY_COLUMNS), (name, used)
    assert pq.read_table(lake.path).equals(table)
