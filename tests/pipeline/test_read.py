"""Batch reads: ``read()`` (native sealed + Python tail), ``format("loglake")`` (the Python
source alone), pushdown."""

from __future__ import annotations

import pytest

from loglake.errors import task_error
from loglake.log.api import CorruptSegment
from loglake.pipeline import read
from loglake.pipeline.errors import BadOption
from loglake.pipeline.options import parse_options, resolve_stream
from loglake.pipeline.read import make_plan

from .helpers import DAMAGED_PAGE, damage_lake_file, make_log_stream, rows_of, write_lake

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("read")
    expected = make_log_stream(d, "orders", partitions=2, records=300)
    return d, expected


def _load(spark, d, **options):
    reader = spark.read.format("loglake").option("data_dir", str(d)).option("stream", "orders")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_stream_has_sealed_files_and_a_live_tail(stream_dir):
    d, _ = stream_dir
    opts = parse_options({"data_dir": str(d), "stream": "orders"})
    plan = make_plan(opts, resolve_stream(opts))
    assert plan.files, "the fixture must seal segments to the lake"
    assert plan.live, "the fixture must leave a live tail"


def test_read_returns_every_record_once(spark, stream_dir):
    d, expected = stream_dir
    assert rows_of(read(spark, str(d), "orders")) == expected


def test_sealed_history_goes_to_the_native_parquet_reader(spark, stream_dir):
    d, _ = stream_dir
    plan = read(spark, str(d), "orders")._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" in plan and "BatchScan loglake" in plan


def test_format_entry_reads_every_record_through_the_registered_source(spark, stream_dir):
    # issue 18: no patch of PySpark routes format("loglake") to the native reader any more;
    # it is the Python source alone (same rows, slower); read() is the fast path.
    d, expected = stream_dir
    df = _load(spark, d)
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" not in plan and "BatchScan loglake" in plan
    assert rows_of(df) == expected


def test_nothing_in_pyspark_is_patched(spark):
    from pyspark.sql.readwriter import DataFrameReader

    for name in ("format", "option", "options", "load"):
        assert getattr(DataFrameReader, name).__module__ == "pyspark.sql.readwriter", name
    assert "_loglake_options" not in vars(spark.read)


def test_read_options_is_the_fast_path_for_format_options(spark, stream_dir):
    from loglake.pipeline.read import read_options

    d, expected = stream_dir
    opts = {"data_dir": str(d), "stream": "orders"}
    fast = read_options(spark, opts)
    assert "FileScan parquet" in fast._jdf.queryExecution().executedPlan().toString()
    assert rows_of(fast) == expected
    plain = read_options(spark, {**opts, "nativeSealed": "false"})
    assert "FileScan parquet" not in plain._jdf.queryExecution().executedPlan().toString()


def test_small_tail_read_on_the_driver_gives_the_same_rows(spark, stream_dir):
    d, expected = stream_dir
    df = read(spark, str(d), "orders", driver_tail_records=100_000)
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" in plan and "BatchScan loglake" not in plan
    assert rows_of(df) == expected


def test_python_source_alone_gives_the_same_rows(spark, stream_dir):
    d, expected = stream_dir
    df = _load(spark, d, nativeSealed="false")
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" not in plan and "BatchScan loglake" in plan
    assert rows_of(df) == expected


def test_all_fields_match_the_log(spark, stream_dir):
    from loglake.log import open_log

    d, _ = stream_dir
    log = open_log(d, readonly=True)
    want = {(r.partition, r.index): r for p in (0, 1) for r in log.read("orders", 0, partition=p)}
    log.close()
    for native in ("true", "false"):
        got = _load(spark, d, nativeSealed=native).collect()
        assert len(got) == len(want)
        for row in got:
            rec = want[(row["partition"], row["index"])]
            assert row["stream"] == "orders"
            assert row["timestamp_ns"] == rec.timestamp_ns
            assert row["key"] == rec.key
            assert [(h["key"], bytes(h["value"])) for h in row["headers"]] == list(rec.headers)


def test_index_range_and_partitions(spark, stream_dir):
    d, expected = stream_dir
    want = {k: v for k, v in expected.items() if k[0] == 1 and 50 <= k[1] < 120}
    df = read(spark, str(d), "orders", partitions=[1], start_index=50, end_index=120)
    assert rows_of(df) == want
    assert rows_of(_load(spark, d, partitions="1", startIndex="50", endIndex="120")) == want


def test_opt_in_filter_pushdown_prunes_splits(spark, stream_dir):
    d, expected = stream_dir
    full = _load(spark, d, nativeSealed="false", splitRecords="50")
    assert full.rdd.getNumPartitions() == 12  # 2 partitions x 300 records / 50
    narrow = _load(spark, d, nativeSealed="false", splitRecords="50", pushFilters="true").where(
        "partition = 1 AND index >= 100 AND index < 150"
    )
    assert narrow.rdd.getNumPartitions() == 1
    want = {k: v for k, v in expected.items() if k[0] == 1 and 100 <= k[1] < 150}
    assert rows_of(narrow) == want


