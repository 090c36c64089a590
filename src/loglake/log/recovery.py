"""Recovery of a partition: what opening one trusts, repairs and rebuilds, and how a reader in
another process follows the writer.

Why a module of its own: a partition opens once (at start, or when the log reopens it after a
failed fsync) and then appends for hours; the open's rules — which segment is the active one,
how much of its tail the durable watermark vouches for, which leftovers of an interrupted
deletion to drop, what to make durable before the first append — are read and changed apart
from the append path, and keeping them out of ``Partition`` keeps that class about appends,
reads and durability. The functions work on a ``Partition`` being opened (its ``__init__`` calls
``open_partition``) or, for ``follow_writer``, under its lock.

Kafka's rule (STYLE.md): the log is the source of truth and recovery checks only the tail. A
sealed segment's index is rebuilt when a read finds it wrong (``Segment``); the active segment's
torn tail is cut at the durable watermark or at its first bad frame (``Segment.recover_active``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import TYPE_CHECKING

from loglake.log import fs, retention, watermark
from loglake.log.api import CorruptSegment, StorageFailed
from loglake.log.lake import list_lake_files, remove_temp_files, visible_lake_files
from loglake.log.segment import Segment, parse_segment_name, segment_name
from loglake.structured_logging import log_event

if TYPE_CHECKING:
    from loglake.log.partition import Partition

logger = logging.getLogger(__name__)

STORAGE_FAILED_FILE = "STORAGE_FAILED"
"""JSON of the partition's current ``StorageFailure`` (written when it fails and after each
failed reopen attempt, removed by the open that recovers it), for ``loglake log info``."""


def list_bases(p: Partition) -> list[int]:
    try:
        names = fs.listdir(p.dir)
    except FileNotFoundError:
        return []
    return sorted(b for b in map(parse_segment_name, names) if b is not None)


def open_partition(p: Partition) -> None:
    bases = list_bases(p)
    if not bases and not p.readonly:
        fs.makedirs_durable(p.dir)
        Segment.create(p.dir, 0).close()
        p._fsync(lambda: fs.fsync_dir(p.dir))
        bases = [0]
    if p.readonly:
        p._reader_mark = watermark.read(p.dir)
    else:
        p._mark = watermark.MarkWriter(p.dir)
    for i, b in enumerate(bases[:-1]):
        p.segments.append(Segment.sealed(p.dir, b, bases[i + 1], p.readonly))
    drop_resurrected(p)
    if bases:
        p.segments.append(
            Segment.recover_active(
                p.dir,
                bases[-1],
                p.readonly,
                durable_size_of(p, bases[-1]),
                p.config.segment_bytes,
            )
        )
    p.lake = visible_lake_files(list_lake_files(p.lake_dir))
    if not p.readonly:
        # what recovery kept is now the acknowledged history: make it durable and say so
        # (nothing to do after a clean close: the watermark already says exactly this)
        active = p.segments[-1]
        assert p._mark is not None
        mark, new_file = p._mark.mark, p._mark.mark is None
        if mark is None or (mark.base, mark.size, mark.next_index) != (
            active.base,
            active.size,
            active.next_index,
        ):
            if mark is not None and mark.base != active.base:
                # the mark may name a segment only once its name is durable (as in
                # _roll): after a failed roll in this process only the cache may hold it
                p._fsync(lambda: fs.fsync_dir(p.dir))
            p._fsync(active.sync)
            p._publish_durable(sync=True)
        if new_file:
            p._fsync(lambda: fs.fsync_dir(p.dir))  # the DURABLE file's own name

        for stale in (retention.SEAL_FAILED_FILE, STORAGE_FAILED_FILE):  # recovered; seals are
            with contextlib.suppress(FileNotFoundError):  # scheduled again below
                fs.unlink(p.dir / stale)
        remove_temp_files(p.lake_dir)
        if p.config.seal_to_lake:
            for seg in p.segments[:-1]:
                retention.schedule_seal(p, seg)


def drop_resurrected(p: Partition) -> None:
    """Retention deletes the oldest segments first; if a crash came before the folder was
    fsynced, some of them can reappear. Such a segment ends before the next file's first
    index, and deriving its end from that name would skip records. So a sealed segment
    that ends before its successor starts marks a gap: it and every older one are leftovers
    of a deletion (removed by a writer, ignored by a reader). A damaged tail is left for
    reads to report."""
    cut = 0
    for i, seg in enumerate(p.segments):
        if not seg.is_sealed or seg.checked_end:
            continue
        end = seg.ends_at()
        seg.checked_end = True
        if end is not None and end < seg.next_index:
            cut = i + 1
    if not cut:
        return
    gone, p.segments = p.segments[:cut], p.segments[cut:]
    for seg in gone:
        log_event(
            logger,
            logging.WARNING,
            "ignoring a segment left over from a deletion a crash interrupted",
            file=seg.path,
            next_file_starts_at=p.segments[0].base if p.segments else None,
            removed=not p.readonly,
        )
        if p.readonly:
            seg.close()
        else:
            seg.delete()
    if not p.readonly:
        p._fsync(lambda: fs.fsync_dir(p.dir))


def follow_writer(p: Partition) -> None:
    """Readers only: follow the writer (new segments, new records, deleted files)."""
    with p._lock:
        bases = list_bases(p)
        known = {s.base: s for s in p.segments}
        segs: list[Segment] = []
        for i, b in enumerate(bases):
            last = i == len(bases) - 1
            seg = known.pop(b, None)
            try:
                if seg is None:
                    if last:
                        seg = Segment.recover_active(p.dir, b, readonly=True)
                    else:
                        seg = Segment.sealed(p.dir, b, bases[i + 1], readonly=True)
                elif last:
                    seg.refresh_tail()
                elif not seg.is_sealed:
                    seg.close()
                    seg = Segment.sealed(p.dir, b, bases[i + 1], readonly=True)
            except FileNotFoundError:
                continue  # deleted by the writer's retention since the listing
            segs.append(seg)
        for gone in known.values():
            gone.close()
        p.segments = segs
        drop_resurrected(p)
        p.lake = visible_lake_files(list_lake_files(p.lake_dir))
        p._reader_mark = watermark.read(p.dir)


def durable_size_of(p: Partition, base: int) -> int:
    """Bytes of segment ``base`` (the newest) that the watermark says are fsynced."""
    mark = p._mark.mark if p._mark is not None else p._reader_mark
    if mark is None or mark.base < base:
        return 0  # no watermark (older data dir) or none since this segment was created
    if mark.base > base and not p.readonly:
        raise CorruptSegment(
            str(p.dir / segment_name(mark.base)),
            0,
            f"segment holding acknowledged records up to index {mark.next_index - 1} is missing",
        )
    return mark.size if mark.base == base else 0


def release(p: Partition) -> None:
    """Close what a failed open had opened."""
    for seg in p.segments:
        with contextlib.suppress(OSError):
            seg.close()
    if p._mark is not None:
        with contextlib.suppress(OSError):
            p._mark.close()


# -- a failed partition, until SegmentLog replaces it by one opened from disk -----------------
def record_failure(p: Partition) -> None:
    """``STORAGE_FAILED`` for ``loglake log info`` in another process (best effort: the disk
    is failing)."""
    if p.reopen.record is None:
        return
    record = json.dumps(dataclasses.asdict(p.reopen.record)).encode()
    with contextlib.suppress(OSError):
        fs.replace_file_atomic(p.dir / STORAGE_FAILED_FILE, record)


def refusal(p: Partition, now: float) -> StorageFailed:
    """The error for an append to the failed partition ``p`` before its next reopen attempt."""
    failure = p.reopen.record
    assert failure is not None
    tried = (
        f"reopening it failed {failure.reopen_attempts} time(s), last: {failure.reopen_error}; "
        if failure.reopen_attempts
        else ""
    )
    e = StorageFailed(
        f"{p.stream}/{p.partition}: appends are refused after a storage failure "
        f"({failure.error}); {tried}reopening the partition from disk is retried in "
        f"{p.reopen.wait(now):.2f} s"
    )
    e.__cause__ = p.reopen.error
    return e


def reopen_failed(p: Partition, now: float, error: Exception) -> StorageFailed:
    """Opening a partition to replace the failed ``p`` failed (caller: the one reopening):
    back off, log, record; return the error for the append."""
    delay = p.reopen.attempt_failed(now, error)
    assert p.reopen.record is not None
    log_event(
        logger,
        logging.ERROR,
        "reopening a failed partition failed",
        stream=p.stream,
        partition=p.partition,
        error=p.reopen.record.reopen_error,
        attempt=p.reopen.attempts,
        retry_in_s=delay,
    )
    record_failure(p)
    return refusal(p, now)
