"""Ockam TCP transport: version byte, {:packet, 4} framing, CBOR TCPMessage.

Vectors from the reference (build-trust/ockam at commit fb8fb64, Elixir):
``transport/tcp/handler.ex`` (version byte 1, 4-byte big-endian length prefix) and
``transport/tcp/transport_message.ex`` (TypedCBOR ``encode_as: :list``: ``[onward_route,
return_route, payload, tracing_context]``, tracing null when absent; addresses ``:struct_values``
``[type, value bytes]``). ``REFERENCE_VECTOR`` is the bytes the reference's own Elixir codec
wrote (recorded in the Ockam interop issue); the others are derived from the same schemas with
CBOR per RFC 8949 (major type 4 array = 0x80|n, 2 bytes = 0x40|n, 3 text = 0x60|n, null = f6)."""

from __future__ import annotations

import contextlib
import struct

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.errors import DecodeError
from loglake.wire.ockam import (
    ADDRESS_TYPE_TCP,
    Address,
    BadProtocolVersion,
    FrameTooLarge,
    OckamWireError,
    RoutingMessage,
    TcpConnection,
    decode_transport_message,
    encode_frame,
    encode_transport_message,
    route,
    tcp_address,
)

REFERENCE_VECTOR = "848182004e73747265616d5f736572766963658182004361707043010203f6"
"""``TransportMessage.encode`` of onward ``[stream_service]``, return ``[app]``, payload
``01 02 03``, no tracing context, as the reference's Elixir codec writes it."""
REFERENCE_MSG = RoutingMessage(route("stream_service"), route("app"), b"\x01\x02\x03")

MSG = RoutingMessage(route("stream_service"), route("app"), b"\x01")
# 84                       array(4)
#   81 82 00 4e ...        [ [0, h'"stream_service"'] ]   (14 bytes -> 0x4e)
#   81 82 00 43 ...        [ [0, h'"app"'] ]
#   41 01                  payload h'01'
#   f6                     tracing_context: null
MSG_CBOR = "84" + "8182004e" + b"stream_service".hex() + "81820043" + b"app".hex() + "4101" + "f6"


def test_reference_vector_encodes_and_decodes_byte_for_byte() -> None:
    assert encode_transport_message(REFERENCE_MSG).hex() == REFERENCE_VECTOR
    assert decode_transport_message(bytes.fromhex(REFERENCE_VECTOR)) == REFERENCE_MSG
    # and through a connection, as a frame after the version byte (both decoding paths)
    wire = b"\x01" + 2 * (struct.pack(">I", 31) + bytes.fromhex(REFERENCE_VECTOR))
    assert TcpConnection().receive_data(wire) == [REFERENCE_MSG, REFERENCE_MSG]
    assert encode_frame(REFERENCE_MSG) == struct.pack(">I", 31) + bytes.fromhex(REFERENCE_VECTOR)


def test_transport_message_vector() -> None:
    assert encode_transport_message(MSG).hex() == MSG_CBOR
    assert decode_transport_message(bytes.fromhex(MSG_CBOR)) == MSG


def test_tracing_context_is_the_fourth_item_as_text() -> None:
    m = RoutingMessage(route("a"), (), b"", tracing_context="t")
    assert encode_transport_message(m).hex() == "84" + "81820041" + "61" + "80" + "40" + "6174"
    assert decode_transport_message(encode_transport_message(m)) == m


def test_frame_is_big_endian_length_then_body() -> None:
    body = bytes.fromhex(MSG_CBOR)
    assert encode_frame(MSG) == struct.pack(">I", len(body)) + body


def test_version_byte_then_frames_in_any_chunking() -> None:
    wire = (
        TcpConnection.initial_bytes() + encode_frame(MSG) + b"\x00\x00\x00\x00" + encode_frame(MSG)
    )
    assert wire[0] == 1
    for step in (1, 3, 7, len(wire)):
        conn = TcpConnection()
        got = []
        for i in range(0, len(wire), step):
            got += conn.receive_data(wire[i : i + step])
        assert got == [MSG, MSG]  # the empty frame is ignored (handler.ex)
        assert conn.error is None and conn.buffered == 0


