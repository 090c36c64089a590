"""``NodeH11Protocol``: uvicorn's h11 protocol with what the node's HTTP server needs and
uvicorn does not have: the security headers on the 400 uvicorn answers itself (below), and two
bounds: a request's head (request line and headers) must arrive within
``HEAD_TIMEOUT`` seconds of the connection or of its first byte, and at most
``MAX_CONNECTIONS`` connections are open at once, each holding a place in the process's budget
(``streams.descriptors.CONNECTIONS``; one past either is dropped as it is accepted).

Why: uvicorn's only timer, ``timeout_keep_alive``, runs between requests and stops at the
next byte, so a client that connects and sends nothing, or half a request line and headers,
was held forever, with no token needed (20 such sockets were all still open 8 s later). The
stream server bounds the same with ``version_timeout`` and ``frame_timeout``
(``streams/limits.py``); the node's descriptors are shared by both servers and the log.
Written by hand because uvicorn takes a protocol class and has no such option.

The 400: a request h11 cannot parse (a bad request line or header) is answered by uvicorn
itself (``h11_impl.send_400_response``), never reaching the app, so ``gate.SecurityHeaders``
did not put ``nosniff`` and ``API_CSP`` on it as it does on every answer of the app. uvicorn's
``headers=`` option does not help: that 400 leaves out its default headers (uvicorn 0.54), and
the app's answers would carry the policy twice (a page's own policy and ``API_CSP``, both
enforced, would break ``/docs`` and the console).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from loglake.node.gate import API_CSP
from loglake.streams.descriptors import CONNECTIONS

HEAD_TIMEOUT = 10.0
"""Seconds a request's line and headers may take (from the connection, or from the first byte
of a request after the last one's reply)."""
MAX_CONNECTIONS = 512
"""Connections the HTTP server keeps open at once."""


class NodeH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._counted = False  # holds a place in the process's CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS or not CONNECTIONS.admit():
            transport.abort()
            return
        self._counted = True
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()  # a request begins (no-op if its clock runs already)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # its head is in

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 (its status, body and ``Connection: close``), with the headers every
        answer of the app carries (``gate.SecurityHeaders``)."""
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"connection", b"close"),
            (b"x-content-type-options", b"nosniff"),
            (b"content-security-policy", API_CSP.encode()),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=msg.encode("ascii")),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            CONNECTIONS.release()
        super().connection_lost(exc)

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
