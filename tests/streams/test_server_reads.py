"""Reads do not block appends, and a failed request is answered (issue 17 item 9, server side).

A pull is held inside the log (``GatedLog.read_payloads`` waits on an event the test sets), and
the tests check what makes progress meanwhile — ordering and progress, never timing thresholds:
the held pull is released only after the pushes were confirmed, so on a server that handled one
batch at a time the pushes would wait for the pull and the test would fail (client timeout)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from loglake.log import MemoryLog
from loglake.streams import codec
from loglake.streams.client import AsyncStreamClient, StreamClient, StreamServiceError
from loglake.streams.messages import PullRequest, PullResponse, PushConfirm
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import RoutingMessage, TcpConnection, encode_frame, route

WAIT = 20.0  # a generous bound on any single wait; no assertion depends on how long it took


class GatedLog(MemoryLog):
    """A MemoryLog whose reads wait until ``gate`` is set (a cold read of old history)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.reading = threading.Event()

    def read_payloads(self, *a, **k):
        self.reading.set()
        assert self.gate.wait(WAIT * 2), "the test never released the read"
        return super().read_payloads(*a, **k)


def wait_until(cond) -> bool:
    done = threading.Event()
    for _ in range(int(WAIT * 100)):
        if cond():
            return True
        done.wait(0.01)
    return False


@pytest.fixture
def gated():
    log = GatedLog()
    srv = BackgroundServer(StreamService(log)).start()
    try:
        yield log, srv
    finally:
        log.gate.set()
        srv.stop()


def test_a_held_pull_does_not_delay_pushes_from_another_client(gated) -> None:
    log, srv = gated
    with StreamClient(port=srv.port, timeout=WAIT) as producer:
        producer.create_stream("s")
        producer.push("s", b"old")
        pulled: list = []

        def consume() -> None:
            with StreamClient(port=srv.port, timeout=WAIT * 2) as consumer:
                pulled.extend(consumer.pull("s", 0, 1000))

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        assert log.reading.wait(WAIT), "the pull reached the log"
        assert producer.push_many("s", [b"new"] * 100) == list(range(1, 101))
        assert producer.push("s", b"newer") == 101
        assert t.is_alive() and not pulled, "the pull is still held while pushes were confirmed"
        log.gate.set()
        t.join(WAIT)
    assert not t.is_alive() and pulled and pulled[0].data == b"old"


def test_a_held_pull_does_not_delay_pushes_on_the_same_connection(gated) -> None:
    log, srv = gated

    async def main() -> None:
        async with await AsyncStreamClient.connect(port=srv.port) as c:
            await c.create_stream("s", 2)
            await c.push("s", b"old", 1)
            pull = asyncio.ensure_future(c.pull("s", 0, 10, 1))
            assert await asyncio.to_thread(log.reading.wait, WAIT)
            assert await c.push_many("s", [b"x"] * 50, 0) == list(range(50))
            assert await c.push("s", b"y", 1) == 1
            assert not pull.done(), "the pull is still held"
            log.gate.set()
            got = await asyncio.wait_for(pull, WAIT)
            assert got[0].data == b"old"

    asyncio.run(main())


def test_replies_to_one_return_route_keep_request_order(gated) -> None:
    """As from one Ockam worker's mailbox: a push confirm sent to the same return route as an
    earlier, held pull comes after the pull's reply (the push itself is not held)."""
    log, srv = gated
    with StreamClient(port=srv.port, timeout=WAIT) as c:
        c.create_stream("s")
        c.push("s", b"old")
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT)
    try:
        assert s.recv(1) == b"\x01"
        worker = route(worker_address("s", 0))
        pull = RoutingMessage(worker, route("me"), codec.encode_payload(PullRequest(1, 0, 10)))
        push = RoutingMessage(worker, route("me"), codec.encode_push_request(2, b"new"))
        s.sendall(b"\x01" + encode_frame(pull))
        assert log.reading.wait(WAIT)
        s.sendall(encode_frame(push))
        assert wait_until(lambda: log.next_index("s") == 2), "pushed while the pull is held"
        log.gate.set()
        conn = TcpConnection()
        conn.receive_data(b"\x01")
        got: list[RoutingMessage] = []
        while len(got) < 2:
            data = s.recv(65536)
            assert data, "the server closed the connection"
            got += conn.receive_data(data)
    finally:
        s.close()
    first = codec.decode_response(got[0].payload, PullResponse)
    second = codec.decode_response(got[1].payload, PushConfirm)
    assert first.request_id == 1 and second == PushConfirm(2, "OK", 1)


class BrokenService(StreamService):
    def batch(self, msgs, **kw):
        raise RuntimeError("a bug in the core")


def test_a_request_the_server_failed_to_handle_gets_an_error_reply() -> None:
    log = MemoryLog()
    log.create_stream("s")
    with (
        BackgroundServer(BrokenService(log)) as srv,
        StreamClient(port=srv.port, timeout=WAIT) as c,
    ):
        with pytest.raises(StreamServiceError, match="internal error: RuntimeError"):
            c.pull("s", 0, 10)
        with pytest.raises(StreamServiceError, match="internal error: RuntimeError"):
            c.push("s", b"x")


class FailingReadLog(MemoryLog):
    def read_payloads(self, *a, **k):
        raise RuntimeError("disk on fire")


def test_a_pull_whose_read_fails_unexpectedly_gets_an_error_reply() -> None:
    with (
        BackgroundServer(StreamService(FailingReadLog())) as srv,
        StreamClient(port=srv.port, timeout=WAIT) as c,
    ):
        c.create_stream("s")
        assert c.push("s", b"x") == 0
        with pytest.raises(StreamServiceError, match="internal error: RuntimeError"):
            c.pull("s", 0, 10)
        assert c.push("s", b"y") == 1  # the connection and the server carry on
