"""A job's output folder, replaced as one durable step: the old output or the new one, whole.

Why: a Spark job's output is a folder of files (Parquet parts, ``summary.json``, an archive's
data and index). Spark's writer never fsyncs, and a job that deletes the old output before it
renames the new one in leaves neither after a crash between the two. Every job therefore writes
into a staging folder beside its output (``staged_output``) and ``commit_dir`` then:

1. fsyncs every file and every folder of the staging tree, bottom up, and the parent (so the
   new output is on disk before any name points at it);
2. swaps it with the old output in one step — Linux's ``renameat2(RENAME_EXCHANGE)`` exchanges
   two folder names atomically, so the output path names one whole output, old or new, at every
   instant and after a crash at any point — and fsyncs the parent (the swap is durable);
3. removes the old output (now under the staging name) and fsyncs the parent again.

Where the file system cannot exchange (``EINVAL``: e.g. some network file systems; ``ENOSYS``:
no ``renameat2``), the swap is two renames: old → ``.<name>.old-<token>``, new → ``<name>``. A
crash between them leaves both whole but no folder at the output path; ``recover_dir`` (run
first by every ``staged_output``) renames the old one back. Leftover staging and old folders of
a crashed run are removed by the next one.

``renameat2`` is called through ``ctypes``: the standard library has no binding (``os.rename``
cannot exchange), and the system call is one line. Every other change goes through
``loglake.log.fs`` (the storage engine's file layer) so the simulated disk of the log's power
loss tests can run this module too.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from loglake.log import fs
from loglake.pipeline.errors import JobFailed

STAGING_TAG = ".staging-"
OLD_TAG = ".old-"
LOCK_TAG = ".lock"  # ``.<dest>.lock``, beside it: ``staged_output``'s one job at a time
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h
_NO_EXCHANGE = frozenset({errno.EINVAL, errno.ENOSYS, errno.ENOTSUP})


def _exchange(a: Path, b: Path) -> None:
    """Swap the names ``a`` and ``b`` in one step (``renameat2(..., RENAME_EXCHANGE)``)."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(a))
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))


def _siblings(dest: Path, tag: str) -> list[Path]:
    prefix = f".{dest.name}{tag}"
    try:
        names = fs.listdir(dest.parent)
    except FileNotFoundError:
        return []
    return sorted(dest.parent / n for n in names if n.startswith(prefix))


def fsync_tree(root: Path) -> None:
    """Every file and folder under ``root`` durable (folders after their entries), then the
    name ``root`` itself (its parent folder)."""
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files:
            fs.fsync_file(Path(folder) / name)
        fs.fsync_dir(folder)
        del dirs
    fs.fsync_dir(Path(root).parent)


def remove_tree(root: Path) -> None:
    """``rm -rf root`` through ``loglake.log.fs`` (no fsync: callers fsync the parent)."""
    try:
        for folder, _, files in os.walk(root, topdown=False):
            for name in files:
                fs.unlink(Path(folder) / name)
            fs.rmdir(folder)
    except FileNotFoundError:
        pass


def recover_dir(dest: Path | str) -> None:
    """Undo what a crashed ``commit_dir`` left: an output path with no folder while the old
    output waits under its ``.old-`` name gets it back; staging and old folders beside a
    present output are removed."""
    dest = Path(dest)
    changed = False
    olds = _siblings(dest, OLD_TAG)
    if not dest.exists() and olds:
        fs.replace(olds[-1], dest)
        olds = olds[:-1]
        changed = True
    for leftover in [*olds, *_siblings(dest, STAGING_TAG)]:
        remove_tree(leftover)
        changed = True
    if changed:
        fs.fsync_dir(dest.parent)


def commit_dir(stage: Path | str, dest: Path | str) -> None:
    """Make the folder ``stage`` durable and put it at ``dest`` in place of whatever was there,
    so that a crash at any point leaves ``dest`` the old output or the new one, whole (see the
    module docstring). ``stage`` must be beside ``dest`` (one file system, one parent)."""
    stage, dest = Path(stage), Path(dest)
    fsync_tree(stage)
    parent = dest.parent
    if not dest.exists():
        fs.replace(stage, dest)
        fs.fsync_dir(parent)
        return
    try:
        _exchange(stage, dest)
    except OSError as e:
        if e.errno not in _NO_EXCHANGE:
            raise
        old = parent / f".{dest.name}{OLD_TAG}{secrets.token_hex(4)}"
        fs.replace(dest, old)
        fs.replace(stage, dest)  # a crash before this: recover_dir renames old back
        fs.fsync_dir(parent)
        remove_tree(old)
    else:
        fs.fsync_dir(parent)
        remove_tree(stage)  # the old output, under the staging name
    fs.fsync_dir(parent)


def carry_over(dest: Path, stage: Path, keep: Callable[[str], bool]) -> None:
    """Entries of ``dest`` that ``keep`` names and the job did not write, hard-linked into
    ``stage`` (a copy where the file system has no hard links), so the swap keeps them: a
    user's own files in an output folder the job shares. ``dest`` itself is not changed."""
    if not dest.is_dir():
        return
    for name in sorted(os.listdir(dest)):
        src, dst = dest / name, stage / name
        if not keep(name) or os.path.lexists(dst):
            continue
        if src.is_dir() and not src.is_symlink():
            for folder, _, files in os.walk(src):
                target = dst / Path(folder).relative_to(src)
                target.mkdir(exist_ok=True)
                for f in files:
                    _link(Path(folder) / f, target / f)
        else:
            _link(src, dst)


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV):
            raise
        shutil.copy2(src, dst, follow_symlinks=False)


