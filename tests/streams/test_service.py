"""The sans-I/O stream service core, one test per rule of specs/ockam-stream-service.txt
(section named in each test), driven with routing messages — no sockets."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.errors import DecodeError
from loglake.log import MemoryLog, StreamConfig
from loglake.streams import codec
from loglake.streams.messages import (
    CreatePartitionedStreamRequest,
    CreatePartitionedStreamResponse,
    CreateStreamRequest,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    Init,
    PartitionIndex,
    PullRequest,
    PullResponse,
    PushConfirm,
    PushRequest,
    SaveIndex,
    SavePartitionIndex,
    StreamInfoRequest,
    StreamInfoResponse,
)
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import Address, RoutingMessage, route
from tests.streams.interop import ockam_peer as ref

CLIENT = route("client_1")


class CountingLog(MemoryLog):
    """A real MemoryLog that counts append_many calls."""

    def __init__(self) -> None:
        super().__init__()
        self.append_calls: list[int] = []

    def append_many(self, stream, entries, *, partition=0):
        self.append_calls.append(len(entries))
        return super().append_many(stream, entries, partition=partition)


@pytest.fixture
def log() -> CountingLog:
    return CountingLog()


@pytest.fixture
def svc(log: CountingLog) -> StreamService:
    return StreamService(log, rng=random.Random(7))


def send(svc, dest, msg, ret=CLIENT) -> list[RoutingMessage]:
    dest_route = route(dest) if isinstance(dest, str | Address) else dest
    return svc.handle(RoutingMessage(dest_route, ret, codec.encode_payload(msg)))


def one(svc, dest, msg, expect):
    (reply,) = send(svc, dest, msg)
    assert reply.onward_route == CLIENT
    return reply, codec.decode_response(reply.payload, expect)


def create(svc, name="orders", partitions=1) -> list[Address]:
    if partitions == 1:
        replies = send(svc, "stream_service", CreateStreamRequest(name))
    else:
        replies = send(svc, "stream_service", CreatePartitionedStreamRequest(name, partitions))
    return [r.return_route[0] for r in replies]


# -- Stream creation ---------------------------------------------------------------------------
def test_create_answers_init_to_the_create_return_route_with_the_stream_address(svc) -> None:
    reply, init = one(svc, "stream_service", CreateStreamRequest("orders"), Init)
    assert init == Init("orders")
    # "<stream_address> SHOULD be created based on the stream_name", "MAY have some prefix"
    assert reply.return_route == route(worker_address("orders", 0))
    assert svc.log.streams() == ["orders"]


def test_create_without_a_name_creates_a_random_stream(svc) -> None:
    _, a = one(svc, "stream_service", CreateStreamRequest(None), Init)
    _, b = one(svc, "stream_service", CreateStreamRequest(None), Init)
    assert a.stream_name.startswith("generated_") and a.stream_name != b.stream_name
    assert sorted(svc.log.streams()) == sorted([a.stream_name, b.stream_name])


def test_create_of_an_existing_stream_sends_init_again(svc) -> None:
    first = create(svc, "orders")
    again = create(svc, "orders")
    assert first == again
    assert svc.log.streams() == ["orders"]


def test_a_refused_create_is_invalid_request_with_the_reason_in_the_log(svc, caplog) -> None:
    """workers/service.ex ``return_error``: every refused CREATE gets ``Invalid request`` (the
    reference logs "Empty stream name" and sends that); the detail is in loglake's log."""
    caplog.set_level("INFO", logger="loglake.streams.service")
    for request, why in [
        (CreateStreamRequest(""), "Empty stream name"),
        (CreateStreamRequest("bad/name"), "invalid stream name"),
        (CreatePartitionedStreamRequest("t", 0), "partitions must be 1..4096, not 0"),
    ]:
        reply, err = one(svc, "stream_service", request, Init)
        assert err == Error("Invalid request")
        assert reply.return_route == route("stream_service")
        refused = [r for r in caplog.records if r.getMessage() == "create refused"]
        assert why in refused[-1].fields["reason"]  # type: ignore[attr-defined]
    assert svc.log.streams() == []


