"""``compact`` durability and coordination (issue 17 item 8), without Spark: the staging a Spark
job would leave is written with pyarrow, and every call that changes the disk is traced through
``loglake.log.fs`` (the storage engine's one file layer) to check its order."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loglake.log import fs
from loglake.log.lake import lake_lock
from loglake.log.lake_schema import lake_file_name, lake_partition_dir
from loglake.pipeline.errors import JobFailed
from loglake.pipeline.jobs import compact
from loglake.pipeline.lake import all_lake_files, stream_lake_dir, visible_lake_files

from .helpers import lake_table, write_lake


def _trace(monkeypatch) -> list[tuple]:
    """Record fsync / fsync_dir / replace / unlink through ``loglake.log.fs``, in order."""
    trace: list[tuple] = []
    paths: dict[int, str] = {}
    real_open, real_fsync, real_dir = fs.open, fs.fsync, fs.fsync_dir
    real_replace, real_unlink = fs.replace, fs.unlink

    def open_(path, flags, *a):
        fd = real_open(path, flags, *a)
        paths[fd] = str(path)
        return fd

    def fsync(fd):
        trace.append(("fsync", paths.get(fd, fd)))
        real_fsync(fd)

    def fsync_dir(path):
        trace.append(("fsync_dir", str(path)))
        real_dir(path)

    def replace(a, b):
        trace.append(("replace", str(a), str(b)))
        real_replace(a, b)

    def unlink(p):
        trace.append(("unlink", str(p)))
        real_unlink(p)

    for name, fn in [
        ("open", open_),
        ("fsync", fsync),
        ("fsync_dir", fsync_dir),
        ("replace", replace),
        ("unlink", unlink),
    ]:
        monkeypatch.setattr(fs, name, fn)
    return trace


def _lake(tmp_path: Path) -> tuple[Path, list[str]]:
    d = tmp_path / "data"
    sources = [str(write_lake(d, "cs", 0, 0, 9)), str(write_lake(d, "cs", 0, 10, 19))]
    return d, sources


def _group(sources: list[str]) -> compact.Group:
    return compact.Group(0, 0, 19, sources, 20, sum(os.path.getsize(s) for s in sources))


def _fake_write_group(spark, g, out: Path, row_group_bytes: int) -> str:
    """What Spark leaves: a folder with one part file (and Spark's own ``_SUCCESS``)."""
    out.mkdir(parents=True)
    part = out / "part-00000.parquet"
    pq.write_table(lake_table("cs", g.partition, g.first, g.last), part)
    (out / "_SUCCESS").write_bytes(b"")
    return str(part)


def _staged_job(d: Path, sources: list[str]) -> tuple[Path, Path]:
    """A job folder as ``stage`` leaves it at its commit point."""
    job = stream_lake_dir(d, "cs") / f"{compact.JOB_PREFIX}test"
    g = _group(sources)
    g.staged = _fake_write_group(None, g, job / "g0", 0)
    (job / "plan.json").write_text(json.dumps({"stream": "cs", "groups": [asdict(g)]}))
    (job / compact.SUCCESS).write_bytes(b"")
    return job, Path(g.staged)


def test_staging_is_durable_before_the_success_marker(tmp_path, monkeypatch):
    d, sources = _lake(tmp_path)
    monkeypatch.setattr(compact, "_write_group", _fake_write_group)
    trace = _trace(monkeypatch)
    opts = compact.CompactOptions(str(d), "cs", target_bytes=1 << 20)
    job = compact.stage(None, opts, [_group(sources)], lambda *a: None)
    assert job is not None
    success = next(
        i for i, t in enumerate(trace) if t[0] == "replace" and t[2] == str(job / compact.SUCCESS)
    )
    before = trace[:success]
    part = job / "g0" / "part-00000.parquet"
    assert ("fsync", str(part)) in before, "Spark's output is fsynced before the commit point"
    for folder in (job / "g0", job, job.parent):
        assert ("fsync_dir", str(folder)) in before, f"{folder} is fsynced before _SUCCESS"
    plan = next(i for i, t in enumerate(trace) if t[0] == "replace" and t[2].endswith("plan.json"))
    assert plan < success


def test_commit_makes_the_compacted_file_durable_before_it_replaces_anything(tmp_path, monkeypatch):
    d, sources = _lake(tmp_path)
    job, staged = _staged_job(d, sources)
    trace = _trace(monkeypatch)
    assert compact.recover(str(d), "cs") == 1
    assert compact.delete_superseded(str(d), "cs", 0) == 2
    folder = lake_partition_dir(d, "cs", 0)
    dest = folder / lake_file_name(0, 19)
    moved = trace.index(("replace", str(staged), str(dest)))
    assert ("fsync", str(staged)) in trace[:moved], "fsynced before it is renamed into the lake"
    named = trace.index(("fsync_dir", str(folder)), moved)
    unlinks = [i for i, t in enumerate(trace) if t[0] == "unlink"]
    assert sorted(trace[i][1] for i in unlinks) == sorted(sources)
    assert min(unlinks) > named, "sources go only after the new file's name is durable"
    assert ("fsync_dir", str(folder)) in trace[max(unlinks) :], "the deletions are made durable"
    assert [f.path for f in all_lake_files(d, "cs", 0)] == [str(dest)]
    assert not job.exists()


def test_commit_drops_a_group_whose_source_retention_removed(tmp_path):
    d, sources = _lake(tmp_path)
    job, staged = _staged_job(d, sources)
    os.unlink(sources[0])  # the writer's lake retention, between plan and commit
    assert compact.recover(str(d), "cs") == 0
    assert [f.path for f in visible_lake_files(d, "cs", 0)] == [sources[1]]
    assert not staged.exists() and not job.exists()


def test_one_compact_job_per_stream(tmp_path):
    d, _ = _lake(tmp_path)
    opts = compact.CompactOptions(str(d), "cs")
    with compact.job_lock(str(d), "cs"), pytest.raises(JobFailed) as e:
        compact.run(None, opts)  # at once: no Spark session is needed to be refused
    assert str(e.value) == "compact: another compact job is running on stream 'cs'"
    with compact.job_lock(str(d), "cs"):  # released with the job
        pass


def test_commit_waits_for_the_lake_lock(tmp_path):
    d, sources = _lake(tmp_path)
    _staged_job(d, sources)
    folder = lake_partition_dir(d, "cs", 0)
    dest = folder / lake_file_name(0, 19)
    done = threading.Event()

    def finish():
        compact.recover(str(d), "cs")
        done.set()

    with lake_lock(folder):  # held as the log's retention would hold it
        t = threading.Thread(target=finish, daemon=True)
        t.start()
        t.join(0.5)
        assert not done.is_set() and not dest.exists(), "no commit while the lock is held"
    t.join(30)
    assert done.is_set() and dest.exists()
