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


def test_the_sender_keeps_order_across_roles_and_lets_reports_through():
    """Calls to one role and method are pipelined; a call to another role waits until those
    are answered; a call marked unordered (a progress report) leaves at once; replies reach
    the core in call order."""
    from loglake.events.actions import Call
    from loglake.events.identity import Identity
    from loglake.events.role import Role
    from loglake.events.server import HttpRoleServer

    async def main():
        arrived: list[str] = []
        release = asyncio.Event()

        async def slow(request: web.Request) -> web.Response:  # role A: answers when released
            arrived.append("A" + (await request.read())[-1:].decode())
            await release.wait()
            return web.Response(status=500, text="no")

        async def fast(request: web.Request) -> web.Response:  # role B
            arrived.append("B" + (await request.read())[-1:].decode())
            return web.Response(status=500, text="no")

        ra, url_a = await _serve(slow)
        rb, url_b = await _serve(fast)
        me, a, b = Identity.generate(), Identity.generate(), Identity.generate()
        replies: list[str] = []

        class Core(Role):
            def on_reply(self, call, reply, now):
                replies.append(call.token)

        core = Core(me.principal)
        server = HttpRoleServer(
            core, me, {a.principal.bytes: url_a, b.principal.bytes: url_b}, pipeline=4
        )
        m = "icrc72_confirm_notifications"  # any method: the bodies end with the call's digit
        await server._start(server.app)
        try:
            core.outbox += [
                Call(a.principal, m, [1], token="a1"),
                Call(a.principal, m, [2], token="a2"),
                Call(b.principal, m, [3], token="b3", ordered=False),
                Call(b.principal, m, [4], token="b4"),
            ]
            server.drain()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if len(arrived) >= 2:
                    break
            await asyncio.sleep(0.1)  # a quiet period: b4 must not leave while a1, a2 wait
            # a2 is written behind a1 on A's connection; A handles it once a1 is answered
            assert arrived == ["A\x01", "B\x03"]
            release.set()
            for _ in range(200):
                await asyncio.sleep(0.01)
                if len(replies) == 4:
                    break
            assert arrived == ["A\x01", "B\x03", "A\x02", "B\x04"]
            assert replies == ["a1", "a2", "b3", "b4"]
        finally:
            await server._stop(server.app)
            await ra.cleanup()
            await rb.cleanup()

    asyncio.run(main())
