"""Spark's Python daemon for loglake's executors (``spark.python.daemon.module``).

Spark starts one Python daemon per executor and forks every Python worker from it. A worker
imports what a task needs (pyarrow, numpy, pandas, loglake's log and data source) after it is
forked, so each paid for them again: 0.8-0.9 s of CPU per worker here, measured. This daemon
imports them once, before the fork, and every worker starts with them; then it is the stock
``pyspark.daemon``.

Fork safety: the imports start no thread that a fork would leave half-held (numpy's OpenBLAS
pool is shut down and restarted around ``fork`` by its own handlers; pyarrow and pandas start
threads only when used); the stock daemon forks after importing pyspark the same way.

Not done (measured, left): pyspark itself is imported from the ``pyspark.zip`` Spark puts first
on the executors' path, whose modules Python compiles at every daemon start (~0.85 s of CPU
against 0.25 s from the installed package). Reordering the path here is too late: running this
module imports ``loglake.pipeline``, which imports pyspark.
"""

from __future__ import annotations

import importlib

PRELOAD = ("numpy", "pyarrow", "pandas", "loglake.log", "loglake.pipeline.datasource")
"""What loglake's tasks import: imported once here, before the workers fork."""


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


if __name__ == "__main__":
    preload()
    from pyspark import daemon

    daemon.manager()
