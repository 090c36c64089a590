"""``job archives-build`` reading records where they lie (issue 11 §1): tasks read lake files and
live ranges themselves, whole windows per task. The grouping and the shared-filesystem check are
tested without Spark; one Spark test forces one window per task (and a window's hour buckets
straddling two tasks) and compares with ``ControlNode`` byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loglake.archives import get_layout
from loglake.archives.messages import ArchiveMetadata
from loglake.pipeline.errors import JobFailed
from loglake.pipeline.jobs import archives_build as ab
from tests.archives.helpers import DAY, START, WEEK
from tests.conftest import require_peer
from tests.pipeline.test_job_archives_build import (
    CID,
    assert_same,
    control_build,
    staging_empty,
    write_weeks,
)

H = ab.BUCKET_NS


def _units(*ranges: tuple[int, int]) -> list[ab.Unit]:
    return [ab.Unit("c", f"/lake/{a}.parquet", a, b) for a, b in ranges]


def test_windows_are_grouped_whole_and_each_task_reads_the_index_range_of_its_windows():
    # hour bucket -> [lo, hi, n, oldest]: 10 records an hour, index order = time order, except
    # one late record (index 95) whose time is in the first hour
    week = 7 * 24
    buckets = {b: [b * 10, b * 10 + 9, 10, b * H] for b in range(0, 3 * week)}
    buckets[0] = [0, 95, 11, 0]
    ws = [(k * week * H, (k + 1) * week * H) for k in range(4)]  # the 4th window is empty
    units = _units((0, 1000), (1000, 5000), (5000, 99999))
    tasks = ab._group_windows(0, ws, buckets, units, target=week * 10)
    assert [t.windows for t in tasks] == [(w,) for w in ws[:3]]  # whole windows, no empty one
    assert (tasks[0].lo, tasks[0].hi) == (0, week * 10)  # the late record's index included
    assert [u.start for u in tasks[0].units] == [0, 1000]
    assert (tasks[1].lo, tasks[1].hi) == (week * 10, 2 * week * 10)
    assert [t.group for t in tasks] == [0, 1, 2]
    # a bigger target groups consecutive windows; never a window split
    tasks = ab._group_windows(0, ws, buckets, units, target=10**9)
    assert len(tasks) == 1 and tasks[0].windows == tuple(ws[:3])
    assert (tasks[0].lo, tasks[0].hi) == (0, 3 * week * 10)


def test_windows_not_on_hour_boundaries_read_the_straddling_bucket_in_both_tasks():
    buckets = {b: [b * 10, b * 10 + 9, 10, b * H] for b in range(0, 10)}
    ws = [(H // 2, H // 2 + 5 * H), (H // 2 + 5 * H, H // 2 + 10 * H)]
    tasks = ab._group_windows(0, ws, buckets, _units((0, 100)), target=1)
    assert [(t.lo, t.hi) for t in tasks] == [(0, 60), (50, 100)]


def test_a_part_file_the_driver_cannot_see_fails_clearly(tmp_path: Path):
    layout = get_layout("spec")
    piece = layout.piece_length
    st = ab._State(ab.Community("c", "0x02" + "ab" * 32), tmp_path / "c", [], 0, None)
    row = {
        "sid": 0,
        "w": 0,
        "path": str(tmp_path / "elsewhere" / "0-0"),
        "nbytes": piece,
        "hashes": b"\x00" * 20,
        "entries": ab.pickle.dumps([(ArchiveMetadata(0, WEEK, ("t",), 1), 0, piece, 0)]),
        "records": 1,
    }
    rep = ab.CommunityReport("c", st.community.community_id)
    with pytest.raises(JobFailed, match="not visible to the driver"):
        ab._stage_community(tmp_path, st, layout, [row], WEEK, (), rep)


@pytest.mark.spark
@pytest.mark.parametrize("layout_name", ["spec", "status-go"])
def test_one_window_per_task_gives_the_control_nodes_bytes(
    spark, tmp_path, monkeypatch, layout_name
):
    layout = get_layout(layout_name)
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 4), per_week=30)
    monkeypatch.setattr(ab, "TASK_RECORDS", (1, 1))  # every window its own task
    now = START + 4 * WEEK + DAY
    seen: dict[str, object] = {}

    def fault(point: str) -> None:
        """After the build: what the build tasks left in the staging folder."""
        if point == "parts":
            base = tmp_path / "job" / ab.STAGING_DIR
            seen["parts"] = sorted(f.name for d in base.glob("_parts-*") for f in d.iterdir())
            staged = base / CID / "data"
            seen["staged"] = staged.stat().st_size if staged.exists() else None

    opts = ab.ArchivesBuildOptions(
        str(data), str(tmp_path / "job"), (ab.Community("c", CID),), layout=layout_name, now_ns=now
    )
    rep = ab.run(spark, opts, fault=fault)
    out = control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(tmp_path / "job", tmp_path / "ctl")
    assert rep.new_archives == len(out.new) and rep.communities[0].records == 4 * 30
    assert staging_empty(tmp_path / "job")
    if layout_name == "spec":  # sized by the driver: written in place, no part file
        assert seen == {"parts": [], "staged": rep.communities[0].data_bytes}
    else:  # status-go: a part file per task, copied in by the driver
        assert len(seen["parts"]) == 4 and seen["staged"] is None  # type: ignore[arg-type]


@pytest.mark.spark
def test_records_in_index_order_are_read_framed_and_written_as_they_go(
    spark, tmp_path, monkeypatch
):
    """A stream appended in time order (each task's records one index run per unit, the
    common case): the spec build streams them from the stream into the archives
    (``_streamed``), two windows a task, and writes the control node's bytes."""
    layout = get_layout("spec")
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 5), per_week=30, in_order=True)
    assert sorted((data / "lake").rglob("*.parquet")), "the test needs records in lake files"
    monkeypatch.setattr(ab, "TASK_RECORDS", (1, 60))  # two windows a task
    now = START + 5 * WEEK + DAY
    opts = ab.ArchivesBuildOptions(
        str(data), str(tmp_path / "job"), (ab.Community("c", CID),), now_ns=now
    )
    rep = ab.run(spark, opts)
    out = control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(tmp_path / "job", tmp_path / "ctl")
    assert rep.new_archives == len(out.new) == 5 and rep.communities[0].records == 5 * 30


