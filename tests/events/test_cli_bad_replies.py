"""`loglake events` client commands pointed at something that answers, but not with a reply:
another protocol on the port, a connection closed at once or mid-body, a 200 that is not Candid,
a body over the size limit. Each is one line naming the URL, exit 1, no traceback, in bounded
time (real processes and a raw socket server on loopback)."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from loglake.events.client import MAX_REPLY_BYTES, BadReply, post_raw
from tests.events.test_cli_unreachable import _events, key  # noqa: F401  (fixture)
from tests.peers import peer_server


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
