"""The durable watermark of a partition: how much of its newest segment an fsync has covered.

Why: recovery and readers in other processes must know which bytes are acknowledged.

- Recovery (``Segment.recover_active``) may cut a torn tail only in the part no fsync covered. A
  bad record below the watermark was acknowledged: it is corruption (``CorruptSegment``), never
  truncated. A segment shorter than its watermark lost acknowledged bytes: corruption too.
- A read-only reader in another process (the Spark source, ``loglake log``) sees indexes below
  the watermark's ``next_index`` only, so it never reads a record a crash could still take back
  (and whose index a later append would reuse).

File ``<partition dir>/DURABLE``: two 40-byte slots at offsets 0 and 512 (different sectors),
each ``magic:4s seq:u64 base:u64 size:u64 next_index:u64 crc32c:u32`` (little-endian, the CRC
over the first 36 bytes). The writer alternates slots by ``seq``; a reader takes the valid slot
with the highest ``seq``, so a torn or concurrent write of one slot leaves the other one.

When it is written:
- after every fsync of the active segment (group commit, ``always``, ``flush``, ``close``), with
  a ``pwrite`` and no fsync of its own: it survives a process crash (page cache) at the cost of
  one small syscall per group commit, not per record;
- fsynced on open (after recovery), on close, and at most every ``SYNC_INTERVAL_S`` from the
  group commit, so after a power loss it may lag the truth by that long. A lagging watermark is
  safe (everything below it is still durable); it only narrows what recovery can call
  corruption rather than a torn tail.

A value is published only after the fsync it describes has returned, so the watermark never
claims more than what is on disk.
"""

from __future__ import annotations

import errno
import os
import struct
import time
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from loglake.log import fs
from loglake.log.api import CorruptStore

FILE_NAME = "DURABLE"
MAGIC = b"LLDW"
SLOT = struct.Struct("<4sQQQQI")
_SLOT_HEAD = struct.Struct("<4sQQQQ")
"""A slot without its CRC (what the CRC covers)."""
_CRC = struct.Struct("<I")
SLOT_OFFSETS = (0, 512)
SYNC_INTERVAL_S = 1.0


class Mark(NamedTuple):
    seq: int
    base: int
    """First index of the segment ``size`` is about (the active segment when published)."""
    size: int
    """Bytes of that segment known to be on disk."""
    next_index: int
    """One past the newest record known to be on disk."""


def encode_slot(mark: Mark) -> bytes:
    head = _SLOT_HEAD.pack(MAGIC, mark.seq, mark.base, mark.size, mark.next_index)
    return head + _CRC.pack(crc32c(head))


def parse(raw: bytes, path: str = FILE_NAME) -> Mark | None:
    """The newest valid slot; None when no slot was ever written (an empty or zero file: a
    crash while the file was created). Non-zero bytes with no valid slot → ``CorruptStore``."""
    best: Mark | None = None
    for off in SLOT_OFFSETS:
        slot = raw[off : off + SLOT.size]
        if len(slot) < SLOT.size:
            continue
        magic, seq, base, size, nxt, crc = SLOT.unpack(slot)
        if magic != MAGIC or crc32c(slot[:-4]) != crc:
            continue
        if best is None or seq > best.seq:
            best = Mark(seq, base, size, nxt)
    if best is None and raw.strip(b"\0"):
        raise CorruptStore(path, "no valid durable-watermark slot")
    return best


def read(directory: Path, name: str = FILE_NAME) -> Mark | None:
    """The partition's watermark, or None if it has none (a data dir from before it existed)."""
    path = directory / name
    for attempt in range(3):
        try:
            raw = fs.read_file(path)
        except FileNotFoundError:
            return None
        try:
            return parse(raw, str(path))
        except CorruptStore:
            if attempt == 2:
                raise
            time.sleep(0.01)  # a reader can catch the writer's very first slot half written
    raise AssertionError("unreachable")


class MarkWriter:
    """The writer's handle on ``DURABLE``."""

    def __init__(self, directory: Path, name: str = FILE_NAME) -> None:
        self.path = directory / name
        self.mark = read(directory, name)
        self._fd: int | None = fs.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def publish(self, base: int, size: int, next_index: int) -> bool:
        """Record that ``size`` bytes of segment ``base`` (records below ``next_index``) are
        on disk; ignored unless it is newer than what is published (a late group commit must
        not move it back past a roll)."""
        old = self.mark
        if old is not None and (next_index, base, size) <= (old.next_index, old.base, old.size):
            return False
        return self.put(base, size, next_index)

    def put(self, base: int, size: int, next_index: int) -> bool:
        """Publish unconditionally (the consumer store resets it before a rewrite)."""
        old = self.mark
        if self._fd is None:  # closed: a group commit that finished after close()
            return False
        mark = Mark((old.seq if old else 0) + 1, base, size, next_index)
        slot = encode_slot(mark)
        n = fs.pwrite(self._fd, slot, SLOT_OFFSETS[mark.seq % 2])
        if n != len(slot):  # a torn slot is caught by its CRC, but it must not count as put
            raise OSError(errno.EIO, f"watermark slot: short write ({n} of {len(slot)} bytes)")
        self.mark = mark
        return True

    def sync(self) -> None:
        if self._fd is not None:
            fs.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            fs.close(self._fd)
            self._fd = None