# -- Partitioned stream ------------------------------------------------------------------------
def test_partitioned_create_answers_once_per_partition(svc) -> None:
    replies = send(svc, "stream_service", CreatePartitionedStreamRequest("topic", 3))
    decoded = [codec.decode_response(r.payload, CreatePartitionedStreamResponse) for r in replies]
    assert decoded == [CreatePartitionedStreamResponse("topic", p) for p in range(3)]
    assert [r.return_route for r in replies] == [
        route(worker_address("topic", p)) for p in range(3)
    ]
    assert len(svc.log.stream_info("topic").partitions) == 3


def test_partitioned_create_under_the_reference_name_is_answered_under_it(svc) -> None:
    payload = codec.encode_payload(
        CreatePartitionedStreamRequest("t", 2), "stream_create_partitioned"
    )
    replies = svc.handle(RoutingMessage(route("stream_service"), CLIENT, payload))
    assert [codec.decode_base(r.payload).protocol for r in replies] == [
        "stream_create_partitioned"
    ] * 2


def test_create_asking_more_partitions_than_exist_grows_the_stream(svc) -> None:
    """The reference's ``ensure_streams`` (stream/workers/service.ex): a worker is started for
    each missing partition and every partition 0..n-1 answers INIT from its own address."""
    addrs = create(svc, "t", 2)
    _, c = one(svc, addrs[1], PushRequest(1, b"kept"), PushConfirm)
    replies = send(svc, "stream_service", CreatePartitionedStreamRequest("t", 5))
    decoded = [codec.decode_response(r.payload, CreatePartitionedStreamResponse) for r in replies]
    assert decoded == [CreatePartitionedStreamResponse("t", p) for p in range(5)]
    assert [r.return_route for r in replies] == [route(worker_address("t", p)) for p in range(5)]
    assert svc.log.partition_count("t") == 5
    _, c4 = one(svc, replies[4].return_route, PushRequest(2, b"new"), PushConfirm)
    assert (c.index, c4.index) == (0, 0)  # a new partition starts its own sequence at 0
    assert svc.log.read_payloads("t", 0, partition=1) == [(0, b"kept")]
    assert len(create(svc, "t", 1)) == 1  # fewer: INIT for partitions 0..n-1 (reference)
    assert svc.log.partition_count("t") == 5


def test_growing_a_stream_past_the_partition_cap_is_an_error(svc) -> None:
    create(svc, "t", 2)
    _, err = one(svc, "stream_service", CreatePartitionedStreamRequest("t", 5000), Init)
    assert isinstance(err, Error)
    assert svc.log.partition_count("t") == 2


def test_partitions_are_independent_index_sequences(svc) -> None:
    addrs = create(svc, "t", 2)
    _, c0 = one(svc, addrs[0], PushRequest(1, b"a"), PushConfirm)
    _, c1 = one(svc, addrs[1], PushRequest(2, b"b"), PushConfirm)
    assert (c0.index, c1.index) == (0, 0)


# -- Pushing -----------------------------------------------------------------------------------
def test_push_is_confirmed_with_request_id_status_and_index(svc) -> None:
    (addr,) = create(svc)
    reply, confirm = one(svc, addr, PushRequest(42, b"hello"), PushConfirm)
    assert confirm == PushConfirm(42, "OK", 0)
    assert reply.return_route == (addr,)
    assert svc.log.read("orders", 0)[0].data == b"hello"


def test_index_is_unique_monotonic_and_scoped_per_stream_not_publisher(svc) -> None:
    (addr,) = create(svc)
    got = []
    for i in range(6):
        ret = route(f"publisher_{i % 2}")
        (reply,) = send(svc, addr, PushRequest(i, b"x"), ret)
        assert reply.onward_route == ret
        got.append(codec.decode_response(reply.payload, PushConfirm).index)
    assert got == sorted(set(got)) == list(range(6))


def test_same_request_id_pushed_twice_is_saved_twice(svc) -> None:
    (addr,) = create(svc)
    _, a = one(svc, addr, PushRequest(7, b"x"), PushConfirm)
    _, b = one(svc, addr, PushRequest(7, b"x"), PushConfirm)
    assert (a.request_id, b.request_id) == (7, 7) and a.index != b.index
    assert svc.log.next_index("orders") == 2