def test_version_received_only_after_the_version_byte() -> None:
    conn = TcpConnection()
    assert not conn.version_received
    conn.receive_data(b"")
    assert not conn.version_received
    conn.receive_data(b"\x01")
    assert conn.version_received


def test_bad_version_byte_is_a_protocol_error() -> None:
    conn = TcpConnection()
    assert conn.receive_data(b"\x02" + encode_frame(MSG)) == []
    assert isinstance(conn.error, BadProtocolVersion)
    assert not conn.version_received


def test_frame_over_the_limit_is_refused_before_buffering_it() -> None:
    conn = TcpConnection(max_frame=100)
    assert conn.receive_data(b"\x01" + encode_frame(MSG) + struct.pack(">I", 101)) == [MSG]
    assert isinstance(conn.error, FrameTooLarge)
    assert conn.receive_data(b"more") == []  # dead connection ignores further bytes


def test_messages_before_a_bad_frame_are_kept() -> None:
    conn = TcpConnection()
    bad = b"\xff\xff"
    got = conn.receive_data(b"\x01" + encode_frame(MSG) + struct.pack(">I", 2) + bad)
    assert got == [MSG]
    assert isinstance(conn.error, OckamWireError)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("ff", "not valid CBOR"),
        ("84808040", "not valid CBOR"),  # truncated: the tracing context is missing
        ("83" + "80" + "80" + "40", "expected 4 fields, got 3"),  # the reference refuses 3
        ("82" + "80" + "80", "expected 4 fields, got 2"),
        ("85" + "80" + "80" + "40" + "f6" + "f6", "expected 4 fields, got 5"),
        ("a0", "must be an array"),  # a map, not an array
        ("84" + "a0" + "80" + "40" + "f6", "onward_route must be an array"),
        ("84" + "80" + "a0" + "40" + "f6", "return_route must be an array"),
        ("84" + "81a20000014161" + "80" + "40" + "f6", "address must be an array"),  # map form
        ("84" + "8183004161" + "00" + "80" + "40" + "f6", "address must be an array"),  # 3 items
        ("84" + "8181" + "00" + "80" + "40" + "f6", "address must be an array"),  # 1 item
        ("84" + "8182006161" + "80" + "40" + "f6", "byte string"),  # value as text
        ("84" + "818200f6" + "80" + "40" + "f6", "byte string"),  # value null
        ("84" + "818261614161" + "80" + "40" + "f6", "integer"),  # type as text
        ("84" + "8182f54161" + "80" + "40" + "f6", "integer"),  # type true
        ("84" + "8182204161" + "80" + "40" + "f6", "integer"),  # type -1
        ("84" + "818219010041" + "61" + "80" + "40" + "f6", "integer"),  # type 256
        ("84" + "80" + "80" + "6161" + "f6", "payload must be a byte string"),
        ("84" + "80" + "80" + "f6" + "f6", "payload must be a byte string"),
        ("84" + "80" + "80" + "40" + "01", "tracing_context"),
        ("84" + "80" + "80" + "40" + "4174", "tracing_context"),  # bytes, not text
        ("84" + "80" + "80" + "40" + "f6" + "00", "trailing"),
        # nesting: refused at the first item that is not the shape's, not by a depth limit
        ("84" + "81" * 600 + "80" + "80" + "40" + "f6", "address must be an array"),
    ],
)
def test_malformed_transport_messages(body: str, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        decode_transport_message(bytes.fromhex(body))


address = st.builds(Address, st.integers(0, 255), st.binary(max_size=40))
routes = st.lists(address, max_size=4).map(tuple)


@given(routes, routes, st.binary(max_size=300), st.none() | st.text(max_size=20))
def test_transport_message_round_trip(onward, ret, payload, tracing) -> None:
    m = RoutingMessage(onward, ret, payload, tracing)
    assert decode_transport_message(encode_transport_message(m)) == m


@given(st.binary(max_size=80))
def test_random_frame_bodies_decode_or_raise_decode_error(body: bytes) -> None:
    # anything but a DecodeError (or a crash) fails the test
    with contextlib.suppress(DecodeError):
        decode_transport_message(body)


def test_tcp_address_is_type_1_with_host_port_text() -> None:
    # transport/tcp/address.ex: TCPAddress.new(host, port) = %Address{type: 1, value: "host:port"}
    a = tcp_address("127.0.0.1", 4000)
    assert a == Address(ADDRESS_TYPE_TCP, b"127.0.0.1:4000")
    body = encode_transport_message(RoutingMessage((a,), (), b""))
    assert body.hex() == "84" + "8182014e" + b"127.0.0.1:4000".hex() + "80" + "40" + "f6"
    assert decode_transport_message(body).onward_route == (a,)


@given(st.binary(max_size=300), st.binary(max_size=8))
def test_repeated_route_shortcut_agrees_with_the_full_decoder(payload: bytes, junk: bytes) -> None:
    conn = TcpConnection()
    first = RoutingMessage(route("w"), route("p0"), b"first")
    second = RoutingMessage(route("w"), route("p0"), payload)
    wire = b"\x01" + encode_frame(first) + encode_frame(second)
    assert conn.receive_data(wire) == [first, second]
    # same routes, then a payload item with junk after it: must fail exactly as the full path
    body = encode_transport_message(second) + junk
    conn2 = TcpConnection()
    conn2.receive_data(b"\x01" + encode_frame(first))
    got = conn2.receive_data(struct.pack(">I", len(body)) + body)
    if junk:
        assert got == [] and isinstance(conn2.error, OckamWireError)
    else:
        assert got == [second]


@given(st.binary(max_size=70000))
def test_frame_template_gives_the_same_bytes_as_encode_frame(payload: bytes) -> None:
    from loglake.wire.ockam import FrameTemplate

    on, ret = route("stream_service/s/0"), route("p0")
    assert FrameTemplate(on, ret).frame(payload) == encode_frame(RoutingMessage(on, ret, payload))
    # the same bytes cbor2 writes for the whole TCPMessage
    frame = FrameTemplate(on, ret).frame(payload)
    assert frame[4:] == cbor2.dumps([[[0, on[0].value]], [[0, ret[0].value]], payload, None])


# -- Ockam.Wire.Binary.V2 (the older BARE message encoding) -----------------------------------
# Vectors copied from the reference's test/ockam/wire/binary/v2_test.exs ("encode/1 for TCP",
# "encode/1 for TCP (minimal)", "decode/1 for TCP").
V2_TCP = bytes(
    [1, 2, 1, 7, 0, 127, 0, 0, 1, 160, 15, 0, 7, 112, 114, 105, 110, 116, 101, 114]
) + bytes([1, 1, 7, 0, 127, 0, 0, 1, 184, 11, 5, 104, 101, 108, 108, 111])
V2_TCP_MINIMAL = bytes([1, 1, 1, 7, 0, 127, 0, 0, 1, 160, 15, 0, 0])


def test_wire_binary_v2_vectors_from_the_reference() -> None:
    from loglake.wire.ockam import decode_wire_binary, encode_wire_binary
    from loglake.wire.ockam import legacy_tcp_address as tcp_address

    msg = RoutingMessage(
        (tcp_address("127.0.0.1", 4000), Address.local("printer")),
        (tcp_address("127.0.0.1", 3000),),
        b"hello",
    )
    assert encode_wire_binary(msg) == V2_TCP
    assert decode_wire_binary(V2_TCP) == msg
    minimal = RoutingMessage((tcp_address("127.0.0.1", 4000),), (), b"")
    assert encode_wire_binary(minimal) == V2_TCP_MINIMAL
    assert decode_wire_binary(V2_TCP_MINIMAL) == minimal


@pytest.mark.parametrize(
    "data",
    [V2_TCP[:-1], V2_TCP + b"\x00", b"\x02" + V2_TCP[1:], b"\x01\x01\x01\x09\x00"],
    ids=["truncated", "trailing", "version-2", "address-past-end"],
)
def test_wire_binary_v2_rejects_malformed(data: bytes) -> None:
    from loglake.wire.ockam import decode_wire_binary

    with pytest.raises(DecodeError):
        decode_wire_binary(data)


# -- frames as parts, one-pass decoding (issue 16: the push path's framing) ----------------------
@pytest.mark.parametrize("n", [0, 1, 23, 24, 255, 256, 65535, 65536, 70000])
def test_cbor_bytes_head_is_cbor2s_head(n: int) -> None:
    from loglake.wire.ockam import cbor_bytes_head

    assert cbor_bytes_head(n) == cbor2.dumps(b"\0" * n)[: -n or None]


def test_cbor_bytes_head_of_huge_strings() -> None:
    # RFC 8949 §3: argument in 4 bytes (0x5a) below 2**32, else 8 bytes (0x5b)
    from loglake.wire.ockam import cbor_bytes_head

    assert cbor_bytes_head(2**32 - 1) == b"\x5a\xff\xff\xff\xff"
    assert cbor_bytes_head(2**32) == b"\x5b" + (2**32).to_bytes(8, "big")


messages = st.builds(
    RoutingMessage, routes, routes, st.binary(max_size=300), st.none() | st.text(max_size=8)
)


@given(st.lists(messages, max_size=8), st.lists(st.binary(max_size=300), max_size=8))
def test_frame_parts_join_to_the_frames(msgs, burst) -> None:
    from loglake.wire.ockam import encode_frames, frame_parts

    # a burst on the very same route objects (the server's confirms) takes the cached heads
    on, ret = route("p0"), route("stream_service/s/0")
    msgs = msgs + [RoutingMessage(on, ret, p) for p in burst] + msgs[:2]
    parts = frame_parts(msgs)
    expected = b"".join(encode_frame(m) for m in msgs)
    assert b"".join(parts) == encode_frames(msgs) == expected
    # payloads are handed on as they are, not copied
    plain = [m for m in msgs if m.tracing_context is None]
    assert all(any(p is m.payload for p in parts) for m in plain)


@given(
    st.lists(messages, max_size=6),
    st.lists(st.lists(st.binary(max_size=300), max_size=6), max_size=4),
)
def test_a_message_run_is_framed_as_its_messages(msgs, runs) -> None:
    from loglake.wire.ockam import MessageRun, encode_frames, frame_parts

    on, ret = route("p0"), route("stream_service/s/0")
    items: list = list(msgs)
    for k, payloads in enumerate(runs):
        # runs on the very route objects, on equal routes that are other objects, between
        # single messages on the same routes (the route cache must not leak across them)
        r = ret if k % 2 else route("stream_service/s/0")
        items += [MessageRun(on, r, payloads), RoutingMessage(on, r, b"single"), *msgs[:1]]
    expanded = [m for it in items for m in (it.messages() if isinstance(it, MessageRun) else [it])]
    assert encode_frames(items) == b"".join(encode_frame(m) for m in expanded)
    parts = frame_parts(items)
    for it in items:  # payloads handed on, not copied
        if isinstance(it, MessageRun):
            assert all(any(p is q for q in parts) for p in it.payloads)


@given(st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=300)), max_size=30))
def test_frames_one_call_at_a_time_over_a_few_route_objects(calls) -> None:
    """``frame_parts`` keeps the last route pair it framed (by object identity) between
    calls, as a server answering one push at a time does: framing call after call, on route
    objects that come back, on equal routes that are other objects, and with payload sizes
    that repeat, must give each message's own frame."""
    from loglake.wire.ockam import frame_parts

    pairs = [
        (route("p0"), route("stream_service/s/0")),
        (route("p0"), route("stream_service/s/1")),
        (route("p0"), route("stream_service/s/0")),  # equal to the first, other objects
        (route("r7"), route("stream_service")),
    ]
    for k, payload in calls:
        m = RoutingMessage(*pairs[k], payload)
        assert b"".join(frame_parts([m])) == encode_frame(m)


