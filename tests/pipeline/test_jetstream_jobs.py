"""Protocol jobs run unchanged against a node on JetStream: given only the node's data dir (the
sealer's note there names the cluster), a job reads the sealed lake plus the unsealed part from
JetStream, and its output equals the same job over the embedded log holding the same records:
``replay`` and ``cardinal-blocks`` through the ``loglake`` source, ``archives-build`` and
``sds-audit`` through ``pipeline/units.py`` (live ranges planned from JetStream's bounds and read
from JetStream by the tasks).

The JetStream copy is record for record the embedded history (data, key, headers, timestamp),
half of each partition sealed, half only in JetStream (``to_jetstream``); a job that read only the
lake would see half the records. One JetStream server and one Spark session for the module
(session fixtures), small inputs: each job's cost here is Spark's per-stage overhead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loglake.archives import get_layout
from loglake.events.actions import ReplayJobSpec
from loglake.log import StreamConfig, open_log
from loglake.log.api import Entry
from loglake.pipeline.jobs.cardinal_blocks import BATCHES, TABLES
from loglake.pipeline.jobs.replay import iter_parts, run_replay_job
from loglake.pipeline.jobs.sds_audit import SdsAuditOptions
from loglake.pipeline.jobs.sds_audit import run as sds_run
from loglake.streams.jetstream import JetStreamLog
from loglake.streams.jetstream_seal import JetStreamSealer
from tests.archives.helpers import DAY, START, WEEK
from tests.pipeline.test_job_archives_build import assert_same, write_weeks
from tests.pipeline.test_job_archives_build import job as archives_job
from tests.pipeline.test_job_cardinal import make_input
from tests.pipeline.test_job_cardinal import options as cardinal_options
from tests.pipeline.test_job_replay import NS, N, P, history  # noqa: F401 (fixture)
from tests.pipeline.test_job_replay_cluster import DRIVER
from tests.pipeline.test_job_sds_audit import STREAM, simulated
from tests.pipeline.test_job_sds_audit_cluster import CLUSTER_CFG, rows_of
from tests.pipeline.test_job_sds_audit_cluster import DRIVER as SDS_DRIVER
from tests.streams.jetstream_fixtures import (
    nats_single,  # noqa: F401 (fixture)
    new_prefix,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = ReplayJobSpec(7, NS, 3, N - 5, P["pub"].bytes, "amount >= 20", (2, 1), True)


def to_jetstream(src: Path, node: Path, url: str, streams: list[str] | None = None) -> None:
    """Every stream of the embedded data dir ``src`` (or ``streams``), record for record, into
    JetStream under a fresh prefix, with ``node`` as the node's data dir: the first half of each
    partition sealed into ``node``'s lake (and the sealer's note naming the cluster), the rest
    only in JetStream."""
    log = open_log(src, readonly=True)
    js = JetStreamLog(url, prefix=new_prefix(), lake_dir=str(node))
    try:
        rest = []
        for name in streams if streams is not None else log.streams():
            info = log.stream_info(name)
            js.create_stream(name, StreamConfig(partitions=len(info.partitions)))
            for p in info.partitions:
                recs = log.read(name, 0, partition=p.partition)
                assert p.first_index == 0 and len(recs) == p.next_index
                entries = [Entry(r.data, r.key, r.headers, r.timestamp_ns) for r in recs]
                half = len(entries) // 2
                if half:
                    js.append_many(name, entries[:half], partition=p.partition)
                rest.append((name, p.partition, entries[half:]))
        JetStreamSealer(js, node).seal()
        for name, partition, entries in rest:
            if entries:
                js.append_many(name, entries, partition=partition)
    finally:
        js.close()
        log.close()


def lake_records(node: Path) -> int:
    """Records the node's lake holds (what a job that missed JetStream would see)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in (node / "lake").rglob("*.parquet"))


@pytest.fixture(scope="module")
def node_dir(history, nats_single, tmp_path_factory) -> Path:  # noqa: F811
    """A node's data dir on JetStream holding ``history``'s records: the first half sealed."""
    d = tmp_path_factory.mktemp("node")
    to_jetstream(history, d, nats_single.url, [NS])
    assert 0 < lake_records(d) < N
    return d


