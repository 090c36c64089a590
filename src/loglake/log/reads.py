"""Reading a partition: records and Arrow tables from its segments and the lake below them.

Why a module of its own: reads do not hold the partition lock while they touch the disk, so a
cold read never stalls appends. Under the lock a read only takes a view (which segments, their
sizes, the visible end) and pins those segments (their read descriptors stay open if retention
deletes them meanwhile); the bytes it then reads are immutable (sealed segments, lake files,
the active segment below its size at that moment). That discipline is the whole of this module,
and it shares nothing with the append path but the lock, so it lives apart from ``Partition``.

A sealed segment whose checksums fail is served from its lake copy when one verifies
(``_lake_copy_read``); a file that disappears under a read (retention, a compaction) is looked
up again a few times (``_missed``).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from loglake.log import recovery, retention
from loglake.log.api import CorruptSegment, Record
from loglake.log.lake import (
    list_lake_files,
    plain_table,
    read_lake_file,
    records_table,
    visible_lake_files,
)
from loglake.log.segment import Segment
from loglake.structured_logging import log_event

if TYPE_CHECKING:
    import pyarrow as pa

    from loglake.log.partition import Partition

logger = logging.getLogger(__name__)

TABLE_BYTES = 8 * 1024 * 1024
"""Records per table of ``read_tables``, in bytes (about; whole index entries)."""


def read(
    p: Partition,
    start: int,
    limit: int | None,
    end: int | None,
    pairs: bool = False,
    max_bytes: int | None = None,
) -> list:
    """Records ``start <= index < end`` (at most ``limit``) from the lake below the first
    live segment and from segments above it.

    ``max_bytes``: stop before a record whose data would take the records' data past it (the
    first is always returned). Found from outside: a pull read every message up to its
    ``limit`` and only then cut its reply to ``max_pull_bytes``; 4 pulls of 100,000 over
    2,400 records of 256 KiB took 4.2 s each and the server 2.4 GB, to send 8 MiB each.

    Reads do not hold the partition lock while they touch the disk, so a cold read never
    stalls appends: under the lock a read only takes a view (which segments,
    their sizes, the visible end) and pins those segments (their read fds stay open if
    retention deletes them meanwhile). The bytes it then reads are immutable: sealed
    segments, lake files, and the part of the active segment below its size at that moment
    (appends only add past it)."""
    with p._lock:
        p._check_open()
        if p.readonly:
            p.refresh()
        visible = p.visible_next
    end = visible if end is None else min(end, visible)
    pos = start
    remaining = None if limit is None else max(0, limit)
    out: list = []  # records, or (index, data) pairs
    misses = 0
    room = max_bytes
    while (
        (remaining is None or remaining > 0) and pos < end and (room is None or room > 0 or not out)
    ):
        with p._lock:
            p._check_open()  # a closed partition's segments must not be pinned again
            pos = max(pos, p.first_index)
            seg_first = p.segments[0].base if p.segments else p.next_index
            view = None
            if pos >= seg_first or not p.lake:
                try:
                    view = pin_view(p, pos, end)
                except FileNotFoundError:
                    misses = _missed(p, misses)  # deleted by the writer since listed
                    continue
            lf = None if view is not None else p._lake_file_at(pos)
        if view is not None:
            try:
                out += read_segments(p, view, pos, end, remaining, pairs, room, bool(out))
            finally:
                with p._lock:
                    for seg, _ in view:
                        seg.unpin()
            break
        if lf is None or lf.first >= seg_first:
            pos = seg_first  # a gap in the lake (it never held that range)
            continue
        want = min(end, seg_first, lf.last + 1) - max(pos, lf.first)
        if remaining is not None:
            want = min(want, remaining)
        try:
            got = read_lake_file(lf, p.stream, p.partition, pos, end, want)
        except FileNotFoundError:
            # Removed since we listed it: by lake retention, or by a compaction that wrote
            # a file covering it. Look again.
            with p._lock:
                misses = _missed(p, misses)
            continue
        rows = [(r.index, r.data) for r in got] if pairs else got
        if room is not None:
            rows, room = _within(rows, room, bool(out), pairs)
            if len(rows) < len(got):
                out += rows
                break
        out += rows
        if remaining is not None:
            remaining -= len(got)
        pos = max(pos, lf.first) + want
    return out


def _within(rows: list, room: int, taken: bool, pairs: bool) -> tuple[list, int]:
    """The first of ``rows`` whose data fits in ``room`` bytes (one at least, unless rows were
    ``taken`` before), and the room left (negative: past it)."""
    for k, row in enumerate(rows):
        n = len(row[1] if pairs else row[-1] if isinstance(row, tuple) else row.data)
        if n > room and (taken or k):
            return rows[:k], room
        room -= n
    return rows, room


def read_tables(
    p: Partition, start: int, end: int, max_bytes: int = TABLE_BYTES
) -> Iterator[pa.Table]:
    """What ``read(start, None, end)`` returns, as tables in the lake's schema of about
    ``max_bytes`` of records each, in index order.

    Why: a Spark task reading the live tail (the ``loglake`` source, ``job archives-build``)
    spent ~6 µs a record building a ``Record`` and then an Arrow row from it. Records in
    the segments come out as columns straight from their bytes (``Segment.plain_chunk``,
    ``plain_table``). Everything else — the lake below the segments, records with a key or
    headers, a damaged or torn frame — comes through ``read``, row by row, with its
    checks and its errors. A chunk's segment is pinned only while its bytes are read."""
    pos = start
    while pos < end:
        with p._lock:
            p._check_open()
            if p.readonly:
                p.refresh()
            stop = min(end, p.visible_next)
            pos = max(pos, p.first_index)
            if pos >= stop:
                return
            seg_first = p.segments[0].base if p.segments else p.next_index
            view = pin_view(p, pos, pos + 1) if pos >= seg_first else []
        chunk_end: int | None = None  # where the segment's chunk ends, once known
        fast = None
        try:
            if view:
                seg, size = view[0]
                chunk_end, fast = seg.plain_chunk(pos, stop, size, max_bytes)
        except FileNotFoundError:  # deleted since it was listed: read() looks again
            pass
        finally:
            if view:
                with p._lock:
                    view[0][0].unpin()
        table = None if fast is None else plain_table(*fast, p.stream, p.partition)
        if fast is not None and table is not None and int(fast[1].index[0]) + len(table) > pos:
            first = int(fast[1].index[0])
            hi = min(stop, first + table.num_rows)
            yield table.slice(pos - first, hi - pos)
            pos = hi
            continue
        # the chunk row by row; else (the lake below the segments, a segment deleted
        # meanwhile) about max_bytes of rows
        if chunk_end is not None:
            rows = p.read(pos, None, min(stop, max(chunk_end, pos + 1)))
        else:
            rows = p.read(pos, max(1, max_bytes // 1024), stop)
        if not rows:
            return
        yield records_table(rows, p.stream, p.partition)
        pos = rows[-1].index + 1


def _missed(p: Partition, misses: int) -> int:
    """A file listed a moment ago is gone (caller holds the lock): look again, up to 5
    times."""
    if misses >= 5:
        raise FileNotFoundError(f"{p.dir}: files keep disappearing under a read")
    if p.readonly:
        p.refresh()
    else:
        p.lake = visible_lake_files(list_lake_files(p.lake_dir))
    return misses + 1


def pin_view(p: Partition, pos: int, end: int) -> list[tuple[Segment, int]]:
    """``(segment, size now)`` of the segments holding ``pos..end``, pinned (caller holds
    the lock)."""
    view: list[tuple[Segment, int]] = []
    i = max(0, bisect.bisect_right([s.base for s in p.segments], pos) - 1)
    try:
        for seg in p.segments[i:]:
            if seg.base >= end:
                break
            seg.pin()
            view.append((seg, seg.size))
    except BaseException:
        for seg, _ in view:
            seg.unpin()
        raise
    return view


def read_segments(
    p: Partition,
    view: list[tuple[Segment, int]],
    pos: int,
    end: int,
    remaining: int | None,
    pairs: bool = False,
    room: int | None = None,
    taken: bool = False,
) -> list:
    """The records of ``view`` from ``pos``; ``room``: at most that many bytes of data (one
    record at least unless records were ``taken`` before: ``read``'s ``max_bytes``)."""
    out: list = []
    for seg, size in view:
        if (remaining is not None and remaining <= 0) or pos >= end:
            break
        if room is not None and room <= 0 and (out or taken):
            break
        want = end - pos if remaining is None else remaining
        try:
            got = seg.read(pos, end, want, pairs, size, may_rebuild=seg.is_sealed, max_bytes=room)
        except CorruptSegment as e:
            if p.readonly and not seg.is_sealed:
                got = None  # a reader's look may be stale: read again before reporting it
            else:
                copy = _lake_copy_read(p, seg, e, pos, end, want, pairs)
                out += copy
                if remaining is not None:
                    remaining -= len(copy)
                pos = max(pos, seg.next_index)
                continue
        if got is None and p.readonly:  # a reader's active segment disagrees with the file
            got = _reread_and_read(p, seg, pos, end, want, pairs)
            if got is None:
                break  # the segment rolled and went to retention meanwhile
        elif got is None:  # the writer's active segment has a wrong index entry
            with p._lock:
                seg.rebuild_index()
                got = seg.read(pos, end, want, pairs, size)
            assert got is not None
        short = False
        if room is not None:
            # the segment stops at the cap itself, but takes one record even when rows were
            # taken before it (from an earlier segment or the lake): that one may not fit
            n = len(got)
            got, room = _within(got, room, taken or bool(out), pairs)
            short = len(got) < n or (bool(got) and got[-1][0] + 1 < min(end, seg.next_index))
        if pairs:
            out += got
        else:
            stream, partition = p.stream, p.partition
            out += [Record(stream, partition, *row) for row in got]
        if remaining is not None:
            remaining -= len(got)
        if short:
            break
        pos = max(pos, seg.next_index)
    return out


def _reread_and_read(
    p: Partition, seg: Segment, pos: int, end: int, want: int, pairs: bool
) -> list | None:
    """A reader's active segment whose index entry points at another record, or whose read
    failed: the writer may have cut frames this reader had read (a full disk) and written
    others over them. Its index and size are from that earlier look, so rebuilding the index
    up to that size would report the zeros past the writer's records as damage (found from
    outside: ``CorruptSegment 'implausible body length 0'`` for acknowledged records). The
    segment is read again as on a first look (``recovery.reread_active``) and the read runs
    on that; damage it still finds is reported. None: the segment is gone."""
    with p._lock:
        fresh = next((s for s in p.segments if s.base == seg.base), None)
        try:
            if fresh is seg:
                fresh = recovery.reread_active(p, seg)
        except FileNotFoundError:
            fresh = None
        if fresh is None:
            return None
        fresh.pin()
        size = fresh.size
    try:
        return fresh.read(pos, end, want, pairs, size)
    finally:
        with p._lock:
            fresh.unpin()


def _lake_copy_read(
    p: Partition, seg: Segment, e: CorruptSegment, pos: int, end: int, want: int, pairs: bool
) -> list:
    """A sealed segment failed its checksums: its records come from its lake copy, which
    ``read_lake_file`` verifies, and the damage is logged (once a file) for ``loglake log
    verify`` to find. No verified copy: the segment's error stands."""
    with p._lock:
        lf = p._lake_file_at(seg.base) if seg.is_sealed and retention.lake_has(p, seg) else None
        first_time = seg.path not in p.damaged
        p.damaged.add(seg.path)
    if lf is None:
        raise e
    if first_time:
        log_event(
            logger,
            logging.ERROR,
            "sealed segment damaged; served from its lake copy",
            file=seg.path,
            offset=e.offset,
            reason=e.reason,
            lake=str(lf.path),
        )
    hi = min(end, seg.next_index)
    got = read_lake_file(lf, p.stream, p.partition, pos, hi, min(want, hi - pos))
    return [(r.index, r.data) for r in got] if pairs else got
