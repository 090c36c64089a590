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

from loglake.log.memory import MemoryLog
from loglake.streams import codec
from loglake.streams.client import StreamClient
from loglake.streams.messages import PushConfirm, PushRequest, StreamInfoRequest, StreamInfoResponse
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import RoutingMessage, TcpConnection, encode_frame, route

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