def parts(output: str) -> list[list]:
    return [[i, a.hex(), b.hex(), c.hex()] for i, a, b, c in iter_parts(output)]


def test_replay_job_on_jetstream_equals_the_embedded_log(spark, history, node_dir, tmp_path):  # noqa: F811
    local = run_replay_job(spark, SPEC, tmp_path / "embedded", str(history))
    want = parts(local.output)
    assert local.selected == len(want) > 100
    on_js = run_replay_job(spark, SPEC, tmp_path / "jetstream", str(node_dir))
    assert on_js.selected == local.selected
    assert parts(on_js.output) == want


def test_replay_job_over_jetstream_on_the_standalone_cluster(
    spark,
    cluster_driver,
    history,  # noqa: F811
    node_dir,
    tmp_path,
):
    local = run_replay_job(spark, SPEC, tmp_path / "embedded", str(history))
    js = {**SPEC.__dict__, "source": SPEC.source.hex(), "skip": list(SPEC.skip or ())}
    result = cluster_driver.run(DRIVER, str(node_dir), str(tmp_path / "cl"), json.dumps(js))
    assert result["selected"] == local.selected
    assert result["parts"] == parts(local.output)


# -- archives-build (units) ---------------------------------------------------------------------


ARCHIVES_NOW = START + 3 * WEEK + DAY


@pytest.fixture(scope="module")
def archives_dirs(nats_single, tmp_path_factory) -> tuple[Path, Path]:  # noqa: F811
    """A community stream of three weeks on the embedded log, and the same records on a node
    on JetStream (half sealed)."""
    src, node = tmp_path_factory.mktemp("archives_src"), tmp_path_factory.mktemp("archives_node")
    write_weeks(src, "c", get_layout("status-go"), range(0, 3))
    to_jetstream(src, node, nats_single.url)
    assert 0 < lake_records(node) < 3 * 40
    return src, node


def test_archives_build_on_jetstream_equals_the_embedded_log(spark, archives_dirs, tmp_path):
    src, node = archives_dirs
    local = archives_job(spark, src, tmp_path / "embedded", "status-go", ARCHIVES_NOW)
    on_js = archives_job(spark, node, tmp_path / "jetstream", "status-go", ARCHIVES_NOW)
    assert local.communities[0].records == on_js.communities[0].records == 3 * 40
    assert local.new_archives == on_js.new_archives >= 3
    assert_same(tmp_path / "jetstream", tmp_path / "embedded")  # data, index, torrent: bytes


# -- sds-audit (units) ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sds_dirs(nats_single, tmp_path_factory) -> tuple[Path, Path]:  # noqa: F811
    """A simulated SDS channel (and one record that is not an SdsMessage, for ``rejects``) on
    the embedded log, and the same records on a node on JetStream (half sealed)."""
    src, node = tmp_path_factory.mktemp("sds_src"), tmp_path_factory.mktemp("sds_node")
    simulated(src, CLUSTER_CFG)
    with open_log(src) as log:
        log.append_many(STREAM, [Entry(b"\x08\xff not an SdsMessage")])
    to_jetstream(src, node, nats_single.url)
    return src, node


def audit_summary(spark, data_dir: Path, out: Path) -> dict:
    summary = sds_run(spark, SdsAuditOptions(str(data_dir), STREAM, str(out)).validate())
    return untimed(summary.as_dict())


def untimed(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("seconds", "stage_seconds")}


@pytest.fixture(scope="module")
def sds_embedded(spark, sds_dirs, tmp_path_factory) -> tuple[dict, dict]:
    """The audit of the embedded copy (summary, table rows): what both runs on JetStream must
    equal, made once for the module (an audit is ~20 Spark stages)."""
    src, node = sds_dirs
    out = tmp_path_factory.mktemp("sds_embedded")
    summary = audit_summary(spark, src, out)
    assert summary["rejects"] == 1 and summary["acks"] > 0
    assert summary["records"] > lake_records(node)
    return summary, rows_of(spark, out)


