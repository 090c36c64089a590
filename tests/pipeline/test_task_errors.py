"""A typed error raised inside a Spark task reaches the driver as itself (``task_error``,
``raises_task_errors``) and the CLI prints it as one line, through the wrappers real Spark raises:
``Py4JJavaError`` from an RDD action (the jobs' plain tasks), ``PythonException`` from a
DataFrame's Python function (``mapInArrow``, the ``loglake`` source). A bug in a task keeps
Spark's wrapper and its traceback."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from loglake.clitools import TypedErrorGroup
from loglake.errors import task_error
from loglake.pipeline.errors import JobFailed, LiveHistoryGone, raises_task_errors

pytestmark = pytest.mark.spark


def in_rdd_task(spark: Any, fail: Any) -> BaseException:
    """What the driver catches when ``fail`` raises in a plain task (``collect``)."""

    def task(_: int) -> int:
        fail()
        return 0

    with pytest.raises(Exception) as info:
        spark.sparkContext.parallelize([0], 1).map(task).collect()
    return info.value


def in_dataframe_task(spark: Any, fail: Any) -> BaseException:
    """What the driver catches when ``fail`` raises in a ``mapInArrow`` function."""

    def run(batches: Any) -> Any:
        fail()
        yield from batches

    with pytest.raises(Exception) as info:
        spark.range(1).mapInArrow(run, "id long").collect()
    return info.value


def gone() -> None:
    raise LiveHistoryGone("ev", 0, 10, 20)


def refused() -> None:
    raise JobFailed("nothing was written")


def denied() -> None:
    raise PermissionError(13, "Permission denied", "/out/part-00000.arrow")


def bug() -> None:
    raise KeyError("oops")


def refused_while_handling_a_bug() -> None:
    try:
        bug()
    except KeyError as e:
        raise JobFailed("refused after a KeyError") from e


def bug_while_handling_a_refusal() -> None:
    try:
        refused()
    except JobFailed:
        bug()


@pytest.mark.parametrize("where", [in_rdd_task, in_dataframe_task])
def test_a_tasks_typed_error_is_rebuilt_with_its_class_and_message(spark, where):
    wrapper = where(spark, gone)
    assert type(wrapper).__module__.startswith(("py4j", "pyspark"))  # Spark's, not ours
    err = task_error(wrapper)
    assert type(err) is LiveHistoryGone
    assert str(err) == str(LiveHistoryGone("ev", 0, 10, 20))

    err = task_error(where(spark, refused))
    assert type(err) is JobFailed and str(err) == "nothing was written"


@pytest.mark.parametrize("where", [in_rdd_task, in_dataframe_task])
def test_a_tasks_file_system_refusal_is_rebuilt_as_an_os_error(spark, where):
    err = task_error(where(spark, denied))
    assert isinstance(err, PermissionError)
    assert (err.errno, err.strerror, err.filename) == (
        13,
        "Permission denied",
        "/out/part-00000.arrow",
    )


@pytest.mark.parametrize("where", [in_rdd_task, in_dataframe_task])
def test_a_bug_in_a_task_keeps_sparks_wrapper(spark, where):
    assert task_error(where(spark, bug)) is None
    # the exception raised last decides: a refusal after a bug is the refusal, and a bug
    # raised while handling a refusal is a bug
    err = task_error(where(spark, refused_while_handling_a_bug))
    assert type(err) is JobFailed and str(err) == "refused after a KeyError"
    assert task_error(where(spark, bug_while_handling_a_refusal)) is None


def test_a_job_raises_its_tasks_typed_error_as_itself(spark):
    @raises_task_errors
    def job(fail: Any) -> None:
        spark.sparkContext.parallelize([0], 1).foreach(lambda _: fail())

    with pytest.raises(LiveHistoryGone, match=r"indexes 10\.\.19") as info:
        job(gone)
    assert type(info.value.__cause__).__module__.startswith(("py4j", "pyspark"))  # kept
    with pytest.raises(Exception) as info:
        job(bug)
    assert not isinstance(info.value, KeyError) and task_error(info.value) is None


def test_the_cli_prints_a_tasks_typed_error_as_one_line(spark):
    @click.group(cls=TypedErrorGroup)
    def g():
        """A group."""

    @g.command()
    def typed():
        """A job whose task refuses."""
        spark.sparkContext.parallelize([0], 1).foreach(lambda _: refused())

    @g.command()
    def files():
        """A job whose task cannot write."""
        spark.sparkContext.parallelize([0], 1).foreach(lambda _: denied())

    @g.command()
    def broken():
        """A job whose task has a bug."""
        spark.sparkContext.parallelize([0], 1).foreach(lambda _: bug())

    r = CliRunner().invoke(g, ["typed"])
    assert (r.exit_code, r.output) == (1, "Error: nothing was written\n")
    r = CliRunner().invoke(g, ["files"])
    assert (r.exit_code, r.output) == (1, "Error: Permission denied: /out/part-00000.arrow\n")
    r = CliRunner().invoke(g, ["broken"])
    assert r.exit_code == 1 and type(r.exception).__module__.startswith(("py4j", "pyspark"))


@pytest.mark.parametrize("job", ["compact", "sds-audit"])
def test_a_damaged_lake_page_is_one_line_from_the_job_cli(tmp_path, job):
    # a few bytes damaged inside a lake file's data page, its footer whole: compact (Spark's
    # Parquet reader) compacted them as other rows or, in a page header, printed a Java stack
    # trace; sds-audit (pyarrow in its tasks, pipeline/units.py) read them as other records or
    # printed a pyarrow traceback. Now one line naming the file, the JVM's task logs included
    import subprocess
    import sys

    from .helpers import damage_lake_file, make_log_stream, write_lake

    d = tmp_path / "data"
    if job == "compact":
        make_log_stream(d, "cs", partitions=1, records=120)
        bad = sorted((d / "lake" / "cs" / "partition=0").glob("*.parquet"))[1]
        args = ["--stream", "cs", "--target-size", "16KB"]
    else:
        write_lake(d, "sds.x", 0, 0, 9)
        bad = write_lake(d, "sds.x", 0, 10, 19)
        args = ["--stream", "sds.x", "--out", str(tmp_path / "out")]
    damage_lake_file(bad, "page")
    out = subprocess.run(
        [sys.executable, "-m", "loglake.cli", "job", job, "--data-dir", str(d), *args,
         "--spark-master", "local[1]"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("Error: ")]
    assert errors == [
        f"Error: {bad}: corrupt record at byte 0: unreadable Parquet: "
        + errors[0].split("unreadable Parquet: ", 1)[-1]
    ], out.stderr[-3000:]
    assert "CRC checksum verification failed" in errors[0]
    noise = [
        ln for ln in out.stderr.splitlines() if ln.startswith(("\tat ", "Traceback", "Caused"))
    ]
    assert noise == [], out.stderr[-3000:]


def test_a_lake_file_removed_under_a_read_keeps_sparks_error(spark, tmp_path):
    # only damage is CorruptSegment: a file a compaction or retention removed after the plan
    # is Spark's own error (not the file's fault), as typed_lake_errors keeps FileNotFoundError
    from loglake.pipeline import read

    from .helpers import write_lake

    write_lake(tmp_path, "s", 0, 0, 9)
    gone = write_lake(tmp_path, "s", 0, 10, 19)
    df = read(spark, str(tmp_path), "s")
    gone.unlink()
    with pytest.raises(Exception) as e:
        df.collect()
    assert "FAILED_READ_FILE" in str(e.value) and task_error(e.value) is None
