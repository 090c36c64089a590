"""The server's push path after issue 16's cuts, through the real objects in process.

The core now takes a push whose onward route is the very object of the previous push's (a
connection's decoder hands out one route object per run of frames on the same routes) without
checking the address again, and replies are framed from parts. What must not change: request
order, what each peer may do, and the error reply to a malformed push among good ones.
"""

from __future__ import annotations

from loglake.log import MemoryLog, StreamConfig
from loglake.streams import codec
from loglake.streams.client import ClientCore
from loglake.streams.messages import Error, PullRequest
from loglake.streams.permissions import ANONYMOUS, AccessPolicy, Peer
from loglake.streams.service import INVALID_REQUEST, StreamService, worker_address
from loglake.wire.ockam import (
    Address,
    RoutingMessage,
    TcpConnection,
    encode_frames,
    frame_parts,
    route,
)

WORKER = Address.local(worker_address("s", 0))
ONWARD = (WORKER,)  # one object for every message below, as the frame decoder gives it
CLIENT = route("p0")


def service(**kw) -> StreamService:
    log = MemoryLog()
    log.create_stream("s")
    return StreamService(log, **kw)


def push(rid: int, data: bytes) -> RoutingMessage:
    return RoutingMessage(ONWARD, CLIENT, codec.encode_push_request(rid, data))


def test_pushes_around_a_pull_on_the_same_route_object_keep_request_order() -> None:
    svc = service()
    pull = RoutingMessage(ONWARD, route("r1"), codec.encode_payload(PullRequest(7, 0, 10)))
    msgs = [push(1, b"a"), push(2, b"b"), pull, push(3, b"c")]
    replies = svc.handle_batch(msgs)
    assert [codec.decode_push_confirm(r[0].payload) for r in (replies[0], replies[1])] == [
        (1, True, 0),
        (2, True, 1),
    ]
    pulled = codec.decode_pull_reply(replies[2][0].payload)
    assert [m.data for m in pulled.messages] == [b"a", b"b"]  # sees the pushes before it
    assert codec.decode_push_confirm(replies[3][0].payload) == (3, True, 2)
    assert svc.log.read_payloads("s", 0, 10) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_malformed_push_among_good_ones_on_the_same_route_gets_an_error() -> None:
    svc = service()
    bad = RoutingMessage(ONWARD, CLIENT, codec.encode_push_request(2, b"b")[:-1] + b"xx")
    replies = svc.handle_batch([push(1, b"a"), bad, push(3, b"c")])
    assert codec.decode_push_confirm(replies[0][0].payload) == (1, True, 0)
    assert codec.decode_response(replies[1][0].payload, Error) == Error(INVALID_REQUEST)
    assert codec.decode_push_confirm(replies[2][0].payload) == (3, True, 1)
    assert svc.log.read_payloads("s", 0, 10) == [(0, b"a"), (1, b"c")]


def test_each_peer_is_checked_even_on_the_same_route_object() -> None:
    policy = AccessPolicy.from_dict(
        {"grant": [{"identities": ["uri:w"], "streams": ["s"], "allow": ["write"]}]}
    )
    svc = service(access=policy)
    writer = Peer(frozenset({"*", "uri:w"}))
    msgs = [push(i, b"m%d" % i) for i in range(1, 7)]
    peers = [writer, writer, ANONYMOUS, writer, ANONYMOUS, ANONYMOUS]
    replies = svc.handle_batch(msgs, peers)
    for r, who in zip(replies, peers, strict=True):
        if who is writer:
            assert codec.decode_push_confirm(r[0].payload) is not None
        else:
            assert "permission denied" in codec.decode_response(r[0].payload, Error).reason
    assert [d for _, d in svc.log.read_payloads("s", 0, 10)] == [b"m1", b"m2", b"m4"]


def test_client_frames_through_the_decoder_core_and_reply_parts_round_trip() -> None:
    """Bytes a ``ClientCore`` writes → the server's ``TcpConnection`` → the core → replies
    framed by ``frame_parts`` → the client's confirms: indexes in order, nothing left over."""
    svc = service()
    client, server_wire = ClientCore(), TcpConnection()
    rids, parts = client.push_parts(WORKER, [b"x" * n for n in range(300)])
    wire = client.initial_bytes() + b"".join(parts)
    msgs: list[RoutingMessage] = []
    for i in range(0, len(wire), 4096):  # as the event loop reads it
        msgs += server_wire.receive_data(wire[i : i + 4096])
    assert len({id(m.onward_route) for m in msgs}) == 1  # the fast path's premise
    replies = [m for r in svc.handle_batch(msgs) for m in r]
    out = b"".join(frame_parts(replies))
    assert out == encode_frames(replies)
    client.receive_data(TcpConnection.initial_bytes() + out)
    assert client.confirms == {rid: (True, i) for i, rid in enumerate(rids)}
    assert [d for _, d in svc.log.read_payloads("s", 0, 1000)] == [b"x" * n for n in range(300)]


