"""A Spark job started, followed and finished through the node's API (``[jobs] enabled``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loglake.node.config import load_config
from loglake.node.runner import BackgroundNode
from loglake.streams import StreamClient
from tests.pipeline.conftest import spark as spark  # the session fixture, here too
from tests.waiting import wait_until


@pytest.mark.slow
@pytest.mark.spark
def test_compact_job_runs_with_progress_and_result(tmp_path: Path) -> None:
    cfg = load_config(
        data={
            "data_dir": str(tmp_path),
            "console": False,
            "http": {"port": 0},
            "streams": {"port": 0, "segment_bytes": 4096},
            "jobs": {"enabled": True},
        },
        env={},
    )
    with BackgroundNode(cfg) as node:
        api = httpx.Client(
            base_url=node.url, headers={"Authorization": f"Bearer {node.token}"}, timeout=60
        )
        addr = node.context.stream_address
        assert addr is not None
        with StreamClient(port=addr[1]) as c:
            c.create_stream("hist", 1)
            for _ in range(20):  # one batch is written whole into one segment: 20 batches
                c.push_many("hist", [b"x" * 200] * 100)  # roll 20 segments of 4 KB or more
        node.context.log.wait_for_seals()
        bad = api.post("/api/jobs", json={"name": "compact", "stream": "nope"})
        assert bad.status_code == 404 and bad.json()["error"] == "UnknownStream"
        job = api.post("/api/jobs", json={"name": "compact", "stream": "hist"}).json()
        assert job["state"] in ("queued", "running")
        seen: list[dict] = []

        def done() -> dict | None:
            j = api.get(f"/api/jobs/{job['id']}").json()
            seen.append(j["progress"])
            return j if j["state"] in ("succeeded", "failed") else None

        final = wait_until(done, timeout=240, interval=0.5, what="the compact job")
        assert final["state"] == "succeeded", final["error"]
        assert final["result"]["files_before"] > final["result"]["files_after"] == 1
        assert final["progress"]["fraction"] == 1.0
        assert final["progress"]["steps"]["commit"] == {"done": 1, "total": 1}
        assert [j["id"] for j in api.get("/api/jobs").json()] == [job["id"]]
        with StreamClient(port=addr[1]) as c:  # the compacted history still reads back whole
            assert len(c.pull("hist", 0, 5000)) == 2000


@pytest.mark.spark
def test_the_node_leaves_a_spark_session_it_did_not_start_running(spark, tmp_path: Path) -> None:
    """An application that embeds a node keeps its own session when the node closes (the
    node's job manager reuses the process's SparkContext; stopping it broke every later query
    of its owner)."""
    from loglake.node.api.jobs import JobManager

    jobs = JobManager(ctx=None)  # type: ignore[arg-type]  # the session needs no context
    assert jobs._session().sparkContext is spark.sparkContext
    jobs.close()
    assert spark.range(3).count() == 3
