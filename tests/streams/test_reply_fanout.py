"""A CREATE's 4,096 INIT replies are framed as the client reads them, against a real server.

Found from outside (review 5, A3): a CREATE of 4,096 partitions is answered with one INIT
frame per partition (the reference's workers each send one), every frame carrying the
request's whole return route; all were framed and written at once, before flow control saw
them: a 262 KB request queued 1.07 GB for a client that never read (RSS 1,128 MB). Now the
replies wait unframed while the connection is over ``connection_output``, and all of them still
arrive, in order, once the client reads."""

from __future__ import annotations

import time

from loglake.log import open_log
from loglake.streams import codec
from loglake.streams.limits import KiB
from loglake.streams.messages import CreatePartitionedStreamRequest, CreatePartitionedStreamResponse
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
