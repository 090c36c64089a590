"""Golden frames for every stream message: the bytes an Ockam node (build-trust/ockam at commit
fb8fb64) puts on the TCP wire, asserted both ways against loglake's codecs.

Each vector is a whole frame: 4-byte length, the CBOR ``TCPMessage`` (transport_message.ex:
``[onward, return, payload, null]``, addresses ``[0, name bytes]``) whose payload is
``base_encode(protocol, BARE body)`` with the body from ``protocol/stream.ex`` /
``stream_partitioned.ex``. They were derived from those schemas with the reference-shaped peer
(``interop/ockam_peer.py``: ``cbor2`` and its own BARE, no loglake code) and are re-derived by it
here, so the literal, the peer and loglake must all agree. One, spelled out (``push``)::

    00000024                  length 36
    84                        TCPMessage, 4 items
      81 82 00 45 775f735f30  onward [[0, "w_s_0"]]
      81 82 00 43 617070      return [[0, "app"]]
      51                      payload, 17 bytes: BasePayload
        0b 73..68             protocol "stream_push"
        04 01 02 6869         data: PushRequest {request_id 1, data "hi"}
      f6                      tracing_context null
"""

from __future__ import annotations

import pytest

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
from loglake.wire.ockam import RoutingMessage, TcpConnection, encode_frame, route
from tests.streams.interop import ockam_peer as ref
from tests.streams.interop.ockam_peer import Message, local

W, A = route("w_s_0"), route("app")
S, IX = route("stream_service"), route("stream_index_service")

# name: (onward, return, protocol as sent, loglake message, request?, frame hex, the peer's frame)
VECTORS = {
    "create": (
        S, A, "stream_create", CreateStreamRequest("s"), True,
        "0000002e848182004e73747265616d5f7365727669636581820043617070520d73747265616d5f637265"
        "61746503010173f6",
        ref.create("s"),
    ),
    "create_partitioned": (
        S, A, "stream_create_partitioned", CreatePartitionedStreamRequest("s", 2), True,
        "0000003c848182004e73747265616d5f7365727669636581820043617070581f1973747265616d5f6372"
        "656174655f706172746974696f6e65640401017302f6",
        ref.create_partitioned("s", 2),
    ),
    "init": (
        A, W, "stream_create", Init("s"), False,
        "00000024848182004361707081820045775f735f30510d73747265616d5f637265617465020173f6",
        ref.init("s"),
    ),
    "init_partitioned": (
        A, W, "stream_create_partitioned", CreatePartitionedStreamResponse("s", 1), False,
        "00000032848182004361707081820045775f735f30581e1973747265616d5f6372656174655f70617274"
        "6974696f6e656403017301f6",
        ref.init_partitioned("s", 1),
    ),
    "push": (
        W, A, "stream_push", PushRequest(1, b"hi"), True,
        "000000248481820045775f735f3081820043617070510b73747265616d5f707573680401026869f6",
        ref.push(1, b"hi"),
    ),
    "push_confirm": (
        A, W, "stream_push", PushConfirm(1, "OK", 0), False,
        "00000023848182004361707081820045775f735f30500b73747265616d5f7075736803010000f6",
        ref.push_confirm(1, True, 0),
    ),
    "pull": (
        W, A, "stream_pull", PullRequest(2, 0, 10), True,
        "000000238481820045775f735f3081820043617070500b73747265616d5f70756c6c0302000af6",
        ref.pull(2, 0, 10),
    ),
    "pull_response": (
        A, W, "stream_pull", PullResponse(2, (StreamMessage(0, b"hi"),)), False,
        "00000026848182004361707081820045775f735f30530b73747265616d5f70756c6c06020100026869f6",
        ref.pull_response(2, [(0, b"hi")]),
    ),
    "index_get": (
        IX, A, "stream_index", GetIndex("c", "s"), True,
        "00000035848182005473747265616d5f696e6465785f7365727669636581820043617070530c73747265"
        "616d5f696e646578050001630173f6",
        ref.index_get("c", "s"),
    ),
    "index_save": (
        IX, A, "stream_index", SaveIndex("c", "s", 5), True,
        "00000036848182005473747265616d5f696e6465785f7365727669636581820043617070540c73747265"
        "616d5f696e64657806010163017305f6",
        ref.index_save("c", "s", 5),
    ),
    "index": (
        A, IX, "stream_index", Index("c", "s", 5), False,
        "0000003684818200436170708182005473747265616d5f696e6465785f73657276696365540c73747265"
        "616d5f696e64657806016301730105f6",
        ref.index_response("c", "s", 5),
    ),
    "index_get_partitioned": (
        IX, A, "stream_index_partitioned", GetPartitionIndex("c", "s", 1), True,
        "00000043848182005473747265616d5f696e6465785f736572766963658182004361707058201873747265"
        "616d5f696e6465785f706172746974696f6e656406000163017301f6",
        ref.index_get_partitioned("c", "s", 1),
    ),
    "index_save_partitioned": (
        IX, A, "stream_index_partitioned", SavePartitionIndex("c", "s", 1, 5), True,
        "00000044848182005473747265616d5f696e6465785f736572766963658182004361707058211873747265"
        "616d5f696e6465785f706172746974696f6e65640701016301730105f6",
        ref.index_save_partitioned("c", "s", 1, 5),
    ),
    "index_partitioned": (
        A, IX, "stream_index_partitioned", PartitionIndex("c", "s", 1, None), False,
        "0000004384818200436170708182005473747265616d5f696e6465785f7365727669636558201873747265"
        "616d5f696e6465785f706172746974696f6e656406016301730100f6",
        ref.index_response_partitioned("c", "s", 1, None),
    ),
    "error": (
        A, S, "error", Error("Invalid request"), False,
        "0000003384818200436170708182004e73747265616d5f7365727669636557056572726f72100f496e76"
        "616c69642072657175657374f6",
        ref.error("Invalid request"),
    ),
}  # fmt: skip


def _peer_addrs(r) -> list:
    return [local(a.name) for a in r]


@pytest.mark.parametrize("name", list(VECTORS))
def test_the_peer_derives_the_same_frame(name: str) -> None:
    onward, ret, _, _, _, hexed, payload = VECTORS[name]
    assert ref.frame(Message(_peer_addrs(onward), _peer_addrs(ret), payload)).hex() == hexed


@pytest.mark.parametrize("name", list(VECTORS))
def test_loglake_encodes_the_frame(name: str) -> None:
    onward, ret, protocol, msg, _, hexed, _ = VECTORS[name]
    frame = encode_frame(RoutingMessage(onward, ret, codec.encode_payload(msg, protocol)))
    assert frame.hex() == hexed


@pytest.mark.parametrize("name", list(VECTORS))
def test_loglake_decodes_the_frame(name: str) -> None:
    onward, ret, protocol, msg, request, hexed, _ = VECTORS[name]
    conn = TcpConnection()
    (got,) = conn.receive_data(b"\x01" + bytes.fromhex(hexed))
    assert conn.error is None
    assert (got.onward_route, got.return_route, got.tracing_context) == (onward, ret, None)
    if request:
        assert codec.decode_request(got.payload) == (protocol, msg)
    else:
        assert codec.decode_base(got.payload).protocol == protocol
        assert codec.decode_response(got.payload, type(msg)) == msg
