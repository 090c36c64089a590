"""``Streams.bounds`` says what a reader can pull, the same in process and over TCP (one
stream-info round trip), so no part searches for a stream's end with pulls."""

from __future__ import annotations

import asyncio
import collections
import socket
import threading

import pytest

from loglake.errors import LocalProtocolError
from loglake.log import MemoryLog, open_log
from loglake.log.api import UnknownPartition, UnknownStream
from loglake.streams import LocalStreams, RetryingStreams
from loglake.streams.client import (
    SERVER_MAX_FRAME,
    AsyncStreamClient,
    ClientCore,
    PushTooLarge,
    StreamClient,
)
from loglake.streams.limits import ServerLimits
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import DEFAULT_MAX_FRAME, MAX_WIRE_FRAME, Address, FrameTooLarge


def test_bounds_in_process_and_over_tcp_agree(tmp_path) -> None:
    log = open_log(tmp_path / "data")
    local = LocalStreams(log)
    try:
        local.create_stream("s", 3)
        local.push_many("s", [b"%d" % i for i in range(10)], 1)
        local.push_many("s", [b"x"] * 4, 2)
        want = {0: (0, 0), 1: (0, 10), 2: (0, 4)}
        assert {p: local.bounds("s", p) for p in range(3)} == want
        with (
            BackgroundServer(StreamService(log)) as srv,
            StreamClient(port=srv.port) as remote,
            RetryingStreams(lambda: StreamClient(port=srv.port)) as retrying,
        ):
            assert {p: remote.bounds("s", p) for p in range(3)} == want
            assert {p: retrying.bounds("s", p) for p in range(3)} == want
            for p, (first, nxt) in want.items():
                got = remote.pull("s", 0, 100, p)
                assert [m.index for m in got] == list(range(first, nxt))

            async def in_async() -> tuple[int, int]:
                a = await AsyncStreamClient.connect(port=srv.port)
                try:
                    return await a.bounds("s", 1)
                finally:
                    await a.close()

            assert asyncio.run(in_async()) == (0, 10)
            for s in (local, remote):
                with pytest.raises(UnknownStream):
                    s.bounds("nope")
                with pytest.raises(UnknownPartition):
                    s.bounds("s", 3)
    finally:
        log.close()


def _data_size_for_a_full_push_frame() -> int:
    """Data size whose push frame (as StreamClient builds it: lane p0, 1-octet request id)
    has a body of exactly DEFAULT_MAX_FRAME bytes (the server accepts size <= limit)."""
    probe = ClientCore(server_max_frame=MAX_WIRE_FRAME)  # frames the 32 MiB probe
    probe._n = 1  # the next request id is 2, as in the client below (create used 1)
    worker = Address.local(worker_address("s", 0))
    n = 1 << 25  # same varint/CBOR head sizes as the target size
    _, frame = probe.push_frames(worker, [bytes(n)])
    overhead = len(frame) - 4 - n
    return DEFAULT_MAX_FRAME - overhead


def test_a_record_pushed_in_a_frame_at_the_limit_is_pulled_back() -> None:
    # The pull's reply carries the record with its index and the message count: a few bytes
    # more than the push that stored it, past the frame limit the client held it to (the
    # client refused it, and its connection with it: an acknowledged record nobody could read).
    size = _data_size_for_a_full_push_frame()
    data = b"\xab" * size
    with BackgroundServer(StreamService(MemoryLog())) as srv, StreamClient(port=srv.port) as c:
        c.create_stream("s")
        index = c.push("s", data)  # accepted and confirmed: the frame is within the limit
        assert index == 0
        msgs = c.pull("s", 0, 1)
        assert [(m.index, len(m.data)) for m in msgs] == [(0, size)]


MiB = 1024 * 1024