def test_a_streamed_task_gives_each_range_its_records_framed_and_checks_them(tmp_path, monkeypatch):
    """``_streamed``: records of index runs (``_in_index_runs``) read and framed in order,
    each range asked for given its records (records between two ranges skipped); a record
    that is not the one the spill holds at its place fails the job."""
    import pyarrow as pa

    from loglake.archives.layout import frame_parts

    _lake(tmp_path, 0, 29)
    (u,) = ab.plan_units(str(tmp_path), {0: "c"})[0]

    def slices(idx: list[int]) -> list[tuple[ab.Unit, pa.Table]]:
        n = len(idx)
        cols = {"index": idx, "ts": list(range(n)), "flen": [4] * n}
        return [(u, pa.table({k: pa.array(v, pa.int64()) for k, v in cols.items()}))]

    def joined(idx: range) -> bytes:
        return b"".join(frame_parts([b"r%d" % i for i in idx])[0])

    assert ab._in_index_runs(slices(list(range(3, 20))))
    assert not ab._in_index_runs(slices([3, 4, 6]))  # a record skipped as bad
    assert not ab._in_index_runs(slices([])) and not ab._in_index_runs([])
    recs = ab._streamed(str(tmp_path), slices(list(range(3, 20))))
    assert list(recs.ts) == list(range(17)) and int(recs.flen.sum()) == 17 * 4
    assert b"".join(recs.framed(0, 5)) == joined(range(3, 8))
    assert b"".join(recs.framed(7, 17)) == joined(range(10, 20))  # 8 and 9: no window's
    with pytest.raises(JobFailed, match=r"records 5\.\.10 of a build task are gone"):
        list(ab._streamed(str(tmp_path), slices(list(range(25, 35)))).framed(0, 10))
    real = ab.read_unit

    def shifted(*a: object, **kw: object) -> object:
        for idx, col in real(*a, **kw):  # type: ignore[arg-type]
            yield idx + 1, col

    monkeypatch.setattr(ab, "read_unit", shifted)
    with pytest.raises(JobFailed, match="record 3 is not where the scan saw it"):
        list(ab._streamed(str(tmp_path), slices(list(range(3, 20)))).framed(0, 3))


