"""Units: a stream partition's records planned on the driver from metadata, read by plain tasks.

Why: a job whose work is Python over the records' bytes (``job archives-build``,
``job sds-audit``'s decode) spent most of its time in the JVM copying each record from the lake
into Arrow for Python (and, for a DataFrame result, back). Here the driver plans *units* from
file names and the live log's bounds only — the lake's visible files (the cover rule) and the
live ranges they do not cover — and Spark runs plain tasks (``SparkContext.parallelize`` of
``Unit`` descriptors) that read their records where they lie: a lake file through pyarrow, the
live tail through ``loglake.log``'s read-only view (``Log.read_tables``), in index order.

A node on JetStream (``loglake node --backend nats://…``) keeps the live part in the cluster,
not in the data dir: when the data dir's lake names a cluster (the sealer's
``lake/_jetstream.json``, the rule ``pipeline.options`` applies to the ``loglake`` source), the
live ranges are planned from JetStream's bounds and read from JetStream by the tasks, through the
source's reader (``livelog.NatsSource``, bounded fetches of ``NATS_READ_BATCH`` records), with
the same rule: an index is the stream sequence − 1, and a range retention dropped after the plan
is read again from the lake (the sealer copied it there) or fails with ``LiveHistoryGone``,
never skipped. Each such unit carries the cluster's servers, prefix and credentials path: the
tasks run on executors, which open their own connection.

This relies on a filesystem shared by the driver and every executor (``data_dir`` is read by
the tasks): true for ``local[*]`` and for the standalone cluster on one machine. A lake file
that ``job compact`` removed after the plan is read from what covers it now
(``_read_replanned``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from loglake.log.api import CorruptSegment
from loglake.log.lake import check_index_run, check_lake_footer, check_lake_schema
from loglake.log.lake_schema import parse_lake_file_name
from loglake.pipeline.errors import BadOption, JobFailed
from loglake.pipeline.lake import plan_partition, subtract, visible_lake_files
from loglake.pipeline.livelog import NatsSource

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

SCAN_BATCH = 65_536
"""Records read at once (one Arrow batch) unless a reader asks for fewer."""
LIVE_SPLIT = 500_000
"""Records of the live log per unit (a sealed lake file is one unit)."""


@dataclass(frozen=True)
class Unit:
    """Where one index range ``[start, end)`` of a stream partition lies: a sealed lake file
    (``path``, read with pyarrow) or the live part (``path`` empty): the data dir's embedded
    log (read with ``loglake.log``), or the JetStream cluster ``cluster`` names.

    Small and picklable: only descriptors like this one and the tasks' small results travel
    through Spark, never the records."""

    stream: str
    path: str
    start: int
    end: int
    partition: int = 0
    cluster: NatsSource | None = None
    """A live range of a node on JetStream: how the task reaches the cluster (servers,
    prefix, ``.creds`` path). None: the embedded log of the data dir."""


def data_dir_cluster(data_dir: str) -> NatsSource | None:
    """The JetStream cluster the data dir's lake names (the sealer's note), or None when its
    live part is the embedded log: the ``loglake`` source's rule (``parse_options`` given
    only ``data_dir``), so units and the source read the same place."""
    from loglake.pipeline.options import parse_options

    # the stream name is only there to satisfy the parser: the note is per data dir
    opts = parse_options({"data_dir": data_dir, "stream": "x"})
    if not opts.backend:
        return None
    return NatsSource(opts.backend, opts.nats_prefix, opts.nats_creds)


def stream_names(data_dir: str) -> set[str]:
    """The streams of ``data_dir``: its lake's and its live part's — the embedded log's, or
    those of the JetStream cluster the lake names (a stream not sealed yet is there only)."""
    from loglake.pipeline.lake import lake_streams
    from loglake.pipeline.livelog import open_log_readonly

    names = set(lake_streams(data_dir))
    cluster = data_dir_cluster(data_dir)
    if cluster is not None:
        return names | set(cluster.streams())
    # a lake-only data dir has no log to open
    with contextlib.suppress(Exception), open_log_readonly(data_dir) as log:
        names |= set(log.streams())
    return names


def plan_units(
    data_dir: str, streams: Mapping[int, str], partition: int = 0
) -> dict[int, list[Unit]]:
    """Every stream's records in ``partition`` as units sorted by index, keyed like
    ``streams``; planned from file names and the live part's bounds only (one listing per
    stream; the embedded log opened once for all streams, or one stream-info request per
    stream to the JetStream cluster the data dir names). An unknown stream is ``BadOption``."""
    cluster = data_dir_cluster(data_dir)
    live = (
        _cluster_bounds(cluster, streams, partition)
        if cluster
        else _log_bounds(data_dir, streams, partition)
    )
    out: dict[int, list[Unit]] = {}
    for sid, stream in streams.items():
        files = visible_lake_files(data_dir, stream, partition)
        if not files and stream not in live:
            where = f"data_dir {data_dir}" + (f" or backend {cluster.backend}" if cluster else "")
            raise BadOption("stream", stream, f"unknown stream in {where}")
        first, nxt = live.get(stream, (None, None))
        if cluster and files and first is not None and first > files[-1].last + 1:
            # JetStream dropped records the sealer never copied: planned as live, so the task
            # reading them raises ``LiveHistoryGone`` naming the range (the source's rule),
            # instead of a plan that silently skips them
            first = files[-1].last + 1
        plan = plan_partition(partition, files, first, nxt, 0, None, LIVE_SPLIT)
        units = [Unit(stream, str(f.path), f.first, f.last + 1, partition) for f in plan.files]
        units += [Unit(stream, "", r.start, r.end, partition, cluster) for r in plan.live]
        out[sid] = sorted(units, key=lambda u: u.start)
    return out


def _log_bounds(
    data_dir: str, streams: Mapping[int, str], partition: int
) -> dict[str, tuple[int, int]]:
    """``(first_index, next_index)`` of ``partition`` of each stream the embedded log has."""
    from loglake.pipeline.livelog import open_log_readonly

    live: dict[str, tuple[int, int]] = {}
    with contextlib.ExitStack() as stack:
        try:
            log = stack.enter_context(open_log_readonly(data_dir))
        except Exception:  # a lake-only data dir has no log to open
            return live
        for stream in set(streams.values()):
            if log.has_stream(stream):
                ps = [p for p in log.stream_info(stream).partitions if p.partition == partition]
                if ps:
                    live[stream] = (ps[0].first_index, ps[0].next_index)
    return live


def _cluster_bounds(
    cluster: NatsSource, streams: Mapping[int, str], partition: int
) -> dict[str, tuple[int, int]]:
    """``(first_index, next_index)`` of ``partition`` of each stream JetStream holds: stream
    sequences − 1, as the source's offsets."""
    live: dict[str, tuple[int, int]] = {}
    for stream in set(streams.values()):
        bounds = (cluster.partitions(stream) or {}).get(partition)
        if bounds is not None:
            live[stream] = bounds
    return live


