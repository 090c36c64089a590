"""asyncio TCP adapter of the stream service: Ockam TCP framing in, ``StreamService`` core, out.

Per connection a sans-I/O ``TcpConnection`` (``loglake.wire.ockam``) turns bytes into routing
messages; the server hands every message that arrived in one iteration of the event loop — from
all connections — to the core as one ``Batch`` and performs the actions it asks for
(``loglake.streams.service.perform``). Everything that arrived during one fsync is the next group
commit: that is how many small pushes share one append, and one fsync.
One partition's pushes stay in one append, in arrival order.

The event loop is the core's thread (docs/streams.md, Performance). The core is Python and the
interpreter runs one thread's Python at a time, so a separate core thread bought no parallelism,
only hand-offs: a queue, a wake-up and a switch of the interpreter's lock per batch each way,
and the lock passing back and forth between the loop and the core under load. With both on one
thread, a client with 1,000 pushes in flight went 19% faster (median of 6 alternating pairs;
0.99–1.43×) and the code lost its inbox.

Pipelined group commit: a burst (more than ``INLINE_MAX`` messages), or any batch
while an earlier one waits for its fsync, is written with ``Log.append_payloads_then`` and the
loop goes on reading and writing the next batches while the log's sync thread fsyncs; the
outcome comes back to the loop (``_synced``) when the fsync that covers it has finished, and
only then are the confirms made and sent. So the disk syncs batch N while the loop decodes and
writes batch N+1. Batches are answered in the order they came (a later batch never overtakes an
earlier one, and a batch's pulls start only once it and every batch before it is durable, so a
pull still sees the pushes sent before it).

A few requests on an idle server (at most ``INLINE_MAX`` messages, nothing waiting for an
fsync) are appended, fsynced and answered here and now (for one-by-one latency; a lone
push without a ``Batch`` at all, ``_run_lone``). This is Redis's model for ``appendfsync
always``: the loop blocks on the fsync, and what other connections send meanwhile waits in
their sockets and becomes the next batch, one group commit. The loop gathers what every
connection sent in one of its iterations before it runs a batch (one ``call_soon``; at once
when only one connection is open), so concurrent one-by-one clients still share an fsync.
Appends to different partitions of such a batch run on a small thread pool so their fsyncs
overlap.

Pulls do not hold up pushes: the core leaves each pull's ``Read`` to the
adapter (``defer_reads``), which runs it on a separate pool of reader threads once the actions
before it in its batch are done (so a pull sees the pushes sent before it), while the next batch's
appends go on. Its reply is sent when it is ready.

Replies go back on the connection the request came from (each connection is its own Ockam TCP
handler, as ``transport/tcp/handler.ex`` is one worker per socket), and replies to one return
route of one connection keep request order, as they would from one Ockam worker's mailbox: a
reply waits only for earlier replies to the same return route (loglake's client gives each pull
its own return address, so its pushes never wait for its pulls). A request the server failed to
handle gets an ``error`` reply, never silence. A connection that breaks the protocol (bad version
byte, oversized or undecodable frame) is closed with its reason logged; the messages it sent
before the bad frame are still answered, and nothing else is affected.

Hostile and careless clients (``streams/limits.py``, docs/security.md): every bound a client
is held to is a field of ``ServerLimits``. Output is flow-controlled with asyncio's own
``pause_writing``/``resume_writing``: a connection whose replies go unread stops being read
and its pulls wait unread; incomplete frames and unsent replies of all connections have global
budgets; connections are capped in all and per peer address; a started frame must finish in
time; ``stop()`` (SIGTERM) ends within ``shutdown_timeout`` whatever the clients do.

TLS (docs/security.md): given an ``ssl.SSLContext`` (``streams/tls.py``), the server speaks the same
framing inside TLS 1.3. Each connection's ``Peer`` — the names of its verified client
certificate, or ``ANONYMOUS`` — goes with its messages into the core, which checks them against
the service's access policy and answers a refused request with an ``error`` reply naming the
refused action; the connection stays open. A failed handshake (no client certificate, one from
another CA) closes the connection before any message is read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import itertools
import logging
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Generic, TypeVar, cast

from loglake.streams import eventloop
from loglake.streams.descriptors import CONNECTIONS, soft_limit
from loglake.streams.limits import ServerLimits
from loglake.streams.permissions import ANONYMOUS, Peer, peer_from_certificate
from loglake.streams.service import Append, Batch, Outcome, PendingRead, StreamService, perform
from loglake.structured_logging import log_event
from loglake.wire.ockam import (
    ADDRESS_TYPE_LOCAL,
    Address,
    MessageRun,
    RoutingMessage,
    TcpConnection,
    frame_parts,
)

logger = logging.getLogger(__name__)

_S = TypeVar("_S")

APPEND_THREADS = 8
"""Partitions appended in parallel within one batch."""
READ_THREADS = 4
"""Pulls read at the same time, beside the appends."""
INLINE_MAX = 16
"""At most this many messages gathered in one loop iteration of an idle server are appended and
fsynced before the loop goes on (the one-by-one latency); more are pipelined, the fsync of one
batch overlapping the next batch's decoding and writing. Small enough that a client with a
window of pushes in flight gets the pipeline; large enough for a few one-by-one clients at
once."""
READS_PER_CONNECTION = 2
"""Pulls of one connection read at the same time; its others wait, unread (each reply is up to
``max_pull_bytes``: a connection must not hold the reader threads, or memory, for a backlog)."""
STARVED_RETRY = 0.01
"""Seconds before pulls held back by the output budget are tried again."""
EVICT_IDLE_AFTER = 1.0
"""Seconds a connection must have been silent (and owed nothing) before a new connection at a
cap may take its place (``StreamServer._evict_idlest``): a flood of new connections cannot
push out clients that are talking."""
INDEX_TURN = 512
"""Consumer-index requests of one connection taken into one turn of the event loop; what it sent
after them waits, in order and unread, for the next turn (``StreamServer._take_turn``). Found
from outside: one client's 8,000 pipelined ``SaveIndex`` in one write held every other client
24 s (an fsync each, all in one turn). The saves of a turn are one write and one fsync now
(``Log.index_ops``), but decoding and answering an index request is ~50 µs of Python (the
generic BARE codec; ~250 µs on a loaded 2-core machine), so a read's thousands still held
the loop a second; 512 a turn keeps that to a few tens of ms, and a bulk saver's requests
still share an fsync 512 at a time. Pushes are not counted: a burst of them is one append, the
server's throughput path."""
META_THREADS = 2
"""Stream service requests (CREATE, stream info) performed at the same time, off the loop."""
FRAME_CHUNK = 64
"""Replies framed at a time (``_Connection.send``): a connection goes at most this many frames
past ``connection_output`` (each carries its routes, which ``wire.ockam`` bounds at decode)."""
SMALL_PARTIAL = 64 * 1024
"""An incomplete frame up to this size is never held up by the input budget: a client sending
ordinary frames has at most this much of one between two reads."""
HELD_COST = 256
"""Bytes a message kept as an object (an unframed reply in ``backlog``, a request in
``held_msgs``) costs beyond its payload and its routes' address bytes: its ``RoutingMessage``,
its payload's and its return route's objects, a deque slot. Measured with ``tracemalloc`` on
the 4,096 INIT replies of a CREATE: 288 bytes each, of which 33 payload and 30 route bytes;
RSS grew ~340 bytes a reply. Counted as payload bytes alone (33), a client that never read
held 262 MiB where the output budget saw 25.7 MB."""
HELD_RUN_PAYLOAD_COST = 48
"""Bytes each payload of a ``MessageRun`` costs beyond its length (its ``bytes`` object and
list slot)."""
HELD_INPUT = 64 * 1024
"""Bytes of requests a connection may have waiting behind its stream service request
(``held_msgs``) before it is no longer read until that request is answered. Found from outside:
400 pushes of 4 MiB sent behind 15 slow CREATEs were all read and kept (server RSS peak
1,062 MiB against a ~512 MiB design bound). They are counted in ``input_budget`` too."""
OUTPUT_RECOUNT = 0.005
"""Seconds a sum of all connections' unsent bytes is reused (``output_budget``)."""
READ_BUFFER = 256 * 1024
"""Bytes one read may take (asyncio's own default)."""
LISTEN_BACKLOG = 1024
"""Connections the kernel completes and queues before the event loop accepts them. asyncio's
default (100) overflowed when 500 clients connected at once while the loop was busy: the
kernel drops the SYN of a connection that finds the queue full, and that client waits for
its retransmit (1 s, then 3 s …). Linux caps it at ``net.core.somaxconn``."""
GC_YOUNG_THRESHOLD = 100_000
"""The collector's youngest-generation threshold while a server that is the process runs
(``freeze_gc``); CPython's default is 700. Why: the push path allocates a few tracked
objects per message that live until their batch is confirmed (routing messages, decoded
tuples, reply lists), so at 700 a young collection ran every ~700 pushes, traversed the
batch in flight and promoted it, and the promoted batches then paid for middle collections:
measured about 90 young and 7 middle collections per 60,000 pushes (0.01-0.03 s of the
server's 0.6-0.8 s of CPU for them). Those objects are freed by their
reference counts; at 100,000 a young collection is rare (none in that run) and the cyclic
garbage it would find stays small."""


