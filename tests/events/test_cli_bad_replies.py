"""`loglake events` client commands pointed at something that answers, but not with a reply:
another protocol on the port, a connection closed at once or mid-body, a 200 that is not Candid,
a body over the size limit. Each is one line naming the URL, exit 1, no traceback, in bounded
time (real processes and a raw socket server on loopback)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from loglake.events.client import MAX_REPLY_BYTES, BadReply, post_raw
from tests.events.test_cli_unreachable import _events, key  # noqa: F401  (fixture)
from tests.procs import free_port


def read_request(s: socket.socket, body: bool = True) -> None:
    """Read the whole request, head and body, before answering: a socket closed with unread
    bytes sends a reset, and the client would see that instead of the answer under test.
    ``body`` False: the head only (and what came with it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = s.recv(65536)
        if not got:
            return
        data += got
    if not body:
        return
    head, _, rest = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    want = int(length.group(1)) if length else 0
    while len(rest) < want:
        got = s.recv(65536)
        if not got:
            return
        rest += got


def _endless(s: socket.socket) -> None:
    """Body bytes until the client hangs up (or 30 s pass: the test fails by then)."""
    end = time.monotonic() + 30
    while time.monotonic() < end:
        s.sendall(b"\0" * 65536)


@contextmanager
def peer_server(handle: Callable[[socket.socket], None] | None = None) -> Iterator[str]:
    """A loopback TCP server that runs ``handle`` on each connection (in a thread of its own,
    nothing read before it) and closes every connection when the test ends; without
    ``handle`` it never reads (a hung or hostile peer: what a client writes stays in the
    sockets' buffers)."""
    srv = socket.create_server(("127.0.0.1", free_port()))
    held: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        assert handle is not None
        with contextlib.suppress(OSError):  # the client, or the test's end, closed it
            handle(conn)

    def run() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            if handle is not None:
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        # close() alone does not wake the thread's accept(): the join took its whole 10 s
        with contextlib.suppress(OSError):
            srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        for conn in held:
            conn.close()
        t.join(10)


@contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback TCP server that reads each request whole, runs ``answer`` on its connection,
    then closes it."""

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            read_request(conn)
            answer(conn)

    with peer_server(handle) as url:
        yield url


CASES = {
    "ssh": (
        lambda s: s.sendall(b"SSH-2.0-x\r\n"),
        "bad reply from {url}: not an HTTP reply (BadStatusLine: 'SSH-2.0-x\\r\\n')",
    ),
    "closed-at-once": (
        lambda s: None,
        "cannot reach {url}: closed the connection without a reply",
    ),
    "not-candid": (
        lambda s: s.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"),
        "bad reply from {url}: icrc77_get_replays: not its Candid result (malformed Candid",
    ),
    "closed-mid-body": (
        lambda s: s.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nDIDL"),
        "cannot reach {url}: the connection closed mid-reply (4 of 100 bytes)",
    ),
    "too-long": (
        lambda s: (
            s.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2000000000\r\n\r\n"),
            _endless(s),
        ),
        f"bad reply from {{url}}: a reply of 2000000000 bytes, over the limit of {MAX_REPLY_BYTES}",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_an_answer_that_is_not_a_reply_is_one_line(case, key):  # noqa: F811
    answer, line = CASES[case]
    with raw_server(answer) as url:
        t0 = time.monotonic()
        r = _events(["replays"], url, key, timeout=60, LOGLAKE_EVENTS_CALL_TIMEOUT="10")
        took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "Error: " + line.format(url=url) in r.stderr, r.stderr
    assert took < 20, took  # interpreter start and one call, not the call timeout


def test_a_reply_without_length_is_cut_at_the_limit_not_read_to_its_end():
    """Close-delimited (no Content-Length): the client stops one byte past the limit rather
    than reading what the server keeps sending."""

    def answer(s: socket.socket) -> None:
        s.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
        _endless(s)

    with raw_server(answer) as url:
        t0 = time.monotonic()
        with pytest.raises(BadReply, match="a reply of more than 100000 bytes, over the limit"):
            post_raw(url, "icrc77_get_replays", b"", {}, timeout=10, max_reply_bytes=100_000)
        assert time.monotonic() - t0 < 10
