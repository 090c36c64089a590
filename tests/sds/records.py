"""SDS message records built byte by byte for the columnar decoder's tests: fields in any
order, lengths as the tests choose them, so a record can be what no encoder writes."""

from __future__ import annotations

from loglake.sds.bloom import BloomFilter
from loglake.sds.codec import (
    TAG_CHANNEL_ID,
    TAG_CONTENT,
    TAG_LAMPORT,
    TAG_MESSAGE_ID,
    TAG_SENDER_ID,
    encode_history_entry,
)
from loglake.sds.messages import HistoryEntry
from loglake.wire.varint import encode_uleb

CHANNEL = "room"
BLOOM = BloomFilter().n_bytes


def ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + encode_uleb(len(payload)) + payload


def sliding_window(n: int, senders: int, keep: int, hint: bool = False) -> list[bytes | None]:
    """``n`` messages from ``senders`` taking turns, each carrying the last ``keep`` message
    ids as its causal history (the benchmark's channel); ``hint``: each entry's retrieval hint
    is its own (``h<k>``), else all are ``h``."""
    datas: list[bytes | None] = []
    window: list[bytes] = []
    for k in range(n):
        head = ld(TAG_SENDER_ID, b"p%d" % (k % senders)) + ld(TAG_MESSAGE_ID, b"id%d" % k)
        head += ld(TAG_CHANNEL_ID, CHANNEL.encode()) + TAG_LAMPORT + encode_uleb(k + 1)
        datas.append(head + b"".join(window) + ld(TAG_CONTENT, b"c%d" % k))
        entry = HistoryEntry(f"id{k}", b"h%d" % k if hint else b"h", "p")
        window = [*window, encode_history_entry(entry)][-keep:]
    return datas
