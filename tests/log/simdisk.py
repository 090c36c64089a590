"""A simulated disk under ``loglake.log.fs``: a volatile page cache, and power loss from a seed.

Why: a SIGKILL leaves the kernel's page cache intact, so a crash test that only kills the writer
passes even with every fsync removed. What an acknowledgement really promises is what survives
losing power, and that depends on the exact sequence of write / fsync / rename / unlink / fsync of
a folder. ``SimDisk`` replaces the functions of ``loglake.log.fs`` (the storage engine's one file
layer) and keeps, beside the real files, a model of what the disk has durably; ``restart(rng)``
then builds the disk as a power loss could have left it. The model is the one of ALICE
(Pillai et al., OSDI 2014, "All File Systems Are Not Created Equal") and LazyFS (Ramos et al.,
VLDB 2024): a page cache that only fsync empties. TigerBeetle's VOPR is the model for driving it:
everything comes from one seed, and a failing seed replays.

The model
---------
- **Running**: the engine works on real files in a temporary folder (``root``), so every read,
  through ``fs`` or not (``open(..., "rb")``, ``os.path``, pyarrow), sees the latest (cached)
  state. Real fsyncs are skipped (the model decides what is durable), which also makes it fast.
- **File data** is durable once ``fs.fsync``/``fs.fdatasync`` ran on the file: the file's
  content at that moment becomes its durable content. Writes, ``ftruncate``/``truncate`` and
  ``O_TRUNC`` after that are *pending*, recorded in order with their offsets and bytes.
- **Folder entries** (a file created, a rename, an unlink, a ``mkdir``/``rmdir``) are durable
  only once the folder itself was fsynced (``fs.fsync_dir``, or ``fs.fsync`` of a folder's fd):
  the folder's listing at that moment becomes its durable listing; later entry changes are
  pending, in order. fsyncing a new file does not make its name durable (the strict, portable
  rule; ext4 happens to be kinder), and a folder that was created but whose parent was never
  fsynced vanishes with everything in it.
- **Power loss** (``power_off()``, or the crash point set by ``crash_after(n)``: the n-th
  mutating ``fs`` call from now does not happen) freezes the model; every later ``fs`` call, from
  any thread, raises ``PowerLoss``. ``restart(rng)`` then writes the post-crash disk into a new
  folder and makes it the current one (everything on it is durable: it *is* the disk after
  reboot). Each folder keeps its durable listing plus a random prefix of its pending entry
  changes (journaled metadata is ordered; a rename is atomic). Each file keeps its durable
  content plus one of, drawn from ``rng`` per file:

  - ``all``: every pending write (what a SIGKILL leaves);
  - ``none``: no pending write (LazyFS's "clear cache");
  - ``prefix``: the first k pending writes and then part of the next one, torn at a
    ``SECTOR``-byte boundary of the file;
  - ``reorder``: a random subset of the pending writes, each cut into sectors of which a random
    subset is kept, applied in a random order (writeback order is not write order); a sector
    past the end of the file that was not written may read back as zeros (the size reached the
    disk, the data did not).

  Missing bytes inside a file read as zeros.

- **fsync failure** (``fail_fsync_after(n)``): the n-th fsync of a file raises EIO, and what it
  should have written never reaches the disk, though reads still see it and a later fsync of the
  same file succeeds without writing it (Linux's behaviour since 4.13, PostgreSQL's
  "fsyncgate"): an engine that retries the fsync, or goes on appending, loses acknowledged data.

Bytes written outside ``fs`` (there should be none under ``loglake.log``) are invisible to the
model until an fsync through ``fs`` captures the file whole; paths outside ``root`` pass through
untouched. ``fsync=False`` makes fsync (of files and folders) do nothing: the test-only switch
that proves a checker can see losses.

Thread safety: one lock serialises every simulated call, so an fsync captures exactly the writes
that returned before it. With several threads, *which* call is the n-th depends on scheduling, so
a seed replays exactly only when one thread touches the disk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import random
import shutil
import stat as statmod
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from loglake.log import fs

SECTOR = 512
"""The unit a disk writes atomically (a torn write keeps whole sectors)."""

FILE_MODES = ("all", "none", "prefix", "reorder")
FILE_MODE_WEIGHTS = (15, 15, 40, 30)

SIMULATED = (
    "open",
    "close",
    "dup",
    "write",
    "pwrite",
    "pread",
    "fsync",
    "fdatasync",
    "start_writeback",
    "ftruncate",
    "truncate",
    "replace",
    "unlink",
    "mkdir",
    "rmdir",
    "listdir",
    "stat",
)
"""Every primitive of ``loglake.log.fs`` this module replaces. The helpers built on them
(``read_file``, ``pread_named``, ``write_all``, ``pwrite_all``, ``writev_all``, ``fsync_file``,
``fsync_dir``, ``makedirs_durable``, ``replace_file_atomic``, ``create_exclusive``, ``lock_file``)
look them up at call time, so they run on the simulated disk unchanged. ``lock_file``'s
``flock`` is the real one, outside this module's lock (a blocking wait must not stop every
other simulated call): the lock file is a real file, and ``restart`` closes the fds of the
dead process, which releases its locks as a process exit does."""

HELPERS = {
    "read_file",
    "pread_named",
    "write_all",
    "pwrite_all",
    "writev_all",
    "fsync_file",
    "fsync_dir",
    "makedirs_durable",
    "replace_file_atomic",
    "create_exclusive",
    "lock_file",
}


class PowerLoss(BaseException):
    """Raised by every ``fs`` call once the simulated power is off. A ``BaseException`` so that
    no ``except Exception`` / ``except OSError`` in the engine mistakes it for a disk error it
    can handle: the process is simply gone."""


@dataclass
class _File:
    id: int
    durable: bytes = b""
    pending: list[tuple] = field(default_factory=list)
    """``("w", offset, data)`` and ``("t", size)`` since the last fsync, in order."""
    lost: list[tuple[int, bytes]] = field(default_factory=list)
    """``(offset, bytes on disk)`` of writes an failed fsync dropped: the page cache still
    shows the new bytes (the pages were marked clean), the disk keeps the old ones, and no
    later fsync writes them (Linux since 4.13; PostgreSQL's "fsyncgate")."""


@dataclass
class _Dir:
    id: int
    durable: dict[str, int] = field(default_factory=dict)
    pending: list[tuple] = field(default_factory=list)
    """``("link", name, node)``, ``("unlink", name)``, ``("rename", src, dst, node)``."""


@dataclass
class CrashReport:
    """What one power loss kept and dropped (for failure messages and benchmark figures)."""

    ops: int
    """Mutating ``fs`` calls of the life that ended."""
    files: dict[str, str] = field(default_factory=dict)
    """path (relative to the new root) → mode, for files that had pending writes."""
    writes_pending: int = 0
    writes_kept: int = 0
    writes_torn: int = 0
    entries_pending: int = 0
    entries_kept: int = 0

    def summary(self) -> str:
        modes = ",".join(f"{p}:{m}" for p, m in sorted(self.files.items()))
        return (
            f"ops={self.ops} writes kept {self.writes_kept}/{self.writes_pending} "
            f"(torn {self.writes_torn}), entries kept {self.entries_kept}/"
            f"{self.entries_pending} [{modes}]"
        )


class SimDisk:
    """``with SimDisk(tmp_path) as disk: log = open_log(disk.root / "data")`` …
    ``disk.crash_after(n)`` … (``PowerLoss``) … ``report = disk.restart(rng)``; reopen the log at
    ``disk.root / "data"`` (a new folder: the old one may still be touched by threads of the
    dead process)."""

    def __init__(self, base: Path | str, *, fsync: bool = True, fsync_latency: float = 0.0) -> None:
        self.base = Path(base).absolute()
        self.base.mkdir(parents=True, exist_ok=True)
        self.fsync_enabled = fsync
        self.fsync_latency = fsync_latency
        """Seconds an fsync takes after it captured what it makes durable: with several
        threads, the window in which written data is not yet durable, as on a real disk."""
        self.life = 0
        self.root = self.base / "disk-0"
        self.root.mkdir()
        self._lock = threading.RLock()
        self._saved: dict[str, object] = {}
        self._saved_hook = None
        self._force: tuple[str | None, str | None] = (None, None)
        self.lives_ops: list[int] = []
        self.fsyncs = 0
        self.eio_injected = 0
        self._reset()

    # -- the model ---------------------------------------------------------------------------
    def _reset(self) -> None:
        """Everything now under ``root`` is durable (a fresh disk, or the disk after reboot)."""
        self.nodes: dict[int, _File | _Dir] = {}
        self.inodes: dict[tuple[int, int], int] = {}
        self.ops = 0
        self.fds: set[int] = set()
        """Descriptors opened through ``fs`` this life and not closed: closed by ``restart``
        (the process they belonged to is gone)."""
        self.crash_op: int | None = None
        self.eio_at: int | None = None
        self.file_fsyncs = 0
        self.dead = False
        self._root_s = str(self.root)
        self.root_node = self._scan(self.root)

    def _new(self, cls: type, st: os.stat_result | None) -> _File | _Dir:
        node = cls(len(self.nodes) + 1)
        self.nodes[node.id] = node
        if st is not None:
            self.inodes[(st.st_dev, st.st_ino)] = node.id
        return node

    def _scan(self, path: Path) -> int:
        st = os.lstat(path)
        if statmod.S_ISDIR(st.st_mode):
            d = self._new(_Dir, st)
            for name in sorted(os.listdir(path)):
                d.durable[name] = self._scan(path / name)
            return d.id
        f = self._new(_File, st)
        f.durable = path.read_bytes()
        return f.id

    def _inside(self, path: str) -> bool:
        return path == self._root_s or path.startswith(self._root_s + os.sep)

    def _abs(self, path) -> str:
        return os.path.abspath(os.fsdecode(os.fspath(path)))

    def _node_for_stat(self, st: os.stat_result) -> _File | _Dir:
        nid = self.inodes.get((st.st_dev, st.st_ino))
        if nid is not None:
            node = self.nodes[nid]
            if isinstance(node, _Dir) == statmod.S_ISDIR(st.st_mode):
                return node
        # made outside fs (or an inode number reused): known from now on, durable as nothing
        return self._new(_Dir if statmod.S_ISDIR(st.st_mode) else _File, st)

    def _node_at(self, path: str) -> _File | _Dir:
        return self._node_for_stat(os.lstat(path))

    def _node_of_fd(self, fd: int) -> _File | _Dir | None:
        """The node an fd refers to, or None for a file outside ``root``."""
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) not in self.inodes:
            try:
                where = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                return None
            if not self._inside(where):
                return None
        return self._node_for_stat(st)

    def _dir_of(self, path: str) -> _Dir:
        node = self._node_at(os.path.dirname(path))
        assert isinstance(node, _Dir)
        return node

    def _forget_if_last_link(self, st: os.stat_result | None) -> None:
        """The real inode is gone: its number may be reused by a new file."""
        if st is not None and (st.st_nlink <= 1 or statmod.S_ISDIR(st.st_mode)):
            self.inodes.pop((st.st_dev, st.st_ino), None)

    # -- crash points ------------------------------------------------------------------------
    def crash_after(self, n: int | None) -> None:
        """Lose power instead of performing the ``n``-th mutating call from now (1 = the next
        one); None: no scheduled power loss."""
        with self._lock:
            self.crash_op = None if n is None else self.ops + max(1, n)

    def fail_fsync_after(self, n: int | None) -> None:
        """The ``n``-th fsync/fdatasync of a file from now fails with EIO, and the writes it
        should have made durable are dropped (see ``_File.lost``); None: no failure."""
        with self._lock:
            self.file_fsyncs = 0
            self.eio_at = n

    def power_off(self) -> None:
        with self._lock:
            self.dead = True

    def _alive(self) -> None:
        if self.dead:
            raise PowerLoss(f"power is off (life {self.life})")

    def _step(self) -> None:
        """A mutating call is about to happen: the crash point may be here."""
        self._alive()
        self.ops += 1
        if self.crash_op is not None and self.ops >= self.crash_op:
            self.dead = True
            raise PowerLoss(f"power lost at op {self.ops} of life {self.life}")

    # -- the simulated calls -----------------------------------------------------------------
    def open(self, path, flags: int, mode: int = 0o777, *, dir_fd=None) -> int:
        with self._lock:
            self._alive()
            p = self._abs(path)
            if dir_fd is not None or not self._inside(p):
                return os.open(path, flags, mode, dir_fd=dir_fd)
            if not flags & (os.O_CREAT | os.O_TRUNC):
                fd = os.open(p, flags, mode)
                self.fds.add(fd)
                return fd
            try:
                before = os.lstat(p)
            except FileNotFoundError:
                before = None
            if before is None or (flags & os.O_TRUNC and before.st_size):
                self._step()
            fd = os.open(p, flags, mode)
            self.fds.add(fd)
            if before is None:
                node = self._new(_File, os.fstat(fd))
                self._dir_of(p).pending.append(("link", os.path.basename(p), node.id))
            elif flags & os.O_TRUNC and before.st_size:
                node = self._node_for_stat(os.fstat(fd))
                if isinstance(node, _File):
                    node.pending.append(("t", 0))
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._alive()
            os.close(fd)
            self.fds.discard(fd)

    def dup(self, fd: int) -> int:
        with self._lock:
            self._alive()
            new = os.dup(fd)
            self.fds.add(new)
            return new

    def write(self, fd: int, data) -> int:
        with self._lock:
            node = self._node_of_fd(fd)
            if node is None:
                self._alive()
                return os.write(fd, data)
            self._step()
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
                offset = os.fstat(fd).st_size
            else:
                offset = os.lseek(fd, 0, os.SEEK_CUR)
            n = os.write(fd, data)
            if isinstance(node, _File) and n > 0:
                node.pending.append(("w", offset, bytes(memoryview(data)[:n])))
                _redirty(node, offset, n)
            return n

    def pwrite(self, fd: int, data, offset: int) -> int:
        with self._lock:
            node = self._node_of_fd(fd)
            if node is None:
                self._alive()
                return os.pwrite(fd, data, offset)
            self._step()
            n = os.pwrite(fd, data, offset)
            if isinstance(node, _File) and n > 0:
                node.pending.append(("w", offset, bytes(memoryview(data)[:n])))
                _redirty(node, offset, n)
            return n

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        with self._lock:
            self._alive()
            return os.pread(fd, n, offset)

    def _sync(self, fd: int, real) -> None:
        with self._lock:
            node = self._node_of_fd(fd)
            if node is None:
                self._alive()
                real(fd)
                return
            self._step()
            self.fsyncs += 1
            if isinstance(node, _File) and self.eio_at is not None:
                self.file_fsyncs += 1
                if self.file_fsyncs >= self.eio_at:
                    self.eio_at = None
                    self.eio_injected += 1
                    old = node.durable
                    for op in node.pending:
                        if op[0] == "w":
                            was = old[op[1] : op[1] + len(op[2])]
                            node.lost.append((op[1], was + bytes(len(op[2]) - len(was))))
                    node.pending.clear()
                    raise OSError(errno.EIO, "Input/output error (simulated)")
            if not self.fsync_enabled:
                return
            if isinstance(node, _File):
                with open(f"/proc/self/fd/{fd}", "rb") as f:
                    content = bytearray(f.read())
                for off, was in node.lost:
                    if off < len(content):
                        content[off : off + len(was)] = was[: len(content) - off]
                node.durable = bytes(content)
                node.pending.clear()
            else:
                node.durable = {
                    name: self._node_for_stat(os.stat(name, dir_fd=fd, follow_symlinks=False)).id
                    for name in sorted(os.listdir(fd))
                }
                node.pending.clear()

    def fsync(self, fd: int) -> None:
        self._sync(fd, os.fsync)
        if self.fsync_latency:
            time.sleep(self.fsync_latency)  # outside the lock: others write meanwhile

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, os.fdatasync)
        if self.fsync_latency:
            time.sleep(self.fsync_latency)

    def start_writeback(self, fd: int, offset: int = 0, count: int = 0) -> bool:
        """Only a hint to the kernel: it makes nothing durable, and a simulated power loss
        may keep any part of what was not fsynced anyway, so the disk's state is unchanged."""
        with self._lock:
            self._alive()
            return True

    def ftruncate(self, fd: int, size: int) -> None:
        with self._lock:
            node = self._node_of_fd(fd)
            if node is None:
                self._alive()
                os.ftruncate(fd, size)
                return
            self._step()
            os.ftruncate(fd, size)
            if isinstance(node, _File):
                node.pending.append(("t", size))

    def truncate(self, path, size: int) -> None:
        with self._lock:
            self._alive()
            p = self._abs(path)
            if not self._inside(p):
                os.truncate(p, size)
                return
            node = self._node_at(p)
            self._step()
            os.truncate(p, size)
            if isinstance(node, _File):
                node.pending.append(("t", size))

    def replace(self, src, dst) -> None:
        with self._lock:
            self._alive()
            s, d = self._abs(src), self._abs(dst)
            if not (self._inside(s) and self._inside(d)):
                os.replace(s, d)
                return
            node = self._node_at(s)
            sdir, ddir = self._dir_of(s), self._dir_of(d)
            try:
                over = os.lstat(d)
            except FileNotFoundError:
                over = None
            self._step()
            os.replace(s, d)
            if over is not None and (over.st_dev, over.st_ino) != (
                os.lstat(d).st_dev,
                os.lstat(d).st_ino,
            ):
                self._forget_if_last_link(over)
            sname, dname = os.path.basename(s), os.path.basename(d)
            if sdir is ddir:
                sdir.pending.append(("rename", sname, dname, node.id))
            else:
                sdir.pending.append(("unlink", sname))
                ddir.pending.append(("link", dname, node.id))

    def unlink(self, path, *, dir_fd=None) -> None:
        with self._lock:
            self._alive()
            p = self._abs(path)
            if dir_fd is not None or not self._inside(p):
                os.unlink(path, dir_fd=dir_fd)
                return
            st = os.lstat(p)
            parent = self._dir_of(p)
            self._step()
            os.unlink(p)
            self._forget_if_last_link(st)
            parent.pending.append(("unlink", os.path.basename(p)))

    def mkdir(self, path, mode: int = 0o777, *, dir_fd=None) -> None:
        with self._lock:
            self._alive()
            p = self._abs(path)
            if dir_fd is not None or not self._inside(p):
                os.mkdir(path, mode, dir_fd=dir_fd)
                return
            parent = self._dir_of(p)
            if os.path.lexists(p):
                raise FileExistsError(17, "File exists", p)
            self._step()
            os.mkdir(p, mode)
            node = self._new(_Dir, os.lstat(p))
            parent.pending.append(("link", os.path.basename(p), node.id))

    def rmdir(self, path, *, dir_fd=None) -> None:
        with self._lock:
            self._alive()
            p = self._abs(path)
            if dir_fd is not None or not self._inside(p):
                os.rmdir(path, dir_fd=dir_fd)
                return
            st = os.lstat(p)
            parent = self._dir_of(p)
            self._step()
            os.rmdir(p)
            self._forget_if_last_link(st)
            parent.pending.append(("unlink", os.path.basename(p)))

    def listdir(self, path=".") -> list[str]:
        with self._lock:
            self._alive()
            return os.listdir(path)

    def stat(self, path, *, dir_fd=None, follow_symlinks: bool = True) -> os.stat_result:
        with self._lock:
            self._alive()
            return os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    # -- patching loglake.log.fs -------------------------------------------------------------
    def __enter__(self) -> SimDisk:
        unknown = sorted(
            name
            for name, value in vars(fs).items()
            if callable(value)
            and not name.startswith("_")
            and name not in SIMULATED
            and name not in HELPERS
            and getattr(value, "__module__", "") in ("posix", "os", "loglake.log.fs")
            and not isinstance(value, type)
        )
        assert not unknown, (
            f"loglake.log.fs has calls tests/log/simdisk.py does not simulate: {unknown}; "
            "add them to SimDisk so no write bypasses the simulated disk"
        )
        for name in SIMULATED:
            if not hasattr(fs, name):  # an older fs.py
                continue
            self._saved[name] = getattr(fs, name)
            setattr(fs, name, getattr(self, name))
        self._saved_hook = threading.excepthook
        threading.excepthook = self._excepthook
        return self

    def __exit__(self, *exc: object) -> None:
        for name, value in self._saved.items():
            setattr(fs, name, value)
        self._saved.clear()
        if self._saved_hook is not None:
            threading.excepthook = self._saved_hook

    def _excepthook(self, args: threading.ExceptHookArgs) -> None:
        """A thread of the dead process (the sealer, a group commit) ends on ``PowerLoss``:
        that is the power loss, not a bug to report."""
        if args.exc_type is not None and issubclass(args.exc_type, PowerLoss):
            return
        assert self._saved_hook is not None
        self._saved_hook(args)

    # -- power loss --------------------------------------------------------------------------
    def restart(
        self, rng: random.Random, *, file_mode: str | None = None, entries: str | None = None
    ) -> CrashReport:
        """Power off (if not already), build the disk a power loss could leave (drawn from
        ``rng``) in a new folder, and make it the current ``root``. ``file_mode`` (one of
        ``FILE_MODES``) and ``entries`` (``"all"`` or ``"none"`` of the pending folder changes)
        force a choice, for the simulator's own tests."""
        self._force = (file_mode, entries)
        with self._lock:
            self.dead = True
            for fd in self.fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            report = CrashReport(self.ops)
            self.lives_ops.append(self.ops)
            old = self.root
            self.life += 1
            new = self.base / f"disk-{self.life}"
            new.mkdir()
            entries = self._crash_entries(rng, report)
            contents: dict[int, bytes] = {}
            self._materialize(self.root_node, new, entries, contents, rng, report, set(), "")
            self.root = new
            self._reset()
        with contextlib.suppress(OSError):
            shutil.rmtree(old)
        return report

    def _crash_entries(self, rng: random.Random, report: CrashReport) -> dict[int, dict]:
        """Each folder's listing after the crash: durable + a random prefix of the pending."""
        out = {}
        for node in self.nodes.values():
            if not isinstance(node, _Dir):
                continue
            entries = dict(node.durable)
            n = len(node.pending)
            keep = rng.choice((0, n, rng.randint(0, n))) if n else 0
            if self._force[1] is not None:
                keep = n if self._force[1] == "all" else 0
            report.entries_pending += n
            report.entries_kept += keep
            for op in node.pending[:keep]:
                if op[0] == "link":
                    entries[op[1]] = op[2]
                elif op[0] == "unlink":
                    entries.pop(op[1], None)
                else:
                    entries.pop(op[1], None)
                    entries[op[2]] = op[3]
            out[node.id] = entries
        return out

    def _materialize(self, nid, path, entries, contents, rng, report, seen, rel) -> None:
        if nid in seen:  # a folder cannot be its own ancestor; be safe anyway
            return
        seen.add(nid)
        for name, child in sorted(entries[nid].items()):
            node = self.nodes[child]
            target = path / name
            if isinstance(node, _Dir):
                target.mkdir()
                self._materialize(
                    child, target, entries, contents, rng, report, seen, rel + name + "/"
                )
            else:
                if child not in contents:
                    contents[child] = self._crash_content(node, rng, report, rel + name)
                target.write_bytes(contents[child])

    def _crash_content(self, f: _File, rng: random.Random, report: CrashReport, rel: str) -> bytes:
        if not f.pending:
            return f.durable
        mode = self._force[0] or rng.choices(FILE_MODES, FILE_MODE_WEIGHTS)[0]
        report.files[rel] = mode
        writes = [op for op in f.pending if op[0] == "w"]
        report.writes_pending += len(writes)
        buf = bytearray(f.durable)
        if mode == "none":
            return bytes(buf)
        if mode == "all":
            report.writes_kept += len(writes)
            for op in f.pending:
                _apply(buf, op)
            return bytes(buf)
        if mode == "prefix":
            k = rng.randint(0, len(f.pending))
            for op in f.pending[:k]:
                _apply(buf, op)
                report.writes_kept += op[0] == "w"
            if k < len(f.pending) and f.pending[k][0] == "w":
                _, off, data = f.pending[k]
                cuts = [off, *range((off // SECTOR + 1) * SECTOR, off + len(data), SECTOR)]
                cut = rng.choice(cuts)
                if cut > off:
                    _apply(buf, ("w", off, data[: cut - off]))
                    report.writes_torn += 1
            return bytes(buf)
        # reorder: a subset of sectors of a subset of the ops, in a random order
        p_op, p_sector = rng.random(), rng.uniform(0.5, 1.0)
        pieces: list[tuple] = []
        for op in f.pending:
            if rng.random() >= p_op:
                if op[0] == "w" and rng.random() < 0.2:  # the size got there, the data did not
                    end = op[1] + len(op[2])
                    pieces.append(("z", end))
                continue
            if op[0] == "t":
                pieces.append(op)
                continue
            _, off, data = op
            bounds = [off, *range((off // SECTOR + 1) * SECTOR, off + len(data), SECTOR)]
            bounds.append(off + len(data))
            kept = [
                ("w", a, data[a - off : b - off])
                for a, b in itertools.pairwise(bounds)
                if rng.random() < p_sector
            ]
            report.writes_kept += bool(kept)
            report.writes_torn += 0 < len(kept) < len(bounds) - 1
            pieces += kept
        rng.shuffle(pieces)
        for op in pieces:
            _apply(buf, op)
        return bytes(buf)

    # -- introspection for tests -------------------------------------------------------------
    def durable_files(self) -> Iterator[tuple[str, bytes]]:
        """``(path relative to root, durable content)`` of every file the disk would keep with
        no pending change at all (for tests of the simulator)."""
        stack = [(self.root_node, "")]
        while stack:
            nid, rel = stack.pop()
            node = self.nodes[nid]
            assert isinstance(node, _Dir)
            for name, child in sorted(node.durable.items()):
                c = self.nodes[child]
                if isinstance(c, _Dir):
                    stack.append((child, rel + name + "/"))
                else:
                    yield rel + name, c.durable


def _apply(buf: bytearray, op: tuple) -> None:
    if op[0] == "w":
        _, off, data = op
        if off > len(buf):
            buf.extend(bytes(off - len(buf)))
        buf[off : off + len(data)] = data
    elif op[0] == "t":
        size = op[1]
        if size < len(buf):
            del buf[size:]
        else:
            buf.extend(bytes(size - len(buf)))
    else:  # "z": the file reached this size, its bytes did not
        if op[1] > len(buf):
            buf.extend(bytes(op[1] - len(buf)))


def _redirty(f: _File, offset: int, n: int) -> None:
    """A write over a range a failed fsync dropped makes those bytes dirty again."""
    if not f.lost:
        return
    end = offset + n
    keep = []
    for off, was in f.lost:
        e = off + len(was)
        if e <= offset or off >= end:
            keep.append((off, was))
            continue
        if off < offset:
            keep.append((off, was[: offset - off]))
        if e > end:
            keep.append((end, was[end - off :]))
    f.lost[:] = keep