def read_unit_columns(
    data_dir: str,
    u: Unit,
    columns: Sequence[str] = ("index", "data"),
    lo: int = 0,
    hi: int | None = None,
    batch_rows: int = SCAN_BATCH,
    checked: bool = False,
) -> Iterator[pa.RecordBatch]:
    """``columns`` (of the lake's schema, ``LAKE_SCHEMA``; ``index`` among them) of ``u``'s
    records within ``[lo, hi)``, in index order, in batches of at most ``batch_rows``: a lake
    file through pyarrow (row groups pruned by the index statistics), the live log through its
    read-only view (columns from the segments' bytes, no Python object per record).

    ``checked``: this job already read ``u``'s lake file whole with its pages' CRCs checked
    (``job archives-build``'s build reads again what its scan read), so they are not checked
    again (a quarter of the read's CPU, about 0.05 µs a 300-byte record). A lake file is never
    rewritten in place (``job compact`` writes a new one), and a file read in its place
    (``_read_replanned``) is checked."""
    lo, hi = max(lo, u.start), u.end if hi is None else min(hi, u.end)
    if lo >= hi:
        return
    cols = list(columns)
    if u.path:
        try:
            if (lo, hi) == (u.start, u.end):
                batches = _lake_file_batches(u.path, cols, batch_rows, verify=not checked)
            else:
                tables = _read_lake_file(u.path, cols, (lo, hi), verify=not checked)
                batches = (b for t in tables for b in t.to_batches(max_chunksize=batch_rows))
        except FileNotFoundError:
            yield from _read_replanned(data_dir, u, cols, lo, hi, batch_rows)
            return
        yield from batches
        return
    if u.cluster is not None:
        yield from _rebatch(_read_cluster(data_dir, u, cols, lo, hi), batch_rows)
        return
    from loglake.pipeline.livelog import DirSource

    # the source's reader: a range retention removed after the plan is ``LiveHistoryGone``
    for table in DirSource(data_dir).tables(u.stream, u.partition, lo, hi):
        yield from table.select(cols).to_batches(max_chunksize=batch_rows)


