"""Fuzz the log's small durable-state decoders: consumer indexes
(``log.consumer_store.decode_entries``, the Ockam index service's file), the durable watermark
(``log.watermark.parse``) and the sparse index (``log.sparse_index.SparseIndex.parse``).

As in the record codec's harness, half the consumer-store inputs get correct CRC32C frames (the
input is split into bodies) so mutations reach the body parser.

Typed error: ``CorruptStore`` (the watermark); the other two never raise — they stop at the
first bad entry (a torn save) or refuse an untrustworthy index (None). Beyond "no crash": the
consumer entries read re-encode to the bytes they were read from, and a sparse index that
parses has increasing indexes and positions inside the segment.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from crc32c import crc32c

from loglake.log import consumer_store, watermark
from loglake.log.api import CorruptStore
from loglake.log.sparse_index import ENTRY, SparseIndex
from tests.fuzz import _harness

EXPECTED = (CorruptStore,)
INSTRUMENT = ("loglake.log.consumer_store", "loglake.log.watermark", "loglake.log.sparse_index")
SEP = b"\xfe\xfd"


def one(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 4, data[1:]
    if mode == 0:
        watermark.parse(body)
    elif mode == 1:
        idx = SparseIndex.parse(body, 1000, 1 << 20)
        if idx is not None:
            assert idx.indexes == sorted(set(idx.indexes)) and all(i >= 1000 for i in idx.indexes)
            assert idx.positions == sorted(set(idx.positions)) and idx.positions[-1:] < [1 << 20]
    else:
        if mode == 3:  # frames with a good CRC around each body
            body = b"".join(
                consumer_store._HEAD.pack(len(b), crc32c(b)) + b for b in body.split(SEP)
            )
        entries, end = consumer_store.decode_entries(body)
        assert 0 <= end <= len(body)
        again, _ = consumer_store.decode_entries(body[:end])
        assert again == entries


def seeds() -> list[bytes]:
    mark = watermark.Mark(3, 1000, 4096, 1200)
    slot = watermark.encode_slot(mark)
    entries = [
        consumer_store.encode_entry(c, s, p, i)
        for c, s, p, i in (
            ("client", "stream", 0, 5),
            ("client", "stream", 0, 9),
            ("é", "s2", 3, 2**40),
        )
    ]
    return [
        b"\x00" + slot + bytes(512 - len(slot)) + slot,
        b"\x00" + bytes(1024),
        b"\x01" + ENTRY.pack(1000, 0) + ENTRY.pack(1100, 4096) + ENTRY.pack(1200, 8192),
        b"\x02" + b"".join(entries),
        b"\x03" + SEP.join(e[consumer_store._HEAD.size :] for e in entries),
    ]


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
