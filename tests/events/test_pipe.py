"""The role server's pipelined HTTP/1.1 connection (``server._Pipe``) against a real aiohttp
server: requests written back to back are handled and answered in the order they were
written; a connection that breaks fails the calls in flight with ``ConnectionError`` and the
next call opens a new one."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiohttp import web

from loglake.events.server import _Pipe


async def _serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/api/{method}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_pipelined_requests_are_handled_and_answered_in_order():
    async def main():
        seen: list[int] = []
        rnd = random.Random(7)

        async def handler(request: web.Request) -> web.Response:
            body = await request.read()
            await asyncio.sleep(rnd.random() / 200)  # handlers that take uneven time
            seen.append(int(body))
            return web.Response(body=body + b"!", content_type="application/candid")

        runner, url = await _serve(handler)
        pipe = _Pipe(url)
        try:
            futs = [await pipe.send("m", str(i).encode(), {"x-k": "v"}) for i in range(50)]
            replies = await asyncio.gather(*futs)
        finally:
            pipe.close()
            await runner.cleanup()
        assert seen == list(range(50))
        assert replies == [(200, f"{i}!".encode()) for i in range(50)]

    asyncio.run(main())


def test_a_broken_connection_fails_the_calls_in_flight_then_reconnects():
    async def main():
        calls = 0

        async def handler(request: web.Request) -> web.Response:
            nonlocal calls
            calls += 1
            if calls == 1:
                assert request.transport is not None
                request.transport.close()  # the connection dies before any reply
                await asyncio.sleep(0.05)
            return web.Response(body=b"ok", status=200)

        runner, url = await _serve(handler)
        pipe = _Pipe(url)
        try:
            futs = [await pipe.send("m", b"x", {}) for _ in range(3)]
            for f in futs:
                with pytest.raises(ConnectionError):
                    await f
            assert await (await pipe.send("m", b"y", {})) == (200, b"ok")
        finally:
            pipe.close()
            await runner.cleanup()

    asyncio.run(main())


def test_only_http_urls():
    with pytest.raises(ConnectionError):
        _Pipe("ftp://127.0.0.1:1")
