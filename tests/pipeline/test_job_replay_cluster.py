"""The replay job (loglake.pipeline.jobs.replay) on the standalone cluster the pipeline tests
start (master + worker from the pyspark package, loopback, and one driver application on it;
tests/pipeline/conftest.py's fixtures): its output equals the ``local[*]`` session's, part for
part (issue 11 §3)."""

from __future__ import annotations

import json
import textwrap

import pytest

from loglake.events.actions import ReplayJobSpec
from loglake.pipeline.jobs.replay import iter_parts, run_replay_job
from tests.pipeline.test_job_replay import NS, N, P, history  # noqa: F401 (fixture)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# run by the cluster application (``cluster_driver``: ``spark`` is its session on the cluster)
DRIVER = textwrap.dedent(
    """
    import json
    from loglake.events.actions import ReplayJobSpec
    from loglake.pipeline.jobs.replay import iter_parts, run_replay_job
    data_dir, out, spec = argv[0], argv[1], json.loads(argv[2])
    spec["skip"] = tuple(spec["skip"]) if spec["skip"] else None
    spec["source"] = bytes.fromhex(spec["source"])
    assert spark.sparkContext.master == master
    res = run_replay_job(spark, ReplayJobSpec(**spec), out, data_dir)
    parts = [[i, a.hex(), b.hex(), c.hex()] for i, a, b, c in iter_parts(res.output)]
    result = {"selected": res.selected, "parts": parts}
    """
)


def test_replay_job_on_the_cluster_equals_local(spark, cluster_driver, history, tmp_path):  # noqa: F811
    spec = ReplayJobSpec(7, NS, 3, N - 5, P["pub"].bytes, "amount >= 20", (2, 1), True)
    local = run_replay_job(spark, spec, tmp_path / "local", str(history))
    want = [[i, a.hex(), b.hex(), c.hex()] for i, a, b, c in iter_parts(local.output)]
    assert local.selected == len(want) > 100
    js = {**spec.__dict__, "source": spec.source.hex(), "skip": list(spec.skip or ())}
    result = cluster_driver.run(DRIVER, str(history), str(tmp_path / "cl"), json.dumps(js))
    assert result["selected"] == local.selected
    assert result["parts"] == want