def test_framed_records_are_frame_parts_joined():
    """The spec build's C framing: ``0x1a varint(len) record`` for every record (varints of
    1, 2 and 3 bytes, empty records, a sliced column) equals ``frame_parts`` joined; a record
    of 2 MiB or more is left to the general path (None)."""
    import random

    import pyarrow as pa

    from loglake.archives.layout import frame_parts

    rng = random.Random(7)
    lens = [0, 1, 127, 128, 129, 16383, 16384, 16385, (1 << 21) - 1, 300]
    lens += [rng.randrange(0, 40_000) for _ in range(100)]
    col = pa.array([rng.randbytes(n) for n in lens], pa.binary())
    for part in (col, col.slice(3, 50), col.slice(0, 0)):
        framed = ab._framed(part)
        assert framed is not None
        assert bytes(ab._data_view(framed)) == b"".join(frame_parts(part.to_pylist())[0])
    big = pa.array([bytes(1 << 21), b"x", b""], pa.binary())
    assert ab._framed(big) is None
    assert ab._framed(pa.array([b"x"], pa.large_binary())) is None
    # what the scan frames instead: the same bytes, record by record
    framed = ab._framed_slow(big)
    assert bytes(ab._data_view(framed)) == b"".join(frame_parts(big.to_pylist())[0])
    assert bytes(ab._data_view(framed.cast(pa.large_binary()).slice(1))) == b"\x1a\x01x\x1a\x00"


def test_pwritev_writes_every_part_at_its_offset_in_iov_max_groups(tmp_path, monkeypatch):
    """A build task's archive goes to its offset in the shared staged file whatever the
    number of buffers (groups of ``IOV_MAX``), leaving the bytes around it as they were."""
    import os

    monkeypatch.setattr(ab.fs, "IOV_MAX", 3)
    parts = [bytes([i]) * (i % 5) for i in range(20)] + [memoryview(b"tail")]
    path = tmp_path / "data"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_WRONLY)
    try:
        ab._pwritev_all(fd, parts, 10)
    finally:
        os.close(fd)
    body = b"".join(bytes(p) for p in parts)
    assert path.read_bytes() == b"x" * 10 + body + b"x" * (90 - len(body))


def test_a_direct_write_puts_every_part_at_its_offset_past_the_page_cache(tmp_path, monkeypatch):
    """An archive written past the page cache (``O_DIRECT``, a buffer of whole pieces at a
    time, parts crossing pieces and buffers, two archives back to back) lands at its aligned
    offset whole, the bytes around it as they were, and its pieces hash as ``extend_parts``
    hashes the same parts; the file is opened direct only where archives start and end on a
    block."""
    import os

    from loglake.archives import PieceHashes

    require_peer("O_DIRECT on the test folder's file system", _direct_works(tmp_path))
    plen = ab.DIRECT_ALIGN
    monkeypatch.setattr(ab, "DIRECT_CHUNK", 2 * plen + 100)  # 2 pieces a buffer
    rng = np.random.default_rng(7)
    sizes = [1, 5000, 3, 9000, 17 * 1024, 7]
    parts: list = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    parts.append(bytes(10 * plen - sum(sizes)))  # padding to whole pieces
    parts[1] = memoryview(parts[1])
    second = [rng.integers(0, 256, 3 * plen, dtype=np.uint8).tobytes()]
    path = tmp_path / "data"
    path.write_bytes(b"x" * (16 * plen))
    fd = ab._open_direct(str(path), plen, plen)
    assert fd is not None
    got_hashes = PieceHashes(plen)
    try:
        w = ab._DirectWriter(fd, plen)
        assert w.chunk == 2 * plen
        w.write(parts, plen, got_hashes)
        w.write(second, 11 * plen, got_hashes)
        w.wait()
    finally:
        os.close(fd)
    body = b"".join(bytes(p) for p in parts) + second[0]
    want_hashes = PieceHashes(plen)
    want_hashes.extend_parts(parts, 10 * plen, 0)
    want_hashes.extend_parts(second, 3 * plen, 0)
    assert got_hashes.hashes == want_hashes.hashes and len(got_hashes.hashes) == 13
    got = path.read_bytes()
    assert got[:plen] == b"x" * plen
    assert got[plen : plen + len(body)] == body
    assert got[plen + len(body) :] == b"x" * (2 * plen)
    # not whole pieces: refused before a byte is written past the last whole buffer
    fd = ab._open_direct(str(path), 0, plen)
    assert fd is not None
    try:
        with pytest.raises(JobFailed, match="whole"):
            ab._DirectWriter(fd, plen).write([b"y" * 100], 0, PieceHashes(plen))
    finally:
        os.close(fd)
    assert path.read_bytes() == got
    # where an archive would start or end off a block, the build writes through the cache
    assert ab._open_direct(str(path), 100, plen) is None
    assert ab._open_direct(str(path), 0, 100 * 1000) is None


