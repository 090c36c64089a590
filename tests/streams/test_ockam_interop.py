"""loglake against a reference-shaped Ockam peer over real TCP (``interop/ockam_peer.py``: a
client and a stream service written from the reference's schemas with ``cbor2``, no loglake
code): the peer's client against ``loglake serve`` (a subprocess), and loglake's client against
the peer's service — every stream message, the version byte, and the 5 s silence rule."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time

import pytest

from loglake.errors import LocalProtocolError, RemoteProtocolError
from loglake.log import InvalidStreamName, MemoryLog
from loglake.streams import codec
from loglake.streams.client import (
    AsyncStreamClient,
    StreamClient,
    StreamServiceError,
    _Addresses,
)
from loglake.streams.messages import Init
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService
from loglake.wire.ockam import Address, RoutingMessage, route
from tests.procs import free_port, wait_port
from tests.streams.interop import ockam_peer as ref
from tests.streams.interop.ockam_peer import PeerClient, PeerServer, local

SERVICE = [local("stream_service")]
INDEX = [local("stream_index_service")]


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """``loglake serve`` in a subprocess; yields its port."""
    port = free_port()
    data = tmp_path_factory.mktemp("serve")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loglake.cli",
            "serve",
            "--data-dir",
            str(data),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def peer(port: int) -> PeerClient:
    return PeerClient("127.0.0.1", port)


# -- the reference-shaped client against loglake serve ----------------------------------------
def test_serve_exchanges_version_bytes(serve) -> None:
    with socket.create_connection(("127.0.0.1", serve), timeout=10) as s:
        assert ref.read_exact(s, 1) == b"\x01"  # the service speaks first, without waiting


def test_reference_create_push_pull(serve) -> None:
    with peer(serve) as c:
        init = c.call(SERVICE, ref.create("interop_plain"))
        assert ref.decode_response(init.payload) == ("stream_create", ("interop_plain",))
        worker = init.ret  # INIT comes from the partition's worker
        assert init.onward == [local("app")]
        confirms = []
        for rid, payload in enumerate([b"one", b"two", b"x" * 3000]):
            c.send(worker, ref.push(rid + 10, payload), ret="pusher")
            confirms.append(c.recv())
        assert [ref.decode_response(m.payload) for m in confirms] == [
            ("stream_push", (10, "ok", 0)),
            ("stream_push", (11, "ok", 1)),
            ("stream_push", (12, "ok", 2)),
        ]
        assert all(m.onward == [local("pusher")] and m.ret == worker for m in confirms)
        got = c.call(worker, ref.pull(7, 1, 10), ret="puller")
        assert ref.decode_response(got.payload) == (
            "stream_pull",
            (7, [(1, b"two"), (2, b"x" * 3000)]),
        )


def test_reference_push_with_a_tracing_context(serve) -> None:
    with peer(serve) as c:
        worker = c.call(SERVICE, ref.create("interop_traced")).ret
        c.send(worker, ref.push(1, b"t"), tracing="00-trace-span-01")
        assert ref.decode_response(c.recv().payload) == ("stream_push", (1, "ok", 0))


def test_reference_partitioned_create_and_index(serve) -> None:
    with peer(serve) as c:
        c.send(SERVICE, ref.create_partitioned("interop_parts", 3))
        inits = [c.recv() for _ in range(3)]
        got = sorted(ref.decode_response(m.payload) for m in inits)
        assert got == [("stream_create_partitioned", ("interop_parts", p)) for p in range(3)]
        reply = c.call(INDEX, ref.index_get_partitioned("me", "interop_parts", 2))
        assert ref.decode_response(reply.payload) == (
            "stream_index_partitioned",
            ("me", "interop_parts", 2, 0),
        )
        c.send(INDEX, ref.index_save_partitioned("me", "interop_parts", 2, 7))
        assert c.nothing_within(0.5)  # a save is a cast: no reply
        reply = c.call(INDEX, ref.index_get_partitioned("me", "interop_parts", 2))
        assert ref.decode_response(reply.payload)[1] == ("me", "interop_parts", 2, 7)


def test_reference_create_for_more_partitions_grows_the_stream(serve) -> None:
    """stream/workers/service.ex ``ensure_streams``: every partition 0..n-1 answers INIT from
    its worker, the missing ones newly started; what the old ones hold stays."""
    with peer(serve) as c:
        c.send(SERVICE, ref.create_partitioned("interop_grow", 2))
        old = {ref.decode_response(m.payload)[1][1]: m.ret for m in (c.recv(), c.recv())}
        c.send(old[1], ref.push(1, b"before"))
        assert ref.decode_response(c.recv().payload) == ("stream_push", (1, "ok", 0))
        c.send(SERVICE, ref.create_partitioned("interop_grow", 4))
        inits = [c.recv() for _ in range(4)]
        got = {ref.decode_response(m.payload)[1][1]: m.ret for m in inits}
        assert sorted(ref.decode_response(m.payload) for m in inits) == [
            ("stream_create_partitioned", ("interop_grow", p)) for p in range(4)
        ]
        assert got[0] == old[0] and got[1] == old[1]
        c.send(got[3], ref.push(2, b"after"))
        assert ref.decode_response(c.recv().payload) == ("stream_push", (2, "ok", 0))
        reply = c.call(got[1], ref.pull(3, 0, 10))
        assert ref.decode_response(reply.payload) == ("stream_pull", (3, [(0, b"before")]))


def test_reference_plain_index_save_gets_no_reply(serve) -> None:
    with peer(serve) as c:
        c.call(SERVICE, ref.create("interop_idx"))
        c.send(INDEX, ref.index_save("me", "interop_idx", 4))
        c.send(INDEX, ref.index_save("me", "nosuch_stream", 4))  # a failed save: silent too
        assert c.nothing_within(0.5)
        reply = c.call(INDEX, ref.index_get("me", "interop_idx"))
        assert ref.decode_response(reply.payload) == ("stream_index", ("me", "interop_idx", 4))


def test_reference_index_get_of_an_unknown_stream_or_partition_is_an_index_with_none(serve):
    """The reference's index service answers every get with an Index; for a (client, stream)
    it holds nothing for, with index ``none`` (storage/internal.ex ``:undefined``), streams
    unknown to it or not. loglake answered an ``error`` a reference consumer only logs."""
    with peer(serve) as c:
        reply = c.call(INDEX, ref.index_get("me", "interop_nosuch"))
        assert reply.ret == INDEX
        assert reply.payload == ref.index_response("me", "interop_nosuch", None)
        assert ref.decode_response(reply.payload) == (
            "stream_index",
            ("me", "interop_nosuch", None),
        )
        c.send(SERVICE, ref.create_partitioned("interop_few", 2))
        for _ in range(2):  # the INITs
            c.recv()
        reply = c.call(INDEX, ref.index_get_partitioned("me", "interop_few", 5))
        assert ref.decode_response(reply.payload) == (
            "stream_index_partitioned",
            ("me", "interop_few", 5, None),
        )


def test_reference_error_reply(serve) -> None:
    """The reference's stream service answers a refused CREATE (an empty name: ``return_error``
    in workers/service.ex) and an undecodable one with the error ``Invalid request`` from
    ``stream_service``; a worker answers an undecodable request alike (workers/stream.ex)."""
    invalid = ref.error("Invalid request")
    assert invalid == b"\x05error\x10\x0fInvalid request"
    with peer(serve) as c:
        for request in [ref.create(""), ref.base("stream_create", b"\x07"), ref.pull(1, 0, 1)]:
            reply = c.call(SERVICE, request)
            assert reply.payload == invalid
            assert reply.ret == [local("stream_service")]
        worker = c.call(SERVICE, ref.create("interop_err")).ret
        reply = c.call(worker, ref.base("stream_push", b"\x01\x09ab"))
        assert reply.payload == invalid and reply.ret == worker


def test_reference_create_for_0_partitions_gets_invalid_request_not_silence(serve) -> None:
    """The reference sends nothing for 0 partitions (``ensure_streams`` starts a worker per
    ``:lists.seq(0, -1)``, none, and only workers send INIT): a choice of loglake's to answer
    it, at once, with the reference's own refusal; and no stream is made."""
    with peer(serve) as c:
        reply = c.call(SERVICE, ref.create_partitioned("interop_zero", 0))
        assert reply.payload == ref.error("Invalid request")
        assert reply.ret == [local("stream_service")]
        reply = c.call(INDEX, ref.index_get("me", "interop_zero"))  # no stream: no record
        assert ref.decode_response(reply.payload)[1] == ("me", "interop_zero", None)


