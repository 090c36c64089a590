"""``pipeline/output_dir.py``: a job's output folder is replaced so that a crash at any point
leaves the old output or the new one, whole — never neither, never a mix. Two kinds of crash:
the process killed after each file-system call (``os._exit`` in a forked child: the page cache
survives, so this tests the order and atomicity of the names), and power lost after each call
on the log's simulated disk (``tests/log/simdisk.py``: only what was fsynced survives)."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from loglake.log import fs
from loglake.pipeline import output_dir
from loglake.pipeline.output_dir import commit_dir, recover_dir, staged_output
from tests.log.simdisk import PowerLoss, SimDisk

OLD = {"part-0.parquet": b"old-0" * 100, "sub/part-1.parquet": b"old-1", "summary.json": b"{}"}
NEW = {"part-0.parquet": b"new-0" * 300, "sub/x/part-9.parquet": b"new-9", "_SUCCESS": b""}
CALLS = ("replace", "fsync", "fsync_dir", "unlink", "rmdir", "mkdir")


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def run_job(dest: Path) -> None:
    with staged_output(dest) as stage:
        write_tree(stage, NEW)  # as Spark or pyarrow write: not through fs, never fsynced


def _beside(folder: Path) -> list[str]:
    """What is in ``folder`` but the empty file of ``staged_output``'s lock (which stays:
    removing it would let two jobs lock two files of one name)."""
    return sorted(n for n in os.listdir(folder) if not n.endswith(output_dir.LOCK_TAG))


def test_the_new_output_replaces_the_old_and_nothing_is_left_beside_it(tmp_path):
    dest = tmp_path / "out"
    run_job(dest)
    assert read_tree(dest) == NEW
    write_tree(dest, OLD)
    run_job(dest)
    assert read_tree(dest) == NEW
    assert sorted(os.listdir(tmp_path)) == [".out.lock", "out"]  # the lock's empty file stays


def test_a_second_job_on_the_same_output_fails_and_touches_nothing(tmp_path):
    """Found from outside: two sds-audit runs on one --out, 4 s apart; the second's recovery
    removed the staging folder the first was writing (which then failed on a vanished file of
    its own, and could have committed a partly deleted output). Now the second fails at once
    with ``JobFailed``, and the first commits whole."""
    from loglake.pipeline.errors import JobFailed

    dest = tmp_path / "out"
    with staged_output(dest) as stage:
        write_tree(stage, NEW)
        with pytest.raises(JobFailed, match="another job is writing"), staged_output(dest):
            pass
        assert read_tree(stage) == NEW
    assert read_tree(dest) == NEW
    run_job(dest)  # the lock was let go


def test_a_failing_job_leaves_the_old_output(tmp_path):
    dest = tmp_path / "out"
    write_tree(dest, OLD)
    with pytest.raises(RuntimeError), staged_output(dest) as stage:
        write_tree(stage, {"part-0.parquet": b"half"})
        raise RuntimeError("the Spark job failed")
    assert read_tree(dest) == OLD
    assert _beside(tmp_path) == ["out"]


def _killed_after(tmp_path: Path, n: int, exchange: bool) -> bool:
    """Run the job in a forked child killed at its ``n``-th file-system call; True if it was
    killed (False: it finished with fewer calls)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            count = [0]

            def killing(real):
                def call(*a, **k):
                    count[0] += 1
                    if count[0] > n:
                        os._exit(7)
                    return real(*a, **k)

                return call

            for name in CALLS:
                setattr(fs, name, killing(getattr(fs, name)))
            if exchange:
                output_dir._exchange = killing(output_dir._exchange)
            else:
                output_dir._exchange = _no_exchange
            run_job(tmp_path / "out")
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 7


def _no_exchange(a, b):
    raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here")


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_killed_after_any_call_the_output_is_old_or_new(tmp_path, exchange):
    n = 0
    seen = set()
    while True:
        case = tmp_path / str(n)
        write_tree(case / "out", OLD)
        killed = _killed_after(case, n, exchange)
        if exchange:  # with the atomic swap the output path is whole even before recovery
            assert read_tree(case / "out") in (OLD, NEW), f"killed after call {n}"
        recover_dir(case / "out")
        got = read_tree(case / "out")
        assert got in (OLD, NEW), f"killed after call {n}"
        seen.add("new" if got == NEW else "old")
        assert _beside(case) == ["out"]
        run_job(case / "out")  # and the next run commits as usual
        assert read_tree(case / "out") == NEW
        if not killed:
            break
        n += 1
    assert n > 5 and seen == {"old", "new"}