def test_a_direct_write_that_fails_on_the_writer_thread_fails_the_task(tmp_path):
    """A write the writer thread could not do raises in the task (at the next buffer or at
    ``wait``), never lost; ``settle`` only waits (the task is failing already)."""
    import os

    from loglake.archives import PieceHashes

    path = tmp_path / "data"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)  # every write refused (EBADF)
    try:
        w = ab._DirectWriter(fd, ab.DIRECT_ALIGN)
        w.write([bytes(ab.DIRECT_ALIGN)], 0, PieceHashes(ab.DIRECT_ALIGN))
        with pytest.raises(OSError):
            w.wait()
        w.write([bytes(ab.DIRECT_ALIGN)], 0, PieceHashes(ab.DIRECT_ALIGN))
        w.settle()
        assert w.pending is None
    finally:
        os.close(fd)


def _direct_works(folder: Path) -> bool:
    import os

    f = folder / "probe"
    f.write_bytes(b"")
    fd = ab._open_direct(str(f), 0, ab.DIRECT_ALIGN)
    if fd is not None:
        os.close(fd)
    return fd is not None


def test_a_written_archive_is_handed_to_the_disk_at_once_and_a_bad_fd_is_only_a_no(tmp_path):
    """A build task starts the write-back of each archive it wrote (``sync_file_range``, not
    waiting): the kernel takes it for the staged file's range, the bytes stay as written, and
    a descriptor it refuses is a False, never an error (durability is the driver's fsync)."""
    import os

    path = tmp_path / "data"
    body = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        ab._pwritev_all(fd, [body], 4096)
        assert ab._start_writeback(fd, 4096, len(body)) is True
        assert ab._start_writeback(fd, 4096, 0) is False  # nothing to write back
    finally:
        os.close(fd)
    assert ab._start_writeback(fd, 0, 4096) is False  # closed: refused, no exception
    assert path.read_bytes() == bytes(4096) + body


def _lake(data_dir: Path, first: int, last: int) -> Path:
    from loglake.log.lake import records_table, write_lake_table
    from loglake.log.lake_schema import lake_partition_dir
    from loglake.log.record_codec import StoredRecord

    recs = [StoredRecord(i, i, None, (), b"r%d" % i, 0, 0) for i in range(first, last + 1)]
    return write_lake_table(lake_partition_dir(data_dir, "c", 0), records_table(recs, "c", 0)).path


def _read(data_dir: Path, u: ab.Unit, lo: int = 0, hi: int | None = None) -> list[bytes]:
    return [d for _, col in ab.read_unit(str(data_dir), u, lo, hi) for d in col.to_pylist()]


