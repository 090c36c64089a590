"""Serves one role core over HTTP (aiohttp), so each role can run in its own process.

The I/O adapter of the sans-I/O cores. Per request: verify the call's signature
(``identity.verify_call``; bad, expired or replayed → 401; the replay guard full → 503), decode
the Candid argument (malformed → 400), dispatch to the core with the verified caller (pure CPU
work on the event loop; a caller over a rate whose result has no error for it,
``RateLimited`` → 429 with ``Retry-After``), wait until the actions the core queued have been
performed, encode the result.

Actions (``actions.py``) are performed in the order the core queued them by one task:
storage actions run on a worker thread (``asyncio.to_thread``) through the role's
``StreamsStore`` — an fsync never stalls the event loop, and the actions of every request queued
meanwhile go to the store together (one group commit) — and their results go back to the core
(``on_result``). Calls are handed, in order, to a sender task that signs them with the role's
own key and posts them to the URL the directory gives for the target principal, over one
HTTP/1.1 connection per target (``_Pipe``): consecutive calls to the same target and method are
pipelined (``pipeline`` in flight, handled and answered in order), any other call waits until
those in flight are answered; replies go back to the core (``on_reply``) in call order.
Nothing queued after a storage action — a call, or the reply to the request that caused it —
leaves before that action is done. A publisher, broadcaster or orchestrator is pumped by
another task. A storage action that fails leaves the core ahead of
its log: the server answers 503 from then on (restart it; the state is rebuilt from the log).

Besides the ICRC methods, two local methods serve the CLI and tests (Candid too):
``loglake_publish`` (publisher; caller must be the publisher itself) and ``loglake_inbox``
(subscriber; caller must be the subscriber itself). ``loglake_inbox`` is at least once: it
returns the oldest notifications without removing them, at most ``max_inbox_reply_bytes`` of
them, with a cursor; a notification is removed when a later call acknowledges that cursor, so
a reply that never reached its reader (too long for it, failed, or cut off) is sent again.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import signal
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from icp_principal import Principal

from loglake.errors import DecodeError, LoglakeError, shown
from loglake.events import fastcodec
from loglake.events.actions import Action, AppendEvents, Call, JobAction
from loglake.events.broadcaster import Broadcaster
from loglake.events.client import MAX_REPLY_BYTES
from loglake.events.codec import METHODS
from loglake.events.identity import (
    Identity,
    PrincipalError,
    ReplayCacheFull,
    ReplayGuard,
    SignatureError,
    principal_from_text,
    verify_call,
)
from loglake.events.orchestrator import Orchestrator
from loglake.events.publisher import Publisher, publication_config
from loglake.events.resend import CallRefused, NoAddress
from loglake.events.role import RateLimited, Role
from loglake.events.store import ReplayJobs, StreamsStore, perform_job
from loglake.events.subscriber import InboxCursorError, Subscriber
from loglake.streams.descriptors import CONNECTIONS, raise_soft_limit

log = logging.getLogger("loglake.events.server")

ALL_METHODS = METHODS
LOCAL_METHODS = (
    "loglake_publish",
    "loglake_register",
    "loglake_registrations",
    "loglake_inbox",
)


class Forbidden(LoglakeError):
    pass


MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body a role reads (``--max-body-bytes``); a longer one is answered 413
before it is decoded. The IC caps a message at 2 MB and loglake's publisher splits its
``icrc72_publish`` calls at 1 MB of event data (``publisher.MAX_MESSAGE_BYTES``); the
notification batches a Broadcaster makes of them add about 100 bytes an event. 8 MiB leaves
room for those and for merged batches, where the old 256 MiB let one client pin that much
memory per request."""
DECODE_OFF_LOOP_BYTES = 64 * 1024
"""Bodies at least this long are decoded in a worker thread so the event loop keeps serving
other clients meanwhile (a 1 MB batch takes milliseconds to decode)."""
MAX_INBOX_REPLY_BYTES = 64 * 1024 * 1024
"""The most notification bytes one ``loglake_inbox`` reply carries (at least one notification,
whatever its size: at most a request body, ``MAX_BODY_BYTES``). A quarter of the client's
``client.MAX_REPLY_BYTES``, which refuses a longer reply whole: a node's reader asking for
1,000 notifications of up to 1 MB each got a reply it could only drop."""
PIPELINE = 4
"""Calls to one target, of one method, in flight at once (HTTP/1.1 pipelining on one
connection: the receiver handles a connection's requests one after the other, in order)."""
CALL_TIMEOUT_S = 120.0
SEND_TIMEOUT_S = 30.0
"""How long a call's bytes may wait for its target to take them (``_Pipe.send``) before the
target is treated as hung. Why: a target that accepted the connection but never read (hostile,
or stopped) filled the socket's buffers with ~3 MB of calls, and the sender task then waited in
``drain`` for good: every later call of the role, to any target, stuck behind it (closing the
connection did not end that wait: asyncio's ``close`` waits for the unsent bytes first). A
bound on the whole wait, not on a wait without progress: a target taking a few KB a second
would otherwise hold the sender for as long as its calls last (minutes per 32 MB pipelined).
So a target slower than ~280 KB/s on the longest call (``MAX_BODY_BYTES``, 8 MB), or busy for
30 s with calls pipelined behind the one it handles, is hung too: the sender cannot wait on it
without every other target waiting as well."""
CONNECT_TIMEOUT_S = 10.0
"""How long opening a connection to a target may take before its calls fail with
``ConnectionError`` (unreachable: sent again with back-off by the core). Why: a target whose
SYNs are dropped (a full accept queue, a filtered port) held the sender for the system's 2
minutes of SYN retries, every other call of the role waiting behind it."""
UNREACHABLE_S = 30.0
"""After a connection that did not open within ``CONNECT_TIMEOUT_S``, the target's calls fail
at once (``ConnectionError``) for this long instead of each waiting ``CONNECT_TIMEOUT_S`` on
the role's sender: the calls queued for it, and their resends, would wait one after the other."""
IDLE_S = 30.0
"""A connection idle this long is reopened before use (aiohttp closes idle ones after 75 s)."""
LANE_DEPTH = 2
"""Unordered calls to one target sent and not yet answered (``HttpRoleServer._unordered``),
at most. Why so few: each is signed as it leaves, and its target reaches it only once it has
handled those ahead of it on the connection; with ``LANE_DEPTH - 1`` of them taking up to
``CALL_TIMEOUT_S`` (120 s) each, the last must still be within its signature's validity
(``identity.MAX_EXPIRY_NS // 2``, 150 s), or the subscriber refuses it as expired (401, final:
its notifications given up, the subscriber stalled, though it answered every call)."""
MAX_CONNECTIONS = 512
"""Connections a role server keeps open at once (``RoleRunner``): one past it is aborted as it
is accepted. Why: aiohttp has no such bound, and 200 connections of a client sending half a
request each took a role's (or a node's, whose stream server and log share the process's
descriptors) last descriptors: a signed call of another client timed out."""
MAX_CONNECTIONS_PER_PEER = 128
"""Connections from one IP address a role server keeps open at once (``RoleRunner``; one past
it is aborted as it is accepted): a quarter of ``MAX_CONNECTIONS``, as the stream server's and
the node's HTTP server's caps are, so one client cannot hold every connection. Roles call each
other over one connection per target (``_Pipe``), so the roles of a node, all on loopback, use
a handful. Found from outside on the node's HTTP server: 512 connections from one client that
sent a head and no body locked every other client out."""
KEEPALIVE_S = 75.0
"""A role server's connection idle, or with a request head unfinished, this long is closed
(aiohttp's keep-alive timer, which runs from the connection's start since aiohttp 3.14.4,
the oldest this project takes; ``RoleRunner`` sets it: ``web.AppRunner``'s default is 3630 s,
and a connection that sent nothing was kept an hour). Above the client's ``IDLE_S``, so a
pipe never reuses a connection the server is closing."""
BODY_TIMEOUT_S = 30.0
"""How long a request's body may take to arrive (then 408 and the connection closed): a
client sending a body a byte at a time held its handler, and what it had sent of
``MAX_READING_BYTES``, for good."""
MAX_READING_BYTES = 64 * 1024 * 1024
"""Request bodies a role server holds at once, all connections together (each counted as its
bytes arrive, until its answer: a declared length holds nothing); a call whose next bytes
would pass it is answered 503 with ``Retry-After`` at once (one call alone always goes: the
body limit may be set above this). Why: each handler read up to ``MAX_BODY_BYTES`` before the
signature could be checked (it signs the body), so 40 connections sending 8 MB bodies took a
role from 105 to 448 MB, and more took the process's memory."""
MAX_PIPE_REPLY_BYTES = MAX_REPLY_BYTES
"""The longest reply body a role reads from another role (``_Pipe``), the client's limit
(``client.MAX_REPLY_BYTES``): a reply declaring more is refused from its ``Content-Length``
before a byte of its body is read. The body is buffered whole, so a peer declaring 2 GB (hostile
or broken) made the role buffer whatever it sent until memory ran out; a role's own replies to
role calls (counts, one short result per item of a batch) are far shorter."""


