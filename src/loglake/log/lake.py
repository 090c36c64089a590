"""Sealed history as Parquet: write a rolled segment as one lake file, read index ranges back.

Why: DESIGN.md "Sealed history is kept as Parquet, so history *is* a lake table". Files follow
``lake_schema.py`` (layout ``lake/<stream>/partition=<p>/<first>-<last>.parquet``, ``LAKE_SCHEMA``)
and are written with pyarrow to a temporary name in the same folder, fsynced, then renamed, so a
reader (Spark, DuckDB, pyarrow) never sees a half-written file: a name that parses as a lake file
is always a whole one. Temporary files start with ``.`` so Hive-style readers skip them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from loglake.log import fs
from loglake.log.api import CorruptSegment, CorruptStore, Record
from loglake.log.lake_schema import LAKE_SCHEMA, lake_file_name, parse_lake_file_name
from loglake.log.record_codec import (
    PLAIN_HEAD_SIZE,
    PlainColumns,
    RecordDecodeError,
    StoredRecord,
    plain_columns,
)
from loglake.log.segment import Segment

TMP_PREFIX = ".tmp-"
LAKE_ROW_GROUP_ROWS = 8192
"""Rows per Parquet row group: small enough that a read of a few thousand indexes touches
one or two row groups (pruned by the ``index`` column statistics), large enough for scans."""

LAKE_DICTIONARY_COLUMNS = (
    "stream",
    "partition",
    "key",
    "headers.list.element.key",
    "headers.list.element.value",
)
"""The columns a lake file dictionary-encodes: those whose values repeat. ``index``,
``timestamp_ns`` and ``data`` are written plain. Why: a payload (or an index) is almost never
repeated, yet the writer's default built a dictionary of each row group's first ~1 MB of
payloads before falling back to plain, and every reader then decoded two encodings (seen in
profiles of the archives-build scan). 32,768 records × 300 B here: the file written in
21-27 ms against 26-35, its ``data`` read in 2.7-3.1 ms against 3.4 (3 runs each, load ~4).
Lake files written before are read as ever: Parquet records each page's encoding."""


@dataclass(frozen=True, slots=True)
class LakeFile:
    """One lake file: ``first``..``last`` inclusive, as in its name. ``size``/``mtime`` are
    filled in by listings that stat (``loglake.pipeline``: compaction plans by size and ages
    superseded files by mtime; Spark takes ``str`` paths)."""

    first: int
    last: int
    path: Path | str
    size: int = 0
    mtime: float = 0.0


def list_lake_files(directory: Path) -> list[LakeFile]:
    """Every well-named lake file of one partition folder, by ``(first, -last)``, covered
    ones included (see ``visible_lake_files``)."""
    try:
        names = fs.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        rng = parse_lake_file_name(name)
        if rng is not None:
            out.append(LakeFile(rng[0], rng[1], directory / name))
    out.sort(key=lambda f: (f.first, -f.last))
    return out


class _Ranged(Protocol):
    @property
    def first(self) -> int: ...
    @property
    def last(self) -> int: ...
    @property
    def path(self) -> Path | str: ...


R = TypeVar("R", bound=_Ranged)


def split_covered(files: Iterable[R]) -> tuple[list[R], list[tuple[R, R]]]:
    """The lake's cover rule, the one place it lives (``loglake.pipeline``'s compaction writes
    a file spanning several sealed ones, then removes those after a grace period): a file whose
    range lies inside another's is hidden, so every index is read once. Returns ``(visible,
    [(covered, covering), ...])``; ranges that overlap without one holding the other are
    ``CorruptStore``."""
    visible: list[R] = []
    covered: list[tuple[R, R]] = []
    for f in sorted(files, key=lambda f: (f.first, -f.last)):
        if visible and f.first <= visible[-1].last:
            if f.last <= visible[-1].last:
                covered.append((f, visible[-1]))
                continue
            raise CorruptStore(
                str(f.path), f"overlaps {Path(visible[-1].path).name} without containing it"
            )
        visible.append(f)
    return visible, covered


def visible_lake_files(files: list[LakeFile]) -> list[LakeFile]:
    return split_covered(files)[0]


LAKE_LOCK = ".lake.lock"
"""Lock file of one partition folder (hidden: Spark, pyarrow and DuckDB globs skip it)."""


