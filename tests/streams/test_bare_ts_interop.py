"""Cross-check of the stream payload codec with an independent BARE implementation:
@bare-ts/lib 0.6.0 (npm, in interop/node), which the Node peer (``interop/node/diff_peer.mjs``,
commands ``bare_encode``/``bare_decode``) drives with the spec's schemas. Both directions: its
bytes equal ours, and each side decodes the other's; and it rejects the malformed inputs we
reject. The differential fuzzer over the same peer is ``tests/differential/bare.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
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
from tests.differential.bare import KINDS, to_js
from tests.differential.peer import NodePeer, available

pytestmark = [
    pytest.mark.interop,
    pytest.mark.peer("node + @bare-ts/lib + @waku/sds", available(), "make node-deps"),
]


@pytest.fixture(scope="module")
def peer() -> Iterator[NodePeer]:
    with NodePeer() as p:
        yield p


MESSAGES = [
    CreateStreamRequest("orders"),
    CreateStreamRequest(None),
    Init("orders"),
    CreatePartitionedStreamRequest("t", 3),
    CreatePartitionedStreamRequest(None, 2),
    CreatePartitionedStreamResponse("t", 2),
    PushRequest(300, b"hi"),
    PushRequest(2**64 - 1, bytes(range(256)) * 5),
    PushConfirm(1, "OK", 5),
    PushConfirm(2**40, "ERROR", 0),
    PullRequest(7, 0, 128),
    PullResponse(7, (StreamMessage(4, b"a"), StreamMessage(2**33, b""))),
    PullResponse(0, ()),
    GetIndex("c", "s"),
    SaveIndex("c", "s", 9),
    Index("c", "s", None),
    Index("c", "s", 16384),
    GetPartitionIndex("c", "s", 2),
    SavePartitionIndex("client-é", "s", 2, 2**63),
    PartitionIndex("c", "s", 1, None),
    Error("Invalid request"),
]


def test_bare_ts_encodes_every_message_to_our_bytes(peer: NodePeer) -> None:
    ours = [codec.encode_payload(m).hex() for m in MESSAGES]
    assert peer.call("bare_encode", [to_js(m) for m in MESSAGES]) == ours


def test_bare_ts_decodes_our_bytes_to_the_same_values(peer: NodePeer) -> None:
    items = [(to_js(m)[0], codec.encode_payload(m).hex()) for m in MESSAGES]
    got = peer.call("bare_decode", items)
    assert [g.get("ok") for g in got] == [to_js(m)[1] for m in MESSAGES]
    # and the BasePayload names the spec's protocol of each message
    assert [g["protocol"] for g in got] == [KINDS[kind][0] for kind, _ in items]


@settings(max_examples=10, deadline=None)
@given(
    st.lists(
        st.builds(PushRequest, st.integers(0, 2**64 - 1), st.binary(max_size=200))
        | st.builds(
            SavePartitionIndex,
            st.text(max_size=10),
            st.text(max_size=10),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
        )
        | st.builds(
            Index, st.text(max_size=10), st.text(max_size=10), st.none() | st.integers(0, 2**64 - 1)
        ),
        min_size=1,
        max_size=20,
    )
)
def test_random_messages_agree_both_ways(peer: NodePeer, msgs: list) -> None:
    ours = [codec.encode_payload(m).hex() for m in msgs]
    assert peer.call("bare_encode", [to_js(m) for m in msgs]) == ours


MALFORMED = [
    ("push_request", codec.encode_base("stream_push", bytes.fromhex("8000" + "00"))),  # non-minimal
    ("push_request", codec.encode_base("stream_push", bytes.fromhex("01" + "05" + "6162"))),
    ("push_confirm", codec.encode_base("stream_push", bytes.fromhex("01" + "02" + "00"))),  # enum
    ("index_request", codec.encode_base("stream_index", bytes.fromhex("02"))),  # union tag
    ("create_request", codec.encode_base("stream_create", bytes.fromhex("02"))),  # optional flag
    ("init", codec.encode_base("stream_create", bytes.fromhex("02fffe"))),  # UTF-8
    ("push_request", codec.encode_base("stream_push", bytes.fromhex("0100" + "00"))),  # trailing
    (
        "push_request",
        codec.encode_base("stream_push", bytes.fromhex("ffffffffffffffffffff01" + "00")),
    ),
]


def test_both_implementations_reject_the_same_malformed_payloads(peer: NodePeer) -> None:
    got = peer.call("bare_decode", [(kind, payload.hex()) for kind, payload in MALFORMED])
    for (kind, payload), theirs in zip(MALFORMED, got, strict=True):
        assert "error" in theirs, (kind, payload.hex(), theirs)
        with pytest.raises(DecodeError):
            if kind in ("push_confirm", "init"):
                codec.decode_response(payload, PushConfirm if kind == "push_confirm" else Init)
            else:
                codec.decode_request(payload)
