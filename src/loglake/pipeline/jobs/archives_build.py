"""``archives-build``: the due 7-day archives of one community stream, or of many, on Spark.

Why: the control node builds archives in one Python process, through its SQLite working store,
which does not scale past one core. This job builds the same bytes from the stream itself,
with Spark distributing the work. Records never enter the JVM: a community stream's records are
already ``WakuMessage`` bytes, so the driver plans from metadata only — the lake's visible files (by
name) and the live log's bounds, the log opened once for every stream — and Spark runs plain
tasks (``SparkContext.parallelize`` of small descriptors) that read their records where they
lie (lake Parquet through pyarrow, the live tail through ``loglake.log``'s read-only view) and
send back only small results. Two stages, one decode of every record:

- scan, one call per unit (``loglake.pipeline.units``, shared with ``job sds-audit``: a lake
  file, or up to ``LIVE_SPLIT`` records of the live log; units packed into a few Spark
  tasks): each record decoded (``decode_waku_batch``: numpy over the Arrow buffers, with
  the layout's own ``decode_record`` for any record it cannot vouch for);
  out come only, per community and hour of message time, the index range and oldest time of
  its messages, and the bad records (so a bad record fails the job before any build work, and
  windows are planned from the oldest message); the unit's good records stay, decoded and in
  the store's order (time, then index), in an Arrow IPC spill file, with their bytes for the
  general path (for the spec layout's, the build reads them again: ``_scan_task`` says why);
- plan (driver, spec layout): every archive sized before any is built, from the spills' time,
  framed size and topic codes (``_plan_direct``: metadata, layout head, padding), each build
  task given its offset in the community's staged ``data``, made that long;
- build, one call per group of whole consecutive windows of one community (about a quarter of
  the records per core, ``TASK_RECORDS``; a window never spans two tasks): its windows' slices
  of its units' spills (memory-mapped, no decode), built — for the spec layout by
  ``_build_direct`` (the layout's archive head, the records read again and framed in C,
  ``_reread``, ``padding_field``: no Python object per record), written at its planned
  offset in the staged ``data`` past the page cache (``O_DIRECT``, ``_DirectWriter``) where
  the file system allows it, else with one ``pwritev`` per archive, its write-back to the
  disk started at once (``_start_writeback``);
  otherwise (status-go, ``--topic``) by the archives part's sans-I/O
  ``ArchiveBuilder`` (framing, padding, status-go chunks) into a part file the driver copies
  in — every archive padded to whole pieces, so a task's pieces and SHA-1 hashes do not
  depend on any other task.

This relies on a filesystem shared by the driver and every executor (``data_dir`` is read by
tasks; spills and part files under ``root`` are written by one task and read by another
or by the driver): true for ``local[*]`` and for the standalone cluster on one machine; the
driver fails with ``JobFailed`` naming a part file it cannot see. The spills go to memory
(``/dev/shm``) when it has room and the executors share it (``pipeline.scratch``,
``ArchivesBuildOptions.scratch``): on disk, past the kernel's dirty-page thresholds, they
were written out to the disk beside the output and throttled every writer. Dropped
(docs/archives.md): the DataFrame path — records through ``pipeline.read``, decoded in
``mapInArrow`` twice and shuffled by window to ``applyInArrow`` — crossed the JVM/Python
boundary three times per record and was slower than ``ControlNode``.

The driver then does what only depends on order: offsets by prefix sum (``Layout.make_entry``
at the real offset gives each keccak-256 key), the index (``Layout.encode_index``) and the
torrent (``ArchiveBuilder.torrent``), and writes the files ``ControlNode`` writes —
``<root>/<community id>/{data,index}`` and ``<root>/<community id>.torrent`` — plus
``<root>/<community id>.magnet``. Windows follow ``ControlNode.build``: from the end of the last
archive (the index, or the control node's store if it recorded a later end), else from the
oldest valid message of the stream (``plan_windows``: full windows, catch-up builds every
missed one; ``partial`` adds the unfinished one). So the bytes are the control node's, for both
layouts, and a control node started on ``root`` afterwards continues from them: its builder
resumes at the index's last window, and its store (new or lagging) is re-flagged from the
archives at its next ingest (``ControlNode._reflag``: a row is archived iff its record is in an
archive), so it neither rebuilds nor re-exports.

Atomic and re-runnable (a job killed midway leaves no partial archive visible):

1. Scan tasks write their spills (and build tasks of the general path their part files) to
   ``<root>/.archives-build/_parts-<job>/``, the spills to ``/dev/shm/loglake-<key>/<job>``
   when in memory (both removed at the end, or by the next run).
2. The driver stages the community's new files in ``<root>/.archives-build/<community id>/``:
   ``data`` (the live ``data`` up to the end of its last indexed archive, copied in the kernel
   with ``copy_file_range``, then the new archives: written in place by the build tasks, or
   each part copied in), ``index``, ``torrent``, ``magnet``; every file and folder fsync'd.
3. ``COMMIT`` (a JSON plan, written atomically: ``fs.replace_file_atomic``) is the commit point.
4. Roll forward: ``data``, then ``index``, then the torrent, then the magnet are renamed into
   place (each folder fsync'd). Between the first two renames a reader sees the old index over a
   longer ``data``: the unindexed tail every reader ignores (``ControlNode`` truncates it).

A crash before ``COMMIT`` leaves only staging, removed by the next run, which rebuilds the same
bytes (the build is a pure function of the stream and the committed files); a crash after it is
rolled forward by the next run. One job per ``root`` at a time (``flock``); a ``ControlNode``
must not build the same community while the job runs (it does not take the lock).

Bad input: a record that is not the layout's ``WakuMessage`` fails the job with
``BadCommunityRecord`` naming the stream and index (nothing is written), or with
``on_bad_record="skip"`` is skipped (as ``ControlNode`` skips it) and counted in the report.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import fnmatch
import functools
import itertools
import json
import os
import pickle
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw
import numpy as np

from loglake.archives import (
    WINDOW_NS,
    ArchiveBuilder,
    BadRecord,
    IndexEntry,
    Layout,
    PieceHashes,
    check_topics,
    check_trackers,
    decode_waku_batch,
    frame_records,
    get_layout,
    plan_windows,
)
from loglake.log import fs
from loglake.pipeline.errors import BadOption, JobFailed, check_dir, raises_task_errors
from loglake.pipeline.output_dir import one_job
from loglake.pipeline.scratch import MODES, Scratch, clear_stale, open_scratch, scratch_key
from loglake.pipeline.units import Unit, plan_units, read_unit, require_visible
from loglake.wire import value_offsets

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

STAGING_DIR = ".archives-build"
"""Under ``root``; hidden (a dot folder), and not a community folder (those are ``0x…``)."""
PARTS_PREFIX = "_parts-"
COMMIT = "COMMIT"
LOCK = ".archives-build.lock"
ON_BAD_RECORD = ("fail", "skip")
BAD_SAMPLE = 10
"""Bad records named per community in the report (all are counted)."""


class BadCommunityRecord(JobFailed, BadRecord):
    """A community stream record is not the layout's ``WakuMessage`` (``on_bad_record=fail``)."""

    def __init__(self, stream: str, index: int, reason: str, count: int = 1) -> None:
        more = f" ({count} bad records in all)" if count > 1 else ""
        super().__init__(
            f"stream {stream!r} index {index}: {reason}{more}; "
            "rerun with --on-bad-record skip to skip such records"
        )
        self.stream, self.index, self.reason, self.count = stream, index, reason, count


@dataclass(frozen=True)
class Community:
    stream: str
    community_id: str
    """``0x`` + compressed public key hex: the torrent's name and the folder's."""


@dataclass(frozen=True)
class ArchivesBuildOptions:
    data_dir: str
    root: str
    communities: tuple[Community, ...]
    layout: str = "spec"
    now_ns: int | None = None
    """Build as of this time (default: now)."""
    partial: bool = False
    period_ns: int = WINDOW_NS
    topics: tuple[bytes | str, ...] | None = None
    announce: tuple[str, ...] | None = None
    """Tracker URLs of the torrent (None: the layout's defaults, as ``ControlNode``)."""
    on_bad_record: str = "fail"
    scratch: str = "auto"
    """Where the scan's spills go (``pipeline.scratch``): ``auto`` (memory when it has room
    and the master is local), ``memory`` (also for a cluster whose executors share this
    machine's ``/dev/shm``), ``disk``."""

    def __post_init__(self) -> None:
        check_dir("data_dir", self.data_dir, self.data_dir)
        if not self.communities:
            raise BadOption("streams", "", "no community stream to build")
        if self.on_bad_record not in ON_BAD_RECORD:
            raise BadOption("on_bad_record", self.on_bad_record, "use fail or skip")
        if self.scratch not in MODES:
            raise BadOption("scratch", self.scratch, f"use one of {', '.join(MODES)}")
        if self.period_ns <= 0:
            raise BadOption("period_ns", self.period_ns, "must be positive")
        if self.now_ns is not None and not 0 <= self.now_ns <= 2**63 - 1:
            # int64 ns, as the node's archives API bounds it: windows are planned one period
            # at a time up to now, so a now of 10^39 ns never finished planning
            raise BadOption("now_ns", self.now_ns, "expected 0..2^63-1 (int64 nanoseconds)")
        get_layout(self.layout)  # ArchiveConfigError for an unknown layout
        check_topics(self.topics)  # an archive's bounds, before any Spark work
        if self.announce is not None:  # before any Spark work: ArchiveConfigError naming it
            check_trackers(self.announce)
        ids = [c.community_id for c in self.communities]
        if len(set(ids)) != len(ids):
            raise BadOption("communities", ids, "two streams share a community id")