@contextlib.contextmanager
def lake_lock(directory: Path | str) -> Iterator[None]:
    """Exclusive ``flock`` on ``<partition folder>/.lake.lock``, held by whoever removes or
    replaces lake files of the partition in bulk (the ``compact`` job commits and deletes
    under it; log retention may take it too), so that a compaction never commits a file over
    sources another process removed since it planned. Advisory: sealing a new file needs no
    lock. The lock file itself carries no data and need not be durable (``fs.lock_file``)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    fd = fs.lock_file(Path(directory) / LAKE_LOCK, blocking=True)
    try:
        yield
    finally:
        fs.close(fd)  # closing the descriptor releases the lock


def remove_temp_files(directory: Path) -> None:
    """Leftovers of a crash during sealing (writer only, and only where no seal of this
    process can be writing: ``SegmentLog`` calls it at the first open of a partition, see
    ``Partition(sweep_lake_temps=...)``). A file that is gone between the listing and its
    unlink is what this wanted (found from outside: the race raised ``FileNotFoundError``
    into the append that opened the partition)."""
    try:
        names = fs.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(TMP_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                fs.unlink(directory / name)


MAX_FAST_DATA = (1 << 31) - 1
"""``binary`` columns have 32-bit offsets: more data than this takes the slow path."""


def plain_table(buf: bytes, cols: PlainColumns, stream: str, partition: int) -> pa.Table | None:
    """The lake table of plain records, built from buffers (no per-row Python objects); None
    when the data is too large for one ``binary`` column."""
    n = len(cols.index)
    starts, ends = cols.data_start, cols.data_end
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    if offsets[-1] > MAX_FAST_DATA:
        return None
    column: pa.Array
    if n and cols.frame_size is not None:
        # every frame the same size: the data is a strided block, copied out in one go
        width, first = int(ends[0] - starts[0]), int(starts[0])
        data = np.ndarray((n, width), np.uint8, buf, first, (cols.frame_size, 1)).tobytes()
        column = _binary(n, offsets, data)
    elif (
        n
        and ends[-1] <= MAX_FAST_DATA
        and _back_to_back(starts, ends)
        and n * (widest := int((ends - starts).max()) + PLAIN_HEAD_SIZE) <= 4 * len(buf)
    ):
        # frames of any size, one after the other: a binary array of the whole frames over the
        # buffer (no copy), each cut after its head in C (a Python slice per record cost ~1 µs
        # a record). ``binary_slice`` sizes its output as n × (stop − start) (an overflow with
        # no stop), hence the widest frame as the stop, and only where that stays near the size
        frames = np.empty(n + 1, dtype=np.int32)
        frames[0] = starts[0] - PLAIN_HEAD_SIZE
        frames[1:] = ends
        column = pc.binary_slice(_binary(n, frames, buf), PLAIN_HEAD_SIZE, widest)
    else:
        mv = memoryview(buf)
        data = b"".join(map(mv.__getitem__, map(slice, starts.tolist(), ends.tolist())))
        column = _binary(n, offsets, data)
    headers_type = LAKE_SCHEMA.field("headers").type
    return pa.table(
        {
            "stream": pa.array([stream] * n, pa.string()),
            "partition": pa.array(np.full(n, partition, dtype=np.int32)),
            "index": pa.array(cols.index),
            "timestamp_ns": pa.array(cols.timestamp_ns),
            "key": pa.nulls(n, pa.binary()),
            "headers": pa.ListArray.from_arrays(
                pa.array(np.zeros(n + 1, dtype=np.int32)),
                pa.array([], headers_type.value_type),
                type=headers_type,
            ),
            "data": column,
        },
        schema=LAKE_SCHEMA,
    )


def _binary(n: int, offsets: np.ndarray, data: bytes | pa.Buffer) -> pa.Array:
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )


def _back_to_back(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Each plain record's frame begins where the one before ends (a whole-frame buffer)."""
    return bool((starts[1:] - PLAIN_HEAD_SIZE == ends[:-1]).all())


def records_table(
    records: Sequence[StoredRecord | Record], stream: str, partition: int
) -> pa.Table:
    """The lake table of any records, row by row."""
    n = len(records)
    return pa.table(
        {
            "stream": pa.array([stream] * n, pa.string()),
            "partition": pa.array([partition] * n, pa.int32()),
            "index": pa.array([r.index for r in records], pa.int64()),
            "timestamp_ns": pa.array([r.timestamp_ns for r in records], pa.int64()),
            "key": pa.array([r.key for r in records], pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in records],
                LAKE_SCHEMA.field("headers").type,
            ),
            "data": pa.array([r.data for r in records], pa.binary()),
        },
        schema=LAKE_SCHEMA,
    )