@pytest.mark.parametrize("seed", range(4))
def test_power_lost_after_any_call_the_output_is_old_or_new(tmp_path, monkeypatch, seed):
    """The simulated disk keeps only what was fsynced (plus a random part of the rest). It
    models renames, not the exchange: the two-rename swap runs here."""
    monkeypatch.setattr(output_dir, "_exchange", _no_exchange)
    rng = random.Random(seed)
    n = 0
    while True:
        with SimDisk(tmp_path / f"n{n}") as disk:
            dest = disk.root / "jobs" / "out"
            fs.makedirs_durable(dest)
            write_tree(dest, OLD)
            output_dir.fsync_tree(dest)
            disk.crash_after(n)
            try:
                run_job(dest)
                finished = True
            except PowerLoss:
                finished = False
            disk.restart(rng)
            dest = disk.root / "jobs" / "out"
            recover_dir(dest)
            got = read_tree(dest) if dest.exists() else None
            sizes = None if got is None else {k: len(v) for k, v in got.items()}
            assert got in (OLD, NEW), f"seed {seed}: power lost after call {n}: {sizes}"
            if finished:
                assert got == NEW  # it returned: the new output is durable
                break
        n += 1
    assert n > 5


def test_commit_dir_reports_a_real_error(tmp_path, monkeypatch):
    def broken(a, b):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(output_dir, "_exchange", broken)
    dest = tmp_path / "out"
    write_tree(dest, OLD)
    stage = tmp_path / ".out.staging-x"
    write_tree(stage, NEW)
    with pytest.raises(OSError, match="I/O error"):
        commit_dir(stage, dest)
    assert read_tree(dest) == OLD


def test_files_that_are_not_the_jobs_are_carried_over(tmp_path):
    dest = tmp_path / "out"
    write_tree(dest, {**OLD, "notes.txt": b"mine", "mine/a.txt": b"a"})
    with staged_output(dest, keep=lambda n: n in ("notes.txt", "mine", "summary.json")) as st:
        write_tree(st, {**NEW, "summary.json": b'{"new": 1}'})
    got = read_tree(dest)
    assert got == {**NEW, "summary.json": b'{"new": 1}', "notes.txt": b"mine", "mine/a.txt": b"a"}
    assert _beside(tmp_path) == ["out"]


def test_a_finished_output_part_is_handed_to_the_disk_before_its_rename(tmp_path, monkeypatch):
    """``write_part`` starts the write-back of a Parquet part of the output as soon as it is
    written (whole, under its temporary name), so the commit's fsync finds little left; a job's
    intermediate Arrow IPC file is never written back (it is removed at the end)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    seen: list[tuple[str, int]] = []
    real = fs.start_writeback

    def spy(fd: int, offset: int = 0, count: int = 0) -> bool:
        path = os.readlink(f"/proc/self/fd/{fd}")
        seen.append((os.path.basename(path), os.fstat(fd).st_size))
        return real(fd, offset, count)

    monkeypatch.setattr(fs, "start_writeback", spy)
    table = pa.table({"x": list(range(1000))})
    path, rows = output_dir.write_part(
        str(tmp_path), "part-0.parquet", table.schema, table.to_batches()
    )
    assert rows == 1000 and pq.read_table(path).equals(table)
    assert len(seen) == 1
    name, size = seen[0]
    assert name.startswith(".part-0.parquet-") and name.endswith(".tmp")
    assert size == os.path.getsize(path)  # the whole file, footer included
    output_dir.write_part(
        str(tmp_path), "w.arrow", table.schema, table.to_batches(), "zstd", arrow_ipc=True
    )
    assert len(seen) == 1


def test_start_writeback_is_taken_for_a_written_file_and_only_a_no_for_a_bad_fd(tmp_path):
    body = os.urandom(1 << 20)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fs.write_all(fd, body)
        assert fs.start_writeback(fd) is True
        assert fs.start_writeback(fd, 4096, len(body) - 4096) is True
    finally:
        os.close(fd)
    assert fs.start_writeback(fd) is False  # closed: refused, no exception
    assert (tmp_path / "f").read_bytes() == body


def test_a_part_the_hint_cannot_open_is_still_written(tmp_path, monkeypatch):
    """The write-back is only a hint: a part file it cannot open (a file system that refuses a
    second open) is written and renamed as ever, and left to the commit's fsync."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    real = fs.open

    def refuse_read_only(path, flags, *mode):
        if flags == os.O_RDONLY:
            raise PermissionError(13, "refused", str(path))
        return real(path, flags, *mode)

    monkeypatch.setattr(fs, "open", refuse_read_only)
    table = pa.table({"x": [1, 2, 3]})
    path, rows = output_dir.write_part(str(tmp_path), "p.parquet", table.schema, table.to_batches())
    assert rows == 3 and pq.read_table(path).equals(table)


def test_the_output_lock_is_one_job_at_a_time_and_let_go_at_the_end(tmp_path):
    """``cardinal-blocks`` holds it for its whole run (found from outside: a second run on the
    same --out failed with ~100 lines of Spark's SparkConcurrentModificationException)."""
    from loglake.pipeline.errors import JobFailed

    dest = tmp_path / "deep" / "out"
    busy = pytest.raises(JobFailed, match="another job is writing")
    with output_dir.output_lock(dest), busy, output_dir.output_lock(dest):
        pass
    with output_dir.output_lock(dest):
        pass
