"""Structured Streaming from ``readStream.format("loglake")`` into a Parquet sink: offsets,
``startingOffsets``, and exactly-once output across a killed and restarted query."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.pipeline.errors import BadOption

from .helpers import append, make_log_stream

pytestmark = pytest.mark.spark


def run_available_now(spark, data_dir, out, cp, **options):
    reader = spark.readStream.format("loglake").option("data_dir", str(data_dir))
    reader = reader.option("stream", "ev")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(cp))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None


def sink_rows(spark, out) -> list[tuple[int, int, bytes]]:
    rows = spark.read.parquet(str(out)).select("partition", "index", "data").collect()
    return sorted((r[0], r[1], bytes(r[2])) for r in rows)


def expected_rows(expected: dict) -> list[tuple[int, int, bytes]]:
    return sorted((p, i, d) for (p, i), d in expected.items())


def test_restart_from_checkpoint_picks_up_new_records_once(spark, tmp_path):
    d = tmp_path / "data"
    expected = make_log_stream(d, "ev", partitions=2, records=60)
    out, cp = tmp_path / "out", tmp_path / "cp"
    run_available_now(spark, d, out, cp)
    assert sink_rows(spark, out) == expected_rows(expected)
    for p in (0, 1):
        for i, data in zip(
            append(d, "ev", p, [b"new-%d" % p] * 7), [b"new-%d" % p] * 7, strict=True
        ):
            expected[(p, i)] = data
    run_available_now(spark, d, out, cp)
    assert sink_rows(spark, out) == expected_rows(expected)


def _resume_past_retention(spark, tmp_path, **options) -> tuple:
    """A query that read 0..49 of ``ev``, then 100 more records appended and retention cut the
    head below 120 (0..first-1 gone): the resumed query's outcome, its sink, and ``first``."""
    from loglake.log import Entry, StreamConfig, open_log

    d = tmp_path / "data"
    log = open_log(d)
    log.create_stream("ev", StreamConfig(segment_bytes=2048, seal_to_lake=False))
    log.close()

    def add(n: int) -> None:
        with open_log(d) as w:
            for _ in range(n // 10):
                w.append_many("ev", [Entry(b"x" * 100) for _ in range(10)])

    add(50)
    out, cp = tmp_path / "out", tmp_path / "cp"
    run_available_now(spark, d, out, cp, **options)
    add(100)
    with open_log(d) as w:
        w.truncate_before("ev", 120)
        first = w.stream_info("ev").partitions[0].first_index
    assert 50 < first <= 120
    try:
        run_available_now(spark, d, out, cp, **options)
        failed = None
    except Exception as e:
        failed = e
    return failed, [i for _, i, _ in sink_rows(spark, out)], first


@pytest.mark.parametrize("option", [{}, {"failOnDataLoss": "true"}])
def test_a_checkpoint_past_retention_fails_the_query_with_live_history_gone(
    spark, tmp_path, option
):
    # Kafka's failOnDataLoss (default true): a resumed query whose next offsets retention
    # removed used to skip them silently (the sink went 0..49, then 120..149)
    from loglake.errors import task_error
    from loglake.pipeline.errors import LiveHistoryGone

    failed, rows, _ = _resume_past_retention(spark, tmp_path, **option)
    gone = task_error(failed) if failed else None
    assert isinstance(gone, LiveHistoryGone), str(failed)[:500]
    assert "indexes 50.." in str(gone)
    assert rows == list(range(50))


def test_fail_on_data_loss_false_skips_what_retention_removed_and_goes_on(spark, tmp_path):
    # Kafka's failOnDataLoss=false: the query skips the lost range (a warning names it) and
    # writes what is still held, each record once, and nothing of another range
    failed, rows, first = _resume_past_retention(spark, tmp_path, failOnDataLoss="false")
    assert failed is None
    assert rows == [*range(50), *range(first, 150)]


def _resume_on_a_remade_stream(spark, tmp_path, **options) -> tuple:
    """A query that read 60 records a partition of ``ev``; the stream then deleted and made
    again with 20 other records a partition: the resumed query's error (None if it went on),
    its sink, the first run's records, the data dir and the query's (sink, checkpoint)."""
    import shutil

    d = tmp_path / "data"
    before = make_log_stream(d, "ev", partitions=2, records=60)
    out, cp = tmp_path / "out", tmp_path / "cp"
    run_available_now(spark, d, out, cp, **options)
    assert sink_rows(spark, out) == expected_rows(before)
    shutil.rmtree(d)
    make_log_stream(d, "ev", partitions=2, records=20, seed=2)
    try:
        run_available_now(spark, d, out, cp, **options)
        failed = None
    except Exception as e:
        failed = e
    return failed, sink_rows(spark, out), before, d, (out, cp)


@pytest.mark.parametrize("option", [{}, {"failOnDataLoss": "true"}])
def test_a_checkpoint_past_the_end_of_a_remade_stream_fails_the_query(spark, tmp_path, option):
    # the stream made again with 20 records under a checkpoint at 60: the query read nothing
    # and would have skipped every record appended below 60 (Kafka: "offset was changed")
    from loglake.errors import task_error
    from loglake.pipeline.errors import StreamBehindCheckpoint

    failed, rows, before, _, _ = _resume_on_a_remade_stream(spark, tmp_path, **option)
    behind = task_error(failed) if failed else None
    assert isinstance(behind, StreamBehindCheckpoint), str(failed)[:500]
    assert "ends at index 20, below the checkpoint's offset 60" in str(behind)
    assert rows == expected_rows(before)


def test_fail_on_data_loss_false_goes_on_from_the_end_of_a_remade_stream(spark, tmp_path):
    # Kafka's source with failOnDataLoss=false, a partition's offset gone backwards: a
    # warning, the batch ends at the partition's latest offset and the query goes on from
    # there. Before, StreamBehindCheckpoint whatever the option said
    failed, rows, before, d, (out, cp) = _resume_on_a_remade_stream(
        spark, tmp_path, failOnDataLoss="false"
    )
    assert failed is None, str(failed)[:500]
    assert rows == expected_rows(before)  # the remade stream's 0..19 are not read
    new = {(p, i): b"new-%d-%d" % (p, i) for p in (0, 1) for i in range(20, 25)}
    for p in (0, 1):
        assert append(d, "ev", p, [new[(p, i)] for i in range(20, 25)]) == list(range(20, 25))
    run_available_now(spark, d, out, cp, failOnDataLoss="false")
    # the sink holds indexes 20..24 twice: the old stream's and the remade one's
    assert sink_rows(spark, out) == sorted(expected_rows(before) + expected_rows(new))


def test_starting_offsets_latest_and_json(spark, tmp_path):
    d = tmp_path / "data"
    make_log_stream(d, "ev", partitions=2, records=30)
    run_available_now(spark, d, tmp_path / "o1", tmp_path / "c1", startingOffsets="latest")
    append(d, "ev", 1, [b"after"])
    run_available_now(spark, d, tmp_path / "o1", tmp_path / "c1", startingOffsets="latest")
    assert [(p, i) for p, i, _ in sink_rows(spark, tmp_path / "o1")] == [(1, 30)]
    run_available_now(
        spark, d, tmp_path / "o2", tmp_path / "c2", startingOffsets='{"0": 28, "1": -1}'
    )
    assert [(p, i) for p, i, _ in sink_rows(spark, tmp_path / "o2")] == [(0, 28), (0, 29)]


def test_max_records_per_trigger_splits_batches(spark, tmp_path):
    d = tmp_path / "data"
    expected = make_log_stream(d, "ev", partitions=2, records=30)
    out = tmp_path / "out"
    q = (
        spark.readStream.format("loglake")
        .option("data_dir", str(d))
        .option("stream", "ev")
        .option("maxRecordsPerTrigger", "25")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert sink_rows(spark, out) == expected_rows(expected)
    batches = [n for n in os.listdir(out / "_spark_metadata") if n.isdigit()]
    assert len(batches) == 3  # 60 records, 25 per trigger


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from([str(i) for i in range(8)]), st.integers(0, 10_000)),
    st.integers(1, 20_000),
)
def test_a_budget_is_shared_across_partitions_in_proportion(lags, budget):
    from loglake.pipeline.datasource import share_budget

    take = share_budget(lags, budget)
    total = sum(lags.values())
    assert take.keys() == lags.keys()
    assert sum(take.values()) == min(budget, total)
    for p, n in lags.items():
        assert 0 <= take[p] <= n
        if total > budget:  # the floor of its proportional share, or one more
            assert budget * n // total <= take[p] <= budget * n // total + 1