class RoleRunner(web.AppRunner):
    """``web.AppRunner`` of a role server: at most ``MAX_CONNECTIONS`` open connections,
    ``MAX_CONNECTIONS_PER_PEER`` of them from one IP address, each holding a place in the
    process's budget (``streams.descriptors.CONNECTIONS``; one past any aborted as it is
    accepted: aiohttp has no option for it), the keep-alive timer at
    ``KEEPALIVE_S``, bodies as sent, no lingering read of a refused request's body. The node's
    roles and ``loglake events serve`` (``serve_role``) run on it."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", KEEPALIVE_S)
        # bodies as sent: no role sends a Content-Encoding, and aiohttp's decompression let
        # a few KB of gzip become MB held past MAX_READING_BYTES (which counts what arrives)
        kwargs.setdefault("auto_decompress", False)
        # a request answered before its body was read (408, 413, 503) closes its connection
        # at once: aiohttp read the rest for 10 s first, a slow client's handler held so long
        kwargs.setdefault("lingering_time", 0)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        made, lost = server.connection_made, server.connection_lost
        counted: dict[Any, str] = {}  # the handlers holding a place in CONNECTIONS: their peer
        per_peer: collections.Counter[str] = collections.Counter()

        def capped(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            peername = transport.get_extra_info("peername")
            peer = str(peername[0]) if peername else "?"
            if (
                len(server.connections) > MAX_CONNECTIONS
                or per_peer[peer] >= MAX_CONNECTIONS_PER_PEER
                or not CONNECTIONS.admit()
            ):
                # after the handler has started: aborted at once, its start() found the
                # connection gone and logged an AssertionError for each one refused
                asyncio.get_running_loop().call_soon(transport.abort)
            else:
                counted[handler] = peer
                per_peer[peer] += 1

        def released(handler: Any, exc: BaseException | None) -> None:
            peer = counted.pop(handler, None)
            if peer is not None:
                per_peer[peer] -= 1
                if per_peer[peer] <= 0:
                    del per_peer[peer]
                CONNECTIONS.release()
            lost(handler, exc)

        server.connection_made = capped  # type: ignore[method-assign]
        server.connection_lost = released  # type: ignore[method-assign,assignment]
        return server


class CannotListen(LoglakeError):
    """``serve_role`` could not listen on its address: the port taken, a port below 1024
    without the right, an address not on this machine. Why typed: the ``OSError`` of the bind
    reached ``loglake events serve``'s user as a 30-line traceback, after a banner that said
    the role was serving."""

    def __init__(self, host: str, port: int, e: OSError) -> None:
        # asyncio's message repeats the address ("error while attempting to bind on ..."); a
        # name that does not resolve is a gaierror, whose negative errno os.strerror lacks
        errno = e.errno if isinstance(e.errno, int) and e.errno > 0 else None
        reason = os.strerror(errno) if errno else e.strerror or str(e)
        reason = reason[:1].lower() + reason[1:]
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
        self.host, self.port, self.errno = host, port, e.errno


def serve_role(
    app: web.Application, host: str, port: int, listening: Callable[[], None] | None = None
) -> None:
    """Serve a role's app on ``host:port`` on a ``RoleRunner`` until SIGINT or SIGTERM, then
    stop as ``web.run_app`` does: the requests in flight answered first (the runner's
    ``shutdown_timeout``), then the role's tasks. ``listening`` is called once the port is
    bound (``events serve`` prints its banner then); an address it cannot listen on is
    :class:`CannotListen`."""

    raise_soft_limit()

    async def main() -> None:
        runner = RoleRunner(app)
        await runner.setup()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            try:
                await web.TCPSite(runner, host, port).start()
            except OSError as e:
                raise CannotListen(host, port, e) from None
            if listening is not None:
                listening()
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


class _Pipe:
    """One HTTP/1.1 connection to a role, requests pipelined: written in order, answered in
    order (RFC 9112 §9.3.2). Why not aiohttp's client: it sends at most one request per
    connection at a time, so keeping a target's calls in order meant waiting for each reply
    before sending the next — the replay data plane stalled on every round trip.
    Only ``Content-Length`` replies are read (aiohttp's ``web.Response`` writes them); anything
    else, or a broken connection, fails every call in flight on it with ``ConnectionError``."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ConnectionError(f"cannot call {url!r}: not an http(s) URL")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = u.scheme == "https"
        self.prefix = u.path.rstrip("/")
        self.authority = u.netloc
        self.writer: asyncio.StreamWriter | None = None
        self.waiting: collections.deque[asyncio.Future[tuple[int, bytes]]] = collections.deque()
        self.reader_task: asyncio.Task[None] | None = None
        self.used = 0.0
        self.unreachable_until = 0.0
        self.turn: asyncio.Future[None] | None = None
        """Done when the last send begun has written its request (or failed): each send waits
        for the one begun before it, so requests go out in the order ``send`` was called, though
        their senders run apart (the role's ordered sender, its lanes' senders)."""

    async def _open(self) -> None:
        fresh = self.waiting or asyncio.get_running_loop().time() - self.used <= IDLE_S
        if self.writer is not None and not self.writer.is_closing() and fresh:
            return
        self.close()
        loop = asyncio.get_running_loop()
        if loop.time() < self.unreachable_until:
            raise ConnectionError(
                f"no connection to {self.authority} within {CONNECT_TIMEOUT_S:g} s "
                f"(tried again from {UNREACHABLE_S:g} s after)"
            )
        ctx = ssl.create_default_context() if self.ssl else None
        cm = asyncio.timeout(CONNECT_TIMEOUT_S)
        try:
            async with cm:
                reader, self.writer = await asyncio.open_connection(self.host, self.port, ssl=ctx)
        except TimeoutError:
            if not cm.expired():  # the system's own (ETIMEDOUT)
                raise
            self.unreachable_until = loop.time() + UNREACHABLE_S
            raise ConnectionError(
                f"no connection to {self.authority} within {CONNECT_TIMEOUT_S:g} s"
            ) from None
        self.reader_task = asyncio.create_task(self._read(reader, self.writer))

    def send(
        self, method: str, body: bytes, headers: dict[str, str]
    ) -> Coroutine[Any, Any, asyncio.Future[tuple[int, bytes]]]:
        """Take the request's turn on the connection now; the coroutine writes it once the
        requests begun before it are written, and returns a future that resolves to ``(status,
        body)``. A target that does not take the request's bytes within ``SEND_TIMEOUT_S`` is
        hung: the connection is dropped and this call and every call in flight on it fail with
        ``TimeoutError`` (none was answered; the core treats them as timed out)."""
        before, self.turn = self.turn, asyncio.get_running_loop().create_future()
        return self._send(before, self.turn, method, body, headers)

    async def _send(
        self,
        before: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
        method: str,
        body: bytes,
        headers: dict[str, str],
    ) -> asyncio.Future[tuple[int, bytes]]:
        try:
            if before is not None:
                await asyncio.wait([before])  # (a cancelled wait leaves ``before`` as it is)
            return await self._write(method, body, headers)
        finally:
            if not mine.done():
                mine.set_result(None)

    async def _write(
        self, method: str, body: bytes, headers: dict[str, str]
    ) -> asyncio.Future[tuple[int, bytes]]:
        await self._open()
        assert self.writer is not None
        head = [f"POST {self.prefix}/api/{method} HTTP/1.1", f"Host: {self.authority}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head.append(f"Content-Length: {len(body)}")
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_consume)
        self.waiting.append(fut)
        self.writer.writelines([("\r\n".join(head) + "\r\n\r\n").encode("latin-1"), body])
        self.used = asyncio.get_running_loop().time()
        cm = asyncio.timeout(SEND_TIMEOUT_S)  # no task, no turn of the loop when nothing waits
        try:
            async with cm:
                await self.writer.drain()
        except TimeoutError:
            if not cm.expired():  # the system's own (ETIMEDOUT): the connection's error
                raise
            self._drop(
                TimeoutError(
                    f"{self.authority} did not take a call's bytes within {SEND_TIMEOUT_S:g} s: "
                    "treated as hung"
                )
            )
        return fut

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        err: BaseException = ConnectionError("connection closed")
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                status = int(lines[0].split(" ", 2)[1])
                fields: dict[str, str] = {}
                for line in lines[1:]:
                    k, sep, v = line.partition(":")
                    if sep:
                        k = k.strip().lower()
                        # a field sent twice is one list ("5, 5"): not a length, refused below
                        fields[k] = f"{fields[k]}, {v.strip()}" if k in fields else v.strip()
                if "content-length" not in fields or "chunked" in fields.get(
                    "transfer-encoding", ""
                ):
                    raise ConnectionError(f"reply without Content-Length: {lines[0]!r}")
                data = await reader.readexactly(_body_length(fields["content-length"]))
                if not self.waiting:
                    raise ConnectionError("a reply nobody asked for")
                fut = self.waiting.popleft()
                if not fut.done():
                    fut.set_result((status, data))
                if fields.get("connection", "").lower() == "close":
                    break
        except asyncio.CancelledError:
            err = ConnectionError("connection closed")
        except asyncio.LimitOverrunError:  # a head past the reader's limit (64 KiB)
            err = ConnectionError("reply head over 64 KiB without its end")
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
            err = e if isinstance(e, ConnectionError) else ConnectionError(f"{e!r}")
        finally:
            # aborted, not closed: close would keep the connection, and a drain waiting on
            # it, until a target that stopped reading took the unsent bytes
            writer.transport.abort()
            if self.writer is writer:
                self.writer = None
                while self.waiting:
                    f = self.waiting.popleft()
                    if not f.done():
                        f.set_exception(err)

    def close(self) -> None:
        self._drop(ConnectionError("connection closed"))

    def _drop(self, err: BaseException) -> None:
        """The connection aborted (its unsent bytes discarded: a ``drain`` waiting on a target
        that does not read returns at once, where ``close`` would wait to send them first) and
        every call in flight on it failed with ``err``."""
        if self.reader_task is not None:
            self.reader_task.cancel()
            self.reader_task = None
        if self.writer is not None:
            self.writer.transport.abort()
            self.writer = None
        while self.waiting:
            f = self.waiting.popleft()
            if not f.done():
                f.set_exception(err)


def _body_length(value: str) -> int:
    """A reply's ``Content-Length``, checked before its body is read: ASCII digits only (``int``
    also takes a sign, ``_`` and other scripts' digits), at most :data:`MAX_PIPE_REPLY_BYTES`;
    else ``ConnectionError`` naming the problem."""
    if not (value.isascii() and value.isdigit()):
        raise ConnectionError(f"reply with Content-Length {shown(value)}: not a byte count")
    n = int(value)
    if n > MAX_PIPE_REPLY_BYTES:
        raise ConnectionError(
            f"reply of {n} bytes (its Content-Length), over the limit of {MAX_PIPE_REPLY_BYTES}"
        )
    return n


class HttpRoleServer:
    def __init__(
        self,
        role: Role,
        identity: Identity,
        directory: dict[bytes, str],
        store: StreamsStore | None = None,
        clock: Callable[[], int] = time.time_ns,
        throttle_s: float = 0.0,
        jobs: ReplayJobs | None = None,
        replays: ReplayGuard | None = None,
        pipeline: int = PIPELINE,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_inbox_reply_bytes: int = MAX_INBOX_REPLY_BYTES,
    ) -> None:
        if pipeline < 1:
            raise ValueError("pipeline must be >= 1")
        if max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if max_inbox_reply_bytes < 1:
            raise ValueError("max_inbox_reply_bytes must be >= 1")
        self.max_inbox_reply_bytes = max_inbox_reply_bytes
        self.inbox_base = clock()
        """Added to the inbox's numbers to make ``loglake_inbox``'s cursors: the clock at start,
        so a cursor a reader kept from an earlier run of this subscriber (numbered from an
        earlier clock, at most one a nanosecond) acknowledges nothing here rather than
        notifications this run holds that the reader never saw."""
        self.throttle_s = throttle_s
        self.replays = replays if replays is not None else ReplayGuard()
        """Signed calls accepted and not yet expired: a second use is refused (401)."""
        self.jobs = jobs
        """Performs replay job actions (an orchestrator's Spark jobs, a
        broadcaster's reads of their output), off the event loop like storage."""
        self.store = store
        self.batches: list[tuple[list[Action], asyncio.Future[dict[Action, Any]]]] = []
        self.kick = asyncio.Event()
        self.failed: BaseException | None = None
        if role.principal != identity.principal:
            raise ValueError("the role's principal must be the identity's")
        self.role, self.identity, self.directory, self.clock = role, identity, directory, clock
        if isinstance(role, Orchestrator):  # a replay for a subscriber not listed is refused
            role.reachable = self._listed
        self.queue: asyncio.Queue[Call] = asyncio.Queue()
        self.tasks: list[asyncio.Task[Any]] = []
        self.pipeline = pipeline
        self.pipes: dict[str, _Pipe] = {}
        self.replies: asyncio.Queue[tuple[Call, asyncio.Future[Any]]] = asyncio.Queue()
        self.inflight: tuple[bytes, str] | None = None
        """(target, method) of the calls in flight; ``inflight_n`` of them."""
        self.inflight_n = 0
        self.settled = asyncio.Event()
        self.lanes: dict[bytes, _Lane] = {}
        """The unordered calls to each target still queued, sent or unanswered (``_unordered``)."""
        self.wake = asyncio.Event()
        self.decoder = concurrent.futures.ThreadPoolExecutor(1, "candid-decode")
        """One worker: large bodies decode off the loop, and in the order they arrived."""
        self.decoding = 0
        """Decodes queued on ``decoder``; while any is, small bodies queue behind them too: a
        role's calls reach its core in the order they arrived, whoever sent them. Callers can
        be causally related: the orchestrator's subscription assignment to a broadcaster
        follows the publisher's events it has seen; decoded ahead of the publisher's large
        batches still queued here, it made the broadcaster send the new subscriber every older
        event (a change that let other callers' small bodies pass failed the end-to-end test
        8 times in 10). What one body can hold the others up is bounded by its size instead
        (the decoder's work is linear in the body's size, ``candid._Skips``: a hostile body
        costs about what an honest one of its size does)."""
        self.max_body_bytes = max_body_bytes
        self.reading = 0
        """Bytes of request bodies held now (``MAX_READING_BYTES``)."""
        self.app = web.Application(client_max_size=max_body_bytes)
        self.app.router.add_post("/api/{method}", self.handle)
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    def _listed(self, p: Principal) -> bool:
        return p.bytes in self.directory

    # -- serving ---------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["method"]
        m = ALL_METHODS.get(name)
        if m is None or (name not in self.role.methods and name not in self._local()):
            return web.Response(status=404, text=f"no method {name}")
        parts: list[bytes] = []
        try:
            refused = await self._read_body(request, parts)
            if refused is not None:
                refused.force_close()  # the rest of its body is not read
                return refused
            return await self._answer(name, m, request, b"".join(parts))
        finally:
            self.reading -= sum(map(len, parts))

    async def _read_body(self, request: web.Request, parts: list[bytes]) -> web.Response | None:
        """The request's body into ``parts`` as it arrives, each chunk counted in ``reading``
        (``MAX_READING_BYTES``) when it is in: bytes a client declared and never sent hold
        nothing. A refusal is returned: 503 past the budget, 408 past ``BODY_TIMEOUT_S``, 400
        when the client left; past the body limit, aiohttp's own 413 (``request.read``'s)."""
        got = 0
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                async for chunk in request.content.iter_any():
                    if got + len(chunk) > self.max_body_bytes:
                        raise web.HTTPRequestEntityTooLarge(
                            max_size=self.max_body_bytes, actual_size=got + len(chunk)
                        )
                    # other calls hold bytes (``reading`` counts this one's ``got`` too)
                    if self.reading > got and self.reading + len(chunk) > MAX_READING_BYTES:
                        return web.Response(
                            status=503,
                            text="busy: other calls' bodies are being read",
                            headers={"retry-after": "1"},
                        )
                    self.reading += len(chunk)
                    got += len(chunk)
                    parts.append(chunk)
        except TimeoutError:
            return web.Response(
                status=408, text=f"the body did not arrive within {BODY_TIMEOUT_S:g} s"
            )
        except ConnectionError:  # the client left mid-body (aiohttp logged a traceback)
            return web.Response(status=400, text="the connection closed mid-body")
        return None

    async def _answer(self, name: str, m: Any, request: web.Request, body: bytes) -> web.Response:
        if self.failed is not None:
            return web.Response(status=503, text=f"storage failed; restart the role: {self.failed}")
        now = self.clock()
        try:
            hdrs = {k.lower(): v for k, v in request.headers.items()}
            caller = verify_call(name, body, hdrs, now, self.replays)
        except SignatureError as e:
            return web.Response(status=401, text=str(e))
        except ReplayCacheFull as e:
            return web.Response(status=503, text=str(e), headers={"retry-after": "5"})
        try:
            if len(body) >= DECODE_OFF_LOOP_BYTES or self.decoding:
                self.decoding += 1
                try:
                    loop = asyncio.get_running_loop()
                    arg = await loop.run_in_executor(self.decoder, m.decode_arg, body)
                finally:
                    self.decoding -= 1
            else:
                arg = m.decode_arg(body)
        except DecodeError as e:
            return web.Response(status=400, text=f"malformed Candid argument: {e}")
        try:
            if name in LOCAL_METHODS:
                ret = self._local()[name](caller, arg, now)
            else:
                ret = self.role.dispatch(caller, name, arg, now)
        except Forbidden as e:
            self.drain()
            return web.Response(status=403, text=str(e))
        except RateLimited as e:
            self.drain()
            wait = str(max(1, math.ceil(e.retry_after_s)))
            return web.Response(status=429, text=str(e), headers={"retry-after": wait})
        except LoglakeError as e:
            self.drain()
            return web.Response(status=400, text=f"{type(e).__name__}: {e}")
        try:
            results = await self.drain()
        except Exception as e:  # any storage failure: the role stops serving
            return web.Response(status=503, text=f"storage failed: {e}")
        if isinstance(ret, AppendEvents):  # loglake_publish: the ids the stream assigned
            ret = results[ret]
        try:
            out = m.encode_ret(ret)
        except LoglakeError as e:
            return web.Response(status=400, text=f"{type(e).__name__}: {e}")
        return web.Response(body=out, content_type="application/candid")

    def _local(self) -> dict[str, Callable[..., Any]]:
        out: dict[str, Callable[..., Any]] = {}
        if isinstance(self.role, Publisher):
            out["loglake_publish"] = self._publish
            out["loglake_register"] = self._register
            out["loglake_registrations"] = self._registrations
        if isinstance(self.role, Subscriber):
            out["loglake_inbox"] = self._inbox
        return out

    def _publish(self, caller: Any, arg: Any, now: int) -> AppendEvents:
        if caller != self.role.principal:
            raise Forbidden("only the publisher itself may publish")
        ns, items = arg
        assert isinstance(self.role, Publisher)  # only a publisher's server routes here
        return self.role.publish(ns, items, now)

    def _register(self, caller: Any, arg: Any, now: int) -> str:
        if caller != self.role.principal:
            raise Forbidden("only the publisher itself may register its namespaces")
        ns, price = arg
        assert isinstance(self.role, Publisher)  # only a publisher's server routes here
        self.role.register(ns, publication_config(price), now)
        return self.role.registrations[ns].state

    def _registrations(self, caller: Any, namespaces: list[str], now: int) -> list[tuple]:
        if caller != self.role.principal:
            raise Forbidden("only the publisher itself may read its registrations")
        assert isinstance(self.role, Publisher)  # only a publisher's server routes here
        return [
            (ns, st.state, st.attempts, st.last_error or "")
            for ns, st in sorted(self.role.registrations.items())
            if not namespaces or ns in namespaces
        ]

    def _inbox(
        self, caller: Any, arg: tuple[int, int], now: int
    ) -> tuple[int, fastcodec.EncodedNotes]:
        """Remove what the caller acknowledges (``ack``: a cursor it was given, or 0), then
        the oldest ``n`` notifications within the reply budget, written here and removed only
        when a later call acknowledges the returned cursor."""
        if caller != self.role.principal:
            raise Forbidden("only the subscriber itself may read its inbox")
        sub = self.role
        assert isinstance(sub, Subscriber)  # only a subscriber's server routes here
        ack, n = arg
        base = self.inbox_base
        try:
            sub.acknowledge(max(0, ack - base))  # below base: nothing, or an earlier run's
        except InboxCursorError:
            raise InboxCursorError(
                f"inbox cursor {ack} is past this inbox's {base + sub.inbox_seq} (another "
                "subscriber's, or from a run whose clock was ahead): acknowledge 0"
            ) from None
        parts: list[bytes] = []

        def size(note: Any) -> int:  # written once: counted here, sent as written
            parts.append(fastcodec.notification_bytes(note))
            return len(parts[-1])

        notes = sub.peek(n, self.max_inbox_reply_bytes, size)
        del parts[len(notes) :]  # the one that did not fit
        return base + sub.inbox_first + len(notes), fastcodec.EncodedNotes(parts)

    # -- performing actions -------------------------------------------------------------------
    def drain(self) -> asyncio.Future[dict[Action, Any]]:
        """Hand the core's queued actions to the performer; the future resolves (to the results
        of the storage actions) once they and everything queued before them are performed."""
        fut: asyncio.Future[dict[Action, Any]] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_consume)
        self.batches.append((self.role.take_outbox(), fut))
        self.kick.set()
        self.wake.set()
        return fut

    async def _performer(self) -> None:
        while True:
            await self.kick.wait()
            self.kick.clear()
            while self.batches:
                batches, self.batches = self.batches, []
                actions = [a for acts, _ in batches for a in acts]
                try:
                    results = await self._perform(actions)
                except Exception as e:  # the core is now ahead of its log
                    log.exception("storage action failed; the role stops serving")
                    self.failed = e
                    for _, fut in [*batches, *self.batches]:
                        fut.set_exception(e)
                    self.batches = []
                    continue
                for _, fut in batches:
                    fut.set_result(results)
                self.wake.set()  # results may have made work for the pump (a replay's bounds)

    async def _perform(self, actions: list[Action]) -> dict[Action, Any]:
        results: dict[Action, Any] = {}
        work = collections.deque(actions)
        while work:
            a = work.popleft()
            if isinstance(a, Call):
                self.queue.put_nowait(a)
                continue
            if isinstance(a, JobAction):
                r = await asyncio.to_thread(perform_job, self.jobs, a)
                results[a] = r
                self.role.on_result(a, r, self.clock())
                work.extendleft(reversed(self.role.take_outbox()))
                continue
            group: list[Action] = [a]
            while work and not isinstance(work[0], Call | JobAction):
                group.append(work.popleft())
            if self.store is None:
                raise RuntimeError(f"{type(self.role).__name__} queued {a!r} and has no store")
            got = await asyncio.to_thread(self.store.perform_many, group)
            now = self.clock()
            for g, r in zip(group, got, strict=True):
                assert not isinstance(g, Call)
                results[g] = r
                self.role.on_result(g, r, now)
            work.extendleft(reversed(self.role.take_outbox()))  # consequences come first
        return results

    # -- sending ---------------------------------------------------------------------------
    async def _start(self, app: web.Application) -> None:
        self.tasks = [
            asyncio.create_task(self._sender()),
            asyncio.create_task(self._replier()),
            asyncio.create_task(self._performer()),
        ]
        if isinstance(self.role, Publisher | Broadcaster | Orchestrator | Subscriber):
            # replays; relay resends; an orchestrator's resends after a restart; resends of
            # failed calls (a subscriber's confirmations)
            self.tasks.append(asyncio.create_task(self._pumper()))
        self.drain()

    async def _stop(self, app: web.Application) -> None:
        self.decoder.shutdown(wait=False, cancel_futures=True)
        tasks = [*self.tasks, *(t for lane in self.lanes.values() for t in lane.tasks)]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in self.pipes.values():
            p.close()

    def _post(self, c: Call) -> Coroutine[Any, Any, asyncio.Future[tuple[int, bytes]]]:
        """Encode and sign one call and take its turn on its target's connection now; the
        coroutine writes it, and its future resolves to the HTTP reply."""
        url = self.directory.get(c.target.bytes)
        if url is None:
            raise NoAddress(c.target)
        body = METHODS[c.method].encode_arg(c.arg)
        headers = self.identity.sign_call(c.method, body, self.clock())
        pipe = self.pipes.get(url)
        if pipe is None:
            pipe = self.pipes[url] = _Pipe(url)
        return pipe.send(c.method, body, {"content-type": "application/candid", **headers})

    async def _sender(self) -> None:
        """Calls leave in the order they were queued. Consecutive calls to the same target and
        method are pipelined (``pipeline`` in flight); any other call waits until every call in
        flight is answered — so a role that tells one role something, then another, still
        knows the first has handled it before the second hears of it.

        A call marked ``ordered=False`` (a notification to a subscriber, a progress report)
        goes to its target's lane (``_unordered``): it holds nothing up and waits for nothing
        but the unordered calls to its own target queued before it (one that ``waits`` first
        waits, as an ordered call would, for the ordered calls in flight). Why: a subscriber
        that answered each notification just before ``CALL_TIMEOUT_S`` held every call of its
        broadcaster, to every other subscriber, that long (and was never stalled: it
        answered)."""
        while True:
            c = await self.queue.get()
            if not c.ordered:
                while c.waits and self.inflight_n:  # (``Call.waits``)
                    self.settled.clear()
                    await self.settled.wait()
                self._unordered(c)
                continue
            key = (c.target.bytes, c.method)
            while self.inflight_n and (self.inflight != key or self.inflight_n >= self.pipeline):
                self.settled.clear()
                await self.settled.wait()
            self.inflight, self.inflight_n = key, self.inflight_n + 1
            try:
                fut = await self._post(c)
            except Exception as e:  # the reply is the failure (the replier keeps the order)
                fut = _failed(e)
            self.replies.put_nowait((c, fut))

    def _unordered(self, c: Call) -> None:
        """Queue ``c`` on its target's lane: the lane's sender sends its calls in order, at
        most ``LANE_DEPTH`` unanswered, each signed as it leaves, and its replier hands their
        replies to the core in order, each waited for ``CALL_TIMEOUT_S``. Once one times
        out the target is hung: the calls still queued fail at once, timed out too, unsent
        (a hung subscriber's calls had gone out a few every ``CALL_TIMEOUT_S`` for as long
        as they lasted). The lane goes once it has nothing queued or unanswered."""
        key = c.target.bytes
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = _Lane()
            lane.tasks.add(asyncio.create_task(self._lane_replier(key, lane)))
        lane.queue.append(c)
        if lane.sender is None:
            lane.sender = asyncio.create_task(self._lane_sender(lane))
            lane.tasks.add(lane.sender)

    async def _lane_sender(self, lane: _Lane) -> None:
        try:
            while lane.queue:
                while lane.unanswered >= min(self.pipeline, LANE_DEPTH):
                    lane.room.clear()
                    await lane.room.wait()
                c = lane.queue.popleft()
                lane.unanswered += 1
                if lane.hung is not None:
                    fut = _failed(lane.hung)
                else:
                    try:
                        fut = await self._post(c)
                    except Exception as e:
                        fut = _failed(e)
                lane.replies.put_nowait((c, fut))
        finally:
            lane.tasks.discard(asyncio.current_task())
            lane.sender = None

    async def _lane_replier(self, key: bytes, lane: _Lane) -> None:
        try:
            while lane.unanswered or lane.queue or lane.sender is not None:
                c, fut = await lane.replies.get()
                reply = await self._settle(c, fut)
                if isinstance(reply, TimeoutError) and lane.hung is None:
                    lane.hung = reply
                lane.unanswered -= 1
                lane.room.set()
        finally:
            if self.lanes.get(key) is lane:
                del self.lanes[key]
            if lane.sender is not None:  # (only if the core raised: nobody would answer it)
                lane.sender.cancel()

    async def _replier(self) -> None:
        """Hands the ordered calls' replies to the core in the order the calls were sent."""
        while True:
            c, fut = await self.replies.get()
            await self._settle(c, fut)

    async def _settle(self, c: Call, fut: asyncio.Future[tuple[int, bytes]]) -> Any:
        """Wait for one call's reply (``CALL_TIMEOUT_S``) and hand it, or the failure, to the
        core; returns what it handed over."""
        reply: Any
        cm = asyncio.timeout(CALL_TIMEOUT_S)  # not wait_for: on 3.11 it can swallow a cancel
        try:
            async with cm:
                status, data = await asyncio.shield(fut)
            if status != 200:
                raise CallRefused(c.method, status, data)
            reply = METHODS[c.method].decode_ret(data)
        except Exception as e:  # the core decides what a failed call means
            reply = e
            if isinstance(e, TimeoutError) and cm.expired():
                # no reply in time (a call whose bytes the target did not take failed as
                # timed out in _Pipe.send, its connection dropped there already): the calls
                # in flight behind it fail as timed out too (the target is hung: a broadcaster
                # does not send them again)
                reply = TimeoutError(f"no reply within {CALL_TIMEOUT_S:g} s")
                url = self.directory.get(c.target.bytes)
                if url in self.pipes:
                    self.pipes[url]._drop(reply)
            log.warning("call %s to %s failed: %s", c.method, c.target, reply)
        if c.ordered:
            self.inflight_n -= 1
        self.role.on_reply(c, reply, self.clock())
        self.drain()
        self.settled.set()
        return reply

    def _jobs_finished(self) -> bool:
        """Hand the ends of the orchestrator's replay jobs to it."""
        if self.jobs is None or not isinstance(self.role, Orchestrator):
            return False
        done = self.jobs.finished()
        for rid, result in done:
            self.role.job_finished(rid, result, self.clock())
        return bool(done)

    async def _pumper(self) -> None:
        while True:
            if self.failed is None and (self._jobs_finished() | self.role.pump(self.clock())):
                with contextlib.suppress(Exception):  # a failure is logged by the performer
                    await self.drain()  # reads done before the next pump: bounded memory
                await asyncio.sleep(self.throttle_s)
            else:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):  # (wait_for could swallow a cancel)
                        await self.wake.wait()


