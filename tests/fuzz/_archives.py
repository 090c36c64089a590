"""Layouts and encoded samples shared by the archive harnesses.

The fuzzed layouts are the real ``SpecLayout`` and ``StatusGoLayout`` with a 64-byte piece
length instead of 100 KiB: every decoder path is the same code, but an archive region small
enough for libFuzzer's inputs can be piece-aligned, so mutations reach the protobuf decoding
rather than stopping at the alignment check.
"""

from __future__ import annotations

from loglake.archives.layout import Layout, SpecLayout, StatusGoLayout
from loglake.archives.messages import NS, ArchiveMetadata


class SmallSpec(SpecLayout):
    piece_length = 64


class SmallStatusGo(StatusGoLayout):
    piece_length = 64


LAYOUTS: tuple[Layout, ...] = (SmallSpec(), SmallStatusGo())
TOPICS = {"spec": "/status/1/community-chat/proto", "status-go": bytes.fromhex("d7a5d2c3")}


def records(layout: Layout, n: int = 3) -> list[bytes]:
    extra = {"sig": b"\x01" * 65} if layout.name == "status-go" else {}
    return [
        layout.make_record(
            payload=bytes([i]) * (5 + i),
            topic=TOPICS[layout.name],
            timestamp_ns=(i + 1) * NS,
            **extra,
        )
        for i in range(n)
    ]


def archives(layout: Layout) -> list[tuple[bytes, object]]:
    """``(region bytes, IndexEntry)`` of two consecutive archives."""
    out = []
    offset = 0
    for week in range(2):
        meta = ArchiveMetadata(
            week * 7 * 86400 * NS, (week + 1) * 7 * 86400 * NS, (TOPICS[layout.name],)
        )
        a = layout.encode_archive(meta, records(layout, 2 + week), offset)
        region = a.data_bytes()
        out.append((region, a.entry))
        offset += len(region)
    return out
