"""The lake rules of ``loglake.pipeline.lake`` (cover rule, split rule) — no Spark."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.log.api import CorruptSegment
from loglake.pipeline.errors import LakeLayoutError
from loglake.pipeline.lake import (
    IndexRange,
    LakeFile,
    all_lake_files,
    chunk,
    lake_file_rows,
    plan_partition,
    split_covered,
    subtract,
    visible_lake_files,
)

from .helpers import DAMAGED_PAGE, damage_lake_file, write_lake


def lf(first: int, last: int, size: int = 100) -> LakeFile:
    return LakeFile(first, last, f"/x/{first}-{last}", size)


def test_cover_rule_hides_files_inside_a_larger_one():
    visible, superseded = split_covered([lf(0, 9), lf(10, 19), lf(0, 19), lf(20, 29)])
    assert [(f.first, f.last) for f in visible] == [(0, 19), (20, 29)]
    assert sorted((a.first, b.first, b.last) for a, b in superseded) == [(0, 0, 19), (10, 0, 19)]


def test_cover_rule_rejects_partial_overlap():
    with pytest.raises(LakeLayoutError, match="overlaps"):
        split_covered([lf(0, 9), lf(5, 14)])


def test_listing_ignores_foreign_files_and_applies_cover_rule(tmp_path):
    write_lake(tmp_path, "s", 0, 0, 9)
    write_lake(tmp_path, "s", 0, 10, 19)
    big = write_lake(tmp_path, "s", 0, 0, 19)
    (big.parent / ".tmp-00000000000000000020-00000000000000000029.parquet").write_bytes(b"x")
    (big.parent / "notes.txt").write_text("not a lake file")
    assert len(all_lake_files(tmp_path, "s", 0)) == 3
    assert [f.path for f in visible_lake_files(tmp_path, "s", 0)] == [str(big)]


def test_subtract_examples():
    assert subtract(0, 100, [(10, 20), (30, 40)]) == [(0, 10), (20, 30), (40, 100)]
    assert subtract(15, 35, [(10, 20), (30, 40)]) == [(20, 30)]
    assert subtract(0, 10, [(0, 10)]) == []
    assert subtract(5, 5, []) == []


@given(
    lo=st.integers(0, 50),
    span=st.integers(0, 50),
    cuts=st.lists(st.tuples(st.integers(0, 100), st.integers(1, 10)), max_size=6),
)
def test_subtract_is_exactly_the_uncovered_indexes(lo, span, cuts):
    hi = lo + span
    covered, pos = [], 0
    for gap, length in cuts:  # sorted, non-overlapping ranges
        covered.append((pos + gap, pos + gap + length))
        pos += gap + length
    want = {i for i in range(lo, hi) if not any(a <= i < b for a, b in covered)}
    got = [i for a, b in subtract(lo, hi, covered) for i in range(a, b)]
    assert len(got) == len(set(got)) and set(got) == want


def test_chunk_splits_by_split_records():
    want = [IndexRange(3, 0, 10), IndexRange(3, 10, 20), IndexRange(3, 20, 25)]
    assert chunk(3, 0, 25, 10) == want


def test_plan_sends_sealed_range_to_files_and_the_rest_to_the_log():
    files = [lf(0, 99), lf(100, 199)]
    plan = plan_partition(0, files, log_first=0, log_next=250, lo=150, hi=None, split_records=40)
    assert [(f.first, f.last) for f in plan.files] == [(100, 199)]
    assert plan.live == [IndexRange(0, 200, 240), IndexRange(0, 240, 250)]


def test_plan_range_inside_the_lake_reads_no_live_record():
    plan = plan_partition(0, [lf(0, 99)], log_first=0, log_next=150, lo=10, hi=20)
    assert [(f.first, f.last) for f in plan.files] == [(0, 99)] and plan.live == []


def test_plan_without_a_readable_log_is_lake_only():
    plan = plan_partition(0, [lf(0, 9)], log_first=None, log_next=None)
    assert len(plan.files) == 1 and plan.live == []


@pytest.mark.parametrize("how", ["truncated", "foreign"])
def test_a_damaged_or_foreign_lake_file_is_corrupt_segment_naming_it(tmp_path, how):
    from loglake.pipeline.units import Unit, read_unit_columns

    good = write_lake(tmp_path, "s", 0, 0, 9)
    assert lake_file_rows(good) == 10
    bad = write_lake(tmp_path, "s", 0, 10, 19)
    damage_lake_file(bad, how)
    with pytest.raises(CorruptSegment, match=bad.name):
        lake_file_rows(bad)
    # the protocol jobs' reader of lake files (pipeline/units.py), whole file and a range
    for lo in (10, 12):
        with pytest.raises(CorruptSegment, match=bad.name):
            list(read_unit_columns(str(tmp_path), Unit("s", str(bad), 10, 20), lo=lo))


def _every_jobs_reader_refuses(data_dir: pathlib.Path, bad: pathlib.Path) -> None:
    """``bad`` (the lake file of indexes 10..19 of stream ``s``) is ``CorruptSegment`` naming it
    for each reader of lake files the jobs use."""
    from loglake.pipeline.datasource import RangeSplit, read_range
    from loglake.pipeline.options import parse_options
    from loglake.pipeline.units import Unit, read_unit_columns, read_unit_pieces

    unit = Unit("s", str(bad), 10, 20)
    for lo in (10, 12):  # the protocol jobs' reader (pipeline/units.py): whole file, a range
        with pytest.raises(CorruptSegment, match=bad.name):
            list(read_unit_columns(str(data_dir), unit, lo=lo))
    with pytest.raises(CorruptSegment, match=bad.name):  # archives-build's and sds-audit's
        list(read_unit_pieces(str(data_dir), unit, ["index", "data"], 4, 2))
    opts = parse_options({"data_dir": str(data_dir), "stream": "s"})
    with pytest.raises(CorruptSegment, match=bad.name):  # the loglake source, cardinal-blocks
        list(read_range(opts, RangeSplit(0, 0, 20)))


@pytest.mark.parametrize("how", DAMAGED_PAGE)
def test_a_damaged_page_whose_footer_is_whole_is_corrupt_segment_naming_it(tmp_path, how):
    # the footer reads, so the check on opening passes; pyarrow did not check the pages' CRCs:
    # flipped data bytes came back as other records, a flipped page header was a pyarrow
    # OSError from the task (not typed, so the jobs printed its traceback)
    write_lake(tmp_path, "s", 0, 0, 9)
    bad = write_lake(tmp_path, "s", 0, 10, 19)
    damage_lake_file(bad, how)
    assert lake_file_rows(bad) == 10  # the footer is whole
    _every_jobs_reader_refuses(tmp_path, bad)


def _rewrite_rows(path: pathlib.Path, how: str) -> None:
    """A lake file rewritten whole (schema, page checksums and all) with rows that do not
    match its name: what the footer-only checks let through."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    n = t.num_rows
    at = t.schema.get_field_index("index")
    if how == "fewer":
        t = t.slice(0, n // 2)
    elif how == "twice":
        t = pa.concat_tables([t, t])
    elif how == "shifted":
        t = t.set_column(at, t.schema.field("index"), pc.add(t["index"], 1000))
    elif how == "reversed":
        t = t.take(list(range(n - 1, -1, -1)))
    elif how == "swapped":  # one row in place of another: same count, same bounds
        t = t.take([0, 1, 1, *range(3, n)])
    elif how == "null":
        schema = pa.schema([f.with_nullable(True) for f in t.schema])
        idx = t["index"].to_pylist()
        idx[3] = None
        t = t.cast(schema).set_column(at, schema.field("index"), pa.array(idx, pa.int64()))
    pq.write_table(t, path, write_page_checksum=True)


@pytest.mark.parametrize("how", ["fewer", "twice", "shifted", "reversed", "swapped", "null"])
def test_a_lake_file_whose_rows_do_not_match_its_name_is_corrupt_segment(tmp_path, how):
    """Found from outside: a lake file under its name holding half its rows, each row twice,
    other indexes, its rows in another order or a null index was read as it was by every
    reader the jobs use (only the storage engine's own ``check_lake_file`` refused it):
    ``sds-audit`` and ``archives-build`` reported success over lost or duplicated records,
    ``compact`` wrote the damage into its output and deleted the sources, the ``loglake``
    source skipped or repeated indexes. Now each is ``CorruptSegment`` naming the file."""
    write_lake(tmp_path, "s", 0, 0, 9)
    bad = write_lake(tmp_path, "s", 0, 10, 19)
    _rewrite_rows(bad, how)
    _every_jobs_reader_refuses(tmp_path, bad)
    if how in ("fewer", "twice", "shifted", "null"):  # Spark's reader and compact: the footer
        with pytest.raises(CorruptSegment, match=bad.name):
            lake_file_rows(bad)
