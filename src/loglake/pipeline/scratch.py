"""Where a job's tasks leave intermediate files: in memory (tmpfs) when there is room, else
on disk.

Why: a job's scratch (archives-build's spills: every record's bytes, once more) written into
the page cache of a disk filesystem counts toward the kernel's dirty-page thresholds
(``vm.dirty_background_ratio``, ``vm.dirty_ratio``). Past them the kernel writes the scratch
out to the disk, which is wasted disk bandwidth taken from the job's durable output, and
throttles every writer of the machine. Files on tmpfs (``/dev/shm``) are never written back
and are not dirty pages, so the disk only writes what the job keeps. At 10 M messages this
took archives-build's scan and build from disk-bound to CPU-bound.

Memory is used only where every executor shares the driver's ``/dev/shm``: a ``local[*]``
master (``mode="auto"``), or where the user says so (``mode="memory"``, e.g. a standalone
cluster whose workers run on this machine). Each file goes to memory only if tmpfs and the
machine's available memory both have room for it beside ``reserve_bytes`` (tmpfs pages are
not reclaimable without swap: scratch must not starve the JVM and the Python workers), and a
write that fails there (full, or a directory this executor cannot see) is written again on
disk. Readers look in memory first, then on disk.

A job's memory scratch lives in ``/dev/shm/loglake-<key>/<job>``, ``key`` naming the job's
output (``scratch_key``): a killed run's leftovers are removed by the next run on the same
output (``clear_stale``), which holds that output's lock.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MEMORY_ROOT = "/dev/shm"
MODES = ("auto", "memory", "disk")


def scratch_key(purpose: str, output: Path) -> str:
    """One name per (job kind, output): a run's memory scratch is found by the next run's
    ``clear_stale`` on the same output, and never by a run on another one."""
    return f"{purpose}-{hashlib.sha256(str(output).encode()).hexdigest()[:16]}"


def _is_tmpfs(path: str) -> bool:
    """Whether ``path`` is a tmpfs mount (its pages are never written back to a disk)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                if fields[4] == path and fields[sep + 1] == "tmpfs":
                    return True
    except (OSError, ValueError, IndexError):
        return False
    return False


def _mem_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (0 if unreadable: then no memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _mem_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 0


@dataclass(frozen=True)
class Scratch:
    """A job's scratch folders (picklable: tasks get it in their closure)."""

    disk: str
    memory: str | None = None
    reserve_bytes: int = 1 << 30

    def _memory_has_room(self, nbytes: int) -> bool:
        if self.memory is None:
            return False
        try:
            st = os.statvfs(self.memory)
        except OSError:  # not on this executor's machine
            return False
        need = nbytes + self.reserve_bytes
        return st.f_bavail * st.f_frsize >= need and _mem_available() >= need

    def write(self, name: str, nbytes: int, write: Callable[[str], None]) -> str:
        """``write(path)`` a new file ``name`` of about ``nbytes`` under a temporary name,
        then renamed (a retried task rewrites it): in memory if there is room, else (or if
        the write fails there) on disk. Returns where it is."""
        dirs = [self.memory, self.disk] if self._memory_has_room(nbytes) else [self.disk]
        for d in dirs:
            assert d is not None
            path = os.path.join(d, name)
            tmp = f"{path}.tmp"
            try:
                write(tmp)
                os.replace(tmp, path)
                return path
            except OSError:
                if d == self.disk:
                    raise
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        raise AssertionError("unreachable: the disk is always the last folder")

    def _folders(self) -> list[str]:
        """Memory first, then disk: where files are written and looked for."""
        return [d for d in (self.memory, self.disk) if d is not None]

    def find(self, name: str) -> str | None:
        """Where ``name`` was written (memory first), or None if it never was."""
        for d in self._folders():
            path = os.path.join(d, name)
            if os.path.exists(path):
                return path
        return None

    def unlink(self, pattern: str) -> None:
        """Remove the files matching ``pattern`` (a glob) from both folders: scratch no
        longer needed frees its memory before the job's end."""
        for d in self._folders():
            for path in glob.glob(os.path.join(glob.escape(d), pattern)):
                os.unlink(path)

    def remove(self) -> None:
        """Both folders and everything in them (the end of the job, failed or not)."""
        for d in self._folders():
            shutil.rmtree(d, ignore_errors=True)
        if self.memory is not None:
            with contextlib.suppress(OSError):  # the key's folder, if no other run is left
                os.rmdir(os.path.dirname(self.memory))


def open_scratch(
    disk: Path, key: str, job: str, mode: str = "auto", local_master: bool = True
) -> Scratch:
    """The job's scratch: ``disk`` (made here) always, as the fallback; and a memory folder
    unless ``mode`` is ``"disk"``, the master is not local and ``mode`` is ``"auto"``, or no
    tmpfs is mounted at ``MEMORY_ROOT``."""
    if mode not in MODES:
        raise ValueError(f"scratch mode {mode!r}: use one of {', '.join(MODES)}")
    disk.mkdir(parents=True, exist_ok=True)
    reserve = max(1 << 30, _mem_total() // 8)
    use_memory = mode == "memory" or (mode == "auto" and local_master)
    if not use_memory or not _is_tmpfs(MEMORY_ROOT):
        return Scratch(str(disk), None, reserve)
    memory = os.path.join(MEMORY_ROOT, f"loglake-{key}", job)
    try:
        os.makedirs(memory, mode=0o700)
    except OSError:
        return Scratch(str(disk), None, reserve)
    return Scratch(str(disk), memory, reserve)


def clear_stale(key: str) -> None:
    """Remove the memory scratch of every earlier run with ``key`` (killed runs leave theirs).
    The caller holds the lock that makes it the only run with this key."""
    shutil.rmtree(os.path.join(MEMORY_ROOT, f"loglake-{key}"), ignore_errors=True)
