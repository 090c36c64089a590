"""The client's push encoding and confirm sorting, byte for byte against the generic codec.

Issue 16 cut the per-message work of the push path: a push frame is now built from constant
parts (per lane, data size and request-id length) plus the request id and the caller's data,
and confirms are sorted by route once per burst. These tests hold the fast encoders to the
generic ones (``encode_frame`` of ``codec.encode_payload``), across the uint boundaries where
the constant parts change, and check the malformed-input behaviour of the fast decoders: a
payload that is not exactly a push or a confirm gives None (the generic path, which names the
problem), never a wrong value or a crash.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.errors import DecodeError
from loglake.log import MemoryLog
from loglake.streams import codec
from loglake.streams.client import AsyncStreamClient, ClientCore, StreamClient
from loglake.streams.messages import PushConfirm, PushRequest
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire import bare
from loglake.wire.ockam import Address, RoutingMessage, TcpConnection, encode_frame, route

WORKER = Address.local(worker_address("s", 0))
OTHER = Address.local(worker_address("t", 3))
# uint length changes: 1→2 octets at 128, 2→3 at 16,384, 3→4 at 2,097,152
BOUNDARIES = [1, 127, 128, 16383, 16384, 2097151, 2097152, 2**28 - 1, 2**28, 2**35, 2**64 - 1]
UINTS = st.sampled_from(BOUNDARIES) | st.integers(0, 2**64 - 1)


def generic_push_frame(worker: Address, lane: str, rid: int, data: bytes) -> bytes:
    payload = codec.encode_payload(PushRequest(rid, data))
    return encode_frame(RoutingMessage((worker,), route(lane), payload))


@given(
    st.lists(st.binary(max_size=300), min_size=1, max_size=6),
    st.sampled_from([3, 128, 16384, 2097152, 2**35]),
)
def test_push_parts_are_the_generic_frames_across_id_lengths(datas, first_rid) -> None:
    core = ClientCore()
    core._n = first_rid - 3  # ids cross the boundary inside the burst
    datas = datas * 2 + [b"x" * 130, b"x" * 130]  # data sizes repeat and change
    rids, parts = core.push_parts(WORKER, datas)
    assert rids == list(range(first_rid - 2, first_rid - 2 + len(datas)))
    frames = [generic_push_frame(WORKER, "p0", r, d) for r, d in zip(rids, datas, strict=True)]
    assert b"".join(parts) == b"".join(frames)
    more, joined = core.push_frames(WORKER, datas)
    frames = [generic_push_frame(WORKER, "p0", r, d) for r, d in zip(more, datas, strict=True)]
    assert joined == b"".join(frames)
    assert list(core.in_flight[0]) == rids + more == list(range(rids[0], more[-1] + 1))


def test_push_parts_hand_on_the_callers_data_objects() -> None:
    datas = [bytes([i]) * 1024 for i in range(5)]
    _, parts = ClientCore().push_parts(WORKER, datas)
    assert [p for p in parts if len(p) == 1024] == datas
    assert all(any(p is d for p in parts) for d in datas)  # not copied


def test_each_worker_gets_its_own_lane_and_return_address() -> None:
    core = ClientCore()
    _, a = core.push_frames(WORKER, [b"a"])
    _, b = core.push_frames(OTHER, [b"b"])
    assert a == generic_push_frame(WORKER, "p0", 1, b"a")
    assert b == generic_push_frame(OTHER, "p1", 2, b"b")


@given(UINTS, st.integers(0, 70000))
def test_push_request_parts_and_head(rid, size) -> None:
    data = b"d" * size
    before, after = codec.push_request_parts(len(bare.encode_uint(rid)), size)
    generic = codec.encode_payload(PushRequest(rid, data))
    assert before + bare.encode_uint(rid) + after + data == generic
    assert codec.push_request_head(rid, size) + data == generic
    assert codec.encode_push_request(rid, data) == generic


@pytest.mark.parametrize("n", [0, 11, -1])
def test_push_request_parts_refuse_impossible_id_lengths(n) -> None:
    with pytest.raises(ValueError, match="1 to 10 octets"):
        codec.push_request_parts(n, 5)


@given(st.lists(st.tuples(UINTS, UINTS), max_size=10))
def test_encode_push_confirms_is_encode_payload_of_each(pairs) -> None:
    rids, indexes = [p[0] for p in pairs], [p[1] for p in pairs]
    assert codec.encode_push_confirms(rids, indexes) == [
        codec.encode_payload(PushConfirm(r, "OK", i)) for r, i in pairs
    ]
    with pytest.raises(ValueError):
        codec.encode_push_confirms([1, 2], [3])


@given(UINTS)
def test_the_inline_uint_paths_agree_with_bare(v) -> None:
    enc = codec.encode_uint(v)
    assert enc == bare.encode_uint(v)
    assert codec._uint_at(enc + b"\x07", 0) == (v, len(enc))


@pytest.mark.parametrize("v", [-1, 2**64])
def test_uints_out_of_range_are_a_typed_error(v) -> None:
    with pytest.raises(bare.BareEncodeError):
        codec.encode_uint(v)


def test_non_minimal_uints_are_refused_by_the_fast_decoders() -> None:
    # request id 1 as three octets (81 80 00): BARE refuses non-minimal uints (docs/streams.md)
    body = b"\x81\x80\x00" + b"\x01" + b"x"
    payload = codec.encode_base(codec.STREAM_PUSH, body)
    assert codec.decode_push_request(payload) is None
    with pytest.raises(DecodeError):
        codec.decode_request(payload)
    confirm = codec.encode_base(codec.STREAM_PUSH, b"\x05\x00\x81\x80\x00")  # index non-minimal
    assert codec.decode_push_confirm(confirm) is None
    with pytest.raises(DecodeError):
        codec.decode_response(confirm, PushConfirm)


@pytest.mark.parametrize(
    "body",
    [
        b"",  # no body at all
        b"\x05",  # truncated
        b"\x05\x02\x07",  # status 2
        b"\x05\x00\x07\x00",  # a trailing octet
        b"\x05\x00",  # no index
    ],
)
def test_malformed_confirms_take_the_generic_path(body) -> None:
    payload = codec.encode_base(codec.STREAM_PUSH, body)
    assert codec.decode_push_confirm(payload) is None
    with pytest.raises(DecodeError):
        codec.decode_response(payload, PushConfirm)
    assert codec.decode_push_confirm(payload[:-1] if payload else b"") is None


@given(st.binary(max_size=40))
def test_fast_decoders_never_disagree_with_the_generic_ones(junk) -> None:
    for payload in (junk, codec.encode_base(codec.STREAM_PUSH, junk)):
        fast = codec.decode_push_confirm(payload)
        if fast is not None:
            assert codec.decode_response(payload, PushConfirm) == PushConfirm(
                fast[0], "OK" if fast[1] else "ERROR", fast[2]
            )
        req = codec.decode_push_request(payload)
        if req is not None:
            assert codec.decode_request(payload)[1] == PushRequest(*req)


def reply(lane: str, worker: Address, payload: bytes) -> bytes:
    return encode_frame(RoutingMessage(route(lane), (worker,), payload))


def test_confirms_of_two_lanes_and_a_request_reply_are_sorted_in_one_chunk() -> None:
    core = ClientCore()
    core.receive_data(TcpConnection.initial_bytes())
    a, _ = core.push_frames(WORKER, [b"1", b"2"])
    b, _ = core.push_frames(OTHER, [b"3"])
    tok, _ = core.request(route("stream_service"), b"whatever")
    chunk = (
        reply("p0", WORKER, codec.encode_push_confirm(a[0], 10))
        + reply("p1", OTHER, codec.encode_push_confirm(b[0], 20))
        + reply(f"r{tok}", Address.local("stream_service"), b"an answer")
        + reply("p0", WORKER, codec.encode_push_confirm(a[1], 11, ok=False))
        + reply("p9", WORKER, codec.encode_push_confirm(99, 1))  # not a lane of ours
    )
    core.receive_data(chunk)
    assert core.confirms == {a[0]: (True, 10), b[0]: (True, 20), a[1]: (False, 11)}
    assert [m.payload for m in core.replies[tok]] == [b"an answer"]
    assert [list(q) for q in core.in_flight] == [[], []]


def test_a_malformed_frame_from_the_service_is_raised_as_a_typed_error() -> None:
    core = ClientCore()
    with pytest.raises(DecodeError):
        core.receive_data(b"\x01\x00\x00\x00\x02\xff\xff")


def test_sync_and_async_push_many_against_a_real_server() -> None:
    """Indexes in order across chunk boundaries; the async client leaves no waiter behind."""
    with BackgroundServer(StreamService(MemoryLog())) as srv:
        datas = [b"m%d" % i for i in range(2_500)]
        with StreamClient(port=srv.port, window=1000) as c:
            c.create_stream("s")
            assert c.push_many("s", datas) == list(range(2_500))
            assert c.push_many("s", [b"x" * 5000] * 3) == [2_500, 2_501, 2_502]

        async def main() -> None:
            c = await AsyncStreamClient.connect(port=srv.port, window=1000)
            try:
                got = await asyncio.gather(c.push_many("s", datas), c.push_many("s", datas))
                assert sorted(got[0] + got[1]) == list(range(2_503, 2_503 + 5_000))
                assert got[0] == sorted(got[0]) and got[1] == sorted(got[1])
                assert c._push_waiters == {}
                pulled = await c.pull("s", got[0][0], 1)
                assert pulled[0].data == b"m0"
            finally:
                await c.close()

        asyncio.run(main())
