"""The lake's table schema and layout: one place, because the log writes it and Spark, DuckDB
and pyarrow read it.

Layout (the foundation issue): ``<data_dir>/lake/<stream>/partition=<p>/<first>-<last>.parquet``
with ``first``/``last`` the inclusive index range of the file, zero-padded to 20 digits so a
plain lexicographic listing is index order. Columns are the record fields; ``headers`` is a list
of ``{key, value}`` structs because headers are ordered and may repeat.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from loglake.log.api import ascii_digits

LAKE_DIR = "lake"
INDEX_WIDTH = 20
BACKEND_NOTE = "_jetstream.json"
"""``<data_dir>/lake/_jetstream.json``: which cluster and prefix the lake's streams live in, so a
reader given only the data dir (every Spark job's ``--data-dir``) reads the unsealed part from
JetStream too (``pipeline/options.py``). Server URLs are written without user or password.
Named here, with the layout, and not beside its writer (``streams.jetstream_seal``): every
Spark process that parses a data dir option reads it, and the writer's module imports the NATS
client stack (nats, aiohttp, asyncio: ~180 modules) that a reader never needs."""

MAX_PARTITION = 2**31 - 1
"""The highest partition number a stream's sealed history holds: the lake's ``partition`` column
(and the Spark jobs' tables') is int32, so no partition past it is sealed. The ceiling of the
commands that read one partition of a data dir (``log read -p``, ``job sds-audit
--partition``), which took any integer."""

LAKE_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("timestamp_ns", pa.int64(), nullable=False),
        pa.field("key", pa.binary(), nullable=True),
        pa.field(
            "headers",
            pa.list_(
                pa.struct(
                    [
                        pa.field("key", pa.string(), nullable=False),
                        pa.field("value", pa.binary(), nullable=False),
                    ]
                )
            ),
            nullable=False,
        ),
        pa.field("data", pa.binary(), nullable=False),
    ]
)


def lake_partition_dir(data_dir: Path | str, stream: str, partition: int) -> Path:
    return Path(data_dir) / LAKE_DIR / stream / f"partition={partition}"


def lake_file_name(first: int, last: int) -> str:
    return f"{first:0{INDEX_WIDTH}d}-{last:0{INDEX_WIDTH}d}.parquet"


def parse_lake_file_name(name: str) -> tuple[int, int] | None:
    """``(first, last)`` of a lake file name, or None for anything else in the folder
    (including a name whose range is empty: no writer makes one)."""
    stem, dot, ext = name.partition(".")
    if ext != "parquet" or not dot:
        return None
    first, dash, last = stem.partition("-")
    if not dash or not ascii_digits(first) or not ascii_digits(last) or int(first) > int(last):
        return None
    return int(first), int(last)
