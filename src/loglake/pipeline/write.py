"""``write(df, data_dir, stream)``: append a DataFrame's rows to a stream, checked first.

``df.write.format("loglake")`` does the same work, but its checks run inside Spark's Python
planner worker and come back wrapped in a Spark ``AnalysisException``; this entry runs them on
the driver first so a bad option or a schema mismatch is a typed ``BadOption`` /
``SchemaMismatch`` naming the option or column, before any Spark job starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loglake.pipeline.datasource import FORMAT, check_write_schema
from loglake.pipeline.errors import BadOption
from loglake.pipeline.options import TlsFiles, parse_options, resolve_stream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def write(
    df: DataFrame,
    data_dir: str | None = None,
    stream: str | None = None,
    *,
    partition_by: str | None = None,
    url: str | None = None,
    partition_count: int | None = None,
    mode: str = "append",
    tls: TlsFiles | None = None,
) -> None:
    """Append ``df`` (columns ``data`` and optionally ``key``, ``headers``, ``timestamp_ns``,
    ``partition``) to ``stream``. ``partition_by``: ``column:NAME``, ``key`` (murmur3 of the key
    modulo the partition count) or ``round_robin``; default ``partition`` column, else key.
    ``tls``: how the ``url`` client speaks TLS, as for ``read``."""
    if mode != "append":
        raise BadOption("mode", mode, "streams are append-only; use mode append")
    raw = {
        "data_dir": data_dir,
        "stream": stream,
        "partitionBy": partition_by,
        "url": url,
        "partitionCount": partition_count,
    }
    options = {k: str(v) for k, v in raw.items() if v is not None}
    if tls is not None:
        options.update(tls.as_options())
    opts = parse_options(options)
    resolve_stream(opts)
    check_write_schema(df.schema, opts)
    df.write.format(FORMAT).options(**options).mode("append").save()