def test_confirms_as_runs_are_the_same_frames_in_the_same_order_per_route() -> None:
    """``batch(runs=True)`` (the server's way): one ``MessageRun`` per run of pushes from one
    return route object to one partition, in the first push's entry. The frames per return
    route are the ones ``runs=False`` gives, in the same order; nothing else changes."""
    from loglake.streams.service import perform
    from loglake.wire.ockam import MessageRun

    other = route("p1")
    w1 = Address.local(worker_address("s", 1))

    def msgs() -> list[RoutingMessage]:
        pull = RoutingMessage(ONWARD, route("r1"), codec.encode_payload(PullRequest(7, 0, 10)))
        out = [push(1, b"a"), push(2, b"b"), pull, push(3, b"c")]
        out += [RoutingMessage(ONWARD, other, codec.encode_push_request(9, b"o"))]
        out += [RoutingMessage((w1,), CLIENT, codec.encode_push_request(4, b"p1"))]
        out += [push(5, b"d"), RoutingMessage(ONWARD, (), codec.encode_push_request(6, b"e"))]
        out += [push(7, b"f"), push(8, b"g")]
        return out

    def run(runs: bool) -> list:
        log = MemoryLog()
        log.create_stream("s", StreamConfig(partitions=2))
        svc = StreamService(log)
        batch = svc.batch(msgs(), runs=runs)
        while batch.actions:
            batch.feed([perform(log, a) for a in batch.actions])
        return batch.replies

    plain, grouped = run(False), run(True)
    assert not any(isinstance(m, MessageRun) for r in plain for m in r)
    # a run per stretch of pushes from one return route to one partition: the pull ends the
    # first; another route, another partition or a route-less push (no reply) ends a run
    sizes = [len(r[0].payloads) if r and isinstance(r[0], MessageRun) else r for r in grouped]
    assert sizes[:2] == [2, []] and isinstance(sizes[2][0], RoutingMessage)
    assert sizes[3:] == [1, 1, 1, 1, [], 2, []]

    def per_route(replies: list) -> dict:
        out: dict = {}
        for r in replies:
            for m in r:
                for one in m.messages() if isinstance(m, MessageRun) else [m]:
                    out.setdefault(one.onward_route, []).append(encode_frames([one]))
        return out

    assert per_route(grouped) == per_route(plain)


def test_connections_sharing_the_read_buffer_keep_their_own_partial_frames() -> None:
    """The server reads every connection into one buffer: a frame split across reads, on two
    connections at once, must come out whole and on its own connection."""
    import socket

    from loglake.streams.server import BackgroundServer

    svc = service()
    with BackgroundServer(svc) as srv:
        cores = [ClientCore(), ClientCore()]
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in cores]
        try:
            wires = []
            for k, (core, sock) in enumerate(zip(cores, socks, strict=True)):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _, parts = core.push_parts(WORKER, [bytes([k]) * 3000 for _ in range(3)])
                wires.append(core.initial_bytes() + b"".join(parts))
            cuts = [0, 1, 700, 3100, 3101, 6000, 9200]
            for a, b in zip(cuts, [*cuts[1:], None], strict=True):
                for sock, wire in zip(socks, wires, strict=True):  # interleaved halves
                    sock.sendall(wire[a:b])
            for core, sock in zip(cores, socks, strict=True):
                while len(core.confirms) < 3:
                    data = sock.recv(65536)
                    assert data, "the server closed the connection"
                    core.receive_data(data)
                assert all(ok for ok, _ in core.confirms.values())
        finally:
            for sock in socks:
                sock.close()
    stored = [d for _, d in svc.log.read_payloads("s", 0, 10)]
    assert sorted(stored) == [bytes([0]) * 3000] * 3 + [bytes([1]) * 3000] * 3


def test_freeze_gc_only_for_a_server_that_is_the_process_or_when_asked() -> None:
    import asyncio
    import gc

    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer, StreamServer

    before = gc.get_freeze_count()
    try:
        with BackgroundServer(service()) as srv:  # a loop on a background thread: not frozen
            assert srv.server is not None and srv.server.freeze_gc is None
            assert gc.get_freeze_count() == before
        with BackgroundServer(service(), freeze_gc=True) as srv:
            assert gc.get_freeze_count() > before
            with StreamClient(port=srv.port, timeout=10) as client:  # and it serves as before
                assert client.push_many("s", [b"a", b"b"]) == [0, 1]
        gc.unfreeze()

        async def main_thread_server() -> None:  # as ``loglake serve`` runs it
            server = await StreamServer(service()).start()
            await server.stop()

        asyncio.run(main_thread_server())
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()  # give this test process its collector back
