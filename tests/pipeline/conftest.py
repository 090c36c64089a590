"""Fixtures started once for the whole part (session-scoped): a local SparkSession (starting
Spark costs ~10 s) and a real standalone cluster (master + one worker from the installed pyspark
package, on loopback; ~20 s to start), which every cluster test shares.

The cluster follows FIELD-NOTES "Spark": ``spark-class org.apache.spark.deploy.master.Master`` /
``...Worker`` with ``SPARK_HOME`` = the pyspark package folder, ``SPARK_LOCAL_IP=127.0.0.1``,
``PYSPARK_PYTHON`` = this venv's python, ``SPARK_WORKER_DIR`` in a temp folder, absolute paths.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark
import pytest

from tests.procs import free_port, wait_port


@pytest.fixture(scope="session")
def spark():
    from loglake.pipeline.session import build_session

    session = build_session(
        master="local[2]",
        app_name="loglake-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"},
    )
    yield session
    session.stop()


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


@pytest.fixture(scope="session")
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