def test_a_unit_compacted_away_after_the_plan_is_read_from_the_file_that_covers_it(tmp_path):
    """``job compact`` (grace 0 s) replaces the files a build planned: the build reads the
    same records from the compacted file; if retention took them, it fails naming them."""
    small = [_lake(tmp_path, a, a + 9) for a in (0, 10, 20)]
    units = ab.plan_units(str(tmp_path), {0: "c"})[0]
    assert [(u.start, u.end) for u in units] == [(0, 10), (10, 20), (20, 30)]
    want = [b"r%d" % i for i in range(30)]
    assert [r for u in units for r in _read(tmp_path, u)] == want
    covering = _lake(tmp_path, 0, 29)  # what compaction commits, then it deletes the sources
    for f in small:
        f.unlink()
    assert [r for u in units for r in _read(tmp_path, u)] == want
    assert _read(tmp_path, units[1], 12, 15) == want[12:15]
    # retention removed the records a unit planned: a clear error, not fewer records
    covering.unlink()
    _lake(tmp_path, 15, 29)
    assert _read(tmp_path, units[2]) == want[20:]
    with pytest.raises(JobFailed, match=r"records 10\.\.15 of stream .c. were removed"):
        _read(tmp_path, units[1])


def test_the_spec_build_reads_its_records_again_in_the_spills_order_framed(tmp_path):
    """``_reread``: the records of the indexes asked for, in the order asked (the spill's),
    each framed as the spec archive holds it; the whole unit in index order is the read
    itself; a range within one lake file, records in another order, or some skipped (bad
    records the scan left out) are taken by position; an index the stream no longer holds
    fails the job naming it."""
    from loglake.archives.layout import frame_parts

    _lake(tmp_path, 0, 29)
    (u,) = ab.plan_units(str(tmp_path), {0: "c"})[0]

    def framed(idx: list[int]) -> list[bytes]:
        return frame_parts([b"r%d" % i for i in idx])[0]

    def got(idx: list[int], is_framed: bool = True) -> list[bytes]:
        return ab._reread(str(tmp_path), u, np.array(idx), is_framed).to_pylist()

    every = list(range(30))
    assert got(every) == [a + b for a, b in zip(*[iter(framed(every))] * 2, strict=True)]
    for idx in ([12, 13, 14], [5, 3, 4, 29], [0, 2, 28]):
        parts = framed(idx)
        assert got(idx) == [a + b for a, b in zip(parts[0::2], parts[1::2], strict=True)]
        assert got(idx, False) == [b"r%d" % i for i in idx]
    with pytest.raises(JobFailed, match=r"record 30 of stream .c. is gone"):
        got([28, 30])


