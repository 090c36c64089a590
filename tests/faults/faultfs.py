"""A seeded failing-file layer over ``loglake.log.fs`` (issue 15 §3): ENOSPC and EIO on write
and on fsync, short writes, and (opt-in) EIO on ``pread``, for every part that goes through
``fs``.

Why on top of ``tests/log/simdisk.py``: a failed fsync is only dangerous because of what it
does to durability — Linux drops the dirty pages it could not write and marks them clean, so a
retried fsync "succeeds" without writing them (PostgreSQL's "fsyncgate"). ``SimDisk`` models
exactly that (``fail_fsync_after``), and a power loss after the fault episode
(``SimDisk.restart``) shows whether anything acknowledged depended on a failed fsync. This
layer adds the faults ``SimDisk`` does not make: ENOSPC and EIO from ``write``/``pwrite``
(nothing written), short writes (a prefix written, its length returned, as a nearly full disk
does: cut at a block boundary), and ENOSPC from fsync (raised like the simulated EIO, with the
same lost pages).

Use::

    with SimDisk(tmp_path) as disk, FaultyFs(disk, random.Random(seed), rate=0.05) as faults:
        ... run the part on disk.root ...
        faults.active = False      # the fault clears (space freed, the device is back)
        disk.restart(rng)          # a power loss: only what was fsynced survives

Faults hit only regular files under ``disk.root`` whose name matches ``only`` (a substring
test on the path; None: all). Every decision comes from the seeded ``rng``, so a single-threaded
part replays exactly. ``injected`` counts each kind.
"""

from __future__ import annotations

import errno
import os
import random
import stat
from collections import Counter
from collections.abc import Callable
from typing import Any

from loglake.log import fs
from tests.log.simdisk import SimDisk

KINDS = ("write-enospc", "write-eio", "short-write", "fsync-enospc", "fsync-eio")
DIR_FSYNC = "dir-fsync-eio"
"""Opt-in (not in ``KINDS``, so the seeded runs of the file kinds replay as before): a folder's
fsync fails with EIO and makes none of its pending entries durable — a created, renamed or
removed file may then come back, or not, at the next power loss."""

READ_EIO = "read-eio"
"""Opt-in (not in ``KINDS``, like ``DIR_FSYNC``): ``pread`` fails with EIO and reads nothing —
a bad sector, a device that went away. Every read of the log, the consumer store and the
watermarks goes through ``fs.pread`` (``fs.read_file`` too), and so do SQLite's ``xRead`` over
``sqlite_vfs.FsVfs``; pyarrow's own reads of lake files do not. A read changes nothing on
disk, so what the kind checks is the reader: a clear error, nothing lost, nothing marked
failed for writes, and reads that work again once the fault clears."""

_WRAPPED = ("write", "pwrite", "fsync", "fdatasync", "pread")
BLOCK = 4096
"""The file system's block: a short write on a full disk stops at one."""


