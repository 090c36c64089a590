"""Shared builders for the archives tests."""

from __future__ import annotations

import os

from loglake.archives.layout import NS, Layout
from loglake.log.api import Entry, Log

START = 1577836800 * NS  # 2020-01-01, as in status-go's archive tests
DAY = 86400 * NS
WEEK = 7 * DAY
SG_TOPIC = bytes.fromhex("d7a5d2c3")
SPEC_TOPIC = "/status/1/community-chat/proto"


def topic_for(layout: Layout):
    return SG_TOPIC if layout.name == "status-go" else SPEC_TOPIC


def record(layout: Layout, at_ns: int, payload: bytes = b"hello") -> bytes:
    extra = {"sig": b"\x01" * 65} if layout.name == "status-go" else {}
    return layout.make_record(payload=payload, topic=topic_for(layout), timestamp_ns=at_ns, **extra)


def fill_weeks(
    log: Log, stream: str, layout: Layout, weeks: range, per_week: int, size: int = 300
) -> None:
    log.create_stream(stream)
    for w in weeks:
        log.append_many(
            stream,
            0,
            [
                Entry(record(layout, START + w * WEEK + i * (WEEK // per_week), os.urandom(size)))
                for i in range(per_week)
            ],
        )
