"""Hostile Ockam frames: bounded time and memory, typed errors, bounded routes and caches.

Found from outside (review 5, over real TCP against ``loglake serve``):
- a 33,554,415-byte frame — ``0x84``, then an onward route declared as 33.5 M items each the
  empty array ``0x80`` — took the server 11.7 s and 2.4 GB before it closed the connection, and
  an honest client's push waited 11.47 s: ``cbor2`` built the whole term before the shape was
  checked (a 4 MiB frame in process: 2.6 s, 314 MB);
- routes had no bound: a CREATE of 4,096 partitions on a single 256 KiB return address queued
  1.07 GB of replies (every reply's frame head carries the route);
- decoded addresses and encoded routes were cached whatever their size: 300 requests each with a
  distinct 1 MiB return address left the server at 708 MB after the client had gone.
"""

from __future__ import annotations

import gc
import socket
import struct
import time
import tracemalloc

import pytest

from loglake.wire import ockam
from loglake.wire.ockam import (
    MAX_ADDRESS_BYTES,
    MAX_ROUTE_ADDRESSES,
    MAX_ROUTE_BYTES,
    Address,
    OckamWireLimit,
    RoutingMessage,
    TcpConnection,
    decode_transport_message,
    encode_frame,
    encode_route,
    encode_transport_message,
    route,
    routes_prefix,
    tcp_address,
)

BOMB = 4 * 1024 * 1024
"""Bytes of a bomb: the review's in-process size (2.6 s and 314 MB before the fix)."""


def _empties(n: int) -> bytes:
    """An array declared as ``n`` items (4-byte count), each the empty array ``0x80``."""
    return b"\x9a" + struct.pack(">I", n) + b"\x80" * n


