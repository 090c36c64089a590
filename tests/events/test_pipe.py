"""The role server's pipelined HTTP/1.1 connection (``server._Pipe``) against a real aiohttp
server: requests written back to back are handled and answered in the order they were
written; a connection that breaks fails the calls in flight with ``ConnectionError`` and the
next call opens a new one. Against a raw socket server: a reply whose ``Content-Length`` is not
a byte count, or is over the limit, fails the calls in flight before its body is read."""

from __future__ import annotations

import asyncio
import random
import socket
import time

import pytest
from aiohttp import web

from loglake.events.server import MAX_PIPE_REPLY_BYTES, _Pipe
from tests.events.test_cli_bad_replies import raw_server, read_request
from tests.peers import peer_server


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


def _until_closed(s: socket.socket) -> None:
    """Read (the calls pipelined behind the first) until the client closes: closing with
    unread bytes would send a reset, which the client could see before the answer."""
    while s.recv(65536):
        pass


async def _two_calls_fail(url: str) -> list[str]:
    """Two calls pipelined on one connection: each one's ``ConnectionError`` (10 s at most)."""
    pipe = _Pipe(url)
    try:
        futs = [await pipe.send("m", b"x", {}) for _ in range(2)]
        out = []
        for f in futs:
            with pytest.raises(ConnectionError) as e:
                await asyncio.wait_for(f, 10)
            out.append(str(e.value))
        return out
    finally:
        pipe.close()


BAD_LENGTHS = {
    "negative": (b"Content-Length: -1", "reply with Content-Length '-1': not a byte count"),
    "a word": (b"Content-Length: many", "reply with Content-Length 'many': not a byte count"),
    "signed": (b"Content-Length: +5", "reply with Content-Length '+5': not a byte count"),
    "underscored": (b"Content-Length: 1_0", "reply with Content-Length '1_0': not a byte count"),
    "sent twice": (
        b"Content-Length: 5\r\nContent-Length: 6",
        "reply with Content-Length '5, 6': not a byte count",
    ),
    "over the limit": (
        f"Content-Length: {MAX_PIPE_REPLY_BYTES + 1}".encode(),
        f"reply of {MAX_PIPE_REPLY_BYTES + 1} bytes (its Content-Length), over the limit of "
        f"{MAX_PIPE_REPLY_BYTES}",
    ),
}


@pytest.mark.parametrize("case", list(BAD_LENGTHS))
def test_a_reply_with_a_bad_content_length_fails_every_call_in_flight(case):
    field, why = BAD_LENGTHS[case]

    def answer(s: socket.socket) -> None:
        s.sendall(b"HTTP/1.1 200 OK\r\n" + field + b"\r\n\r\n")  # and no body
        _until_closed(s)

    with raw_server(answer) as url:
        assert asyncio.run(_two_calls_fail(url)) == [why, why]


def test_a_reply_head_that_never_ends_fails_every_call_in_flight():
    """A peer sending header bytes without the blank line that ends them: the reader's 64 KiB
    limit stopped it with ``LimitOverrunError``, which no except clause took (the calls failed
    as "connection closed" and the task's error was logged as never retrieved)."""

    def answer(s: socket.socket) -> None:
        s.sendall(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (128 * 1024))
        _until_closed(s)

    with raw_server(answer) as url:
        assert asyncio.run(_two_calls_fail(url)) == ["reply head over 64 KiB without its end"] * 2


def test_a_reply_declaring_gigabytes_is_refused_before_its_body_is_read():
    """A peer declaring 2 GB and streaming: the role buffered until memory ran out. Now the
    call fails at the head, the connection is closed, and the peer can send only what the
    sockets' buffers take — not the 64 MiB it would."""
    sent = [0]

    def answer(s: socket.socket) -> None:
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000000\r\n\r\n")
        chunk = b"\0" * 65536
        while sent[0] < 64 * 1024 * 1024:  # bounded: the test ends even if the client reads on
            s.sendall(chunk)  # an OSError once the client closed ends it
            sent[0] += len(chunk)

    with raw_server(answer) as url:
        errors = asyncio.run(_two_calls_fail(url))
    assert (
        errors
        == [
            f"reply of 2000000000 bytes (its Content-Length), over the limit of "
            f"{MAX_PIPE_REPLY_BYTES}"
        ]
        * 2
    )
    assert sent[0] < 16 * 1024 * 1024, f"the peer sent {sent[0]} bytes before the close"


