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
    from pathlib import Path

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
    if p.readonly:
        p._reader_mark = watermark.read(p.dir)  # before the files: see ``follow_writer``
    bases = list_bases(p)
    if p.readonly:
        check_newest(p, bases)
    if not bases and not p.readonly:
        fs.makedirs_durable(p.dir)
        Segment.create(p.dir, 0).close()
        p._fsync(lambda: fs.fsync_dir(p.dir))
        bases = [0]
    if not p.readonly:
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
    if p.readonly and p._reader_mark is None:
        p._reader_mark = watermark.read(p.dir)  # see ``follow_writer``
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
            # (a mark naming an older segment: ``_publish_durable`` fsyncs the folder first,
            # as the name may be in the cache only, after a failed roll in this process)
            p._fsync(active.sync)
            p._publish_durable(sync=True)
        if new_file:
            p._fsync(lambda: fs.fsync_dir(p.dir))  # the DURABLE file's own name

        for stale in (retention.SEAL_FAILED_FILE, STORAGE_FAILED_FILE):  # recovered; seals are
            with contextlib.suppress(FileNotFoundError):  # scheduled again below
                fs.unlink(p.dir / stale)
        if p.sweep_lake_temps:
            remove_temp_files(p.lake_dir)
        if p.config.seal_to_lake:
            for seg in p.segments[:-1]:
                retention.schedule_seal(p, seg)


def drop_resurrected(p: Partition) -> None:
    """Retention deletes the oldest segments first; if a crash came before the folder was
    fsynced, some of them can reappear. Such a segment ends before the next file's first
    index, and deriving its end from that name would skip records. So a sealed segment that
    ends before its successor starts is looked at: below the base retention recorded before
    its unlinks (``retention.deleted_below``), it and every older one are leftovers of a
    deletion (removed by a writer, ignored by a reader); at or above it, it lost records at a
    frame boundary: damage, kept, and every read of its missing records raises
    ``CorruptSegment`` naming it (``Segment.read``; served from a lake copy if one verifies).
    Found from outside: such damage was taken for a leftover, dropped silently by readers and
    ``verify`` (exit 0) and deleted by the writer with every older segment. A damaged tail
    (``ends_at`` None) is left for reads to report."""
    cut = 0
    below: int | None = None  # read only when a segment ends early (a file read per look)
    for i, seg in enumerate(p.segments):
        if not seg.is_sealed or seg.checked_end:
            continue
        end = seg.ends_at()
        seg.checked_end = True
        if end is not None and end < seg.next_index:
            if below is None:
                below = retention.deleted_below(p)
            if seg.base < below:
                cut = i + 1
            else:
                log_event(
                    logger,
                    logging.ERROR,
                    "sealed segment ends before the next one starts: records lost",
                    file=seg.path,
                    ends_at=end,
                    next_file_starts_at=seg.next_index,
                )
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
    """Readers only: follow the writer (new segments, new records, deleted files).

    The watermark is read first, then the files. Why: the active segment's records must reach
    the watermark's bytes, or acknowledged data was lost (``CorruptSegment``, as the writer's
    open says); the writer writes and fsyncs bytes before it publishes a watermark over them,
    so bytes named by a watermark read earlier are in the file when it is read, while one read
    after the segment could name bytes written since (a false alarm under a live writer).

    The same earlier watermark caps what the reader shows (``Partition.visible_next``): it can
    only show less than a later one would. Except when there was none yet: no watermark means
    "show every whole record" (a data dir from before it existed), and a writer opening the
    partition meanwhile publishes one before its first append, so the reader looks again after
    the segments, as it always did; the records it found were there when that one was read."""
    with p._lock:
        p._reader_mark = watermark.read(p.dir)
        bases = list_bases(p)
        check_newest(p, bases)
        known = {s.base: s for s in p.segments}
        segs: list[Segment] = []
        for i, b in enumerate(bases):
            last = i == len(bases) - 1
            seg = known.pop(b, None)
            try:
                if seg is None:
                    if last:
                        seg = Segment.recover_active(
                            p.dir, b, readonly=True, durable_size=durable_size_of(p, b)
                        )
                    else:
                        seg = Segment.sealed(p.dir, b, bases[i + 1], readonly=True)
                elif last:
                    seg = _refresh_active(p, seg)
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
        if p._reader_mark is None:
            p._reader_mark = watermark.read(p.dir)


