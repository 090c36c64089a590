"""Protocol tests through the real asyncio TCP server and the real clients (loopback)."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading

import pytest

from loglake.log import UnknownPartition, UnknownStream, open_log
from loglake.streams import codec
from loglake.streams.api import Streams
from loglake.streams.client import AsyncStreamClient, StreamClient
from loglake.streams.messages import PushRequest
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import RoutingMessage, TcpConnection, encode_frame, route


@pytest.fixture
def server(memory_log):
    with BackgroundServer(StreamService(memory_log)) as srv:
        yield srv


@pytest.fixture
def client(server):
    with StreamClient(port=server.port, timeout=10) as c:
        yield c


def test_client_implements_the_streams_protocol(client) -> None:
    assert isinstance(client, Streams)


def test_create_push_pull_index_round_trip(client) -> None:
    name = client.create_stream("orders", partitions=2)
    assert name == "orders"
    assert client.push("orders", b"a", partition=1) == 0
    assert client.push_many("orders", [b"b", b"c"], partition=1) == [1, 2]
    got = client.pull("orders", 1, 10, partition=1)
    assert [(m.index, m.data) for m in got] == [(1, b"b"), (2, b"c")]
    assert client.pull("orders", 0, 10, partition=0) == []
    assert client.get_index("me", "orders", 1) == 0
    assert client.save_index("me", "orders", 2, 1) == 2
    assert client.save_index("me", "orders", 1, 1) == 2  # monotonic


def test_random_stream_name(client) -> None:
    name = client.create_stream()
    assert name.startswith("generated_")
    assert client.push(name, b"x") == 0


def test_a_second_client_finds_a_stream_it_did_not_create(server, client) -> None:
    client.create_stream("t", 3)
    client.push("t", b"x", 2)
    with StreamClient(port=server.port, timeout=10) as other:
        assert [m.data for m in other.pull("t", 0, 5, partition=2)] == [b"x"]
        with pytest.raises(UnknownPartition):
            other.push("t", b"y", partition=3)


def test_unknown_stream_raises_unknown_stream(client) -> None:
    with pytest.raises(UnknownStream):
        client.pull("nope", 0, 1)
    with pytest.raises(UnknownStream):
        client.get_index("c", "nope")


def test_partitions_through_stream_info(server, client) -> None:
    client.create_stream("p3", 3)
    client.create_stream("p1")
    assert client.partitions("p3") == 3
    with StreamClient(port=server.port, timeout=10) as other:  # a client that did not create it
        assert other.partitions("p3") == 3
        assert other.partitions("p1") == 1
    with pytest.raises(UnknownStream) as e:
        client.partitions("nope")
    assert e.value.stream == "nope"

    async def main() -> None:
        async with await AsyncStreamClient.connect(port=server.port) as c:
            assert await c.partitions("p3") == 3
            with pytest.raises(UnknownStream):
                await c.partitions("nope")

    asyncio.run(main())


def test_large_pipelined_push_many(client) -> None:
    client.create_stream("big")
    datas = [i.to_bytes(4, "big") * 256 for i in range(3000)]  # 1 KB each
    assert client.push_many("big", datas) == list(range(3000))
    got = client.pull("big", 2990, 100)
    assert [m.data for m in got] == datas[2990:]


def test_concurrent_clients_get_unique_indexes(server) -> None:
    with StreamClient(port=server.port) as c:
        c.create_stream("shared", 2)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            with StreamClient(port=server.port, timeout=20, window=50) as c:
                results[k] = c.push_many("shared", [f"{k}:{i}".encode() for i in range(300)], k % 2)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for p in (0, 1):
        idx = [i for k, v in results.items() if k % 2 == p for i in v]
        assert sorted(idx) == list(range(900))  # unique, no gaps, per partition
    with StreamClient(port=server.port) as c:
        msgs = c.pull("shared", 0, 1000, partition=0)
        assert len(msgs) == 900
        for m in msgs:  # each index holds what its pusher was told
            k, i = map(int, m.data.decode().split(":"))
            assert results[k][i] == m.index


def test_async_client_with_concurrent_calls(server) -> None:
    async def main() -> None:
        async with await AsyncStreamClient.connect(port=server.port) as c:
            await c.create_stream("a", 2)
            r = await asyncio.gather(
                c.push_many("a", [b"x"] * 500, 0),
                c.push_many("a", [b"y"] * 500, 1),
                c.get_index("z", "a", 1),
            )
            assert r[0] == list(range(500)) and r[1] == list(range(500)) and r[2] == 0
            assert [m.data for m in await c.pull("a", 498, 5, 1)] == [b"y", b"y"]
            assert await c.save_index("z", "a", 7, 1) == 7
            assert await c.list_streams() == ["a"]
            with pytest.raises(UnknownStream):
                await c.pull("nope", 0, 1)

    asyncio.run(main())


# -- bad clients -------------------------------------------------------------------------------
def raw(server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    assert s.recv(1) == b"\x01"  # handler.ex: the server sends the version byte first
    return s


def closed_by_server(s: socket.socket) -> bool:
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x02" + b"\x00\x00\x00\x01\xa0",  # wrong protocol version
        b"\x01" + struct.pack(">I", 1 << 30),  # frame over the size limit
        b"\x01" + struct.pack(">I", 3) + b"\xff\xff\xff",  # not CBOR
        b"\x01" + struct.pack(">I", 1) + b"\xa0",  # CBOR, not a TCPMessage
    ],
    ids=["version", "oversized", "not-cbor", "not-tcpmessage"],
)
def test_bad_frames_close_only_that_connection(
    server, client, garbage: bytes, caplog, monkeypatch
) -> None:
    # the main CLI's logging setup (run by other tests) stops propagation; caplog needs it
    monkeypatch.setattr(logging.getLogger("loglake"), "propagate", True)
    client.create_stream("s")
    client.push("s", b"before")
    bad = raw(server)
    with caplog.at_level(logging.WARNING, logger="loglake.streams.server"):
        bad.sendall(garbage)
        assert closed_by_server(bad)
    bad.close()
    closing = [r for r in caplog.records if r.getMessage().startswith("closing connection")]
    assert closing and closing[0].fields["reason"]  # the reason is logged
    assert client.push("s", b"after") == 1  # the server is up, the other client unaffected
    assert [m.data for m in client.pull("s", 0, 10)] == [b"before", b"after"]


def test_valid_messages_before_a_bad_frame_are_answered(server, client) -> None:
    client.create_stream("s")
    s = raw(server)
    msg = RoutingMessage(
        route(worker_address("s", 0)), route("r1"), codec.encode_payload(PushRequest(1, b"ok"))
    )
    s.sendall(b"\x01" + encode_frame(msg) + struct.pack(">I", 2) + b"\xff\xff")
    conn = TcpConnection()
    conn.receive_data(b"\x01")  # raw() consumed the server's version byte
    got = []
    while True:
        data = s.recv(65536)
        if not data:
            break
        got += conn.receive_data(data)
    assert len(got) == 1 and got[0].onward_route == route("r1")
    assert client.pull("s", 0, 5)[0].data == b"ok"


def test_malformed_payload_gets_an_error_reply_and_the_connection_stays(server, client) -> None:
    client.create_stream("s")
    s = raw(server)
    bad = RoutingMessage(route(worker_address("s", 0)), route("r1"), b"\x03abc")
    s.sendall(b"\x01" + encode_frame(bad) + encode_frame(bad))
    conn = TcpConnection()
    conn.receive_data(b"\x01")
    got = []
    while len(got) < 2:
        got += conn.receive_data(s.recv(65536))
    for m in got:
        assert codec.decode_base(m.payload).protocol == "error"
    s.close()
    assert client.pull("s", 0, 5) == []  # nothing stored


def test_client_reports_a_server_that_is_not_there() -> None:
    from loglake.errors import Unavailable
    from tests.procs import free_port

    with pytest.raises(Unavailable, match="cannot connect") as e:
        StreamClient(port=free_port(), timeout=2)
    assert e.value.retriable


def test_server_on_the_embedded_log(tmp_path) -> None:
    log = open_log(tmp_path)
    try:
        with BackgroundServer(StreamService(log)) as srv, StreamClient(port=srv.port) as c:
            c.create_stream("durable", 2)
            assert c.push_many("durable", [b"a", b"b"], 1) == [0, 1]
            c.save_index("me", "durable", 2, 1)
    finally:
        log.close()
    log = open_log(tmp_path)  # reopen: records and consumer index survived
    try:
        with BackgroundServer(StreamService(log)) as srv, StreamClient(port=srv.port) as c:
            assert [m.data for m in c.pull("durable", 0, 10, 1)] == [b"a", b"b"]
            assert c.get_index("me", "durable", 1) == 2
    finally:
        log.close()


def test_push_to_a_worker_that_is_not_a_stream_fails_all_pushes_in_flight(client) -> None:
    from loglake.wire.ockam import Address

    client.addresses.map[("ghost", 0)] = (Address.local(worker_address("ghost", 0)),)
    with pytest.raises(UnknownStream):
        client.push_many("ghost", [b"a", b"b", b"c"])
    client.create_stream("real")
    assert client.push("real", b"x") == 0  # the connection is still usable
    # the stream appears later under that name: the errors left over from the failed pushes
    # must not fail the new ones
    client.create_stream("ghost")
    assert client.push_many("ghost", [b"a", b"b"]) == [0, 1]


def test_async_push_error_lane(server) -> None:
    from loglake.wire.ockam import Address

    async def main() -> None:
        async with await AsyncStreamClient.connect(port=server.port) as c:
            c.addresses.map[("ghost", 0)] = (Address.local(worker_address("ghost", 0)),)
            with pytest.raises(UnknownStream):
                await c.push_many("ghost", [b"a"] * 10)
            await c.create_stream("real")
            assert await c.push("real", b"x") == 0

    asyncio.run(main())


def test_a_loop_thread_serves_its_value_then_stops_it_on_its_loop() -> None:
    import asyncio
    import threading

    from loglake.streams.server import LoopThread

    seen: list = []

    async def begin() -> str:
        seen.append(("begin", threading.current_thread().name))
        return "svc"

    async def end(v: str) -> None:
        seen.append(("end", v, threading.current_thread().name))

    t = LoopThread(begin, end, "loglake-test-loop")
    assert t.start() == "svc"
    assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "x"), t._loop).result(5) == "x"
    t.stop()
    assert seen == [("begin", "loglake-test-loop"), ("end", "svc", "loglake-test-loop")]
    assert not t._thread.is_alive() and t._loop.is_closed()


def test_a_loop_thread_whose_start_fails_raises_it_and_leaves_nothing_running() -> None:
    from loglake.streams.server import LoopThread

    async def begin() -> None:
        raise OSError(98, "Address already in use")

    async def end(v: object) -> None:
        raise AssertionError("never started, never stopped")

    t = LoopThread(begin, end, "loglake-test-loop")
    with pytest.raises(OSError, match="already in use"):
        t.start()
    assert not t._thread.is_alive() and t._loop.is_closed()
    t.stop()  # harmless afterwards
