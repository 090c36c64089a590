"""The collector settings of a server that is the process (``StreamServer(freeze_gc=)``,
issue 16): the young generation's threshold is raised while it runs and put back by
``stop()``; a server on a background thread leaves the collector alone."""

from __future__ import annotations

import asyncio
import gc

from loglake.log import MemoryLog
from loglake.streams.client import StreamClient
from loglake.streams.server import GC_YOUNG_THRESHOLD, BackgroundServer, StreamServer
from loglake.streams.service import StreamService


def service() -> StreamService:
    log = MemoryLog()
    log.create_stream("s")
    return StreamService(log)


def test_a_main_thread_server_raises_the_young_threshold_until_it_stops() -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []

    async def main_thread_server() -> None:  # as ``loglake serve`` runs it
        server = await StreamServer(service()).start()
        try:
            seen.append(gc.get_threshold())
            loop = asyncio.get_running_loop()

            def pushes() -> list[int]:
                with StreamClient(port=server.port, timeout=10) as client:
                    return client.push_many("s", [b"a", b"b", b"c"])

            assert await loop.run_in_executor(None, pushes) == [0, 1, 2]
        finally:
            await server.stop()

    try:
        asyncio.run(main_thread_server())
        assert seen[0][0] == max(before[0], GC_YOUNG_THRESHOLD)
        assert seen[0][1:] == before[1:]
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def test_a_background_server_leaves_the_thresholds_alone() -> None:
    before = gc.get_threshold()
    with BackgroundServer(service()) as srv:
        assert gc.get_threshold() == before
        with StreamClient(port=srv.port, timeout=10) as client:
            assert client.push_many("s", [b"x"]) == [0]
    assert gc.get_threshold() == before
