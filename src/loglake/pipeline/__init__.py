"""loglake.pipeline — Spark through PySpark: the lake as tables, the ``loglake`` data source, jobs.

``build_session()`` starts Spark (``local[*]`` or ``--spark-master``/``LOGLAKE_SPARK_MASTER``) with
the source registered; ``read(spark, data_dir, stream)`` returns a stream as one DataFrame; jobs
live in ``loglake.pipeline.jobs`` and run with ``loglake job NAME``. PySpark is imported lazily so
``import loglake.pipeline`` stays cheap for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["build_session", "read", "register", "write"]


def build_session(*args: Any, **kwargs: Any) -> SparkSession:
    from loglake.pipeline.session import build_session as _build

    return _build(*args, **kwargs)


def register(spark: SparkSession) -> None:
    """Register the ``loglake`` format and route its batch loads through ``read``."""
    from loglake.pipeline.datasource import register as _register
    from loglake.pipeline.read import install_reader_hook

    _register(spark)
    install_reader_hook()


def read(spark: SparkSession, *args: Any, **kwargs: Any) -> DataFrame:
    from loglake.pipeline.read import read as _read

    return _read(spark, *args, **kwargs)


def write(df: DataFrame, *args: Any, **kwargs: Any) -> None:
    from loglake.pipeline.write import write as _write

    _write(df, *args, **kwargs)