def write_lake_table(directory: Path, table: pa.Table) -> LakeFile:
    """Write ``table`` (contiguous indexes, in order) as one lake file; atomic and durable."""
    if table.num_rows == 0:
        raise ValueError("nothing to seal")
    idx = table.column("index")
    first, last = idx[0].as_py(), idx[-1].as_py()
    fs.makedirs_durable(directory)
    final = directory / lake_file_name(first, last)
    tmp = directory / f"{TMP_PREFIX}{final.name}"
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        row_group_size=LAKE_ROW_GROUP_ROWS,
        use_dictionary=list(LAKE_DICTIONARY_COLUMNS),
        write_page_checksum=True,  # a flipped byte in a page is an error, not other data
    )
    fs.replace_file_atomic(final, memoryview(sink.getvalue()), tmp=tmp)
    return LakeFile(first, last, final)


def seal_segment(
    path: Path, first_index: int, next_index: int, directory: Path, stream: str, partition: int
) -> LakeFile:
    """Seal one rolled segment file into the lake. Plain records (the Ockam stream service's
    case: data only) take a columnar fast path; others are decoded one by one. Any damage →
    ``CorruptSegment`` (nothing is written). Yields the GIL as it goes: it runs on the
    background sealer while appenders work."""
    buf = fs.read_file(path)
    pause = _yield_gil
    table = None
    try:
        cols = plain_columns(buf, first_index, pause)
        if cols is not None:
            if first_index + len(cols.index) != next_index:
                raise CorruptSegment(str(path), len(buf), f"ends before index {next_index}")
            table = plain_table(buf, cols, stream, partition)
    except RecordDecodeError as e:
        raise CorruptSegment(str(path), e.offset, e.reason) from None
    if table is None:
        seg = Segment.sealed(path.parent, first_index, next_index, readonly=True)
        try:
            table = records_table(seg.iter_all(yield_every=64), stream, partition)
        finally:
            seg.close()
    pause()
    return write_lake_table(directory, table)


def _yield_gil() -> None:
    time.sleep(0)


@contextlib.contextmanager
def typed_lake_errors(path: str | Path) -> Iterator[None]:
    """A damaged lake file (at ``path``) is ``CorruptSegment`` naming it. A missing one stays
    ``FileNotFoundError``: readers re-list the lake when compaction or retention removed it.
    A disk error (an ``OSError`` with an errno, such as EIO) stays an ``OSError``: the file
    may be whole, and calling it damage would send its user looking in the wrong place."""
    try:
        yield
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno is not None:
            raise
        raise CorruptSegment(str(path), 0, f"unreadable Parquet: {e}") from None
    except (pa.ArrowException, ValueError, KeyError) as e:
        raise CorruptSegment(str(path), 0, f"unreadable Parquet: {e}") from None


def check_lake_schema(
    path: str | Path, schema: pa.Schema, columns: Iterable[str] | None = None
) -> None:
    """``CorruptSegment`` naming the file unless ``schema`` (its footer's) has every column of
    the lake's (``LAKE_SCHEMA``; or those of ``columns``, what a reader reads) with its type;
    nullability is not compared (``compact``'s
    files are written by Spark, whose columns are all nullable). Why: Spark's Parquet reader,
    given the record schema, reads a column a file lacks as nulls, so a foreign file under a
    lake name became rows of nulls in ``read()`` and in ``compact``'s output."""
    have = {f.name: f.type for f in schema}
    wanted = LAKE_SCHEMA.names if columns is None else set(columns)
    wrong = [
        f"no column {f.name}" if f.name not in have else f"{f.name} is {have[f.name]}"
        for f in LAKE_SCHEMA
        if f.name in wanted
        if f.name not in have or _nullable(have[f.name]) != _nullable(f.type)
    ]
    if wrong:
        raise CorruptSegment(
            str(path), 0, f"not a lake file: schema differs from LAKE_SCHEMA ({'; '.join(wrong)})"
        )


def check_lake_footer(path: str | Path, meta: pq.FileMetaData) -> None:
    """``CorruptSegment`` naming the file unless its footer agrees with its name
    (``first-last.parquet``): ``last - first + 1`` rows, and where the row groups carry
    statistics of ``index``, none null and ``first``..``last`` their bounds. A file whose name
    is not a lake file's is not judged here.

    Why: the Spark jobs read a lake file whole or hand it to Spark's reader, trusting its name;
    found from outside, a file under a lake name holding half its rows, or each row twice, was
    read as it was: ``sds-audit`` and ``archives-build`` reported success over lost or
    duplicated records, and ``compact`` wrote the damage into its output and deleted the
    sources. The footer is read anyway; the rows' order is checked where they are read
    (``pipeline.units``, ``pipeline.datasource``)."""
    named = parse_lake_file_name(Path(path).name)
    if named is None:
        return
    first, last = named
    if meta.num_rows != last - first + 1:
        raise CorruptSegment(
            str(path), 0, f"{meta.num_rows} rows where its name says {first}..{last}"
        )
    lo = hi = None
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        col = next(
            (rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == "index"),
            None,
        )
        st = None if col is None else col.statistics
        if st is not None and st.has_null_count and st.null_count:
            raise CorruptSegment(str(path), 0, "index column holds nulls")
        if st is None or not st.has_min_max:
            return  # no statistics to go by: the readers check the rows themselves
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    if meta.num_rows and (lo, hi) != (first, last):
        raise CorruptSegment(
            str(path), 0, f"index column spans {lo}..{hi} where its name says {first}..{last}"
        )


