"""What the lake holds for one stream, and how a read is split into sealed files and live ranges.

The layout is ``loglake.log.lake_schema``'s: ``<data_dir>/lake/<stream>/partition=<p>/
<first>-<last>.parquet``. Two rules are added here because compaction (``jobs/compact.py``)
needs them and every reader must apply them the same way:

* **Cover rule.** A file whose index range lies inside another file's range is *superseded*
  (compaction writes the larger file first, then removes the small ones after a grace period,
  so a reader that listed the folder in between still reads each index once). Two files whose
  ranges overlap without one containing the other break the layout: ``LakeLayoutError``.
* **Split rule.** A read of ``[lo, hi)`` of a partition = the visible lake files that overlap it
  (handed to Spark's native Parquet reader) + the sub-ranges of ``[first_index, next_index)``
  of the live log the lake does not cover (read through the Python data source), each cut into
  chunks of at most ``split_records`` so one Spark partition reads one (log partition, index
  range). Why: the Python source costs 3–6× a native scan.

Everything here is plain Python on file names and numbers (and a file's Parquet footer, for
``lake_file_rows``), so it is tested without Spark. A
lake file is the storage engine's ``loglake.log.lake.LakeFile`` (one type for both parts), with
its size and mtime filled in and an absolute ``str`` path (Spark takes strings).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from loglake.log import lake as log_lake
from loglake.log.api import CorruptStore, ascii_digits
from loglake.log.lake import LakeFile, check_lake_footer, check_lake_schema, typed_lake_errors
from loglake.log.lake_schema import (
    LAKE_DIR,
    lake_partition_dir,
    parse_lake_file_name,
)
from loglake.pipeline.errors import LakeLayoutError

DEFAULT_SPLIT_RECORDS = 1_000_000
VERIFY_PAGES = ("parquet.page.verify-checksum.enabled", "true")
"""The Spark (parquet-mr) read option that checks each page's CRC, which every lake file
carries (``log.lake.write_lake_table``: ``write_page_checksum``), as pyarrow's
``page_checksum_verification`` does for the Python readers. Off by default in parquet-mr: a few
bytes damaged inside a page whose footer was whole were read as other rows without a word
(``index``, ``data``, ``timestamp_ns``) or, in a page header, failed with a JVM trace. A read
option, not a session setting, so only loglake's own reads of the lake pay it."""
PARTITION_DIR_PREFIX = "partition="


def overlaps(f: LakeFile, lo: int, hi: int | None) -> bool:
    """``f`` holds some index of ``[lo, hi)`` (``hi`` None: no upper bound)."""
    return f.last >= lo and (hi is None or f.first < hi)


@dataclass(frozen=True, slots=True)
class IndexRange:
    """``start <= index < end`` of one log partition."""

    partition: int
    start: int
    end: int

    @property
    def records(self) -> int:
        return self.end - self.start


@dataclass
class PartitionPlan:
    partition: int
    files: list[LakeFile] = field(default_factory=list)
    live: list[IndexRange] = field(default_factory=list)


@dataclass
class ReadPlan:
    stream: str
    partitions: list[PartitionPlan]

    @property
    def files(self) -> list[LakeFile]:
        return [f for p in self.partitions for f in p.files]

    @property
    def live(self) -> list[IndexRange]:
        return [r for p in self.partitions for r in p.live]


def stream_lake_dir(data_dir: Path | str, stream: str) -> Path:
    return Path(data_dir) / LAKE_DIR / stream


def lake_streams(data_dir: Path | str) -> list[str]:
    root = Path(data_dir) / LAKE_DIR
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
    )


def lake_partitions(data_dir: Path | str, stream: str) -> list[int]:
    root = stream_lake_dir(data_dir, stream)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        num = p.name[len(PARTITION_DIR_PREFIX) :]
        if p.is_dir() and p.name.startswith(PARTITION_DIR_PREFIX) and ascii_digits(num):
            out.append(int(num))
    return sorted(out)


def all_lake_files(data_dir: Path | str, stream: str, partition: int) -> list[LakeFile]:
    """Every well-named lake file of a partition, superseded ones included, by (first, -last)."""
    folder = lake_partition_dir(data_dir, stream, partition)
    out = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for e in entries:
        rng = parse_lake_file_name(e.name)
        if rng is None or not e.is_file():
            continue
        try:
            st = e.stat()
        except FileNotFoundError:  # removed by a compaction between listing and stat
            continue
        out.append(LakeFile(rng[0], rng[1], os.path.abspath(e.path), st.st_size, st.st_mtime))
    out.sort(key=lambda f: (f.first, -f.last))
    return out


def split_covered(
    files: Iterable[LakeFile],
) -> tuple[list[LakeFile], list[tuple[LakeFile, LakeFile]]]:
    """Apply the cover rule (``loglake.log.lake.split_covered``, shared with the log so both
    read the same files): ``(visible, [(superseded, covering file), ...])``."""
    try:
        return log_lake.split_covered(files)
    except CorruptStore as e:
        raise LakeLayoutError(str(e)) from None


def visible_lake_files(data_dir: Path | str, stream: str, partition: int) -> list[LakeFile]:
    return split_covered(all_lake_files(data_dir, stream, partition))[0]


def lake_file_rows(path: str | Path) -> int:
    """Rows of the lake file at ``path``, from its footer, once it is checked to be one
    (``check_lake_schema``, ``check_lake_footer``); a truncated or non-Parquet file is
    ``CorruptSegment`` naming it, as the storage engine's own reads say, not a pyarrow or JVM
    trace."""
    with typed_lake_errors(path):
        pf = pq.ParquetFile(path)
    check_lake_schema(path, pf.schema_arrow)
    check_lake_footer(path, pf.metadata)  # its rows agree with its name
    return int(pf.metadata.num_rows)


def subtract(lo: int, hi: int, covered: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[lo, hi)`` minus the half-open ranges in ``covered`` (sorted, non-overlapping)."""
    out = []
    pos = lo
    for a, b in covered:
        if b <= pos:
            continue
        if a >= hi:
            break
        if a > pos:
            out.append((pos, min(a, hi)))
        pos = max(pos, b)
        if pos >= hi:
            break
    if pos < hi:
        out.append((pos, hi))
    return out


def chunk(partition: int, start: int, end: int, split_records: int) -> list[IndexRange]:
    step = max(1, split_records)
    return [IndexRange(partition, s, min(end, s + step)) for s in range(start, end, step)]


def plan_partition(
    partition: int,
    files: list[LakeFile],
    log_first: int | None,
    log_next: int | None,
    lo: int = 0,
    hi: int | None = None,
    split_records: int = DEFAULT_SPLIT_RECORDS,
) -> PartitionPlan:
    """Split ``[lo, hi)`` of one partition into visible lake files and uncovered live ranges.

    ``log_first``/``log_next`` are the live log's ``PartitionInfo`` (None when no log is
    readable: lake only)."""
    chosen = [f for f in files if overlaps(f, lo, hi)]
    live: list[IndexRange] = []
    if log_first is not None and log_next is not None:
        a = max(lo, log_first)
        b = log_next if hi is None else min(hi, log_next)
        if a < b:
            covered = [(f.first, f.last + 1) for f in files]
            for s, e in subtract(a, b, covered):
                live.extend(chunk(partition, s, e, split_records))
    return PartitionPlan(partition, chosen, live)