@pytest.mark.parametrize("native", ["true", "false"])
def test_a_dataframe_reused_after_a_filter_still_reads_everything(spark, stream_dir, native):
    # Guards against Spark 4.3's pushdown leaking into the parent DataFrame (see LoglakeReader).
    d, expected = stream_dir
    full = _load(spark, d, nativeSealed=native)
    assert full.where("partition = 1 AND index < 10").count() == 10
    assert full.count() == len(expected)


def test_timestamp_filter(spark, stream_dir):
    d, expected = stream_dir
    # make_log_stream stamps record i with 10_000 + i
    want = {k: v for k, v in expected.items() if k[1] >= 250}
    for native in ("true", "false"):
        df = _load(spark, d, nativeSealed=native).where("timestamp_ns >= 10250")
        assert rows_of(df) == want


def test_lake_only_stream_written_by_another_tool(spark, tmp_path):
    write_lake(tmp_path, "ext", 0, 0, 9)
    write_lake(tmp_path, "ext", 0, 10, 19)
    write_lake(tmp_path, "ext", 2, 5, 9)
    df = read(spark, str(tmp_path), "ext")
    assert sorted((r["partition"], r["index"]) for r in df.collect()) == [
        *((0, i) for i in range(20)),
        *((2, i) for i in range(5, 10)),
    ]


@pytest.mark.parametrize("how", ["truncated", "foreign"])
def test_a_damaged_or_foreign_lake_file_is_a_typed_error_not_null_rows(spark, tmp_path, how):
    # Spark's Parquet reader given the record schema read a foreign file's rows as nulls
    # (read() returned 10 rows of nulls) and failed on a truncated one with a JVM trace
    write_lake(tmp_path, "ext", 0, 0, 9)
    bad = write_lake(tmp_path, "ext", 0, 10, 19)
    damage_lake_file(bad, how)
    with pytest.raises(CorruptSegment, match=bad.name):
        read(spark, str(tmp_path), "ext")  # on the driver, before any job
    df = spark.read.format("loglake").option("data_dir", str(tmp_path)).option("stream", "ext")
    with pytest.raises(Exception) as e:
        df.load().collect()
    assert isinstance(task_error(e.value), CorruptSegment), str(e.value)[:500]
    assert bad.name in str(task_error(e.value))


@pytest.mark.parametrize("how", DAMAGED_PAGE)
def test_a_damaged_page_with_a_whole_footer_is_corrupt_segment_naming_the_file(
    spark, tmp_path, how
):
    # the footer check on the driver passes; Spark's Parquet reader did not check the pages'
    # CRCs (parquet-mr's default): flipped data bytes were read as other rows without a word,
    # a flipped page header failed the action with a JVM trace
    d = tmp_path / "data dir"  # Spark names the file by its URI: %20 for the blank
    make_log_stream(d, "orders", partitions=1, records=120)
    files = sorted((d / "lake" / "orders" / "partition=0").glob("*.parquet"))
    assert len(files) >= 3
    bad = files[1]
    damage_lake_file(bad, how)
    df = read(spark, str(d), "orders")  # the footers are whole: no error yet
    # (a count alone reads no ``data`` page: Spark prunes the column, and it succeeds)
    for action in (df.collect, df.where("index >= 10").select("index", "data").collect):
        with pytest.raises(Exception) as e:
            action()
        err = task_error(e.value)
        assert isinstance(err, CorruptSegment), str(e.value)[:800]
        assert str(err).startswith(f"{bad}: corrupt record at byte 0: unreadable Parquet: ")
    # the Python source (pyarrow in the task): the same, from the page's CRC
    with pytest.raises(Exception) as e:
        _load_dir(spark, d, "orders").collect()
    err = task_error(e.value)
    assert isinstance(err, CorruptSegment) and str(bad) in str(err), str(e.value)[:800]
    # the other files still read, each record once
    good = read(spark, str(d), "orders", start_index=0, end_index=bad_first(bad))
    assert sorted(r["index"] for r in good.collect()) == list(range(bad_first(bad)))


def bad_first(path) -> int:
    return int(path.stem.split("-")[0])


def _load_dir(spark, d, stream):
    return spark.read.format("loglake").option("data_dir", str(d)).option("stream", stream).load()


def test_bad_input_is_a_typed_error_before_any_job(spark, tmp_path):
    with pytest.raises(BadOption, match="data_dir"):
        read(spark, str(tmp_path / "missing"), "orders")
    with pytest.raises(BadOption, match="'nope'"):
        read(spark, str(tmp_path), "nope")
    # format("loglake") checks the same options in Spark's Python planner: the message names
    # the option, inside Spark's own exception (no job runs either)
    with pytest.raises(Exception, match="stream='nope'"):
        spark.read.format("loglake").option("data_dir", str(tmp_path)).option(
            "stream", "nope"
        ).load()


def test_a_misspelt_option_fails_load_instead_of_reading_everything(spark, stream_dir):
    # start_index (for startIndex) was ignored: 600 rows instead of the 20 asked for
    d, _ = stream_dir
    with pytest.raises(Exception, match=r"start_index='290'.*did you mean startIndex"):
        _load(spark, d, start_index="290").count()
    assert _load(spark, d, startIndex="290").count() == 20


