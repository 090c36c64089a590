"""A real Spark standalone cluster (the session fixture in ``conftest.py``: master + one worker
from the installed pyspark package, on loopback): the same ``read`` and ``compact`` give the same
results as ``local[*]``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from loglake.pipeline import read
from loglake.pipeline.jobs.compact import CompactOptions, run
from loglake.pipeline.lake import visible_lake_files

from .helpers import make_log_stream, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.slow]


DRIVER = textwrap.dedent(
    """
    import json, sys
    from loglake.pipeline import build_session, read
    from loglake.pipeline.jobs.compact import CompactOptions, run
    from loglake.pipeline.lake import visible_lake_files
    master, data_dir = sys.argv[1:3]
    spark = build_session(master=master, app_name="loglake-cluster-test", conf={
        "spark.executor.memory": "1g", "spark.driver.memory": "1g", "spark.cores.max": "2"})
    assert spark.sparkContext.master == master
    def rows():
        df = read(spark, data_dir, "cl")
        return sorted([r[0], r[1], bytes(r[2]).hex()]
                      for r in df.select("partition", "index", "data").collect())
    before = rows()
    result = run(spark, CompactOptions(data_dir, "cl", target_bytes=48 * 1024))
    files = [[f.first, f.last] for p in (0, 1) for f in visible_lake_files(data_dir, "cl", p)]
    print("RESULT " + json.dumps({"before": before, "after": rows(), "files": files,
                                  "groups": len(result.groups)}), flush=True)
    spark.stop()
    """
)


def test_cluster_read_and_compact_equal_local(spark, cluster, tmp_path):
    master, env = cluster
    src = tmp_path / "src"
    make_log_stream(src, "cl", partitions=2, records=100)
    on_cluster, local = tmp_path / "on_cluster", tmp_path / "local"
    shutil.copytree(src, on_cluster)
    shutil.copytree(src, local)

    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, master, str(on_cluster)],
        env=env,
        capture_output=True,
        timeout=400,
        start_new_session=True,
    )
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])

    def local_rows():
        return sorted(
            [p, i, d.hex()] for (p, i), d in rows_of(read(spark, str(local), "cl")).items()
        )

    assert result["groups"] > 0, "the cluster compacted nothing: nothing was compared"
    assert result["before"] == local_rows()
    run(spark, CompactOptions(str(local), "cl", target_bytes=48 * 1024))
    assert result["after"] == local_rows() == result["before"]
    files = [[f.first, f.last] for p in (0, 1) for f in visible_lake_files(local, "cl", p)]
    assert result["files"] == files
