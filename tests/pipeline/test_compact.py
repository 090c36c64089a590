"""The ``compact`` job: larger sorted files, same records, atomic commit, readable throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from loglake.cli import main
from loglake.pipeline import read
from loglake.pipeline.errors import BadOption
from loglake.pipeline.jobs.compact import (
    JOB_PREFIX,
    SUCCESS,
    CompactOptions,
    delete_superseded,
    plan,
    plan_groups,
    recover,
    run,
    stage,
)
from loglake.pipeline.lake import LakeFile, all_lake_files, stream_lake_dir, visible_lake_files

from .helpers import DAMAGED_PAGE, damage_lake_file, make_log_stream, rows_of, write_lake


def lf(first, last, size):
    return LakeFile(first, last, f"/x/{first}", size)


def test_groups_are_contiguous_runs_cut_at_the_target_size():
    files = [lf(0, 9, 40), lf(10, 19, 40), lf(20, 29, 40), lf(40, 49, 40), lf(50, 59, 40)]
    groups = plan_groups(files, target_bytes=100)
    # 0-9 + 10-19 fill 80 of 100; 20-29 alone is left alone; 40-49 follows a gap.
    assert [[f.first for f in g] for g in groups] == [[0, 10], [40, 50]]


def test_bad_options_are_typed(tmp_path):
    with pytest.raises(BadOption, match="data_dir"):
        CompactOptions(str(tmp_path / "missing"), "s")
    with pytest.raises(BadOption, match="stream"):
        CompactOptions(str(tmp_path), "s")


@pytest.mark.parametrize(
    ("name", "value"),
    [("grace_seconds", float("nan")), ("grace_seconds", -1.0), ("row_group_bytes", 0)],
)
def test_bad_numbers_are_typed(tmp_path, name, value):
    # NaN grace kept every superseded file for good (nothing is ever >= NaN seconds old);
    # a 0 row group size went to Spark's writer as is
    write_lake(tmp_path, "s", 0, 0, 9)
    with pytest.raises(BadOption) as e:
        CompactOptions(str(tmp_path), "s", **{name: value})
    assert e.value.option == name


def test_a_stream_name_that_is_a_path_is_refused(tmp_path):
    # "--stream ../outside" compacted the Parquet files of <data_dir>/outside/partition=0
    write_lake(tmp_path, "s", 0, 0, 9)
    outside = tmp_path / "outside" / "partition=0"
    outside.mkdir(parents=True)
    with pytest.raises(BadOption) as e:
        CompactOptions(str(tmp_path), "../outside")
    assert e.value.option == "stream"


def log_view(d, stream="cs"):
    """What the storage engine itself reads (it must keep reading compacted files)."""
    from loglake.log import open_log

    log = open_log(d, readonly=True)
    try:
        parts = log.stream_info(stream).partitions
        return {
            (r.partition, r.index): r.data
            for p in parts
            for r in log.read(stream, 0, partition=p.partition)
        }
    finally:
        log.close()


@pytest.fixture
def stream(tmp_path):
    d = tmp_path / "data"
    expected = make_log_stream(d, "cs", partitions=2, records=200)
    return d, expected


@pytest.mark.spark
def test_compact_merges_sorts_and_keeps_every_record(spark, stream):
    d, expected = stream
    before = {p: visible_lake_files(d, "cs", p) for p in (0, 1)}
    seen_during: list[int] = []

    def progress(step, done, total):  # readable throughout: check at every step
        seen_during.append(done)
        assert log_view(d) == expected
        if done == 1 or step == "commit":  # Spark reads cost seconds: sample them
            assert rows_of(read(spark, str(d), "cs")) == expected

    result = run(spark, CompactOptions(str(d), "cs", target_bytes=16 * 1024), progress)
    assert result.groups and seen_during
    for p in (0, 1):
        after = visible_lake_files(d, "cs", p)
        assert len(after) < len(before[p])
        assert after[0].first == before[p][0].first and after[-1].last == before[p][-1].last
        assert all_lake_files(d, "cs", p) == after, "superseded files remain with grace 0"
        for f in after:
            idx = pq.read_table(f.path, columns=["index"]).column(0).to_pylist()
            assert idx == list(range(f.first, f.last + 1)), "a compacted file is sorted, gapless"
    assert not list(stream_lake_dir(d, "cs").glob(f"{JOB_PREFIX}*"))
    assert log_view(d) == expected
    assert rows_of(read(spark, str(d), "cs")) == expected


@pytest.mark.spark
@pytest.mark.parametrize("how", ["truncated", "foreign", *DAMAGED_PAGE])
def test_a_damaged_or_foreign_source_stops_the_job_before_it_writes(spark, stream, how):
    # a foreign file under a lake name was compacted as rows of null index and data, and
    # its neighbours deleted; a truncated one was a pyarrow traceback from the CLI; a damaged
    # page (footer whole) was compacted as other rows (data) or a JVM trace (a page header)
    d, _ = stream
    bad = visible_lake_files(d, "cs", 0)[1].path
    damage_lake_file(Path(bad), how)
    before = {p: all_lake_files(d, "cs", p) for p in (0, 1)}
    res = CliRunner().invoke(
        main, ["job", "compact", "--data-dir", str(d), "--stream", "cs", "--target-size", "16KB"]
    )
    assert res.exit_code == 1
    error = [line for line in res.output.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1 and Path(bad).name in error[0], res.output
    assert "Traceback" not in res.output
    assert {p: all_lake_files(d, "cs", p) for p in (0, 1)} == before


@pytest.mark.spark
def test_crash_after_success_is_finished_and_before_is_dropped(spark, stream):
    d, expected = stream
    opts = CompactOptions(str(d), "cs", target_bytes=16 * 1024, partitions=(0,))
    groups, _ = plan(opts)
    job_dir = stage(spark, opts, groups, lambda *a: None)
    assert (job_dir / SUCCESS).exists() and json.loads((job_dir / "plan.json").read_text())
    # "crash" here: staged files are invisible to every reader
    assert rows_of(read(spark, str(d), "cs")) == expected and log_view(d) == expected
    half = stream_lake_dir(d, "cs") / f"{JOB_PREFIX}unfinished"
    (half / "g0").mkdir(parents=True)
    (half / "g0" / "part-0.parquet").write_bytes(b"partial")
    assert recover(str(d), "cs") == len(groups)
    assert not job_dir.exists() and not half.exists()
    assert rows_of(read(spark, str(d), "cs")) == expected and log_view(d) == expected
    assert delete_superseded(str(d), "cs", 0) > 0
    assert log_view(d) == expected


@pytest.mark.spark
def test_grace_keeps_superseded_files_without_duplicates(spark, stream):
    d, expected = stream
    run(spark, CompactOptions(str(d), "cs", target_bytes=16 * 1024, grace_seconds=3600))
    assert len(all_lake_files(d, "cs", 0)) > len(visible_lake_files(d, "cs", 0))
    assert rows_of(read(spark, str(d), "cs")) == expected
    assert delete_superseded(str(d), "cs", 0) > 0
    assert all_lake_files(d, "cs", 0) == visible_lake_files(d, "cs", 0)


@pytest.mark.spark
def test_cli_job_compact(spark, stream):
    d, expected = stream
    res = CliRunner().invoke(
        main, ["job", "compact", "--data-dir", str(d), "--stream", "cs", "--target-size", "16KB"]
    )
    assert res.exit_code == 0, res.output
    assert "compact cs" in res.output
    assert log_view(d) == expected


def test_cli_bad_input_is_a_message_not_a_traceback(tmp_path):
    runner = CliRunner()
    res = runner.invoke(
        main, ["job", "compact", "--data-dir", str(tmp_path / "x"), "--stream", "s"]
    )
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert f"option --data-dir='{tmp_path / 'x'}'" in res.output, res.output
    res = runner.invoke(
        main,
        ["job", "compact", "--data-dir", str(tmp_path), "--stream", "s", "--target-size", "lots"],
    )
    assert res.exit_code != 0 and "--target-size='lots'" in res.output
    assert runner.invoke(main, ["job", "--help"]).exit_code == 0


@pytest.mark.parametrize(
    ("option", "value", "shown"),
    [
        ("--target-size", "1000", "option --target-size=1000"),
        ("--row-group-size", "0", "option --row-group-size=0"),
    ],
)
def test_cli_errors_name_the_option_typed_not_the_python_field(stream, option, value, shown):
    """The options dataclass names its fields (``target_bytes``); the command line's error
    names the option the user typed, and nothing is compacted."""
    d, _ = stream
    before = all_lake_files(d, "cs", 0)
    res = CliRunner().invoke(
        main, ["job", "compact", "--data-dir", str(d), "--stream", "cs", option, value]
    )
    assert res.exit_code != 0 and "Traceback" not in res.output, res.output
    assert shown in res.output, res.output
    assert "_bytes" not in res.output, res.output
    assert all_lake_files(d, "cs", 0) == before


def test_cli_errors_of_other_jobs_name_their_options(stream, tmp_path):
    """The same mapping for every job mounted under ``loglake job`` (archives-build here:
    ``streams`` and ``key_dir`` are its fields)."""
    d, _ = stream
    runner = CliRunner()
    base = ["job", "archives-build", "--data-dir", str(d), "--root", str(tmp_path / "r")]
    res = runner.invoke(main, [*base, "--stream", "nomatch*", "--key-dir", str(tmp_path)])
    assert "option --stream='nomatch*': no stream of" in res.output, res.output
    res = runner.invoke(main, [*base, "--stream", "cs"])
    assert "option --key-dir=None: give --key-file" in res.output, res.output
    assert res.exit_code != 0 and "Traceback" not in res.output
