"""Protocol jobs run unchanged against a node on JetStream: given only the node's data dir (the
sealer's note there names the cluster), a job reads the sealed lake plus the unsealed part from
JetStream, and its output equals the same job over the embedded log holding the same records.

The JetStream copy is record for record the embedded history (data, key, headers, timestamp),
half of it sealed, half only in JetStream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loglake.events.actions import ReplayJobSpec
from loglake.log import StreamConfig, open_log
from loglake.log.api import Entry
from loglake.pipeline.jobs.replay import iter_parts, run_replay_job
from loglake.streams.jetstream import JetStreamLog
from loglake.streams.jetstream_seal import JetStreamSealer
from tests.pipeline.test_job_replay import NS, N, P, history  # noqa: F401 (fixture)
from tests.pipeline.test_job_replay_cluster import DRIVER
from tests.streams.jetstream_fixtures import (
    nats_single,  # noqa: F401 (fixture)
    new_prefix,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = ReplayJobSpec(7, NS, 3, N - 5, P["pub"].bytes, "amount >= 20", (2, 1), True)


@pytest.fixture(scope="module")
def node_dir(history, nats_single, tmp_path_factory) -> Path:  # noqa: F811
    """A node's data dir on JetStream holding ``history``'s records: the first half sealed."""
    d = tmp_path_factory.mktemp("node")
    src = open_log(history, readonly=True)
    js = JetStreamLog(nats_single.url, prefix=new_prefix(), lake_dir=str(d))
    try:
        recs = src.read(NS, 0)
        assert len(recs) == N
        js.create_stream(NS, StreamConfig(partitions=1))
        entries = [Entry(r.data, r.key, r.headers, r.timestamp_ns) for r in recs]
        js.append_many(NS, entries[: N // 2], partition=0)
        JetStreamSealer(js, d).seal()
        js.append_many(NS, entries[N // 2 :], partition=0)
    finally:
        js.close()
        src.close()
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
