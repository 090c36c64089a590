"""Rewrite a damaged copy of sealed history from the copy of it that verifies.

Why: sealed history is kept twice — the sealed segment (``segment.py``, CRC per record) and its
lake copy (``lake.py``, Parquet with page checksums). A read of a sealed segment that fails its
checksums is already served from a lake copy that verifies (``reads._lake_copy_read``), but
the damaged file stays damaged, and the next bit flip in the other copy would lose the range.
``loglake log verify --repair`` closes that window: each damaged copy is rebuilt from the one
that verifies, in both directions (a sealed segment from the lake file holding its range; a
lake file from the sealed segments holding its range). A copy is never touched when no other
copy of its range verifies: it is reported as unrecoverable.

How a rewrite stays safe:
- Atomic and durable: the new bytes are checked in memory (a segment is decoded back frame by
  frame; a lake file is checked with ``check_lake_file`` after writing), then written to a
  temporary file beside the old one, fsynced, renamed over it, and the folder fsynced
  (``fs.replace_file_atomic``, ``write_lake_table``). A crash leaves the old or the new file,
  whole. A sealed segment's ``.idx`` is removed first: it is derived data, rebuilt from the
  segment on first use, so a new segment never meets a stale index.
- One writer: ``repair`` holds the data dir's writer lock (``LOCK``) for the whole run and
  refuses (``RepairRefused``) while a writer — ``loglake serve`` — holds it. A running writer
  keeps open descriptors and cached sparse indexes of its sealed segments; swapping a file
  under it would leave it reading the old inode. Readers in other processes (Spark, ``loglake
  log read``) are safe: they open the old whole file or the new one.
- Lake files are rewritten under the partition's ``lake_lock`` (as the compaction job commits),
  and only if the file is still there: a compaction or lake retention that ran since the scan
  removed it, and nothing is written back.
- Idempotent: a second run finds nothing damaged and writes nothing. Bytes are the same the
  writer wrote: a segment's frames are encoded again from the records (``encode_batch``, the
  writer's own encoder; the frame format is deterministic), so a repaired segment is the
  original file byte for byte.

The active (newest) segment of a partition has no lake copy, and recovery on open handles its
torn tail. Its bytes below the durable watermark are checked (read-only, as a reader does:
``Segment.recover_active``) and damage there is listed as unrecoverable. Found from outside:
``loglake log verify`` failed on such damage but listed nothing (``--json``: ``{"damage": []}``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from loglake.log import fs, recovery, watermark
from loglake.log.api import (
    CorruptSegment,
    CorruptStore,
    Entry,
    LogLocked,
    Record,
    ascii_digits,
    in_use_by_writer,
)
from loglake.log.lake import (
    LakeFile,
    check_lake_file,
    lake_lock,
    list_lake_files,
    read_lake_file,
    records_table,
    visible_lake_files,
    write_lake_table,
)
from loglake.log.lake_schema import lake_partition_dir, parse_lake_file_name
from loglake.log.record_codec import encode_batch, scan
from loglake.log.segment import INDEX_SUFFIX, Segment, parse_segment_name, segment_name
from loglake.log.segment_log import LOCK_FILE, STREAMS_DIR

REPAIR_TMP_SUFFIX = ".repair-tmp"
"""A segment rewrite's temporary file: ``.<segment name>.repair-tmp`` (no ``.seg`` suffix, so
the log never lists it as a segment; removed by the next ``repair`` if a crash left it)."""


class RepairRefused(LogLocked):
    """A writer (``loglake serve``) holds the data dir: repair swaps files a writer has open."""

    def __init__(self, data_dir: str) -> None:
        Exception.__init__(self, in_use_by_writer(data_dir, "loglake log verify --repair"))


@dataclass(frozen=True, slots=True)
class Damage:
    """One copy of a range of sealed history that fails to verify, and the copies that can
    replace it (``sources``: a lake file for a segment, the segments for a lake file; empty
    when none of them verifies — unrecoverable)."""

    stream: str
    partition: int
    kind: Literal["segment", "lake"]
    path: str
    first: int
    last: int
    offset: int
    reason: str
    sources: tuple[str, ...]
    repaired: bool = False

    @property
    def recoverable(self) -> bool:
        return bool(self.sources)


@dataclass
class Report:
    """What a scan found (and a repair did): copies checked, damaged copies."""

    segments: int = 0
    lake_files: int = 0
    damage: list[Damage] = field(default_factory=list)

    @property
    def unrecoverable(self) -> list[Damage]:
        return [d for d in self.damage if not d.recoverable]

    @property
    def repaired(self) -> list[Damage]:
        return [d for d in self.damage if d.repaired]


Progress = Callable[[int], None]
"""Called with the bytes just checked (for a progress bar)."""


@dataclass
class _Partition:
    stream: str
    partition: int
    seg_dir: Path
    lake_dir: Path
    sealed: list[tuple[int, int]]
    """``(base, next_index)`` of every sealed segment (all but the newest)."""
    lake: list[LakeFile]
    active: int | None = None
    """The newest segment's first index (None: no segment)."""
    mark: watermark.Mark | None = None
    """The durable watermark, read before the segments were listed (``recovery.follow_writer``
    says why that order)."""

    def seg_path(self, base: int) -> Path:
        return self.seg_dir / segment_name(base)


