"""A role's ``HttpRoleServer`` served on loopback from a thread of its own, for tests that call
it over real HTTP from the test's thread (the hostile-input and signed-call tests)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from aiohttp import web

from loglake.events.broadcaster import Broadcaster
from loglake.events.identity import Identity
from loglake.events.orchestrator import Orchestrator, Quotas
from loglake.events.publisher import Publisher
from loglake.events.role import Role
from loglake.events.server import HttpRoleServer, RoleRunner
from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.procs import free_port
from tests.waiting import wait_until


def serve(server: HttpRoleServer) -> tuple[int, Callable[[], None]]:
    """``server`` listening on 127.0.0.1: its port, and the call that stops it."""
    loop = asyncio.new_event_loop()
    runner = RoleRunner(server.app)  # the bounds the node and ``events serve`` run with
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


def serve_orchestrator(
    quotas: Quotas | None = None, publishers: tuple[Identity, ...] = ()
) -> tuple[Orchestrator, str, Callable[[], None]]:
    """An orchestrator with its journal and ledger in memory on loopback, its broadcaster and a
    publisher role for each of ``publishers`` beside it, so that every system message it sends
    lands (the hostile-caller tests): its core, its URL and the call that stops them all."""
    me, bc = Identity.generate(), Identity.generate()
    store = StreamsStore(LocalStreams(MemoryLog()))
    core = open_orchestrator(store, me.principal, [bc.principal], quotas, open_ledger(store, fee=1))
    directory: dict[bytes, str] = {}  # filled as each role starts listening
    roles: list[tuple[Role, Identity, StreamsStore | None]] = [
        (core, me, store),
        (Broadcaster(bc.principal, me.principal), bc, None),
    ]
    for p in publishers:
        roles.append(
            (Publisher(p.principal, me.principal), p, StreamsStore(LocalStreams(MemoryLog())))
        )
    servers = [HttpRoleServer(role, ident, directory, st) for role, ident, st in roles]
    stops = []
    for server, (_, ident, _) in zip(servers, roles, strict=True):
        port, stop = serve(server)
        directory[ident.principal.bytes] = f"http://127.0.0.1:{port}"
        stops.append(stop)

    def stop_all() -> None:
        # stopped once the roles' calls are sent and answered (a server stopped while its
        # sender has calls in flight may not finish its cleanup)
        try:
            wait_until(
                lambda: all(
                    not s.batches and s.queue.empty() and not s.inflight_n and not s.lanes
                    for s in servers
                ),
                30,
                what="every role's calls answered",
            )
        finally:
            for stop in stops:
                stop()

    return core, directory[me.principal.bytes], stop_all
