"""What leaves a partition's segments: sealing rolled segments to the lake, retention, and
truncation.

Why together: the one rule retention must never break is about the seal — a segment of a
``seal_to_lake`` stream is deleted only once some lake file holds it whole (``lake_has``) — and
a seal's failure is bookkeeping the partition reports (``SealFailure``, the ``SEAL_FAILED``
file for ``loglake log info`` in another process) while the sealer retries. None of it is on the
append path; keeping it out of ``Partition`` keeps that class about appends, reads and
durability.

Kafka's rule: retention deletes whole sealed segments whose every record is outside the window,
never the active one, oldest first; the folder is fsynced after, or a crash can bring a deleted
segment back (``recovery.drop_resurrected`` ignores such leftovers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from loglake.log import fs, watermark
from loglake.log.api import CorruptStore, SealFailure
from loglake.log.lake import (
    lake_file_max_timestamp,
    lake_lock,
    list_lake_files,
    seal_segment,
    visible_lake_files,
)
from loglake.log.segment import Segment, segment_name

if TYPE_CHECKING:
    from loglake.log.partition import Partition

RETAINED_FILE = "RETAINED"
"""Two-slot file (``watermark.py``'s format; ``next_index``: the first kept segment's base):
every segment below it was deleted by retention or truncation. Written and fsynced before the
unlinks (``record_deletion``), so a segment a crash brought back is known for a leftover by
its base, never by its shape (``recovery.drop_resurrected``)."""

SEAL_FAILED_FILE = "SEAL_FAILED"
"""JSON of the partition's current ``SealFailure`` (written by the writer, removed once the
segment is sealed), for ``loglake log info`` in another process."""

T = TypeVar("T")


def _call(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


def lake_has(p: Partition, seg: Segment) -> bool:
    """Some lake file holds the whole segment (its own, or a compacted one spanning it)."""
    lf = p._lake_file_at(seg.base)
    return lf is not None and lf.first <= seg.base and seg.next_index - 1 <= lf.last


def schedule_seal(p: Partition, seg: Segment) -> None:
    if p.sealer is None:
        seal_reporting(p, seg)
    else:
        p.sealer.submit(lambda: seal_reporting(p, seg))


def seal_reporting(p: Partition, seg: Segment) -> None:
    """``_seal``, keeping its failure where ``health()`` and ``loglake log info`` (the
    ``SEAL_FAILED`` file, for readers in other processes) find it; the sealer retries."""
    try:
        seal(p, seg)
    except Exception as e:
        with p._lock:
            old = p.seal_failure
            same = old is not None and old.segment == seg.path
            p.seal_failure = SealFailure(
                seg.path,
                f"{type(e).__name__}: {e}",
                old.attempts + 1 if same and old else 1,
                old.since_ns if same and old else time.time_ns(),
            )
            record = json.dumps(dataclasses.asdict(p.seal_failure)).encode()
        with contextlib.suppress(OSError):  # e.g. the same full disk: the log says it too
            fs.replace_file_atomic(p.dir / SEAL_FAILED_FILE, record)
        raise
    with p._lock:
        cleared = p.seal_failure is not None and p.seal_failure.segment == seg.path
        if cleared:
            p.seal_failure = None
    if cleared:
        with contextlib.suppress(FileNotFoundError):
            fs.unlink(p.dir / SEAL_FAILED_FILE)


def seal(p: Partition, seg: Segment) -> None:
    """Write a rolled segment to the lake (outside the partition lock: the segment is
    immutable and retention does not delete it before it is sealed)."""
    with p._lock:
        if p._closed or seg.next_index <= seg.base or lake_has(p, seg):
            return  # (a closed partition's successor, if any, seals its own segments)
        if seg not in p.segments:
            return
    run = p.sealer.run if p.sealer is not None else _call
    lf = run(
        seal_segment,
        p.dir / segment_name(seg.base),
        seg.base,
        seg.next_index,
        p.lake_dir,
        p.stream,
        p.partition,
    )
    with p._lock:
        if not lake_has(p, seg):
            p.lake = visible_lake_files(sorted([*p.lake, lf], key=lambda f: (f.first, -f.last)))


def deleted_below(p: Partition) -> int:
    """Every segment below this index was deleted by retention or truncation (0: none known;
    an unreadable file proves nothing, so it is 0 too)."""
    try:
        mark = watermark.read(p.dir, RETAINED_FILE)
    except (CorruptStore, OSError):
        return 0
    return 0 if mark is None else mark.next_index


def record_deletion(p: Partition, keep_from: int) -> None:
    """Before unlinking the segments below ``keep_from`` (caller holds the partition lock):
    say so durably. Why: an unlink whose folder fsync a crash forestalled can come back, and
    retention deletes oldest first, so a leftover ends before its successor starts, as does
    a sealed segment that lost its last records at a frame boundary. Found from outside:
    recovery took such damage for a leftover, and the writer deleted it and every older
    segment (readers and ``verify`` dropped them, exit 0). The file's slots are rewritten in
    place (no new block: a full disk must not stop retention, which frees it)."""
    marks = watermark.MarkWriter(p.dir, RETAINED_FILE)
    try:
        new_file = marks.mark is None
        if marks.mark is not None and marks.mark.next_index >= keep_from:
            return
        marks.put(keep_from, 0, keep_from)
        p._fsync(marks.sync)
        if new_file:
            p._fsync(lambda: fs.fsync_dir(p.dir))  # its name, before any unlink is durable
    finally:
        marks.close()


def enforce(p: Partition, now_ns: int) -> int:
    """Delete sealed segments (and expired lake files); return how many records stopped
    being readable (how far ``first_index`` moved)."""
    cfg = p.config
    with p._lock:
        p._check_writable()  # a failed partition deletes nothing (its successor will)
        before = p.first_index
        horizon = None if cfg.retention_ms is None else now_ns - cfg.retention_ms * 1_000_000
        total = p.bytes
        nxt = p.next_index
        n = 0  # the oldest n segments go
        while len(p.segments) - n > 1:
            seg = p.segments[n]
            newer_records = nxt - seg.next_index
            newer_bytes = total - seg.size
            out = (
                (cfg.retention_records is not None and newer_records >= cfg.retention_records)
                or (cfg.retention_bytes is not None and newer_bytes >= cfg.retention_bytes)
                or (horizon is not None and (seg.compute_max_ts() or 0) < horizon)
            )
            sealed = lake_has(p, seg) or seg.next_index <= p.lake_expired_to
            if not out or (cfg.seal_to_lake and not sealed):
                break  # an unsealed segment waits for the sealer
            total -= seg.size
            n += 1
        if n:
            delete_oldest(p, n)
        if cfg.lake_retention_ms is not None and p.lake_dir.exists():
            lake_horizon = now_ns - cfg.lake_retention_ms * 1_000_000
            # under the lake lock, so a compaction never commits over sources removed
            # here after it planned (pipeline/jobs/compact.py checks them under it)
            with lake_lock(p.lake_dir):
                p.lake = visible_lake_files(list_lake_files(p.lake_dir))
                while p.lake and lake_file_max_timestamp(p.lake[0]) < lake_horizon:
                    gone = p.lake.pop(0)
                    # a live segment it copied is sealed still: without this, segment
                    # retention waited at it for the sealer for good, and kept every newer one
                    p.lake_expired_to = max(p.lake_expired_to, gone.last + 1)
                    # the files it covers go too, or they would become visible again
                    for f in list_lake_files(p.lake_dir):
                        if gone.first <= f.first and f.last <= gone.last:
                            with contextlib.suppress(FileNotFoundError):
                                fs.unlink(f.path)
                    p._fsync(lambda: fs.fsync_dir(p.lake_dir))
        return p.first_index - before


def delete_oldest(p: Partition, n: int) -> None:
    """Delete the oldest ``n`` segments (never the active one; caller holds the lock): the
    record of it first, then the unlinks oldest first, then a folder fsync (or a crash can
    bring a segment back: ``recovery.drop_resurrected``)."""
    assert 0 < n < len(p.segments)
    record_deletion(p, p.segments[n].base)
    gone = p.segments[:n]
    del p.segments[:n]
    for seg in gone:
        seg.delete()
    p._fsync(lambda: fs.fsync_dir(p.dir))


def truncate_before(p: Partition, index: int) -> int:
    """Delete whole segments whose every record is below ``index``; return how many records
    were dropped.

    - ``seal_to_lake``: a segment goes only once the lake holds it (the caller drains the
      sealer first), and the lake is not touched, so the records stay readable there. The
      count is the records that left the segments.
    - otherwise: an active segment wholly below ``index`` is rolled first so that it can
      go too, and lake files wholly below ``index`` are deleted (there are none unless a
      tool wrote them), so nothing below the first kept segment stays readable. The count is
      how far ``first_index`` moved.

    A segment holding ``index`` is kept whole (never drop a record >= ``index``)."""
    cfg = p.config
    with p._lock:
        p._check_writable()
        before = p.first_index
        active = p.segments[-1]
        if not cfg.seal_to_lake and active.size and active.next_index <= index:
            p._roll(cfg.durability)
        n = 0
        while len(p.segments) - n > 1 and p.segments[n].next_index <= index:
            if cfg.seal_to_lake and not lake_has(p, p.segments[n]):
                break  # not in the lake yet: keep it rather than lose it
            n += 1
        dropped = sum(seg.next_index - seg.base for seg in p.segments[:n])
        if n:
            delete_oldest(p, n)
        if cfg.seal_to_lake:
            return dropped
        keep_from = p.segments[0].base if p.segments else p.next_index
        below = [f for f in list_lake_files(p.lake_dir) if f.last < min(index, keep_from)]
        if below:
            with lake_lock(p.lake_dir):  # as in enforce_retention
                for f in below:
                    with contextlib.suppress(FileNotFoundError):
                        fs.unlink(f.path)
                p._fsync(lambda: fs.fsync_dir(p.lake_dir))
        p.lake = visible_lake_files(list_lake_files(p.lake_dir))
        return p.first_index - before