def _failed(e: BaseException) -> asyncio.Future[Any]:
    """A call's reply that is ``e`` (a call that could not be sent)."""
    fut = asyncio.get_running_loop().create_future()
    fut.add_done_callback(_consume)  # a role stopping may never read it
    fut.set_exception(e)
    return fut


@dataclass
class _Lane:
    """The unordered calls to one target (``HttpRoleServer._unordered``)."""

    queue: collections.deque[Call] = field(default_factory=collections.deque)
    """Not sent yet."""
    unanswered: int = 0
    """Taken from ``queue`` and not yet handed to the core."""
    replies: asyncio.Queue[tuple[Call, asyncio.Future[Any]]] = field(default_factory=asyncio.Queue)
    room: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when an answer makes room under ``LANE_DEPTH``."""
    sender: asyncio.Task[None] | None = None
    """Running while ``queue`` holds calls."""
    hung: TimeoutError | None = None
    """Set once a call timed out: the rest fail with it, unsent."""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


def _consume(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (the performer logs it once)."""
    if not fut.cancelled():
        fut.exception()


class DirectoryError(DecodeError):
    """A directory file (``--directory``, ``[events] directory``) that is not a JSON object of
    principal → http(s) URL; the message names the file."""


def load_directory(path: str | Path) -> dict[bytes, str]:
    """``{"<principal text>": "http://127.0.0.1:PORT", ...}`` → ``{principal bytes: url}``.

    Checked whole before use: a file that is not JSON, not an object, or names a principal
    or URL badly is a ``DirectoryError`` naming the file (it stopped a node with a
    JSONDecodeError traceback)."""
    try:
        raw = json.loads(Path(path).read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DirectoryError(f"{path}: not a JSON directory: {e}") from None
    if not isinstance(raw, dict):
        raise DirectoryError(f"{path}: expected a JSON object {{principal: url}}")
    out = {}
    for k, v in raw.items():
        if not isinstance(v, str) or not v.startswith(("http://", "https://")):
            raise DirectoryError(f"{path}: {shown(k)}: expected an http(s) URL, got {shown(v)}")
        try:
            out[principal_from_text(k).bytes] = v.rstrip("/")
        except PrincipalError as e:
            raise DirectoryError(f"{path}: {shown(k)}: {e}") from None
    return out