def match_streams(data_dir: str, pattern: str) -> list[str]:
    """Streams of ``data_dir`` (live part and lake: ``units.stream_names``) whose name matches
    ``pattern`` (fnmatch); a plain name matches itself."""
    from loglake.pipeline.units import stream_names

    return sorted(n for n in stream_names(data_dir) if fnmatch.fnmatchcase(n, pattern))


def communities_from_keys(
    data_dir: str, pattern: str, key_file: str | None = None, key_dir: str | None = None
) -> tuple[Community, ...]:
    """Each stream matching ``pattern`` with its community id: from ``key_file`` (one stream),
    or from ``key_dir/<stream>.key`` (a control node key, hex, as ``archives keygen`` writes)."""
    from loglake.archives import community_id, load_private_key

    streams = match_streams(data_dir, pattern)
    if not streams:
        raise BadOption("streams", pattern, f"no stream of {data_dir} matches")
    if key_file is not None:
        if len(streams) != 1:
            raise BadOption(
                "key_file", key_file, f"one key for {len(streams)} streams: use --key-dir"
            )
        key = load_private_key(Path(key_file).read_text().strip())
        return (Community(streams[0], community_id(key)),)
    if key_dir is None:
        raise BadOption("key_dir", None, "give --key-file (one stream) or --key-dir")
    out = []
    for s in streams:
        path = Path(key_dir) / f"{s}.key"
        if not path.exists():
            raise BadOption("key_dir", key_dir, f"no key {path.name} for stream {s!r}")
        out.append(Community(s, community_id(load_private_key(path.read_text().strip()))))
    return tuple(out)


# -- results ---------------------------------------------------------------------------------


@dataclass
class CommunityReport:
    stream: str
    community_id: str
    windows: int = 0
    """7-day windows consumed by this build (empty ones included)."""
    new_archives: int = 0
    records: int = 0
    """Records in the windows built (before topic filtering and status-go's size cap; a
    copy of an earlier record is not counted: ``_copies``)."""
    bad_records: int = 0
    bad_sample: list[tuple[int, str]] = field(default_factory=list)
    topic_skipped: int = 0
    """Records of the windows built left out as their topic was past the bounds of an
    archive's metadata (no topics given: ``archives.builder.bounded_topics``), as
    ``ControlNode`` leaves them out."""
    appended_bytes: int = 0
    data_bytes: int = 0
    info_hash: str | None = None
    magnet: str | None = None


@dataclass
class ArchivesBuildReport:
    communities: list[CommunityReport] = field(default_factory=list)
    recovered: int = 0
    """Committed builds of an earlier, killed run rolled forward."""
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def new_archives(self) -> int:
        return sum(c.new_archives for c in self.communities)

    @property
    def bad_records(self) -> int:
        return sum(c.bad_records for c in self.communities)

    @property
    def appended_bytes(self) -> int:
        return sum(c.appended_bytes for c in self.communities)

    def to_json(self) -> dict[str, Any]:
        return {
            "communities": [c.__dict__ for c in self.communities],
            "recovered": self.recovered,
            "new_archives": self.new_archives,
            "bad_records": self.bad_records,
            "appended_bytes": self.appended_bytes,
            "seconds": self.seconds,
        }


Progress = Callable[[str, int, int], None]
Fault = Callable[[str], None]
"""``fault(point)``: called between stages (``parts``, ``staged``, ``committing``); tests kill
the job there."""


# -- executors -------------------------------------------------------------------------------


BUCKET_NS = 3600 * 1_000_000_000
"""The scan records, per community and hour of message time, the stream index range holding
its messages: each build task reads only the index range of its windows (a weekly build does
not re-read archived history)."""
TASK_RECORDS = (20_000, 500_000)
"""Bounds of the records one build task gets (whole windows; the target is a quarter of the
job's records per core, so both cores stay busy and a straggler is small)."""


def _spill_name(sid: int, u: Unit) -> str:
    """The scratch file where the scan leaves a unit's decoded records for the build."""
    return f"s-{sid}-{u.start}.arrow"


_SPILL_COLUMNS = ("index", "ts", "topic", "cap", "flen")
"""A spill's columns: stream index, message time, topic (dictionary-encoded: one dictionary
per spill), cap (payload size), flen (the record's size framed in an archive: tag, varint
length, record; the driver sizes every archive from it before any is built); then the
record's bytes (large binary: a unit's bytes may pass the 2 GiB a binary array can offset),
as ``framed`` (``0x1a varint(len) record``, what the spec layout's archive holds: the
build's body is a slice of it) or as ``data`` (the record, for ``ArchiveBuilder``)."""


def _framed_len(lens: np.ndarray) -> np.ndarray:
    """``len(b"\x1a" + varint(n) + record)`` for records of ``lens`` bytes."""
    v = lens.astype(np.int64)
    return 2 + v + (v >= 1 << 7) + (v >= 1 << 14) + (v >= 1 << 21) + (v >= 1 << 28)


SCAN_ROWS = 8192
"""Records the scan decodes and frames at a time: a lake row group (the sealer's), 2.7 MB of
300-byte records, decompressed just before (``units._lake_file_batches``) and so still in the
CPU's cache when the kernel reads and frames it; 65,536 (56 MB of a lake file decompressed
at once) was ~25% more CPU for read, decode and frame, measured in one process."""
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""``mallopt`` parameters (glibc's malloc.h)."""
HEAP_KEEP = (256 << 20, 32 << 20)
"""The worker's heap settings for the scan: free memory kept at the heap's top before it is
returned to the kernel, and the size from which an allocation gets its own ``mmap`` (glibc's
largest)."""


@functools.cache
def _keep_heap() -> bool:
    """Let glibc's ``malloc`` keep what a batch freed for the next batch, in this worker
    (process-wide, once; it stays for the worker's later tasks). Returns whether libc took it.

    Why: with batches of 65,536 rows (before ``SCAN_ROWS``), the scan's numpy temporaries (a
    few dozen arrays of 0.5 MiB) were each ``mmap``'d and unmapped by glibc, or trimmed off
    the heap's top as soon as freed (its default thresholds: 128 KiB and twice the largest
    freed map), so every batch faulted its pages in again: at 10 M records, ~290,000 minor
    faults in the scan tasks against ~35,000 with these settings, their system time 2.6 →
    1.9 s and their CPU 0.70 → 0.64 µs a record (medians of 5 runs, measured in the tasks).
    With ``SCAN_ROWS`` batches it still pays inside Spark, though not in one process (the
    scan's loop alone: 131 against 134 ms of CPU a lake file): at 10 M records, with it
    against without, the job took 11.6/12.0/13.8 against 13.2/17.2/16.3 CPU-s and its scan
    4.4/5.5/9.5 against 5.7/12.9/11.8 s (3 alternations, load 2.8-3.1: other benchmarks on
    the machine). On this VM a page the host has reclaimed costs several µs to fault in.
    The cost: a worker keeps up to ``HEAP_KEEP[0]`` of free heap. Arrow's buffers are not
    concerned (its own pool)."""
    import ctypes

    fn = getattr(ctypes.CDLL(None), "mallopt", None)
    if fn is None:  # not glibc
        return False
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    trim, mmap_ = HEAP_KEEP
    return bool(fn(M_TRIM_THRESHOLD, trim)) and bool(fn(M_MMAP_THRESHOLD, mmap_))


def _scan_task(
    layout_name: str, data_dir: str, scratch: Scratch, direct: bool
) -> Callable[[tuple[int, Unit]], tuple[list[tuple[int, ...]], list[tuple[int, int, str]]]]:
    """The scan, one call per unit, and the only decode of every record: out come, per
    (community, hour of message time), ``(sid, bucket, lo, hi, n, oldest time)`` and every
    bad record as ``(sid, index, error)`` (small: windows are planned from it); the unit's good
    records, decoded (index, time, topic, cap, framed size), in the store's order (time, then
    index), are left in an uncompressed Arrow IPC file in ``scratch`` (in memory when it has
    room: ``pipeline.scratch``) for the driver's plan and the build, which memory-map it.

    ``direct`` (the spec layout, sized by the driver): the spill holds no record bytes; the
    build reads its records from the stream again (``_reread``), each framed right after it is
    decompressed. Why: kept in the spill (framed, 3.3 GB at 10 M records), the bytes were
    written into fresh memory pages, which this VM's host must back first: the scan's system
    time was most of that (with the bytes against without, scan CPU 5.9-7.6 s against
    4.2-4.5 s at 10 M records), more than a second decompression costs (about 30 ms of CPU a
    lake file, into buffers the worker reuses). Otherwise the spill keeps each record's bytes
    (``data``), which the general path's builder takes whole."""

    def run(task: tuple[int, Unit]) -> tuple[list[tuple[int, ...]], list[tuple[int, int, str]]]:
        import pyarrow as pa

        _keep_heap()
        sid, u = task
        rows: list[tuple[int, ...]] = []
        bad: list[tuple[int, int, str]] = []
        keep: list[pa.RecordBatch] = []
        names = [*_SPILL_COLUMNS] if direct else [*_SPILL_COLUMNS, "data"]
        for idx, col in read_unit(data_dir, u, batch_rows=SCAN_ROWS):
            ts, topic, cap, bads = decode_waku_batch(layout_name, col)
            if not pa.types.is_dictionary(topic.type):  # one type for every batch of a spill
                topic = topic.dictionary_encode()
            good = np.ones(len(ts), dtype=bool)
            if bads:
                good = np.array([x is None for x in bads], dtype=bool)
                bad += [(sid, int(idx[i]), str(bads[i])) for i in np.flatnonzero(~good).tolist()]
            if not good.any():
                continue
            if not good.all():
                sel = np.flatnonzero(good)
                idx, ts, cap = idx[sel], ts[sel], cap[sel]
                topic, col = topic.take(pa.array(sel)), col.take(pa.array(sel))
            if col.type != pa.binary():
                col = col.cast(pa.binary())
            flen = _framed_len(np.diff(value_offsets(col)))
            arrays = [pa.array(idx), pa.array(ts), topic, pa.array(cap), pa.array(flen)]
            if not direct:
                arrays.append(col.cast(pa.large_binary()))
            keep.append(pa.RecordBatch.from_arrays(arrays, names=names))
            bucket = ts // BUCKET_NS
            order = np.argsort(bucket, kind="stable")
            i_, t_, bucket = idx[order], ts[order], bucket[order]
            starts = np.concatenate(([0], np.flatnonzero(np.diff(bucket) != 0) + 1))
            cols = zip(
                bucket[starts].tolist(),
                np.minimum.reduceat(i_, starts).tolist(),
                np.maximum.reduceat(i_, starts).tolist(),
                np.diff(np.concatenate((starts, [len(i_)]))).tolist(),
                np.minimum.reduceat(t_, starts).tolist(),
                strict=True,
            )
            rows += [(sid, *c) for c in cols]
        if keep:
            _write_spill(scratch, _spill_name(sid, u), keep)
        return rows, bad

    return run


def _framed_slow(chunk: pa.Array) -> pa.Array:
    """``_framed`` for what it does not handle (a record of 2 MiB or more): ``frame_parts``,
    each prefix joined to its record in Python."""
    import pyarrow as pa

    from loglake.archives import frame_parts

    parts, _ = frame_parts(chunk.to_pylist())
    return pa.array([a + b for a, b in zip(parts[0::2], parts[1::2], strict=True)], pa.binary())


def _write_spill(scratch: Scratch, name: str, batches: list[pa.RecordBatch]) -> None:
    """The batches in the store's order (time, then index; no sort when already in it) as an
    Arrow IPC file ``name`` in ``scratch`` (``Scratch.write``: a temporary name, renamed).
    Not fsynced: a spill is scratch of this run, read back by its build tasks; a crash
    discards the whole folder, and what reaches the output is staged, fsynced
    and committed by ``COMMIT`` (module docstring, steps 2-4)."""
    import pyarrow as pa

    ts = np.concatenate([b.column(1).to_numpy() for b in batches])
    idx = np.concatenate([b.column(0).to_numpy() for b in batches])
    table = pa.Table.from_batches(batches)
    if _out_of_order(ts, idx):
        table = table.take(pa.array(np.lexsort((idx, ts))))
    # the topics one dictionary for the whole file (the driver sizes archives from its codes;
    # the writer slices it along the other columns' batches and writes it once): the
    # batches' dictionaries unified; the records' bytes stay in their batches: combining
    # them was a copy of every byte
    topic = table.column(2).combine_chunks().dictionary_encode()  # (as is when encoded)
    table = table.set_column(2, "topic", pa.chunked_array([topic]))

    def write(path: str) -> None:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)

    scratch.write(name, table.nbytes, write)


