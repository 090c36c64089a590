"""Fuzz segment recovery (``loglake.log.segment.Segment.recover_active``): the newest segment
file of a partition, with or without its ``.idx`` sparse index, opened by the writer (which cuts
a torn tail at or past the fsynced size) or by a reader, then read back whole.

The input is ``flags, durable, segment bytes [SEP idx bytes]``: bit 0 of ``flags`` opens as a
reader, bit 1 gives the segment a base index of 1000 instead of 0, bit 2 has the writer append
a record after recovering (zero-filling ahead, as a live writer does); ``durable`` (when ≥ 128)
is how many bytes an fsync covered, in steps of 8. Files live in a tmpfs folder (``/dev/shm``).

Typed error: ``CorruptSegment`` (a ``LogError``; with ``RecordDecodeError`` for ``iter_all`` at a
sparse-index resume point). Beyond "no crash": after a writer's recovery the file is exactly the
recovered size (the tail was cut there), every record before it reads back in sequence, and a
second recovery finds the same end and the same next index; a reader never changes the file. A
record appended after recovery lands right after the last one (not after a cut tail or the
zeros), and the next recovery finds it, then the file's end, as a crash would leave it.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.log.api import CorruptSegment, Entry
from loglake.log.record_codec import FRAME_HEAD, encode_batch, encode_plain_parts
from loglake.log.segment import Segment, segment_name
from loglake.log.sparse_index import ENTRY
from tests.fuzz import _harness

EXPECTED = (CorruptSegment,)
INSTRUMENT = ("loglake.log.segment", "loglake.log.record_codec", "loglake.log.sparse_index")
SEP = b"\xfe\xfdIDX"
APPENDED = b"appended after recovery"
_ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def _workdir() -> Path:
    """This process's folder; folders of processes that are gone are removed (libFuzzer leaves
    with ``exit()``, so no run can clean up after itself)."""
    for old in _ROOT.glob("loglake-fuzz-segment-*"):
        try:
            os.kill(int(old.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, PermissionError):
            pass
    d = _ROOT / f"loglake-fuzz-segment-{os.getpid()}"
    d.mkdir(exist_ok=True)
    return d


_DIR: list[Path] = []


def workdir() -> Path:
    if not _DIR:
        _DIR.append(_workdir())
    return _DIR[0]


logging.getLogger("loglake").setLevel(logging.ERROR)  # a cut torn tail logs a warning per input


def _recover(base: int, readonly: bool, durable: int, append: bool = False) -> tuple[int, int]:
    """``(size, next index)`` recovered; with ``append``, then one record written at that point,
    left as a crash leaves it (no trim, no fsync)."""
    seg = Segment.recover_active(workdir(), base, readonly, durable, prealloc_cap=1 << 20)
    try:
        if not readonly:
            assert os.path.getsize(seg.path) == seg.size, "tail not cut at the recovered size"
            records = seg.iter_all()
            assert [r.index for r in records] == list(range(base, seg.next_index))
        found = seg.size, seg.next_index
        if append:
            parts, n, offsets, ts = encode_plain_parts((APPENDED,), seg.next_index, 1)
            seg.write(parts, n, offsets, seg.next_index, ts)
            assert os.path.getsize(seg.path) > seg.size, "no zeros ahead of a small write"
        return found
    finally:
        seg.close()


def one(data: bytes) -> None:
    if len(data) < 2:
        return
    readonly, base = bool(data[0] & 1), 1000 if data[0] & 2 else 0
    durable = 0 if data[1] < 128 else (data[1] - 128) * 8
    seg_bytes, _, idx_bytes = data[2:].partition(SEP)
    folder = workdir()
    path = folder / segment_name(base)
    idx = path.with_suffix(".idx")
    for p in folder.iterdir():
        p.unlink()
    path.write_bytes(seg_bytes)
    if SEP in data:
        idx.write_bytes(idx_bytes)
    append = bool(data[0] & 4) and not readonly
    first = _recover(base, readonly, durable, append)
    if readonly:
        assert path.read_bytes() == seg_bytes, "a reader changed the segment"
    elif append:  # the record appended after the first recovery follows its last record
        size, nxt = _recover(base, False, 0)
        assert (size, nxt) == (first[0] + FRAME_HEAD.size + 19 + len(APPENDED), first[1] + 1)
        seg = Segment.recover_active(workdir(), base, True)
        try:
            assert seg.iter_all()[-1].data == APPENDED
        finally:
            seg.close()
    else:
        assert _recover(base, False, min(durable, first[0])) == first


def seeds() -> list[bytes]:
    out = []
    for base, flag in ((0, 0), (1000, 2)):
        entries = [Entry(bytes([i]) * (40 + i), b"k" if i % 3 == 0 else None) for i in range(12)]
        buf, offsets, _ = encode_batch(entries, base, 1_700_000_000_000_000_000)
        idx = ENTRY.pack(base, 0) + ENTRY.pack(base + 6, offsets[6])
        out += [
            bytes((flag, 0)) + buf,
            bytes((flag, 0)) + buf[:-7],  # torn tail
            bytes((flag | 1, 0)) + buf[:-7],
            bytes((flag, 128 + len(buf) // 16)) + buf + SEP + idx,
            bytes((flag, 0)) + buf[:-7] + SEP + idx,
            bytes((flag | 4, 0)) + buf[:-7] + bytes(300),  # torn, then zeros; append after
            bytes((flag | 4, 128 + len(buf) // 16)) + buf + bytes(5000) + SEP + idx,
        ]
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