def test_plain_python_source_reports_the_bad_option(spark, tmp_path):
    with pytest.raises(Exception, match="unknown stream") as e:
        spark.read.format("loglake").option("data_dir", str(tmp_path)).option(
            "stream", "nope"
        ).option("nativeSealed", "false").load().count()
    assert "stream='nope'" in str(e.value)


@pytest.mark.parametrize("native", [True, False])
def test_fail_on_data_loss_in_a_batch_read_whose_plan_retention_overtook(spark, tmp_path, native):
    # read() plans the live tail on the driver; retention removing its head before the action
    # is LiveHistoryGone (failOnDataLoss, default true), or with false the records still held,
    # each once (Kafka's batch source takes the option too)
    from loglake.log import Entry, StreamConfig, open_log
    from loglake.pipeline.errors import LiveHistoryGone
    from loglake.pipeline.read import read_options

    with open_log(tmp_path) as log:
        log.create_stream("ev", StreamConfig(segment_bytes=2048, seal_to_lake=False))
        for i in range(20):
            log.append_many("ev", [Entry(b"r%d" % (i * 10 + j)) for j in range(10)])
    base = {"data_dir": str(tmp_path), "stream": "ev", "startIndex": "10"}
    if not native:
        base["nativeSealed"] = "false"
    strict = read_options(spark, base)
    lossy = read_options(spark, {**base, "failOnDataLoss": "false"})
    assert strict.count() == lossy.count() == 190
    with open_log(tmp_path) as log:
        log.truncate_before("ev", 120)
        first = log.stream_info("ev").partitions[0].first_index
    assert 10 < first <= 120
    got = rows_of(lossy)
    assert got == {(0, i): b"r%d" % i for i in range(first, 200)}
    # the plan (read()'s live ranges; the Python source's splits, kept by the DataFrame) was
    # made before retention ran
    with pytest.raises(Exception) as e:
        strict.collect()
    gone = task_error(e.value)
    assert isinstance(gone, LiveHistoryGone), str(e.value)[:500]
    assert f"indexes 10..{first - 1} are in neither" in str(gone)


def _head_cut_below_120(tmp_path) -> int:
    """Stream ``ev``: records 0..199 (``r<i>``) in the live log, retention then removed its
    head below 120; the first index it still holds."""
    from loglake.log import Entry, StreamConfig, open_log

    with open_log(tmp_path) as log:
        log.create_stream("ev", StreamConfig(segment_bytes=2048, seal_to_lake=False))
        for i in range(20):
            log.append_many("ev", [Entry(b"r%d" % (i * 10 + j)) for j in range(10)])
        log.truncate_before("ev", 120)
        first = log.stream_info("ev").partitions[0].first_index
    assert 10 < first <= 120
    return first


@pytest.mark.parametrize("native", [True, False])
def test_a_start_index_retention_removed_is_data_loss_as_kafkas_batch_source(
    spark, tmp_path, native, caplog
):
    # Kafka's batch source with startingOffsets below the earliest offset kept: failOnDataLoss
    # (default true) fails the query; false logs the lost offsets and reads from the earliest.
    # Before, startIndex=10 started at the first kept index in silence, whatever the option
    import logging

    from loglake.pipeline.errors import LiveHistoryGone
    from loglake.pipeline.read import read_options

    first = _head_cut_below_120(tmp_path)
    base = {"data_dir": str(tmp_path), "stream": "ev"}
    if not native:
        base["nativeSealed"] = "false"  # spark.read.format("loglake")
    kept = {(0, i): b"r%d" % i for i in range(first, 200)}
    # no startIndex is earliest (Kafka's batch default): what is kept, no error, no warning
    with caplog.at_level(logging.WARNING, logger="loglake.pipeline.datasource"):
        assert rows_of(read_options(spark, base)) == kept
        assert rows_of(read_options(spark, {**base, "startIndex": str(first)})) == kept
    assert caplog.records == []
    for strict in (
        {**base, "startIndex": "10"},
        {**base, "startIndex": "10", "failOnDataLoss": "TRUE"},
    ):
        with pytest.raises(Exception) as e:
            rows_of(read_options(spark, strict))
        gone = e.value if isinstance(e.value, LiveHistoryGone) else task_error(e.value)
        assert isinstance(gone, LiveHistoryGone), str(e.value)[:500]
        assert f"stream 'ev' partition 0: indexes 10..{first - 1} are in neither" in str(gone)
    lossy = {**base, "startIndex": "10", "failOnDataLoss": "false"}
    with caplog.at_level(logging.WARNING, logger="loglake.pipeline.datasource"):
        assert rows_of(read_options(spark, lossy)) == kept
        # an endIndex below the first kept index: all of [10, 50) is lost, nothing read
        assert rows_of(read_options(spark, {**lossy, "endIndex": "50"})) == {}
    if native:  # planned here, on the driver (the Python source plans in a Spark worker)
        got = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert [f"indexes 10..{first - 1} are in neither" in m for m in got] == [True, False]
        assert "indexes 10..49 are in neither" in got[1]