@contextlib.contextmanager
def staged_output(dest: Path | str, keep: Callable[[str], bool] | None = None) -> Iterator[Path]:
    """A fresh staging folder beside ``dest`` to write the job's output into; on a normal exit
    it replaces ``dest`` (``commit_dir``), on an exception it is removed and ``dest`` is left
    as it was. What a crashed earlier run left is cleared first (``recover_dir``). One job at a
    time writes ``dest`` (an ``flock`` beside it); another fails at once with ``JobFailed``.

    ``keep``: which names in ``dest`` are not the job's (carried over, ``carry_over``); by
    default the job owns the whole folder."""
    dest = Path(dest).absolute()
    # one job per output folder: the next one's recover_dir removed the staging folder of a
    # run still writing it (found from outside: two sds-audit runs on one --out, 4 s apart;
    # the first failed on a file of its own that had vanished, and between its rename and the
    # other's removal it could have committed a partly deleted output)
    with output_lock(dest):
        recover_dir(dest)
        stage = dest.parent / f".{dest.name}{STAGING_TAG}{secrets.token_hex(4)}"
        fs.mkdir(stage)
        try:
            yield stage
            if keep is not None:
                carry_over(dest, stage, keep)
        except BaseException:
            remove_tree(stage)
            raise
        commit_dir(stage, dest)


@contextlib.contextmanager
def output_lock(dest: Path | str) -> Iterator[None]:
    """One job at a time writes the folder ``dest``: ``one_job`` on ``.<dest>.lock`` beside it
    (its parent made first). The empty file stays (removing it would let two jobs lock two
    files of one name)."""
    dest = Path(dest).absolute()
    fs.makedirs_durable(dest.parent)
    busy = f"another job is writing {dest}: wait for it to end"
    with one_job(dest.parent / f".{dest.name}{LOCK_TAG}", busy):
        yield


@contextlib.contextmanager
def one_job(lock: Path, busy: str) -> Iterator[None]:
    """An ``flock`` on the file ``lock`` held until the block ends; taken already (another job
    holds it), ``JobFailed(busy)`` at once. The jobs' locks (an output folder, archives-build's
    root, compact's stream) are this one."""
    try:
        fd = fs.lock_file(lock)
    except fs.LockHeld:
        raise JobFailed(busy) from None
    try:
        yield
    finally:
        fs.close(fd)


def write_part(
    folder: str,
    name: str,
    schema: Any,
    batches: Iterable[Any],
    compression: str = "snappy",
    arrow_ipc: bool = False,
    file_schema: Any = None,
) -> tuple[str, int]:
    """``batches`` (Arrow record batches of ``schema``) written by a plain task as
    ``folder/name``, one Parquet file, under a hidden temporary name and then renamed: a retried
    or speculative attempt rewrites the same file whole, and a failed or cancelled one leaves no
    half-written file. Returns the file's path and its row count. (The staging folder it writes
    into is made durable by ``commit_dir``.) ``arrow_ipc``: an Arrow IPC file instead (its
    buffers compressed with ``compression``, ``lz4`` or ``zstd``), for a job's intermediate
    files read back once by pyarrow on the same machine: no Parquet encoding either way.
    ``file_schema``: the Arrow schema a Parquet file says it holds (its ``ARROW:schema``)
    where ``schema`` is another Arrow form of the same Parquet columns (a column given
    dictionary-encoded): readers see ``file_schema``, and the file's bytes are those
    ``file_schema``'s batches would have made while every given dictionary stays under the
    writer's dictionary page limit (past it, from strings the writer goes on in plain
    encoding, and a given dictionary it keeps whole: the caller checks, as ``job
    sds-audit``'s ``_messages_task`` does)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 0
    with part_file(folder, name) as tmp:
        if arrow_ipc:
            options = pa.ipc.IpcWriteOptions(compression=compression)
            with pa.OSFile(tmp, "wb") as f, pa.ipc.new_file(f, schema, options=options) as w:
                for batch in batches:
                    w.write_batch(batch)
                    rows += batch.num_rows
        else:
            stored = file_schema is None
            with pq.ParquetWriter(tmp, schema, compression=compression, store_schema=stored) as w:
                for batch in batches:
                    w.write_batch(batch)
                    rows += batch.num_rows
                if not stored:  # what the writer stores for a schema (base64 of its IPC form)
                    form = base64.b64encode(file_schema.serialize().to_pybytes())
                    w.add_key_value_metadata({b"ARROW:schema": form})
            _start_writeback(tmp)
    return os.path.join(folder, name), rows


def _start_writeback(path: str) -> None:
    """The disk starts writing a finished part of the job's output now (``fs.start_writeback``):
    ``commit_dir``'s fsync then finds little left, instead of waiting alone for the whole
    output once every task is done (``sds-audit`` at 1M messages: 627 MB of ``acks``). Only a
    hint: a file it cannot open is left to that fsync, and the task goes on."""
    try:
        fd = fs.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fs.start_writeback(fd)
    finally:
        fs.close(fd)


@contextlib.contextmanager
def part_file(folder: str, name: str) -> Iterator[str]:
    """A hidden temporary path in ``folder`` to write ``name`` at: renamed to ``name`` when
    the block ends, removed when it raises (``write_part``'s way, for a task writing a file
    another way)."""
    import uuid

    tmp = os.path.join(folder, f".{name}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