@given(st.binary(max_size=70000))
def test_frame_template_head_then_payload_is_the_frame(payload: bytes) -> None:
    from loglake.wire.ockam import FrameTemplate

    on, ret = route("stream_service/s/0"), route("p0")
    t = FrameTemplate(on, ret)
    assert t.head(len(payload)) + payload + t.TAIL == encode_frame(RoutingMessage(on, ret, payload))
    assert t.head(len(payload)) is t.head(len(payload))  # built once per size


@given(st.lists(messages, min_size=1, max_size=6), st.integers(1, 400), st.data())
def test_receive_frames_in_any_chunking(msgs, step, data) -> None:
    # repeated routes (the shortcut), new routes and tracing contexts, mixed
    msgs = msgs + [msgs[0]] * 3 + msgs
    wire = b"\x01" + b"".join(encode_frame(m) for m in msgs)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(wire) - 1), max_size=12)))
    conn, got = TcpConnection(), []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += conn.receive_frames(wire[a:b])
    assert [RoutingMessage(*f) for f in got] == msgs
    assert conn.error is None and conn.buffered == 0
    # bytearray and memoryview chunks are accepted as well
    conn2 = TcpConnection()
    got2 = conn2.receive_data(bytearray(wire[:step])) + conn2.receive_data(memoryview(wire)[step:])
    assert got2 == msgs


