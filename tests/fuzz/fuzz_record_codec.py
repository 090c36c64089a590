"""Fuzz the log's record codec (``loglake.log.record_codec``): ``decode_frame``, ``scan``,
``frame_offsets`` and ``plain_columns`` (the sealer's numpy fast path).

A random frame almost never passes its CRC32C, so half the inputs are turned into frames with a
correct CRC (the input is the body, or several bodies) so that mutations reach the body parser.

Typed error: ``RecordDecodeError`` (``TornRecord``/``CorruptRecord``). Beyond "no crash": a
record that decodes encodes back to the same frame bytes (``encode_batch``), and
``plain_columns`` agrees with a frame-by-frame ``scan`` — when it returns columns, ``scan``
read the same records without error; when ``scan`` reads only plain records numbered from the
first index to the end, ``plain_columns`` returns them.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from crc32c import crc32c

from loglake.log.api import Entry
from loglake.log.record_codec import (
    FRAME_HEAD,
    RecordDecodeError,
    decode_frame,
    encode_batch,
    plain_columns,
    scan,
)
from tests.fuzz import _harness

EXPECTED = (RecordDecodeError,)
INSTRUMENT = ("loglake.log.record_codec",)
SEP = b"\xfe\xfd"
"""Splits the input into bodies in the framed mode."""


def frame(body: bytes) -> bytes:
    return FRAME_HEAD.pack(len(body), crc32c(body)) + body


def one(data: bytes) -> None:
    if not data:
        return
    buf = b"".join(frame(b) for b in data[1:].split(SEP)) if data[0] & 1 else data[1:]
    records, end, err = scan(buf)
    for r in records:
        entry = Entry(r.data, r.key, r.headers, r.timestamp_ns)
        again = encode_batch([entry], r.index, 0)[0]
        assert again == buf[r.offset : r.offset + r.size], (
            again,
            buf[r.offset : r.offset + r.size],
        )
    # a segment's first index is its file name's number, far below 2**63; from 2**63 on the
    # u64 index field no longer fits the int64 columns plain_columns returns (documented in
    # docs/reliability.md; no real segment gets there)
    first = records[0].index if records and records[0].index < 2**62 else 0
    try:
        cols = plain_columns(buf, first)
    except RecordDecodeError:
        cols = None
        clean = err is None and all(
            r.key is None and not r.headers and r.index == first + i for i, r in enumerate(records)
        )
        assert not clean, "plain_columns refused what scan read"
    if cols is not None:
        assert err is None and end == len(buf)
        assert cols.index.tolist() == [r.index for r in records]
        assert cols.timestamp_ns.tolist() == [r.timestamp_ns for r in records]
        got = [
            buf[s:e] for s, e in zip(cols.data_start.tolist(), cols.data_end.tolist(), strict=True)
        ]
        assert got == [r.data for r in records]
    if buf:
        decode_frame(buf)


def seeds() -> list[bytes]:
    plain = [Entry(b"hello"), Entry(b""), Entry(b"x" * 100)]
    mixed = [Entry(b"d", b"key"), Entry(b"e", None, (("h", b"v"), ("\u00e9", b""))), Entry(b"f")]
    out = []
    for entries, first in ((plain, 0), (plain, 2**40), (mixed, 7)):
        buf, offsets, _ = encode_batch(entries, first, 1_700_000_000_000_000_000)
        out.append(b"\x00" + buf)
        out.append(b"\x00" + buf[:-3])  # a torn tail
        bodies = [
            buf[o + FRAME_HEAD.size : e]
            for o, e in zip(offsets, [*offsets[1:], len(buf)], strict=True)
        ]
        out.append(b"\x01" + SEP.join(bodies))
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