def _out_of_order(ts: np.ndarray, idx: np.ndarray) -> bool:
    """Whether rows are not in the store's order (time, then index)."""
    if len(ts) < 2:
        return False
    dt = np.diff(ts)
    return bool(np.any(dt < 0) or np.any((dt == 0) & (np.diff(idx) <= 0)))


@dataclass(frozen=True)
class _BuildTask:
    """Whole consecutive windows of one community (so no window spans two tasks), and the
    units holding the index range ``[lo, hi)`` of their messages."""

    sid: int
    group: int
    windows: tuple[tuple[int, int], ...]
    units: tuple[Unit, ...]
    lo: int
    hi: int
    place: _Place | None = None
    """Where the task writes its archives when the driver sized them (``_plan_direct``)."""
    drop: tuple[int, ...] = ()
    """Stream indexes of records in its windows that are copies of an earlier one, left out
    (``_copies``)."""


@dataclass(frozen=True)
class _Place:
    """A build task's archives, sized by the driver from the spills: the staged ``data`` file
    they go into, the offset of the first, and each one's metadata and size (windows without
    a record have no archive)."""

    path: str
    offset: int
    archives: tuple[tuple[Any, int], ...]
    """``(ArchiveMetadata, size)`` per non-empty window of the task, in window order."""


def _build_task(
    layout_name: str,
    data_dir: str,
    topics: Sequence[bytes | str] | None,
    parts_dir: str,
    scratch: Scratch,
) -> Callable[[_BuildTask], dict[str, Any]]:
    """The build, one call per group of windows: the group's records taken from the scan's
    spill files of its units (memory-mapped, already decoded, in the store's order, each
    window a slice by time), with their bytes from the spill or, where the scan kept none
    (the spec layout), read from the stream again (``_reread``); then ``_build_direct``
    (archives sized by the driver, written in place) or ``_build_window`` (archives framed,
    padded, pieces hashed, bytes written to a part file); returned: sizes, hashes, entries."""

    def run(t: _BuildTask) -> dict[str, Any]:
        import pyarrow as pa

        # the sized path needs no topic (the driver put them in each archive's metadata)
        names = ["index", "ts", "flen"] if t.place is not None else ["index", "ts", "topic", "cap"]
        layout = get_layout(layout_name)
        slices = _spill_slices(scratch, t)
        if t.place is not None and _in_index_runs(slices):
            # the common case: read, framed and written as it goes
            return _build_direct(layout, t, _streamed(data_dir, slices))
        tables = []
        for u, part in slices:
            if "topic" in names:  # each spill has its own dictionary: plain values
                topic = part.column("topic")
                part = part.set_column(
                    part.column_names.index("topic"), "topic", topic.cast(topic.type.value_type)
                )
            if "data" in part.column_names:
                tables.append(part.select([*names, "data"]))
                continue
            framed = t.place is not None
            body = _reread(data_dir, u, part.column("index").to_numpy(), framed)
            tables.append(part.select(names).append_column("framed" if framed else "data", body))
        table = pa.concat_tables(tables) if tables else None
        if table is not None and len(tables) > 1:
            ts = table.column("ts").to_numpy()
            if _out_of_order(ts, table.column("index").to_numpy()):
                order = np.lexsort((table.column("index").to_numpy(), ts))  # the store's order
                table = table.take(pa.array(order))
        if t.place is not None:
            return _build_direct(layout, t, _Records.of_table(table))
        rows: list[Any] = []
        if table is not None:
            rows = list(
                zip(
                    table.column("ts").to_numpy().tolist(),
                    table.column("topic").to_pylist(),
                    table.column("data").to_pylist(),
                    table.column("cap").to_numpy().tolist(),
                    strict=True,
                )
            )
        return _build_window(layout, t.sid, t.group, list(t.windows), rows, topics, parts_dir)

    return run


def _reread(data_dir: str, u: Unit, want: np.ndarray, framed: bool) -> pa.ChunkedArray:
    """The bytes of ``u``'s records of index ``want`` (in that order: the spill's, the store's
    order), read from the stream again, ``SCAN_ROWS`` at a time (``read_unit``: a lake file's
    row groups outside ``want``'s range are skipped), each batch framed right after it is
    decompressed where ``framed`` (``frame_records``, in C; else ``_framed``, else
    ``_framed_slow``): one large binary chunk a batch, no copy when the records read are
    ``want`` itself (a whole unit in index order, none skipped as bad); else taken by
    position. A record no longer there fails the job (the stream changed under it)."""
    import pyarrow as pa

    want = np.asarray(want, dtype=np.int64)
    lo, hi = int(want.min()), int(want.max()) + 1
    idxs: list[np.ndarray] = []
    chunks: list[pa.Array] = []
    # the scan read this unit whole and checked its pages' CRCs (``read_unit_columns``)
    for idx, col in read_unit(data_dir, u, lo, hi, batch_rows=SCAN_ROWS, checked=True):
        idxs.append(idx)
        chunks.append(_frame_batch(col) if framed else col.cast(pa.large_binary()))
    got = np.concatenate(idxs) if idxs else np.zeros(0, np.int64)
    out = pa.chunked_array(chunks, pa.large_binary())
    if len(got) == len(want) and np.array_equal(got, want):
        return out
    pos = np.searchsorted(got, want)
    missing = pos >= len(got)
    missing[~missing] = got[pos[~missing]] != want[~missing]
    if missing.any():
        raise JobFailed(
            f"record {int(want[np.argmax(missing)])} of stream {u.stream!r} is gone since the "
            "scan: the stream changed during the job"
        )
    return out.take(pa.array(pos))