def test_a_record_a_server_with_a_larger_max_frame_accepted_is_pulled_back() -> None:
    """A server may take frames past the 32 MiB default (``--limits-max-frame``); the client
    holds replies to no limit of its own by default — the reference transport's only limit is
    its 4-byte length (handler.ex ``{:packet, 4}``) — so what the server stored, both clients
    can pull. Before, a 36 MiB record pushed to a 48 MiB server closed the puller's
    connection (``FrameTooLarge`` at 32 MiB + 64 KiB)."""
    data = bytes(range(256)) * (36 * MiB // 256)
    with (
        BackgroundServer(StreamService(MemoryLog()), max_frame=48 * MiB) as srv,
        StreamClient(port=srv.port, server_max_frame=48 * MiB) as c,
    ):
        c.create_stream("big")
        assert c.push("big", data) == 0
        (msg,) = c.pull("big", 0, 1)
        assert msg.index == 0 and msg.data == data

        async def in_async() -> bytes:
            a = await AsyncStreamClient.connect(port=srv.port)
            try:
                (m,) = await a.pull("big", 0, 1)
                return m.data
            finally:
                await a.close()

        assert asyncio.run(in_async()) == data


def test_a_client_given_a_max_frame_refuses_a_larger_reply_with_a_typed_error() -> None:
    with (
        BackgroundServer(StreamService(MemoryLog()), max_frame=48 * MiB) as srv,
        StreamClient(port=srv.port) as c,
        StreamClient(port=srv.port, max_frame=1 * MiB) as small,
    ):
        c.create_stream("big")
        c.push("big", bytes(2 * MiB))
        with pytest.raises(FrameTooLarge):
            small.pull("big", 0, 1)


KiB = 1024


def _fits(limit: int) -> int:
    """The largest data a push frame (request id 1, to the worker of ``s`` partition 0) carries
    within ``limit``, by the client's own sum; ``test_push_frame_size_is_what_the_server_counts``
    holds it to the server's count."""
    core = ClientCore(server_max_frame=limit)
    lane = core.lane(Address.local(worker_address("s", 0)))
    n = limit
    while core.push_frame_size(lane, 1, n) > limit:
        n -= 1
    return n


def _server_takes(port: int, data: bytes) -> bool:
    """Whether a server keeps a connection that sends one push frame of ``data`` (request id 1,
    framed by a client with no limit of its own): a frame over the server's ``max_frame`` closes
    the connection, and one within it is confirmed."""
    core = ClientCore(server_max_frame=MAX_WIRE_FRAME)
    _, frames = core.push_frames(Address.local(worker_address("s", 0)), [data])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(core.initial_bytes() + frames)
        got = b""
        while len(got) < 2:  # the version byte, then a confirm's first byte
            chunk = s.recv(1 << 16)
            if not chunk:
                return False
            got += chunk
    return True


def test_push_frame_size_is_what_the_server_counts() -> None:
    limit = 64 * KiB
    n = _fits(limit)
    with BackgroundServer(StreamService(MemoryLog()), max_frame=limit) as srv:
        with StreamClient(port=srv.port) as c:
            c.create_stream("s")
        assert _server_takes(srv.port, bytes(n))
        assert not _server_takes(srv.port, bytes(n + 1))


def test_a_push_over_the_servers_max_frame_is_refused_before_it_is_sent() -> None:
    """The server closes the connection on a frame over its ``max_frame`` and does not announce
    the limit: a client given it (``server_max_frame``) refuses such a push with
    ``PushTooLarge``, a ``LocalProtocolError``, and the connection goes on. Before, the push
    was sent and the connection closed (``Unavailable``, every request in flight lost)."""
    limit = 64 * KiB
    n = _fits(limit)
    with (
        BackgroundServer(StreamService(MemoryLog()), max_frame=limit) as srv,
        StreamClient(port=srv.port, server_max_frame=limit) as c,
    ):
        c.create_stream("s")
        with pytest.raises(PushTooLarge) as e:
            c.push("s", bytes(n + 1))
        assert isinstance(e.value, LocalProtocolError)
        assert (e.value.size, e.value.limit) == (limit + 1, limit)
        assert c.push("s", bytes(n)) == 0  # the largest that fits, on the same connection
        with pytest.raises(PushTooLarge) as e:  # the batch is refused whole, none of it sent
            c.push_many("s", [b"a", bytes(n + 1), b"b"])
        assert e.value.position == 1
        assert c.push_many("s", [b"a", b"b"]) == [1, 2]
        assert [len(m.data) for m in c.pull("s", 0, 10)] == [n, 1, 1]

        async def in_async() -> list[int]:
            a = await AsyncStreamClient.connect(port=srv.port, server_max_frame=limit)
            try:
                with pytest.raises(PushTooLarge):
                    await a.push("s", bytes(limit))
                with pytest.raises(PushTooLarge):
                    await a.push_many("s", [b"c", bytes(limit)])
                return await a.push_many("s", [b"c"])
            finally:
                await a.close()

        assert asyncio.run(in_async()) == [3]


def test_the_default_push_limit_is_the_servers_default_max_frame() -> None:
    assert SERVER_MAX_FRAME == ServerLimits().max_frame == DEFAULT_MAX_FRAME
    core = ClientCore()
    lane = core.lane(Address.local(worker_address("s", 0)))
    with pytest.raises(PushTooLarge):
        core.push_parts(Address.local(worker_address("s", 0)), [bytes(DEFAULT_MAX_FRAME)])
    assert core.in_flight[lane] == collections.deque()  # no request id taken


@pytest.mark.parametrize("size", [0, 1, 23, 24, 127, 128, 255, 256, 16383, 16384, 65535, 65536])
def test_push_frame_size_counts_every_byte_of_the_frame(size: int) -> None:
    core = ClientCore(server_max_frame=MAX_WIRE_FRAME)
    worker = Address.local(worker_address("s", 0))
    lane = core.lane(worker)
    core._n = 300  # a two-octet request id
    want = core.push_frame_size(lane, 301, size)
    (rid,), frame = core.push_frames(worker, [bytes(size)])
    assert rid == 301 and len(frame) - 4 == want == int.from_bytes(frame[:4], "big")


def test_pushes_after_the_server_closed_the_connection_are_unavailable() -> None:
    """A push over the server's limit, sent anyway (a client not told the server's lower
    limit), makes the server close the connection: that push and every later one on the
    connection are ``Unavailable``. The second was a bare ``BrokenPipeError`` (the send,
    unlike the read, was not typed)."""
    from loglake.errors import Unavailable

    limit = 64 * KiB
    with (
        BackgroundServer(StreamService(MemoryLog()), max_frame=limit) as srv,
        StreamClient(port=srv.port) as c,
    ):
        c.create_stream("s")
        with pytest.raises(Unavailable):
            c.push("s", bytes(2 * limit))
        for _ in range(3):
            with pytest.raises(Unavailable):
                c.push_many("s", [bytes(limit // 2)] * 8)
            with pytest.raises(Unavailable):
                c.push("s", b"x")


def test_bounds_in_process_end_at_what_a_pull_returns_while_an_append_is_fsynced(
    tmp_path, monkeypatch
) -> None:
    """``LocalStreams.bounds`` gave the log's ``next_index``: records another thread has
    written whose fsync has not finished yet, which a pull does not return (readers see the
    durable prefix). A part that read ``range(*bounds)`` stopped short of the end it was given
    (the events publisher then replayed a range without its last records, ``completed``)."""
    from tests.log.test_durability import hold_fdatasync

    log = open_log(tmp_path / "data")
    local = LocalStreams(log)
    local.create_stream("s")
    local.push_many("s", [b"durable"] * 5)
    in_sync, release = hold_fdatasync(monkeypatch)
    writer = threading.Thread(target=local.push_many, args=("s", [b"pending"] * 5))
    writer.start()
    try:
        assert in_sync.wait(10)
        first, end = local.bounds("s")
        assert (first, end) == (0, 5)
        assert [m.index for m in local.pull("s", first, 100)] == list(range(first, end))
    finally:
        release.set()
        writer.join(10)
    assert local.bounds("s") == (0, 10)
    log.close()
