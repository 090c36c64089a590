"""Fuzz the archive protobufs of both layouts: a community-stream record
(``Layout.decode_record``: the spec's 14/WAKU2-MESSAGE or status-go's ``WakuMessage``) and an
archive region of ``data`` (``Layout.decode_archive``: ``WakuMessageArchive`` with its padding).

Typed error: ``ArchiveError`` subclasses (``BadRecord``, ``CorruptArchive``,
``MisalignedArchive``). Beyond "no crash": every message an archive yields decodes as a record of
its layout or is refused with ``BadRecord`` — never an untyped error downstream.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import contextlib

from loglake.archives.errors import ArchiveError
from tests.fuzz import _harness
from tests.fuzz._archives import LAYOUTS, archives, records

EXPECTED = (ArchiveError,)
INSTRUMENT = ("loglake.archives.layout",)
ENTRIES = [archives(layout)[0][1] for layout in LAYOUTS]


def one(data: bytes) -> None:
    if len(data) < 2:
        return
    k = data[0] & 1
    layout = LAYOUTS[k]
    if data[0] & 2:
        layout.decode_record(data[2:])
        return
    # the index entry of the region: its padding (status-go) comes from the second byte
    entry = dataclasses.replace(ENTRIES[k], padding=data[1])
    for raw in layout.decode_archive(data[2:], entry):
        with contextlib.suppress(ArchiveError):
            layout.decode_record(raw)


def seeds() -> list[bytes]:
    out = []
    for k, layout in enumerate(LAYOUTS):
        out += [bytes((k | 2, 0)) + r for r in records(layout)]
        for region, entry in archives(layout):
            out.append(bytes((k, entry.padding)) + region)
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
