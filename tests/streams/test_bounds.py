"""``Streams.bounds`` says what a reader can pull, the same in process and over TCP (one
stream-info round trip), so no part searches for a stream's end with pulls."""

from __future__ import annotations

import asyncio

import pytest

from loglake.log import open_log
from loglake.log.api import UnknownPartition, UnknownStream
from loglake.streams import LocalStreams, RetryingStreams
from loglake.streams.client import AsyncStreamClient, StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService


def test_bounds_in_process_and_over_tcp_agree(tmp_path) -> None:
    log = open_log(tmp_path / "data")
    local = LocalStreams(log)
    try:
        local.create_stream("s", 3)
        local.push_many("s", [b"%d" % i for i in range(10)], 1)
        local.push_many("s", [b"x"] * 4, 2)
        want = {0: (0, 0), 1: (0, 10), 2: (0, 4)}
        assert {p: local.bounds("s", p) for p in range(3)} == want
        with (
            BackgroundServer(StreamService(log)) as srv,
            StreamClient(port=srv.port) as remote,
            RetryingStreams(lambda: StreamClient(port=srv.port)) as retrying,
        ):
            assert {p: remote.bounds("s", p) for p in range(3)} == want
            assert {p: retrying.bounds("s", p) for p in range(3)} == want
            for p, (first, nxt) in want.items():
                got = remote.pull("s", 0, 100, p)
                assert [m.index for m in got] == list(range(first, nxt))

            async def in_async() -> tuple[int, int]:
                a = await AsyncStreamClient.connect(port=srv.port)
                try:
                    return await a.bounds("s", 1)
                finally:
                    await a.close()

            assert asyncio.run(in_async()) == (0, 10)
            for s in (local, remote):
                with pytest.raises(UnknownStream):
                    s.bounds("nope")
                with pytest.raises(UnknownPartition):
                    s.bounds("s", 3)
    finally:
        log.close()
