"""Bit rot (issue 17): one byte flipped at a seeded random offset of each kind of file the log
keeps. Every flip is either reported — ``CorruptSegment``/``CorruptStore`` naming the file and,
for segments, the offset of the damaged record — or harmless: everything reads back exactly as
written. Derived files (sparse indexes, durable watermarks) are rebuilt or fall back, never an
error. Nothing is ever served differently from what was written, and nothing goes missing.

Each case prints its seed and offset on failure; ``LOGLAKE_BITROT_FLIPS`` sets flips per kind."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from loglake.log import CorruptSegment, CorruptStore, Entry, StreamConfig, open_log
from loglake.log.record_codec import FRAME_HEAD

FLIPS = int(os.environ.get("LOGLAKE_BITROT_FLIPS", "12"))
CLIENTS = [f"client-{i}" for i in range(12)]


def _build(data: Path) -> None:
    with open_log(data) as log:
        # s: sealed segments and an active one, still on disk (and in the lake)
        log.create_stream("s", StreamConfig(segment_bytes=3000, seal_to_lake=False))
        # t: history served from the lake only (its segments are gone)
        log.create_stream("t", StreamConfig(segment_bytes=3000, retention_records=1))
        for i in range(80):
            key = b"k%d" % i if i % 3 == 0 else None
            headers = (("h", b"%d" % i),) if i % 4 == 0 else ()
            log.append_many("s", [Entry(b"s%04d" % i + b"." * (i % 50), key, headers)])
            log.append_many("t", [Entry(b"t%04d" % i + b"-" * (i % 70), key, headers)])
        log.wait_for_seals()
        log.enforce_retention()
        for i, c in enumerate(CLIENTS):
            log.save_index(c, "s", 10 + i)
            log.save_index(c, "s", 20 + i)


def _observe(data: Path) -> dict:
    with open_log(data) as log:
        out = {
            name: [(r.index, r.key, r.headers, r.data) for r in log.read(name, 0)]
            for name in ("s", "t")
        }
        out["consumers"] = [log.get_index(c, "s") for c in CLIENTS]
        log.verify()
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, dict]:
    data = tmp_path_factory.mktemp("bitrot") / "data"
    _build(data)
    return data, _observe(data)


KINDS = {
    "sealed segment": lambda d: sorted((d / "streams/s/0").glob("*.seg"))[:-1],
    "active segment": lambda d: sorted((d / "streams/s/0").glob("*.seg"))[-1:],
    "sparse index": lambda d: sorted((d / "streams").glob("*/0/*.idx")),
    "durable watermark": lambda d: sorted((d / "streams").glob("*/0/DURABLE")),
    "retention marker": lambda d: sorted((d / "streams").glob("*/0/RETAINED")),
    "consumer store": lambda d: [d / "consumers.log"],
    "lake file": lambda d: sorted((d / "lake/t/partition=0").glob("*.parquet")),
}


def _record_start(path: Path, offset: int) -> int:
    raw = path.read_bytes()
    pos = 0
    while True:
        (length,) = FRAME_HEAD.unpack_from(raw, pos)[:1]
        if pos + FRAME_HEAD.size + length > offset:
            return pos
        pos += FRAME_HEAD.size + length


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_flipped_byte_is_reported_with_its_file_or_harmless(tmp_path, pristine, kind):
    source, expected = pristine
    rng = random.Random(f"bitrot-{kind}")
    reported = harmless = 0
    for n in range(FLIPS):
        data = tmp_path / f"flip{n}"
        shutil.copytree(source, data)
        files = KINDS[kind](data)
        assert files, kind
        path = rng.choice(files)
        raw = bytearray(path.read_bytes())
        offset = rng.randrange(len(raw))
        raw[offset] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(raw))
        where = f"{kind}: {path.relative_to(data)} byte {offset} (seed bitrot-{kind}, flip {n})"
        try:
            got = _observe(data)
        except CorruptSegment as e:
            assert e.path == str(path), where
            if path.suffix == ".seg":
                assert e.offset == _record_start(data / path.relative_to(data), offset) or (
                    _record_start(path, offset) <= e.offset <= offset
                ), (where, e)
            reported += 1
        except CorruptStore as e:
            assert e.path == str(path), where
            reported += 1
        else:
            assert got == expected, f"served differently after a flip: {where}"
            harmless += 1
        shutil.rmtree(data)
    if kind in ("sealed segment", "active segment", "consumer store"):
        assert reported == FLIPS, "every flip of primary data is reported"
    if kind in ("sparse index", "durable watermark", "retention marker"):
        assert harmless == FLIPS, "derived data is rebuilt or falls back, never an error"


def test_a_flip_in_a_lake_footers_names_is_reported_or_harmless(tmp_path, pristine):
    """Each byte of every column and field name in a lake file's footer flipped in turn: a
    renamed header field (``key`` → ``kez``) read back as a ``KeyError`` from the reader
    (fresh-clone CI of bab1970, where the seeded flip happened to land there)."""
    source, expected = pristine
    lake = KINDS["lake file"](source)[0]
    raw = lake.read_bytes()
    footer = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    names = (b"index", b"timestamp_ns", b"key", b"headers", b"value", b"data")
    offsets = sorted(
        at + i for name in names for at in _occurrences(raw, name, footer) for i in range(len(name))
    )
    assert len(offsets) > 20, offsets
    for offset in offsets:
        data = tmp_path / f"flip{offset}"
        shutil.copytree(source, data)
        path = data / lake.relative_to(source)
        flipped = bytearray(raw)
        flipped[offset] ^= 1
        path.write_bytes(bytes(flipped))
        try:
            got = _observe(data)
        except CorruptSegment as e:
            assert e.path == str(path), offset
        else:
            assert got == expected, f"served differently after a flip at byte {offset}"
        shutil.rmtree(data)


def _occurrences(raw: bytes, name: bytes, start: int) -> Iterator[int]:
    at = raw.find(name, start)
    while at >= 0:
        yield at
        at = raw.find(name, at + 1)


def test_a_disk_error_on_a_lake_file_is_not_reported_as_damage(tmp_path, pristine, monkeypatch):
    """pyarrow reads lake files itself (not through ``loglake.log.fs``), so a failing disk
    shows here as an ``OSError`` with an errno: it must reach the reader as that, not as
    ``CorruptSegment`` ("unreadable Parquet") for a file that may be whole."""
    import errno

    import loglake.log.lake as lake

    source, expected = pristine
    data = tmp_path / "data"
    shutil.copytree(source, data)

    def failing_read(path, *a, **kw):
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(lake.pq, "read_table", failing_read)
    with open_log(data) as log, pytest.raises(OSError) as e:
        list(log.read("t", 0))
    assert e.value.errno == errno.EIO and not isinstance(e.value, CorruptSegment)
    monkeypatch.undo()
    assert _observe(data) == expected  # nothing was damaged