def test_sds_audit_on_jetstream_equals_the_embedded_log(spark, sds_dirs, sds_embedded, tmp_path):
    summary, rows = sds_embedded
    assert audit_summary(spark, sds_dirs[1], tmp_path / "jetstream") == summary
    assert rows_of(spark, tmp_path / "jetstream") == rows


@pytest.mark.timeout(1800)  # the cluster and its driver start within the test on a cold run
def test_sds_audit_over_jetstream_on_the_standalone_cluster(
    spark, cluster_driver, sds_dirs, sds_embedded, tmp_path
):
    summary, rows = sds_embedded
    on_cluster = cluster_driver.run(
        SDS_DRIVER, str(sds_dirs[1]), str(tmp_path / "cl"), timeout=1500
    )
    assert untimed(on_cluster) == summary
    assert rows_of(spark, tmp_path / "cl") == rows


# -- cardinal-blocks (the loglake source, streaming) ---------------------------------------------


@pytest.fixture(scope="module")
def cardinal_dirs(nats_single, tmp_path_factory) -> tuple[Path, Path]:  # noqa: F811
    """A Cardinal application's topics (3 partitions each, a reorg channel, planted bad records)
    on the embedded log, and the same records on a node on JetStream (half sealed)."""
    src, node = tmp_path_factory.mktemp("cardinal_src"), tmp_path_factory.mktemp("cardinal_node")
    make_input(src, producers=1)
    to_jetstream(src, node, nats_single.url)
    return src, node


def output_files(out: Path) -> dict[str, bytes]:
    """Every file of the job's tables and batch markers, by path (the checkpoint, the pickled
    ordering state and ``_job.json``, which names the data dir, aside: bookkeeping, not output)."""
    return {
        str(f.relative_to(out)): f.read_bytes()
        for f in sorted(out.rglob("*"))
        if f.is_file() and str(f.relative_to(out)).startswith((*TABLES, BATCHES))
    }


def test_cardinal_blocks_on_jetstream_equals_the_embedded_log(spark, cardinal_dirs, tmp_path):
    from loglake.pipeline.jobs.cardinal_blocks import run as cardinal_run

    src, node = cardinal_dirs
    local = cardinal_run(
        spark, cardinal_options(src, tmp_path / "embedded", max_records_per_trigger=60)
    )
    on_js = cardinal_run(
        spark, cardinal_options(node, tmp_path / "jetstream", max_records_per_trigger=60)
    )
    assert local.batches > 3 and local.blocks > 0 and local.rejects > 0
    assert (on_js.batches, on_js.blocks, on_js.rejects) == (
        local.batches,
        local.blocks,
        local.rejects,
    )
    want = output_files(tmp_path / "embedded")
    assert any(name.startswith("blocks") for name in want)
    assert output_files(tmp_path / "jetstream") == want


# -- units on JetStream: the boundary moving, a gap, names (no Spark) ---------------------------


def test_units_read_a_range_retention_dropped_from_the_lake_and_fail_on_a_gap(
    nats_single,  # noqa: F811
    tmp_path,
):
    """A live unit planned before the sealer ran, read after retention dropped its head: read
    from the lake. Records in neither (dropped before sealing) fail with ``LiveHistoryGone``
    naming them: the plan does not step over them."""
    from loglake.pipeline.errors import LiveHistoryGone
    from loglake.pipeline.units import plan_units, read_unit_columns
    from loglake.streams.jetstream_seal import write_backend_note

    node = tmp_path / "node"
    js = JetStreamLog(nats_single.url, prefix=new_prefix(), lake_dir=str(node))
    try:
        js.create_stream("ev", StreamConfig(partitions=1, retention_records=10))
        js.append_many("ev", [Entry(b"r%d" % i, timestamp_ns=i + 1) for i in range(10)])
        write_backend_note(node, js)  # what the node's sealer writes on its first round
        (unit,) = plan_units(str(node), {0: "ev"})[0]
        assert (unit.path, unit.start, unit.end) == ("", 0, 10) and unit.cluster is not None
        JetStreamSealer(js, node).seal()  # 0..9 into the lake
        js.append_many("ev", [Entry(b"r%d" % i, timestamp_ns=i + 1) for i in range(10, 15)])
        assert js.stream_info("ev").partitions[0].first_index == 5  # JetStream dropped 0..4
        got = list(read_unit_columns(str(node), unit, ("index", "data")))
        assert [i for b in got for i in b.column("index").to_pylist()] == list(range(10))
        assert [d for b in got for d in b.column("data").to_pylist()] == [
            b"r%d" % i for i in range(10)
        ]
        # in the batch size the job asks for, whatever size the reads answered in
        sizes = [b.num_rows for b in read_unit_columns(str(node), unit, batch_rows=4)]
        assert sizes == [4, 4, 2]

        js.append_many("ev", [Entry(b"r%d" % i, timestamp_ns=i + 1) for i in range(15, 30)])
        units = plan_units(str(node), {0: "ev"})[0]  # lake 0..9, JetStream 20..29
        assert [(u.start, u.end) for u in units] == [(0, 10), (10, 30)]
        with pytest.raises(LiveHistoryGone, match=r"10\.\.19"):
            for u in units:
                list(read_unit_columns(str(node), u))
    finally:
        js.close()


