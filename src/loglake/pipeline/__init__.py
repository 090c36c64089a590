"""loglake.pipeline — Spark through PySpark: the lake as tables, the ``loglake`` data source, jobs.

``build_session()`` starts Spark (``local[*]`` or ``--spark-master``/``LOGLAKE_SPARK_MASTER``) with
the source registered; ``read(spark, data_dir, stream)`` returns a stream as one DataFrame;
``write(df, data_dir, stream)`` appends to one (``url=`` with ``tls=TlsFiles(...)`` reaches a
stream service over TLS); jobs live in ``loglake.pipeline.jobs`` and run with
``loglake job NAME``.

``read`` and ``write`` are imported eagerly (this costs the PySpark import, ~0.3 s): the
submodules share their names, and a lazy wrapper would be replaced by the submodule the first
time anything imported ``loglake.pipeline.read``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loglake.pipeline.options import TlsFiles
from loglake.pipeline.read import read
from loglake.pipeline.session import build_session
from loglake.pipeline.write import write

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["TlsFiles", "build_session", "read", "register", "write"]


def register(spark: SparkSession) -> None:
    """Register the ``loglake`` format on ``spark`` (nothing else in Spark is changed:
    ``read(...)`` is the fast path that sends sealed history to the native Parquet reader)."""
    from loglake.pipeline.datasource import register as _register

    _register(spark)