def test_only_http_urls():
    with pytest.raises(ConnectionError):
        _Pipe("ftp://127.0.0.1:1")


def test_the_sender_keeps_order_across_roles_and_lets_unordered_calls_through():
    """Calls to one role and method are pipelined; a call to another role waits until those
    are answered. A call marked unordered (a notification to a subscriber, a progress
    report) leaves at once and its reply reaches the core as soon as it comes: it neither
    waits for nor holds up the ordered calls, and it stays in its place among the unordered
    calls to its own target (a5 goes out behind a1 and a2, which the sender wrote first).
    Before, its reply reached the core in call order, so a target that answered slowly held
    every later call of the role."""
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
                Call(a.principal, m, [5], token="a5", ordered=False),
                Call(b.principal, m, [6], token="b6", ordered=False),
                Call(b.principal, m, [4], token="b4"),
            ]
            server.drain()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if len(replies) >= 2:
                    break
            await asyncio.sleep(0.1)  # a quiet period: b4 must not leave while a1, a2 wait
            # a2 and a5 are written behind a1 on A's connection; A handles them once a1 is
            # answered. b3 and b6 are answered while A holds a1
            assert arrived == ["A\x01", "B\x03", "B\x06"]
            assert replies == ["b3", "b6"]
            release.set()
            for _ in range(200):
                await asyncio.sleep(0.01)
                if len(replies) == 6:
                    break
            # A's calls in the order written; b4 once a1 and a2 are answered
            assert arrived[3] == "A\x02" and sorted(arrived[4:]) == ["A\x05", "B\x04"]
            assert sorted(arrived) == ["A\x01", "A\x02", "A\x05", "B\x03", "B\x04", "B\x06"]
            assert replies[:4] == ["b3", "b6", "a1", "a2"]  # the ordered ones in call order
            assert sorted(replies[4:]) == ["a5", "b4"]
        finally:
            await server._stop(server.app)
            await ra.cleanup()
            await rb.cleanup()

    asyncio.run(main())


def test_a_target_that_never_reads_times_its_calls_out_and_holds_up_no_other(monkeypatch):
    """Calls of a few MB to a role that accepted the connection and never reads: the sender
    waited in ``drain`` for good once the sockets' buffers were full, so every later call of
    the role, to any target, waited too (closing the connection did not end the wait). Now
    the calls to it fail as timed out after ``SEND_TIMEOUT_S`` (the core treats the target as
    hung) and the next call, to another role, leaves."""
    from loglake.events import server as srv_mod
    from loglake.events.actions import Call
    from loglake.events.identity import Identity
    from loglake.events.role import Role
    from loglake.events.server import HttpRoleServer

    monkeypatch.setattr(srv_mod, "SEND_TIMEOUT_S", 0.5)
    # a call whose bytes fit in the buffers waits for its reply: CALL_TIMEOUT_S (120 s), as
    # before; the change is that the role's sender is no longer stuck behind it for good
    monkeypatch.setattr(srv_mod, "CALL_TIMEOUT_S", 1.0)

    async def main(hung_url: str) -> tuple[list[str], dict[str, str], float]:
        arrived: list[str] = []

        async def fast(request: web.Request) -> web.Response:
            arrived.append((await request.read())[-1:].decode())
            return web.Response(status=500, text="no")

        rb, url_b = await _serve(fast)
        me, a, b = Identity.generate(), Identity.generate(), Identity.generate()
        replies: dict[str, str] = {}

        class Core(Role):
            def on_reply(self, call, reply, now):
                replies[call.token] = type(reply).__name__

        core = Core(me.principal)
        server = HttpRoleServer(
            core, me, {a.principal.bytes: hung_url, b.principal.bytes: url_b}, pipeline=4
        )
        m = "icrc72_confirm_notifications"
        big = list(range(1_000_000, 2_000_000))  # ~3 MB of Candid nats a call
        await server._start(server.app)
        t0 = asyncio.get_running_loop().time()
        try:
            core.outbox += [Call(a.principal, m, big, token=f"a{i}") for i in range(3)]
            core.outbox.append(Call(b.principal, m, [4], token="b4"))
            server.drain()
            for _ in range(1500):  # 15 s at most: before the change, b4 never left
                await asyncio.sleep(0.01)
                if len(replies) == 4:
                    break
            return arrived, replies, asyncio.get_running_loop().time() - t0
        finally:
            await server._stop(server.app)
            await rb.cleanup()

    with peer_server() as hung_url:
        arrived, replies, took = asyncio.run(main(hung_url))
    assert arrived == ["\x04"], (arrived, replies)
    assert replies == {"a0": "TimeoutError", "a1": "TimeoutError", "a2": "TimeoutError",
                       "b4": "CallRefused"}  # fmt: skip
    assert took < 10, took


