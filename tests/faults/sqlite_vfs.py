"""A SQLite VFS whose file data goes through ``loglake.log.fs``, so the seeded failing-file
layer (``faultfs.FaultyFs``) and the simulated disk (``tests/log/simdisk.SimDisk``) sit under
the archives working store (``loglake.archives.store``) as they sit under every other part
(issue 15 §3).

Why through ``fs`` rather than a model of its own: ``SimDisk`` already is the disk model the
other parts are held to — a page cache that only fsync empties, folder entries durable only once
the folder is fsynced, a power loss that keeps a seeded subset of the unsynced writes (none,
all, a torn prefix, or reordered sectors), and a failed fsync that drops the pages it should
have written while reads still see them (Linux since 4.13, "fsyncgate"). ``FaultyFs`` makes
ENOSPC and EIO on write and on fsync, and short writes, from a seeded ``random.Random`` at a
rate. Both work by replacing ``loglake.log.fs``'s functions, and SQLite's own I/O never calls
them; this VFS makes it.

What goes where:

- ``FsVfs`` inherits SQLite's default VFS (``unix``): path names, ``xAccess``, randomness,
  time, and for each file the locks and the WAL's shared memory (``-shm``, memory-mapped by the
  ``unix`` VFS itself: volatile, never in the model; after a power loss SQLite rebuilds it from
  the WAL) stay the ``unix`` VFS's.
- ``FsFile`` (every named file: the database, its ``-wal``, its ``-journal``) opens the file a
  second time with ``fs.open`` and does ``xRead``/``xWrite``/``xTruncate``/``xSync``/
  ``xFileSize`` on that descriptor, as ``unix``'s ``os_unix.c`` does on its own: a failed write
  is ``SQLITE_FULL`` (ENOSPC) or ``SQLITE_IOERR_WRITE``; a *short* write (what a nearly full
  disk does) leaves its prefix written and is ``SQLITE_FULL``, which is where ``unixWrite``
  ends up when the retry of the rest finds no space; every failed fsync is
  ``SQLITE_IOERR_FSYNC``, whatever its errno, as in ``unixSync``; a journal or WAL that was
  opened to be created fsyncs its folder after its first fsync (``UNIXFILE_DIRSYNC``); ``xDelete``
  is ``fs.unlink`` and, when SQLite asks, ``fs.fsync_dir``.
- Unnamed files (SQLite's temporary files) are the ``unix`` VFS's own: no faults, outside the
  disk.

A power loss: ``disk.power_off()`` (every ``fs`` call then raises ``PowerLoss``, which this
VFS reports to SQLite as an I/O error: the process is gone and nothing more reaches the disk),
close the connection (``close_dead``), ``disk.restart(rng)``, open the store again at
``disk.root``.

Limits: one connection per database file in the process. POSIX locks belong to the process
and the inode, so closing this VFS's extra descriptor drops the ``unix`` VFS's locks on the same
file; with one connection the locks are already gone then (``xClose`` closes the ``unix`` file
first). Python's ``sqlite3`` (a second copy of SQLite) must not open the same file meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
from collections.abc import Iterator
from typing import Any

import apsw

from loglake.log import fs
from tests.log.simdisk import PowerLoss

_names = itertools.count(1)

_CREATE_SYNCS_DIR = (
    apsw.SQLITE_OPEN_MAIN_JOURNAL | apsw.SQLITE_OPEN_WAL | apsw.SQLITE_OPEN_SUPER_JOURNAL
)
"""File kinds whose creation ``unix`` makes durable by fsyncing the folder after the file's
first fsync (``os_unix.c``: ``syncDir``); the database file itself is not one of them."""


def _error(code: int, what: str, e: BaseException) -> apsw.Error:
    """The SQLite error ``code`` for an ``fs`` failure (``PowerLoss`` included: a dead disk
    fails every call)."""
    err = apsw.exception_for(code)
    assert isinstance(err, apsw.Error)
    err.args = (f"{what}: {e}",)
    return err


class FsFile(apsw.VFSFile):
    """One SQLite file whose data goes through ``loglake.log.fs`` (see the module docstring)."""

    def __init__(self, vfs: FsVfs, name: Any, path: str, flags: list[int]) -> None:
        self.path = path
        self.vfs = vfs
        want = flags[0]
        oflags = os.O_RDWR if want & apsw.SQLITE_OPEN_READWRITE else os.O_RDONLY
        if want & apsw.SQLITE_OPEN_CREATE:
            oflags |= os.O_CREAT
        try:
            # through fs first, so the simulated disk records the file's creation
            self.fd: int | None = fs.open(path, oflags | os.O_CLOEXEC, 0o644)
        except (OSError, PowerLoss) as e:
            raise _error(apsw.SQLITE_CANTOPEN, f"open {path}", e) from None
        try:
            super().__init__("", name, flags)  # the unix VFS's file: locks and -shm
        except BaseException:
            self._close_fd()
            raise
        self.dirsync = bool(want & apsw.SQLITE_OPEN_CREATE and want & _CREATE_SYNCS_DIR)

    def _fd(self) -> int:
        if self.fd is None:
            raise apsw.exception_for(apsw.SQLITE_IOERR)
        return self.fd

    def _close_fd(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError, PowerLoss):
                fs.close(fd)

    def xRead(self, amount: int, offset: int) -> bytes:
        try:
            out = bytearray()
            while len(out) < amount:
                chunk = fs.pread(self._fd(), amount - len(out), offset + len(out))
                if not chunk:
                    break  # a short read at the end: apsw zero-fills, SQLite knows the case
                out += chunk
            return bytes(out)
        except (OSError, PowerLoss) as e:
            raise _error(apsw.SQLITE_IOERR_READ, f"read {self.path}", e) from None

    def xWrite(self, data: Any, offset: int) -> None:
        view = memoryview(data).cast("B")
        try:
            n = fs.pwrite(self._fd(), view, offset)
        except OSError as e:
            full = e.errno == errno.ENOSPC
            code = apsw.SQLITE_FULL if full else apsw.SQLITE_IOERR_WRITE
            raise _error(code, f"write {self.path}", e) from None
        except PowerLoss as e:
            raise _error(apsw.SQLITE_IOERR_WRITE, f"write {self.path}", e) from None
        if n < len(view):  # the disk is full after the prefix it took
            short = OSError(errno.ENOSPC, f"short write ({n} of {len(view)} bytes)")
            raise _error(apsw.SQLITE_FULL, f"write {self.path}", short)

    def xTruncate(self, newsize: int) -> None:
        try:
            fs.ftruncate(self._fd(), newsize)
        except (OSError, PowerLoss) as e:
            raise _error(apsw.SQLITE_IOERR_TRUNCATE, f"truncate {self.path}", e) from None

    def xSync(self, flags: int) -> None:
        try:
            if flags & apsw.SQLITE_SYNC_DATAONLY:
                fs.fdatasync(self._fd())
            else:
                fs.fsync(self._fd())
        except (OSError, PowerLoss) as e:
            self.vfs.failed_syncs += 1
            raise _error(apsw.SQLITE_IOERR_FSYNC, f"fsync {self.path}", e) from None
        if self.dirsync:
            try:
                fs.fsync_dir(os.path.dirname(self.path))
            except (OSError, PowerLoss) as e:
                raise _error(apsw.SQLITE_IOERR_DIR_FSYNC, f"fsync dir of {self.path}", e) from None
            self.dirsync = False

    def xFileSize(self) -> int:
        try:
            return os.fstat(self._fd()).st_size
        except OSError as e:
            raise _error(apsw.SQLITE_IOERR_FSTAT, f"fstat {self.path}", e) from None

    def xClose(self) -> None:
        try:
            super().xClose()  # the unix file (and its locks) first
        finally:
            self._close_fd()


class FsVfs(apsw.VFS):
    """SQLite's default VFS with every named file's data through ``loglake.log.fs``. Open a
    store with ``MessageStore(path, vfs=v.name)``; ``unregister()`` when done (or use
    ``fs_vfs()``)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"loglake-fs-{next(_names)}"
        self.failed_syncs = 0
        """xSync calls that failed (SQLite was told)."""
        super().__init__(self.name, "")

    def xOpen(self, name: Any, flags: list[int]) -> apsw.VFSFile:
        path = name.filename() if isinstance(name, apsw.URIFilename) else name
        if not path:  # a temporary file: the unix VFS's own
            return apsw.VFSFile("", name, flags)
        return FsFile(self, name, path, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        try:
            fs.unlink(filename)
        except FileNotFoundError as e:
            raise _error(apsw.SQLITE_IOERR_DELETE_NOENT, f"delete {filename}", e) from None
        except (OSError, PowerLoss) as e:
            raise _error(apsw.SQLITE_IOERR_DELETE, f"delete {filename}", e) from None
        if syncdir:
            try:
                fs.fsync_dir(os.path.dirname(filename))
            except (OSError, PowerLoss) as e:
                raise _error(apsw.SQLITE_IOERR_DIR_FSYNC, f"fsync dir of {filename}", e) from None


_shared: FsVfs | None = None


def shared_vfs() -> FsVfs:
    """One ``FsVfs`` for the whole process, registered on first use: for harnesses that open
    stores in many places (``tests/faults/parts.py``). It holds no state but counters, so
    every test may share it."""
    global _shared
    if _shared is None:
        _shared = FsVfs("loglake-fs")
    return _shared


@contextlib.contextmanager
def fs_vfs() -> Iterator[FsVfs]:
    """A registered ``FsVfs`` for the ``with`` block."""
    v = FsVfs()
    try:
        yield v
    finally:
        v.unregister()


def close_dead(db: apsw.Connection) -> None:
    """Close a connection whose disk lost power: SQLite's closing checkpoint fails (the VFS
    reports every call as an I/O error) and nothing reaches the disk; errors are the dead
    process's, not the caller's."""
    with contextlib.suppress(apsw.Error):
        db.close()
