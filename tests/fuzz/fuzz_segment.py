"""Fuzz segment recovery (``loglake.log.segment.Segment.recover_active``): the newest segment
file of a partition, with or without its ``.idx`` sparse index, opened by the writer (which cuts
a torn tail at or past the fsynced size) or by a reader, then read back whole.

The input is ``flags, durable, segment bytes [SEP idx bytes]``: bit 0 of ``flags`` opens as a
reader, bit 1 gives the segment a base index of 1000 instead of 0; ``durable`` (when ≥ 128) is
how many bytes an fsync covered, in steps of 8. Files live in a tmpfs folder (``/dev/shm``).

Typed error: ``CorruptSegment`` (a ``LogError``; with ``RecordDecodeError`` for ``iter_all`` at a
sparse-index resume point). Beyond "no crash": after a writer's recovery the file is exactly the
recovered size (the tail was cut there), every record before it reads back in sequence, and a
second recovery finds the same end and the same next index; a reader never changes the file.
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
from loglake.log.record_codec import encode_batch
from loglake.log.segment import Segment, segment_name
from loglake.log.sparse_index import ENTRY
from tests.fuzz import _harness

EXPECTED = (CorruptSegment,)
INSTRUMENT = ("loglake.log.segment", "loglake.log.record_codec", "loglake.log.sparse_index")
SEP = b"\xfe\xfdIDX"
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


def _recover(base: int, readonly: bool, durable: int) -> tuple[int, int]:
    seg = Segment.recover_active(workdir(), base, readonly, durable)
    try:
        if not readonly:
            assert os.path.getsize(seg.path) == seg.size, "tail not cut at the recovered size"
            records = seg.iter_all()
            assert [r.index for r in records] == list(range(base, seg.next_index))
        return seg.size, seg.next_index
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
    first = _recover(base, readonly, durable)
    if readonly:
        assert path.read_bytes() == seg_bytes, "a reader changed the segment"
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
        ]
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