def test_a_target_whose_connection_never_opens_fails_as_unreachable_in_bounded_time(
    monkeypatch,
):
    """A target whose SYNs are dropped (here: its accept queue is full): opening the
    connection waited for the system's SYN retries (about 2 minutes), the role's sender with
    it. Now the call fails with ``ConnectionError`` after ``CONNECT_TIMEOUT_S``."""
    from loglake.events import server as srv_mod

    monkeypatch.setattr(srv_mod, "CONNECT_TIMEOUT_S", 0.5)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    queued = [socket.create_connection(srv.getsockname(), timeout=5)]  # fills the queue

    async def main() -> list[tuple[str, float]]:
        pipe = _Pipe(f"http://127.0.0.1:{srv.getsockname()[1]}")
        out = []
        try:
            for _ in range(2):  # the second at once: no second wait of CONNECT_TIMEOUT_S
                t0 = asyncio.get_running_loop().time()
                with pytest.raises(ConnectionError) as e:
                    await asyncio.wait_for(pipe.send("m", b"x", {}), 10)
                out.append((str(e.value), asyncio.get_running_loop().time() - t0))
            return out
        finally:
            pipe.close()

    try:
        (first, t1), (second, t2) = asyncio.run(main())
        where = f"127.0.0.1:{srv.getsockname()[1]}"
        assert first == f"no connection to {where} within 0.5 s" and 0.4 < t1 < 5
        assert second == f"no connection to {where} within 0.5 s (tried again from 30 s after)"
        assert t2 < 0.1
    finally:
        for s in queued:
            s.close()
        srv.close()


def test_a_connection_the_reply_ends_is_dropped_at_once_though_the_target_stops_reading(
    monkeypatch,
):
    """A target that answers ``Connection: close`` (or anything the reader refuses) and stops
    reading: the reader closed the connection gently, which waits for the unsent bytes, so the
    role's sender waited until ``SEND_TIMEOUT_S`` and the connection stayed open as long as
    the target kept it. Now the reader aborts it: the call's send returns at once."""
    from loglake.events import server as srv_mod

    monkeypatch.setattr(srv_mod, "SEND_TIMEOUT_S", 10.0)

    def answer(s: socket.socket) -> None:
        read_request(s, body=False)  # and not the body: kept open, never read again
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    async def main(url: str) -> tuple[tuple[int, bytes], float]:
        pipe = _Pipe(url)
        t0 = asyncio.get_running_loop().time()
        try:
            fut = await asyncio.wait_for(pipe.send("m", b"x" * (16 << 20), {}), 20)
            return await fut, asyncio.get_running_loop().time() - t0
        finally:
            pipe.close()

    with peer_server(answer) as url:
        reply, took = asyncio.run(main(url))
    assert reply == (200, b"ok") and took < 5, took


def test_a_target_that_takes_a_call_slowly_is_hung_once_the_send_timeout_passes(monkeypatch):
    """``SEND_TIMEOUT_S`` bounds the whole wait for a call's bytes, not a wait without
    progress: a target taking a few KB at a time would otherwise hold the role's sender (and
    every other target's calls) for as long as its calls last."""
    from loglake.events import server as srv_mod

    monkeypatch.setattr(srv_mod, "SEND_TIMEOUT_S", 1.0)

    def drip(s: socket.socket) -> None:
        for _ in range(100):  # 64 KiB every 0.05 s: never nothing for long
            if not s.recv(64 * 1024):
                return
            time.sleep(0.05)

    async def main(url: str) -> tuple[str, float]:
        pipe = _Pipe(url)
        t0 = asyncio.get_running_loop().time()
        try:
            fut = await asyncio.wait_for(pipe.send("m", b"x" * (32 << 20), {}), 20)
            took = asyncio.get_running_loop().time() - t0
            with pytest.raises(TimeoutError) as e:
                await fut
            return str(e.value), took
        finally:
            pipe.close()

    with peer_server(drip) as url:
        why, took = asyncio.run(main(url))
    assert "did not take a call's bytes within 1 s: treated as hung" in why and took < 3, took
