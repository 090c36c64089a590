"""Ctrl-C during a Spark job (a real SIGINT to a real process, on a ``local[1]`` session):
one line ``interrupted`` and exit status 130, Spark's jobs cancelled and the session stopped.

Found from outside: every ``loglake job …`` and ``loglake demo``'s Spark step printed three
tracebacks (``RuntimeError: reentrant call inside <_io.BufferedReader>``, ``Py4JNetworkError``,
``Py4JError``: pyspark's own SIGINT handler calling the JVM from inside the interrupted call),
then ``Aborted!``, status 1 (``loglake.pipeline.session._on_sigint``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

# a command as `loglake job` runs one: under TypedErrorGroup, on build_session; it says
# "running" once Spark reports the job active (asked from a thread of its own), and the job
# would run for hours
SCRIPT = """
import threading, time
import click
from loglake.clitools import TypedErrorGroup

@click.group(cls=TypedErrorGroup)
def main():
    pass

@main.command()
def run():
    from loglake.pipeline.session import build_session
    spark = build_session(master="local[1]", app_name="sigint-test", data_source=False)
    tracker = spark.sparkContext.statusTracker()

    def say_running():
        while not tracker.getActiveStageIds():
            time.sleep(0.05)
        print("running", flush=True)

    threading.Thread(target=say_running, daemon=True).start()
    spark.range(0, 10**13, numPartitions=1).selectExpr("sum(id * id % 7)").collect()

main()
"""


def test_ctrl_c_during_a_spark_job_is_one_line_and_130(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    p = subprocess.Popen(
        [sys.executable, str(script), "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # the SIGINT goes to this process alone
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # Spark started and the job runs
        assert line == "running\n", p.communicate(timeout=60)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted", err
    for noise in ("Traceback", "Aborted", "Py4J", "ERROR", "Exception"):
        assert noise not in err, err