def _frame_batch(col: pa.Array) -> pa.Array:
    """``0x1a varint(len) record`` of every record of a batch, as large binary: in C where
    built (``frame_records``), else pyarrow (``_framed``), else per record."""
    import pyarrow as pa

    if col.type != pa.binary():
        col = col.cast(pa.binary())
    body = frame_records(col)
    if body is None:
        body = _framed(col)
    if body is None:
        body = _framed_slow(col)
    return body.cast(pa.large_binary())


def _spill_slices(scratch: Scratch, t: _BuildTask) -> list[tuple[Unit, pa.Table]]:
    """Per unit of ``t`` with records in its windows, the spill's rows of them (memory-mapped,
    in the store's order: a slice by time)."""

    frm, to = t.windows[0][0], t.windows[-1][1]
    drop = np.asarray(t.drop, dtype=np.int64)
    out = []
    for u in t.units:
        table = _read_spill(scratch, t.sid, u, drop)
        if table is None:  # no good record in this unit
            continue
        a, z = np.searchsorted(table.column("ts").to_numpy(), [frm, to], side="left").tolist()
        if z > a:
            out.append((u, table.slice(a, z - a)))
    return out


def _read_spill(
    scratch: Scratch, sid: int, u: Unit, drop: np.ndarray | None = None
) -> pa.Table | None:
    """The spill of unit ``u`` (memory-mapped), without the records of stream index ``drop``
    (sorted: the copies ``_copies`` found), or None where the unit had no good record."""
    import pyarrow as pa

    path = scratch.find(_spill_name(sid, u))
    if path is None:
        return None
    with pa.memory_map(path) as src:
        table = pa.ipc.open_file(src).read_all()
    if drop is not None and len(drop):
        a, z = np.searchsorted(drop, [u.start, u.end]).tolist()
        if z > a:
            keep = ~np.isin(table.column("index").to_numpy(), drop[a:z])
            table = table.filter(pa.array(keep))
    return table


def _copies(
    ts: np.ndarray,
    flen: np.ndarray,
    cap: np.ndarray,
    idx: np.ndarray,
    records: Callable[[np.ndarray], Any],
) -> np.ndarray:
    """The stream indexes (sorted) of the records that are a copy of a record of a lower
    index: the same bytes, a Waku message received twice. ``MessageStore.add`` keeps the
    first copy of a message, as status-go keeps one row per message hash (its docstring
    cites status-go and says why the first); this drops the same copies, so the job's
    archives stay the control node's.

    Without a pass per record: only records whose time, framed size and cap all equal
    another's can be copies; they are found with numpy over the spills' columns (an argsort
    of the times, which the spills hold in sorted runs, then one sort of the few records
    sharing a time, by time and a 64-bit mix of size and cap: a collision of the mix only
    reads a record more), and only those are read (``records(positions)``, positions sorted:
    their bytes in that order) and grouped by their bytes (Arrow's hash grouping)."""
    import pyarrow as pa

    none = np.zeros(0, dtype=np.int64)
    if len(ts) < 2:
        return none
    order = np.argsort(ts, kind="stable")
    shared = _with_an_equal_neighbour(ts[order])
    if not shared.any():
        return none
    cand = order[shared]  # in time order
    ct = ts[cand]
    rank = np.concatenate(([0], np.cumsum(ct[1:] != ct[:-1]))).astype(np.uint64)
    with np.errstate(over="ignore"):
        mix = flen[cand].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ cap[cand].astype(
            np.uint64
        ) * np.uint64(0xC2B2AE3D27D4EB4F)
    # past 2**24 shared times the ranks wrap and keys of other times may meet: only a record
    # more is read (equal records always have equal keys)
    key = (rank << np.uint64(40)) | (mix >> np.uint64(24))
    by = np.argsort(key, kind="stable")  # sorted by rank already: cheap
    sel = _with_an_equal_neighbour(key[by])
    if not sel.any():
        return none
    pos = np.sort(cand[by[sel]])
    table = pa.table({"data": records(pos), "index": pa.array(idx[pos])})
    first = table.group_by("data", use_threads=False).aggregate([("index", "min")])
    return np.setdiff1d(idx[pos], first.column("index_min").to_numpy())


def _in_index_runs(slices: Sequence[tuple[Unit, pa.Table]]) -> bool:
    """Whether a task's records, in the store's order (time, then index), are each unit's
    records of one index range, units in order: then reading each range in index order gives
    them in the order the archives hold them (``_streamed``). Not so where a record was
    skipped as bad or message times run against the index."""
    idx = [np.asarray(p.column("index").to_numpy()) for _, p in slices]
    if not idx or any(not len(i) or not bool(np.all(np.diff(i) == 1)) for i in idx):
        return False
    ts = np.concatenate([p.column("ts").to_numpy() for _, p in slices])
    return not _out_of_order(ts, np.concatenate(idx))


@dataclass
class _Records:
    """A build task's records in the store's order, as ``_build_direct`` takes them: each
    one's time and framed size (from the spills), and ``framed(a, z)``: the framed bytes of
    records ``[a, z)`` as buffers, asked for in order, each range once."""

    ts: np.ndarray
    flen: np.ndarray
    framed: Callable[[int, int], Iterator[Any]]

    @staticmethod
    def of_table(table: pa.Table | None) -> _Records:
        """Records held in memory: a table with ``ts``, ``flen`` and ``framed`` (slices of its
        chunks, no copy)."""
        if table is None:
            empty = np.zeros(0, np.int64)
            return _Records(empty, empty, lambda a, z: iter(()))
        col = table.column("framed")
        return _Records(
            table.column("ts").to_numpy(),
            table.column("flen").to_numpy(),
            lambda a, z: (_data_view(c) for c in col.slice(a, z - a).chunks),
        )


def _streamed(data_dir: str, slices: Sequence[tuple[Unit, pa.Table]]) -> _Records:
    """Records in index runs (``_in_index_runs``) read from the stream as ``_build_direct``
    asks for them: each unit's range through ``read_unit``, ``SCAN_ROWS`` at a time, each
    batch framed right after it is decompressed (``_frame_batch``) and handed over as it is.

    Why: read whole before the build (``_reread``), a task's records (about 150 MB) were
    decompressed and framed while its disk sat idle, then written while its core did
    little but hash. Streamed, the writer thread (``_DirectWriter``) writes one buffer while
    the core decompresses, frames and hashes the next. A record that is not the one the spill
    holds at its place (the stream changed under the job) fails the job."""
    want = np.concatenate([np.asarray(p.column("index").to_numpy()) for _, p in slices])

    def batches() -> Iterator[tuple[np.ndarray, pa.Array]]:
        for u, p in slices:
            idx = p.column("index").to_numpy()
            lo, hi = int(idx[0]), int(idx[-1]) + 1
            for got, col in read_unit(data_dir, u, lo, hi, SCAN_ROWS, checked=True):
                yield got, _frame_batch(col)

    source = batches()
    left: list[Any] = []  # the rest of a batch a range ended in: (indexes, framed)
    at = [0]  # the next record the source gives

    def framed(a: int, z: int) -> Iterator[Any]:
        first = at[0]
        at[0] = z
        while first < z:
            got, body = left.pop() if left else next(source, (None, None))
            if got is None or body is None:
                raise JobFailed(f"records {first}..{z} of a build task are gone since the scan")
            k = min(z - first, len(got))
            if not np.array_equal(got[:k], want[first : first + k]):
                raise JobFailed(
                    f"record {int(want[first])} is not where the scan saw it: the stream "
                    "changed during the job"
                )
            if k < len(got):
                left.append((got[k:], body.slice(k)))
            if first + k > a:  # records before a: in no window of the task, skipped
                skip = max(0, a - first)
                yield _data_view(body.slice(skip, k - skip))
            first += k

    ts = np.concatenate([p.column("ts").to_numpy() for _, p in slices])
    flen = np.concatenate([p.column("flen").to_numpy() for _, p in slices])
    return _Records(ts, flen, framed)