def read_unit_pieces(
    data_dir: str, u: Unit, columns: Sequence[str], batch_rows: int, piece_rows: int
) -> Iterator[list[pa.RecordBatch]]:
    """``read_unit_columns``'s batches of ``u`` (all its records), each as the list of its
    pieces of at most ``piece_rows`` records (``batch_rows`` a multiple of it), for a reader
    that keeps the batches but works a piece at a time. A whole lake file is read
    ``piece_rows`` at a time (``iter_batches`` cuts exact sizes across row groups, so
    consecutive pieces make ``read_unit_columns``'s batches); the rest is cut from its batches
    (slices, no copy). Why: pyarrow grows a batch's binary column by reallocation, and copying
    ~60 MB batches of ~20 KB records went through memory where ~20 MB pieces stay in the CPU's
    cache (``job sds-audit``'s decode: 1M records' read 30% less CPU)."""
    if batch_rows % piece_rows:
        raise ValueError(
            f"batch_rows ({batch_rows}) is not a multiple of piece_rows ({piece_rows})"
        )
    if u.start >= u.end:
        return
    if u.path:
        try:
            pieces = _lake_file_batches(u.path, list(columns), piece_rows)
        except FileNotFoundError:
            pass  # replaced by a compaction: read_unit_columns reads where its records went
        else:
            group: list[pa.RecordBatch] = []
            for p in pieces:
                group.append(p)
                if len(group) * piece_rows == batch_rows:
                    yield group
                    group = []
            if group:
                yield group
            return
    for b in read_unit_columns(data_dir, u, columns, batch_rows=batch_rows):
        yield [b.slice(i, piece_rows) for i in range(0, b.num_rows, piece_rows)] or [b]


def _open_lake_file(path: str, columns: list[str], verify: bool = True) -> pq.ParquetFile:
    """The lake file at ``path``, opened and checked to hold ``columns`` (and ``index``) as
    the lake types them (``log.lake.check_lake_schema``): a truncated or foreign file is
    ``CorruptSegment`` naming it, which the job's entry point raises as itself, not a pyarrow
    error inside Spark's wrapper. ``verify``: each page's CRC checked as it is read."""
    import pyarrow.parquet as pq

    from loglake.log.lake import typed_lake_errors

    with typed_lake_errors(path):
        # each page's CRC checked as it is decompressed (the lake writes them): a damaged page
        # whose footer is whole is ``CorruptSegment`` too, not other rows
        f = pq.ParquetFile(path, page_checksum_verification=verify)
    check_lake_schema(path, f.schema_arrow, [*columns, "index"])
    check_lake_footer(path, f.metadata)
    return f


def _lake_file_batches(
    path: str, columns: list[str], batch_rows: int, verify: bool = True
) -> Iterator[pa.RecordBatch]:
    """Every record of a lake file, ``batch_rows`` at a time, each row group decompressed when
    its records are asked for (the file is opened here: a missing one raises at once). Why not
    the whole file first: a reader that takes small batches then works on bytes just
    decompressed, still in the CPU's cache (``job archives-build``'s scan: 8,192 records,
    2.7 MB, against a 56 MB file read before its first batch). Without Arrow's threads: each
    Spark task is one core's work already, and waking a pool thread per row group showed in
    the scan's profile (``pthread_cond_signal``, a fifth of its main thread's samples)."""
    f = _open_lake_file(path, columns, verify)
    named = parse_lake_file_name(os.path.basename(path))
    return _typed_batches(
        path,
        f.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False),
        named[0] if named is not None and "index" in columns else None,
    )


def _typed_batches(
    path: str, batches: Iterator[pa.RecordBatch], first: int | None = None
) -> Iterator[pa.RecordBatch]:
    """``batches`` of the lake file at ``path``, a damaged page among them ``CorruptSegment``
    naming the file (pyarrow reads a row group's pages when its batches are asked for), and
    so is an ``index`` column that is not ``first``, ``first + 1``, … (``check_index_run``:
    the footer agreed with the name, the rows may still not)."""
    from loglake.log.lake import typed_lake_errors

    with typed_lake_errors(path):
        expect = first
        for b in batches:
            if expect is not None:
                expect = check_index_run(path, b.column("index"), expect)
            yield b


def _read_lake_file(
    path: str, columns: list[str], within: tuple[int, int], verify: bool = True
) -> list[pa.Table]:
    """``columns`` of a lake file's records (those with an index in ``within``), a table per
    row group kept: row groups pruned by the index statistics, rows by a numpy mask. Why not
    ``pq.read_table(filters=…)``: it goes through ``pyarrow.dataset``, whose first use in a
    worker imports the dataset and query modules (and pandas where the daemon did not)."""
    from loglake.log.lake import typed_lake_errors

    f = _open_lake_file(path, columns, verify)
    lo, hi = within
    at = f.schema_arrow.get_field_index("index")
    want = columns if "index" in columns else [*columns, "index"]
    out = []
    named = parse_lake_file_name(os.path.basename(path))
    expect = max(lo, named[0]) if named is not None else None
    for g in range(f.metadata.num_row_groups):
        stats = f.metadata.row_group(g).column(at).statistics
        if stats is not None and stats.has_min_max and (stats.max < lo or stats.min >= hi):
            continue
        with typed_lake_errors(path):
            t = f.read_row_group(g, columns=want)
        idx = np.asarray(t.column("index").to_numpy())
        keep = (idx >= lo) & (idx < hi)
        if not keep.all():
            t = t.filter(keep)
        if expect is not None:
            expect = check_index_run(path, t.column("index"), expect)
        out.append(t.select(columns))
    if named is not None and expect != min(hi, named[1] + 1):  # a row group pruned wrongly
        raise CorruptSegment(path, 0, f"index column does not hold {lo}..{hi - 1}")
    return out


