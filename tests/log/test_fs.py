"""``loglake.log.fs.lock_file``: the one ``flock`` every lock file of loglake goes through (the
log's writer lock, the repair's, the compact and archives-build jobs', the node's, the lake's).

Each caller's own refusal (``LogLocked``, ``RepairRefused``, ``JobFailed``, ``NodeStartError``)
is tested beside the caller; these are the rules they all rely on, against the kernel's
``flock`` (flock(2): the lock belongs to the open file description and goes with its last
descriptor)."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import threading

import pytest

from loglake.log import LogLocked, fs, open_log


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_held_lock_is_refused_at_once_with_lock_held_and_no_fd(tmp_path):
    path = tmp_path / "x.lock"
    fd = fs.lock_file(path)
    try:
        before = _open_fds()
        with pytest.raises(fs.LockHeld) as e:
            fs.lock_file(path)  # another open file description: refused, as another process
        assert isinstance(e.value, BlockingIOError) and e.value.filename == str(path)
        assert _open_fds() == before
    finally:
        fs.close(fd)
    fs.close(fs.lock_file(path))  # closing the fd released it


def test_another_process_is_refused_while_the_lock_is_held(tmp_path):
    path = tmp_path / "x.lock"
    code = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except BlockingIOError:\n    sys.exit(3)\n"
    )
    fd = fs.lock_file(path)
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(path)], timeout=60)
        assert proc.returncode == 3
    finally:
        fs.close(fd)
    assert subprocess.run([sys.executable, "-c", code, str(path)], timeout=60).returncode == 0


def test_the_file_is_created_once_and_kept(tmp_path):
    path = tmp_path / "x.lock"
    fs.close(fs.lock_file(path))
    assert path.read_bytes() == b"" and path.stat().st_mode & 0o777 == 0o644 & ~_umask()
    fs.close(fs.lock_file(path))  # an existing lock file is taken as is
    assert path.exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_blocking_lock_waits_for_the_holder(tmp_path):
    path = tmp_path / "x.lock"
    fd = fs.lock_file(path)
    got = threading.Event()

    def waiter() -> None:
        fs.close(fs.lock_file(path, blocking=True))
        got.set()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    assert not got.wait(0.3)  # still waiting while the lock is held
    fs.close(fd)
    assert got.wait(30)
    t.join(30)


def test_a_failed_flock_closes_the_fd(tmp_path, monkeypatch):
    """Not contention (ENOLCK: a file system that cannot lock, an NFS mount without lockd):
    the error itself, and no fd left open."""

    def enolck(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", enolck)
    before = _open_fds()
    with pytest.raises(OSError) as e:
        fs.lock_file(tmp_path / "x.lock")
    assert e.value.errno == errno.ENOLCK and not isinstance(e.value, fs.LockHeld)
    assert _open_fds() == before


def test_a_log_whose_lock_cannot_be_taken_leaks_no_fd(tmp_path, monkeypatch):
    """The log's writer lock closed its fd only on contention: a data dir on a file system
    that cannot lock left one fd open per attempt."""
    (tmp_path / "d").mkdir()
    with open_log(tmp_path / "d"):
        pass
    real = fcntl.flock

    def enolck(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", enolck)
    before = _open_fds()
    for _ in range(3):
        with pytest.raises(OSError) as e:
            open_log(tmp_path / "d")
        assert e.value.errno == errno.ENOLCK and not isinstance(e.value, LogLocked)
    assert _open_fds() == before