def _plan_direct(
    root: Path,
    layout: Layout,
    states: list[_State],
    windows: Mapping[int, list[tuple[int, int]]],
    tasks: list[_BuildTask],
    units: Mapping[int, list[Unit]],
    scratch: Scratch,
    drops: Mapping[int, np.ndarray],
) -> tuple[list[_BuildTask], dict[int, Path]]:
    """Every archive of the spec layout sized before any is built, from the spills' time,
    framed size and topic codes (memory-mapped; no record bytes read): per window its
    metadata (the window's topics, sorted) and size (the layout's head + framed records +
    ``padding_field``); then each task's offset by prefix sum, and the community's staged
    ``data`` made that long (``_open_stage``). The tasks come back with their ``_Place``;
    a community whose head is not the shape this assumes keeps the part files."""

    from loglake.archives import ArchiveMetadata, padding_field, topics_within_bounds

    staged: dict[int, Path] = {}
    out: list[_BuildTask] = []
    by_sid: dict[int, list[_BuildTask]] = {}
    for t in tasks:
        by_sid.setdefault(t.sid, []).append(t)
    for sid, ts_ in by_sid.items():
        ws = windows[sid]
        frm = np.array([w[0] for w in ws], dtype=np.int64)
        to = np.array([w[1] for w in ws], dtype=np.int64)
        body = np.zeros(len(ws), dtype=np.int64)
        count = np.zeros(len(ws), dtype=np.int64)
        topics: list[set[Any]] = [set() for _ in ws]
        for u in units[sid]:
            table = _read_spill(scratch, sid, u, drops.get(sid))
            if table is None:  # no good record in this unit
                continue
            ts = table.column("ts").to_numpy()
            csum = np.zeros(len(ts) + 1, dtype=np.int64)
            np.cumsum(table.column("flen").to_numpy(), out=csum[1:])
            a, z = np.searchsorted(ts, frm, side="left"), np.searchsorted(ts, to, side="left")
            body += csum[z] - csum[a]
            count += z - a
            topic = table.column("topic").combine_chunks()
            codes = topic.indices.to_numpy()
            names = topic.dictionary.to_pylist()
            for k in np.flatnonzero(z > a).tolist():
                # the codes a window holds, by counting (a pass over them) rather than
                # np.unique (a sort of them): the driver does this alone, for every record
                held = np.bincount(codes[a[k] : z[k]], minlength=len(names))
                topics[k].update(names[c] for c in np.flatnonzero(held).tolist())
        sizes: dict[int, tuple[Any, int]] = {}
        for k in np.flatnonzero(count).tolist():
            if not topics_within_bounds(topics[k]):
                # a topic past an archive's bounds: some records are left out, which the
                # sized path cannot do (it writes every record of a window): part files
                break
            meta = ArchiveMetadata(
                ws[k][0], ws[k][1], tuple(sorted(topics[k])), layout.archive_version
            )
            empty = layout.encode_archive(meta, [], 0)
            if len(empty.parts) != 2 or empty.trailing_zeros:
                break  # not the shape _build_direct writes: part files for this community
            n = len(empty.parts[0]) + int(body[k])
            sizes[k] = (meta, n + len(padding_field(n, layout.piece_length)))
        else:
            index = {w: k for k, w in enumerate(ws)}
            base = states[sid].indexed_end
            for t in ts_:
                archives = tuple(sizes[index[w]] for w in t.windows if index[w] in sizes)
                out.append(dataclasses.replace(t, place=_Place("", base, archives)))
                base += sum(size for _, size in archives)
            stage = _open_stage(root, states[sid], base)
            staged[sid] = stage
            path = str(stage / "data")
            out[-len(ts_) :] = [
                dataclasses.replace(t, place=dataclasses.replace(t.place, path=path))
                for t in out[-len(ts_) :]
                if t.place is not None
            ]
            continue
        out += ts_
    return out, staged


def _with_an_equal_neighbour(values: np.ndarray) -> np.ndarray:
    """Which of ``values`` (sorted) equal the value before or after them."""
    eq = values[1:] == values[:-1]
    out = np.zeros(len(values), dtype=bool)
    out[1:] |= eq
    out[:-1] |= eq
    return out


def _community_copies(
    data_dir: str, scratch: Scratch, sid: int, units: Sequence[Unit], frm: int, to: int
) -> np.ndarray:
    """``_copies`` among a community's records of time ``[frm, to)`` (the windows to build:
    a copy has its original's time, so both are in one window): from the scan's spills,
    the few records compared read from the spill (general path) or the stream again (the
    spec layout's spills hold no bytes: ``_reread``)."""
    import pyarrow as pa

    parts: list[tuple[Unit, pa.Table]] = []
    for u in units:
        table = _read_spill(scratch, sid, u)
        if table is None:
            continue
        a, z = np.searchsorted(table.column("ts").to_numpy(), [frm, to], side="left").tolist()
        if z > a:
            parts.append((u, table.slice(a, z - a)))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    starts = np.cumsum([0] + [p.num_rows for _, p in parts])

    def col(name: str) -> np.ndarray:
        cols = [p.column(name).to_numpy() for _, p in parts]
        return np.concatenate(cols).astype(np.int64, copy=False)

    def records(pos: np.ndarray) -> pa.ChunkedArray:
        chunks: list[pa.Array] = []
        for k, (u, p) in enumerate(parts):
            a, z = np.searchsorted(pos, starts[k : k + 2]).tolist()
            if z <= a:
                continue
            at = pos[a:z] - starts[k]
            if "data" in p.column_names:
                chunks += p.column("data").take(pa.array(at)).chunks
            else:
                want = p.column("index").to_numpy()[at]
                chunks += _reread(data_dir, u, want, framed=False).chunks
        return pa.chunked_array(chunks, pa.large_binary())

    # the times alone first: with no two records at one time (nanosecond times: the spec
    # layout's) there is no copy, and the other columns are never read (at 10M records,
    # reading all four from the spills took 1.2 s of the driver)
    if not _times_shared([p.column("ts").to_numpy() for _, p in parts]):
        return np.zeros(0, dtype=np.int64)
    return _copies(col("ts"), col("flen"), col("cap"), col("index"), records)


def _times_shared(runs: list[np.ndarray]) -> bool:
    """Whether two of the times in ``runs`` (each sorted: a spill's slice) are equal: each run
    checked against itself, and the runs against each other only where their spans overlap
    (then all of them at once, sorted: the runs of a stream's units mostly follow each other
    in time, so that is rare)."""
    runs = [r for r in runs if len(r)]
    if any(bool((r[1:] == r[:-1]).any()) for r in runs):
        return True
    spans = sorted((int(r[0]), int(r[-1])) for r in runs)
    if all(b[0] > a[1] for a, b in itertools.pairwise(spans)):
        return False
    return bool(_with_an_equal_neighbour(np.sort(np.concatenate(runs), kind="stable")).any())


def _in_groups(items: Sequence[Any], sizes: Sequence[int], n: int) -> list[list[Any]]:
    """``items`` in at most ``n`` groups of about equal total size (largest first into the
    lightest group), each group one Spark task: a task costs a closure unpickled in a Python
    worker, so a hundred small streams should not make a hundred tasks."""
    n = max(1, min(n, len(items)))
    groups: list[list[Any]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(items)), key=lambda i: -sizes[i]):
        g = load.index(min(load))
        groups[g].append(items[i])
        load[g] += sizes[i]
    return [g for g in groups if g]