@pytest.mark.parametrize(
    "body",
    [
        bytes.fromhex("83808040"),  # the old 3-item TCPMessage
        bytes.fromhex("8481a20000014161808040f6"),  # an address as a map
        bytes.fromhex("ff"),
    ],
    ids=["three-items", "map-address", "not-cbor"],
)
def test_a_frame_that_is_not_a_tcp_message_closes_the_connection(serve, body: bytes) -> None:
    with peer(serve) as c:
        c.sock.sendall(struct.pack(">I", len(body)) + body)
        c.sock.settimeout(10)
        assert c.sock.recv(1) == b""  # closed, with nothing sent back
    with peer(serve) as c:  # the service is unharmed
        assert ref.decode_response(c.call(SERVICE, ref.create("after_bad")).payload)[0] == (
            "stream_create"
        )


@pytest.mark.slow  # waits out the reference's 5 s
def test_a_peer_silent_after_connecting_is_dropped_after_5_seconds(serve) -> None:
    with socket.create_connection(("127.0.0.1", serve), timeout=20) as s:
        t0 = time.monotonic()
        assert ref.read_exact(s, 1) == b"\x01"
        assert s.recv(1) == b""  # closed by the service
        waited = time.monotonic() - t0
    assert 4.5 <= waited <= 9.0, waited