def test_pushes_of_one_batch_are_one_append_and_confirms_keep_order(svc, log) -> None:
    (addr,) = create(svc)
    msgs = [
        RoutingMessage((addr,), CLIENT, codec.encode_push_request(i, bytes([i]))) for i in range(50)
    ]
    out = svc.handle_batch(msgs)
    assert log.append_calls == [50]
    confirms = [codec.decode_response(o[0].payload, PushConfirm) for o in out]
    assert [(c.request_id, c.index) for c in confirms] == [(i, i) for i in range(50)]


def test_a_pull_after_pushes_in_the_same_batch_sees_them(svc) -> None:
    (addr,) = create(svc)
    msgs = [RoutingMessage((addr,), CLIENT, codec.encode_push_request(i, b"m")) for i in range(3)]
    msgs.append(RoutingMessage((addr,), CLIENT, codec.encode_payload(PullRequest(9, 0, 10))))
    out = svc.handle_batch(msgs)
    pulled = codec.decode_response(out[3][0].payload, PullResponse)
    assert [m.index for m in pulled.messages] == [0, 1, 2]


def test_storage_failure_is_confirmed_with_status_error(svc, log) -> None:
    (addr,) = create(svc)

    def broken(*a, **k):
        from loglake.log import LogError

        raise LogError("disk full")

    log.append_many = broken  # type: ignore[method-assign]
    _, confirm = one(svc, addr, PushRequest(3, b"x"), PushConfirm)
    assert confirm == PushConfirm(3, "ERROR", 0)  # as workers/stream.ex encodes it


# -- Pulling -----------------------------------------------------------------------------------
@pytest.fixture
def filled(svc):
    (addr,) = create(svc)
    for i in range(10):
        send(svc, addr, PushRequest(i, f"m{i}".encode()))
    return addr


def test_pull_returns_at_most_limit_messages_from_index_with_the_pushed_data(svc, filled) -> None:
    _, r = one(svc, filled, PullRequest(5, 3, 4), PullResponse)
    assert r.request_id == 5
    assert [(m.index, m.data) for m in r.messages] == [(i, f"m{i}".encode()) for i in range(3, 7)]


def test_pull_index_0_starts_from_the_earliest_message(log) -> None:
    svc = StreamService(log, StreamConfig(retention_records=8))
    (addr,) = create(svc)
    for i in range(10):
        send(svc, addr, PushRequest(i, b"m"))
    assert log.enforce_retention() == 2  # indexes 0 and 1 are gone
    _, r = one(svc, addr, PullRequest(1, 0, 3), PullResponse)
    assert [m.index for m in r.messages] == [2, 3, 4]  # MUST NOT be lower than requested


def test_pull_with_limit_0_or_past_the_end_is_empty(svc, filled) -> None:
    assert one(svc, filled, PullRequest(1, 0, 0), PullResponse)[1].messages == ()
    assert one(svc, filled, PullRequest(1, 10, 5), PullResponse)[1].messages == ()
    assert one(svc, filled, PullRequest(1, 2**63, 5), PullResponse)[1].messages == ()


def test_pull_response_is_capped_in_bytes(log) -> None:
    svc = StreamService(log, max_pull_bytes=2500)
    (addr,) = create(svc)
    for i in range(5):
        send(svc, addr, PushRequest(i, b"x" * 1000))
    _, r = one(svc, addr, PullRequest(1, 0, 100), PullResponse)
    assert [m.index for m in r.messages] == [0, 1]


# -- Index service -----------------------------------------------------------------------------
def test_get_index_of_a_new_client_answers_0_and_writes_nothing(svc) -> None:
    create(svc)
    reply, idx = one(svc, "stream_index_service", GetIndex("c1", "orders"), Index)
    assert idx == Index("c1", "orders", 0)  # the spec's "new record ... with an index 0"
    assert reply.return_route == route("stream_index_service")
    # nothing written: a record of 0 answers as no record does (docs/streams.md, deviation 4)
    assert svc.log.get_index("c1", "orders") is None


def get(svc, client: str = "c", stream: str = "orders") -> int:
    return one(svc, "stream_index_service", GetIndex(client, stream), Index)[1].index


def test_save_index_is_a_cast_with_no_reply(svc) -> None:
    # stream/index/shard.ex: save_index is GenServer.cast; a reference client reads no reply
    create(svc)
    assert send(svc, "stream_index_service", SaveIndex("c", "orders", 5)) == []
    assert get(svc) == 5
    create(svc, "t", 2)
    assert send(svc, "stream_index_service", SavePartitionIndex("c", "t", 1, 3)) == []


