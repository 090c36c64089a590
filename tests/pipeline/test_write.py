"""``df.write.format("loglake")`` and ``write()``: appends, partitioning, bad input."""

from __future__ import annotations

from pathlib import Path

import mmh3
import pytest

from loglake.pipeline import read, write
from loglake.pipeline.datasource import remove_stale_staging, staging_root
from loglake.pipeline.errors import BadOption, SchemaMismatch

from .helpers import make_log_stream

pytestmark = pytest.mark.spark


@pytest.fixture
def target(tmp_path):
    make_log_stream(tmp_path, "out", partitions=3, records=20)
    return tmp_path


def next_indexes(d: Path, stream: str = "out") -> list[int]:
    from loglake.log import open_log

    log = open_log(d, readonly=True)
    try:
        return [p.next_index for p in log.stream_info(stream).partitions]
    finally:
        log.close()


def test_write_appends_by_partition_column(spark, target):
    df = spark.createDataFrame([(b"a", 0), (b"b", 2), (b"c", 2)], "data binary, partition int")
    write(df, str(target), "out")
    assert next_indexes(target) == [21, 20, 22]
    got = read(spark, str(target), "out", start_index=20).collect()
    assert sorted((r["partition"], r["index"], bytes(r["data"])) for r in got) == [
        (0, 20, b"a"),
        (2, 20, b"b"),
        (2, 21, b"c"),
    ] or sorted((r["partition"], r["index"], bytes(r["data"])) for r in got) == [
        (0, 20, b"a"),
        (2, 20, b"c"),
        (2, 21, b"b"),
    ]


def test_format_write_partitions_by_key_hash_and_keeps_fields(spark, target):
    rows = [(f"v{i}".encode(), f"key-{i}".encode(), 123 + i) for i in range(12)]
    df = spark.createDataFrame(rows, "data binary, key binary, timestamp_ns long")
    df.write.format("loglake").option("data_dir", str(target)).option("stream", "out").option(
        "partitionBy", "key"
    ).mode("append").save()
    got = read(spark, str(target), "out", start_index=20).collect()
    assert len(got) == 12
    for r in got:
        i = int(bytes(r["data"])[1:])
        assert r["partition"] == mmh3.hash(f"key-{i}".encode(), signed=False) % 3
        assert bytes(r["key"]) == f"key-{i}".encode() and r["timestamp_ns"] == 123 + i


def test_round_trip_copies_a_stream_with_headers(spark, target, tmp_path_factory):
    src = read(spark, str(target), "out").where("index < 5")
    write(src.select("data", "key", "headers", "partition"), str(target), "out")
    copied = read(spark, str(target), "out", start_index=20).collect()
    assert len(copied) == 15
    assert all([h["key"] for h in r["headers"]] == ["n"] for r in copied)


def test_schema_mismatch_is_typed_and_names_the_column(spark, target):
    df = spark.createDataFrame([(b"x", "oops")], "data binary, colour string")
    with pytest.raises(SchemaMismatch, match="'colour'"):
        write(df, str(target), "out")
    bad_type = spark.createDataFrame([(1,)], "data int")
    with pytest.raises(SchemaMismatch, match="'data' is int"):
        write(bad_type, str(target), "out")
    no_data = spark.createDataFrame([(b"k",)], "key binary")
    with pytest.raises(SchemaMismatch, match="no 'data' column"):
        write(no_data, str(target), "out")
    assert next_indexes(target) == [20, 20, 20]


def test_format_write_reports_schema_mismatch(spark, target):
    df = spark.createDataFrame([(b"x", "oops")], "data binary, colour string")
    with pytest.raises(Exception, match="colour"):
        df.write.format("loglake").option("data_dir", str(target)).option("stream", "out").mode(
            "append"
        ).save()
    assert next_indexes(target) == [20, 20, 20]


def test_failed_write_leaves_the_stream_unchanged(spark, target):
    # Partition 7 does not exist: the task holding it fails after others staged their rows.
    df = spark.createDataFrame(
        [(b"ok", 0), (b"ok", 1), (b"bad", 7)], "data binary, partition int"
    ).repartition(3)
    with pytest.raises(Exception, match="partition 7 out of range"):
        write(df, str(target), "out")
    assert next_indexes(target) == [20, 20, 20]
    # Staging of a task still running at abort time may land after the abort's clean-up;
    # it is never appended, and the next write removes it once stale.
    remove_stale_staging(str(target), older_than=0)
    root = staging_root(str(target))
    assert not root.exists() or not any(root.iterdir())
    write(spark.createDataFrame([(b"ok", 1)], "data binary, partition int"), str(target), "out")
    assert next_indexes(target) == [20, 21, 20]


def test_a_partition_value_past_int32_is_out_of_range_not_an_overflow(spark, target):
    # a bigint partition column holding 2^40 failed the task with pyarrow's cast overflow
    from loglake.errors import task_error

    df = spark.createDataFrame([(b"x", 2**40)], "data binary, partition bigint")
    with pytest.raises(Exception) as e:
        write(df, str(target), "out")
    assert isinstance(task_error(e.value), BadOption), str(e.value)[:500]
    assert f"partition {2**40} out of range 0..2" in str(task_error(e.value))
    assert next_indexes(target) == [20, 20, 20]


@pytest.mark.parametrize(
    ("rows", "schema", "named"),
    [
        ([(None,)], "data binary", "null in data"),
        ([(b"a", [(None, b"v")])], "data binary, headers array<struct<key:string,value:binary>>",
         "null in headers.key"),
        ([(b"a", [("k", None)])], "data binary, headers array<struct<key:string,value:binary>>",
         "null in headers.value"),
    ],
)  # fmt: skip
def test_a_null_data_or_header_is_schema_mismatch_not_a_cast_error(
    spark, target, rows, schema, named
):
    # the staged cast failed the task with pyarrow's "column ... is not nullable" instead
    from loglake.errors import task_error

    with pytest.raises(Exception) as e:
        write(spark.createDataFrame(rows, schema), str(target), "out")
    assert isinstance(task_error(e.value), SchemaMismatch), str(e.value)[:500]
    assert named in str(task_error(e.value))
    assert next_indexes(target) == [20, 20, 20]


def test_bad_write_options(spark, target, tmp_path):
    df = spark.createDataFrame([(b"x",)], "data binary")
    with pytest.raises(BadOption, match="stream"):
        write(df, str(target), "nope")
    with pytest.raises(BadOption, match="data_dir"):
        write(df, str(tmp_path / "missing"), "out")
    with pytest.raises(BadOption, match="mode"):
        write(df, str(target), "out", mode="overwrite")
    with pytest.raises(BadOption, match="partitionBy"):
        write(df, str(target), "out", partition_by="column:shard")