def _partitions(data_dir: Path) -> Iterator[_Partition]:
    root = data_dir / STREAMS_DIR
    try:
        streams = sorted(fs.listdir(root))
    except FileNotFoundError:
        return
    for stream in streams:
        sdir = root / stream
        if not sdir.is_dir():
            continue
        for name in sorted(fs.listdir(sdir), key=lambda n: (len(n), n)):
            if not ascii_digits(name) or not (sdir / name).is_dir():
                continue
            p = int(name)
            try:
                mark = watermark.read(sdir / name)
            except CorruptStore:
                mark = None  # opening the log says so; the sealed history is checked still
            bases = _bases(sdir / name)
            lake_dir = lake_partition_dir(data_dir, stream, p)
            yield _Partition(
                stream,
                p,
                sdir / name,
                lake_dir,
                list(itertools.pairwise(bases)),
                visible_lake_files(list_lake_files(lake_dir)),
                bases[-1] if bases else None,
                mark,
            )


def _bases(seg_dir: Path) -> list[int]:
    return sorted(b for b in map(parse_segment_name, fs.listdir(seg_dir)) if b is not None)


def _size(path: Path | str) -> int:
    try:
        return fs.stat(path).st_size
    except FileNotFoundError:
        return 0


def _check_segment(part: _Partition, base: int, nxt: int) -> CorruptSegment | None:
    """None if the sealed segment reads whole (CRC, framing, index sequence); else its error.
    Gone since listed (retention under a live writer, for a scan): nothing to report."""
    try:
        seg = Segment.sealed(part.seg_dir, base, nxt, readonly=True)
    except FileNotFoundError:
        return None
    try:
        seg.iter_all()
    except CorruptSegment as e:
        return e
    except FileNotFoundError:
        return None
    finally:
        seg.close()
    return None


def _check_active(part: _Partition) -> Damage | None:
    """Damage below the watermark in the active segment (unrecoverable: it has no lake copy).
    Past the watermark a bad frame is a torn tail, which the writer's open cuts."""
    mark, base = part.mark, part.active
    if mark is None:
        return None  # nothing of the newest segment is known fsynced
    try:
        if base is None or mark.base > base:  # gone (see ``recovery.check_newest``)
            raise recovery.missing_segment(part.seg_dir, mark)
        if mark.base != base:
            return None  # the watermark is older than the newest segment
        Segment.recover_active(part.seg_dir, base, True, mark.size).close()
    except CorruptSegment as e:
        return Damage(
            part.stream,
            part.partition,
            "segment",
            e.path,
            mark.base,
            mark.next_index - 1,
            e.offset,
            e.reason,
            (),
        )
    except FileNotFoundError:
        pass  # deleted since listed: retention rolled and removed it under a live writer
    return None