@pytest.mark.slow  # waits out the reference's 5 s
def test_a_peer_that_sent_its_version_byte_is_kept_past_5_seconds(serve) -> None:
    with peer(serve) as c:
        assert c.nothing_within(6.0)  # not dropped: the connection is idle, not silent
        assert ref.decode_response(c.call(SERVICE, ref.create("still_here")).payload)[0] == (
            "stream_create"
        )


# -- loglake's client against the reference-shaped service ------------------------------------
def test_loglake_client_against_a_reference_service() -> None:
    with PeerServer() as srv, StreamClient(port=srv.port, timeout=10) as c:
        assert c.create_stream("s") == "s"
        assert c.push("s", b"a") == 0
        assert c.push_many("s", [b"b", b"c"]) == [1, 2]
        assert [(m.index, m.data) for m in c.pull("s", 0, 10)] == [(0, b"a"), (1, b"b"), (2, b"c")]
        assert c.get_index("me", "s") == 0
        assert c.save_index("me", "s", 2) == 2
        assert c.create_stream("p", 2) == "p"
        assert c.push("p", b"z", partition=1) == 0
        assert c.get_index("me", "p", partition=1) == 0
        assert c.save_index("me", "p", 5, partition=1) == 5
        assert c.save_index("me", "p", 3, partition=1) == 5  # monotonic
        seen = srv.service.seen
        assert srv.errors == [] and srv.versions == [b"\x01"]
    # the reference's protocol names, saves as casts that the service never answered
    assert ("stream_create_partitioned", "create") in seen
    assert ("stream_index_partitioned", "get") in seen
    assert ("stream_index_partitioned", "save") in seen
    assert ("stream_index", "save") in seen
    assert not any(n == "stream_create_partitions" for n, _ in seen)
    answered = [ref.decode_response(m.payload)[0] for m in srv.service.sent]
    assert answered.count("stream_index") + answered.count("stream_index_partitioned") == 5


def test_loglake_client_follows_every_hop_of_the_init_return_route() -> None:
    """The reference clients send to the INIT's whole return route (Elixir
    ``stream/client/publisher.ex`` ``add_stream(…, Message.return_route(message))``; Rust
    ``stream/producer.rs`` ``w.route = return_route``): a worker behind a hop is reached
    through it. Following only the first hop, every push and pull ended at the hop."""
    with PeerServer() as srv, StreamClient(port=srv.port, timeout=5) as c:
        srv.service.hop = "relay_1"
        assert c.create_stream("p", 2) == "p"
        assert c.addresses.map[("p", 1)] == (Address.local("relay_1"), Address.local("w_p_1"))
        assert c.push("p", b"a", partition=1) == 0
        assert c.push_many("p", [b"b", b"c"], partition=1) == [1, 2]
        assert [(m.index, m.data) for m in c.pull("p", 0, 10, partition=1)] == [
            (0, b"a"),
            (1, b"b"),
            (2, b"c"),
        ]
        assert srv.service.dropped == [] and srv.errors == []
    assert srv.service.streams[("p", 1)] == [b"a", b"b", b"c"]


def test_the_async_client_follows_every_hop_of_the_init_return_route() -> None:
    import asyncio

    async def run(port: int) -> list[tuple[int, bytes]]:
        c = await AsyncStreamClient.connect(port=port)
        try:
            await c.create_stream("q")
            await c.push_many("q", [b"x", b"y"])
            return [(m.index, m.data) for m in await c.pull("q", 0, 10)]
        finally:
            await c.close()

    with PeerServer() as srv:
        srv.service.hop = "relay_1"
        got = asyncio.run(asyncio.wait_for(run(srv.port), 5))
        assert srv.service.dropped == []
    assert got == [(0, b"x"), (1, b"y")]


