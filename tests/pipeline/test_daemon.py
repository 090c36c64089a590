"""Executors run loglake's Python daemon (``loglake.sparkdaemon``): workers start with the tasks'
imports done, and with pyspark from the installed package rather than Spark's ``pyspark.zip``
when that zip is the installed package's own copy."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_workers_start_with_the_log_and_the_data_source_imported_and_installed_pyspark(spark):
    def loaded(batches):  # pickled by value: importing it imports nothing of loglake
        import gc
        import sys

        import pyarrow as pa
        import pyspark

        names = ("loglake.log", "loglake.pipeline.datasource", "numpy")
        row = ",".join(n for n in names if n in sys.modules)
        # pyspark from the installed package, not from the pyspark.zip Spark puts first
        row += f"|{'.zip' in pyspark.__file__}"
        # the preloaded objects frozen before the fork: the collection after a task skips them
        row += f"|{gc.get_freeze_count() > 10_000}"
        for b in batches:
            yield pa.record_batch([pa.array([row] * b.num_rows)], names=["loaded"])

    df = spark.range(0, 4, numPartitions=2).mapInArrow(loaded, "loaded string")
    want = "loglake.log,loglake.pipeline.datasource,numpy|False|True"
    assert {r.loaded for r in df.collect()} == {want}


CANCELLED_TASKS = """
import os, sys, threading, time
from loglake.pipeline.session import build_session

marks = sys.argv[1]
spark = build_session(master="local[2]", app_name="cancelled-tasks")
sc = spark.sparkContext
sc.parallelize(range(2), 2).count()  # the workers forked before the job

def slow(i):
    open(os.path.join(marks, str(i)), "w").close()
    time.sleep(1.5)  # woken after the cancel, before Spark's kill timeout (2 s)
    return [b"x" * 1000] * 100

def job():
    try:
        sc.parallelize(range(2), 2).flatMap(slow).count()
    except Exception as e:
        print("cancelled:", type(e).__name__)

t = threading.Thread(target=job)
t.start()
deadline = time.monotonic() + 60
while len(os.listdir(marks)) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
print("running:", len(os.listdir(marks)))
sc.cancelAllJobs()
t.join()
time.sleep(2)  # the workers write into the closed sockets
spark.stop()
"""


def test_cancelled_tasks_end_without_a_traceback_per_worker(tmp_path):
    """A cancelled job's workers (Ctrl-C, a stopped query) write into sockets the JVM has
    closed: the stock daemon printed a ``BrokenPipeError`` traceback per worker on the user's
    terminal; loglake's daemon ends them quietly (``quiet_when_cut_off``)."""
    import subprocess
    import sys

    marks = tmp_path / "marks"
    marks.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", CANCELLED_TASKS, str(marks)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "running: 2" in out.stdout, out.stdout + out.stderr
    assert "cancelled:" in out.stdout, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "BrokenPipeError" not in out.stderr, out.stderr
