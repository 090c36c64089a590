"""The ``loglake`` source over a stream kept in NATS JetStream (option ``backend``): the sealed
lake from the data dir plus the unsealed part straight from JetStream, offsets = stream
sequences − 1, exactly once while the sealer moves the boundary and across query restarts.

The cluster is a real nats-server (``tests/nats_cluster.py``); the reference every read is
compared with is the same pushes on the embedded log, read by the same source."""

from __future__ import annotations

import pytest

from loglake.log import StreamConfig, open_log
from loglake.log.api import Entry
from loglake.pipeline.errors import BadOption, LiveHistoryGone
from loglake.streams.jetstream import ClusterUnavailable, JetStreamLog
from loglake.streams.jetstream_seal import JetStreamSealer
from tests.procs import free_port
from tests.streams.jetstream_fixtures import nats_r3 as nats_r3
from tests.streams.jetstream_fixtures import nats_single as nats_single
from tests.streams.jetstream_fixtures import new_prefix

from .test_streaming import sink_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

T0 = 1_700_000_000_000_000_000


def entries(p: int, lo: int, hi: int) -> list[Entry]:
    """Records with every field set (key, headers, timestamp): what JetStream must give back."""
    return [
        Entry(
            b"p%d-%d" % (p, i),
            key=b"k%d" % (i % 3),
            headers=(("h", b"%d" % i),),
            timestamp_ns=T0 + 1000 * i + p,
        )
        for i in range(lo, hi)
    ]


def full_rows(df) -> list[tuple]:
    rows = df.collect()
    return sorted(
        (
            r["stream"],
            r["partition"],
            r["index"],
            r["timestamp_ns"],
            r["key"] and bytes(r["key"]),
            tuple((h["key"], bytes(h["value"])) for h in r["headers"] or ()),
            bytes(r["data"]),
        )
        for r in rows
    )


@pytest.fixture
def js(nats_single, tmp_path):
    log = JetStreamLog(nats_single.url, prefix=new_prefix(), lake_dir=str(tmp_path / "node"))
    (tmp_path / "node").mkdir()
    yield log
    log.close()


def embedded(tmp_path, pushes: list[tuple[int, list[Entry]]]) -> str:
    d = tmp_path / "embedded"
    log = open_log(d)
    log.create_stream("ev", StreamConfig(partitions=2))
    for p, es in pushes:
        log.append_many("ev", es, partition=p)
    log.flush()
    log.close()
    return str(d)


def source(spark, js: JetStreamLog, data_dir: str | None, **options: str):
    r = spark.read.format("loglake").option("stream", "ev").option("backend", js.options.servers[0])
    r = r.option("natsPrefix", js.options.prefix)
    if data_dir:
        r = r.option("data_dir", data_dir)
    return r.options(**options).load()


def test_batch_read_of_lake_plus_jetstream_equals_the_embedded_log(spark, js, tmp_path) -> None:
    from loglake.pipeline import read

    pushes = [(0, entries(0, 0, 30)), (1, entries(1, 0, 12))]
    js.create_stream("ev", StreamConfig(partitions=2))
    for p, es in pushes:
        js.append_many("ev", es, partition=p)
    node = tmp_path / "node"
    JetStreamSealer(js, node).seal()  # 0..29 / 0..11 sealed
    more = [(0, entries(0, 30, 45)), (1, entries(1, 12, 13))]
    for p, es in more:
        js.append_many("ev", es, partition=p)  # live only
    want = full_rows(
        spark.read.format("loglake")
        .options(data_dir=embedded(tmp_path, pushes + more), stream="ev")
        .load()
    )
    assert len(want) == 58
    assert full_rows(source(spark, js, str(node))) == want
    assert full_rows(source(spark, js, None)) == want  # no lake: all from JetStream
    assert full_rows(source(spark, js, str(node), splitRecords="7")) == want
    opts = {"backend": js.options.servers[0], "nats_prefix": js.options.prefix}
    assert full_rows(read(spark, data_dir=str(node), stream="ev", **opts)) == want
    assert full_rows(read(spark, data_dir=str(node), stream="ev", start_index=29, **opts)) == [
        r for r in want if r[2] >= 29
    ]


