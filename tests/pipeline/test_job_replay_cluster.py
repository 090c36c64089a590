"""The replay job (loglake.pipeline.jobs.replay) on the standalone cluster the pipeline tests
start (master + worker from the pyspark package, loopback; tests/pipeline/conftest.py's
fixture): its output equals the ``local[*]`` session's, part for part (issue 11 §3)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from loglake.events.actions import ReplayJobSpec
from loglake.pipeline.jobs.replay import iter_parts, run_replay_job
from tests.pipeline.test_job_replay import NS, N, P, history  # noqa: F401 (fixture)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DRIVER = textwrap.dedent(
    """
    import json, sys
    from loglake.events.actions import ReplayJobSpec
    from loglake.pipeline import build_session
    from loglake.pipeline.jobs.replay import iter_parts, run_replay_job
    master, data_dir, out, spec = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    spec["skip"] = tuple(spec["skip"]) if spec["skip"] else None
    spec["source"] = bytes.fromhex(spec["source"])
    spark = build_session(master=master, app_name="loglake-replay-cluster-test", conf={
        "spark.executor.memory": "1g", "spark.driver.memory": "1g", "spark.cores.max": "2"})
    assert spark.sparkContext.master == master
    res = run_replay_job(spark, ReplayJobSpec(**spec), out, data_dir)
    parts = [[i, a.hex(), b.hex(), c.hex()] for i, a, b, c in iter_parts(res.output)]
    print("RESULT " + json.dumps({"selected": res.selected, "parts": parts}), flush=True)
    spark.stop()
    """
)


def test_replay_job_on_the_cluster_equals_local(spark, cluster, history, tmp_path):  # noqa: F811
    master, env = cluster
    spec = ReplayJobSpec(7, NS, 3, N - 5, P["pub"].bytes, "amount >= 20", (2, 1), True)
    local = run_replay_job(spark, spec, tmp_path / "local", str(history))
    want = [[i, a.hex(), b.hex(), c.hex()] for i, a, b, c in iter_parts(local.output)]
    assert local.selected == len(want) > 100
    js = {**spec.__dict__, "source": spec.source.hex(), "skip": list(spec.skip or ())}
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, master, str(history), str(tmp_path / "cl"), json.dumps(js)],
        env=env,
        capture_output=True,
        timeout=400,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = proc.stdout.decode()
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    assert result["selected"] == local.selected
    assert result["parts"] == want
