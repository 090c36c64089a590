"""Fixtures started once for the whole part (session-scoped): a local SparkSession (starting
Spark costs ~10 s), a real standalone cluster (master + one worker from the installed pyspark
package, on loopback; ~20 s to start), which every cluster test shares, and one driver
application on that cluster (``cluster_driver``, in its own process) that runs every cluster
test's job.

The cluster follows FIELD-NOTES "Spark": ``spark-class org.apache.spark.deploy.master.Master`` /
``...Worker`` with ``SPARK_HOME`` = the pyspark package folder, ``SPARK_LOCAL_IP=127.0.0.1``,
``PYSPARK_PYTHON`` = this venv's python, ``SPARK_WORKER_DIR`` in a temp folder, absolute paths.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyspark
import pytest

from tests.conftest import jvm_opts


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
    except (OSError, ValueError):  # not up yet, or a page that is not the master's JSON
        return 0


def logged_port(log: Path, pattern: str, procs: list[subprocess.Popen], deadline: float) -> int:
    """The port a Spark daemon logged it bound (``pattern`` has one group, the port).

    Why the log and not ports picked beforehand: a port found free by the test can be taken
    before the JVM binds it (by anything else on the machine), and Spark then silently binds
    the next one; the fixture would then talk to someone else's server. Spark binds port 0 to
    a free port itself and logs which one it got."""
    while True:
        found = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if found:
            return int(found.group(1))
        assert time.monotonic() < deadline, f"{log.name}: {pattern!r} not logged in time"
        assert all(p.poll() is None for p in procs), "a cluster process exited: " + (
            log.read_text(errors="replace")[-2000:] if log.exists() else ""
        )
        time.sleep(0.2)


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
        # the submission REST server would take the fixed port 6066 (the tests do not submit)
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        # the master and worker only schedule: C1 only, as every test JVM (tests/conftest.py)
        "SPARK_DAEMON_JAVA_OPTS": jvm_opts(),
    }
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    procs: list[subprocess.Popen] = []
    logs = []

    def start(name, *args):
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed in the finally below)
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [spark_class, *args], env=env, stdout=log, stderr=log, start_new_session=True
            )
        )

    try:
        # every port 0: Spark binds free ones and logs them (see logged_port)
        master = ("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1")
        start("master", *master, "--port", "0", "--webui-port", "0")
        deadline = time.monotonic() + 120
        master_log = tmp / "master.log"
        port = logged_port(
            master_log, r"Starting Spark master at spark://[^:]+:(\d+)", procs, deadline
        )
        ui = logged_port(master_log, r"started service 'MasterUI' on port (\d+)", procs, deadline)
        worker = ["--host", "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", "0"]
        start(
            "worker", "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", *worker
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


class ClusterDriver:
    """The client side of ``tests/pipeline/cluster_driver.py``: ``run(script, *argv)`` runs a
    job script in the cluster application and returns the script's ``result``."""

    def __init__(self, master: str, env: dict[str, str], log_path: Path) -> None:
        from tests.pipeline.cluster_driver import MARK

        self.master, self.log_path, self._mark = master, log_path, MARK
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.pipeline.cluster_driver", master],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        self._answers: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._answer(240)
        assert ready.get("ready") == master, ready

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(self._mark):
                self._answers.put(json.loads(line[len(self._mark) :]))
        self._answers.put(None)  # the driver exited

    def _answer(self, timeout: float) -> dict:
        try:
            answer = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the cluster driver did not answer in {timeout} s") from None
        if answer is None:
            raise AssertionError(f"the cluster driver exited: {self.log_tail()}")
        return answer

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def run(self, script: str, *argv: str, timeout: float = 400) -> Any:
        """Run ``script`` (it sees ``spark``, ``master`` and ``argv``; it sets ``result``)."""
        assert self.proc.stdin is not None and self.proc.poll() is None, self.log_tail()
        self.proc.stdin.write(json.dumps({"script": script, "argv": list(argv)}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(timeout)
        assert "error" not in answer, answer["error"] + "\n" + self.log_tail()
        return answer["result"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the driver stops its session and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)
        stop(self.proc)
        self._log.close()


@pytest.fixture(scope="session")
def cluster_driver(cluster, tmp_path_factory):
    """One application on the test cluster for every cluster test (see cluster_driver.py)."""
    master, env = cluster
    driver = ClusterDriver(master, env, tmp_path_factory.mktemp("driver") / "driver.log")
    yield driver
    driver.close()
