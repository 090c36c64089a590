"""A role server's own bounds against clients that hold its resources (``server.RoleRunner``,
``HttpRoleServer.handle``): connections past ``MAX_CONNECTIONS`` are aborted as they are
accepted, a connection that sends nothing or half a request head is closed after
``KEEPALIVE_S``, a body that does not arrive within ``BODY_TIMEOUT_S`` is answered 408, and
bodies past ``MAX_READING_BYTES`` in all are refused 503 at once. Real subscriber roles on
loopback; every wait bounded."""

from __future__ import annotations

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


def test_connections_past_the_cap_are_aborted_and_the_cap_frees_as_they_close(monkeypatch):
    monkeypatch.setattr(srv_mod, "MAX_CONNECTIONS", 5)
    port, stop = _role()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]
    try:
        time.sleep(0.3)  # the server has accepted them all by now
        closed = [_closed_within(s, 0.5) for s in socks]
        assert closed == [False] * 5 + [True] * 3
        for s in socks[:5]:
            s.close()
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /api/no_such HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            assert _status(s) == 404  # served again
    finally:
        for s in socks:
            s.close()
        stop()


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
    """Bodies are read before their signature can be checked (it signs them): a client
    holding a read, or many reading at once, held the role's memory (8 MB each)."""
    monkeypatch.setattr(srv_mod, "MAX_READING_BYTES", 1_000_000)
    monkeypatch.setattr(srv_mod, "BODY_TIMEOUT_S", 1.0)
    port, stop = _role()
    slow = socket.create_connection(("127.0.0.1", port), timeout=5)
    other = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        slow.sendall(_head(900_000) + b"DIDL")  # and the rest never
        time.sleep(0.3)
        t0 = time.monotonic()
        other.sendall(_head(900_000) + bytes(900_000))
        assert _status(other) == 503 and time.monotonic() - t0 < 0.9  # before slow's 408
        assert _status(slow) == 408  # then closed (aiohttp lingers up to 10 s for the rest)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
            again.sendall(_head(900_000) + bytes(900_000))
            assert _status(again) == 401  # read now (unsigned: refused at the signature)
    finally:
        slow.close()
        other.close()
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
