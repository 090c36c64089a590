"""The storage engine's file layer: every call that changes what is on disk goes through here.

Why: durability is a property of the exact sequence of write / fsync / rename / unlink calls.
With one seam, a test can put a simulated disk under the log (``tests/log/simdisk.py``: writes
stay in a volatile page cache until fsynced, a "power loss" keeps a seeded subset of them, as
ALICE and LazyFS model it) and inject faults (ENOSPC, EIO, short writes) without touching the
engine's code. Callers must use ``fs.write(...)`` (looked up at call time), never
``from loglake.log.fs import write``, so that replacing an attribute of this module takes effect.

Reads that cannot change the disk (``open(..., "rb")``, ``os.path``) need not come through here,
but ``pread``, ``listdir`` and ``stat`` do, so a simulated disk can serve them from its own view.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

open = os.open  # the os name, on purpose: fs.open(path, flags, mode) -> fd
close = os.close
dup = os.dup
write = os.write
pwrite = os.pwrite
pread = os.pread
fsync = os.fsync
fdatasync = os.fdatasync
ftruncate = os.ftruncate
truncate = os.truncate
replace = os.replace
unlink = os.unlink
mkdir = os.mkdir
rmdir = os.rmdir
listdir = os.listdir
stat = os.stat


def pread_named(fd: int, n: int, offset: int, path: str | Path) -> bytes:
    """``pread`` of ``fd``, the descriptor of ``path``, whose error names ``path``.

    Why: an error of a call on a descriptor names no file. Found from outside: a segment that
    was a directory made ``loglake log info`` print ``Error: Is a directory`` (``open`` of a
    directory succeeds; its first read fails) — one line, but not which file."""
    try:
        return pread(fd, n, offset)
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def read_file(path: str | Path) -> bytes:
    """The whole file, through ``fs.open``/``fs.pread`` so a simulated disk can serve it."""
    fd = open(path, os.O_RDONLY)
    try:
        size = stat(path).st_size
        first = pread_named(fd, size, 0, path)
        if len(first) == size:  # the usual case: no copy (a sealed segment is 64 MiB)
            return first
        out = bytearray(first)
        while first and len(out) < size:
            chunk = pread_named(fd, size - len(out), len(out), path)
            if not chunk:
                break
            out += chunk
        return bytes(out)
    finally:
        close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """``write`` until every byte is written (a short write is retried, an error raised)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = write(fd, view[done:])
        if n <= 0:
            raise OSError(f"write returned {n}")
        done += n


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``pwrite`` of ``data`` at ``offset`` until every byte is written, as ``write_all``."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(f"pwrite returned {n}")
        done += n


_writev = os.writev
"""Private, not a primitive: ``writev_all`` uses it only while ``write`` is the real one."""
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""A disk out of space: ENOSPC, or EDQUOT (a quota is a full disk to this user)."""

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
"""Buffers one ``writev`` call may take (1,024 on Linux)."""


def writev_all(
    fd: int, parts: Sequence[bytes | bytearray | memoryview], size: int | None = None
) -> None:
    """Write the concatenation of ``parts`` (an encoded batch: heads and the records' data as
    given), with ``writev`` and no join: until every byte is written (a short write is
    retried from where it stopped, an error raised), as ``write_all``.

    Why a helper and not a primitive: while a layer has replaced ``write`` (the simulated disk
    of ``tests/log/simdisk.py``, a fault-injecting file layer), the same bytes go through that
    ``write`` — joined, and with ``write_all``'s retries — so the layer sees, keeps or fails
    every byte as before; only the real ``os.write`` is bypassed by ``os.writev``.

    ``size``: the bytes ``parts`` hold, if the caller knows (a whole write in one call then
    costs no sum and no copy of the list: a one-record append)."""
    if write is not os.write:
        write_all(fd, b"".join(parts))
        return
    writev = _writev
    start, end = 0, len(parts)
    while start < end:
        if start == 0 and size is not None and end <= IOV_MAX:
            stop, group, want = end, parts, size
        else:
            stop = min(end, start + IOV_MAX)
            group = parts[start:stop]
            want = sum(map(len, group))
        n = writev(fd, group)
        if n <= 0 and want:
            raise OSError(f"writev returned {n}")
        if n == want:
            start = stop
            continue
        # a short write: skip the whole parts written, finish the one it stopped in
        for i, part in enumerate(group):
            k = len(part)
            if n < k:
                write_all(fd, memoryview(part)[n:])
                start += i + 1
                break
            n -= k


def fsync_file(path: str | Path) -> None:
    """Make a file's data durable by path (a file written earlier, or by someone else)."""
    fd = open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        close(fd)


