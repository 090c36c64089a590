"""``NodeH11Protocol``: uvicorn's h11 protocol with what the node's HTTP server needs and
uvicorn does not have: the security headers on the 400 uvicorn answers itself (below), and
bounds: a request's head (request line and headers) must arrive within ``HEAD_TIMEOUT``
seconds of the connection or of its first byte; its body within ``BODY_TIMEOUT`` seconds of
its head (a second more per MiB that has arrived, so a large body on a slow link still goes);
what is left of a body the app answered without reading is dropped within ``LINGER`` seconds;
at most ``MAX_CONNECTIONS`` connections are open at once, ``MAX_CONNECTIONS_PER_PEER`` of them
from one IP address, each holding a place in the process's budget
(``streams.descriptors.CONNECTIONS``; one past any of these is dropped as it is accepted).

Why: uvicorn's only timer, ``timeout_keep_alive``, runs between requests and stops at the
next byte, so a client that connects and sends nothing, or half a request line and headers,
was held forever, with no token needed (20 such sockets were all still open 8 s later). The
body had no timer either. Found from outside: 512 connections that each sent a
``POST /console/login`` head (open, no token) with ``Content-Length: 100`` and no body held
every HTTP connection for good (the 513th and every client with the token refused); under a
1,024 descriptor limit 300 of them also took the process's connection budget, so the stream
service refused its clients too. The stream server bounds the same with ``version_timeout``,
``frame_timeout`` and ``max_connections_per_peer`` (``streams/limits.py``), the events roles
with ``BODY_TIMEOUT_S`` (``events/server.py``); the node's descriptors are shared by all of
them and the log. Written by hand because uvicorn takes a protocol class and has no such option.

The 400: a request h11 cannot parse (a bad request line or header) is answered by uvicorn
itself (``h11_impl.send_400_response``), never reaching the app, so ``gate.SecurityHeaders``
did not put ``nosniff`` and ``API_CSP`` on it as it does on every answer of the app. uvicorn's
``headers=`` option does not help: that 400 leaves out its default headers (uvicorn 0.54), and
the app's answers would carry the policy twice (a page's own policy and ``API_CSP``, both
enforced, would break ``/docs`` and the console).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from loglake.node.gate import API_CSP, MAX_BODY
from loglake.streams.descriptors import CONNECTIONS
from loglake.structured_logging import log_event

_logger = logging.getLogger(__name__)

HEAD_TIMEOUT = 10.0
"""Seconds a request's line and headers may take (from the connection, or from the first byte
of a request after the last one's reply)."""
BODY_TIMEOUT = 30.0
"""Seconds a request's body may take from the end of its head (the events roles'
``BODY_TIMEOUT_S``), plus ``BODY_SECONDS_PER_MIB`` for each MiB that has arrived: a body that
stalls or trickles is answered 408 (or dropped, once answered) and its connection closed."""
BODY_SECONDS_PER_MIB = 1.0
"""What each MiB of a body that has arrived adds to its time, counted up to ``gate.MAX_BODY``:
a 32 MiB body may take 62 s (a link of ~4 Mbit/s), and no body longer."""
LINGER = 2.0
"""Seconds the rest of a body is read (and dropped) once the app has answered without reading
it (a 401, a 413): h11 must read a body to its end before the connection can serve again, and
a declared 10 GB, or an endless chunked body, kept it reading."""
MAX_CONNECTIONS = 512
"""Connections the HTTP server keeps open at once."""
MAX_CONNECTIONS_PER_PEER = 128
"""Connections from one IP address the HTTP server keeps open at once: one client cannot hold
every connection (a quarter of them, as the stream server's ``max_connections_per_peer`` is a
quarter of its ``max_connections``). A browser opens about 6 per host; a reverse proxy in front
of the node counts as one peer."""


