"""Stream payload codec: every message of specs/ockam-stream-service.txt, bytes computed by hand
from the spec's BARE schemas (BasePayload = string protocol + data; uint = LEB128)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.errors import DecodeError
from loglake.streams import codec
from loglake.streams.api import StreamMessage
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
)


def s(text: str) -> str:
    """BARE string: uint length + UTF-8 (lengths below are < 128, one octet)."""
    return f"{len(text.encode()):02x}" + text.encode().hex()


def base(protocol: str, body_hex: str) -> str:
    """BasePayload {protocol: string, data: data}."""
    return s(protocol) + f"{len(body_hex) // 2:02x}" + body_hex


VECTORS = [
    (CreateStreamRequest("orders"), base("stream_create", "01" + s("orders"))),
    (CreateStreamRequest(None), base("stream_create", "00")),
    (Init("orders"), base("stream_create", s("orders"))),
    (
        CreatePartitionedStreamRequest("orders", 3),
        base("stream_create_partitions", "01" + s("orders") + "03"),
    ),
    (
        CreatePartitionedStreamResponse("orders", 2),
        base("stream_create_partitions", s("orders") + "02"),
    ),
    (PushRequest(300, b"hi"), base("stream_push", "ac02" + "02" + "6869")),
    (PushConfirm(1, "OK", 5), base("stream_push", "01" + "00" + "05")),
    (PushConfirm(1, "ERROR", 0), base("stream_push", "01" + "01" + "00")),
    (PullRequest(7, 0, 128), base("stream_pull", "07" + "00" + "8001")),
    (
        PullResponse(7, (StreamMessage(4, b"a"), StreamMessage(5, b""))),
        base("stream_pull", "07" + "02" + "04" + "0161" + "05" + "00"),
    ),
    (PullResponse(7, ()), base("stream_pull", "07" + "00")),
    # type Request (GetIndex | SaveIndex): tag 0 / 1 in declared order
    (GetIndex("c", "s"), base("stream_index", "00" + s("c") + s("s"))),
    (SaveIndex("c", "s", 9), base("stream_index", "01" + s("c") + s("s") + "09")),
    (Index("c", "s", None), base("stream_index", s("c") + s("s") + "00")),
    (Index("c", "s", 9), base("stream_index", s("c") + s("s") + "0109")),
    (GetPartitionIndex("c", "s", 2), base("stream_index", "00" + s("c") + s("s") + "02")),
    (
        SavePartitionIndex("c", "s", 2, 9),
        base("stream_index", "01" + s("c") + s("s") + "02" + "09"),
    ),
    (PartitionIndex("c", "s", 2, 9), base("stream_index", s("c") + s("s") + "02" + "0109")),
    (Error("Invalid request"), base("error", s("Invalid request"))),
]


@pytest.mark.parametrize(("msg", "hexbytes"), VECTORS, ids=lambda v: type(v).__name__)
def test_message_vectors(msg: object, hexbytes: str) -> None:
    assert codec.encode_payload(msg).hex() == hexbytes


@pytest.mark.parametrize("msg", [m for m, _ in VECTORS], ids=lambda v: type(v).__name__)
def test_each_message_decodes_on_its_side(msg: object) -> None:
    payload = codec.encode_payload(msg)
    if isinstance(msg, Init | CreatePartitionedStreamResponse | PushConfirm | PullResponse):
        assert codec.decode_response(payload, type(msg)) == msg
    elif isinstance(msg, Index | PartitionIndex | Error):
        assert codec.decode_response(payload, Index if isinstance(msg, Error) else type(msg)) == msg
    else:
        assert codec.decode_request(payload)[1] == msg


def test_plain_and_partitioned_index_requests_are_told_apart_by_exact_decoding() -> None:
    assert codec.decode_request(codec.encode_payload(GetIndex("c", "s")))[1] == GetIndex("c", "s")
    got = codec.decode_request(codec.encode_payload(GetPartitionIndex("c", "s", 0)))[1]
    assert got == GetPartitionIndex("c", "s", 0)
    got = codec.decode_request(codec.encode_payload(SavePartitionIndex("c", "s", 1, 2)))[1]
    assert got == SavePartitionIndex("c", "s", 1, 2)


def test_reference_protocol_names_are_accepted_as_aliases() -> None:
    # stream_partitioned.ex names: stream_create_partitioned, stream_index_partitioned
    body = codec.encode_payload(CreatePartitionedStreamRequest("x", 2))
    alias = codec.encode_base("stream_create_partitioned", codec.decode_base(body).data)
    assert codec.decode_request(alias) == (
        "stream_create_partitioned",
        CreatePartitionedStreamRequest("x", 2),
    )
    body = codec.encode_payload(GetPartitionIndex("c", "s", 1), "stream_index_partitioned")
    assert codec.decode_request(body) == (
        "stream_index_partitioned",
        GetPartitionIndex("c", "s", 1),
    )


def test_fast_path_encoders_match_the_schema() -> None:
    assert codec.encode_push_request(300, b"x" * 200) == codec.encode_payload(
        PushRequest(300, b"x" * 200)
    )
    assert codec.encode_push_confirm(2**40, 2**33) == codec.encode_payload(
        PushConfirm(2**40, "OK", 2**33)
    )


@pytest.mark.parametrize(
    ("payload_hex", "why"),
    [
        ("", "truncated"),
        (base("stream_nope", "00"), "unknown protocol"),
        (base("stream_push", "01"), "truncated"),  # PushRequest without data
        (base("stream_push", "0105"), "past the end"),
        (base("stream_push", "010000"), "trailing"),
        (base("stream_index", "02" + s("c") + s("s")), "no tag"),
        (base("stream_create", "02"), "0 or 1"),
        (base("stream_create", "01" + "02fffe"), "UTF-8"),
        (s("stream_push") + "ff", "truncated"),  # data length runs off
    ],
)
def test_malformed_payloads_raise_decode_error(payload_hex: str, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        codec.decode_request(bytes.fromhex(payload_hex))


@given(st.binary(max_size=64))
def test_random_payloads_decode_or_raise_decode_error(buf: bytes) -> None:
    with contextlib.suppress(DecodeError):
        codec.decode_request(buf)


@given(st.integers(0, 2**64 - 1), st.binary(max_size=2000))
def test_push_round_trip(rid: int, data: bytes) -> None:
    assert codec.decode_request(codec.encode_push_request(rid, data))[1] == PushRequest(rid, data)


@given(st.binary(max_size=40))
def test_fast_push_decoders_agree_with_the_schema(tail: bytes) -> None:
    for payload in (codec.encode_base("stream_push", tail), tail):
        fast = codec.decode_push_request(payload)
        try:
            slow = codec.decode_request(payload)[1]
        except DecodeError:
            slow = None
        assert fast == (None if not isinstance(slow, PushRequest) else (slow.request_id, slow.data))
        fast_c = codec.decode_push_confirm(payload)
        try:
            slow_c = codec.decode_response(payload, PushConfirm)
        except DecodeError:
            slow_c = None
        expected = (
            (slow_c.request_id, slow_c.status == "OK", slow_c.index)
            if isinstance(slow_c, PushConfirm)
            else None
        )
        assert fast_c == expected


@given(st.integers(0, 2**64 - 1), st.binary(max_size=300), st.integers(0, 2**64 - 1))
def test_fast_push_decoders_round_trip(rid: int, data: bytes, index: int) -> None:
    assert codec.decode_push_request(codec.encode_push_request(rid, data)) == (rid, data)
    assert codec.decode_push_confirm(codec.encode_push_confirm(rid, index)) == (rid, True, index)
    err = codec.encode_payload(PushConfirm(rid, "ERROR", 0))
    assert codec.decode_push_confirm(err) == (rid, False, 0)


@given(
    st.integers(0, 2**64 - 1),
    st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=300)), max_size=20),
)
def test_fast_pull_codec_matches_the_schema(rid: int, msgs: list[tuple[int, bytes]]) -> None:
    generic = codec.encode_payload(PullResponse(rid, tuple(StreamMessage(i, d) for i, d in msgs)))
    assert codec.encode_pull_response(rid, msgs) == generic
    assert codec.decode_pull_response(generic) == codec.decode_response(generic, PullResponse)


@given(st.binary(max_size=60))
def test_fast_pull_decoder_rejects_what_the_schema_rejects(tail: bytes) -> None:
    payload = codec.encode_base("stream_pull", tail)
    try:
        slow = codec.decode_response(payload, PullResponse)
    except DecodeError:
        slow = None
    assert codec.decode_pull_response(payload) == slow
