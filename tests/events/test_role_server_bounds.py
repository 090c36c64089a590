"""A role server's own bounds against clients that hold its resources (``server.RoleRunner``,
``HttpRoleServer.handle``): connections past ``MAX_CONNECTIONS`` are aborted as they are
accepted, a connection that sends nothing or half a request head is closed after
``KEEPALIVE_S``, a body that does not arrive within ``BODY_TIMEOUT_S`` is answered 408, and
bodies past ``MAX_READING_BYTES`` in all are refused 503 at once. Real subscriber roles on
loopback; every wait bounded."""

from __future__ import annotations

import gc
import socket
import time

import pytest

from loglake.events import server as srv_mod
from loglake.events.identity import Identity
from loglake.events.server import HttpRoleServer
from loglake.events.subscriber import Subscriber
from tests.events.served import serve


def _role() -> tuple[int, object]:
    me = Identity.generate()
    return serve(HttpRoleServer(Subscriber(me.principal, Identity.generate().principal), me, {}))


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closed ``s`` (EOF or reset) within ``seconds``."""
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def _status(s: socket.socket, seconds: float = 10) -> int:
    s.settimeout(seconds)
    head = b""
    while b"\r\n" not in head:
        got = s.recv(4096)
        if not got:
            raise ConnectionError(f"closed after {head!r}")
        head += got
    return int(head.split(b" ", 2)[1])


def _head(length: int) -> bytes:
    return (
        f"POST /api/loglake_inbox HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _served_again(port: int) -> None:
    """A new connection to the role on ``port`` is taken and its request answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /api/no_such HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert _status(s) == 404


def test_connections_past_the_cap_are_aborted_and_the_cap_frees_as_they_close(monkeypatch, caplog):
    """Past the cap a connection is aborted once its handler has started (aborted before,
    aiohttp's handler logged an AssertionError traceback for each one refused)."""
    monkeypatch.setattr(srv_mod, "MAX_CONNECTIONS", 5)
    caplog.set_level("ERROR", "asyncio")
    port, stop = _role()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]
    try:
        time.sleep(0.3)  # the server has accepted them all by now
        closed = [_closed_within(s, 0.5) for s in socks]
        assert closed == [False] * 5 + [True] * 3
        for s in socks[:5]:
            s.close()
        time.sleep(0.3)
        _served_again(port)
    finally:
        for s in socks:
            s.close()
        stop()
    gc.collect()  # an unretrieved task exception is logged when its task is collected
    assert not [r for r in caplog.records if "AssertionError" in r.getMessage() + str(r.exc_info)]


def test_one_peer_cannot_hold_every_connection_of_a_role(monkeypatch):
    """Past ``MAX_CONNECTIONS_PER_PEER`` from one address a connection is aborted as it comes;
    another address is still taken. Found from outside on the node's HTTP server: one client's
    512 connections locked every other client out."""
    monkeypatch.setattr(srv_mod, "MAX_CONNECTIONS_PER_PEER", 3, raising=False)
    port, stop = _role()
    socks = []
    try:
        for _ in range(4):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.05)  # accepted in this order
        other = socket.create_connection(("127.0.0.1", port), 5, ("127.0.0.2", 0))
        socks.append(other)
        time.sleep(0.3)
        closed = [_closed_within(s, 0.5) for s in socks]
        assert closed == [False, False, False, True, False]
        socks[0].close()
        time.sleep(0.3)
        _served_again(port)  # a place from 127.0.0.1 came back as one closed
    finally:
        for s in socks:
            s.close()
        stop()


def test_the_roles_of_a_process_share_its_connection_budget(monkeypatch):
    """Two roles in one process (as a node runs four): together they keep at most the
    process's budget of connections (``streams.descriptors.CONNECTIONS``, a quarter of the
    descriptor limit), each released as it closes. Before, each role had only its own cap, and
    four of them could take every descriptor the node's log needed."""
    from loglake.streams import descriptors

    budget = descriptors.Connections()
    monkeypatch.setattr(srv_mod, "CONNECTIONS", budget)
    monkeypatch.setattr(descriptors, "soft_limit", lambda: 24)  # a budget of 6
    (port_a, stop_a), (port_b, stop_b) = _role(), _role()
    socks = []
    try:
        for port in (port_a,) * 4 + (port_b,) * 4:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.05)  # accepted in this order
        closed = [_closed_within(s, 0.5) for s in socks]
        assert closed == [False] * 6 + [True] * 2
        assert (budget.open, budget.refused) == (6, 2)
        for s in socks[:4]:
            s.close()
        time.sleep(0.3)
        assert budget.open == 2
        _served_again(port_b)
    finally:
        for s in socks:
            s.close()
        stop_a()
        stop_b()
    assert budget.open == 0


