"""``compact``: rewrite a stream's sealed history into larger, index-sorted Parquet files.

Why: the log seals one lake file per rolled segment (64 MiB by default, far smaller when a stream
rolls often), and a table of many small files is slow to plan and scan. This job merges runs of
adjacent files of a partition into files of about ``target_bytes``, sorted by ``index``, written
by Spark's native Parquet writer so it runs unchanged on ``local[*]`` or a cluster.

Atomic, and readable throughout (a reader during compaction never sees a record twice or
misses one):

1. Plan from one listing: per partition, runs of contiguous visible files (``lake.py`` cover
   rule) cut at ``target_bytes``; a run of one file is left alone.
2. Each group is written by Spark to ``lake/<stream>/_compact-<id>/g<n>/`` (underscore folders are
   invisible to Spark's partition discovery and to the log, which lists ``partition=<p>`` only),
   then checked: one file, the same row count as its sources, ``index`` from first to last.
3. Durable before it counts: every staged file and folder is fsynced (Spark's writer never
   fsyncs), then ``plan.json`` and ``_SUCCESS`` are written atomically (``loglake.log.fs``:
   temp file, fsync, rename, folder fsync). ``_SUCCESS`` is the commit point.
4. Commit: each group file is renamed to ``partition=<p>/<first>-<last>.parquet`` (the lake's own
   naming, so the log and every reader keep reading it) and the folder is fsynced, under the
   partition's ``loglake.log.lake.lake_lock``; a group whose sources another process (log
   retention) removed since the plan is dropped instead. A compacted file's range contains its
   sources' ranges, so by the cover rule readers see each index once from then on; the sources
   are deleted (under the same lock, folder fsynced) once the compacted file is
   ``grace_seconds`` old (default 0: at once — safe for the log, which applies the same cover
   rule and re-lists its lake files when one disappears; a longer grace keeps already-planned
   Spark scans of the old files working). A crash before ``_SUCCESS`` leaves only a staging
   folder, removed by the next run; a crash after it is finished by the next run.
5. One job per stream at a time (``job_lock``): a second one fails with ``JobFailed`` rather
   than take the first one's staging for a crash leftover.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from loglake.log import fs
from loglake.log.api import STREAM_NAME_RE
from loglake.log.lake import LakeFile, lake_lock
from loglake.log.lake_schema import lake_file_name, lake_partition_dir
from loglake.pipeline.errors import BadOption, JobFailed, check_dir, raises_task_errors
from loglake.pipeline.lake import (
    VERIFY_PAGES,
    all_lake_files,
    lake_file_rows,
    lake_partitions,
    split_covered,
    stream_lake_dir,
)
from loglake.pipeline.output_dir import one_job

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JOB_PREFIX = "_compact-"
SUCCESS = "_SUCCESS"
JOB_LOCK = "_compact.lock"
DEFAULT_TARGET_BYTES = 128 * 1024 * 1024
DEFAULT_ROW_GROUP_BYTES = 8 * 1024 * 1024
"""Row groups small enough that an index-range read of a big file skips most of it."""


@dataclass(frozen=True)
class CompactOptions:
    data_dir: str
    stream: str
    target_bytes: int = DEFAULT_TARGET_BYTES
    partitions: tuple[int, ...] | None = None
    grace_seconds: float = 0.0
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES

    def __post_init__(self) -> None:
        check_dir("data_dir", self.data_dir, self.data_dir)
        if not STREAM_NAME_RE.fullmatch(self.stream):  # ``../x`` named a folder outside the lake
            raise BadOption("stream", self.stream, "not a valid stream name")
        if not stream_lake_dir(self.data_dir, self.stream).is_dir():
            raise BadOption("stream", self.stream, f"no lake folder for it in {self.data_dir}")
        if self.target_bytes < 1024:
            raise BadOption("target_bytes", self.target_bytes, "must be at least 1024")
        if not self.grace_seconds >= 0:  # NaN too: no file was ever old enough to delete
            raise BadOption("grace_seconds", self.grace_seconds, "must be >= 0")
        if self.row_group_bytes < 1024:  # 0 was handed to Spark's writer as is
            raise BadOption("row_group_bytes", self.row_group_bytes, "must be at least 1024")
        known = lake_partitions(self.data_dir, self.stream)
        for p in self.partitions or ():
            if p not in known:
                raise BadOption("partitions", p, f"stream {self.stream!r} has {known} in the lake")


@dataclass
class Group:
    partition: int
    first: int
    last: int
    sources: list[str]
    rows: int
    bytes: int
    staged: str = ""


@dataclass
class CompactResult:
    groups: list[Group] = field(default_factory=list)
    files_before: int = 0
    files_after: int = 0
    deleted: int = 0
    recovered: int = 0


def _rows(path: str) -> int:
    # checked to be a lake file: Spark reads a foreign one's missing columns as nulls, which
    # the compacted file would then hold in place of the sources it replaces
    return lake_file_rows(path)


def plan_groups(files: list[LakeFile], target_bytes: int) -> list[list[LakeFile]]:
    """Runs of contiguous files, each cut before it would pass ``target_bytes``; runs of ≥ 2."""
    groups: list[list[LakeFile]] = []
    run: list[LakeFile] = []
    size = 0
    for f in files:
        contiguous = bool(run) and f.first == run[-1].last + 1
        if run and (not contiguous or size + f.size > target_bytes):
            groups.append(run)
            run, size = [], 0
        run.append(f)
        size += f.size
    if run:
        groups.append(run)
    return [g for g in groups if len(g) >= 2]


def plan(opts: CompactOptions) -> tuple[list[Group], int]:
    out: list[Group] = []
    total = 0
    for p in opts.partitions or lake_partitions(opts.data_dir, opts.stream):
        visible, _ = split_covered(all_lake_files(opts.data_dir, opts.stream, p))
        total += len(visible)
        for g in plan_groups(visible, opts.target_bytes):
            out.append(
                Group(
                    p,
                    g[0].first,
                    g[-1].last,
                    [str(f.path) for f in g],
                    sum(_rows(str(f.path)) for f in g),
                    sum(f.size for f in g),
                )
            )
    return out, total


def _write_group(spark: SparkSession, g: Group, out: Path, row_group_bytes: int) -> str:
    from loglake.pipeline.datasource import COLUMNS, RECORD_SCHEMA

    # each page's CRC checked as it is read: a damaged one fails the job (``CorruptSegment``
    # naming the file, by ``raises_task_errors``) instead of being compacted as other rows
    reader = spark.read.schema(RECORD_SCHEMA).option(*VERIFY_PAGES)
    df = reader.parquet(*g.sources).select(*COLUMNS)
    (
        df.repartition(1)
        .sortWithinPartitions("index")
        .write.mode("overwrite")
        .option("compression", "zstd")
        .option("parquet.block.size", str(row_group_bytes))
        .parquet(str(out))
    )
    parts = [p for p in out.iterdir() if p.name.endswith(".parquet")]
    if len(parts) != 1:
        raise JobFailed(f"compact: group {g.partition}/{g.first}-{g.last} wrote {len(parts)} files")
    meta = pq.ParquetFile(parts[0]).metadata
    if meta.num_rows != g.rows:
        raise JobFailed(
            f"compact: group {g.partition}/{g.first}-{g.last} wrote {meta.num_rows} rows, "
            f"its sources hold {g.rows}"
        )
    return str(parts[0])


def make_durable(job_dir: Path) -> None:
    """Fsync every file Spark staged under ``job_dir`` and every folder that names one, up to
    the stream's lake folder, so that once ``_SUCCESS`` exists a crash cannot take back a byte
    of what ``commit`` will rename into the lake (Spark's writer never fsyncs)."""
    folders = []
    for root, _dirs, files in os.walk(job_dir):
        for name in files:
            fs.fsync_file(Path(root) / name)
        folders.append(Path(root))
    for folder in reversed(folders):  # deepest first: a folder's entries before its parent's
        fs.fsync_dir(folder)
    fs.fsync_dir(job_dir.parent)


@contextlib.contextmanager
def job_lock(data_dir: str, stream: str) -> Iterator[None]:
    """One ``compact`` job per stream at a time (``flock`` on ``lake/<stream>/_compact.lock``):
    a second job would take the first one's unfinished staging for a crash leftover and
    remove it. A second job fails at once with ``JobFailed``."""
    busy = f"compact: another compact job is running on stream {stream!r}"
    with one_job(stream_lake_dir(data_dir, stream) / JOB_LOCK, busy):
        yield


def commit(job_dir: Path, data_dir: str, stream: str) -> int:
    """Move a finished job's files into the lake (idempotent); return files moved.

    Per group, under the partition's ``lake_lock`` (which the log's lake retention honours
    too): the staged file is fsynced (again: cheap, and ``commit`` does not trust how it was
    staged), its sources are checked to be all there — if another process (retention) removed
    one since the plan, the group is dropped rather than bring those records back — then it is
    renamed to its lake name and the partition folder is fsynced, so the file is durable
    before anything it replaces may be deleted (``delete_superseded``)."""
    groups = [Group(**g) for g in json.loads((job_dir / "plan.json").read_text())["groups"]]
    moved = 0
    for g in groups:
        staged = Path(g.staged)
        if not staged.exists():
            continue  # moved before a crash: nothing left to do
        dest_dir = lake_partition_dir(data_dir, stream, g.partition)
        dest = dest_dir / lake_file_name(g.first, g.last)
        with lake_lock(dest_dir):
            if not all(os.path.exists(src) for src in g.sources):
                fs.unlink(staged)  # a source went meanwhile (retention): keep it gone
                continue
            fs.fsync_file(staged)
            fs.replace(staged, dest)
            fs.fsync_dir(dest_dir)
        moved += 1
    shutil.rmtree(job_dir, ignore_errors=True)
    return moved


def recover(data_dir: str, stream: str) -> int:
    """Finish jobs that reached ``_SUCCESS``; drop the staging of jobs that did not."""
    done = 0
    root = stream_lake_dir(data_dir, stream)
    for job_dir in sorted(root.glob(f"{JOB_PREFIX}*")):
        if (job_dir / SUCCESS).exists():
            done += commit(job_dir, data_dir, stream)
        else:
            shutil.rmtree(job_dir, ignore_errors=True)
    return done


def delete_superseded(
    data_dir: str,
    stream: str,
    grace_seconds: float,
    partitions: Sequence[int] | None = None,
    now: float | None = None,
) -> int:
    """Delete files covered by a compacted file at least ``grace_seconds`` old.

    A covering file is only ever in the lake once ``commit`` made it durable, so deleting what
    it covers loses nothing; the deletions are made durable too (folder fsync), under the
    partition's ``lake_lock``."""
    now = time.time() if now is None else now
    deleted = 0
    for p in partitions or lake_partitions(data_dir, stream):
        folder = lake_partition_dir(data_dir, stream, p)
        with lake_lock(folder):
            _, superseded = split_covered(all_lake_files(data_dir, stream, p))
            here = 0
            for old, cover in superseded:
                if now - cover.mtime >= grace_seconds:
                    try:
                        fs.unlink(old.path)
                        here += 1
                    except FileNotFoundError:
                        pass
            if here:
                fs.fsync_dir(folder)
        deleted += here
    return deleted


Progress = Callable[[str, int, int], None]
"""``progress(step, done, total)``: the CLI draws it; tests use it to read between steps."""


def stage(
    spark: SparkSession, opts: CompactOptions, groups: list[Group], progress: Progress
) -> Path | None:
    """Write every group under a fresh job folder and mark it ``_SUCCESS``; None if no group."""
    if not groups:
        return None
    job_dir = stream_lake_dir(opts.data_dir, opts.stream) / f"{JOB_PREFIX}{uuid.uuid4().hex}"
    progress("write", 0, len(groups))
    try:
        for i, g in enumerate(groups):
            g.staged = _write_group(spark, g, job_dir / f"g{i}", opts.row_group_bytes)
            progress("write", i + 1, len(groups))
        make_durable(job_dir)
        fs.replace_file_atomic(
            job_dir / "plan.json",
            json.dumps({"stream": opts.stream, "groups": [asdict(g) for g in groups]}).encode(),
        )
        fs.replace_file_atomic(job_dir / SUCCESS, b"")
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    return job_dir


@raises_task_errors
def run(
    spark: SparkSession, opts: CompactOptions, progress: Progress | None = None
) -> CompactResult:
    """Recover earlier jobs, plan, stage, commit, then delete superseded files (grace)."""
    progress = progress or (lambda step, done, total: None)
    with job_lock(opts.data_dir, opts.stream):
        return _run(spark, opts, progress)


def _run(spark: SparkSession, opts: CompactOptions, progress: Progress) -> CompactResult:
    result = CompactResult()
    result.recovered = recover(opts.data_dir, opts.stream)
    result.deleted += delete_superseded(
        opts.data_dir, opts.stream, opts.grace_seconds, opts.partitions
    )
    result.groups, result.files_before = plan(opts)
    job_dir = stage(spark, opts, result.groups, progress)
    if job_dir is not None:
        commit(job_dir, opts.data_dir, opts.stream)
    progress("commit", len(result.groups), len(result.groups))
    result.deleted += delete_superseded(
        opts.data_dir, opts.stream, opts.grace_seconds, opts.partitions
    )
    result.files_after = sum(
        len(split_covered(all_lake_files(opts.data_dir, opts.stream, p))[0])
        for p in opts.partitions or lake_partitions(opts.data_dir, opts.stream)
    )
    return result
