"""``loglake events publish`` against a real publisher on loopback.

The command made every event before its first call, so ``--size 1000000000000`` ended in a
MemoryError traceback, and it cut calls by count alone: 12 events of 1 MB were one call of
12 MB, which the publisher refused (413, over its 8 MiB body limit). Now the events are made a
call at a time and a call stops at ``--batch`` events or at the publisher's 1 MB budget for a
call's events, whichever comes first; each #Blob is ``--size`` bytes (it was rounded up to the
next multiple of 8, plus 8).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from loglake.events.cli import command
from loglake.events.identity import Identity
from loglake.events.publisher import MAX_MESSAGE_BYTES, Publisher, event_of
from loglake.events.server import HttpRoleServer
from loglake.events.store import StreamsStore
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.events.served import serve

NS = "com.example.cli"


class Served:
    """A publisher's server on loopback, its stream in memory, and its key in a file."""

    def __init__(self, key: Path) -> None:
        self.me = Identity.generate()
        self.store = StreamsStore(LocalStreams(MemoryLog()))
        core = Publisher(self.me.principal, Identity.generate().principal)  # no orchestrator
        # a clock that moves on at every reading: each call's events get a time of their own
        clock = itertools.count(time.time_ns()).__next__
        port, self.stop = serve(HttpRoleServer(core, self.me, {}, self.store, clock=clock))
        key.write_text(self.me.seed.hex())
        self.args = ["--url", f"http://127.0.0.1:{port}", "--key-file", str(key)]

    def events(self) -> list[tuple[int, bytes | str]]:
        """(call's time, #Blob bytes or #Text) of every stored event, in id order."""
        out = []
        for i, data in self.store.payloads(NS):
            e = event_of(i, data, NS, self.me.principal, raw=False)
            [value] = e.data.values()
            out.append((e.timestamp, value))
        return out


@pytest.fixture
def publisher(tmp_path: Path) -> Iterator[Served]:
    served = Served(tmp_path / "pub.key")
    try:
        yield served
    finally:
        served.stop()


def _calls(events: list[tuple[int, bytes | str]]) -> list[int]:
    """Events per call, in order (a call's events share its time)."""
    return list(Counter(ts for ts, _ in events).values())


def test_a_call_stops_at_the_batch_and_each_blob_is_its_size(publisher: Served) -> None:
    r = CliRunner().invoke(
        command, ["publish", *publisher.args, NS, "--count", "25", "--size", "200", "--batch", "10"]
    )
    assert r.exit_code == 0, r.output
    assert "published 25 events: ids 0..24" in r.output
    events = publisher.events()
    assert _calls(events) == [10, 10, 5]
    assert {len(b) for _, b in events} == {200}
    assert events[3][1] == (3).to_bytes(8, "big") * 25  # the event's number, repeated


def test_a_call_stops_at_the_publishers_budget_whatever_the_batch(publisher: Served) -> None:
    # 12 MB in one call was refused whole: 413, over the publisher's 8 MiB body limit
    args = ["publish", *publisher.args, NS, "--text", "first", "--count", "12"]
    r = CliRunner().invoke(command, [*args, "--size", str(MAX_MESSAGE_BYTES)])
    assert r.exit_code == 0, r.output
    assert "published 13 events: ids 0..12" in r.output
    events = publisher.events()
    assert _calls(events) == [1] * 13  # a megabyte of data is a call's budget
    assert events[0][1] == "first"
    assert [len(b) for _, b in events[1:]] == [MAX_MESSAGE_BYTES] * 12