def test_a_connection_that_sends_nothing_or_half_a_head_is_closed_after_the_keepalive(
    monkeypatch,
):
    monkeypatch.setattr(srv_mod, "KEEPALIVE_S", 0.5)
    port, stop = _role()
    quiet = socket.create_connection(("127.0.0.1", port), timeout=5)
    half = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        half.sendall(b"POST /api/loglake_inbox HTTP/1.1\r\nHost: x\r\n")  # no blank line
        t0 = time.monotonic()
        assert _closed_within(quiet, 5) and _closed_within(half, 5)
        assert time.monotonic() - t0 < 4
    finally:
        quiet.close()
        half.close()
        stop()


def test_a_body_that_does_not_arrive_is_408_and_bodies_past_the_budget_are_503_at_once(
    monkeypatch,
):
    """Bodies are read before their signature can be checked (it signs them): many clients
    sending large bodies at once held the role's memory (8 MB each), and one sending its body
    slowly held its handler for good."""
    monkeypatch.setattr(srv_mod, "MAX_READING_BYTES", 1_000_000)
    monkeypatch.setattr(srv_mod, "BODY_TIMEOUT_S", 1.5)
    port, stop = _role()
    slow = socket.create_connection(("127.0.0.1", port), timeout=5)
    other = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        slow.sendall(_head(900_000) + bytes(600_000))  # and the rest never: 600 kB held
        time.sleep(0.3)
        t0 = time.monotonic()
        other.sendall(_head(900_000) + bytes(900_000))
        assert _status(other) == 503 and time.monotonic() - t0 < 1  # before slow's 408
        assert _status(slow) == 408 and _closed_within(slow, 2)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
            again.sendall(_head(900_000) + bytes(900_000))
            assert _status(again) == 401  # read now (unsigned: refused at the signature)
    finally:
        slow.close()
        other.close()
        stop()


def test_a_declared_length_never_sent_holds_nothing(monkeypatch):
    """A head declaring the body limit and no byte of body: counted at its length, eight of
    them refused every other call with a body (503) while they lasted."""
    monkeypatch.setattr(srv_mod, "MAX_READING_BYTES", 1_000_000)
    port, stop = _role()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]
    try:
        for s in idle:
            s.sendall(_head(8_000_000))
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(_head(900_000) + bytes(900_000))
            assert _status(s) == 401
    finally:
        for s in idle:
            s.close()
        stop()


def test_a_compressed_body_is_taken_as_sent_not_inflated(monkeypatch):
    """No role sends a ``Content-Encoding``: aiohttp inflated gzip bodies, so a few kB sent
    became MB held (this one 413 past the 8 MB limit); now the bytes are the body as sent
    (a compressed one fails its signature like any other)."""
    import gzip

    port, stop = _role()
    body = gzip.compress(bytes(10_000_000))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            head = _head(len(body)).replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n")
            s.sendall(head + body)
            assert _status(s) == 401
    finally:
        stop()


@pytest.mark.parametrize("size", [100, 2_000_000])
def test_one_call_alone_is_read_whatever_the_budget(monkeypatch, size):
    """The budget never refuses a call while no other body is read (the body limit may be
    set above it)."""
    monkeypatch.setattr(srv_mod, "MAX_READING_BYTES", 1_000)
    port, stop = _role()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(_head(size) + bytes(size))
            assert _status(s) == 401
    finally:
        stop()


SERVE = """
import asyncio, sys
from aiohttp import web
from loglake.events.server import serve_role
async def slow(request):
    await asyncio.sleep(1.5)
    return web.Response(text="done")
app = web.Application()
app.router.add_post("/api/{method}", slow)
serve_role(app, "127.0.0.1", int(sys.argv[1]))
"""


def test_serve_role_answers_the_requests_in_flight_when_stopped():
    """SIGTERM while a handler is at work: its answer is sent, then the process exits 0, as
    under ``web.run_app`` (the requests in flight first, then the app's cleanup; stopping
    the event loop at once cut them off)."""
    import signal
    import subprocess
    import sys

    from tests.procs import free_port, stop, wait_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_port(port, proc)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(_head(0))
            time.sleep(0.5)  # the handler is at work
            proc.send_signal(signal.SIGTERM)
            assert _status(s) == 200
        assert proc.wait(10) == 0
    finally:
        stop(proc)