def test_the_commit_makes_each_rename_durable_before_the_next_and_deletes_no_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Roll-forward of a staged build over an existing output: each staged file is renamed
    over its output (never removed first) and the output's folder fsynced before the next
    rename; the staging folder goes only after the last one. A crash after any step leaves
    each output file old or new, whole, and a ``COMMIT`` for the next run to finish."""
    import json

    from loglake.log import fs

    cid = "0x02" + "ab" * 32
    (tmp_path / cid).mkdir()
    old = {"data": b"old data", "index": b"old index"}
    for name, body in old.items():
        (tmp_path / cid / name).write_bytes(body)
    (tmp_path / f"{cid}.torrent").write_bytes(b"old torrent")
    stage = tmp_path / ab.STAGING_DIR / cid
    stage.mkdir(parents=True)
    for name in ("data", "index", "torrent", "magnet"):
        (stage / name).write_bytes(b"new " + name.encode())
    (stage / ab.COMMIT).write_text(json.dumps({"community_id": cid, "job": "j"}))
    events: list[tuple[str, str]] = []
    real_replace, real_fsync_dir, real_unlink = fs.replace, fs.fsync_dir, fs.unlink
    monkeypatch.setattr(
        fs, "replace", lambda a, b: (events.append(("rename", str(b))), real_replace(a, b))[1]
    )
    monkeypatch.setattr(
        fs, "fsync_dir", lambda d: (events.append(("fsync", str(d))), real_fsync_dir(d))[1]
    )
    monkeypatch.setattr(
        fs, "unlink", lambda p: (events.append(("unlink", str(p))), real_unlink(p))[1]
    )

    ab.commit_staged(tmp_path, stage)

    targets = ab._targets(tmp_path, cid)
    renames = [i for i, (kind, _) in enumerate(events) if kind == "rename"]
    assert [events[i][1] for i in renames] == [str(p) for p in targets.values()]
    for i in renames:  # the very next step makes the rename durable
        assert events[i + 1] == ("fsync", str(Path(events[i][1]).parent))
    assert not any(kind == "unlink" and p in map(str, targets.values()) for kind, p in events)
    for name, path in targets.items():
        assert path.read_bytes() == b"new " + name.encode()
    assert not stage.exists()
    assert ab.recover(tmp_path) == 0  # nothing left to roll forward


@pytest.mark.spark
@pytest.mark.parametrize("layout_name", ["spec", "status-go"])
def test_the_general_path_builds_from_the_spills_the_spec_path_reads_the_lake_again(
    spark, tmp_path, monkeypatch, layout_name
):
    """status-go (the general path) takes its records' bytes from the scan's spills: with
    every lake file made unreadable once the scan is done (when the driver groups windows
    into build tasks; the same records are still in the live log, where a re-plan would find
    them), the build still writes the control node's bytes. The spec layout's spills hold no
    bytes (``_scan_task``): its build reads the lake again, and fails on the spoiled file."""
    layout = get_layout(layout_name)
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 3), per_week=30)
    files = sorted((data / "lake").rglob("*.parquet"))
    assert files, "the test needs records in lake files"
    saved = {f: f.read_bytes() for f in files}
    real = ab._group_windows

    def group_after_spoiling_the_lake(*a: object, **kw: object) -> list[ab._BuildTask]:
        for f in files:
            f.write_bytes(b"not parquet")
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ab, "_group_windows", group_after_spoiling_the_lake)
    now = START + 3 * WEEK + DAY
    opts = ab.ArchivesBuildOptions(
        str(data), str(tmp_path / "job"), (ab.Community("c", CID),), layout=layout_name, now_ns=now
    )
    try:
        if layout_name == "spec":
            with pytest.raises(Exception, match=r"[Pp]arquet"):
                ab.run(spark, opts)
            return
        rep = ab.run(spark, opts)
    finally:
        for f, body in saved.items():
            f.write_bytes(body)
    control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(tmp_path / "job", tmp_path / "ctl")
    assert rep.communities[0].records == 3 * 30


@pytest.mark.spark
def test_each_lake_page_is_checked_once_a_job_by_the_scan_and_damage_fails_the_job(
    spark, tmp_path, monkeypatch
):
    """The scan reads every lake file whole with its pages' CRCs checked; the build reads the
    same pages again unchecked (``read_unit_columns``' ``checked``). A damaged page still
    fails the job, at the scan, naming the file, with nothing written."""
    import pyarrow.parquet as pq

    from loglake.log import CorruptSegment

    from .helpers import damage_lake_file

    layout = get_layout("spec")
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 3), per_week=30, in_order=True)
    files = sorted((data / "lake").rglob("*.parquet"))
    assert len(files) >= 2, "the test needs records in lake files"
    now = START + 3 * WEEK + DAY
    opts = ab.ArchivesBuildOptions(
        str(data), str(tmp_path / "job"), (ab.Community("c", CID),), now_ns=now
    )
    opened: list[bool] = []
    real = pq.ParquetFile

    def spy(*a: object, **kw: object) -> pq.ParquetFile:
        opened.append(bool(kw.get("page_checksum_verification")))
        return real(*a, **kw)  # type: ignore[arg-type]

    # the scan's and the build's reads, in this process (Spark's workers do not see the spy)
    monkeypatch.setattr(pq, "ParquetFile", spy)
    scratch = ab.open_scratch(tmp_path / "parts", "t", "t", "disk", True)
    units = [u for u in ab.plan_units(str(data), {0: "c"})[0] if u.path]  # the lake's
    scan = ab._scan_task("spec", str(data), scratch, direct=True)
    for u in units:
        scan((0, u))
    assert opened == [True] * len(units)
    opened.clear()
    for u in units:  # both ways the build reads: all at once, and streamed
        table = ab._read_spill(scratch, 0, u)
        assert table is not None and ab._in_index_runs([(u, table)])
        ab._reread(str(data), u, table.column("index").to_numpy(), True)
        assert len(list(ab._streamed(str(data), [(u, table)]).framed(0, table.num_rows)))
    assert opened == [False] * (2 * len(units))
    scratch.remove()
    monkeypatch.undo()

    damage_lake_file(files[1], "page")
    with pytest.raises(CorruptSegment, match=files[1].name):
        ab.run(spark, opts)
    assert not (tmp_path / "job" / CID / "data").exists()
    assert staging_empty(tmp_path / "job")


@pytest.mark.parametrize("scratch", ["memory", "disk"])
def test_the_spills_go_where_the_scratch_option_says_and_are_gone_after(
    spark, tmp_path, monkeypatch, scratch
):
    """The scan's spills in memory (``/dev/shm``) or on disk under ``root``: the same
    control-node bytes either way; while the build is planned the spills are in the one
    place; after the job neither holds anything, and a killed run's memory spills for the
    same root are removed by the next run."""
    from loglake.pipeline import scratch as sc

    if scratch == "memory":
        require_peer(f"a tmpfs at {sc.MEMORY_ROOT}", sc._is_tmpfs(sc.MEMORY_ROOT))
    layout = get_layout("spec")
    data, root = tmp_path / "data", (tmp_path / "job").resolve()
    write_weeks(data, "c", layout, range(0, 3), per_week=30)
    key = sc.scratch_key("archives-build", root)
    mem = Path(sc.MEMORY_ROOT, f"loglake-{key}")
    (mem / "killed").mkdir(parents=True, exist_ok=True)
    (mem / "killed" / "s-7-7.arrow").write_bytes(b"a killed run's spill")
    seen: dict[str, list[str]] = {}
    real = ab._group_windows

    def look(*a: object, **kw: object) -> list[ab._BuildTask]:
        seen["memory"] = sorted(p.name for p in mem.rglob("s-*.arrow"))
        seen["disk"] = sorted(p.name for p in (root / ab.STAGING_DIR).rglob("s-*.arrow"))
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ab, "_group_windows", look)
    now = START + 3 * WEEK + DAY
    opts = ab.ArchivesBuildOptions(
        str(data), str(root), (ab.Community("c", CID),), now_ns=now, scratch=scratch
    )
    ab.run(spark, opts)
    control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(root, tmp_path / "ctl")
    assert staging_empty(root) and not mem.exists()
    full, empty = ("memory", "disk") if scratch == "memory" else ("disk", "memory")
    assert seen[full] and "s-7-7.arrow" not in seen[full] and seen[empty] == []


def test_a_scratch_option_that_is_not_one_of_the_modes_is_refused(tmp_path):
    with pytest.raises(ab.BadOption, match="scratch"):
        ab.ArchivesBuildOptions(
            str(tmp_path), str(tmp_path), (ab.Community("c", CID),), scratch="x"
        )


@pytest.mark.parametrize("now", ["1e30", "1e300", "inf", "nan", "-1", "9999-01-01", "1969-12-31"])
def test_a_now_outside_int64_nanoseconds_is_refused_before_spark(tmp_path, now):
    # --now 1e30 reached the window planner, which steps a week at a time up to now (~10^24
    # steps); inf, then 1e300 (inf once in nanoseconds), was an OverflowError traceback
    from click.testing import CliRunner

    from loglake.cli import main

    from .helpers import write_lake

    write_lake(tmp_path, "c", 0, 0, 9)
    kf = tmp_path / "c.key"
    kf.write_text("11" * 32)
    res = CliRunner().invoke(main, ["job", "archives-build", "--data-dir", str(tmp_path),
                                    "--stream", "c", "--root", str(tmp_path / "out"),
                                    "--key-file", str(kf), "--now", now])  # fmt: skip
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"Error: option --now={now!r}: expected a time from 1970 to 2262" in res.output
    with pytest.raises(ab.BadOption, match="now_ns"):
        ab.ArchivesBuildOptions(
            str(tmp_path), str(tmp_path), (ab.Community("c", CID),), now_ns=10**39
        )


_HEAP_ROUNDS = """
import resource, sys
import numpy as np
from loglake.pipeline.jobs import archives_build as ab
if sys.argv[1] == "keep":
    assert ab._keep_heap()
def batch():  # a batch's temporaries: many 0.5 MiB arrays, all freed at its end
    return [np.ones(1 << 16) for _ in range(80)]
batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_scan_keeps_what_a_batch_freed_for_the_next_batch():
    # glibc's defaults give a batch's freed temporaries back to the kernel and the next batch
    # faults them in again; kept, the next batches reuse them (a fresh process each: the
    # settings are process-wide)
    import subprocess
    import sys

    def faults(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _HEAP_ROUNDS, mode], capture_output=True, text=True, check=True
        )
        return int(out.stdout)

    pages = 5 * 80 * (1 << 19) // 4096  # every page of the 5 batches
    assert faults("default") > pages // 2  # what the setting is for
    assert faults("keep") < pages // 20