def test_max_records_per_trigger_reads_every_partition_in_each_batch(tmp_path):
    """Not partition 0's backlog first (a Cardinal block's messages are spread over the
    partitions: read one at a time, no block completes until the last is reached)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from loglake.pipeline.datasource import LoglakeDataSource

    d = tmp_path / "data"
    make_log_stream(d, "ev", partitions=3, records=30)
    reader = LoglakeDataSource(
        {"data_dir": str(d), "stream": "ev", "maxRecordsPerTrigger": "25"}
    ).streamReader(None)
    start = reader.initialOffset()
    assert start == {"0": 0, "1": 0, "2": 0}
    end = reader.latestOffset(start, ReadMaxRows(25))
    assert end == {"0": 9, "1": 8, "2": 8}
    assert reader.latestOffset(end, ReadMaxRows(25)) == {"0": 17, "1": 17, "2": 16}


def test_available_now_respects_max_records_per_trigger(spark, tmp_path):
    d = tmp_path / "data"
    expected = make_log_stream(d, "ev", partitions=2, records=30)
    out = tmp_path / "out"
    run_available_now(spark, d, out, tmp_path / "cp", maxRecordsPerTrigger="25")
    assert sink_rows(spark, out) == expected_rows(expected)
    assert len([n for n in os.listdir(out / "_spark_metadata") if n.isdigit()]) == 3


def test_malformed_starting_offsets_fails_before_the_query_runs(spark, tmp_path):
    d = tmp_path / "data"
    make_log_stream(d, "ev", partitions=1, records=5)
    reader = spark.readStream.format("loglake").option("data_dir", str(d)).option("stream", "ev")
    with pytest.raises(BadOption, match="startingOffsets"):
        from loglake.pipeline.options import parse_options

        parse_options({"data_dir": str(d), "stream": "ev", "startingOffsets": "{0: 1}"})
    with pytest.raises(Exception, match="startingOffsets"):
        reader.option("startingOffsets", "{0: 1}").load()


WORKER = textwrap.dedent(
    """
    import sys
    from loglake.pipeline import build_session
    data_dir, out, cp = sys.argv[1:4]
    spark = build_session(master="local[1]", conf={"spark.driver.memory": "1g"})
    q = (spark.readStream.format("loglake").option("data_dir", data_dir).option("stream", "ev")
         .option("maxRecordsPerTrigger", "40").load()
         .writeStream.format("parquet").option("path", out).option("checkpointLocation", cp)
         .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    q.awaitTermination(600)
    """
)


def committed_batches(out: Path) -> int:
    meta = out / "_spark_metadata"
    return len([n for n in os.listdir(meta) if n.isdigit()]) if meta.is_dir() else 0


@pytest.mark.slow
def test_killed_query_restarts_exactly_once(spark, tmp_path):
    d = tmp_path / "data"
    expected = make_log_stream(d, "ev", partitions=2, records=200)
    out, cp = tmp_path / "out", tmp_path / "cp"
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(d), str(out), str(cp)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while committed_batches(out) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, "the streaming worker died on its own"
            time.sleep(0.2)
        assert committed_batches(out) >= 2, "the worker made no progress in 180 s"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and its JVM, mid-stream
        proc.wait(30)
    done_before = committed_batches(out)
    assert done_before < 10, "the query finished before it was killed: nothing was tested"
    for i, data in zip(append(d, "ev", 0, [b"late"] * 5), [b"late"] * 5, strict=True):
        expected[(0, i)] = data
    run_available_now(spark, d, out, cp)
    assert sink_rows(spark, out) == expected_rows(expected)
