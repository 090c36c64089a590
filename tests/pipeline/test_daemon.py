"""Executors run loglake's Python daemon: workers start with the tasks' imports done."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_workers_start_with_the_log_and_the_data_source_imported(spark):
    def loaded(batches):  # pickled by value: importing it imports nothing of loglake
        import sys

        import pyarrow as pa

        names = ("loglake.log", "loglake.pipeline.datasource", "numpy")
        for b in batches:
            row = ",".join(n for n in names if n in sys.modules)
            yield pa.record_batch([pa.array([row] * b.num_rows)], names=["loaded"])

    df = spark.range(0, 4, numPartitions=2).mapInArrow(loaded, "loaded string")
    assert {r.loaded for r in df.collect()} == {"loglake.log,loglake.pipeline.datasource,numpy"}


def test_the_daemon_module_preloads_without_starting_spark():
    import subprocess
    import sys

    code = (
        "import sys; from loglake.pipeline.daemon import preload; preload(); "
        "print(all(m in sys.modules for m in ('numpy', 'pyarrow', 'loglake.log')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