def test_a_failed_save_gets_no_reply_either(svc) -> None:
    # unknown stream: the reference logs a failed save; no error goes to a client that reads none
    assert send(svc, "stream_index_service", SaveIndex("c", "nosuch", 5)) == []


def test_save_index_is_monotonic(svc) -> None:
    create(svc)
    send(svc, "stream_index_service", SaveIndex("c", "orders", 5))
    assert get(svc) == 5
    send(svc, "stream_index_service", SaveIndex("c", "orders", 3))
    assert get(svc) == 5
    send(svc, "stream_index_service", SaveIndex("c", "orders", 8))
    assert get(svc) == 8


def test_partitioned_index_is_per_partition(svc) -> None:
    create(svc, "t", 3)
    assert send(svc, "stream_index_service", SavePartitionIndex("c", "t", 2, 4)) == []
    got = one(svc, "stream_index_service", GetPartitionIndex("c", "t", 2), PartitionIndex)[1]
    assert got == PartitionIndex("c", "t", 2, 4)
    got = one(svc, "stream_index_service", GetPartitionIndex("c", "t", 1), PartitionIndex)[1]
    assert got == PartitionIndex("c", "t", 1, 0)
    # a plain request is partition 0 (index/service.ex: Map.get(data, :partition, 0))
    assert one(svc, "stream_index_service", GetIndex("c", "t"), Index)[1].index == 0


# The reference's answer to a get it holds nothing for (its index service knows no streams):
# ``Index`` with ``index: none`` (stream/index/storage/internal.ex ``:undefined``), the bytes of
# the reference's schemas (protocol/stream.ex, stream_partitioned.ex) spelled out.
ABSENT_INDEX = bytes.fromhex("0c73747265616d5f696e646578080163046e6f706500")
"""BasePayload{"stream_index", Index{client_id "c", stream_name "nope", index none}}."""
ABSENT_PARTITION_INDEX = bytes.fromhex(
    "1873747265616d5f696e6465785f706172746974696f6e656406016301730700"
)
"""BasePayload{"stream_index_partitioned", Index{"c", "s", partition 7, index none}}."""


def test_index_of_an_unknown_stream_is_an_index_with_none_as_the_reference(svc) -> None:
    assert ref.index_response("c", "nope", None) == ABSENT_INDEX
    payload = ref.index_get("c", "nope")
    for _ in range(2):  # and again: no record was made
        (reply,) = svc.handle(RoutingMessage(route("stream_index_service"), CLIENT, payload))
        assert reply.payload == ABSENT_INDEX
        assert reply.return_route == route("stream_index_service")
    assert svc.log.streams() == []


def test_index_of_an_unknown_partition_is_an_index_with_none_as_the_reference(svc) -> None:
    assert ref.index_response_partitioned("c", "s", 7, None) == ABSENT_PARTITION_INDEX
    create(svc, "s", 2)
    payload = ref.index_get_partitioned("c", "s", 7)
    (reply,) = svc.handle(RoutingMessage(route("stream_index_service"), CLIENT, payload))
    assert reply.payload == ABSENT_PARTITION_INDEX
    assert svc.log.consumer_indexes() == {}


# -- bad input ---------------------------------------------------------------------------------
def test_message_to_an_unknown_stream_gets_an_error_and_stores_nothing(svc) -> None:
    (reply,) = send(svc, worker_address("nope", 0), PushRequest(1, b"x"))
    err = codec.decode_response(reply.payload, PushConfirm)
    assert isinstance(err, Error) and "nope" in err.reason
    assert svc.log.streams() == []
    create(svc, "t", 2)
    (reply,) = send(svc, worker_address("t", 2), PullRequest(1, 0, 1))
    assert isinstance(codec.decode_response(reply.payload, PullResponse), Error)


def test_malformed_payload_to_the_stream_service_gets_invalid_request(svc) -> None:
    (reply,) = svc.handle(RoutingMessage(route("stream_service"), CLIENT, b"\x05junk"))
    assert codec.decode_response(reply.payload, Init) == Error("Invalid request")
    assert svc.log.streams() == []