def check_index_run(path: str | Path, index: pa.Array | pa.ChunkedArray, expect: int) -> int:
    """``CorruptSegment`` naming the file unless ``index`` is ``expect``, ``expect + 1``, …
    (a lake file's rows, read in order); returns the index after them. Why: see
    ``check_lake_footer`` (a file with its rows in another order, or one row in place of
    another, passes the footer)."""
    n = len(index)
    if not n:
        return expect
    if index.null_count:
        raise CorruptSegment(str(path), 0, "index column holds nulls")
    got = np.asarray(index.to_numpy(zero_copy_only=False), dtype=np.int64)
    if got[0] != expect or (n > 1 and not (np.diff(got) == 1).all()):
        raise CorruptSegment(
            str(path), 0, f"index column is not {expect}..{expect + n - 1} in order"
        )
    return expect + n


def _nullable(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable: types compared by shape alone."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _nullable(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(_nullable(t.value_type))
    return t


_RECORD_COLUMNS = ("index", "timestamp_ns", "key", "headers", "data")


def read_lake_file(
    lf: LakeFile, stream: str, partition: int, start: int, end: int, limit: int
) -> list[Record]:
    """Records of one lake file with ``start <= index < end``, at most ``limit``."""
    lo, hi = max(start, lf.first), min(end, lf.last + 1, max(start, lf.first) + limit)
    if lo >= hi:
        return []
    with typed_lake_errors(lf.path):
        table = pq.read_table(
            lf.path,
            columns=list(_RECORD_COLUMNS),
            filters=[("index", ">=", lo), ("index", "<", hi)],
            page_checksum_verification=True,
        )
    # a flipped byte in the footer can rename a column or a header's field (CI, bab1970)
    check_lake_schema(lf.path, table.schema, _RECORD_COLUMNS)
    with typed_lake_errors(lf.path):
        cols = table.to_pydict()
    if sorted(cols["index"]) != list(range(lo, hi)):
        # e.g. damaged statistics pruned a row group: never serve a range with holes
        raise CorruptSegment(str(lf.path), 0, f"index column does not hold {lo}..{hi - 1}")
    out = [
        Record(stream, partition, i, ts, k, tuple((h["key"], h["value"]) for h in hs), d)
        for i, ts, k, hs, d in zip(
            cols["index"],
            cols["timestamp_ns"],
            cols["key"],
            cols["headers"],
            cols["data"],
            strict=True,
        )
    ]
    out.sort(key=lambda r: r.index)
    return out


def lake_file_max_timestamp(lf: LakeFile) -> int:
    """Newest ``timestamp_ns`` in a lake file, from the Parquet column statistics."""
    with typed_lake_errors(lf.path):
        meta = pq.ParquetFile(lf.path).metadata
    col = LAKE_SCHEMA.get_field_index("timestamp_ns")
    best: int | None = None
    for rg in range(meta.num_row_groups):
        stats = meta.row_group(rg).column(col).statistics
        if stats is None or not stats.has_min_max:
            best = None
            break
        best = stats.max if best is None else max(best, stats.max)
    if best is None:
        with typed_lake_errors(lf.path):
            ts = pq.read_table(lf.path, columns=["timestamp_ns"]).column(0)
        return int(pc.max(ts).as_py())
    return int(best)


def check_lake_file(lf: LakeFile) -> None:
    """The file's schema, row count and index column match its name (``CorruptSegment``
    otherwise; the lake is a view of segments and is checked like one)."""
    try:
        pf = pq.ParquetFile(lf.path, page_checksum_verification=True)
        schema_ok = pf.schema_arrow == LAKE_SCHEMA
        if not schema_ok:  # (a damaged schema may not even name the index column)
            raise CorruptSegment(str(lf.path), 0, "schema differs from LAKE_SCHEMA")
        idx = pf.read(columns=["index"]).column(0).to_pylist()
        pf.read()  # every page of every column: checksums and decoding
    except (OSError, pa.ArrowException, ValueError, KeyError, IndexError) as e:
        raise CorruptSegment(str(lf.path), 0, f"unreadable Parquet: {e}") from None
    if idx != list(range(lf.first, lf.last + 1)):
        raise CorruptSegment(str(lf.path), 0, f"index column is not {lf.first}..{lf.last}")
