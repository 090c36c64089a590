"""SDS message records built byte by byte for the columnar decoder's tests: fields in any
order, lengths as the tests choose them, so a record can be what no encoder writes."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from loglake.sds.bloom import BloomFilter
from loglake.sds.codec import (
    TAG_CHANNEL_ID,
    TAG_CONTENT,
    TAG_LAMPORT,
    TAG_MESSAGE_ID,
    TAG_SENDER_ID,
    encode_history_entry,
)
from loglake.sds.columnar import HISTORY_RUN_COLUMNS, history_lists
from loglake.sds.messages import HistoryEntry, message_id_of
from loglake.wire.varint import encode_uleb

CHANNEL = "room"
BLOOM = BloomFilter().n_bytes


def ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + encode_uleb(len(payload)) + payload


def window_id(k: int) -> str:
    """The id of ``sliding_window``'s message ``k``: its content's hash, as a sender's."""
    return message_id_of(b"c%d" % k)


def sliding_window(n: int, senders: int, keep: int, hint: bool = False) -> list[bytes | None]:
    """``n`` messages from ``senders`` taking turns, each carrying the last ``keep`` message
    ids as its causal history (the benchmark's channel); ``hint``: each entry's retrieval hint
    is its own (``h<k>``), else all are ``h``."""
    datas: list[bytes | None] = []
    window: list[bytes] = []
    for k in range(n):
        head = ld(TAG_SENDER_ID, b"p%d" % (k % senders)) + ld(TAG_MESSAGE_ID, window_id(k).encode())
        head += ld(TAG_CHANNEL_ID, CHANNEL.encode()) + TAG_LAMPORT + encode_uleb(k + 1)
        datas.append(head + b"".join(window) + ld(TAG_CONTENT, b"c%d" % k))
        entry = HistoryEntry(window_id(k), b"h%d" % k if hint else b"h", "p")
        window = [*window, encode_history_entry(entry)][-keep:]
    return datas


STORED_HISTORY = ("history_stored", *HISTORY_RUN_COLUMNS)
"""How ``DECODED_SCHEMA`` stores a causal history: the ids a run does not cover, and the run."""


def readable(batches: Iterable[pa.RecordBatch]) -> list[dict]:
    """Decoded rows as dicts, each history as its list of ids (``causal_history``, from
    ``history_lists`` of its own batch) in place of how it is stored: what two decodes that
    cut the records into other batches (so store other runs) must agree on."""
    rows: list[dict] = []
    for b in batches:
        hist = history_lists(b).to_pylist()
        for r, h in zip(b.to_pylist(), hist, strict=True):
            for c in STORED_HISTORY:
                del r[c]
            rows.append({**r, "causal_history": h})
    return rows
