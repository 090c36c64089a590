"""One segment file of a partition: ``<first_index:020d>.seg`` plus its ``.idx`` sparse index.

Why: the log-structured model (STYLE.md, Kafka): a partition is a list of append-only segment
files; only the newest (active) one is written; older ones are immutable (sealed). Recovery
checks the active segment only: its torn or corrupt tail is cut at the last whole, CRC-valid
record. A sealed segment was fsynced when it rolled, so any bad byte inside it is corruption and
is reported as ``CorruptSegment`` (file, offset), never skipped.

The active segment's file is zero-filled ahead of small writes (as many bytes as the segment
holds, from 64 KiB up to ``ZERO_AHEAD`` at a time, and up to the roll size): past the last
record it holds zeros. Why: an ``fdatasync`` after a write that grows a file also commits the
new size to the file system's journal; one after a write over blocks that hold data already
writes the data only. For one 1 KB record on this project's ext4 disk that is p50 68 → 53 µs
(docs/log.md, On disk), a tenth of what a one-by-one push waits. Zeros and not ``fallocate``:
ext4 allocates "unwritten" extents, and the first write into each block converts one, a
journal commit again (p50 better, p99 worse: measured). The zeros are written by ``pwrite``
and reach the disk with the next record's fsync (in a busy segment, 1 MiB every ~950 records
of 1 KB). Large writes (a burst's batch) extend the file as before: their fsync is shared by
many records, and zero-filling would double the bytes a burst writes.

The zeros end the records as a torn tail does (a frame length of 0 is implausible), so every
reader stops there; the writer trims them when it seals the segment or closes, so sealed
segments and a cleanly closed log have no such tail, and recovery cuts one left by a crash with
the torn tail (without the torn-tail warning when it is zeros only).

This module does file I/O but no locking; ``partition.py`` serialises access.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from crc32c import crc32c

from loglake.log import fs
from loglake.log.api import CorruptSegment, ascii_digits
from loglake.log.record_codec import (
    BODY_HEAD_NO_KEY,
    FRAME_HEAD,
    MAX_BODY,
    MIN_BODY,
    PLAIN_HEAD_SIZE,
    CorruptRecord,
    PlainColumns,
    RecordDecodeError,
    StoredRecord,
    TornRecord,
    decode_frame,
    frame_length_at,
    plain_columns,
    scan,
)
from loglake.log.sparse_index import (
    ENTRY,
    INTERVAL_BYTES,
    SparseIndex,
    checked_entries,
    write_index_file,
)
from loglake.structured_logging import log_event

logger = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
INDEX_SUFFIX = ".idx"
NAME_WIDTH = 20
READ_CHUNK = 256 * 1024
ZERO_AHEAD = 1024 * 1024
ZERO_AHEAD_MIN = 64 * 1024
"""A fill is as large as the segment's records, within these bounds: a partition that holds
little carries few zeros (a node may have thousands of active segments), a busy one fills
once per ~950 records of 1 KB."""
SMALL_WRITE = 64 * 1024
"""A write of at most this many bytes past the zero-filled part fills zeros ahead first."""
_ZEROS = memoryview(bytes(ZERO_AHEAD + SMALL_WRITE))
"""The most one fill writes: from the file's end (at or past the records' end) to
``ZERO_AHEAD`` past a small write."""


def segment_name(first_index: int) -> str:
    return f"{first_index:0{NAME_WIDTH}d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    stem, suffix = name[: -len(SEGMENT_SUFFIX)], name[-len(SEGMENT_SUFFIX) :]
    if suffix != SEGMENT_SUFFIX or not ascii_digits(stem):
        return None
    return int(stem)


def _pread_range(path: str, start: int, end: int) -> bytes:
    """Bytes ``start..end`` of a file (fewer at its end), through ``fs``."""
    fd = fs.open(path, os.O_RDONLY)
    try:
        return _pread_fd(fd, start, end, path)
    finally:
        fs.close(fd)


def _pread_fd(fd: int, start: int, end: int, path: str) -> bytes:
    """Bytes ``start..end`` of ``path`` through its descriptor ``fd`` (an error names
    ``path``: ``fs.pread_named``)."""
    out = bytearray()
    while start + len(out) < end:
        chunk = fs.pread_named(fd, end - start - len(out), start + len(out), path)
        if not chunk:
            break
        out += chunk
    return bytes(out)


class Segment:
    """State of one segment file. ``next_index`` is one past its last record."""

    def __init__(self, directory: Path, base: int, readonly: bool) -> None:
        self.dir = directory
        self.base = base
        self.path = str(directory / segment_name(base))
        self.idx_path = self.path[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX
        self.readonly = readonly
        self.size = 0
        self.next_index = base
        self.index: SparseIndex | None = None
        self.max_ts: int | None = None
        self.max_ts_complete = True
        """False when ``max_ts`` only covers the records scanned since open."""
        self.wfd: int | None = None
        """Opened without ``O_APPEND`` (the file runs on in zeros past its records): its
        position is ``size``; writes advance it, a failed write sets it back."""
        self.ifd: int | None = None
        self.prealloc_cap = 0
        """Zero-fill the file ahead up to this size (the segment roll size); 0: never."""
        self.allocated = 0
        """The file's size while writing (``>= size``: zeros past the records)."""
        self._rfd: int | None = None
        self.is_sealed = False
        self.pins = 0
        """Reads in progress outside the partition lock; the read fd outlives a delete or
        close until they end (the partition changes this under its lock)."""
        self._close_when_unpinned = False
        self._lock = threading.RLock()
        """Guards loading/rebuilding the sparse index and opening the read fd, which lock-free
        readers may do at the same time."""
        self.checked_end = False
        self.deleted = False
        """``ends_at`` was compared with the name of the next segment (sealed only)."""

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, base: int, prealloc_cap: int = 0) -> Segment:
        seg = cls(directory, base, readonly=False)
        seg.prealloc_cap = prealloc_cap
        seg.wfd = fs.open(seg.path, os.O_WRONLY | os.O_CREAT, 0o644)
        seg.ifd = fs.open(seg.idx_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        seg.index = SparseIndex()
        return seg

    @classmethod
    def recover_active(
        cls,
        directory: Path,
        base: int,
        readonly: bool,
        durable_size: int = 0,
        prealloc_cap: int = 0,
    ) -> Segment:
        """Open the newest segment: scan its tail, cut a torn tail or the zeros past the
        records (writer only; a reader just stops there), and write its sparse index back
        (writer only).

        ``durable_size`` is how many bytes of this segment an fsync is known to have covered
        (the partition's durable watermark, ``watermark.py``). A torn tail can only be what no
        fsync covered, so only bytes at or past it are cut. A bad record below it, or a file
        shorter than it, lost acknowledged data: ``CorruptSegment`` (file, offset), nothing cut,
        for a reader as for the writer (``_check_durable``).

        The scan starts at the newest sparse-index entry below ``durable_size`` that points at
        a record with the entry's index (Kafka's recovery point; the index file is never
        fsynced, so an entry past the durable bytes could outlive the data before it); without
        one it starts at byte 0. Damage before that point is found when read."""
        seg = cls(directory, base, readonly)
        file_size = fs.stat(seg.path).st_size
        # (a reader with no watermark to go by starts at the newest entry: a full scan of a
        # live segment on every look would cost what the watermark exists to save)
        trusted = None if readonly and not durable_size else durable_size
        start_pos, start_index, idx = seg._resume_point(file_size, trusted)
        buf = _pread_range(seg.path, start_pos, file_size)
        seg.index = idx
        seg.size, seg.next_index = start_pos, start_index
        seg.max_ts_complete = start_pos == 0
        records, end, err = seg._scan_checked_at(buf, start_pos)
        seg._check_durable(end, err, durable_size)
        seg._adopt(records, end)
        if err is not None and not readonly:
            at = end - start_pos
            if buf.count(0, at) != len(buf) - at:  # not just the zeros filled ahead
                log_event(
                    logger,
                    logging.WARNING,
                    "truncated torn tail of active segment",
                    file=seg.path,
                    offset=end,
                    bytes_dropped=len(buf) - at,
                    reason=err.reason,
                    durable_size=durable_size,
                )
            fs.truncate(seg.path, end)
        if not readonly:
            seg.prealloc_cap = prealloc_cap
            seg.allocated = end
            seg.wfd = fs.open(seg.path, os.O_WRONLY)
            try:
                if end > durable_size:
                    seg._rewrite(buf[durable_size - start_pos : end - start_pos], durable_size)
                os.lseek(seg.wfd, end, os.SEEK_SET)
                if write_index_file(seg.idx_path, idx):
                    seg.ifd = fs.open(seg.idx_path, os.O_WRONLY | os.O_APPEND)
                # else a full disk: no index file for this segment (appends keep the index in
                # memory; a later open rebuilds the file from the segment)
            except BaseException:
                seg.close()  # an open that fails (a full disk) is retried: leak nothing
                raise
        return seg

    def _check_durable(self, end: int, err: RecordDecodeError | None, durable_size: int) -> None:
        """``CorruptSegment`` (file, offset) when the records read end at ``end``, before the
        ``durable_size`` bytes an fsync covered: a bad record there, or a file that ends there,
        lost acknowledged data. The same rule for the writer's open and a reader's look.

        Found from outside: a read-only view (``loglake log verify``, ``log read``, ``log
        info``, the Spark source) used to stop at such a record as at a torn tail, so ``verify``
        printed "ok, no damage found" over a lost range and a read past it returned nothing,
        while the writer refused to open. A reader may apply it because the writer publishes
        ``DURABLE`` only after the bytes it names are written and fsynced, and never cuts or
        rewrites a byte below it; a reader that reads the watermark before the segment
        (``recovery.follow_writer``) therefore finds them in the file, whatever the writer does
        meanwhile: past the watermark, a torn or zero tail is still just where reading stops."""
        if end >= durable_size:
            return
        if err is not None and err.offset < durable_size:
            raise CorruptSegment(
                self.path, err.offset, f"{err.reason} (inside the {durable_size} fsynced bytes)"
            )
        raise CorruptSegment(
            self.path, end, f"segment ends before its {durable_size} fsynced bytes"
        )

    def _rewrite(self, data: bytes, offset: int) -> None:
        """Write ``data`` (just read from the file) back at ``offset``, so that the next fsync
        really makes it durable.

        Why: these bytes are past the durable watermark, and what a read returns is the page
        cache, not the disk. After a failed fsync in this process (the log reopened after
        ``StorageFailed``), Linux may hold pages it could not write marked clean: they read
        back fine, and a new fsync reports success without writing them (fsyncgate). Recovery
        then publishes a watermark over them; a power loss later leaves that watermark naming
        bytes that are not there. Writing the same bytes again dirties the pages, so the
        recovery fsync covers them. After a real reboot they are what the disk holds already,
        and the cost is one write of the unsynced tail (at most a segment)."""
        assert self.wfd is not None
        fs.pwrite_all(self.wfd, data, offset)

    def _resume_point(
        self, file_size: int, durable_size: int | None
    ) -> tuple[int, int, SparseIndex]:
        """``(position, index, sparse index so far)`` to start the tail scan from: the newest
        index entry below ``durable_size`` (any entry when None) that checks out."""
        pos, index, entries = self._resume_entries(file_size, durable_size)
        return pos, index, SparseIndex.of(entries)

    def _resume_entries(
        self, file_size: int, durable_size: int | None
    ) -> tuple[int, int, np.ndarray]:
        """``_resume_point`` with the index's entries as ``checked_entries``' rows: no Python
        list of them for ``ends_at``, which reads only the last."""
        none = np.zeros((0, 2), dtype=np.uint64)
        try:
            raw = fs.read_file(self.idx_path)
        except FileNotFoundError:
            return 0, self.base, none
        entries = checked_entries(raw, self.base, file_size)
        if entries is None or not len(entries):
            return 0, self.base, none
        if durable_size is not None:
            entries = entries[: int(np.searchsorted(entries[:, 1], np.uint64(durable_size)))]
            if not len(entries):
                return 0, self.base, none
        last_i, last_p = int(entries[-1, 0]), int(entries[-1, 1])
        head = _pread_range(self.path, last_p, last_p + FRAME_HEAD.size)
        try:
            need = frame_length_at(head, 0)
            rest = _pread_range(self.path, last_p + FRAME_HEAD.size, last_p + need)
            rec = decode_frame(head + rest, 0, last_p)
        except RecordDecodeError:
            rec = None
        if rec is None or rec.index != last_i:
            return 0, self.base, none
        return last_p, last_i, entries

    @classmethod
    def sealed(cls, directory: Path, base: int, next_index: int, readonly: bool) -> Segment:
        """A rolled segment; its index is loaded on first use."""
        seg = cls(directory, base, readonly)
        seg.size = fs.stat(seg.path).st_size
        seg.next_index = next_index
        seg.is_sealed = True
        return seg

    def ends_at(self) -> int | None:
        """The index after this segment's last whole record, from its own bytes (a tail scan
        from the last index entry that checks out); None when the tail is damaged (reads will
        report it). Used on open to check the index a sealed segment's successor implies."""
        pos, first, _ = self._resume_entries(self.size, None)
        records, end, err = scan(_pread_range(self.path, pos, self.size), 0, pos)
        if err is not None or end != self.size:
            return None
        return records[-1].index + 1 if records else first

    def _scan_checked(
        self, buf: bytes, pos: int
    ) -> tuple[list[StoredRecord], int, RecordDecodeError | None]:
        """``scan`` plus the rule that indexes run ``base, base+1, …`` without gaps."""
        records, end, err = scan(buf, pos)
        expect = self.next_index if pos else self.base
        for i, r in enumerate(records):
            if r.index != expect + i:
                return (
                    records[:i],
                    r.offset,
                    CorruptRecord(r.offset, f"index {r.index}, expected {expect + i}"),
                )
        return records, end, err

    def _adopt(self, records: list[StoredRecord], end: int) -> None:
        if self.index is None:
            self.index = SparseIndex()
        for r in records:
            self.index.maybe_add(r.index, r.offset)
            if self.max_ts is None or r.timestamp_ns > self.max_ts:
                self.max_ts = r.timestamp_ns
        if records:
            self.next_index = records[-1].index + 1
        self.size = end

    def refresh_tail(self, durable_size: int = 0) -> bool:
        """Readers only: pick up whole records a writer appended since the last look.

        Read a chunk at a time and stop at the first frame that is not whole and valid: the
        file may run on in zeros filled ahead of the records (a live writer's active
        segment), which must not be read on every look. Stopping before ``durable_size`` (the
        watermark, read before this look) is damage: ``CorruptSegment`` (``_check_durable``)."""
        try:
            st = fs.stat(self.path)
        except FileNotFoundError:
            return False  # deleted by the writer's retention: nothing more to find
        fd = self._read_fd()
        found = False
        want = READ_CHUNK
        err: RecordDecodeError | None = None
        while st.st_size > self.size:
            start = self.size
            buf = fs.pread_named(fd, min(want, st.st_size - start), start, self.path)
            records, end, err = self._scan_checked_at(buf, start)
            if records:
                self._adopt(records, end)
                found = True
            if err is None and buf:
                want = READ_CHUNK
                continue  # the chunk ended at a frame's end: read on
            if not isinstance(err, TornRecord) or len(buf) < want:
                break  # a bad or zero frame (the end for now), or the file's end
            # a frame runs past the chunk: read from it, at least its whole length
            at = end - start
            need = frame_length_at(buf, at) if len(buf) - at >= FRAME_HEAD.size else 0
            want = max(READ_CHUNK, need)
        self._check_durable(self.size, err, durable_size)
        return found

    def _scan_checked_at(
        self, buf: bytes, base_pos: int
    ) -> tuple[list[StoredRecord], int, RecordDecodeError | None]:
        records, end, err = scan(buf, 0, base_pos)
        for i, r in enumerate(records):
            if r.index != self.next_index + i:
                return records[:i], r.offset, CorruptRecord(r.offset, "index out of sequence")
        return records, base_pos + end, err

    # -- index -----------------------------------------------------------------------------
    def ensure_index(self) -> SparseIndex:
        """The sparse index; for a sealed segment, loaded from ``.idx`` or rebuilt."""
        idx = self.index
        if idx is not None:
            return idx
        with self._lock:
            return self._load_index()

    def _load_index(self) -> SparseIndex:
        if self.index is not None:
            return self.index
        idx: SparseIndex | None = None
        try:
            raw = fs.read_file(self.idx_path)
            if len(raw) % ENTRY.size == 0:
                idx = SparseIndex.parse(raw, self.base, self.size)
        except FileNotFoundError:
            pass
        if idx is None or not idx.indexes:
            idx = self.rebuild_index()
        self.index = idx
        return idx

    def rebuild_index(self) -> SparseIndex:
        """Scan the whole (sealed) segment; any bad record in it is ``CorruptSegment``. For
        the writer's active segment the caller holds the partition lock (appends add to the
        index)."""
        with self._lock:
            return self._rebuild_index()

    def _rebuild_index(self) -> SparseIndex:
        fd = self._rfd  # a pinned segment may be unlinked already (retention): use its fd
        buf = fs.read_file(self.path) if fd is None else _pread_fd(fd, 0, self.size, self.path)
        records, end, err = self._scan_checked(buf, 0)
        if err is not None:
            raise CorruptSegment(self.path, err.offset, err.reason)
        expected_next = self.next_index
        self.index = None
        self.max_ts = None
        self.max_ts_complete = True
        self._adopt(records, end)
        assert self.index is not None
        if self.is_sealed and self.next_index != expected_next:
            raise CorruptSegment(
                self.path,
                end,
                f"sealed segment ends before index {self.next_index}; "
                f"the next segment starts at {expected_next}",
            )
        log_event(
            logger, logging.INFO, "rebuilt sparse index", file=self.idx_path, entries=len(records)
        )
        if not self.readonly and not self.deleted:
            write_index_file(self.idx_path, self.index)
        return self.index

    def compute_max_ts(self) -> int | None:
        if (self.max_ts is None or not self.max_ts_complete) and self.size:
            self.rebuild_index()
        return self.max_ts

    # -- writing ---------------------------------------------------------------------------
    def write(
        self,
        parts: Sequence[bytes | bytearray | memoryview],
        size: int,
        offsets: list[int],
        first_index: int,
        max_ts: int,
        fill: bool = True,
    ) -> None:
        """Append the encoded batch — the concatenation of ``parts``, ``size`` bytes, records
        ``first_index…`` starting at ``offsets`` within it — with ``writev`` (``fs.writev_all``:
        the records' data is written from where it is, not joined into one buffer first; a
        batch the C framer framed is one part already), then note its sparse index entries.
        ``fill=False``: never zero-fill ahead (the write is one chunk of a larger append, whose
        later chunks would overwrite the zeros)."""
        assert self.wfd is not None and self.index is not None
        base = self.size
        if base + size > self.allocated:
            if size <= SMALL_WRITE and fill and self.prealloc_cap:
                self._zero_ahead(base + size)
            else:
                self.allocated = base + size  # (set before: a failed write sets it back)
        try:
            fs.writev_all(self.wfd, parts, size)
        except OSError:
            # e.g. ENOSPC after part of the batch landed: cut it off, and write the next
            # batch where this one started, so it does not follow a partial record
            fs.ftruncate(self.wfd, base)
            os.lseek(self.wfd, base, os.SEEK_SET)
            self.allocated = base
            raise
        idx = self.index
        due = idx.last_pos + INTERVAL_BYTES if idx.indexes else base
        # the records that start at or past each due position: a bisection per entry, not
        # a Python step per record (each is due by construction: ``SparseIndex.extend``)
        new_indexes: list[int] = []
        new_positions: list[int] = []
        n = len(offsets)
        i = bisect.bisect_left(offsets, due - base)
        while i < n:
            pos = base + offsets[i]
            new_indexes.append(first_index + i)
            new_positions.append(pos)
            i = bisect.bisect_left(offsets, pos + INTERVAL_BYTES - base, i + 1)
        if new_indexes:
            idx.extend(new_indexes, new_positions)
        self.size = base + size
        self.next_index = first_index + len(offsets)
        if self.max_ts is None or max_ts > self.max_ts:
            self.max_ts = max_ts
        if new_indexes and self.ifd is not None:
            try:
                fs.write_all(self.ifd, SparseIndex.entries_bytes(new_indexes, new_positions))
            except OSError as e:
                self._drop_index_file(e)

    def _drop_index_file(self, error: OSError) -> None:
        """The ``.idx`` could not take the batch's entries (a full disk: the data went into
        blocks zero-filled ahead, the index needed a new one): the file goes, and the index
        stays in memory; it is rebuilt from the segment wherever the file is missing. Why not
        raise: the batch is in the segment already, so the append did happen: reported as
        failed, a retry stored it twice."""
        assert self.ifd is not None
        with contextlib.suppress(OSError):
            fs.close(self.ifd)
        self.ifd = None
        with contextlib.suppress(OSError):
            os.unlink(self.idx_path)
        log_event(
            logger,
            logging.WARNING,
            "sparse index file dropped: it is rebuilt from the segment when needed",
            file=self.idx_path,
            error=repr(error),
        )

    def _zero_ahead(self, need: int) -> None:
        """Write zeros from the file's end to past ``need`` (by the segment's size, within
        ``ZERO_AHEAD_MIN``..``ZERO_AHEAD``; at most to ``prealloc_cap``), not fsynced: the next
        record's fsync takes them along. A full disk leaves the file as it was and the write
        extends it itself (its own error, if any, is the write's)."""
        assert self.wfd is not None
        start = self.allocated
        ahead = min(max(self.size, ZERO_AHEAD_MIN), ZERO_AHEAD)
        end = max(need, min(need + ahead, self.prealloc_cap))
        try:
            fs.pwrite_all(self.wfd, _ZEROS[: end - start], start)
        except OSError as e:
            fs.ftruncate(self.wfd, start)
            if e.errno != errno.ENOSPC:
                raise
            end = need
        self.allocated = end

    def trim(self) -> None:
        """Cut the zeros past the last record (before a seal or a clean close)."""
        if self.wfd is not None and self.allocated > self.size:
            fs.ftruncate(self.wfd, self.size)
            self.allocated = self.size

    def sync(self) -> None:
        if self.wfd is not None:
            fs.fdatasync(self.wfd)

    def seal(self) -> None:
        """Make the segment immutable: trim, fsync data and index, close the write handles."""
        if self.wfd is not None:
            self.trim()
            fs.fdatasync(self.wfd)
            fs.close(self.wfd)
            self.wfd = None
        if self.ifd is not None:
            fs.fdatasync(self.ifd)
            fs.close(self.ifd)
            self.ifd = None
        self.is_sealed = True

    # -- reading ---------------------------------------------------------------------------
    def _read_fd(self) -> int:
        fd = self._rfd
        if fd is None:
            with self._lock:
                if self._rfd is None:
                    self._rfd = fs.open(self.path, os.O_RDONLY)
                fd = self._rfd
        return fd

    def pin(self) -> None:
        """A read will use this segment outside the partition lock (caller holds it): open
        the read fd now, so a delete (retention) between here and the read cannot take the
        file away; the fd stays open until ``unpin``."""
        self._read_fd()
        self.pins += 1

    def unpin(self) -> None:
        self.pins -= 1
        if self.pins == 0 and self._close_when_unpinned:
            self._close_when_unpinned = False
            self.close()

    def read(
        self,
        start: int,
        end: int,
        limit: int,
        pairs: bool = False,
        size: int | None = None,
        may_rebuild: bool = True,
        max_bytes: int | None = None,
    ) -> list[tuple] | None:
        """Rows ``(index, timestamp_ns, key, headers, data)`` with ``start <= index < end``, at
        most ``limit``; with ``pairs``, ``(index, data)`` only. A binary search on the sparse
        index, then a forward read from the entry found.

        ``size``: read no byte at or past it (the segment's size when the caller looked, under
        the partition lock: whole records only, though an append may be writing past it). None
        when the index proved wrong and ``may_rebuild`` is False (the writer's active segment:
        the caller rebuilds under the partition lock).

        ``max_bytes``: stop before a record whose data would take the rows' data past it (the
        first row is always taken), so a pull capped in bytes reads no further than it sends."""
        start = max(start, self.base)
        end = min(end, self.next_index)
        if start >= end or limit <= 0:
            return []
        idx = self.ensure_index()
        entry_index, pos = idx.floor(start)
        out = self._read_from(pos, start, end, limit, entry_index, pairs, size, max_bytes)
        if out is None:  # the index pointed at the wrong record: rebuild and retry
            if not may_rebuild:
                return None
            self.rebuild_index()
            entry_index, pos = self.ensure_index().floor(start)
            out = self._read_from(pos, start, end, limit, entry_index, pairs, size, max_bytes)
            if out is None:
                raise CorruptSegment(self.path, pos, "sparse index disagrees with the segment")
        return out

    def plain_chunk(
        self, start: int, end: int, size: int, max_bytes: int
    ) -> tuple[int, tuple[bytes, PlainColumns] | None]:
        """The records from the sparse index entry at or before ``start`` up to about
        ``max_bytes`` further (ending at an index entry, at the first one at or past ``end``,
        or at ``size``), checked and split into columns with no Python object per record
        (``plain_columns``, the sealer's fast path): ``(end of the chunk, (bytes, columns))``,
        the columns' first index being the entry's. The columns are None where that path does
        not apply — a record with a key or headers, a torn or damaged frame, an index entry the
        bytes disagree with — so the caller reads the chunk's rows one by one (``read``
        reports damage as it always has)."""
        idx = self.ensure_index()
        first, pos = idx.floor(max(start, self.base))
        if first < 0:
            first, pos = self.base, 0
        positions = idx.positions
        j = max(bisect.bisect_left(positions, pos + max_bytes), bisect.bisect_right(positions, pos))
        j = min(j, bisect.bisect_left(idx.indexes, end))
        if j < len(positions) and positions[j] <= size:
            stop, chunk_end = positions[j], idx.indexes[j]
        else:
            stop, chunk_end = size, end
        buf = fs.pread_named(self._read_fd(), stop - pos, pos, self.path) if stop > pos else b""
        if not buf or len(buf) != stop - pos:
            return chunk_end, None
        try:
            cols = plain_columns(buf, first)
        except RecordDecodeError:
            return chunk_end, None
        return chunk_end, None if cols is None else (buf, cols)

    def _read_from(
        self,
        pos: int,
        start: int,
        end: int,
        limit: int,
        entry_index: int,
        pairs: bool = False,
        size: int | None = None,
        max_bytes: int | None = None,
    ) -> list[tuple] | None:
        """Parse forward from file position ``pos`` (the record ``entry_index``, or the segment
        start when it is -1). None when the first record is not the one the sparse index
        promised (the caller rebuilds the index); damage → ``CorruptSegment``.

        Bulk parsing: a chunk of the file is read at once and its whole frames are walked in
        one loop; a plain record (no key, no headers) is checked (CRC over a memoryview) and
        sliced without building an intermediate object. Others go through ``decode_frame``."""
        fd = self._read_fd()
        if size is None:
            size = self.size
        out: list[tuple] = []
        add = out.append
        buf = b""
        mv = memoryview(buf)
        bpos = pos  # file position of buf[0]
        off = 0
        first = True
        suspect = entry_index >= 0  # a bad first record may be the index's fault
        unpack_frame = FRAME_HEAD.unpack_from
        unpack_body = BODY_HEAD_NO_KEY.unpack_from
        head = PLAIN_HEAD_SIZE
        reached = entry_index if entry_index >= 0 else self.base  # one past the last parsed
        capped = max_bytes is not None
        room = max_bytes or 0  # data bytes left under the cap (negative: past it)
        while len(out) < limit:
            n = len(buf)
            while len(out) < limit and n - off >= FRAME_HEAD.size:
                length, crc = unpack_frame(buf, off)
                if length < MIN_BODY or length > MAX_BODY:
                    if first and suspect:
                        return None
                    raise CorruptSegment(self.path, bpos + off, f"implausible body length {length}")
                e = off + FRAME_HEAD.size + length
                if e > n:
                    break
                index, ts, flags, count = unpack_body(buf, off + FRAME_HEAD.size)
                row = None
                if flags or count:
                    try:
                        rec = decode_frame(buf, off, bpos)
                    except RecordDecodeError as err:
                        if first and suspect:
                            return None
                        raise CorruptSegment(self.path, err.offset, err.reason) from None
                    row = (rec.index, rec.timestamp_ns, rec.key, rec.headers, rec.data)
                elif crc32c(mv[off + FRAME_HEAD.size : e]) != crc:
                    if first and suspect:
                        return None
                    raise CorruptSegment(self.path, bpos + off, "CRC32C mismatch")
                if first:
                    first = False
                    if suspect and index != entry_index:
                        return None
                    if not suspect and index != self.base:
                        raise CorruptSegment(
                            self.path, bpos + off, f"first record has index {index}"
                        )
                if index >= end:
                    return out
                reached = index + 1
                if index >= start:
                    if capped:
                        n_data = e - off - head if row is None else len(row[4])
                        if n_data > room and out:
                            return out  # the byte cap: this row is for the next read
                        room -= n_data
                    if row is None:
                        data = buf[off + head : e]
                        add((index, data) if pairs else (index, ts, None, (), data))
                    else:
                        add((index, row[4]) if pairs else row)
                off = e
            if len(out) >= limit or bpos + off >= size:
                break
            need = FRAME_HEAD.size
            if n - off >= FRAME_HEAD.size:
                need += unpack_frame(buf, off)[0]
            at = bpos + n
            more = (
                fs.pread_named(fd, min(max(READ_CHUNK, need), size - at), at, self.path)
                if at < size
                else b""
            )
            if not more:
                if first and suspect:
                    return None
                raise CorruptSegment(self.path, bpos + off, "segment ends inside a record")
            mv.release()
            buf = buf[off:] + more
            mv = memoryview(buf)
            bpos += off
            off = 0
        if len(out) < limit and reached < end and self.is_sealed:
            # a sealed segment that lost its last records at a frame boundary (its end is
            # its successor's name): never skip them silently (``recovery.drop_resurrected``)
            raise CorruptSegment(
                self.path, bpos + off, f"sealed segment ends at index {reached}, before {end}"
            )
        return out

    def iter_all(self, yield_every: int = 0) -> list[StoredRecord]:
        """Every record (for sealing to Parquet); corruption → ``CorruptSegment``.

        ``yield_every`` > 0: release the GIL (``time.sleep(0)``) after that many records, so a
        background sealer does not hold up appenders waking from their fsync."""
        buf = _pread_range(self.path, 0, self.size)
        records: list[StoredRecord] = []
        pos = 0
        expect = self.base
        while pos < len(buf):
            try:
                rec = decode_frame(buf, pos)
            except RecordDecodeError as e:
                raise CorruptSegment(self.path, e.offset, e.reason) from None
            if rec.index != expect:
                raise CorruptSegment(self.path, pos, f"index {rec.index}, expected {expect}")
            records.append(rec)
            pos += rec.size
            expect += 1
            if yield_every and expect % yield_every == 0:
                time.sleep(0)
        if expect != self.next_index:
            raise CorruptSegment(self.path, pos, f"segment ends before index {self.next_index}")
        return records

    def close(self) -> None:
        """Close the write handles now, and the read fd once no read has the segment pinned
        (an unlinked file stays readable through it)."""
        names = ("wfd", "ifd") if self.pins else ("wfd", "ifd", "_rfd")
        self._close_when_unpinned = self.pins > 0
        for name in names:
            fd = getattr(self, name)
            if fd is not None:
                fs.close(fd)
                setattr(self, name, None)

    def delete(self) -> None:
        self.deleted = True
        self.close()
        for p in (self.path, self.idx_path):
            with contextlib.suppress(FileNotFoundError):
                fs.unlink(p)
