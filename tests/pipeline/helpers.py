"""Data for the pipeline tests: lake files written with pyarrow per ``lake_schema.py``, and
streams written through the real storage engine (``loglake.log.open_log``) so they have both
sealed lake files and a live tail."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from loglake.log import Entry, StreamConfig
from loglake.log.lake_schema import LAKE_SCHEMA, lake_file_name, lake_partition_dir


def lake_table(stream: str, partition: int, first: int, last: int, seed: int = 0) -> pa.Table:
    rng = random.Random(seed * 1_000_003 + partition * 10_007 + first)
    idx = list(range(first, last + 1))
    return pa.table(
        {
            "stream": [stream] * len(idx),
            "partition": [partition] * len(idx),
            "index": idx,
            "timestamp_ns": [1_000 + i * 10 for i in idx],
            "key": [f"k{i % 7}".encode() if i % 3 else None for i in idx],
            "headers": [[{"key": "h", "value": str(i).encode()}] if i % 2 else [] for i in idx],
            "data": [rng.randbytes(24) for _ in idx],
        },
        schema=LAKE_SCHEMA,
    )


def write_lake(data_dir: Path, stream: str, partition: int, first: int, last: int) -> Path:
    folder = lake_partition_dir(data_dir, stream, partition)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / lake_file_name(first, last)
    # page checksums, as the storage engine writes lake files (log.lake.write_lake_table)
    pq.write_table(lake_table(stream, partition, first, last), path, write_page_checksum=True)
    return path


def make_log_stream(
    data_dir: Path,
    stream: str,
    partitions: int = 2,
    records: int = 300,
    batch: int = 10,
    segment_bytes: int = 4096,
    seed: int = 1,
) -> dict[tuple[int, int], bytes]:
    """Append ``records`` per partition in small batches (so segments roll and seal to the lake,
    leaving a live tail); return ``{(partition, index): data}``."""
    from loglake.log import open_log

    rng = random.Random(seed)
    expected: dict[tuple[int, int], bytes] = {}
    log = open_log(data_dir)
    try:
        log.create_stream(stream, StreamConfig(partitions=partitions, segment_bytes=segment_bytes))
        for p in range(partitions):
            for start in range(0, records, batch):
                entries = [
                    Entry(
                        rng.randbytes(100),
                        key=f"k{i}".encode(),
                        headers=(("n", str(i).encode()),),
                        timestamp_ns=10_000 + i,
                    )
                    for i in range(start, min(records, start + batch))
                ]
                for i, e in zip(
                    log.append_many(stream, entries, partition=p), entries, strict=True
                ):
                    expected[(p, i)] = e.data
    finally:
        log.close()
    return expected


def append(data_dir: Path, stream: str, partition: int, datas: list[bytes]) -> list[int]:
    from loglake.log import open_log

    log = open_log(data_dir)
    try:
        return log.append_many(stream, [Entry(d) for d in datas], partition=partition)
    finally:
        log.close()


def rows_of(df) -> dict[tuple[int, int], bytes]:
    rows = df.select("partition", "index", "data").collect()
    out = {(r["partition"], r["index"]): bytes(r["data"]) for r in rows}
    assert len(out) == len(rows), "duplicate (partition, index) rows"
    return out


DAMAGED_PAGE = ("page", "page-header")
"""``damage_lake_file``'s ways that keep the footer whole: only a read of the page finds them."""


def damage_lake_file(path: Path, how: str) -> None:
    """Make the lake file at ``path`` unreadable as one: ``truncated`` (its second half and
    footer lost, as a copy cut short leaves it), ``foreign`` (a Parquet file of another
    table under the lake's name: no ``index``, ``data``, ... columns), ``page`` (3 bytes in the
    middle of the first row group's ``data`` pages flipped, the footer whole: a bad disk
    sector or a bit rot) or ``page-header`` (the same at the start of that column chunk: its
    first page's header)."""
    if how == "truncated":
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
    elif how in DAMAGED_PAGE:
        group = pq.ParquetFile(path).metadata.row_group(0)
        chunk = next(
            group.column(i)
            for i in range(group.num_columns)
            if group.column(i).path_in_schema == "data"
        )
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        at = start + chunk.total_compressed_size // 2 if how == "page" else start
        raw = bytearray(path.read_bytes())
        for k in range(3):
            raw[at + k] ^= 0xFF
        path.write_bytes(bytes(raw))
        assert pq.ParquetFile(path).metadata.row_group(0).num_rows == group.num_rows  # footer
    else:
        pq.write_table(pa.table({"foo": list(range(10))}), path)