BOMBS = {
    # the review's frame: the onward route declared as millions of empty arrays
    "onward route of empty arrays": b"\x84" + _empties(BOMB) + b"\x80\x40\xf6",
    "return route of empty arrays": b"\x84\x80" + _empties(BOMB) + b"\x40\xf6",
    # no count in the head: an indefinite route of well-formed addresses, counted as they come
    "indefinite route of addresses": b"\x84\x9f"
    + b"\x82\x00\x40" * (BOMB // 3)
    + b"\xff\x80\x40\xf6",
    "payload in one-byte chunks": b"\x84\x80\x80\x5f" + b"\x41a" * (BOMB // 2) + b"\xff\xf6",
    "tracing context of empty arrays": b"\x84\x80\x80\x40" + _empties(BOMB),
    "message of empty arrays": _empties(BOMB),
    "address value of 4 MiB": b"\x84\x81\x82\x00\x5a" + struct.pack(">I", BOMB) + bytes(BOMB)
    + b"\x80\x40\xf6",
}  # fmt: skip


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_hostile_frame_is_refused_in_bounded_time_and_memory(name: str) -> None:
    body = BOMBS[name]
    t0 = time.perf_counter()
    with pytest.raises(ockam.OckamWireError):
        decode_transport_message(body)
    assert time.perf_counter() - t0 < 0.2
    tracemalloc.start()
    try:
        with pytest.raises(ockam.OckamWireError):
            decode_transport_message(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"{peak:,} bytes allocated decoding a {len(body):,}-byte frame"


def test_the_review_frame_through_a_connection_keeps_what_came_before() -> None:
    """The frame the review sent (33,554,415 bytes, just under the server's 32 MiB limit):
    refused with ``OckamWireLimit`` from its route's head; the message before it is kept."""
    n = 32 * 1024 * 1024 - 16 - 10
    body = b"\x84" + _empties(n) + b"\x80\x40\xf6"
    ok = RoutingMessage(route("stream_service"), route("app"), b"\x01")
    conn = TcpConnection()
    wire = b"\x01" + encode_frame(ok) + struct.pack(">I", len(body)) + body
    t0 = time.perf_counter()
    assert conn.receive_data(wire) == [ok]
    assert time.perf_counter() - t0 < 0.5  # the decode is O(1); copying 32 MiB is the rest
    assert isinstance(conn.error, OckamWireLimit)


def _address_of(size: int, i: int = 0) -> Address:
    return Address(0, (b"%06d" % i + b"a" * size)[:size])


def _with_return_route(ret: tuple[Address, ...]) -> bytes:
    return encode_transport_message(RoutingMessage(route("stream_service"), ret, b"\x01"))


@pytest.mark.parametrize(
    "ret",
    [
        tuple(_address_of(1, i) for i in range(MAX_ROUTE_ADDRESSES + 1)),
        (_address_of(MAX_ADDRESS_BYTES + 1),),
        tuple(_address_of(MAX_ADDRESS_BYTES, i) for i in range(MAX_ROUTE_BYTES // 512 + 1)),
        (_address_of(256 * 1024),),  # the review's CREATE: 1.07 GB of replies queued
    ],
    ids=["33 addresses", "an address of 513 bytes", "4,608 bytes of addresses", "256 KiB"],
)
def test_a_route_over_the_limits_is_refused(ret: tuple[Address, ...]) -> None:
    with pytest.raises(OckamWireLimit):
        decode_transport_message(_with_return_route(ret))
    # the same as the onward route
    body = encode_transport_message(RoutingMessage(ret, route("app"), b""))
    with pytest.raises(OckamWireLimit):
        decode_transport_message(body)


def test_routes_at_the_limits_and_real_routes_are_read() -> None:
    host = ("h" * 63 + ".") * 3 + "h" * 61  # 253 characters, the longest DNS name
    real = (tcp_address(host, 65535), Address.local("0123456789abcdef" * 2), Address.local("app"))
    for ret in (
        tuple(_address_of(MAX_ROUTE_BYTES // MAX_ROUTE_ADDRESSES, i) for i in range(32)),
        tuple(_address_of(MAX_ADDRESS_BYTES, i) for i in range(MAX_ROUTE_BYTES // 512)),
        real,
    ):
        m = RoutingMessage(real, ret, b"payload")
        assert decode_transport_message(encode_transport_message(m)) == m


def test_a_reply_head_to_any_readable_route_is_bounded() -> None:
    """What a reply frame carries of a peer's route: at most one route at the limits."""
    worst = tuple(_address_of(MAX_ROUTE_BYTES // MAX_ROUTE_ADDRESSES, i) for i in range(32))
    msg = decode_transport_message(_with_return_route(worst))
    assert len(routes_prefix(msg.return_route, route("stream_service/s/0"))) < 5 * 1024


def _retained(work) -> int:
    """Bytes still allocated after ``work()`` and a collection (what a cache kept)."""
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        work()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before


def test_decoding_and_answering_distinct_long_addresses_keeps_nothing() -> None:
    """The review's a4 within the route limits: 1,000 requests, each from a distinct 500-byte
    return address, decoded and answered (the reply's route encoded), then dropped."""
    bodies = [_with_return_route((_address_of(500, i),)) for i in range(1000)]

    def work() -> None:
        for b in bodies:
            m = decode_transport_message(b)
            ockam.encode_frames([RoutingMessage(m.return_route, route("stream_service"), b"")])

    assert _retained(work) < 100 * 1024


def test_encoding_long_routes_keeps_nothing() -> None:
    """A route built locally is not bounded by the decoder: the encoder's cache keeps only
    small ones (20 routes of 1 MiB were kept, 20 MiB, before)."""
    routes = [(_address_of(1 << 20, i),) for i in range(20)]

    def work() -> None:
        for r in routes:
            encode_route(r)

    assert _retained(work) < 100 * 1024


def test_small_routes_are_still_cached() -> None:
    r = route("stream_service/s/0")
    assert encode_route(r) is encode_route(route("stream_service/s/0"))
    body = _with_return_route(route("p0"))
    assert (
        decode_transport_message(body).return_route[0]
        is (decode_transport_message(body).return_route[0])
    )


# -- over TCP, as the review ran it --------------------------------------------------------------


def _recv_until_closed(s: socket.socket, limit: float) -> float:
    t0 = time.perf_counter()
    s.settimeout(limit)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.perf_counter() - t0


def test_a_bomb_over_tcp_closes_its_connection_at_once_and_others_are_served() -> None:
    from loglake.log import MemoryLog
    from loglake.streams import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    body = BOMBS["onward route of empty arrays"]
    with (
        BackgroundServer(StreamService(MemoryLog())) as srv,
        StreamClient("127.0.0.1", srv.port) as honest,
    ):
        honest.create_stream("s")
        honest.push("s", b"before", partition=0)
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        try:
            s.sendall(b"\x01")
            assert s.recv(1) == b"\x01"
            t0 = time.perf_counter()
            s.sendall(struct.pack(">I", len(body)) + body)
            s.shutdown(socket.SHUT_WR)
            _recv_until_closed(s, 10.0)
            closed = time.perf_counter() - t0
        finally:
            s.close()
        t1 = time.perf_counter()
        honest.push("s", b"after", partition=0)
        pushed = time.perf_counter() - t1
    # before: 2.6 s of decoding (and 314 MB) on the event loop for this 4 MiB frame
    assert closed < 1.0, f"connection closed after {closed:.2f} s"
    assert pushed < 1.0