def _route_bytes(r: tuple[Address, ...]) -> int:
    return sum(len(a.value) for a in r)


def held_cost(m: RoutingMessage | MessageRun) -> int:
    """Bytes of memory ``m`` holds while it waits as an object (``HELD_COST``)."""
    routes = _route_bytes(m.onward_route) + _route_bytes(m.return_route) + HELD_COST
    if isinstance(m, MessageRun):
        return routes + sum(map(len, m.payloads)) + HELD_RUN_PAYLOAD_COST * len(m.payloads)
    return routes + len(m.payload)


class _Connection(asyncio.BufferedProtocol):
    """One Ockam TCP connection. A ``BufferedProtocol``: the transport receives into the
    server's one read buffer (``get_buffer``) and the frames are decoded from it at once
    (``buffer_updated``), instead of a fresh 256 KiB ``bytes`` per read — whose allocation
    above glibc's mmap threshold cost ~40 µs a read here (an mmap, an mremap, a munmap).

    Flow control (``ServerLimits``): the transport calls ``pause_writing`` once this
    connection's unsent replies pass ``connection_output`` and ``resume_writing`` once the peer
    has read them down to a quarter of it. While paused the connection is not read and its
    pulls wait unread in ``reads`` (a pull's reply is up to 8 MiB: a client that asks and never
    reads would otherwise have the server read its whole history into memory). When it
    closes, its waiting pulls are dropped at once."""

    def __init__(self, server: StreamServer) -> None:
        self.server = server
        self.wire = TcpConnection(server.limits.max_frame)
        self.transport: asyncio.Transport | None = None
        self.queued = 0
        self.closing = False
        self.closing_since: float | None = None
        """When a graceful close began (its replies still being sent): it must end within
        ``frame_timeout``, else the connection is dropped (``StreamServer._tick``)."""
        self.peer = "?"
        self.host = "?"
        """The peer's IP address (what ``max_connections_per_peer`` counts)."""
        self.serial = next(server._serials)
        """Order of arrival: among equal offenders, the newest is closed first."""
        self.accepted = False
        """Counted among the server's connections (False: refused at the door)."""
        self.identity: Peer = ANONYMOUS
        """Who proved to be on the other end (its client certificate's names)."""
        self.paused = False
        """Reading is paused (too many queued requests, or unsent replies)."""
        self.write_paused = False
        """The transport said its unsent bytes passed the high-water mark."""
        self.slots: dict[tuple[Address, ...], deque[list]] | None = None
        """While a deferred reply of this connection is outstanding: per return route, the
        requests to it not yet sent, in request order, as ``[return route, replies or None]``;
        the head of each is unanswered (a pull being read). Found from outside: one list of all
        of them, rescanned whenever a pull finished, cost the loop time quadratic in the pulls
        pipelined (8,000 pulls of one record: 39.9 s, 44 of 54 s of CPU in the rescans)."""
        self.held = 0
        """Slots answered but not sent: a later pull's reply waiting for an earlier one on the
        same return route (the read threads finish out of order)."""
        self.meta_busy = False
        """A request to the stream service (CREATE, stream info) of this connection is being
        performed off the loop, or is answered and its replies wait for the client to read them
        (``meta_waits``); what it sent after it waits in ``held_msgs``, in order."""
        self.meta_waits = False
        """The stream service request is answered, and what came after it waits until the
        client has read its replies (``StreamServer._meta_done``, ``_go_on``)."""
        self.held_msgs: deque[RoutingMessage] = deque()
        self.held_bytes = 0
        """What ``held_msgs`` costs (``held_cost``), counted in the server's ``input_budget``;
        over ``HELD_INPUT`` the connection is not read."""
        self.next_turn: list[RoutingMessage] = []
        """What it sent after its first ``INDEX_TURN`` index requests of a read: taken up on
        the loop's next turn (``StreamServer._take_turn``); it is not read meanwhile."""
        self.backlog: deque[RoutingMessage | MessageRun] = deque()
        """Replies not framed yet: the connection was over ``connection_output`` (``send``)."""
        self.backlog_bytes = 0
        """What ``backlog`` costs (``held_cost``: payloads, routes and objects; the output
        budget sums it with the transport's unsent bytes)."""
        self.reads: deque[tuple[PendingRead, list]] = deque()
        """Pulls answered by the core and not yet read: ``(pending read, its slot)``."""
        self.reads_running = 0
        self.input_held = 0
        """Bytes of an incomplete frame this connection holds (counted in the server's
        ``input_budget``)."""
        self.partial_since: float | None = None
        """When the incomplete frame it holds was started (``frame_timeout``)."""
        self.input_paused = False
        """Not read because the incomplete frames of all connections fill ``input_budget``
        and this one's is large: it waits for room (its ``frame_timeout`` runs on)."""
        self.last_active = time.monotonic()
        self.version_timer: asyncio.TimerHandle | None = None
        """Drops the peer if its version byte has not come within ``limits.version_timeout``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream server's transport: asyncio gives a Transport to a Protocol on a socket
        self.transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.host = str(peer[0]) if peer else "?"
        why = self.server._admit(self)
        if why is not None:
            transport.abort()
            self.closing = True
            return
        self.accepted = True
        limit = self.server.limits.connection_output
        transport.set_write_buffer_limits(high=limit, low=limit // 4)
        if self.server.tls is not None:  # verified by the handshake, or absent
            self.identity = peer_from_certificate(transport.get_extra_info("peercert"))
        transport.write(TcpConnection.initial_bytes())
        self.version_timer = asyncio.get_running_loop().call_later(
            self.server.limits.version_timeout, self._version_timed_out
        )
        log_event(
            logger, logging.DEBUG, "connection opened", peer=self.peer, who=self.identity.label
        )

    def _version_timed_out(self) -> None:
        """handler.ex: ``{:ok, <<1>>} = transport.recv(socket, 1, 5000)`` — a peer that has not
        sent its version byte in time is dropped."""
        self.version_timer = None
        if self.transport is not None and not self.wire.version_received:
            limit = self.server.limits.version_timeout
            self.close_for("no protocol version byte", f"none within {limit:g} s")

    def get_buffer(self, sizehint: int) -> memoryview:
        server = self.server
        if server._input_bytes > server.limits.input_budget:  # one read adds little then
            return server._read_view[:SMALL_PARTIAL]
        return server._read_view

    def buffer_updated(self, nbytes: int) -> None:
        # the buffer is the server's, and the next read reuses it: ``receive_data`` copies
        # what it keeps (the decoded payloads, an incomplete frame) before returning
        self.data_received(self.server._read_view[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        t = self.transport
        if self.closing or t is None:
            return
        self.last_active = time.monotonic()
        wire = self.wire
        msgs = wire.receive_data(data)
        if self.version_timer is not None and wire.version_received:
            self.version_timer.cancel()
            self.version_timer = None
        held = wire.buffered
        server = self.server
        freed = held < self.input_held
        if held != self.input_held:
            if held and not self.input_held:
                self.partial_since = self.last_active
            elif not held:
                self.partial_since = None
            server._input_bytes += held - self.input_held
            self.input_held = held
        if msgs:
            self.queued += len(msgs)
            server._take_turn(self, msgs)
            self._update_reading()
        if wire.error is not None:
            self.close_for("protocol error", str(wire.error), graceful=True)
        elif held > SMALL_PARTIAL and server._input_bytes > server.limits.input_budget:
            server._over_input_budget(self)
        elif freed and server._input_waiting:
            server._resume_input()

    def close_for(self, what: str, reason: str, graceful: bool = False) -> None:
        """Close this connection and say why (a hostile or broken client is closed, never
        served at the others' expense). ``graceful``: the replies to what it sent before are
        still sent (a protocol error); else it is dropped at once (its buffers freed). A
        connection already closing gracefully is dropped by a second, not graceful, close:
        a client that stops reading its replies must not keep them, or its descriptor, by
        having sent a bad frame."""
        t = self.transport
        if self.closing:
            if not graceful and t is not None and self.closing_since is not None:
                self.server._warn(
                    f"dropping closing connection: {what}", peer=self.peer, reason=reason
                )
                self.closing_since = None
                self.reads.clear()
                t.abort()
            return
        self.server._warn(f"closing connection: {what}", peer=self.peer, reason=reason)
        self.closing = True
        self._release(drop_reads=not graceful)
        if t is None:
            return
        if not graceful:
            t.abort()
            return
        self.closing_since = time.monotonic()
        if self.queued == 0 and not self.backlog:
            t.close()

    def _release(self, drop_reads: bool = True) -> None:
        """Give back what this connection holds of the server's budgets; drop its waiting
        pulls (not for a graceful close: what it sent before is still answered)."""
        server = self.server
        server._input_bytes -= self.input_held
        self.input_held = 0
        self.partial_since = None
        self.input_paused = False
        server._input_waiting.discard(self)
        if drop_reads:
            self.reads.clear()
            self.take_held()
            self.backlog.clear()
            self.backlog_bytes = 0
        if server._input_waiting:
            server._resume_input()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.closing_since = None
        if self.version_timer is not None:
            self.version_timer.cancel()
            self.version_timer = None
        if not self.accepted:
            return
        self.accepted = False
        self._release()
        self.server._forget(self)
        log_event(logger, logging.DEBUG, "connection closed", peer=self.peer, error=exc)

    def pause_writing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.backlog:
            self._drain()
            if self.write_paused:  # the held replies filled it again: nothing else yet
                return
        self._update_reading()
        self.pump_reads()
        self._go_on()

    def owes_output(self) -> bool:
        """Replies of this connection wait for its client to read, or for an earlier pull."""
        return self.write_paused or bool(self.backlog) or self.held > 0

    def _go_on(self) -> None:
        """Go on with what came after an answered stream service request, once nothing of
        this connection waits to be sent (``StreamServer._meta_done``)."""
        if self.meta_waits and not self.owes_output():
            self.server._meta_done(self)

    def hold_msgs(self, msgs: list[RoutingMessage]) -> None:
        """Keep ``msgs`` until the connection's stream service request is answered (counted in
        ``input_budget``; over ``HELD_INPUT`` the connection is not read meanwhile)."""
        n = sum(map(held_cost, msgs))
        self.held_msgs += msgs
        self.held_bytes += n
        self.server._input_bytes += n
        if self.held_bytes > HELD_INPUT:
            self._update_reading()

    def take_held(
        self, until: Callable[[RoutingMessage], bool] | None = None
    ) -> list[RoutingMessage]:
        """The held messages — all, or the first up to and including one that is ``until`` —
        given back with their share of ``input_budget``."""
        held = self.held_msgs
        if until is None:
            out, n = list(held), self.held_bytes
            held.clear()
        else:
            out, n = [], 0
            while held:
                m = held.popleft()
                out.append(m)
                n += held_cost(m)
                if until(m):
                    break
        server = self.server
        server._input_bytes -= n
        self.held_bytes -= n
        if out and server._input_waiting:
            server._resume_input()
        return out

    def _update_reading(self) -> None:
        """Read the connection unless it has too many requests waiting or too many unsent
        replies (flow control: the client's own sending then blocks in its socket)."""
        t = self.transport
        if t is None or self.closing:
            return
        limit = self.server.limits.max_queued_requests
        if (
            self.write_paused
            or self.queued > limit
            or self.input_paused
            or self.held_bytes > HELD_INPUT
            or self.next_turn
        ):
            if not self.paused:
                self.paused = True
                t.pause_reading()
        elif self.paused and self.queued <= limit // 2:
            self.paused = False
            if self.partial_since is not None:  # its frame's clock stopped while not read
                self.partial_since = time.monotonic()
            t.resume_reading()

    def schedule_read(self, pending: PendingRead, slot: list) -> None:
        if self.transport is None or self.transport.is_closing() or self.server._stopping:
            return
        self.reads.append((pending, slot))
        self.pump_reads()

    def pump_reads(self) -> None:
        """Start waiting pulls while the client reads its replies and the server's output
        budget has room; the rest wait (``resume_writing``, a read finishing, the server's
        retry) — unread, so they hold no reply bytes. None starts while a finished reply waits
        for an earlier one (``held``) and a pull is being read: such replies are in no write
        buffer, so neither the connection's flow control nor the output budget saw them, and
        they went out at once when the earlier reply came (a client that never read held 5.6 MB
        where its bound was 5.0, once, under load). With none being read, the oldest waiting
        pull starts: the reply held may wait for it (a pull, then a push to the same return
        route, in one batch: the push's confirm waited for the pull, which never started)."""
        server = self.server
        while (
            self.reads
            and (not self.held or not self.reads_running)
            and not self.write_paused
            and not self.backlog
            and self.transport is not None
            and not self.transport.is_closing()
            and self.reads_running < READS_PER_CONNECTION
        ):
            if not server._output_room():
                server._starved.add(self)
                server._retry_starved_later()
                return
            pending, slot = self.reads.popleft()
            self.reads_running += 1
            server._start_read(self, pending, slot)

    def answer(self, ms: list[RoutingMessage], replies: list, pending: list[int]) -> list[list]:
        """Send the replies of ``ms`` (one list per message, None where ``pending``: a deferred
        read) — each at once unless an earlier request to its return route is unanswered, then
        after it (``fill``) — and return the slots the deferred replies will fill."""
        if self.slots is None and not pending:  # the push path: nothing to wait for
            self.send(list(itertools.chain.from_iterable(replies)), len(ms))
            return []
        slots = self.slots if self.slots is not None else {}
        waiting = []
        out: list[RoutingMessage | MessageRun] = []
        sent = 0
        for m, r in zip(ms, replies, strict=True):
            route = m.return_route
            queue = slots.get(route)
            if queue is None and r is not None:  # nothing earlier on its route waits
                out += r
                sent += 1
                continue
            slot = [route, r]
            if queue is None:
                slots[route] = deque((slot,))
            else:
                queue.append(slot)
            if r is None:
                waiting.append(slot)
            else:
                self.held += 1
        self.slots = slots or None
        self.send(out, sent)
        return waiting

    def fill(self, slot: list, replies: list[RoutingMessage]) -> None:
        """A deferred reply is ready: send it, and the answered ones behind it on its return
        route, if no earlier request to that route is unanswered (else it waits, ``held``)."""
        slot[1] = replies
        slots = self.slots
        assert slots is not None
        route = slot[0]
        queue = slots[route]
        if queue[0] is not slot:
            self.held += 1
            return
        out: list[RoutingMessage | MessageRun] = []
        sent = 0
        while queue and queue[0][1] is not None:
            out += queue.popleft()[1]
            sent += 1
        self.held -= sent - 1  # the head was not counted
        if not queue:
            del slots[route]
            if not slots:
                self.slots = None
        self.send(out, sent)
        self._go_on()

    def send(self, msgs: Sequence[RoutingMessage | MessageRun], handled: int) -> None:
        """Frame and write ``msgs`` while the peer reads; what the transport cannot take now
        waits unframed in ``backlog`` (``_drain`` on ``resume_writing``).

        Found from outside: a CREATE of 4,096 partitions is answered with 4,096 INIT frames
        (the reference sends one from each partition's worker), each carrying the request's
        whole return route, and all of them were framed and written at once: a 262 KB request
        queued 1.07 GB of output for a client that did not read (RSS 1,128 MB). A reply batch
        is now framed ``FRAME_CHUNK`` messages at a time, and only while the connection is
        under ``connection_output``; the rest costs its message objects (no frame bytes)."""
        self.queued -= handled
        t = self.transport
        if t is None or t.is_closing():
            return
        if msgs:
            if self.backlog or self.write_paused:
                self._hold(msgs, 0)
            elif len(msgs) <= FRAME_CHUNK:
                t.writelines(frame_parts(msgs))  # heads and payloads, no per-frame concatenation
            else:
                self._write_chunks(msgs)
        if self.closing and self.queued == 0 and not self.backlog:
            t.close()
        elif self.paused:
            self._update_reading()

    def _write_chunks(self, msgs: Sequence[RoutingMessage | MessageRun]) -> None:
        """Write ``msgs`` ``FRAME_CHUNK`` at a time until the transport passes its high-water
        mark (``pause_writing`` is called from inside ``writelines``); hold the rest."""
        t = self.transport
        assert t is not None
        for k in range(0, len(msgs), FRAME_CHUNK):
            if self.write_paused:
                self._hold(msgs, k)
                return
            t.writelines(frame_parts(msgs[k : k + FRAME_CHUNK]))

    def _hold(self, msgs: Sequence[RoutingMessage | MessageRun], start: int) -> None:
        """Keep ``msgs[start:]`` unframed until the peer reads (counted in ``backlog_bytes``,
        which the output budget sums with the transport's unsent bytes)."""
        rest = msgs[start:] if start else msgs
        self.backlog.extend(rest)
        self.backlog_bytes += sum(map(held_cost, rest))

    def _drain(self) -> None:
        """Frame and write held replies, in order, while the peer reads them."""
        t = self.transport
        backlog = self.backlog
        if t is None or t.is_closing():
            backlog.clear()
            self.backlog_bytes = 0
            return
        while backlog and not self.write_paused:
            chunk = [backlog.popleft() for _ in range(min(FRAME_CHUNK, len(backlog)))]
            self.backlog_bytes -= sum(map(held_cost, chunk))
            t.writelines(frame_parts(chunk))
        if not backlog and self.closing and self.queued == 0:
            t.close()


class _InFlight:
    """One batch between its arrival and its replies (event loop thread only)."""

    __slots__ = (
        "batch",
        "complete",
        "conns",
        "failed",
        "indexes",
        "meta",
        "msgs",
        "outcomes",
        "peers",
        "replies",
        "waiting",
    )

    def __init__(
        self,
        conns: list[tuple[_Connection, list[RoutingMessage]]],
        msgs: list[RoutingMessage],
        peers: list[Peer] | None,
    ) -> None:
        self.conns, self.msgs, self.peers = conns, msgs, peers
        self.batch: Batch | None = None
        self.outcomes: list = []
        self.waiting = 0
        self.indexes: dict[int, list[int]] = {}
        """Indexes of the appends written and waiting for their fsync, by action position."""
        self.replies: list | None = None
        self.complete = False
        self.failed = False
        self.meta: _Connection | None = None
        """The connection whose stream service request this batch is, alone (``_meta_step``)."""

    def settle(self, i: int, outcome: Outcome) -> bool:
        """Action ``i`` of the step in progress has its outcome; True once all have."""
        self.outcomes[i] = outcome
        self.waiting -= 1
        return self.waiting == 0


class StreamServer:
    """``await StreamServer(service, host, port).start()``; ``.port`` is the bound port."""

    def __init__(
        self,
        service: StreamService,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        limits: ServerLimits | None = None,
        max_frame: int | None = None,
        tls: ssl.SSLContext | None = None,
        handshake_timeout: float | None = None,
        version_timeout: float | None = None,
        freeze_gc: bool | None = None,
    ) -> None:
        self.service = service
        limits = limits or ServerLimits()
        if max_frame is not None:
            limits = dataclasses.replace(limits, max_frame=max_frame)
        if handshake_timeout is not None:
            limits = dataclasses.replace(limits, tls_handshake_timeout=handshake_timeout)
        if version_timeout is not None:
            limits = dataclasses.replace(limits, version_timeout=version_timeout)
        self.limits = limits
        """Every bound a client is held to (``streams/limits.py``)."""
        self.tls = tls
        """TLS (``streams/tls.server_context``); None: plain TCP."""
        self.handshake_timeout = limits.tls_handshake_timeout
        self.freeze_gc = freeze_gc
        """At start, move every object that exists to the collector's permanent generation
        (``gc.freeze``). Why: pushes in flight during a collection are promoted, and every few
        tens of thousands of them trigger a full collection, which walks every object of the
        process (the imports of the whole node): measured 2 full collections of 150–250 ms
        each per 60,000 pushes under load, 15–30% of the server's CPU. Frozen, the startup
        objects are never walked again; and the young generation's threshold is raised to
        ``GC_YOUNG_THRESHOLD`` until ``stop()``, which puts the old one back. It is
        process-wide, so None (the default) does this only when the server's event loop runs
        on the main thread — the process is the server (``loglake serve``, ``loglake node``) —
        and not for a server on a background thread (``BackgroundServer``, a test); True or
        False decides."""
        self._gc_threshold: tuple[int, ...] | None = None
        """The collector's thresholds before ``start`` raised them (to restore on ``stop``)."""
        self.host, self.port = host, port
        self.max_frame = limits.max_frame
        self._conns: set[_Connection] = set()
        self._per_host: dict[str, int] = {}
        """Open connections per peer IP address (``max_connections_per_peer``)."""
        self._serials = itertools.count()
        self._input_bytes = 0
        """Bytes of incomplete frames, and of requests waiting behind a stream service request
        (``held_bytes``), held by all connections (``input_budget``)."""
        self._input_waiting: set[_Connection] = set()
        """Connections not read until the input budget has room (``_resume_input``)."""
        self._reads_running = 0
        """Pulls being read now, all connections (each may become ``max_pull_bytes``)."""
        self._starved: set[_Connection] = set()
        """Connections whose pulls wait for room in the output budget."""
        self._retry: asyncio.TimerHandle | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._output_cache = (0.0, 0)
        """(when, bytes): the unsent reply bytes of all connections, summed at most every
        ``OUTPUT_RECOUNT`` s (a sum over every connection per pull would cost more)."""
        self._warned: dict[str, tuple[float, int]] = {}
        """Per warning: when it was last logged and how many were not logged since."""
        self.refused = 0
        """Connections closed at the door (over ``max_connections`` or the per-peer cap)."""
        self.dropped = 0
        """Connections closed for a limit (input budget, frame or idle timeout)."""
        self._read_view = memoryview(bytearray(READ_BUFFER))
        """Every connection's reads land here, one at a time, on the event loop thread."""
        self._fifo: deque[_InFlight] = deque()
        """Batches started and not answered yet, in arrival order. Empty: the server is idle
        (nothing waits for an fsync), so a lone push may take ``_run_lone``."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gathered: list[tuple[_Connection, list[RoutingMessage]]] | None = None
        """What connections sent in this loop iteration, while an inline batch is gathered."""
        self._meta_running = 0
        """Stream service requests started and not answered (``stop`` waits for them)."""
        self._meta_queue: list[tuple[_Connection, RoutingMessage]] = []
        """Stream service requests that came in this loop iteration (``_start_meta``)."""
        self.service_address_value = Address.local(service.service_address).value
        """The stream service's address: requests to it run off the loop (``_enqueue``)."""
        self.index_address_value = Address.local(service.index_address).value
        """The index service's address: ``INDEX_TURN`` requests to it per connection and turn."""
        self._stopping = False
        # appends to different partitions of one batch run side by side (their fsyncs overlap)
        self._appenders = concurrent.futures.ThreadPoolExecutor(APPEND_THREADS, "loglake-append")
        # pulls run here, beside the appends, never in front of them
        self._readers = concurrent.futures.ThreadPoolExecutor(READ_THREADS, "loglake-read")
        # stream service requests (CREATE, stream info) run here, never on the loop
        self._meta = concurrent.futures.ThreadPoolExecutor(META_THREADS, "loglake-meta")
        self._server: asyncio.Server | None = None

    async def start(self) -> StreamServer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self),
            self.host,
            self.port,
            ssl=self.tls,
            ssl_handshake_timeout=self.handshake_timeout if self.tls is not None else None,
            backlog=LISTEN_BACKLOG,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._loop = loop
        self._tick_handle = loop.call_later(self._tick_every(), self._tick)
        freeze = self.freeze_gc
        if freeze is None:
            freeze = threading.current_thread() is threading.main_thread()
        if freeze:
            gc.collect()  # what is garbage now is not frozen with the rest
            gc.freeze()
            self._gc_threshold = gc.get_threshold()
            young, *older = self._gc_threshold
            gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), *older)
        log_event(
            logger,
            logging.INFO,
            "stream service listening",
            host=self.host,
            port=self.port,
            tls=self.tls is not None,
        )
        return self

    # -- limits (``streams/limits.py``), on the event loop ------------------------------------
    def _warn(self, what: str, **fields: object) -> None:
        """Log a limit being enforced: at most once a second per kind, with how many were not
        logged since (a flood of refused connections must not become a flood of log lines)."""
        now = time.monotonic()
        last, skipped = self._warned.get(what, (-1e9, 0))
        if now - last < 1.0:
            self._warned[what] = (last, skipped + 1)
            return
        self._warned[what] = (now, 0)
        if skipped:
            fields["not_logged_since"] = skipped
        log_event(logger, logging.WARNING, what, **fields)

    def _admit(self, conn: _Connection) -> str | None:
        """Count a new connection in, or say why it is refused (then it is closed at once:
        its descriptor is not kept, and nothing is read from it). At a cap, the connection
        idle the longest may make room (``_evict_idlest``)."""
        why = self._refusal(conn)
        if why is not None and not self._stopping and self._evict_idlest(conn, why):
            why = self._refusal(conn)
        if why is not None:
            self.refused += 1
            self._warn("connection refused", peer=conn.peer, reason=why)
            return why
        self._conns.add(conn)
        self._per_host[conn.host] = self._per_host.get(conn.host, 0) + 1
        return None

    def _refusal(self, conn: _Connection) -> str | None:
        """Why ``conn`` cannot be let in now, or None (then it is counted in the process's
        descriptor budget)."""
        limits = self.limits
        why = None
        if self._stopping:
            why = "the server is stopping"
        elif len(self._conns) >= limits.max_connections:
            why = f"{limits.max_connections} connections open (max_connections)"
        elif self._per_host.get(conn.host, 0) >= limits.max_connections_per_peer:
            why = (
                f"{limits.max_connections_per_peer} connections open from {conn.host} "
                "(max_connections_per_peer)"
            )
        elif not CONNECTIONS.admit():
            why = (
                f"{CONNECTIONS.open} connections open in the process, its share of the "
                f"descriptor limit ({soft_limit()})"
            )
        return why

    def _evict_idlest(self, new: _Connection, why: str) -> bool:
        """At a connection cap, close the connection idle the longest (nothing sent for at
        least ``EVICT_IDLE_AFTER`` s, nothing owed to it, no frame begun) to make room for
        ``new``; at the per-peer cap, one of the same peer's. False: none is idle, ``new`` is
        refused as before.

        Found from outside: 4 × 256 connections from 127.0.0.2-.5 (around the per-peer cap)
        that sent their version byte and nothing else kept an honest client out for 50 s and
        more ("1024 connections open (max_connections)"), with no idle timeout by default.
        Why not a default idle timeout instead: loglake's ``StreamClient`` neither pings nor
        reconnects, so an application holding a quiet client (between batches, waiting for
        input) would find it closed; eviction only costs an idle client its connection while
        the server is full."""
        now = time.monotonic()
        per_peer = "max_connections_per_peer" in why
        victim = None
        for c in self._conns:
            if (
                (per_peer and c.host != new.host)
                or c.closing
                or now - c.last_active < EVICT_IDLE_AFTER
                or c.queued
                or c.reads
                or c.reads_running
                or c.partial_since is not None
                or c.backlog
                or c.meta_busy
                or c.slots is not None
            ):
                continue
            if victim is None or c.last_active < victim.last_active:
                victim = c
        if victim is None:
            return False
        self.dropped += 1
        victim.close_for(
            "evicted at the connection cap",
            f"idle {now - victim.last_active:.1f} s, the longest, while {why}",
        )
        victim.accepted = False  # its place is taken now, not when the loop sees it closed
        self._forget(victim)
        return True

    def _forget(self, conn: _Connection) -> None:
        if conn in self._conns:
            CONNECTIONS.release()
        self._conns.discard(conn)
        self._starved.discard(conn)
        n = self._per_host.get(conn.host, 0) - 1
        if n > 0:
            self._per_host[conn.host] = n
        else:
            self._per_host.pop(conn.host, None)

    def _over_input_budget(self, conn: _Connection) -> None:
        """The incomplete frames (and held requests) of all connections hold more than
        ``input_budget`` and ``conn`` holds a large one: it is not read until there is room (new
        work waits; its
        ``frame_timeout`` runs on, so a client that never completes it is closed then). A
        client sending ordinary frames holds almost nothing between them (at most
        ``SMALL_PARTIAL``) and is never held up. Past twice the budget (many connections each
        starting a large frame in one read), the connections holding the most — the newest
        among equals — are closed until the rest fit."""
        budget = self.limits.input_budget
        while self._input_bytes > 2 * budget:
            victim = max(
                (c for c in self._conns if (c.input_held or c.held_bytes) and not c.closing),
                key=lambda c: (c.input_held + c.held_bytes, c.serial),
                default=None,
            )
            if victim is None:
                break
            self.dropped += 1
            victim.close_for(
                "input budget",
                f"incomplete frames and held requests of all connections passed twice {budget} "
                f"bytes (input_budget); this one held {victim.input_held + victim.held_bytes}",
            )
        if conn.closing or conn.input_paused:
            return
        conn.input_paused = True
        self._input_waiting.add(conn)
        conn._update_reading()
        self._warn(
            "input budget full: a connection waits",
            peer=conn.peer,
            reason=f"incomplete frames of all connections hold {self._input_bytes} bytes "
            f"(input_budget {budget}); this one's holds {conn.input_held}",
        )

    def _resume_input(self) -> None:
        """Read connections waiting for the input budget again, oldest first, as many as the
        room left could take one read each."""
        room = self.limits.input_budget - self._input_bytes
        for c in sorted(self._input_waiting, key=lambda c: c.serial):
            if room < READ_BUFFER:
                return
            self._input_waiting.discard(c)
            c.input_paused = False
            since = c.partial_since
            c._update_reading()
            c.partial_since = since  # waiting for room does not stop its frame's clock
            room -= READ_BUFFER

    def _output_room(self) -> bool:
        """Whether another pull may be read: the unsent replies of all connections plus the
        pulls being read (each up to ``max_pull_bytes``) stay within ``output_budget``."""
        now = time.monotonic()
        when, unsent = self._output_cache
        if now - when > OUTPUT_RECOUNT:
            unsent = self._recount_output(now)
        pending = (self._reads_running + 1) * self.service.max_pull_bytes
        return unsent + pending <= self.limits.output_budget or self._reads_running == 0

    def _recount_output(self, now: float) -> int:
        """Sum every connection's unsent bytes; over ``output_budget``, close the connections
        not reading their replies (flow-controlled, ``write_paused``) that hold the most —
        the newest among equals — until the rest fit: a client that stops reading is the
        offender, and readers go on being served."""
        unsent = 0
        held: list[tuple[bool, int, int, _Connection]] = []
        for c in self._conns:
            t = c.transport
            if t is not None:
                n = t.get_write_buffer_size() + c.backlog_bytes
                unsent += n
                if c.write_paused:  # closing ones first: their replies are a parting gift
                    held.append((c.closing, n, c.serial, c))
        budget = self.limits.output_budget
        if unsent > budget:
            for _, n, _, c in sorted(held, key=lambda h: h[:3], reverse=True):
                if unsent <= budget:
                    break
                self.dropped += 1
                c.close_for(
                    "output budget",
                    f"unsent replies of all connections passed {budget} bytes (output_budget); "
                    f"this client does not read its {n} bytes",
                )
                unsent -= n
        self._output_cache = (now, unsent)
        return unsent

    def _retry_starved_later(self) -> None:
        if self._retry is None and self._loop is not None and not self._stopping:
            self._retry = self._loop.call_later(STARVED_RETRY, self._pump_starved)

    def _pump_starved(self) -> None:
        self._retry = None
        starved, self._starved = self._starved, set()
        for c in sorted(starved, key=lambda c: c.serial):
            c.pump_reads()

    def _start_read(self, conn: _Connection, pending: PendingRead, slot: list) -> None:
        assert self._loop is not None
        self._reads_running += 1
        fut = asyncio.wrap_future(self._readers.submit(self._read, pending), loop=self._loop)
        fut.add_done_callback(functools.partial(self._read_done, conn, slot))

    def _tick_every(self) -> float:
        limits = self.limits
        shortest = min(t for t in (limits.frame_timeout, limits.idle_timeout, 4.0) if t > 0)
        return min(max(shortest / 4, 0.02), 1.0)

    def _tick(self) -> None:
        """Close connections whose frame has taken longer than ``frame_timeout``, or that
        have been idle past ``idle_timeout``."""
        if self._stopping or self._loop is None:
            return
        self._tick_handle = self._loop.call_later(self._tick_every(), self._tick)
        now = time.monotonic()
        self._recount_output(now)
        limits = self.limits
        idle = limits.idle_timeout
        if self._input_waiting:
            self._resume_input()
        for c in list(self._conns):
            began = c.closing_since
            if began is not None and now - began > limits.frame_timeout:
                self.dropped += 1
                c.close_for(
                    "close timeout",
                    f"its last replies are unsent {now - began:.1f} s after it was closed "
                    f"(frame_timeout {limits.frame_timeout:g} s)",
                )
            if c.closing or (c.paused and not c.input_paused):  # held back by us: no clocks
                continue
            since = c.partial_since
            if since is not None and now - since > limits.frame_timeout:
                self.dropped += 1
                c.close_for(
                    "frame timeout",
                    f"a frame begun {now - since:.1f} s ago is not complete "
                    f"(frame_timeout {limits.frame_timeout:g} s)",
                )
            elif (
                idle
                and now - c.last_active > idle
                and c.queued == 0
                and not c.reads_running
                and since is None
            ):
                self.dropped += 1
                c.close_for("idle timeout", f"nothing sent for {idle:g} s (idle_timeout)")

    def _take_turn(self, conn: _Connection, msgs: list[RoutingMessage]) -> None:
        """On the event loop: hand what ``conn`` sent to ``_enqueue``, up to and with its
        ``INDEX_TURN``-th request to the index service; the rest waits in ``conn.next_turn``
        (the connection unread meanwhile) for the loop's next turn, so the other connections'
        requests are read and answered between (``INDEX_TURN``)."""
        cut = self._index_cut(msgs)
        if cut is None:
            self._enqueue(conn, msgs)
            return
        conn.next_turn = msgs[cut:]
        self._enqueue(conn, msgs[:cut])
        assert self._loop is not None
        # after the batch ``_enqueue`` scheduled (``_gather``): the rest is gathered into the
        # next one, with what the other connections send meanwhile
        self._loop.call_soon(self._next_turn, conn)

    def _index_cut(self, msgs: list[RoutingMessage]) -> int | None:
        """Where ``msgs`` pass ``INDEX_TURN`` index requests, or None if they do not."""
        if len(msgs) <= INDEX_TURN:
            return None
        value, n = self.index_address_value, 0
        for k, m in enumerate(msgs):
            route = m.onward_route
            if route and route[0].value == value and route[0].type == ADDRESS_TYPE_LOCAL:
                n += 1
                if n == INDEX_TURN:
                    return k + 1 if k + 1 < len(msgs) else None
        return None

    def _next_turn(self, conn: _Connection) -> None:
        """The loop's next turn for what ``conn`` sent past its last turn's index requests."""
        rest, conn.next_turn = conn.next_turn, []
        t = conn.transport
        if t is None or t.is_closing() or self._stopping:
            conn.send([], len(rest))  # dropped with the connection: nothing waits for them
            return
        self._take_turn(conn, rest)
        conn._update_reading()

    def _enqueue(self, conn: _Connection, msgs: list[RoutingMessage]) -> None:
        """On the event loop: gather what the connections send in this loop iteration into one
        batch (one ``call_soon``; at once when only one connection is open, as no other could
        add to it). A lone push on an idle server takes ``_run_lone``.

        A request to the stream service (CREATE, stream info) is a batch of its own, performed
        off the loop (``_meta_step``); what its connection sent after it waits until it is done
        (``held_msgs``: one such request in flight per connection, and the connection's order
        kept). Found from outside: these ran on the loop, so one CREATE of 4,096 partitions on
        JetStream held every client ~20 s, and 50 pipelined ``stream_info`` of 15 streams of
        4,096 partitions held the server 14.7 s."""
        if conn.meta_busy:
            conn.hold_msgs(msgs)
            return
        service = self.service_address_value
        for k, m in enumerate(msgs):
            route = m.onward_route
            if route and route[0].type == ADDRESS_TYPE_LOCAL and route[0].value == service:
                conn.meta_busy = True
                if k + 1 < len(msgs):
                    conn.hold_msgs(msgs[k + 1 :])
                if k:
                    self._gather(conn, msgs[:k])
                self._meta_queue.append((conn, m))
                if self._gathered is None:  # nothing gathered runs it: run it now
                    self._start_meta()
                return
        self._gather(conn, msgs)

    def _gather(self, conn: _Connection, msgs: list[RoutingMessage]) -> None:
        gathered = self._gathered
        if gathered is not None:
            gathered.append((conn, msgs))
            return
        self._gathered = [(conn, msgs)]
        if len(self._conns) == 1:
            self._run_gathered()
        else:
            assert self._loop is not None
            self._loop.call_soon(self._run_gathered)

    def _start_meta(self) -> None:
        """Start the stream service requests that came (after the batch gathered with them,
        which holds what their connections sent before them)."""
        queue, self._meta_queue = self._meta_queue, []
        for conn, msg in queue:
            fl = self._in_flight([(conn, [msg])])
            fl.meta = conn
            self._meta_running += 1
            try:
                fl.batch = self.service.batch(fl.msgs, peers=fl.peers, runs=True)
            except Exception as e:
                self._crashed(fl, e)
            else:
                self._advance(fl)
            if fl.complete:
                self._meta_answer(fl)

    def _meta_answer(self, fl: _InFlight) -> None:
        """Send a finished stream service request's reply. Not through ``_fifo``: it has no
        append to wait for, and the batches behind it are not held up by it (a CREATE taking
        seconds must not delay everyone's confirms)."""
        assert fl.meta is not None
        self._meta_running -= 1
        try:
            self._send_replies(fl, self._finish(fl))
        except Exception:  # e.g. the connection went meanwhile: never end the server
            logger.exception("stream service: answering a request failed")
        self._meta_done(fl.meta)

    def _meta_done(self, conn: _Connection) -> None:
        """A connection's stream service request is answered: what it sent after it goes on —
        once its replies are sent (``_Connection._go_on``), not while they wait for the client
        to read them. Found from outside: a client that never read pipelined 3,000 CREATEs of a
        stream of 4,096 partitions (210 KB); reading it stopped at ``connection_output``, but
        the CREATEs already read went on being performed one after the other, each adding
        4,096 replies to its backlog: RSS 83 → 739 MiB in 52 s, and climbing."""
        if conn.owes_output() and not conn.closing and not self._stopping:
            conn.meta_waits = True
            return
        conn.meta_waits = conn.meta_busy = False
        if conn.closing or self._stopping:
            held = conn.take_held()
            if held:  # dropped with the connection: nothing waits for them
                conn.send([], len(held))
            return
        # what came after it up to its next stream service request, which the rest waits for
        # still (taken out and held again, the rest would cost each request all of it)
        msgs = conn.take_held(until=self._to_service)
        if msgs:
            self._enqueue(conn, msgs)
        conn._update_reading()

    def _to_service(self, m: RoutingMessage) -> bool:
        """``m`` is a request to the stream service (``_enqueue``)."""
        route = m.onward_route
        return (
            bool(route)
            and route[0].type == ADDRESS_TYPE_LOCAL
            and route[0].value == self.service_address_value
        )

    def _run_gathered(self) -> None:
        """On the event loop, after every connection's reads of the iteration: the batch."""
        arrived, self._gathered = self._gathered or [], None
        if not arrived:
            self._start_meta()
            return
        if (
            not self._fifo
            and len(arrived) == 1
            and len(arrived[0][1]) == 1
            and not self._stopping
            and self._run_lone(*arrived[0])
        ):
            self._start_meta()
            return
        self._start(self._in_flight(arrived))
        self._start_meta()
        self._answer_ready()

    def _run_lone(self, conn: _Connection, msgs: list[RoutingMessage]) -> bool:
        """On the event loop: one push, appended, fsynced and answered here and now without a
        ``Batch`` (``StreamService.lone_push``: one-by-one latency). False, having
        done nothing, for anything else, or while a deferred reply of the connection is
        outstanding (its slots keep the replies of one return route in request order)."""
        if conn.slots is not None:
            return False
        service = self.service
        push = service.lone_push(msgs[0], conn.identity)
        if push is None:
            return False
        try:
            replies = service.lone_push_replies(push, perform(service.log, push.action))
        except Exception as e:  # a bug in the core: an error reply, as _crashed gives
            logger.error("stream service push failed", exc_info=e)
            replies = service.error_reply(msgs[0], f"internal error: {type(e).__name__}")
        conn.send(replies, 1)
        return True

    # -- the core, on the event loop --------------------------------------------------------
    def _in_flight(self, arrived: list[tuple[_Connection, list[RoutingMessage]]]) -> _InFlight:
        msgs = (
            arrived[0][1]
            if len(arrived) == 1
            else list(itertools.chain.from_iterable(ms for _, ms in arrived))
        )
        # who sent each message, when someone checks (else every peer may do anything)
        peers = (
            [c.identity for c, ms in arrived for _ in ms]
            if self.service.access is not None
            else None
        )
        return _InFlight(arrived, msgs, peers)

    def _start(self, fl: _InFlight) -> None:
        self._fifo.append(fl)
        try:
            fl.batch = self.service.batch(fl.msgs, defer_reads=True, peers=fl.peers, runs=True)
        except Exception as e:
            self._crashed(fl, e)
            return
        self._advance(fl)

    def _feed(self, fl: _InFlight, outcomes: list) -> None:
        assert fl.batch is not None
        try:
            fl.batch.feed(outcomes)
        except Exception as e:
            self._crashed(fl, e)
            return
        self._advance(fl)

    def _advance(self, fl: _InFlight) -> None:
        """Perform the batch's next actions: here and now, fsync included, for a small batch
        on an idle server; else its appends are written now and their outcomes come back
        (``_synced``) after the fsync that covers them, while the loop goes on reading."""
        batch = fl.batch
        assert batch is not None
        log = self.service.log
        run = functools.partial(perform, log)
        if fl.meta is not None and batch.actions and not fl.failed:
            self._meta_step(fl, run)
            return
        while batch.actions and not fl.failed:
            actions = batch.actions
            # pipelined for a burst, or behind an earlier batch whose fsync runs (waiting for
            # it here would hold up the loop); inline for a few one-by-one requests (the
            # one-by-one latency: Redis's model, the loop blocks on the fsync), and for a step
            # the batch may follow with more appends (``Batch.read_all``): a later batch must
            # not write between them, or a connection's pushes would be stored out of order
            busy = (len(fl.msgs) > INLINE_MAX or len(self._fifo) > 1) and batch.read_all
            if not busy or not any(isinstance(a, Append) for a in actions):
                self._perform_step(fl, run)
                continue
            fl.outcomes = [None] * len(actions)
            fl.waiting = len(actions)
            for i, action in enumerate(actions):
                if not isinstance(action, Append):
                    fl.settle(i, run(action))
                    continue
                done = functools.partial(self._durable, fl, i)
                try:
                    indexes = log.append_payloads_then(
                        action.stream, action.datas, done, partition=action.partition
                    )
                except Exception as e:  # refused before anything was written
                    fl.settle(i, Outcome(error=e))
                    continue
                fl.indexes[i] = indexes
            if fl.waiting == 0:  # nothing was written: every outcome is in hand
                self._feed(fl, fl.outcomes)
            return  # the appends' outcomes come back through _synced
        fl.complete = True

    def _meta_step(self, fl: _InFlight, run: Callable[[Any], Outcome]) -> None:
        """A stream service request's next actions (log metadata, a CREATE: each may take
        seconds on a large or remote log), on a ``loglake-meta`` thread; the outcomes come back
        to the loop (``_fed_later``), which goes on serving everyone else meanwhile."""
        assert self._loop is not None and fl.batch is not None
        actions = list(fl.batch.actions)

        def work() -> list[Outcome]:
            return [run(a) for a in actions]

        try:
            cf = self._meta.submit(work)
        except RuntimeError as e:  # the pool was shut down: the server has stopped
            self._crashed(fl, e)
            return
        fut = asyncio.wrap_future(cf, loop=self._loop)
        fut.add_done_callback(functools.partial(self._fed_later, fl))

    def _fed_later(self, fl: _InFlight, fut: asyncio.Future) -> None:
        """On the event loop: a stream service request's actions were performed."""
        if fut.cancelled():  # the server stops
            fl.failed = fl.complete = True
            fl.replies = [[]]
        elif (e := fut.exception()) is not None:
            self._crashed(fl, e)
        else:
            self._feed(fl, fut.result())
        if fl.complete:
            self._meta_answer(fl)

    def _perform_step(self, fl: _InFlight, run: Callable[[Any], Outcome]) -> None:
        """Perform the batch's next actions here and now (appends to several partitions side
        by side, so their fsyncs overlap) and feed their outcomes back."""
        batch = fl.batch
        assert batch is not None
        actions = batch.actions
        try:
            if len(actions) == 1:
                outs = [run(actions[0])]
            else:
                outs = list(self._appenders.map(run, actions))
            batch.feed(outs)
        except Exception as e:
            self._crashed(fl, e)

    def _durable(self, fl: _InFlight, i: int, error: BaseException | None) -> None:
        """On the thread whose fsync covered append ``i`` of ``fl`` (or failed); possibly
        before ``append_payloads_then`` returned its indexes, which ``_synced`` reads on the
        loop, later."""
        assert self._loop is not None
        # a closed loop (RuntimeError): the server stopped, and no one waits for the answer
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._synced, fl, i, error)

    def _synced(self, fl: _InFlight, i: int, error: BaseException | None) -> None:
        """On the event loop: append ``i`` of ``fl`` is durable (or failed)."""
        if fl.failed:  # answered with errors already
            return
        if fl.settle(i, Outcome(fl.indexes[i]) if error is None else Outcome(error=error)):
            self._feed(fl, fl.outcomes)
        self._answer_ready()

    def _crashed(self, fl: _InFlight, e: BaseException) -> None:
        """The core raised (a bug): every message of the batch gets an error reply."""
        logger.error("stream service batch failed", exc_info=e)
        reason = f"internal error: {type(e).__name__}"
        fl.replies = [self.service.error_reply(m, reason) for m in fl.msgs]
        fl.failed = fl.complete = True

    def _answer_ready(self) -> None:
        """Answer every finished batch at the head of the queue, in order; start its pulls (it
        and every batch before it are durable now)."""
        fifo = self._fifo
        try:
            while fifo and fifo[0].complete:
                fl = fifo.popleft()
                self._send_replies(fl, self._finish(fl))
        except Exception:  # e.g. the reader pool shut down by stop(): never end the server
            logger.exception("stream service: answering a batch failed")

    def _finish(self, fl: _InFlight) -> dict[int, PendingRead]:
        """A finished batch's replies taken from the core, and its pulls by input position
        (it and every batch before it are durable now: they may be read)."""
        if fl.failed or fl.batch is None:
            return {}
        fl.replies = fl.batch.replies
        return {p.position: p for p in fl.batch.deferred}

    def _read(self, pending: PendingRead) -> list[RoutingMessage]:
        """On a reader thread: one deferred pull, performed and answered."""
        try:
            return pending.finish(perform(self.service.log, pending.action))
        except Exception as e:  # finish() answers errors itself; this is a last resort
            logger.exception("a pull failed")
            return self.service.error_reply(pending.msg, f"internal error: {type(e).__name__}")

    def _send_replies(self, fl: _InFlight, reads: dict[int, PendingRead]) -> None:
        """On the event loop: send a finished batch's replies per connection; its pulls go to
        their connections, which read them as their clients keep up (``pump_reads``)."""
        results = fl.replies
        assert results is not None
        k = 0
        for conn, ms in fl.conns:
            end = k + len(ms)
            pending = [i for i in range(k, end) if i in reads] if reads else []
            slots = conn.answer(ms, results[k:end], pending)
            for i, slot in zip(pending, slots, strict=True):
                conn.schedule_read(reads[i], slot)
            k = end

    def _read_done(self, conn: _Connection, slot: list, fut: asyncio.Future) -> None:
        self._reads_running -= 1
        conn.reads_running -= 1
        if not fut.cancelled():  # cancelled: the server is stopping
            conn.fill(slot, fut.result())  # _read never raises
            conn.pump_reads()
        if self._starved:
            self._pump_starved()

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    async def stop(self) -> None:
        """Accept and read nothing more; let the batches already read finish (their pushes
        are acknowledged only once durable) and send what is ready, within
        ``shutdown_timeout``; then drop every connection still open (one that never reads
        its replies would otherwise hold ``close`` forever). Pulls not yet read are dropped:
        each could be ``max_pull_bytes`` to read. What a client saw acknowledged is on disk
        whatever is dropped here."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        for handle in (self._tick_handle, self._retry):
            if handle is not None:
                handle.cancel()
        if self._server is not None:
            self._server.close()
        deadline = loop.time() + self.limits.shutdown_timeout
        for c in list(self._conns):
            c.closing = True
            c.reads.clear()
            if c.transport is not None:
                with contextlib.suppress(Exception):  # already paused, or closing
                    c.transport.pause_reading()
        while (self._fifo or self._reads_running or self._meta_running) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for c in list(self._conns):
            if c.transport is not None:
                c.transport.close()  # sends what is buffered first, if the client reads
        while self._conns and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for c in list(self._conns):
            if c.transport is not None:
                c.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
        self._readers.shutdown(wait=True, cancel_futures=True)
        self._meta.shutdown(wait=True, cancel_futures=True)
        self._appenders.shutdown(wait=True)
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None


class LoopThread(Generic[_S]):
    """An asyncio event loop on its own thread: ``start()`` runs ``begin()`` on it and returns
    its result, the loop then serves until ``stop()``, which runs ``end(result)`` on it and
    ends the thread. One implementation for every "service on a background thread" (the
    stream server here, ``node.runner.BackgroundNode``); an error in ``begin`` is raised by
    ``start()`` and leaves no thread or loop behind."""

    def __init__(
        self,
        begin: Callable[[], Coroutine[Any, Any, _S]],
        end: Callable[[_S], Coroutine[Any, Any, object]],
        name: str,
        stop_timeout: float = 30.0,
    ) -> None:
        self._begin, self._end, self._stop_timeout = begin, end, stop_timeout
        self._loop = eventloop.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.value: _S | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.value = self._loop.run_until_complete(self._begin())
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> _S:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join(timeout=30)
            self._loop.close()
            raise self._error
        return cast(_S, self.value)

    def stop(self) -> None:
        if self._ready.is_set() and self._error is None and self._loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self._end(cast(_S, self.value)), self._loop)
            fut.result(timeout=self._stop_timeout)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._loop.is_closed():
            self._loop.close()


class BackgroundServer:
    """A ``StreamServer`` on its own event loop thread (for tests, the demo, embedding).

    ``with BackgroundServer(service) as srv: StreamClient(port=srv.port)``.
    """

    def __init__(
        self, service: StreamService, host: str = "127.0.0.1", port: int = 0, **kw: Any
    ) -> None:
        self._thread = LoopThread(
            lambda: StreamServer(service, host, port, **kw).start(),
            StreamServer.stop,
            "loglake-server",
        )
        self.server: StreamServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def start(self) -> BackgroundServer:
        self.server = self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