def test_malformed_payload_to_a_stream_gets_invalid_request_and_changes_nothing(svc) -> None:
    (addr,) = create(svc)
    bad = codec.encode_base("stream_push", b"\x01\x09ab")  # data length past the end
    (reply,) = svc.handle(RoutingMessage((addr,), CLIENT, bad))
    assert codec.decode_response(reply.payload, PushConfirm) == Error("Invalid request")
    assert svc.log.next_index("orders") == 0


def test_wrong_protocol_for_the_address_is_invalid_request(svc) -> None:
    (addr,) = create(svc)
    (reply,) = send(svc, addr, CreateStreamRequest("x"))
    assert codec.decode_response(reply.payload, Init) == Error("Invalid request")
    (reply,) = send(svc, "stream_service", PushRequest(1, b"x"))
    assert codec.decode_response(reply.payload, Init) == Error("Invalid request")


def test_malformed_index_request_is_dropped(svc) -> None:
    create(svc)
    bad = codec.encode_base("stream_index", b"\x07")
    assert svc.handle(RoutingMessage(route("stream_index_service"), CLIENT, bad)) == []
    assert svc.log.get_index("c", "orders") is None


def test_no_return_route_means_no_reply_but_the_push_is_stored(svc) -> None:
    (addr,) = create(svc)
    assert svc.handle(RoutingMessage((addr,), (), codec.encode_push_request(1, b"x"))) == []
    assert svc.log.next_index("orders") == 1


def test_unknown_address_gets_an_error(svc) -> None:
    (reply,) = send(svc, "somebody_else", GetIndex("c", "s"))
    assert isinstance(codec.decode_response(reply.payload, Index), Error)


# -- loglake extension -------------------------------------------------------------------------
def test_stream_info_lists_streams_and_partitions(svc) -> None:
    create(svc, "a", 2)
    (addr,) = create(svc, "b")
    send(svc, addr, PushRequest(1, b"xyz"))
    _, info = one(svc, "stream_service", StreamInfoRequest(None), StreamInfoResponse)
    assert [(s.stream_name, len(s.partitions)) for s in info.streams] == [("a", 2), ("b", 1)]
    assert info.streams[1].partitions[0].next_index == 1
    _, err = one(svc, "stream_service", StreamInfoRequest("zzz"), StreamInfoResponse)
    assert isinstance(err, Error)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(["stream_service", "stream_index_service", worker_address("orders", 0)]),
    st.one_of(
        st.binary(max_size=60),
        st.builds(
            codec.encode_base,
            st.sampled_from(["stream_push", "stream_pull", "stream_index", "stream_create"]),
            st.binary(max_size=40),
        ),
    ),
)
def test_garbage_never_crashes_the_core_and_never_changes_the_log(svc, dest, payload) -> None:
    if not svc.log.has_stream("orders"):
        create(svc)
    before = (svc.log.streams(), svc.log.next_index("orders"))
    replies = svc.handle(RoutingMessage(route(dest), CLIENT, payload))
    try:
        req = codec.decode_request(payload)[1]
    except DecodeError:
        req = None
    if req is None:  # undecodable: an error reply (or nothing, for the index service)
        assert before == (svc.log.streams(), svc.log.next_index("orders"))
        for r in replies:
            assert codec.decode_base(r.payload).protocol == "error"


def test_pushes_to_several_partitions_of_a_batch_may_be_appended_in_parallel(log) -> None:
    import concurrent.futures

    svc = StreamService(log)
    addrs = create(svc, "t", 3)
    msgs = [
        RoutingMessage((addrs[i % 3],), CLIENT, codec.encode_push_request(i, bytes([i])))
        for i in range(30)
    ]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        svc.map_targets = pool.map
        out = svc.handle_batch(msgs)
    assert sorted(log.append_calls) == [10, 10, 10]  # one append per partition
    for i, o in enumerate(out):
        confirm = codec.decode_response(o[0].payload, PushConfirm)
        assert (confirm.request_id, confirm.index) == (i, i // 3)  # order kept per partition
        assert o[0].return_route == (addrs[i % 3],)
    for p in range(3):
        assert [r.data[0] for r in log.read("t", 0, partition=p)] == list(range(p, 30, 3))