class FaultyFs:
    def __init__(
        self,
        disk: SimDisk,
        rng: random.Random,
        rate: float = 0.05,
        kinds: tuple[str, ...] = KINDS,
        only: tuple[str, ...] | None = None,
        read_rate: float | None = None,
    ) -> None:
        """``read_rate``: the chance a ``pread`` fails (with ``READ_EIO`` in ``kinds``); None:
        ``rate``. Opening a part reads far more often than one operation writes (every
        config, watermark, segment tail and index), so a read rate as high as the write rate
        would fail nearly every open and leave nothing else tested."""
        unknown = set(kinds) - {*KINDS, DIR_FSYNC, READ_EIO}
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        self.disk = disk
        self.rng = rng
        self.rate = rate
        self.read_rate = rate if read_rate is None else read_rate
        self.kinds = kinds
        self.only = only
        self.active = True
        self.injected: Counter[str] = Counter()
        self._saved: dict[str, Callable[..., Any]] = {}

    # -- which calls may fail ----------------------------------------------------------------
    def _target(self, fd: int, folders: bool = False) -> str | None:
        """The path of ``fd`` if it is a regular file (or, with ``folders``, a folder) a fault
        may hit, else None."""
        if not self.active:
            return None
        try:
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISREG(mode) or (folders and stat.S_ISDIR(mode))):
                return None
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        root = str(self.disk.root)
        if not path.startswith(root + os.sep):
            return None
        if self.only is not None and not any(o in path for o in self.only):
            return None
        return path

    def _draw(
        self, fd: int, kinds: tuple[str, ...], folders: bool = False, rate: float | None = None
    ) -> str | None:
        allowed = [k for k in kinds if k in self.kinds]
        target = self._target(fd, True) if folders else self._target(fd)  # subclasses: (fd)
        rate = self.rate if rate is None else rate
        if not allowed or target is None or self.rng.random() >= rate:
            return None
        kind = self.rng.choice(allowed)
        self.injected[kind] += 1
        return kind

    # -- the wrapped calls -------------------------------------------------------------------
    def _write(self, real: Callable[..., int], fd: int, data: Any, *rest: Any) -> int:
        kind = self._draw(fd, ("write-enospc", "write-eio", "short-write"))
        if kind == "write-enospc":
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        if kind == "write-eio":
            raise OSError(errno.EIO, "Input/output error (injected)")
        view = memoryview(data)
        if kind == "short-write":
            # a nearly full disk writes the blocks it could allocate: the write stops at a
            # block boundary of the file; one that ends inside its first block fails whole
            start = rest[0] if rest else self._end_or_pos(fd)
            cut = (start // BLOCK + 1) * BLOCK - start
            cuts = range(cut, len(view), BLOCK)
            if not cuts:
                self.injected["short-write"] -= 1
                self.injected["write-enospc"] += 1
                raise OSError(errno.ENOSPC, "No space left on device (injected, short write)")
            return real(fd, view[: self.rng.choice(cuts)], *rest)
        return real(fd, data, *rest)

    @staticmethod
    def _is_folder(fd: int) -> bool:
        try:
            return stat.S_ISDIR(os.fstat(fd).st_mode)
        except OSError:
            return False

    @staticmethod
    def _end_or_pos(fd: int) -> int:
        """Where a ``write`` on ``fd`` lands: the end for ``O_APPEND``, else the position."""
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
            return os.fstat(fd).st_size
        return os.lseek(fd, 0, os.SEEK_CUR)

    def _read(self, real: Callable[[int, int, int], bytes], fd: int, n: int, off: int) -> bytes:
        if self._draw(fd, (READ_EIO,), rate=self.read_rate):
            raise OSError(errno.EIO, "Input/output error (injected, read)")
        return real(fd, n, off)

    def _sync(self, real: Callable[[int], None], fd: int) -> None:
        if DIR_FSYNC in self.kinds and self._is_folder(fd):
            if self._draw(fd, (DIR_FSYNC,), folders=True):
                raise OSError(errno.EIO, "Input/output error (injected, folder fsync)")
            real(fd)
            return
        kind = self._draw(fd, ("fsync-enospc", "fsync-eio"))
        if kind is None:
            real(fd)
            return
        # SimDisk drops the pages this fsync should have written, as Linux does
        self.disk.fail_fsync_after(1)
        try:
            real(fd)
        except OSError as e:
            if kind == "fsync-enospc":
                raise OSError(errno.ENOSPC, "No space left on device (injected)") from e
            raise
        finally:
            self.disk.fail_fsync_after(None)
        raise AssertionError("SimDisk did not fail the fsync it was told to fail")

    def __enter__(self) -> FaultyFs:
        for name in _WRAPPED:
            self._saved[name] = getattr(fs, name)
        w, pw = self._saved["write"], self._saved["pwrite"]
        fsy, fds = self._saved["fsync"], self._saved["fdatasync"]
        fs.write = lambda fd, data: self._write(w, fd, data)  # type: ignore[assignment]
        fs.pwrite = lambda fd, data, off: self._write(pw, fd, data, off)  # type: ignore[assignment]
        fs.fsync = lambda fd: self._sync(fsy, fd)  # type: ignore[assignment]
        fs.fdatasync = lambda fd: self._sync(fds, fd)  # type: ignore[assignment]
        if READ_EIO in self.kinds:  # only then: the other kinds' runs pay nothing per read
            pr = self._saved["pread"]
            fs.pread = lambda fd, n, off: self._read(pr, fd, n, off)  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for name, value in self._saved.items():
            setattr(fs, name, value)
        self._saved.clear()
