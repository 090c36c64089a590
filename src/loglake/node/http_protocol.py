"""``NodeH11Protocol``: uvicorn's h11 protocol with what the node's HTTP server needs and
uvicorn does not have: the security headers on the 400 uvicorn answers itself (below), and
bounds: a request's head (request line and headers) must arrive within ``HEAD_TIMEOUT``
seconds of the connection or of its first byte; its body within ``BODY_TIMEOUT`` seconds of
its head (a second more per MiB that has arrived, so a large body on a slow link still goes);
what is left of a body the app answered without reading is dropped within ``LINGER`` seconds;
at most ``MAX_CONNECTIONS`` connections are open at once, ``MAX_CONNECTIONS_PER_PEER`` of them
from one IP address, each holding a place in the process's budget
(``streams.descriptors.CONNECTIONS``; one past any of these is dropped as it is accepted,
unless an idle or stalled connection can make room: ``_make_room``). Answers: a connection whose
client takes none of what is sent to it for ``SEND_PERIODS`` x ``SEND_TIMEOUT`` seconds is
dropped; a client that
pipelines requests gets the next one answered only while it holds at most ``MAX_UNREAD`` bytes
of answers it has not read (``_hold_pipeline``).

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

The answers' clock: found from outside, 512 connections (128 from each of 127.0.0.2-.5) that
each sent 200 pipelined ``GET /openapi.json`` (no token) and read nothing held every place for
as long as they stayed (75 s measured; every client with the token timed out, the node's CPU at
40-100%). Once a request's head is in, the head's clock stops; the body's runs only while a body
comes; uvicorn's keep-alive timer starts only once an answer is complete: an answer stuck in
``flow.drain()`` (the client's window shut) had no clock at all, and each such connection had
~65 answers of 44 KB computed into the kernel's buffers (2.8 MB, ~2 ms of the event loop each)
before its writes paused. Now its writes may make no progress for ``SEND_PERIODS`` x
``SEND_TIMEOUT`` s (a client reading slowly but steadily is not cut: any progress restarts the
clock), the next pipelined request waits while more than ``MAX_UNREAD`` bytes are unread, and at
the connection cap the connection idle the longest, or else the one stalled the longest (no
progress for half of ``SEND_TIMEOUT``), gives its place to a new one, as the stream server's
``_evict_idlest`` does.

Progress, and why ``SEND_PERIODS``: the node sees a client read only as a drop of the bytes it
holds unacknowledged (``_unread``), and the client's kernel re-opens a shut TCP window only once
its reader has freed about two segments (measured on loopback, MSS 64 KiB: a drop every ~128 KiB
read; at 4 KiB/s one every 32 s). Cut after one ``SEND_TIMEOUT`` (as first written), a reader
steady at 1 KiB every 250 ms was reset at 31.8 s with ``send_timeout = 10``; and at the cap a
client downloading at 64 KiB/s was evicted as "stalled" ahead of 511 idle connections, since the
stall clock moved only at a ``_send_check``. Now the clock moves at every look (``_progress``,
also when a new connection looks for room), idle connections go first, and the deadline is
``SEND_PERIODS`` periods: a client reading at least ``WINDOW_STEP`` bytes per
``SEND_PERIODS * SEND_TIMEOUT`` s (~1.1 KiB/s with the defaults) is never cut, and one that
reads nothing is cut ``SEND_PERIODS * SEND_TIMEOUT`` s (2 min) after its answers stalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import struct
import sys
import termios
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
SEND_TIMEOUT = 30.0
"""The period of the answers' clock: answers that wait (the writes paused, the next pipelined
request held, or the last answer unsent at close) with no progress at all for ``SEND_PERIODS``
of them are dropped. ``[http] send_timeout`` sets it for a node."""
SEND_PERIODS = 4
"""Periods of ``SEND_TIMEOUT`` with no progress before a connection is dropped: progress shows
only in steps of the client's TCP window (``WINDOW_STEP``), so a steady reader slower than a step
per period must not be cut (see the module's docstring)."""
WINDOW_STEP = 128 * 1024
"""Bytes a client reads between two drops of what the node holds unacknowledged, at most
(measured on loopback; over Ethernet a few KB): with ``SEND_PERIODS``, the floor of a reader's
rate that is never cut is ``WINDOW_STEP / (SEND_PERIODS * send_timeout)``."""
MAX_UNREAD = 256 * 1024
"""Bytes of answers a client may leave unread (in the transport's buffer and, on Linux, the
kernel's send queue) before its next pipelined request waits: a client that pipelines requests
and reads nothing has a few answers computed, not as many as the kernel's buffers take."""
HOLD_POLL = 0.05
"""Seconds between looks at the unread bytes of a connection whose next request is held."""
EVICT_IDLE_AFTER = 1.0
"""Seconds a connection must have been idle (owed nothing, nothing of a request in) before a new
connection at a cap may take its place (as ``streams.server.EVICT_IDLE_AFTER``)."""
MAX_CONNECTIONS = 512
"""Connections the HTTP server keeps open at once."""
MAX_CONNECTIONS_PER_PEER = 128
"""Connections from one IP address the HTTP server keeps open at once: one client cannot hold
every connection (a quarter of them, as the stream server's ``max_connections_per_peer`` is a
quarter of its ``max_connections``). A browser opens about 6 per host; a reverse proxy in front
of the node counts as one peer."""


class NodeH11Protocol(H11Protocol):
    send_timeout: float | None = None
    """This server's ``SEND_TIMEOUT`` (None: the module's), set by ``configured``."""

    @classmethod
    def configured(cls, *, send_timeout: float) -> type[NodeH11Protocol]:
        """The protocol class with a node's ``[http]`` settings (uvicorn takes a class)."""
        return type(cls.__name__, (cls,), {"send_timeout": send_timeout})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._send_timer: asyncio.TimerHandle | None = None
        self._send_level = 0  # bytes unread at the last look
        self._stalled_since = 0.0  # loop time of the last progress of a stalled connection
        self._held = False  # an answer is complete; the next pipelined request waits
        self._idle_since = 0.0  # loop time it last received bytes or completed an answer
        self._head_deadline: asyncio.TimerHandle | None = None
        self._counted = False  # holds a place in the process's CONNECTIONS
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_started = 0.0  # loop time its head was in
        self._body_bytes = 0  # bytes that arrived while the body was being read
        self._linger_until: float | None = None  # set once the app answered, body unread

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        why, per_peer = self._refusal()
        for _ in range(2):  # (the cap, then the peer's cap, may each need a place)
            if why is None or not self._make_room(why, per_peer):
                break
            why, per_peer = self._refusal()
        if why is not None:
            _refused(why)
            transport.abort()
            return
        self._counted = True
        self._idle_since = self.loop.time()
        self._arm()

    def _refusal(self) -> tuple[str | None, bool]:
        """Why this connection cannot be let in now (and whether for its peer's cap), or None:
        then it holds a place in ``CONNECTIONS``."""
        if len(self._admitted()) >= MAX_CONNECTIONS:
            return f"{MAX_CONNECTIONS} connections open", False
        if self._from_same_peer() >= MAX_CONNECTIONS_PER_PEER:
            return f"{MAX_CONNECTIONS_PER_PEER} connections open from {self._peer()}", True
        if not CONNECTIONS.admit():
            return "the process's connection budget is used up (streams.descriptors)", False
        return None, False

    def data_received(self, data: bytes) -> None:
        self._idle_since = self.loop.time()
        if self.conn.their_state is h11.IDLE:
            self._arm()  # a request begins (no-op if its clock runs already)
        elif self.conn.their_state is h11.SEND_BODY:
            self._body_bytes += len(data)
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        if self._hold_pipeline():
            self._held = True  # the rest of uvicorn's on_response_complete once it is read
            self._watch_send()
            return
        self._response_done()

    def _response_done(self) -> None:
        body_unread = self.conn.their_state is h11.SEND_BODY
        super().on_response_complete()  # (may start the next pipelined request)
        if body_unread and self.conn.their_state is h11.SEND_BODY:
            self._linger_until = self.loop.time() + LINGER
        self._watch()
        self._watch_send()  # (a last answer left unsent as the connection closes)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_send()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._watch_send()

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._watch_send()

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
        self._watch_send()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_body_timer()
        self._stop_send_timer()
        self._held = False
        if self._counted:
            self._counted = False
            CONNECTIONS.release()
        super().connection_lost(exc)

    def _peer(self) -> str | None:
        return self.client[0] if self.client else None

    def _admitted(self) -> list[NodeH11Protocol]:
        """The connections holding a place (a scan of at most ``MAX_CONNECTIONS``, at each
        accept)."""
        return [c for c in self.connections if isinstance(c, NodeH11Protocol) and c._counted]

    def _from_same_peer(self) -> int:
        """Connections admitted from this one's IP address."""
        peer = self._peer()
        return sum(1 for c in self._admitted() if c._peer() == peer)

    # -- making room at a cap -----------------------------------------------------------------
    def _make_room(self, why: str, per_peer: bool) -> bool:
        """At a cap, drop the connection idle the longest (owed nothing, no byte of a next
        request, for ``EVICT_IDLE_AFTER`` s), or else the one stalled the longest (its answers
        not moved for half of ``send_timeout``, and at least ``EVICT_IDLE_AFTER`` s), to let
        this one in; at the per-peer cap, one of the same peer's. False: none is, this one is
        refused as before. A flood of new connections cannot push out a client whose request is
        being read or run, nor one taking its answers (progress within the half period)."""
        now = self.loop.time()
        peer = self._peer() if per_peer else None
        victim, best = None, (2, 0.0)  # (rank, -seconds): lower goes first
        for c in self._admitted():
            if c is self or (peer is not None and c._peer() != peer):
                continue
            rank = c._evictable(now)
            if rank is not None and rank < best:
                victim, best = c, rank
        if victim is None:
            return False
        _evicted(f"{'idle' if best[0] == 0 else 'stalled'} {-best[1]:.1f} s, the longest: {why}")
        victim._counted = False  # its place is this one's now, not when the loop sees it gone
        CONNECTIONS.release()
        victim._stop_send_timer()
        victim._reset()
        return True

    def _evictable(self, now: float) -> tuple[int, float] | None:
        """(0, -seconds) idle, (1, -seconds) stalled, None: busy (lower goes first)."""
        if self.transport is None:
            return None
        if self._send_timer is not None:
            self._progress(now)  # (its clock otherwise moves once a period)
            stalled = now - self._stalled_since
            if (
                stalled >= max(EVICT_IDLE_AFTER, self._timeout() / 2)
                and self.conn.their_state is not h11.SEND_BODY  # (a request still coming)
            ):
                return (1, -stalled)
            return None
        idle = (
            not self.transport.is_closing()
            and self.conn.their_state is h11.IDLE
            and self.conn.our_state is h11.IDLE
            and not self._pending_input()
            and (self.cycle is None or self.cycle.response_complete)
            and not self.transport.get_write_buffer_size()
        )
        if idle and now - self._idle_since >= EVICT_IDLE_AFTER:
            return (0, -(now - self._idle_since))
        return None

    # -- the answers' clock -------------------------------------------------------------------
    def _timeout(self) -> float:
        return SEND_TIMEOUT if self.send_timeout is None else self.send_timeout

    def _progress(self, now: float) -> None:
        """Look at the unread bytes: if they dropped since the last look, the client took some
        and the stall's clock starts over. (They rise only as the app writes, which it does not
        while the writes are paused; a rise is taken as the new level.)"""
        level = self._unread()
        if level < self._send_level:
            self._stalled_since = now
        self._send_level = level

    def _unread(self) -> int:
        """Bytes sent to the client and not taken by it: the transport's buffer, and on Linux
        the socket's send queue (``TIOCOUTQ``: unsent and unacknowledged)."""
        n = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sys.platform == "linux" and sock is not None:
            with contextlib.suppress(OSError, ValueError):
                n += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        return n

    def _pending_input(self) -> int:
        """Bytes h11 holds unparsed (of pipelined requests): at most about one read, since
        uvicorn stops reading while a request is answered (h11's ``PAUSED``)."""
        buffer = getattr(self.conn, "_receive_buffer", None)  # (trailing_data copies it)
        return len(buffer) if buffer is not None else len(self.conn.trailing_data[0])

    def _hold_pipeline(self) -> bool:
        """Whether the next pipelined request (already in h11's buffer) must wait for the
        client to read: more than ``MAX_UNREAD`` bytes of its answers are unread."""
        return (
            not self.transport.is_closing()
            and self.conn.our_state is h11.DONE
            and self.conn.their_state is h11.DONE
            and self._pending_input() > 0
            and self._unread() > MAX_UNREAD
        )

    def _stalled(self) -> bool:
        if self.transport is None:
            return False
        if self.transport.is_closing():
            return self.transport.get_write_buffer_size() > 0
        return self.flow.write_paused or self._held

    def _watch_send(self) -> None:
        """Start the answers' clock when they stall (stop it when they flow again)."""
        if not self._stalled():
            self._stop_send_timer()
        elif self._send_timer is None:
            self._stalled_since, self._send_level = self.loop.time(), self._unread()
            delay = HOLD_POLL if self._held else self._timeout()
            self._send_timer = self.loop.call_later(delay, self._send_check)

    def _reset(self) -> None:
        """Drop the connection with a reset: what the kernel holds unsent is freed now (a
        plain close would queue a FIN behind it, and the socket would linger, orphaned, as
        long as the client keeps its window shut)."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _stop_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_check(self) -> None:
        self._send_timer = None
        if self.transport is None or not self._stalled():
            return
        now = self.loop.time()
        self._progress(now)
        if self._held and self._send_level <= MAX_UNREAD:
            self._held = False
            self._response_done()  # the next pipelined request goes
            return
        allowed = SEND_PERIODS * self._timeout()
        left = self._stalled_since + allowed - now
        if left <= 0:
            _dropped(self._peer(), allowed)
            self._reset()
            return
        self._send_timer = self.loop.call_later(
            min(left, HOLD_POLL if self._held else self._timeout()), self._send_check
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


_last_logged: dict[str, float] = {}


def _log_rarely(what: str, **fields: Any) -> None:
    """Log ``what`` at most once a second (a flood of refusals must not become a flood of log
    lines)."""
    now = time.monotonic()
    if now - _last_logged.get(what, -1e9) >= 1.0:
        _last_logged[what] = now
        log_event(_logger, logging.WARNING, what, **fields)


def _refused(why: str) -> None:
    _log_rarely("HTTP connection refused", reason=why)


def _evicted(why: str) -> None:
    _log_rarely("HTTP connection evicted at the connection cap", reason=why)


def _dropped(peer: str | None, timeout: float) -> None:
    _log_rarely(
        "HTTP connection dropped",
        peer=peer,
        reason=f"its answers untaken for {timeout:g} s ({SEND_PERIODS} x send_timeout)",
    )