def test_a_range_the_sealer_copied_and_retention_dropped_is_read_from_the_lake(
    spark, js, tmp_path
) -> None:
    """The boundary moves between planning and reading: the plan saw 0..49 in JetStream, then
    the sealer copied them and retention dropped 0..39 from JetStream. Read from the lake."""
    from loglake.pipeline.datasource import RangeSplit, read_range
    from loglake.pipeline.options import parse_options

    node = tmp_path / "node"
    js.create_stream("ev", StreamConfig(partitions=1, retention_records=10))
    js.append_many("ev", entries(0, 0, 10), partition=0)
    opts = parse_options(
        {
            "stream": "ev",
            "backend": js.options.servers[0],
            "natsPrefix": js.options.prefix,
            "data_dir": str(node),
        }
    )
    # read() planned [0, 10) as live, before the sealer ran
    split = RangeSplit(0, 0, 10, live_only=True)
    JetStreamSealer(js, node).seal()
    js.append_many("ev", entries(0, 10, 15), partition=0)  # retention drops 0..4 from JetStream
    got = [i for b in read_range(opts, split) for i in b.column("index").to_pylist()]
    assert got == list(range(10))
    # not sealed and dropped: a typed error, never a silent gap
    js.append_many("ev", entries(0, 15, 30), partition=0)  # JetStream now holds 20..29; lake 0..9
    with pytest.raises(LiveHistoryGone, match=r"10\.\.19"):
        list(read_range(opts, RangeSplit(0, 10, 30)))


def test_streaming_reads_each_record_once_across_seals_and_restarts(spark, js, tmp_path) -> None:
    node, out, cp = tmp_path / "node", tmp_path / "out", tmp_path / "cp"
    js.create_stream("ev", StreamConfig(partitions=2, retention_records=25))
    sealer = JetStreamSealer(js, node)
    want: list[tuple[int, int, bytes]] = []
    nxt = {0: 0, 1: 0}

    def push(p: int, n: int) -> None:
        es = entries(p, nxt[p], nxt[p] + n)
        js.append_many("ev", es, partition=p)
        want.extend((p, nxt[p] + k, e.data) for k, e in enumerate(es))
        nxt[p] += n

    def run() -> None:
        r = spark.readStream.format("loglake").options(
            stream="ev",
            backend=js.options.servers[0],
            natsPrefix=js.options.prefix,
            data_dir=str(node),
            maxRecordsPerTrigger="9",
        )
        q = (
            r.load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(cp))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        assert q.exception() is None

    push(0, 20)
    push(1, 5)
    run()  # all from JetStream
    push(0, 20)  # 0..14 of partition 0 dropped by retention before any seal (the query has them)
    sealer.seal()  # logs 0..14 lost, seals 15..39; partition 1: 0..4
    push(1, 20)
    sealer.seal()  # partition 1: 5..24
    push(1, 10)  # partition 1: 0..9 dropped from JetStream: 5..9 only in the lake now
    push(0, 10)
    run()
    sealer.seal()
    push(1, 3)
    run()
    assert sink_rows(spark, out) == sorted(want)


def test_unreachable_cluster_is_a_typed_error(spark, tmp_path) -> None:
    """Checked on the driver, before any Spark job: ``read`` raises it as it is (the same check
    inside ``format("loglake").load()`` reaches the caller wrapped by Spark)."""
    from loglake.pipeline import read

    with pytest.raises(ClusterUnavailable, match="NATS JetStream unavailable"):
        read(spark, stream="ev", backend=f"nats://127.0.0.1:{free_port()}")


@pytest.mark.parametrize(
    "options, option",
    [
        ({"backend": "http://127.0.0.1:4222"}, "backend"),
        ({"backend": ","}, "backend"),
        ({"backend": "nats://127.0.0.1:1", "url": "loglake://127.0.0.1:1"}, "backend"),
        ({"backend": "nats://127.0.0.1:1", "natsPrefix": "a-b"}, "natsPrefix"),
        ({"backend": "nats://127.0.0.1:1", "natsCreds": "/nonexistent.creds"}, "natsCreds"),
        ({"natsPrefix": "x", "data_dir": "."}, "natsPrefix"),
    ],
)
def test_bad_backend_options_name_the_option(options, option) -> None:
    from loglake.pipeline.options import parse_options

    with pytest.raises(BadOption) as e:
        parse_options({"stream": "ev", **options})
    assert e.value.option == option


def test_a_node_data_dir_names_its_cluster_for_readers(js, tmp_path) -> None:
    """The sealer's note: a reader given only the node's data dir reads JetStream too; a note
    that cannot be read is a ``BadOption`` on ``data_dir``, not a silent lake-only read."""
    from loglake.pipeline.options import parse_options

    node = tmp_path / "node"
    js.create_stream("ev", StreamConfig(partitions=1))
    JetStreamSealer(js, node).seal()
    opts = parse_options({"stream": "ev", "data_dir": str(node)})
    assert (opts.backend, opts.nats_prefix) == (js.options.servers[0], js.options.prefix)
    assert parse_options({"stream": "ev", "data_dir": str(tmp_path)}).backend is None
    (node / "lake" / "_jetstream.json").write_text("{not json")
    with pytest.raises(BadOption) as e:
        parse_options({"stream": "ev", "data_dir": str(node)})
    assert e.value.option == "data_dir"
