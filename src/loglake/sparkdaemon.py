"""Spark's Python daemon for loglake's executors (``spark.python.daemon.module``).

Spark starts one Python daemon per executor and forks every Python worker from it. A worker
imports what a task needs (pyarrow, numpy, pandas, loglake's log and data source) after it is
forked, so each paid for them again: 0.8-0.9 s of CPU per worker here, measured. This daemon
imports them once, before the fork, and every worker starts with them; then it is the stock
``pyspark.daemon``.

pyspark itself: Spark puts its ``pyspark.zip`` (and py4j's) first on the executors' path, and
Python compiles a zip's modules at every start, with no bytecode cache: importing the daemon
and the worker took 0.95-1.0 s of CPU from the zip against 0.16-0.17 s from the installed
package here. When the zip is the installed pyspark's own copy (``<pyspark>/python/lib/``: the
same distribution, so the same code), this daemon takes it off ``sys.path`` before anything
imports pyspark, and the installed package (with its cached bytecode) is used. A zip from
another Spark install (a cluster's own ``SPARK_HOME``) is left first: its Python must match its
JVM. That is why this module is not in ``loglake.pipeline``: running a module imports its
package first, and ``loglake.pipeline`` imports pyspark.

Fork safety: the imports start no thread that a fork would leave half-held (numpy's OpenBLAS
pool is shut down and restarted around ``fork`` by its own handlers; pyarrow and pandas start
threads only when used); the stock daemon forks after importing pyspark the same way.
"""

from __future__ import annotations

import gc
import importlib
import importlib.machinery
import os
import sys
from collections.abc import Callable

PRELOAD = ("numpy", "pyarrow", "pandas", "loglake.log", "loglake.pipeline.datasource")
"""What loglake's tasks import: imported once here, before the workers fork."""


def installed_pyspark_lib(path: list[str]) -> str | None:
    """``<pyspark>/python/lib`` of the pyspark package installed on ``path`` (not in a zip),
    where Spark's own ``pyspark.zip`` and py4j zip of that distribution lie; None if none."""
    plain = [p for p in path if not p.endswith(".zip")]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", plain)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "python", "lib")


def own_spark_zips(path: list[str]) -> list[str]:
    """The entries of ``path`` that are zips of the installed pyspark's own ``python/lib``.

    Compared by real path: Spark names its zips under ``SPARK_HOME``, which pyspark resolves
    (``find_spark_home`` takes the package's real path), while ``path`` finds the package
    through the venv as it was named; a venv reached through a symlink (a worktree's
    ``.venv``) then names one folder two ways, and a plain comparison kept the zips."""
    lib = installed_pyspark_lib(path)
    if lib is None:
        return []
    real = os.path.realpath(lib)
    return [p for p in path if p.endswith(".zip") and os.path.realpath(os.path.dirname(p)) == real]


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


def main() -> None:
    for p in own_spark_zips(sys.path):
        sys.path.remove(p)
    preload()
    from pyspark import daemon

    # a reused worker runs gc.collect() after every task (pyspark.daemon), which walked every
    # object of the preloaded modules: 36-43 ms a task, measured. Frozen here, before the
    # forks, those objects are never walked again (and their pages are not written to, so
    # the workers share them with the daemon)
    gc.freeze()

    daemon.worker = quiet_when_cut_off(daemon.worker)
    daemon.manager()


def quiet_when_cut_off(worker: Callable[..., int]) -> Callable[..., int]:
    """``pyspark.daemon.worker`` that ends its forked worker without a word when the JVM has
    closed the task's socket: a task cancelled (a job cancelled, Ctrl-C, ``spark.stop()``, a
    streaming query stopped) whose worker then writes its result or flushes gets a broken pipe,
    and the stock daemon printed a traceback per worker (``traceback.print_exc`` in
    ``manager``) to the user's terminal for what is a normal end. The exit status is the
    stock one (1: the worker is not reused); any other failure is the stock daemon's to
    report."""

    def run(*args: object) -> int:
        try:
            return worker(*args)
        except (BrokenPipeError, ConnectionResetError):
            os._exit(1)

    return run


if __name__ == "__main__":
    main()