def test_a_large_frame_in_small_chunks_is_kept_until_complete() -> None:
    big = RoutingMessage(route("w"), route("p0"), bytes(range(256)) * 800)  # 204,800 bytes
    wire = b"\x01" + encode_frame(MSG) + encode_frame(big) + encode_frame(MSG)
    conn, got = TcpConnection(), []
    for i in range(0, len(wire), 1000):
        got += conn.receive_frames(wire[i : i + 1000])
        assert conn.buffered < len(encode_frame(big)) + 1000  # only the incomplete frame
    assert [RoutingMessage(*f) for f in got] == [MSG, big, MSG]
    assert conn.buffered == 0


def test_receive_frames_bad_frame_after_good_ones_is_a_typed_error() -> None:
    conn = TcpConnection()
    frames = conn.receive_frames(b"\x01" + encode_frame(MSG) + encode_frame(MSG))
    assert [RoutingMessage(*f) for f in frames] == [MSG, MSG]
    # same routes as the shortcut's, then a payload item that does not fill the body
    body = encode_transport_message(MSG)[:-3] + b"\x42\x01\xf6"  # byte string of 2, 1 given
    got = conn.receive_frames(struct.pack(">I", len(body)) + body + encode_frame(MSG))
    assert got == [] and isinstance(conn.error, OckamWireError)
    assert conn.receive_frames(encode_frame(MSG)) == []  # nothing after the error


def test_receive_frames_refuses_an_oversized_frame_announced_in_a_later_chunk() -> None:
    conn = TcpConnection(max_frame=100)
    assert conn.receive_frames(b"\x01" + encode_frame(MSG)[:3]) == []
    assert conn.receive_frames(encode_frame(MSG)[3:] + b"\x00\x00") != []
    assert conn.receive_frames(b"\x00\x65") == []  # length 101
    assert isinstance(conn.error, FrameTooLarge)


@given(st.binary(max_size=120), st.integers(1, 20))
def test_random_bytes_after_the_version_decode_or_give_a_typed_error(junk, step) -> None:
    conn = TcpConnection()
    wire = b"\x01" + encode_frame(MSG) + junk
    got = []
    for i in range(0, len(wire), step):
        got += conn.receive_frames(wire[i : i + step])
    assert RoutingMessage(*got[0]) == MSG
    assert conn.error is None or isinstance(conn.error, DecodeError | FrameTooLarge)
