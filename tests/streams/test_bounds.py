"""``Streams.bounds`` says what a reader can pull, the same in process and over TCP (one
stream-info round trip), so no part searches for a stream's end with pulls."""

from __future__ import annotations

import asyncio

import pytest

from loglake.log import MemoryLog, open_log
from loglake.log.api import UnknownPartition, UnknownStream
from loglake.streams import LocalStreams, RetryingStreams
from loglake.streams.client import AsyncStreamClient, ClientCore, StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import DEFAULT_MAX_FRAME, Address, FrameTooLarge


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
    probe = ClientCore()
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
        StreamClient(port=srv.port) as c,
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
