"""The sparse index of one segment: record index → byte position, one entry every few KB.

Why: a read by index must be a binary search, not a scan of the segment (Kafka's
``.index`` files are the model: fixed-size entries, one per ``index.interval.bytes`` of log).
The index is derived data: the segment is the truth, so a missing, partial or inconsistent index
file is rebuilt from the segment, never trusted over it.

File: a sequence of 16-byte entries ``index:u64le position:u64le``, strictly increasing in both
fields. A trailing partial entry (a torn write) is ignored and cut off by the writer.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from collections.abc import Sequence

import numpy as np

from loglake.log import fs

ENTRY = struct.Struct("<QQ")
INTERVAL_BYTES = 4096
"""Bytes of segment between two index entries (Kafka's default ``index.interval.bytes``)."""


class SparseIndex:
    """In-memory entries of one segment's index; the file is appended to as records land."""

    __slots__ = ("indexes", "last_pos", "positions")

    def __init__(self) -> None:
        self.indexes: list[int] = []
        self.positions: list[int] = []
        self.last_pos = -INTERVAL_BYTES  # position of the newest entry

    def __len__(self) -> int:
        return len(self.indexes)

    def maybe_add(self, index: int, pos: int) -> bool:
        """Add ``(index, pos)`` if ``pos`` is far enough from the previous entry."""
        if pos - self.last_pos >= INTERVAL_BYTES or not self.indexes:
            # positions first: a reader without the partition lock bisects ``indexes`` and
            # then reads ``positions[i]``, which must exist by then
            self.positions.append(pos)
            self.indexes.append(index)
            self.last_pos = pos
            return True
        return False

    def extend(self, indexes: list[int], positions: list[int]) -> None:
        """Add entries the caller spaced at least ``INTERVAL_BYTES`` apart, the first one
        at least that far from the newest entry (a batch's, found by bisection)."""
        self.positions.extend(positions)  # positions first, as in ``maybe_add``
        self.indexes.extend(indexes)
        self.last_pos = positions[-1]

    def floor(self, index: int) -> tuple[int, int]:
        """``(index, position)`` of the last entry at or before ``index``; ``(-1, 0)`` when
        none (start from the beginning of the segment)."""
        i = bisect.bisect_right(self.indexes, index) - 1
        if i < 0:
            return -1, 0
        return self.indexes[i], self.positions[i]

    def truncate_to(self, size: int) -> None:
        """Drop entries pointing at or past ``size`` (after the segment was truncated)."""
        i = bisect.bisect_left(self.positions, size)
        del self.indexes[i:]
        del self.positions[i:]
        self.last_pos = self.positions[-1] if self.positions else -INTERVAL_BYTES

    def to_bytes(self) -> bytes:
        return self.entries_bytes(self.indexes, self.positions)

    @staticmethod
    def entries_bytes(indexes: Sequence[int], positions: Sequence[int]) -> bytes:
        """The file's bytes of these entries (one ``struct`` call for all)."""
        flat = [0] * (2 * len(indexes))
        flat[0::2] = indexes
        flat[1::2] = positions
        return struct.pack(f"<{len(flat)}Q", *flat)

    @classmethod
    def parse(cls, raw: bytes, base: int, segment_size: int) -> SparseIndex | None:
        """Entries from a file's bytes, or None if they are not trustworthy
        (``checked_entries``)."""
        entries = checked_entries(raw, base, segment_size)
        return None if entries is None else cls.of(entries)

    @classmethod
    def of(cls, entries: np.ndarray) -> SparseIndex:
        """An index of ``checked_entries``' rows."""
        idx = cls()
        if len(entries):
            idx.indexes = entries[:, 0].tolist()
            idx.positions = entries[:, 1].tolist()
            idx.last_pos = idx.positions[-1]
        return idx


def checked_entries(raw: bytes, base: int, segment_size: int) -> np.ndarray | None:
    """A file's entries as rows ``(index, position)`` (uint64), or None if they are not
    trustworthy (not increasing, outside the segment, or before its first index). A partial
    last entry is ignored; entries at or past ``segment_size`` are dropped (the segment was
    truncated), and those after the first of them are not checked.

    Checked with numpy over the whole file, not entry by entry: every open of a partition
    reads the index of each of its sealed segments (``recovery.drop_resurrected``), and a
    1M-message log's 333 segments hold 2M entries: 0.1 s of Python an open, paid by every
    live read of the pipeline (each micro-batch of a streaming job)."""
    whole = len(raw) - len(raw) % ENTRY.size
    entries = np.frombuffer(raw, dtype="<u8", count=whole // 8).reshape(-1, 2)
    past = np.flatnonzero(entries[:, 1] >= np.uint64(segment_size))
    if len(past):
        entries = entries[: past[0]]
    if not len(entries):
        return entries
    i, p = entries[:, 0], entries[:, 1]
    if (
        int(i[0]) < base
        or not bool(np.all(i[1:] > i[:-1]))
        or not bool(np.all(p[1:] > p[:-1]))
        or not bool(np.array_equal(p == 0, i == np.uint64(base)))
    ):
        return None
    return entries


def write_index_file(path: str, index: SparseIndex) -> bool:
    """Replace ``path`` with ``index`` (temp file + rename; not fsynced: it is derived data).

    On a full disk the file is not needed: the index is rebuilt from its segment whenever the
    file is missing. So the stale file is removed (freeing space) and False returned, and
    opening or reading a log never needs free space for it."""
    tmp = path + ".tmp"
    try:
        fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fs.write_all(fd, index.to_bytes())
        finally:
            fs.close(fd)
        fs.replace(tmp, path)
    except OSError as e:
        if e.errno not in fs.DISK_FULL_ERRNOS:
            raise
        for leftover in (tmp, path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        return False
    return True