def _read_cluster(
    data_dir: str, u: Unit, columns: list[str], lo: int, hi: int
) -> Iterator[pa.RecordBatch]:
    """``[lo, hi)`` of a live unit of a node on JetStream, by the ``loglake`` source's range
    reader (``datasource.read_range``, one reader for both): JetStream first, and if its
    retention dropped part of the range since the plan, that part from the lake (the sealer
    copied it) or ``LiveHistoryGone`` when neither holds it."""
    from loglake.log.lake_schema import LAKE_SCHEMA
    from loglake.pipeline.datasource import RangeSplit, read_range
    from loglake.pipeline.options import SourceOptions

    c = u.cluster
    assert c is not None
    opts = SourceOptions(
        stream=u.stream,
        data_dir=data_dir,
        backend=c.backend,
        nats_prefix=c.prefix,
        nats_creds=c.credentials,
    )
    split = RangeSplit(u.partition, lo, hi, live_only=True)
    for b in read_range(opts, split, target=LAKE_SCHEMA):
        yield b.select(columns)


def _rebatch(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """``batches`` regrouped into batches of ``rows`` (the last may be shorter). Why: JetStream
    answers ``NATS_READ_BATCH`` records at a time, and the jobs' decoders are tuned for (and
    pay a fixed cost per) batch of the size they ask for."""
    import pyarrow as pa

    held: list[pa.RecordBatch] = []
    n = 0
    for b in batches:
        held.append(b)
        n += b.num_rows
        if n < rows:
            continue
        table = pa.Table.from_batches(held).combine_chunks()
        full = (n // rows) * rows
        yield from table.slice(0, full).to_batches(max_chunksize=rows)
        held = table.slice(full).to_batches()
        n -= full
    if n:
        yield from pa.Table.from_batches(held).combine_chunks().to_batches(max_chunksize=rows)


def read_unit(
    data_dir: str,
    u: Unit,
    lo: int = 0,
    hi: int | None = None,
    batch_rows: int = SCAN_BATCH,
    checked: bool = False,
) -> Iterator[tuple[np.ndarray, pa.Array]]:
    """(index, data) batches of ``u`` within ``[lo, hi)`` (``read_unit_columns``)."""
    for b in read_unit_columns(data_dir, u, ("index", "data"), lo, hi, batch_rows, checked):
        idx = np.asarray(b.column(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        yield idx, b.column(1)


def _read_replanned(
    data_dir: str, u: Unit, columns: list[str], lo: int, hi: int, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """``[lo, hi)`` of a lake file that is gone since the plan, from what covers it now.

    Why: ``job compact`` replaces small lake files by one that covers them and, with its
    default grace of 0 s, deletes them at once; a job planned before that would otherwise
    fail on a missing file (the node runs both jobs). The records are the same (compaction
    copies them), so the range is planned again from the lake's visible files and the live
    log, as ``plan_units`` does. Records that nothing holds any more (retention removed them
    meanwhile) fail the job, naming the range: the job was planned with them."""
    try:
        now = plan_units(data_dir, {0: u.stream}, u.partition)[0]
    except BadOption:  # nothing at all is left of the stream
        now = []
    files = [f for f in now if f.start < hi and f.end > lo]
    if any(f.path == u.path for f in files):  # listed, yet unreadable: not a compaction
        raise JobFailed(f"lake file {u.path} of stream {u.stream!r} cannot be read")
    gone = subtract(lo, hi, [(f.start, f.end) for f in files])
    if gone:
        raise JobFailed(
            f"records {', '.join(f'{a}..{b}' for a, b in gone)} of stream {u.stream!r} were "
            f"removed during the job (lake file {u.path} is gone and nothing holds them now)"
        )
    for f in files:
        yield from read_unit_columns(data_dir, f, columns, lo, hi, batch_rows)


def require_visible(path: str, job: str, shared: str) -> None:
    """A part file an executor wrote must be visible to the driver: the design of the jobs
    that read and write where the records lie needs a filesystem shared by the driver and
    every executor. ``JobFailed`` naming the file, the job and what must be shared."""
    import os

    if not os.path.exists(path):
        raise JobFailed(
            f"part file {path} written by an executor is not visible to the driver: {job} "
            f"needs {shared} on a filesystem shared by the driver and every executor"
        )