def test_archives_build_finds_a_stream_only_jetstream_holds(nats_single, tmp_path):  # noqa: F811
    """``--streams PATTERN`` on a node on JetStream matches a stream the sealer has not reached."""
    from loglake.pipeline.jobs.archives_build import match_streams

    node = tmp_path / "node"
    js = JetStreamLog(nats_single.url, prefix=new_prefix(), lake_dir=str(node))
    try:
        js.create_stream("sealed", StreamConfig(partitions=1))
        js.append_many("sealed", [Entry(b"x")])
        JetStreamSealer(js, node).seal()
        js.create_stream("community.new", StreamConfig(partitions=1))
        js.append_many("community.new", [Entry(b"y")])
    finally:
        js.close()
    assert match_streams(str(node), "community.*") == ["community.new"]
    assert match_streams(str(node), "*") == ["community.new", "sealed"]


@pytest.mark.parametrize(
    "note", ["{not json", '{"prefix": "loglake"}', '{"servers": 3, "prefix": "p"}', "[]"]
)
def test_units_refuse_a_malformed_cluster_note_naming_the_data_dir(tmp_path, note):
    """A data dir whose ``lake/_jetstream.json`` is damaged: ``BadOption`` naming the data dir
    and the file, before any task — not a lake-only plan that would miss the live part."""
    from loglake.pipeline.errors import BadOption
    from loglake.pipeline.units import plan_units, stream_names

    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / "_jetstream.json").write_text(note)
    for call in (lambda: plan_units(str(tmp_path), {0: "c"}), lambda: stream_names(str(tmp_path))):
        with pytest.raises(BadOption, match=r"data_dir.*unreadable _jetstream\.json"):
            call()


def test_a_job_over_records_retention_dropped_fails_with_the_typed_error(
    spark,
    nats_single,  # noqa: F811
    tmp_path,
):
    """Records JetStream dropped before the sealer copied them are found missing by a task (a
    live unit read in an executor): the job fails with ``LiveHistoryGone`` naming the range,
    as if the driver had read it, not with Spark's wrapper around the executor's traceback."""
    from loglake.pipeline.errors import LiveHistoryGone

    node = tmp_path / "node"
    js = JetStreamLog(nats_single.url, prefix=new_prefix(), lake_dir=str(node))
    try:
        js.create_stream(STREAM, StreamConfig(partitions=1, retention_records=10))
        js.append_many(STREAM, [Entry(b"r%d" % i, timestamp_ns=i + 1) for i in range(10)])
        JetStreamSealer(js, node).seal()  # 0..9 into the lake
        js.append_many(STREAM, [Entry(b"r%d" % i, timestamp_ns=i + 1) for i in range(10, 30)])
        with pytest.raises(LiveHistoryGone, match=r"indexes 10\.\.19 are in neither") as info:
            sds_run(spark, SdsAuditOptions(str(node), STREAM, str(tmp_path / "out")).validate())
        assert type(info.value.__cause__).__module__.startswith(("py4j", "pyspark"))
        assert not (tmp_path / "out").exists()  # nothing half-written
    finally:
        js.close()
