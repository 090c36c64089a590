"""Every request type, fed out-of-range and malformed values over a real TCP connection to a
real server on a real (segment) log, gets a typed reply — an ``error`` naming what is wrong, or
the spec's answer — and never "internal error"; the connection and the server go on serving."""

from __future__ import annotations

import socket

import pytest

from loglake.log import open_log
from loglake.streams import codec
from loglake.streams.messages import (
    CreatePartitionedStreamRequest,
    CreateStreamRequest,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    PartitionIndex,
    PullRequest,
    PullResponse,
    PushConfirm,
    PushRequest,
    SaveIndex,
    SavePartitionIndex,
    StreamInfoRequest,
)
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService
from loglake.wire.ockam import (
    MAX_ADDRESS_BYTES,
    RoutingMessage,
    TcpConnection,
    encode_frame,
    route,
)

U64_MAX = 2**64 - 1
HUGE = "x" * 70_000
BAD_NAMES = ["", HUGE, "٣", "３", "a/b", "..", "\x00", "ü" * 150]
BAD_PARTS = [
    "١",
    "１",
    "٣",
    "３",
    "³",
    "¹",
    "1" * 5000,
    "99999999999999999999",
    "01",
    "-1",
    "+1",
    " 1",
    "1\n",
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    log = open_log(tmp_path_factory.mktemp("strict"))
    with BackgroundServer(StreamService(log)) as s:
        yield s
    log.close()


class Raw:
    """A bare Ockam TCP peer: one request, one reply, read as the protocol says."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(TcpConnection.initial_bytes())
        self.wire = TcpConnection()
        self.got: list[RoutingMessage] = []

    def ask(self, to: str, payload: bytes) -> RoutingMessage:
        self.sock.sendall(encode_frame(RoutingMessage(route(to), route("me"), payload)))
        while not self.got:
            data = self.sock.recv(1 << 20)
            assert data, "the server closed the connection"
            self.got += self.wire.receive_data(data)
        return self.got.pop(0)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(srv):
    r = Raw(srv.port)
    # a real stream for the requests that need one
    r.ask("stream_service", codec.encode_payload(CreatePartitionedStreamRequest("ok", 2)))
    while len(r.got) < 1:  # the second partition's INIT
        r.got += r.wire.receive_data(r.sock.recv(1 << 16))
    r.got.clear()
    yield r
    r.close()


def answer(raw: Raw, to: str, msg: object, expect: type, protocol: str | None = None) -> object:
    reply = raw.ask(to, codec.encode_payload(msg, protocol))
    got = codec.decode_response(reply.payload, expect)
    if isinstance(got, Error):
        assert not got.reason.startswith("internal error"), got.reason
        assert len(got.reason) < 1000, "the reason must not echo a huge value back"
    raw.got.clear()  # a CREATE's further INITs
    return got


def unanswered(raw: Raw, msg: object) -> None:
    """A save is a cast (the reference's shard.ex never replies, not even to a bad one): the
    next reply on the connection is the one to the probe sent after it."""
    raw.sock.sendall(
        encode_frame(
            RoutingMessage(route("stream_index_service"), route("me"), codec.encode_payload(msg))
        )
    )
    probe = answer(raw, "stream_index_service", GetIndex("probe", "ok"), Index)
    assert isinstance(probe, Index) and probe.client_id == "probe", probe


def still_serves(raw: Raw) -> None:
    got = answer(raw, "stream_service/ok/0", PushRequest(7, b"alive"), PushConfirm)
    assert isinstance(got, PushConfirm) and got.status == "OK"


@pytest.mark.parametrize("name", BAD_NAMES)
def test_create_with_a_bad_stream_name_gets_an_error(raw, name) -> None:
    from loglake.streams.messages import Init

    assert isinstance(answer(raw, "stream_service", CreateStreamRequest(name), Init), Error)
    still_serves(raw)


@pytest.mark.parametrize("n", [0, 4097, 2**32, U64_MAX])
def test_create_partitioned_with_out_of_range_partitions_gets_an_error(raw, n) -> None:
    from loglake.streams.messages import CreatePartitionedStreamResponse as R

    assert isinstance(
        answer(raw, "stream_service", CreatePartitionedStreamRequest("p", n), R), Error
    )
    assert isinstance(
        answer(raw, "stream_service", CreatePartitionedStreamRequest(HUGE, 1), R), Error
    )
    still_serves(raw)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_stream_info_of_a_bad_stream_name_gets_an_error(raw, name) -> None:
    from loglake.streams.messages import StreamInfoResponse

    assert isinstance(
        answer(raw, "stream_service", StreamInfoRequest(name), StreamInfoResponse), Error
    )


def closed_for_its_address(raw: Raw, to: str, srv_port: int) -> bool:
    """Whether ``to`` is over the Ockam decoder's ``MAX_ADDRESS_BYTES``; if so, checks that a
    frame to it is a protocol error (the connection is closed, as the reference closes on a
    frame it cannot decode: docs/security.md) and that a new connection is served."""
    if len(to.encode()) <= MAX_ADDRESS_BYTES:
        return False
    raw.sock.sendall(
        encode_frame(
            RoutingMessage(route(to), route("me"), codec.encode_payload(PushRequest(1, b"x")))
        )
    )
    raw.sock.settimeout(10)
    try:
        while raw.sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    other = Raw(srv_port)
    try:
        still_serves(other)
    finally:
        other.close()
    return True


@pytest.mark.parametrize("part", BAD_PARTS)
def test_push_and_pull_to_a_non_decimal_partition_get_an_error(raw, srv, part) -> None:
    """Only ASCII digits name a partition: ``٣``, ``３`` and ``³`` are not partition 3."""
    to = f"stream_service/ok/{part}"
    if closed_for_its_address(raw, to, srv.port):
        return
    assert isinstance(answer(raw, to, PushRequest(1, b"x"), PushConfirm), Error)
    assert isinstance(answer(raw, to, PullRequest(1, 0, 10), PullResponse), Error)
    still_serves(raw)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_push_and_pull_to_a_bad_stream_name_get_an_error(raw, srv, name) -> None:
    to = f"stream_service/{name}/0"
    if closed_for_its_address(raw, to, srv.port):
        return
    assert isinstance(answer(raw, to, PushRequest(1, b"x"), PushConfirm), Error)
    assert isinstance(answer(raw, to, PullRequest(1, 0, 10), PullResponse), Error)


def test_pull_with_out_of_range_index_and_limit_is_answered(raw) -> None:
    for index, limit in [(U64_MAX, 10), (0, U64_MAX), (U64_MAX, U64_MAX)]:
        got = answer(raw, "stream_service/ok/0", PullRequest(U64_MAX, index, limit), PullResponse)
        assert isinstance(got, PullResponse) and got.request_id == U64_MAX
    still_serves(raw)


def test_push_with_the_largest_request_id_is_confirmed(raw) -> None:
    got = answer(raw, "stream_service/ok/1", PushRequest(U64_MAX, b"x"), PushConfirm)
    assert isinstance(got, PushConfirm) and got.request_id == U64_MAX


@pytest.mark.parametrize("client_id", [HUGE, "c" * 1025])
def test_index_requests_with_a_huge_client_id_get_an_error(raw, client_id) -> None:
    to = "stream_index_service"
    assert isinstance(answer(raw, to, GetIndex(client_id, "ok"), Index), Error)
    unanswered(raw, SaveIndex(client_id, "ok", 1))
    got = answer(raw, to, GetPartitionIndex(client_id, "ok", 1), PartitionIndex)
    assert isinstance(got, Error) and "client id" in got.reason
    unanswered(raw, SavePartitionIndex(client_id, "ok", 1, 1))
    still_serves(raw)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_index_requests_on_a_bad_stream_name_get_an_error(raw, name) -> None:
    to = "stream_index_service"
    assert isinstance(answer(raw, to, GetIndex("c", name), Index), Error)
    unanswered(raw, SaveIndex("c", name, 1))
    assert isinstance(answer(raw, to, GetPartitionIndex("c", name, 0), PartitionIndex), Error)
    unanswered(raw, SavePartitionIndex("c", name, 0, 1))


@pytest.mark.parametrize("partition", [2, 4096, 2**32, U64_MAX])
def test_index_requests_on_an_out_of_range_partition_get_no_index(raw, partition) -> None:
    # the reference's answer for a partition it holds nothing for: an Index with index none
    to = "stream_index_service"
    got = answer(raw, to, GetPartitionIndex("c", "ok", partition), PartitionIndex)
    assert got == PartitionIndex("c", "ok", partition, None)
    unanswered(raw, SavePartitionIndex("c", "ok", partition, 1))
    still_serves(raw)


def test_save_index_with_the_largest_index_is_stored(raw) -> None:
    unanswered(raw, SaveIndex("big", "ok", U64_MAX))
    got = answer(raw, "stream_index_service", GetIndex("big", "ok"), Index)
    assert isinstance(got, Index) and got.index == U64_MAX
