"""Stream service requests (CREATE, stream info) are performed off the event loop.

Found from outside (review 5, A6/A9): ``StreamServer`` performed the log calls of a CREATE or a
``stream_info`` on its event loop. On the embedded log, 50 pipelined ``stream_info`` of 15
streams of 4,096 partitions held the server 14.7 s (an honest push waited 14.7 s); on
JetStream one CREATE of 4,096 partitions held every client ~20 s. Now they run on their own
threads and their outcomes come back to the loop, one at a time per connection (what the
connection sent after one waits for it, in order), while other clients are served.

The log here is a ``MemoryLog`` whose listing of streams waits for the test (a backend whose
metadata is slow: a large log, a remote broker), so no timing decides the result."""

from __future__ import annotations

import socket
import threading
import time

from loglake.log.memory import MemoryLog
from loglake.streams import codec
from loglake.streams.client import StreamClient
from loglake.streams.messages import PushConfirm, PushRequest, StreamInfoRequest, StreamInfoResponse
from loglake.streams.server import BackgroundServer, StreamServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import RoutingMessage, TcpConnection, encode_frame, route
from tests.streams.test_hostile_clients import on_loop

WAIT = 20.0
INFOS = 5


class SlowInfoLog(MemoryLog):
    """``streams`` (the listing a ``stream_info`` of every stream starts with) waits for
    ``gate`` once ``armed``; counts how many wait at once."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.gate = threading.Event()
        self.entered = threading.Event()
        self._count_lock = threading.Lock()
        self.inside = self.peak = 0

    def has_stream(self, name: str) -> bool:  # not through ``streams``: a CREATE is not held
        return name in super().streams()

    def streams(self, *a, **k):
        if self.armed:
            with self._count_lock:
                self.inside += 1
                self.peak = max(self.peak, self.inside)
            self.entered.set()
            try:
                assert self.gate.wait(WAIT * 2), "the test never released stream_info"
            finally:
                with self._count_lock:
                    self.inside -= 1
        return super().streams(*a, **k)


def test_a_slow_stream_info_holds_up_neither_the_loop_nor_other_clients() -> None:
    log = SlowInfoLog()
    srv = BackgroundServer(StreamService(log)).start()
    a = None
    try:
        with StreamClient(port=srv.port, timeout=5) as b:
            b.create_stream("s")
            assert b.push("s", b"b0") == 0
            log.armed = True
            # client A: five pipelined infos of every stream, then a push, on one connection
            back = route("app")
            info = codec.encode_payload(StreamInfoRequest(None))
            push = codec.encode_payload(PushRequest(7, b"a"))
            frames = [encode_frame(RoutingMessage(route("stream_service"), back, info))] * INFOS
            frames.append(encode_frame(RoutingMessage(route(worker_address("s", 0)), back, push)))
            a = socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT)
            a.sendall(TcpConnection.initial_bytes() + b"".join(frames))
            assert log.entered.wait(WAIT)
            # before: the loop waited in stream_info, and this push timed out
            assert b.push("s", b"b1") == 1
            assert [m.data for m in b.pull("s", 0, 10)] == [b"b0", b"b1"]
            log.gate.set()
            wire = TcpConnection(1 << 20)
            got: list[RoutingMessage] = []
            while len(got) < INFOS + 1:
                data = a.recv(1 << 16)
                assert data, f"closed after {len(got)} replies"
                got += wire.receive_data(data)
            infos = [codec.decode_response(m.payload, StreamInfoResponse) for m in got[:INFOS]]
            assert all(isinstance(r, StreamInfoResponse) for r in infos), infos
            # A's push waited for its infos (its connection's order), so it came after b1
            assert codec.decode_response(got[-1].payload, PushConfirm) == PushConfirm(7, "OK", 2)
        # one stream service request of a connection at a time
        assert log.peak == 1
    finally:
        log.gate.set()
        if a is not None:
            a.close()
        srv.stop()


PUSHES = 64
RECORD = 256 * 1024


def test_pushes_sent_behind_a_slow_stream_service_request_wait_in_the_socket() -> None:
    """Found from outside (review 9): 400 pushes of 4 MiB sent behind 15 slow CREATEs on one
    connection were all read and kept until the CREATEs were done (server RSS peak 1,062 MiB;
    the limits' design bound is ~512): what a connection sends behind its stream service
    request was counted by neither budget, only by ``max_queued_requests`` (20,000 messages).
    Now past ``HELD_INPUT`` bytes of it the connection is not read until the request is
    answered, and what is held counts in ``input_budget``. Scaled down: 64 pushes of 256 KiB
    (16 MiB) behind a ``stream_info`` the test holds."""
    log = SlowInfoLog()
    srv = BackgroundServer(StreamService(log)).start()
    server = srv.server
    assert server is not None
    a = None
    try:
        with StreamClient(port=srv.port, timeout=5) as b:
            b.create_stream("s")
        log.armed = True
        back = route("app")
        to = route(worker_address("s", 0))
        info = encode_frame(
            RoutingMessage(
                route("stream_service"), back, codec.encode_payload(StreamInfoRequest(None))
            )
        )
        data = [bytes([i]) * RECORD for i in range(PUSHES)]
        pushes = b"".join(
            encode_frame(RoutingMessage(to, back, codec.encode_push_request(i, d)))
            for i, d in enumerate(data)
        )
        a = socket.socket()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        a.settimeout(WAIT * 2)
        a.connect(("127.0.0.1", srv.port))
        a.sendall(TcpConnection.initial_bytes() + info)
        assert log.entered.wait(WAIT)
        sender = threading.Thread(target=a.sendall, args=(pushes,), daemon=True)
        sender.start()

        def held(server: StreamServer) -> tuple[bool, int, int] | None:
            c = next((c for c in server._conns if c.meta_busy), None)
            if c is None:
                return None
            return c.paused, sum(len(m.payload) for m in c.held_msgs), server._input_bytes

        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # until it is no longer read, or all is read
            st = on_loop(srv, held)
            if st is not None and (st[0] or not sender.is_alive()):
                break
            time.sleep(0.02)
        assert st is not None
        paused, kept, budgeted = st
        # before: all 16 MiB read and kept in memory, not counted
        assert kept <= 2 * RECORD, kept
        assert paused
        assert budgeted >= kept
        log.gate.set()
        sender.join(WAIT)
        assert not sender.is_alive()
        wire = TcpConnection(1 << 20)
        got: list[RoutingMessage] = []
        while len(got) < 1 + PUSHES:
            chunk = a.recv(1 << 16)
            assert chunk, f"closed after {len(got)} replies"
            got += wire.receive_data(chunk)
        assert isinstance(
            codec.decode_response(got[0].payload, StreamInfoResponse), StreamInfoResponse
        )
        confirms = [codec.decode_response(m.payload, PushConfirm) for m in got[1:]]
        assert confirms == [PushConfirm(i, "OK", i) for i in range(PUSHES)]
        assert [m.data for m in log.read("s", 0, PUSHES)] == data
        assert on_loop(srv, lambda s: s._input_bytes) == 0
    finally:
        log.gate.set()
        if a is not None:
            a.close()
        srv.stop()