def _group_windows(
    sid: int,
    ws: Sequence[tuple[int, int]],
    buckets: Mapping[int, list[int]],
    units: Sequence[Unit],
    target: int,
) -> list[_BuildTask]:
    """Consecutive windows grouped into tasks of about ``target`` records (whole windows);
    each task's index range from the hour buckets its windows overlap (a bucket may straddle
    two windows: both tasks read it, each keeps its own windows' messages). Windows without a
    message get no task (the driver still consumes them)."""
    out: list[_BuildTask] = []
    cur: list[tuple[int, int]] = []
    lo: int | None = None
    hi = n = 0

    def flush() -> None:
        nonlocal cur, lo, hi, n
        if cur and lo is not None:
            us = tuple(u for u in units if u.end > lo and u.start < hi)
            out.append(_BuildTask(sid, len(out), tuple(cur), us, lo, hi))
        cur, lo, hi, n = [], None, 0, 0

    by_bucket = sorted(buckets.items())
    keys = [b for b, _ in by_bucket]

    for frm, to in ws:
        a = bisect.bisect_left(keys, frm // BUCKET_NS)
        z = bisect.bisect_right(keys, (to - 1) // BUCKET_NS)
        vals = [v for _, v in by_bucket[a:z]]
        if not vals:
            continue
        wl, wh = min(v[0] for v in vals), max(v[1] for v in vals) + 1
        wn = sum(v[2] for v in vals)
        if cur and n + wn > target:
            flush()
        cur.append((frm, to))
        lo = wl if lo is None else min(lo, wl)
        hi, n = max(hi, wh), n + wn
    flush()
    return out


def _build_window(
    layout: Layout,
    sid: int,
    w: int,
    windows: list[tuple[int, int]],
    rows: list[Any],
    topics: Sequence[bytes | str] | None,
    parts_dir: str,
) -> dict[str, Any]:
    """``ArchiveBuilder.build`` of a task's windows (its own builder, so offsets are
    task-local and the hashes are its pieces; ``rows`` in the store's order, time then index),
    the archive bytes written to a part file; returns sizes, piece hashes and the entries'
    (metadata, local offset, size, padding)."""
    builder = ArchiveBuilder(layout, "")
    result = builder.build(windows, rows, topics, presorted=True)
    path = os.path.join(parts_dir, f"{sid}-{w}")
    if result.archives:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for a in result.archives:
                fs.writev_all(fd, a.parts)  # no copy of each buffer (as writelines makes)
                if a.trailing_zeros:
                    fs.write_all(fd, bytes(a.trailing_zeros))
        finally:
            os.close(fd)
    entries = [
        (a.entry.metadata, a.entry.offset, a.entry.size, a.entry.padding) for a in result.archives
    ]
    return {
        "sid": sid,
        "w": w,
        "path": path if result.archives else "",
        "nbytes": builder.data_size,
        "hashes": b"".join(builder.hashes.hashes),
        "entries": pickle.dumps(entries),
        "records": len(rows),
        "topic_skipped": result.topic_skipped,
    }


def _framed(chunk: pa.Array) -> pa.Array | None:
    """``0x1a varint(len) record`` of every record of a binary column, as one binary array
    whose data buffer is their concatenation (``frame_parts`` of the records, joined), built
    in C: prefixes with numpy, joined to the records by ``binary_join_element_wise``. None
    for what it does not handle (not plain binary, a record of 2 MiB or more)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(chunk)
    if chunk.type != pa.binary() or chunk.null_count:
        return None
    lens = np.diff(value_offsets(chunk)).astype(np.int64)
    if n and int(lens.max()) >= 1 << 21:
        return None
    pre = 2 + (lens >= 1 << 7).astype(np.int64) + (lens >= 1 << 14)  # tag + varint bytes
    poffs = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(pre, out=poffs[1:])
    pdata = np.zeros(int(poffs[-1]), dtype=np.uint8)
    at = poffs[:-1].astype(np.int64)
    pdata[at] = 0x1A
    v = lens.copy()
    for k in (1, 2, 3):  # varint byte k-1, continuation bit when another follows
        m = pre > k
        pdata[at[m] + k] = ((v & 0x7F) | np.where(pre > k + 1, 0x80, 0))[m]
        v >>= 7
    prefixes = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(poffs), pa.py_buffer(pdata)]
    )
    out: pa.Array = pc.binary_join_element_wise(prefixes, chunk, pa.scalar(b"", pa.binary()))
    return out


def _data_view(framed: pa.Array) -> memoryview:
    """The concatenated values of a binary or large binary array (its data buffer between its
    first and last offsets)."""
    offs = value_offsets(framed)
    a, z = int(offs[0]), int(offs[-1])
    buf = framed.buffers()[2]
    return memoryview(buf)[a:z] if buf is not None else memoryview(b"")


def _build_direct(layout: Layout, t: _BuildTask, records: _Records) -> dict[str, Any]:
    """The archives of a task the driver sized (``_plan_direct``), written straight into the
    staged ``data`` at their offsets: per window, the layout's head for the metadata the
    driver chose, the records framed (``_reread``: slices of its ``framed`` chunks, no copy)
    and ``padding_field``; written direct (``_DirectWriter``: each
    piece hashed as it is copied into the aligned buffer) or hashed from those buffers and
    written in one ``pwritev`` per archive. The same bytes as ``ArchiveBuilder.build`` (one
    archive per non-empty window, its topics sorted); an archive whose size is not the
    planned one (the stream or the spills changed under the job) fails the job. Why: part
    files copied into the staged ``data`` wrote every byte twice, and at 10 M records the
    copies reached the disk."""
    from loglake.archives import padding_field

    assert t.place is not None
    place = t.place
    hashes = PieceHashes(layout.piece_length)
    ts = records.ts
    entries: list[tuple[Any, int, int, int]] = []
    todo = iter(place.archives)
    fd = _open_direct(place.path, place.offset, layout.piece_length)
    direct = _DirectWriter(fd, layout.piece_length) if fd is not None else None
    if fd is None:
        fd = os.open(place.path, os.O_WRONLY)
    try:
        for frm, to in t.windows:
            a, z = np.searchsorted(ts, [frm, to], side="left").tolist()
            if z <= a:
                continue
            planned = next(todo, None)
            if planned is None:
                raise JobFailed(
                    f"window {frm}..{to} has records the plan did not count: the scan's spill "
                    "changed during the job"
                )
            meta, size = planned
            head = layout.encode_archive(meta, [], 0).parts[0]
            want = int(records.flen[a:z].sum())
            pad = padding_field(len(head) + want, layout.piece_length)
            if len(head) + want + len(pad) != size:
                raise JobFailed(
                    f"archive of window {frm}..{to} is {len(head) + want + len(pad)} bytes, "
                    f"planned {size}: the scan's spill changed during the job"
                )
            seen = [0]

            def counted(parts: Iterator[Any], seen: list[int] = seen) -> Iterator[Any]:
                for part in parts:
                    seen[0] += len(part)
                    yield part

            body = itertools.chain([head], counted(records.framed(a, z)), [pad])
            off = place.offset + hashes.data_size
            if direct is not None:
                direct.write(body, off, hashes)
            else:
                parts = list(body)
                hashes.extend_parts(parts, size, 0)
                _pwritev_all(fd, parts, off)
                _start_writeback(fd, off, size)
            if seen[0] != want:
                raise JobFailed(
                    f"window {frm}..{to}: {seen[0]} bytes of records, the scan counted {want}: "
                    "the stream changed during the job"
                )
            entries.append((meta, off - place.offset, size, 0))
        if direct is not None:
            direct.wait()
    finally:
        if direct is not None:
            direct.settle()  # no write may still use fd once it is closed
        os.close(fd)
    if next(todo, None) is not None:
        raise JobFailed(f"task {t.group} of stream {t.sid} built fewer archives than planned")
    return {
        "sid": t.sid,
        "w": t.group,
        "path": "",
        "nbytes": hashes.data_size,
        "hashes": b"".join(hashes.hashes),
        "entries": pickle.dumps(entries),
        "records": len(ts),
    }


def _start_writeback(fd: int, offset: int, count: int) -> bool:
    """Start writing an archive the task just wrote to the disk, without waiting for it
    (``fs.start_writeback``).

    Why: the staged ``data`` must reach the disk before ``COMMIT`` (the driver fsyncs it), and
    the kernel starts writing dirty pages back only past its background threshold or after
    30 s; the driver's fsync then waited alone for most of the file while the executors sat
    idle (about 3 s of the stage at 10 M messages). Written back as the tasks go, the disk
    works while they hash and write the next archives, and the fsync finds little left (with
    the spills on disk it competed with their write-out and was slower; they are in memory
    now: ``pipeline.scratch``). Only a hint: durability still comes from the driver's fsync,
    so an error here changes nothing. Returns whether the kernel took it."""
    return count > 0 and fs.start_writeback(fd, offset, count)


DIRECT_ALIGN = 4096
"""What ``O_DIRECT`` needs of a write's offset, length and buffer address here: a page
(every block size Linux file systems use divides it)."""
DIRECT_CHUNK = 8 << 20
"""Bytes a direct write takes at a time (rounded down to whole pieces): the archive's bytes are
copied into one of two buffers this size (page-aligned, kept by the worker) and written from
it while the other is filled (``_DirectWriter``)."""


def _open_direct(path: str, offset: int, piece_length: int) -> int | None:
    """``path`` opened for writes that bypass the page cache (``O_DIRECT``), or None where
    they cannot be used: a platform or file system without it (tmpfs refuses it), or archives
    that do not start and end on ``DIRECT_ALIGN`` (every archive is whole pieces from
    ``offset``, so both hold when they do).

    Why: written through the page cache, the build's 3.3 GB at 10 M records needed as much
    fresh page cache, and on this project's VM a page the host has to back first costs far
    more than the copy (the build waited in ``pwritev``: 7.4–8.8 s against 2.6 s written
    direct, same bytes). The archives are read again only by seeding peers, from the disk."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or offset % DIRECT_ALIGN or piece_length % DIRECT_ALIGN:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:
        return None


@functools.cache
def _direct_buffers(size: int) -> tuple[memoryview, memoryview]:
    """The worker's two ``size`` buffers for ``_DirectWriter``: anonymous maps, so
    page-aligned, reused by every archive (their pages touched once)."""
    import mmap

    return memoryview(mmap.mmap(-1, size)), memoryview(mmap.mmap(-1, size))


@functools.cache
def _direct_writer_thread() -> Any:
    """The worker's one thread for ``_DirectWriter``'s writes (a ``ThreadPoolExecutor`` of
    one: a task's writes stay in order, and ``pwrite`` runs without the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(1, thread_name_prefix="archives-build-direct")


class _DirectWriter:
    """A build task's archives written past the page cache through ``fd`` (``_open_direct``):
    each archive's parts copied a piece at a time into one of two aligned buffers, each
    piece hashed (SHA-1, into ``PieceHashes``) right after it is copied, and each full
    buffer (``DIRECT_CHUNK`` rounded down to whole pieces) written by the worker's writer
    thread while the other one is filled. ``wait`` (before the task's result) returns when
    every write is done and raises the first write's error; ``settle`` waits for a write
    still running without raising (before ``fd`` is closed on an error).

    Why: hashed from the spills and then copied from them, every archive byte was read twice
    from memory (3.3 GB each at 10 M records), the second time long out of the CPU's cache;
    copied first, a piece is hashed from the cache. And a direct write waits for the device:
    with the copy, the hashing and the write one after the other, each core sat idle during
    its writes; with the writes on their own thread, the disk writes one buffer while the
    core hashes the next. The driver's fsync before ``COMMIT`` still flushes the device's
    cache."""

    def __init__(self, fd: int, piece_length: int) -> None:
        self.fd = fd  # pieces are whole blocks (``_open_direct``): so is every buffer
        self.chunk = piece_length * max(1, DIRECT_CHUNK // piece_length)
        self.buffers = _direct_buffers(self.chunk)
        self.turn = 0
        self.pending: Any = None

    def write(self, parts: Iterable[Any], offset: int, hashes: PieceHashes) -> None:
        """``parts`` (an archive: whole pieces, at ``offset``: aligned) hashed into ``hashes``
        and written; an archive that is not whole pieces raises ``JobFailed`` before its last
        partial buffer is written."""
        import hashlib

        plen, sha1, out = hashes.piece_length, hashlib.sha1, hashes.hashes
        mv, fill = self.buffers[self.turn], 0
        for part in parts:
            p = memoryview(part).cast("B")
            i, size = 0, len(p)
            while i < size:
                n = min(size - i, plen - fill % plen)
                mv[fill : fill + n] = p[i : i + n]
                fill += n
                i += n
                if fill % plen == 0:
                    out.append(sha1(mv[fill - plen : fill]).digest())
                    if fill == self.chunk:
                        self._submit(mv, offset)
                        offset += fill
                        mv, fill = self.buffers[self.turn], 0
        if fill % plen:
            raise JobFailed(f"an archive is not whole {plen}-byte pieces: {fill % plen} left")
        if fill:
            self._submit(mv[:fill], offset)

    def _submit(self, buf: memoryview, offset: int) -> None:
        """``buf`` written at ``offset`` by the writer thread, once the write before it is
        done (that one's buffer is the next to be filled)."""
        self.wait()
        self.pending = _direct_writer_thread().submit(fs.pwrite_all, self.fd, buf, offset)
        self.turn ^= 1

    def wait(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def settle(self) -> None:
        with contextlib.suppress(Exception):
            self.wait()


def _pwritev_all(fd: int, parts: Sequence[Any], offset: int) -> None:
    """``parts`` written at ``offset`` with ``pwritev`` (``IOV_MAX`` buffers a call; a short
    write continues from where it stopped). A task's archives go to their own offsets in the
    one staged file, so tasks need no order among them."""
    start = 0
    while start < len(parts):
        group = parts[start : start + fs.IOV_MAX]
        want = sum(map(len, group))
        n = os.pwritev(fd, group, offset)
        if n <= 0 and want:
            raise OSError(f"pwritev returned {n}")
        offset += n
        if n == want:
            start += len(group)
            continue
        for i, part in enumerate(group):  # short: finish the part it stopped in
            k = len(part)
            if n < k:
                fs.pwrite_all(fd, memoryview(part)[n:], offset)
                offset += k - n
                start += i + 1
                break
            n -= k


# -- driver: state of a community's files ------------------------------------------------------


@dataclass
class _State:
    community: Community
    folder: Path
    entries: list[IndexEntry]
    indexed_end: int
    """End of the last indexed archive in ``data`` (bytes beyond it are a torn tail)."""
    start_ns: int | None
    """Where the next window starts (None: at the oldest message)."""


def _store_end(root: Path, cid: str) -> int | None:
    """The last window end a control node recorded in its store (``archives build`` keeps it
    at ``<root>/<community id>.sqlite``), read-only: it may be later than the index's last
    archive when the node consumed empty windows."""
    path = root / f"{cid}.sqlite"
    if not path.exists():
        return None
    try:  # apsw, as the store: two SQLite libraries on one file in one process can drop
        # each other's POSIX locks (sqlite.org/howtocorrupt.html §2.2.1)
        db = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            rows = db.execute("SELECT value FROM meta WHERE key='last_archive_end_ns'").fetchall()
        finally:
            db.close()
    except apsw.Error:
        return None
    return int(str(rows[0][0])) if rows else None  # meta values are TEXT


def _load_state(root: Path, c: Community, layout: Layout) -> _State:
    folder = root / c.community_id
    entries: list[IndexEntry] = []
    index_path = folder / "index"
    if index_path.exists():
        entries = layout.decode_index(index_path.read_bytes())
    end = entries[-1].offset + entries[-1].size if entries else 0
    data_path = folder / "data"
    size = data_path.stat().st_size if data_path.exists() else 0
    if size < end:
        raise JobFailed(f"{data_path} holds {size} bytes, its index describes {end}")
    ends = [t for t in (_store_end(root, c.community_id),) if t is not None]
    ends += [max(e.metadata.to_ns for e in entries)] if entries else []
    return _State(c, folder, entries, end, max(ends) if ends else None)


# -- driver: staging and commit --------------------------------------------------------------


def _copy_range(src_fd: int, dst_fd: int, count: int, src_off: int = 0) -> None:
    """``count`` bytes of ``src_fd`` from ``src_off`` appended to ``dst_fd``, in the kernel."""
    done = 0
    while done < count:
        n = os.copy_file_range(src_fd, dst_fd, count - done, src_off + done)
        if n <= 0:
            raise JobFailed(f"copy_file_range returned {n} with {count - done} bytes left")
        done += n


def _write_file(path: Path, data: bytes) -> None:
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fs.write_all(fd, data)
        fs.fsync(fd)
    finally:
        fs.close(fd)


def _targets(root: Path, cid: str) -> dict[str, Path]:
    """Staged file name → where the commit puts it (in commit order: ``data`` first)."""
    return {
        "data": root / cid / "data",
        "index": root / cid / "index",
        "torrent": root / f"{cid}.torrent",
        "magnet": root / f"{cid}.magnet",
    }


def commit_staged(root: Path, stage: Path) -> None:
    """Roll a staged build with ``COMMIT`` forward (idempotent): rename each staged file into
    place, in order, fsync'ing each folder; then drop the staging folder."""
    plan = json.loads((stage / COMMIT).read_text())
    cid = plan["community_id"]
    fs.makedirs_durable(root / cid)
    for name, dest in _targets(root, cid).items():
        src = stage / name
        if src.exists():
            fs.replace(src, dest)
            fs.fsync_dir(dest.parent)
    shutil.rmtree(stage)
    fs.fsync_dir(stage.parent)


def recover(root: Path) -> int:
    """Roll forward the committed builds of a killed run; drop everything else it staged."""
    base = root / STAGING_DIR
    if not base.is_dir():
        return 0
    done = 0
    for d in sorted(base.iterdir()):
        if d.is_dir() and not d.name.startswith(PARTS_PREFIX) and (d / COMMIT).exists():
            commit_staged(root, d)
            done += 1
        else:
            shutil.rmtree(d, ignore_errors=True)
    fs.fsync_dir(base)
    return done


@contextlib.contextmanager
def job_lock(root: Path) -> Iterator[None]:
    """One archives-build job per ``root`` at a time (``flock``); a second fails at once."""
    with one_job(root / LOCK, f"archives-build: another job is running on {root}"):
        yield


def _open_stage(root: Path, st: _State, size: int | None = None) -> Path:
    """A new staging folder for the community, its ``data`` holding the live ``data`` up to
    the end of its last indexed archive (a kernel copy), extended to ``size`` bytes if given
    (the build tasks then write their archives into it at their offsets)."""
    stage = root / STAGING_DIR / st.community.community_id
    shutil.rmtree(stage, ignore_errors=True)
    fs.makedirs_durable(stage)
    fd = fs.open(stage / "data", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if st.indexed_end:
            src = os.open(st.folder / "data", os.O_RDONLY)
            try:
                _copy_range(src, fd, st.indexed_end)
            finally:
                os.close(src)
        if size is not None:
            os.ftruncate(fd, size)
    finally:
        fs.close(fd)
    return stage


def _stage_community(
    root: Path,
    st: _State,
    layout: Layout,
    rows: list[Any],
    end_ns: int,
    announce: tuple[str, ...] | None,
    report: CommunityReport,
    staged: Path | None = None,
) -> Path | None:
    """Offsets by prefix sum, index, torrent, magnet; stage the new files and ``COMMIT``.
    None when the build adds no archive (nothing to write, as for ``ControlNode``).
    ``staged``: the staging folder whose ``data`` the build tasks already wrote."""
    cid = st.community.community_id
    new: list[IndexEntry] = []
    new_hashes: list[bytes] = []
    base = st.indexed_end
    for r in rows:
        for meta, local, size, padding in pickle.loads(r["entries"]):
            new.append(layout.make_entry(meta, base + local, size, padding))
        h = r["hashes"]
        new_hashes += [h[i : i + 20] for i in range(0, len(h), 20)]
        base += r["nbytes"]
    if not new:
        return None
    hashes = PieceHashes(layout.piece_length)
    data_path = st.folder / "data"
    if st.indexed_end:
        with open(data_path, "rb") as f:  # earlier pieces, as ControlNode._load hashes them
            left = st.indexed_end
            while left:
                chunk = f.read(min(left, layout.piece_length * 256))
                hashes.extend(chunk)
                left -= len(chunk)
    hashes.hashes += new_hashes
    builder = ArchiveBuilder(layout, cid, st.entries + new, hashes, end_ns, announce)
    index = layout.encode_index(builder.entries)
    torrent = builder.torrent(index)
    if staged is not None:  # the build tasks wrote every archive into it (_plan_direct)
        stage = staged
        fd = fs.open(stage / "data", os.O_WRONLY)
    else:
        stage = _open_stage(root, st)
        fd = fs.open(stage / "data", os.O_WRONLY)
        os.lseek(fd, 0, os.SEEK_END)  # (not O_APPEND: copy_file_range refuses such a file)
    try:
        for r in rows:
            if r["path"]:
                require_visible(r["path"], "archives-build", "--root")
                src = os.open(r["path"], os.O_RDONLY)
                try:
                    _copy_range(src, fd, r["nbytes"])
                finally:
                    os.close(src)
                # copied: its pages not yet written back are dropped, not written to disk
                os.unlink(r["path"])
        if os.fstat(fd).st_size != hashes.data_size:
            raise JobFailed(f"staged data of {cid} is not {hashes.data_size} bytes")
        fs.fsync(fd)
    finally:
        fs.close(fd)
    magnet = torrent.magnet(cid)
    _write_file(stage / "index", index)
    _write_file(stage / "torrent", torrent.metainfo())
    _write_file(stage / "magnet", (magnet + "\n").encode())
    fs.fsync_dir(stage)
    report.new_archives = len(new)
    report.appended_bytes = hashes.data_size - st.indexed_end
    report.data_bytes = hashes.data_size
    report.info_hash = torrent.info_hash
    report.magnet = magnet
    return stage


# -- the job ---------------------------------------------------------------------------------


@raises_task_errors
def run(
    spark: SparkSession,
    opts: ArchivesBuildOptions,
    progress: Progress | None = None,
    fault: Fault | None = None,
) -> ArchivesBuildReport:
    """Recover a killed run, plan windows, build them on Spark, stage, commit."""
    root = Path(opts.root).resolve()
    fs.makedirs_durable(root)
    with job_lock(root):
        return _run(
            spark, opts, root, progress or (lambda s, d, t: None), fault or (lambda p: None)
        )


def _run(
    spark: SparkSession,
    opts: ArchivesBuildOptions,
    root: Path,
    progress: Progress,
    fault: Fault,
) -> ArchivesBuildReport:
    t0 = time.perf_counter()
    report = ArchivesBuildReport()
    report.recovered = recover(root)
    layout = get_layout(opts.layout)
    now = time.time_ns() if opts.now_ns is None else opts.now_ns
    states = [_load_state(root, c, layout) for c in opts.communities]
    report.communities = [CommunityReport(c.stream, c.community_id) for c in opts.communities]

    # the streams' records as units (lake files, live ranges), planned here from metadata
    streams = {sid: c.stream for sid, c in enumerate(opts.communities)}
    units = plan_units(opts.data_dir, streams)
    sc = spark.sparkContext

    # pass 1 (executors): every record read and decoded where it lies; per community
    # and hour of message time, the index range of its messages; bad records. Small,
    # collected. The decoded records stay in spill files for pass 2: in memory when it has
    # room (``pipeline.scratch``), else beside the part files of the general path.
    job = uuid.uuid4().hex[:12]
    parts_dir = root / STAGING_DIR / f"{PARTS_PREFIX}{job}"
    fs.makedirs_durable(parts_dir)
    key = scratch_key("archives-build", root)
    clear_stale(key)  # a killed run's memory spills (this run holds root's lock)
    scratch = open_scratch(parts_dir, key, job, opts.scratch, (sc.master or "").startswith("local"))
    try:
        return _scan_build_stage(
            sc,
            opts,
            root,
            layout,
            states,
            report,
            units,
            now,
            parts_dir,
            scratch,
            job,
            progress,
            fault,
            t0,
        )
    finally:
        scratch.remove()


def _scan_build_stage(
    sc: Any,
    opts: ArchivesBuildOptions,
    root: Path,
    layout: Layout,
    states: list[_State],
    report: ArchivesBuildReport,
    units: dict[int, list[Unit]],
    now: int,
    parts_dir: Path,
    scratch: Scratch,
    job: str,
    progress: Progress,
    fault: Fault,
    t0: float,
) -> ArchivesBuildReport:
    """Both passes, staging and commit (``_run`` owns ``parts_dir`` and removes it)."""
    all_sids = list(range(len(states)))
    slots = 4 * max(1, sc.defaultParallelism)
    progress("scan", 0, 1)
    scan_tasks = [(sid, u) for sid in all_sids for u in units[sid]]
    # the spec layout's records spilled framed, ready to be written (``_plan_direct``)
    direct = opts.topics is None and layout.max_archive_bytes is None
    scan = _scan_task(opts.layout, opts.data_dir, scratch, direct)
    groups = _in_groups(scan_tasks, [u.end - u.start for _, u in scan_tasks], slots)
    summary = (
        sc.parallelize(groups, len(groups)).flatMap(lambda g: [scan(x) for x in g]).collect()
        if scan_tasks
        else []
    )
    progress("scan", 1, 1)
    buckets: dict[int, dict[int, list[int]]] = {sid: {} for sid in all_sids}
    bad_rows: dict[int, list[tuple[int, str]]] = {}
    for rows_, bads_ in summary:
        for sid, index, reason in bads_:
            bad_rows.setdefault(sid, []).append((index, reason))
        for sid, bucket, lo, hi, n, mints in rows_:
            cur = buckets[sid].get(bucket)
            if cur is None:
                buckets[sid][bucket] = [lo, hi, n, mints]
            else:
                cur[0], cur[1] = min(cur[0], lo), max(cur[1], hi)
                cur[2], cur[3] = cur[2] + n, min(cur[3], mints)
    for sid, bads in bad_rows.items():
        bads.sort()
        report.communities[sid].bad_records = len(bads)
        report.communities[sid].bad_sample = bads[:BAD_SAMPLE]
    if bad_rows and opts.on_bad_record == "fail":
        first = report.communities[min(bad_rows)]
        index, reason = first.bad_sample[0]
        raise BadCommunityRecord(first.stream, index, reason, report.bad_records)
    report.seconds["scan"] = time.perf_counter() - t0

    # windows: from the last archive's end, else from the oldest valid message
    windows: dict[int, list[tuple[int, int]]] = {}
    for sid in all_sids:
        bk = buckets[sid]
        start = states[sid].start_ns
        if start is None and bk:
            start = min(v[3] for v in bk.values())
        if start is None:
            continue  # no valid message at all: nothing to build
        ws = plan_windows(
            start, now, opts.period_ns, partial=opts.partial, unit_ns=layout.time_unit_ns
        )
        if ws:
            windows[sid] = ws
            report.communities[sid].windows = len(ws)
    # tasks: whole windows, about a quarter of the records per core each
    total = sum(v[2] for sid in windows for v in buckets[sid].values())
    lo_t, hi_t = TASK_RECORDS
    target = min(hi_t, max(lo_t, total // (4 * max(1, sc.defaultParallelism))))
    tasks = [
        t
        for sid, ws in windows.items()
        for t in _group_windows(sid, ws, buckets[sid], units[sid], target)
    ]
    if not tasks:  # nothing due anywhere: nothing to build, nothing written
        report.seconds["total"] = time.perf_counter() - t0
        return report

    # a message received twice is archived once, as by the control node (``_copies``)
    drops: dict[int, np.ndarray] = {}
    for sid, ws in windows.items():
        found = _community_copies(opts.data_dir, scratch, sid, units[sid], ws[0][0], ws[-1][1])
        if len(found):
            drops[sid] = found
    tasks = [
        dataclasses.replace(t, drop=tuple(d[(d >= t.lo) & (d < t.hi)].tolist()))
        if len(d := drops.get(t.sid, np.zeros(0, dtype=np.int64)))
        else t
        for t in tasks
    ]

    # the spec layout's archives sized here from the spills: build tasks write them in place
    placed: dict[int, Path] = {}
    if direct:
        tasks, placed = _plan_direct(root, layout, states, windows, tasks, units, scratch, drops)
    report.seconds["plan"] = time.perf_counter() - t0 - report.seconds["scan"]

    # pass 2 (executors): each group of windows built by the archives part's builder
    t1 = time.perf_counter()
    progress("build", 0, len(tasks))
    build = _build_task(opts.layout, opts.data_dir, opts.topics, str(parts_dir), scratch)
    bgroups = _in_groups(tasks, [t.hi - t.lo for t in tasks], slots)
    rows = sc.parallelize(bgroups, len(bgroups)).flatMap(lambda g: [build(x) for x in g]).collect()
    progress("build", len(tasks), len(tasks))
    report.seconds["build"] = time.perf_counter() - t1
    scratch.unlink("s-*.arrow")  # read by every build task: no longer needed
    fault("parts")

    by_sid: dict[int, list[Any]] = {}
    for r in rows:
        by_sid.setdefault(r["sid"], []).append(r)
        report.communities[r["sid"]].records += r["records"]
        report.communities[r["sid"]].topic_skipped += r.get("topic_skipped", 0)

    # driver: prefix sums, index, torrent, magnet; stage every community, then commit
    t2 = time.perf_counter()
    staged = []
    for sid, ws in windows.items():
        wrows = sorted(by_sid.get(sid, []), key=lambda r: r["w"])
        stage = _stage_community(
            root,
            states[sid],
            layout,
            wrows,
            ws[-1][1],
            opts.announce,
            report.communities[sid],
            placed.get(sid),
        )
        if stage is not None:
            payload = {"community_id": opts.communities[sid].community_id, "job": job}
            fs.replace_file_atomic(stage / COMMIT, json.dumps(payload).encode())
            staged.append(stage)
        progress("stage", len(staged), len(windows))
    report.seconds["stage"] = time.perf_counter() - t2
    fault("staged")
    t3 = time.perf_counter()
    for stage in staged:
        _commit_with_fault(root, stage, fault)
    report.seconds["commit"] = time.perf_counter() - t3
    for sid in all_sids:
        rep = report.communities[sid]
        if not rep.info_hash:  # nothing new: describe what is there
            st = states[sid]
            rep.data_bytes = st.indexed_end
    report.seconds["total"] = time.perf_counter() - t0
    return report


def _commit_with_fault(root: Path, stage: Path, fault: Fault) -> None:
    """``commit_staged``, with the ``committing`` fault point after the ``data`` rename (the
    moment a reader sees the old index over a longer ``data``)."""
    plan = json.loads((stage / COMMIT).read_text())
    dest = _targets(root, plan["community_id"])["data"]
    fs.makedirs_durable(dest.parent)
    fs.replace(stage / "data", dest)
    fs.fsync_dir(dest.parent)
    fault("committing")
    commit_staged(root, stage)
