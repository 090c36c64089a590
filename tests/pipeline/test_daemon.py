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