def test_an_init_without_a_return_route_is_a_protocol_error() -> None:
    replies = [
        RoutingMessage(route("r1"), (), codec.encode_payload(Init("s"))),
    ]
    with pytest.raises(RemoteProtocolError, match="empty return route"):
        _Addresses().learn(replies, Init)


def test_loglake_client_reports_a_save_the_service_did_not_store() -> None:
    # the reference answers no save, so a lost one shows only in the get that follows it
    with PeerServer() as srv, StreamClient(port=srv.port, timeout=10) as c:
        c.create_stream("s")
        srv.service.drop_saves = True
        with pytest.raises(StreamServiceError, match=r"did not store index 5 .* holds 0"):
            c.save_index("me", "s", 5)
        assert c.save_index("me", "s", 0) == 0  # a save at or below what is stored is kept


def test_loglake_client_reads_an_absent_index_as_0_from_a_reference_service() -> None:
    """A reference node answers a consumer that never saved with index ``none``; the clients
    return 0, as a reference consumer starts there (client/consumer.ex), after a
    ``loglake_stream_info`` the reference refuses with ``Invalid request``."""
    import asyncio

    async def run(port: int) -> int:
        c = await AsyncStreamClient.connect(port=port)
        try:
            return await c.get_index("you", "s")
        finally:
            await c.close()

    with PeerServer() as srv, StreamClient(port=srv.port, timeout=10) as c:
        srv.service.undefined_index = True
        c.create_stream("s")
        assert c.get_index("me", "s") == 0
        assert c.save_index("me", "s", 2) == 2
        assert asyncio.run(asyncio.wait_for(run(srv.port), 5)) == 0
        answered = [ref.decode_response(m.payload) for m in srv.service.sent]
    assert ("stream_index", ("me", "s", None)) in answered
    assert ("loglake_stream_info", "unknown") in srv.service.seen


def test_the_async_client_against_a_reference_service() -> None:
    import asyncio

    async def run(port: int) -> tuple[int, int]:
        c = await AsyncStreamClient.connect(port=port)
        try:
            await c.create_stream("a", 2)
            saved = await c.save_index("me", "a", 3, partition=1)
            return saved, await c.get_index("me", "a", partition=1)
        finally:
            await c.close()

    with PeerServer() as srv:
        assert asyncio.run(run(srv.port)) == (3, 3)
        seen = srv.service.seen
    assert seen == [
        ("stream_create_partitioned", "create"),
        ("stream_index_partitioned", "save"),
        ("stream_index_partitioned", "get"),
        ("stream_index_partitioned", "get"),
    ]


# -- the silence rule's limit is a parameter -------------------------------------------------
@pytest.fixture
def quick_server():
    with BackgroundServer(StreamService(MemoryLog()), version_timeout=0.3) as srv:
        yield srv.port


def test_a_silent_peer_is_dropped_after_the_servers_version_timeout(quick_server) -> None:
    with socket.create_connection(("127.0.0.1", quick_server), timeout=10) as s:
        t0 = time.monotonic()
        assert ref.read_exact(s, 1) == b"\x01"
        assert s.recv(1) == b""
        assert time.monotonic() - t0 < 3.0


def test_a_version_byte_after_the_timeout_comes_too_late(quick_server) -> None:
    with socket.create_connection(("127.0.0.1", quick_server), timeout=10) as s:
        assert ref.read_exact(s, 1) == b"\x01"
        time.sleep(0.8)
        with pytest.raises(OSError):  # closed: the write or the read fails, or reads EOF
            s.sendall(b"\x01" + ref.frame(ref.Message(SERVICE, [local("app")], ref.create("x"))))
            if s.recv(1) == b"":
                raise ConnectionResetError("closed")


def test_a_client_that_sent_its_version_byte_is_kept(quick_server) -> None:
    with StreamClient(port=quick_server, timeout=10) as c:
        time.sleep(0.8)
        assert c.create_stream("kept") == "kept"


def test_loglake_client_checks_a_create_before_sending_it() -> None:
    """The service answers a refused CREATE with the reference's bare ``Invalid request``, so
    the client gives the reason itself, as ``LocalStreams`` would, and sends nothing."""
    with PeerServer() as srv, StreamClient(port=srv.port, timeout=5) as c:
        with pytest.raises(InvalidStreamName, match="invalid stream name"):
            c.create_stream("bad/name")
        with pytest.raises(InvalidStreamName):
            c.create_stream("")
        with pytest.raises(LocalProtocolError, match="partitions must be >= 1"):
            c.create_stream("ok", 0)
        assert c.create_stream("ok") == "ok"
    assert srv.service.seen == [("stream_create", "create")]