class NodeH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._counted = False  # holds a place in the process's CONNECTIONS
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_started = 0.0  # loop time its head was in
        self._body_bytes = 0  # bytes that arrived while the body was being read
        self._linger_until: float | None = None  # set once the app answered, body unread

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        why = None
        if len(self.connections) > MAX_CONNECTIONS:
            why = f"{MAX_CONNECTIONS} connections open"
        elif self._from_same_peer() >= MAX_CONNECTIONS_PER_PEER:
            why = f"{MAX_CONNECTIONS_PER_PEER} connections open from {self._peer()}"
        elif not CONNECTIONS.admit():
            why = "the process's connection budget is used up (streams.descriptors)"
        if why is not None:
            _refused(why)
            transport.abort()
            return
        self._counted = True
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()  # a request begins (no-op if its clock runs already)
        elif self.conn.their_state is h11.SEND_BODY:
            self._body_bytes += len(data)
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        body_unread = self.conn.their_state is h11.SEND_BODY
        super().on_response_complete()  # (may start the next pipelined request)
        if body_unread and self.conn.their_state is h11.SEND_BODY:
            self._linger_until = self.loop.time() + LINGER
        self._watch()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 (its status, body and ``Connection: close``), with the headers every
        answer of the app carries (``gate.SecurityHeaders``)."""
        self._send_error(400, b"Bad Request", msg)

    def _send_error(self, status: int, reason: bytes, msg: str) -> None:
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"connection", b"close"),
            (b"x-content-type-options", b"nosniff"),
            (b"content-security-policy", API_CSP.encode()),
        ]
        for event in (
            h11.Response(status_code=status, headers=headers, reason=reason),
            h11.Data(data=msg.encode("ascii")),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_body_timer()
        if self._counted:
            self._counted = False
            CONNECTIONS.release()
        super().connection_lost(exc)

    def _peer(self) -> str | None:
        return self.client[0] if self.client else None

    def _from_same_peer(self) -> int:
        """Connections admitted from this one's IP address (a scan of at most
        ``MAX_CONNECTIONS``, at each accept)."""
        peer = self._peer()
        return sum(
            1
            for c in self.connections
            if isinstance(c, NodeH11Protocol) and c._counted and c._peer() == peer
        )

    def _arm(self) -> None:
        if self._head_deadline is None:
            self._head_deadline = self.loop.call_later(HEAD_TIMEOUT, self._head_expired)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_expired(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.abort()

    # -- the body's clock ---------------------------------------------------------------------
    def _watch(self) -> None:
        """After h11 took bytes, or the app answered: the head's clock stops once the head is
        in; the body's runs while h11 waits for body bytes."""
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # its head is in
        elif self.timeout_keep_alive_task is None and not self.transport.is_closing():
            # between requests with no keep-alive timer: uvicorn cancels it at every byte, so
            # the body of a request answered before it was read (a 401, a 400) cancelled it,
            # and the idle connection was then held for good
            self._arm()
        if self.conn.their_state is h11.SEND_BODY:
            if self._body_timer is None:
                self._body_started, self._body_bytes = self.loop.time(), 0
                self._body_timer = self.loop.call_at(self._body_deadline(), self._body_expired)
            elif self._linger_until is not None and self._linger_until < self._body_timer.when():
                self._body_timer.cancel()
                self._body_timer = self.loop.call_at(self._linger_until, self._body_expired)
        else:
            self._stop_body_timer()

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._linger_until = None

    def _body_deadline(self) -> float:
        mib = min(self._body_bytes, MAX_BODY) / (1 << 20)
        deadline = self._body_started + BODY_TIMEOUT + mib * BODY_SECONDS_PER_MIB
        return deadline if self._linger_until is None else min(deadline, self._linger_until)

    def _body_expired(self) -> None:
        self._body_timer = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        deadline = self._body_deadline()
        if self.loop.time() < deadline:  # bytes arrived since: it has more time
            self._body_timer = self.loop.call_at(deadline, self._body_expired)
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            # the app waits in receive(): it gets http.disconnect, its answer goes nowhere
            cycle.disconnected = True
            cycle.message_event.set()
            self._send_error(408, b"Request Timeout", "the request body did not arrive in time")
        self.transport.close()


_last_refusal = [-1e9]


def _refused(why: str) -> None:
    """Log a connection refused at the door, at most once a second (a flood of refusals must
    not become a flood of log lines)."""
    now = time.monotonic()
    if now - _last_refusal[0] >= 1.0:
        _last_refusal[0] = now
        log_event(_logger, logging.WARNING, "HTTP connection refused", reason=why)
