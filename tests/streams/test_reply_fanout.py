"""A CREATE's 4,096 INIT replies are framed as the client reads them, against a real server.

Found from outside (review 5, A3): a CREATE of 4,096 partitions is answered with one INIT
frame per partition (the reference's workers each send one), every frame carrying the
request's whole return route; all were framed and written at once, before flow control saw
them: a 262 KB request queued 1.07 GB for a client that never read (RSS 1,128 MB). Now the
replies wait unframed while the connection is over ``connection_output``, and all of them still
arrive, in order, once the client reads."""

from __future__ import annotations

import socket
import time

from loglake.log import StreamConfig, open_log
from loglake.streams import codec
from loglake.streams.limits import KiB
from loglake.streams.messages import CreatePartitionedStreamRequest, CreatePartitionedStreamResponse
from loglake.streams.server import StreamServer
from loglake.wire.ockam import Address, RoutingMessage, TcpConnection, encode_frame, route
from tests.streams.test_hostile_clients import attacker, on_loop, serving, unsent

PARTITIONS = 4096
BACK = tuple(Address.local(c * 500) for c in "RSTU")
"""A 2,000-byte return route of four hops, within the decoder's route bounds (512 bytes an
address, 4,096 in all: ``wire/ockam.py``)."""
BUDGET = 16 * KiB  # connection_output


def _create_frame() -> bytes:
    payload = codec.encode_payload(
        CreatePartitionedStreamRequest("fan", PARTITIONS), "stream_create_partitioned"
    )
    return encode_frame(RoutingMessage(route("stream_service"), BACK, payload))


def test_a_create_of_4096_partitions_is_framed_as_the_client_reads(tmp_path) -> None:
    log = open_log(tmp_path / "data")
    try:
        with serving(log, connection_output=BUDGET) as srv:
            s = attacker(srv.port)
            s.sendall(_create_frame())
            peak = 0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "fan" not in log.streams():
                time.sleep(0.05)
            for _ in range(10):  # the replies are made once the stream is
                time.sleep(0.1)
                peak = max(peak, on_loop(srv, unsent))
            # before: 4,096 frames of ~2 KB each (8.4 MB) written at once, what the kernel did
            # not take held by the server; now the budget and one chunk of frames past it
            assert peak <= 512 * KiB, peak
            # every INIT still comes, in partition order, once the client reads
            s.settimeout(10)
            wire = TcpConnection(1 << 20)
            got: list[int] = []
            while len(got) < PARTITIONS:
                data = s.recv(1 << 20)
                assert data, f"closed after {len(got)} replies"
                for m in wire.receive_data(data):
                    assert m.onward_route == BACK
                    r = codec.decode_response(m.payload, CreatePartitionedStreamResponse)
                    assert isinstance(r, CreatePartitionedStreamResponse), r
                    got.append(r.partition)
            assert got == list(range(PARTITIONS))
            s.close()
    finally:
        log.close()


WIDE = 512
CREATES = 24


def test_pipelined_creates_from_a_client_that_never_reads_hold_one_creates_replies(
    tmp_path,
) -> None:
    """Found from outside (review 9): a client that never read pipelined 3,000 CREATEs of an
    existing stream of 4,096 partitions. Reading it stopped at ``connection_output``, but the
    CREATEs already read went on being performed, each adding 4,096 unframed replies to its
    backlog (RSS 83 → 739 MiB in 52 s, climbing), and the output budget counted each at its
    33 payload bytes where it cost ~340. Now what came after a CREATE waits until its replies
    are sent, and a held reply counts at what it costs. Scaled down: 24 CREATEs of 512
    partitions on a 2,000-byte return route (12 MB of frames, more than the kernel's buffers
    take; before: ~8,000 replies held; now at most one CREATE's)."""
    log = open_log(tmp_path / "data")
    log.create_stream("wide", StreamConfig(partitions=WIDE, durability="none"))
    payload = codec.encode_payload(
        CreatePartitionedStreamRequest("wide", WIDE), "stream_create_partitioned"
    )
    one = encode_frame(RoutingMessage(route("stream_service"), BACK, payload))
    try:
        with serving(log, connection_output=BUDGET) as srv:
            s = attacker(srv.port)
            s.sendall(one * CREATES)

            def state(server: StreamServer) -> tuple[int, int, int, int] | None:
                c = next(iter(server._conns), None)
                if c is None or server._meta_running or not c.write_paused:
                    return None  # a CREATE is being performed, or its replies being written
                return len(c.backlog), c.backlog_bytes, c.queued, c.held

            deadline = time.monotonic() + 60
            while (st := on_loop(srv, state)) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert st is not None, "the CREATEs were still being performed after 60 s"
            backlog, counted, queued, held = st
            # before: every CREATE was performed, thousands of replies waiting unframed
            assert backlog <= WIDE, (backlog, queued)
            assert held == 0, held
            assert queued > 1, queued  # the rest wait, as requests or unread, for the client
            # each reply counts at its payload (33 bytes), routes and object (~250 more):
            # before, 33 each
            assert counted >= backlog * 200, (counted, backlog)
            # and every reply comes, in order, once the client reads
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            s.settimeout(20)
            wire = TcpConnection(1 << 20)
            got: list[int] = []
            while len(got) < CREATES * WIDE:
                data = s.recv(1 << 20)
                assert data, f"closed after {len(got)} replies"
                for m in wire.receive_data(data):
                    r = codec.decode_response(m.payload, CreatePartitionedStreamResponse)
                    assert isinstance(r, CreatePartitionedStreamResponse), r
                    got.append(r.partition)
            assert got == list(range(WIDE)) * CREATES
            s.close()
    finally:
        log.close()
