"""``NodeH11Protocol``: uvicorn's h11 protocol with the two bounds the node's HTTP server needs
and uvicorn does not have: a request's head (request line and headers) must arrive within
``HEAD_TIMEOUT`` seconds of the connection or of its first byte, and at most
``MAX_CONNECTIONS`` connections are open at once (one past it is dropped as it is accepted).

Why: uvicorn's only timer, ``timeout_keep_alive``, runs between requests and stops at the
next byte, so a client that connects and sends nothing, or half a request line and headers,
was held forever, with no token needed (20 such sockets were all still open 8 s later). The
stream server bounds the same with ``version_timeout`` and ``frame_timeout``
(``streams/limits.py``); the node's descriptors are shared by both servers and the log.
Written by hand because uvicorn takes a protocol class and has no such option.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT = 10.0
"""Seconds a request's line and headers may take (from the connection, or from the first byte
of a request after the last one's reply)."""
MAX_CONNECTIONS = 512
"""Connections the HTTP server keeps open at once."""


class NodeH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.abort()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()  # a request begins (no-op if its clock runs already)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # its head is in

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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