def _check_lake(lf: LakeFile) -> CorruptSegment | None:
    if not Path(lf.path).exists():
        return None  # removed since listed (compaction, lake retention)
    try:
        check_lake_file(lf)
    except CorruptSegment as e:
        # removed while it was read (compaction, lake retention beside a live writer)
        return e if Path(lf.path).exists() else None
    return None


def planned_bytes(data_dir: Path | str) -> int:
    """The bytes ``scan_damage`` will read (every sealed segment and visible lake file): the
    total of a progress bar."""
    total = 0
    for part in _partitions(Path(data_dir)):
        total += sum(_size(part.seg_path(b)) for b, _ in part.sealed)
        total += sum(_size(lf.path) for lf in part.lake)
    return total


def scan_damage(data_dir: Path | str, progress: Progress | None = None) -> Report:
    """Check every sealed segment and visible lake file of every partition; for each damaged
    one, name the copies that can replace it. Read-only: safe beside a running writer."""
    data_dir = Path(data_dir)
    report = Report()
    parts = list(_partitions(data_dir))
    for part in parts:
        active = _check_active(part)
        if active is not None:
            report.damage.append(active)
        bad_segs: dict[int, CorruptSegment] = {}
        bad_lake: dict[str, CorruptSegment] = {}
        for base, nxt in part.sealed:
            err = _check_segment(part, base, nxt)
            if err is not None:
                bad_segs[base] = err
            report.segments += 1
            if progress:
                progress(_size(part.seg_path(base)))
        for lf in part.lake:
            err = _check_lake(lf)
            if err is not None:
                bad_lake[str(lf.path)] = err
            report.lake_files += 1
            if progress:
                progress(_size(lf.path))
        for base, nxt in part.sealed:
            if base not in bad_segs or nxt <= base:
                continue
            err = bad_segs[base]
            copy = _lake_copy(part, base, nxt)
            ok = copy is not None and str(copy.path) not in bad_lake
            report.damage.append(
                Damage(
                    part.stream,
                    part.partition,
                    "segment",
                    err.path,
                    base,
                    nxt - 1,
                    err.offset,
                    err.reason,
                    (str(copy.path),) if ok and copy is not None else (),
                )
            )
        for lf in part.lake:
            if str(lf.path) not in bad_lake:
                continue
            err = bad_lake[str(lf.path)]
            segs = _segment_copies(part, lf)
            ok = segs is not None and not any(b in bad_segs for b, _ in segs)
            report.damage.append(
                Damage(
                    part.stream,
                    part.partition,
                    "lake",
                    err.path,
                    lf.first,
                    lf.last,
                    err.offset,
                    err.reason,
                    tuple(str(part.seg_path(b)) for b, _ in segs) if ok and segs else (),
                )
            )
    return report


def _lake_copy(part: _Partition, base: int, nxt: int) -> LakeFile | None:
    """The visible lake file holding all of ``base..nxt-1`` (its own seal, or a compaction
    spanning it), as ``Partition._lake_has`` finds it."""
    for lf in part.lake:
        if lf.first <= base and nxt - 1 <= lf.last:
            return lf
    return None


def _segment_copies(part: _Partition, lf: LakeFile) -> list[tuple[int, int]] | None:
    """The sealed segments that together hold exactly ``lf.first..lf.last`` or more, without
    a gap; None when retention deleted some of them."""
    segs = [(b, n) for b, n in part.sealed if b <= lf.last and n - 1 >= lf.first]
    if not segs or segs[0][0] > lf.first or segs[-1][1] - 1 < lf.last:
        return None
    if any(a[1] != b[0] for a, b in itertools.pairwise(segs)):
        return None
    return segs


