"""Fuzz the archive ``index`` file decoder (``Layout.decode_index``) of both layouts — the
spec's ``WakuMessageArchiveIndex`` and status-go's — with and without the torrent's data size.

Typed error: ``ArchiveError`` subclasses (``CorruptIndex``, ``MisalignedArchive``). Beyond "no
crash": every entry returned is piece-aligned, inside the data, and non-overlapping, and its key
is keccak-256 of its metadata (the checks ``decode_index`` promises).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.archives.errors import ArchiveError
from loglake.archives.layout import archive_id
from tests.fuzz import _harness
from tests.fuzz._archives import LAYOUTS, archives

EXPECTED = (ArchiveError,)
INSTRUMENT = ("loglake.archives.layout",)


def one(data: bytes) -> None:
    if not data:
        return
    layout = LAYOUTS[data[0] & 1]
    data_size = None if data[0] & 2 else (data[0] >> 2) * layout.piece_length
    entries = layout.decode_index(data[1:], data_size)
    end = 0
    for e in entries:
        assert archive_id(e.encoded) == e.archive_id
        assert e.offset % layout.piece_length == 0 and e.size % layout.piece_length == 0
        assert e.offset >= end and 0 <= e.padding <= e.size
        end = e.offset + e.size
    assert data_size is None or end <= data_size


def seeds() -> list[bytes]:
    out = []
    for k, layout in enumerate(LAYOUTS):
        entries = [entry for _, entry in archives(layout)]
        index = layout.encode_index(entries)
        size = sum(e.size for e in entries) // layout.piece_length
        out += [bytes((k | 2,)) + index, bytes((k | (size << 2),)) + index]
        out.append(bytes((k | 2,)) + layout.encode_index(entries[:1]))
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
