"""A role's ``HttpRoleServer`` served on loopback from a thread of its own, for tests that call
it over real HTTP from the test's thread (the hostile-input and signed-call tests)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from aiohttp import web

from loglake.events.server import HttpRoleServer
from tests.procs import free_port


def serve(server: HttpRoleServer) -> tuple[int, Callable[[], None]]:
    """``server`` listening on 127.0.0.1: its port, and the call that stops it."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(server.app)
    loop.run_until_complete(runner.setup())
    port = free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    return port, stop