def _refresh_active(p: Partition, seg: Segment) -> Segment:
    """The reader's active segment with the records appended since the last look; damage
    below the watermark is ``CorruptSegment``.

    What this reader learned on earlier looks is trusted only while it agrees with the
    watermark: an append that failed part way (a full disk) is cut off by the writer and its
    indexes written again, so a reader that read its whole frames before the cut stops inside
    the new ones. Before damage is reported the segment is read again as on a first look
    (``recover_active``), which finds what the file holds now."""
    durable = durable_size_of(p, seg.base)
    mark = p._reader_mark
    if (
        mark is not None
        and mark.base == seg.base
        and seg.size > mark.size
        and mark.next_index >= seg.next_index
    ):
        # The reader's records end past the watermark's bytes, yet the watermark vouches for
        # as many records or more: in one file the writer's records below ``mark.next_index``
        # end at ``mark.size``, so the reader's end cannot be there unless it read bytes the
        # writer has since cut and replaced by shorter records (a full disk). Never true of a
        # view that matches the file, so a live writer costs no re-read. Found from outside:
        # such a reader stayed at its stale end (records past it invisible while the writer
        # idled) or raised ``CorruptSegment`` on a read over its stale index entries.
        return reread_active(p, seg)
    try:
        seg.refresh_tail(durable)
    except CorruptSegment:
        return reread_active(p, seg)
    return seg


def reread_active(p: Partition, seg: Segment) -> Segment:
    """Readers (caller holds the lock): the active segment ``seg`` read again as on a first
    look (``recover_active``: what the file holds now below and past the watermark), in
    place of ``seg`` in ``p.segments``. Used where the reader's earlier look no longer
    matches the file (a full disk made the writer cut an append it had read), before
    anything is reported as damage."""
    seg.close()  # (its read descriptor stays open while a read has it pinned)
    new = Segment.recover_active(
        p.dir, seg.base, readonly=True, durable_size=durable_size_of(p, seg.base)
    )
    p.segments = [new if s is seg else s for s in p.segments]
    return new


def durable_size_of(p: Partition, base: int) -> int:
    """Bytes of segment ``base`` (the newest) that the watermark says are fsynced.

    A watermark naming a segment newer than the newest on disk is ``CorruptSegment``, for a
    reader as for the writer (``check_newest``)."""
    mark = p._mark.mark if p._mark is not None else p._reader_mark
    if mark is None or mark.base < base:
        return 0  # no watermark (older data dir) or none since this segment was created
    if mark.base > base:
        raise missing_segment(p.dir, mark)
    return mark.size


def check_newest(p: Partition, bases: list[int]) -> None:
    """Readers: the segment the watermark names must be on disk (``durable_size_of`` checks
    it when there is a newest segment; this, when there is none at all).

    Why a reader may say so: the writer creates a segment and fsyncs the folder before it
    publishes a watermark naming it (``Partition._roll``, ``_publish_durable``, the open),
    never deletes the segment a watermark names (retention and truncation keep the active
    one), and a reader reads the watermark before it lists the folder. So a missing one lost
    acknowledged records. Found from outside: the writer refused to open, while ``loglake log
    verify`` and ``log info`` exited 0 with fewer records and ``read`` returned ``[]``."""
    mark = p._reader_mark
    if mark is not None and not bases:
        raise missing_segment(p.dir, mark)


def missing_segment(directory: Path, mark: watermark.Mark) -> CorruptSegment:
    """The damage of a partition (its folder ``directory``) whose watermark names a segment
    that is not there: the writer's open, a reader's look and ``log verify`` say the same."""
    return CorruptSegment(
        str(directory / segment_name(mark.base)),
        0,
        f"segment holding acknowledged records up to index {mark.next_index - 1} is missing",
    )


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
