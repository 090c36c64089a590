"""Durable, monotonic consumer indexes (the Ockam index service's storage).

Why this shape: a save must be durable when it returns and must survive a crash at any byte.
The store is an append-only file ``consumers.log`` of CRC32C-framed entries (the same framing
idea as segments: ``length:u32le crc:u32le body``), fsynced per save — or per group of saves
(``apply``: the index service's requests of one batch, one write and one fsync). On open, a
writer reads the entries up to the first bad or torn one, keeps the latest value per key, and
compacts them into a new file (temp name, fsync, rename, fsync the folder), so the file never
grows without bound and a torn tail disappears. Readers (``readonly``) only read it.

Body: ``index:u64le partition:u32le client_len:u16le client(UTF-8) stream_len:u16le stream``,
optionally followed by ``kind:u8 owner_len:u16le owner(UTF-8)``. Without that tail an entry is
a save with no owner (every entry written before consumers had owners). ``kind``: 0 a save (the
stored value is the highest saved), 1 an operator's reset (the value is set as given, lower or
not), 2 an operator's delete (the key and its owner go). ``owner`` is the identity that first
saved the key under authentication (``streams/permissions.py``'s ``Peer.label``), empty: none.

The Ockam spec: "storage MUST be monotonic" — a lower save writes nothing and returns the
stored value, which stays as it was ("it MUST NOT be changed").

A failed fsync (or a partial entry that cannot be cut off) fails the store: the file is never
fsynced again (fsyncgate). A save after the back-off of ``reopen.py`` reopens it from disk — the
open's own load and compaction, which writes every value into a new file and fsyncs it before
the rename — backing off further while that fails, as a failed log partition does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from crc32c import crc32c

from loglake.errors import LoglakeError
from loglake.log import fs, watermark
from loglake.log.api import (
    CorruptStore,
    IndexOp,
    LogClosed,
    NotOwner,
    PartitionHealth,
    StorageFailed,
)
from loglake.log.reopen import Reopen
from loglake.structured_logging import log_event

logger = logging.getLogger(__name__)

FILE_NAME = "consumers.log"
DURABLE_FILE = "consumers.durable"
"""How many bytes of ``consumers.log`` were fsynced (``watermark.py``'s two-slot file,
``size``): a bad entry inside them is damage, not a torn save, even as the last entry."""
_HEAD = struct.Struct("<II")
_FIXED = struct.Struct("<QI")
_U16 = struct.Struct("<H")
_KIND_OWNER = struct.Struct("<BH")
SAVE, RESET, DELETE = 0, 1, 2
"""Entry kinds (see the module docstring)."""

Key = tuple[str, str, int]
MAX_ENTRY = _HEAD.size + _FIXED.size + 2 + 0xFFFF + 2 + 200 * 4 + _KIND_OWNER.size + 0xFFFF
"""Largest entry: client id and owner up to 65535 bytes each, stream name up to 200
characters (UTF-8)."""


def encode_entry(
    client_id: str, stream: str, partition: int, index: int, kind: int = SAVE, owner: str = ""
) -> bytes:
    c, s, o = client_id.encode("utf-8"), stream.encode("utf-8"), owner.encode("utf-8")
    if len(c) > 0xFFFF or len(o) > 0xFFFF:
        raise ValueError("client id or owner longer than 65535 bytes")
    body = _FIXED.pack(index, partition) + _U16.pack(len(c)) + c + _U16.pack(len(s)) + s
    if kind != SAVE or o:  # a plain save keeps the shape older files have
        body += _KIND_OWNER.pack(kind, len(o)) + o
    return _HEAD.pack(len(body), crc32c(body)) + body


def decode_entries(buf: bytes, owners: dict[Key, str] | None = None) -> tuple[dict[Key, int], int]:
    """Latest value per key from whole, valid entries; and the byte length they cover.
    ``owners`` (if given) is filled with each key's owner."""
    out: dict[Key, int] = {}
    if owners is None:
        owners = {}
    pos = 0
    while pos + _HEAD.size <= len(buf):
        length, crc = _HEAD.unpack_from(buf, pos)
        body = buf[pos + _HEAD.size : pos + _HEAD.size + length]
        if len(body) != length or crc32c(body) != crc:
            break
        try:
            index, partition = _FIXED.unpack_from(body, 0)
            p = _FIXED.size
            (clen,) = _U16.unpack_from(body, p)
            client = body[p + 2 : p + 2 + clen].decode("utf-8")
            p += 2 + clen
            (slen,) = _U16.unpack_from(body, p)
            stream = body[p + 2 : p + 2 + slen].decode("utf-8")
            p += 2 + slen
            kind, owner = SAVE, ""
            if p != length:
                kind, olen = _KIND_OWNER.unpack_from(body, p)
                owner = body[p + 3 : p + 3 + olen].decode("utf-8")
                if p + 3 + olen != length or kind not in (SAVE, RESET, DELETE):
                    break
        except (struct.error, UnicodeDecodeError):
            break
        key = (client, stream, partition)
        if kind == DELETE:
            out.pop(key, None)
            owners.pop(key, None)
        else:
            out[key] = index if kind == RESET else max(index, out.get(key, index))
            if owner:
                owners[key] = owner
        pos += _HEAD.size + length
    return out, pos


