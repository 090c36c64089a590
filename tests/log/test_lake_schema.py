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