class LockHeld(BlockingIOError):
    """``lock_file``: another open of the lock file (another process, or another ``lock_file``
    in this one) holds its lock. Each caller turns it into its own error and wording."""


def lock_file(path: str | Path, *, blocking: bool = False) -> int:
    """An exclusive ``flock`` on ``path`` (created, mode 0o644, if missing); the fd holding it.

    Why one helper: the log's writer lock, the repair's, the compact and archives-build jobs',
    the node's and the lake's were each written by hand, and the log's leaked the fd when ``flock``
    failed other than by contention. Here any failure closes the fd; contention raises
    ``LockHeld`` at once, or with ``blocking`` the call waits for the holder. The lock goes
    with the fd: close it (``fs.close``) to release it, and a process that dies releases it,
    so no stale lock file is ever left to clean up. The file carries no data and is not made
    durable (a crash may lose the empty file; the next call creates it again)."""
    fd = open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        close(fd)
        raise LockHeld(errno.EWOULDBLOCK, "locked by another process", str(path)) from None
    except BaseException:
        close(fd)
        raise
    return fd


SYNC_FILE_RANGE_WRITE = 2
"""``sync_file_range`` flag (linux/fs.h): start writing the range's dirty pages, do not wait."""


@functools.cache
def _sync_file_range() -> Callable[..., int] | None:
    """libc's ``sync_file_range`` through ``ctypes`` (the standard library has no binding), or
    None where libc has none (not Linux)."""
    import ctypes

    fn = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if fn is None:
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int, offset: int = 0, count: int = 0) -> bool:
    """Ask the kernel to start writing a file's dirty pages in ``[offset, offset + count)``
    (``count`` 0: to the end of the file) to the disk, without waiting for them.

    Why: a job's output is fsync'd once, when it is committed; the kernel starts writing dirty
    pages back on its own only past its background threshold (10% of memory) or after 30 s, so
    that fsync waited alone for everything the job wrote while every core sat idle. Started as
    each file is written, the disk works while the job computes the next ones. Only a hint, so
    it changes no durability rule: the commit's fsync still decides, and a refusal (an fd the
    kernel does not take, no such call outside Linux) is a False, never an error."""
    fn = _sync_file_range()
    return fn is not None and fn(fd, offset, count, SYNC_FILE_RANGE_WRITE) == 0


def fsync_dir(path: str | Path) -> None:
    """Make a folder's entries (created, renamed, removed files) durable."""
    fd = open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        close(fd)


_UNSYNCED: set[Path] = set()
"""Folders this process created whose entry is not known durable: the fsync of their parent
failed (or has not run yet). A later ``makedirs_durable`` finds them existing, so without this
it would skip that fsync, and a power loss could still take the folder and all under it."""


def makedirs_durable(path: str | Path) -> None:
    """``mkdir -p``, then fsync every folder whose entries changed — including one created by
    an earlier call whose folder fsync failed — so no created folder can vanish after a
    crash."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            mkdir(d)
        _UNSYNCED.add(d)
    for d in reversed([p for p in (path, *path.parents) if p in _UNSYNCED]):  # top down
        fsync_dir(d.parent)
        _UNSYNCED.discard(d)
    if missing:
        fsync_dir(path)


def _write_and_close(fd: int, data: bytes | memoryview) -> None:
    """Every byte of ``data`` written to ``fd`` and fsynced; ``fd`` closed either way."""
    try:
        write_all(fd, data)
        fsync(fd)
    finally:
        close(fd)


def create_exclusive(path: str | Path, data: bytes, mode: int = 0o600) -> bool:
    """``data`` written to a new file ``path`` (created exclusively, ``mode``, fsynced with its
    folder): True; False if ``path`` exists (nothing written). A write that fails removes the
    half-written file (a full disk left an empty secret, refused at every later start) and
    an ``OSError`` names ``path``. The node's token and keys."""
    path = Path(path)
    try:
        fd = open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    try:
        _write_and_close(fd, data)
        fsync_dir(path.parent)
    except BaseException as e:
        with contextlib.suppress(OSError):
            unlink(path)
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    return True


def replace_file_atomic(
    path: str | Path, data: bytes | memoryview, tmp: str | Path | None = None
) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old or the new whole file:
    write a temporary file beside it (``tmp``, default ``path`` + ``.tmp``), check every byte
    landed, fsync it, rename it over ``path``, fsync the folder."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp") if tmp is None else Path(tmp)
    fd = open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_and_close(fd, data)
    except BaseException:
        with contextlib.suppress(OSError):
            unlink(tmp)
        raise
    replace(tmp, path)
    fsync_dir(path.parent)