def _torn_tail(buf: bytes, pos: int) -> bool:
    """Whether the bad bytes from ``pos`` can be the torn last write: a prefix of one entry
    (its frame reaches the end of the file), or zeros (the file grew, the data never landed).
    A bad entry that ends before the file does is followed by another write: damage."""
    rest = buf[pos:]
    if len(rest) > MAX_ENTRY:
        return False
    if len(rest) < _HEAD.size or not rest.strip(b"\0"):
        return True
    (length, _) = _HEAD.unpack_from(rest, 0)
    if length == 0:  # zeros, then bytes of a write that landed out of order
        return False
    return _HEAD.size + length >= len(rest)


def _torn_group(mark: watermark.Mark | None, pos: int, buf: bytes) -> bool:
    """Whether the bad bytes from ``pos`` lie in the group of saves whose write the durable
    mark announced (``[mark.size, mark.next_index)``, ``ConsumerStore._write_entries``) and
    nothing was written after it: that write was never fsynced, so no save in it was
    acknowledged, and a power loss may have kept any of its pages and not others."""
    if mark is None or mark.next_index <= mark.size:
        return False
    return mark.size <= pos < mark.next_index and len(buf) <= mark.next_index


class ConsumerStore:
    def __init__(
        self, data_dir: Path, readonly: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = data_dir / FILE_NAME
        self.readonly = readonly
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.reopen = Reopen(clock)
        """Its storage failure (``reopen.error``, None while healthy), the back-off of its
        reopen attempts and the count of reopens (``reopen.py``, as for a partition)."""
        self.values: dict[Key, int] = {}
        self.owners: dict[Key, str] = {}
        """Who owns each key that has an owner (the first saver under authentication)."""
        self._mark: watermark.MarkWriter | None = None
        self._size = 0
        if not readonly:
            self._mark = watermark.MarkWriter(data_dir, DURABLE_FILE)
        try:
            self._load()
            if not readonly:
                try:
                    self._compact()
                except OSError as e:
                    if e.errno not in fs.DISK_FULL_ERRNOS:
                        raise
                    self._append_uncompacted(e)
        except BaseException:
            # a failed open (a read error, damage, a full disk) must not keep the descriptors
            # it opened: the log retries opening, and each attempt would leak them
            self.close()
            raise

    def _append_uncompacted(self, why: OSError) -> None:
        """The disk is full at open: starting must not need free space. The file's entries are
        valid as loaded, so appends go on after them (a torn tail cut off first: truncating
        frees space) and the compaction waits for the next open, when there is room. The file
        is read again first: the compaction may have failed after its rename (the folder's
        fsync), leaving the compacted file in place — the same values, another length."""
        self._load()
        fd = fs.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            if os.fstat(fd).st_size != self._used:
                fs.ftruncate(fd, self._used)
        except BaseException:
            fs.close(fd)
            raise
        self._fd, self._size = fd, self._used
        log_event(
            logger,
            logging.WARNING,
            "consumer index store not compacted at open: the disk is full; saves append to it",
            file=str(self.path),
            error=str(why),
        )

    def _load(self) -> None:
        self._used = 0
        """Bytes of the file that hold whole entries (what an open without compaction keeps)."""
        try:
            buf = fs.read_file(self.path)
        except FileNotFoundError:
            self.values, self.owners = {}, {}
            return
        self.owners = {}
        self.values, used = decode_entries(buf, self.owners)
        self._used = used
        mark = self._mark.mark if self._mark is not None else None
        durable = mark.size if mark else 0
        if used < durable:  # the writer only: a reader may race a compaction
            raise CorruptStore(
                str(self.path), f"bad entry at byte {used}, inside the {durable} fsynced bytes"
            )
        if used != len(buf) and not _torn_tail(buf, used) and not _torn_group(mark, used, buf):
            # One save is one write of one entry: a crash tears at most the last one. A bad
            # entry with bytes after it is damage, and dropping them would move consumer
            # indexes back — unless it is inside a group's write the mark announced, and the
            # file ends within that write (``_write_entries``).
            raise CorruptStore(str(self.path), f"bad entry at byte {used}, not at the tail")
        if used != len(buf) and not self.readonly:
            log_event(
                logger,
                logging.WARNING,
                "dropped torn tail of consumer index store",
                file=str(self.path),
                offset=used,
                bytes_dropped=len(buf) - used,
            )

    def _compact(self) -> None:
        """Rewrite the store as one entry per key. ``replace_file_atomic`` checks that every
        byte was written and fsyncs before the rename: a short or failed write raises and the
        good file stays."""
        owners = self.owners
        data = b"".join(
            encode_entry(c, s, p, i, SAVE, owners.get((c, s, p), ""))
            for (c, s, p), i in sorted(self.values.items())
        )
        assert self._mark is not None
        # the new file may be shorter than the old one's fsynced bytes: claim nothing across
        # the rename
        self._mark.put(0, 0, 0)
        self._mark.sync()
        fs.replace_file_atomic(self.path, data)
        self._size = len(data)
        self._mark.put(0, self._size, 0)
        self._mark.sync()
        self._fd = fs.open(self.path, os.O_WRONLY | os.O_APPEND)

    def get(self, client_id: str, stream: str, partition: int) -> int | None:
        if self.readonly:
            self._load()  # another process writes it
        return self.values.get((client_id, stream, partition))

    def all(self) -> dict[tuple[str, str, int], int]:
        """Every stored index (re-read first by a reader: another process writes it)."""
        if self.readonly:
            self._load()
        with self._lock:
            return dict(self.values)

    def owner(self, client_id: str, stream: str, partition: int) -> str | None:
        if self.readonly:
            self._load()
        return self.owners.get((client_id, stream, partition))

    def save(
        self,
        client_id: str,
        stream: str,
        partition: int,
        index: int,
        owner: str | None = None,
        override: bool = False,
    ) -> int:
        """Store ``index`` durably; return the stored value (the old one, unchanged and with
        nothing written, when ``index`` is lower). Arguments in ``Key`` order, as on disk;
        ``Log.save_index`` is the public face.

        ``owner`` (a save under authentication): a key nobody owns becomes ``owner``'s, in the
        same durable entry; a key another identity owns raises ``NotOwner`` unless
        ``override`` (a ``consume`` grant) — checked here, under the store's lock, so two
        savers racing for a new key cannot both own it."""
        if self.readonly:
            raise PermissionError("consumer indexes are read-only in this log")
        if index < 0:
            raise ValueError(f"consumer index must be >= 0, got {index}")
        key = (client_id, stream, partition)
        with self._lock:
            had = self.owners.get(key)
            if owner is not None and had is not None and had != owner and not override:
                raise NotOwner(key, had, owner)
            claim = owner if owner and had is None else ""
            stored = self.values.get(key)
            if stored is not None and index < stored and not claim:
                return stored
            if stored == index and not claim:
                return index
            index = index if stored is None else max(index, stored)
            return self._write(key, index, SAVE, claim)

    def reset(self, client_id: str, stream: str, partition: int, index: int | None) -> int | None:
        """An operator's reset (``index``: the value is set, lower or not; its owner stays) or
        delete (None: the key and its owner go). Returns the stored value before it."""
        if self.readonly:
            raise PermissionError("consumer indexes are read-only in this log")
        if index is not None and index < 0:
            raise ValueError(f"consumer index must be >= 0, got {index}")
        key = (client_id, stream, partition)
        with self._lock:
            before = self.values.get(key)
            if index is None:
                if before is not None or key in self.owners:
                    self._write(key, 0, DELETE, "")
            elif before != index:
                self._write(key, index, RESET, "")
            return before

    def apply(self, ops: Sequence[IndexOp]) -> list[int | Exception | None]:
        """Gets and saves in order, as ``get``/``save`` one by one would answer them, with one
        write and one fsync for every entry the group's saves make (group commit). A save is
        applied — seen by a ``get`` of another caller — only after that fsync, as ``save``'s
        are; a get inside the group sees the saves before it (it is answered after the fsync
        too). If the write or the fsync fails, every save of the group gets the error and
        the gets the values as they were."""
        if self.readonly:
            self._load()  # another process writes it
        out: list[int | Exception | None] = []
        with self._lock:
            values, owners = self.values, self.owners
            new: dict[Key, int] = {}
            claims: dict[Key, str] = {}
            entries: list[bytes] = []
            saves: list[int] = []
            for op in ops:
                key = (op.client_id, op.stream, op.partition)
                stored = new.get(key, values.get(key))
                if op.index is None:
                    out.append(stored)
                    continue
                index = op.index
                if self.readonly:
                    out.append(PermissionError("consumer indexes are read-only in this log"))
                    continue
                if index < 0:
                    out.append(ValueError(f"consumer index must be >= 0, got {index}"))
                    continue
                saves.append(len(out))
                owner = op.owner
                had = claims.get(key) or owners.get(key)
                if owner is not None and had is not None and had != owner and not op.override:
                    out.append(NotOwner(key, had, owner))
                    continue
                claim = owner if owner and had is None else ""
                if stored is not None and index <= stored and not claim:
                    out.append(stored)
                    continue
                index = index if stored is None else max(index, stored)
                entries.append(encode_entry(key[0], key[1], key[2], index, SAVE, claim))
                new[key] = index
                if claim:
                    claims[key] = claim
                out.append(index)
            if not entries:
                return out
            try:
                self._write_entries(b"".join(entries), group=len(entries) > 1)
            except Exception as e:
                for k in saves:
                    out[k] = e
                for k, op in enumerate(ops):
                    if op.index is None:
                        out[k] = values.get((op.client_id, op.stream, op.partition))
                return out
            values.update(new)
            owners.update(claims)
        return out

    def _write(self, key: Key, index: int, kind: int, owner: str) -> int:
        """Append one entry and fsync it, then apply it (caller holds ``_lock``)."""
        client_id, stream, partition = key
        self._write_entries(encode_entry(client_id, stream, partition, index, kind, owner))
        if kind == DELETE:
            self.values.pop(key, None)
            self.owners.pop(key, None)
        else:
            self.values[key] = index
            if owner:
                self.owners[key] = owner
        return index

    def _write_entries(self, entry: bytes, group: bool = False) -> None:
        """Append whole entries with one write and fsync them (caller holds ``_lock``).

        ``group`` (more than one entry): the durable mark is first set to say that a write
        from the file's end to ``end`` is in flight (``Mark.next_index``), and fsynced. A power
        loss can tear such a write anywhere — pages land in any order, so a bad entry may have
        valid ones after it — and recovery must tell that apart from damage (``_load``): a bad
        entry inside the announced write, with nothing after the write, is its torn tail."""
        if self.reopen.error is not None:
            self._reopen_from_disk()
        if self._fd is None:
            raise LogClosed("the log is closed")
        if group:
            assert self._mark is not None
            try:
                self._mark.put(0, self._size, self._size + len(entry))
                self._mark.sync()
            except OSError as e:
                raise self._fail(f"the durable mark before a group of saves: {e}") from e
        try:
            fs.write_all(self._fd, entry)
        except OSError as e:
            # Nothing was fsynced yet: cut the partial entry off (as a segment cuts a
            # partial batch) and refuse this save alone, so saves resume once space frees.
            # Only if the cut fails is the file's tail unknown, and saves stop.
            try:
                fs.ftruncate(self._fd, self._size)
            except OSError:
                raise self._fail(f"{e}, and its partial entry could not be cut off") from e
            raise
        try:
            fs.fdatasync(self._fd)
            self._size += len(entry)
            assert self._mark is not None
            self._mark.put(0, self._size, 0)  # no fsync: see watermark.py
        except OSError as e:
            # A failed fsync is never retried (the page cache may have dropped the entry):
            # refuse further saves (they would follow it) until the store reopens
            raise self._fail(str(e)) from e

    def _fail(self, why: str) -> StorageFailed:
        """Fail the store (caller holds ``_lock``) until ``_reopen_from_disk``."""
        error = StorageFailed(
            f"{self.path}: saving a consumer index failed ({why}); saves are refused until the "
            "store reopens from disk, on a save after a back-off"
        )
        delay = self.reopen.fail(error, f"saving a consumer index failed ({why})")
        log_event(
            logger,
            logging.ERROR,
            "the consumer index store failed; it will be reopened from disk",
            file=str(self.path),
            error=why,
            reopen_in_s=delay,
        )
        return error

    def _reopen_from_disk(self) -> None:
        """Reopen the failed store from disk if its back-off has passed (caller holds
        ``_lock``), else raise ``StorageFailed``: the load and compaction of an open, so every
        value (also the one whose save failed, if the page cache holds it) is written to a new
        file and fsynced before it replaces the old one."""
        assert self.reopen.error is not None
        if self._mark is None:
            raise LogClosed("the log is closed")
        now = self.reopen.clock()
        wait = self.reopen.wait(now)
        if wait > 0:
            raise StorageFailed(
                f"{self.path}: saves are refused after a storage failure; reopening the store "
                f"from disk is retried in {wait:.2f} s"
            ) from self.reopen.error
        values, owners = self.values, self.owners
        try:
            if self._fd is not None:
                fs.close(self._fd)
                self._fd = None
            self._load()
            self._compact()
        except (OSError, LoglakeError) as e:
            self.values, self.owners = values, owners
            delay = self.reopen.attempt_failed(now, e)
            log_event(
                logger,
                logging.ERROR,
                "reopening the consumer index store failed",
                file=str(self.path),
                error=f"{type(e).__name__}: {e}",
                attempt=self.reopen.attempts,
                retry_in_s=delay,
            )
            raise StorageFailed(
                f"{self.path}: saves are refused after a storage failure; reopening the "
                f"store failed ({type(e).__name__}: {e}), retried in {delay:.2f} s"
            ) from e
        log_event(
            logger,
            logging.WARNING,
            "reopened the consumer index store from disk",
            file=str(self.path),
            error=str(self.reopen.error),
            failed_attempts=self.reopen.attempts,
        )
        self.reopen.recovered()

    def health(self) -> PartitionHealth | None:
        """The store's failure, as ``SegmentLog.health()`` reports a partition's — the entry's
        ``stream`` is the store's file name (``consumers.log``), its partition 0 — or None
        while the store has neither failed nor been reopened since the log opened (so a log
        whose store never failed lists its partitions only, as before)."""
        with self._lock:
            if self.reopen.error is None and self.reopen.reopens == 0:
                return None
            return PartitionHealth(
                stream=FILE_NAME,
                partition=0,
                storage_failed=None if self.reopen.error is None else str(self.reopen.error),
                storage_failure=self.reopen.record,
                reopens=self.reopen.reopens,
            )

    def close(self) -> None:
        if self._fd is not None:
            fs.close(self._fd)
            self._fd = None
        if self._mark is not None:
            with contextlib.suppress(OSError):
                if self.reopen.error is None:
                    self._mark.sync()
            self._mark.close()
            self._mark = None