@contextlib.contextmanager
def writer_lock(data_dir: Path) -> Iterator[None]:
    """The data dir's writer lock (the one ``SegmentLog`` takes), or ``RepairRefused``."""
    try:
        fd = fs.lock_file(data_dir / LOCK_FILE)
    except fs.LockHeld:
        raise RepairRefused(str(data_dir)) from None
    try:
        yield
    finally:
        fs.close(fd)  # closing the descriptor releases the lock


def repair(data_dir: Path | str, progress: Progress | None = None) -> Report:
    """Scan (as ``scan_damage``) and rewrite every damaged copy that has a verified one; the
    returned report marks what was rewritten. Holds the writer lock throughout
    (``RepairRefused`` if a writer has the data dir)."""
    data_dir = Path(data_dir)
    with writer_lock(data_dir):
        for part in _partitions(data_dir):
            for name in fs.listdir(part.seg_dir):
                if name.endswith(REPAIR_TMP_SUFFIX):  # a crash during an earlier repair
                    fs.unlink(part.seg_dir / name)
        report = scan_damage(data_dir, progress)
        done = []
        for d in report.damage:
            repaired = False
            if d.recoverable:
                if d.kind == "segment":
                    repaired = _rewrite_segment(data_dir, d)
                else:
                    repaired = _rewrite_lake(data_dir, d)
            done.append(dataclasses.replace(d, repaired=repaired))
        report.damage = done
    return report


def _rewrite_segment(data_dir: Path, d: Damage) -> bool:
    """The segment's frames encoded again from its verified lake copy, checked, swapped in."""
    path = Path(d.path)
    lf_path = Path(d.sources[0])
    lf = LakeFile(*_range_of(lf_path), lf_path)
    count = d.last - d.first + 1
    try:
        records = read_lake_file(lf, d.stream, d.partition, d.first, d.last + 1, count)
    except FileNotFoundError:
        return False  # compacted over or expired since the scan: the next run looks again
    buf, _, _ = encode_batch(
        [Entry(r.data, r.key, r.headers, r.timestamp_ns) for r in records], d.first, 0
    )
    decoded, end, err = scan(buf, 0)
    if (
        err is not None
        or end != len(buf)
        or [r.index for r in decoded] != list(range(d.first, d.last + 1))
    ):
        raise CorruptSegment(str(lf_path), 0, "re-encoded records do not decode back")
    with contextlib.suppress(FileNotFoundError):
        fs.unlink(path.with_suffix(INDEX_SUFFIX))  # derived; the rename's folder fsync covers it
    fs.replace_file_atomic(path, buf, tmp=path.with_name(f".{path.name}{REPAIR_TMP_SUFFIX}"))
    return True


def _rewrite_lake(data_dir: Path, d: Damage) -> bool:
    """The lake file written again from its verified sealed segments, under the lake lock."""
    records: list[Record] = []
    for seg_path in map(Path, d.sources):
        base = parse_segment_name(seg_path.name)
        assert base is not None
        seg_dir = seg_path.parent
        bases = _bases(seg_dir)
        nxt = bases[bases.index(base) + 1]
        seg = Segment.sealed(seg_dir, base, nxt, readonly=True)
        try:
            rows = seg.iter_all()
        finally:
            seg.close()
        records += [
            Record(d.stream, d.partition, r.index, r.timestamp_ns, r.key, r.headers, r.data)
            for r in rows
            if d.first <= r.index <= d.last
        ]
    lake_dir = Path(d.path).parent
    with lake_lock(lake_dir):
        if not Path(d.path).exists():
            return False  # compacted over or expired since the scan: nothing to put back
        lf = write_lake_table(lake_dir, records_table(records, d.stream, d.partition))
        check_lake_file(lf)
    return True


def _range_of(path: Path) -> tuple[int, int]:
    rng = parse_lake_file_name(path.name)
    assert rng is not None
    return rng