def test_a_whole_lake_unit_is_read_in_batches_of_at_most_batch_rows_with_every_record(tmp_path):
    # the scan's batches (SCAN_ROWS) come from the row groups as they are decompressed: the same
    # records in index order whatever the batch size, none larger than asked
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loglake.pipeline.units import read_unit_columns

    n = 1000
    table = pa.table(
        {"index": pa.array(range(n), pa.int64()), "data": [b"r%d" % i for i in range(n)]}
    )
    path = tmp_path / "0-999.parquet"
    pq.write_table(table, path, row_group_size=300)
    u = ab.Unit("c", str(path), 0, n)
    for rows in (64, 300, 4096):
        batches = list(read_unit_columns(str(tmp_path), u, ("index", "data"), batch_rows=rows))
        assert all(len(b) <= rows for b in batches)
        got = pa.Table.from_batches(batches)
        assert got.column("index").to_pylist() == list(range(n))
        assert got.column("data").to_pylist() == table.column("data").to_pylist()


def test_copies_are_the_records_whose_bytes_an_earlier_index_holds_and_only_they_are_read():
    import pyarrow as pa

    # index: bytes (time, framed size and cap follow from them); the spills' order is by time
    recs = {
        10: b"a" * 5,  # time 1
        11: b"b" * 5,  # time 1, same size and cap as a: read, kept
        12: b"c" * 7,  # time 1, other size: never read
        13: b"d" * 5,  # time 2, alone at its time: never read
        14: b"a" * 5,  # time 1: a copy of 10
        15: b"b" * 5,  # time 1: a copy of 11
        16: b"a" * 5,  # time 1: a copy of 10 again
    }
    times = {10: 1, 11: 1, 12: 1, 13: 2, 14: 1, 15: 1, 16: 1}
    idx = np.array([10, 11, 12, 14, 15, 16, 13], dtype=np.int64)  # a spill: time, then index
    ts = np.array([times[i] for i in idx.tolist()], dtype=np.int64)
    flen = np.array([len(recs[i]) + 2 for i in idx.tolist()], dtype=np.int64)
    cap = flen - 2
    read: list[int] = []

    def records(pos: np.ndarray) -> pa.Array:
        assert list(pos) == sorted(pos)
        read.extend(idx[pos].tolist())
        return pa.array([recs[i] for i in idx[pos].tolist()], pa.large_binary())

    assert ab._copies(ts, flen, cap, idx, records).tolist() == [14, 15, 16]
    assert sorted(read) == [10, 11, 14, 15, 16]
    # nothing shares a time: nothing read
    read.clear()
    one = np.array([1, 2, 3], dtype=np.int64)
    assert ab._copies(one, one, one, one, records).tolist() == [] and read == []


def test_times_shared_checks_each_spill_and_only_overlapping_spills_against_each_other():
    def runs(*rs: list[int]) -> list[np.ndarray]:
        return [np.array(r, dtype=np.int64) for r in rs]

    assert not ab._times_shared(runs([1, 2, 3], [4, 5], [], [9]))  # spills one after another
    assert ab._times_shared(runs([1, 2, 2, 3], [4, 5]))  # a time twice in one spill
    assert ab._times_shared(runs([1, 3, 7], [2, 7]))  # overlapping spans, a time in both
    assert not ab._times_shared(runs([1, 3, 7], [2, 6, 8]))  # overlapping, no time in both
    assert ab._times_shared(runs([4, 5], [1, 4]))  # the spills out of time order
    assert not ab._times_shared(runs()) and not ab._times_shared(runs([]))
