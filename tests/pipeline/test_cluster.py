"""A real Spark standalone cluster (master + one worker from the installed pyspark package, on
loopback): the same ``read`` and ``compact`` give the same results as ``local[*]``.

Follows FIELD-NOTES "Spark": ``spark-class org.apache.spark.deploy.master.Master`` / ``...Worker``
with ``SPARK_HOME`` = the pyspark package folder, ``SPARK_LOCAL_IP=127.0.0.1``,
``PYSPARK_PYTHON`` = this venv's python, ``SPARK_WORKER_DIR`` in a temp folder, absolute paths.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pyspark
import pytest

from loglake.pipeline import read
from loglake.pipeline.jobs.compact import CompactOptions, run
from loglake.pipeline.lake import visible_lake_files
from tests.procs import free_port, wait_port

from .helpers import make_log_stream, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp / "work"),
        "SPARK_LOG_DIR": str(tmp / "logs"),
        "PYSPARK_PYTHON": sys.executable,
    }
    port, ui, worker_ui = free_port(), free_port(), free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    procs = []
    logs = []

    def start(args, name):
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed in the finally below)
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [spark_class, *args], env=env, stdout=log, stderr=log, start_new_session=True
            )
        )

    try:
        start(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            "master",
        )
        deadline = time.monotonic() + 120
        wait_port(port, timeout=120)
        start(
            [
                "org.apache.spark.deploy.worker.Worker",
                f"spark://127.0.0.1:{port}",
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                str(worker_ui),
            ],
            "worker",
        )
        while alive_workers(ui) < 1:
            assert time.monotonic() < deadline, (tmp / "worker.log").read_text()[-2000:]
            assert all(p.poll() is None for p in procs), "a cluster process exited"
            time.sleep(0.5)
        yield f"spark://127.0.0.1:{port}", env
    finally:
        for p in reversed(procs):
            stop(p)
        for log in logs:
            log.close()


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
