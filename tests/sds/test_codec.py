"""Codec: bytes identical to @waku/proto's SdsMessage (protons), decode errors typed.

Vectors marked "from @waku/sds" come from ``Message.encode()`` of @waku/sds 0.0.8 run through
interop/node/diff_peer.mjs (command ``sds_encode``), recorded here.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.sds.codec import Limits, decode, encode, encode_message_fast
from loglake.sds.errors import DropReason, SdsDecodeError
from loglake.sds.messages import HistoryEntry, MessageKind, SdsMessage, message_id_of

FULL = SdsMessage(
    sender_id="alice",
    message_id="m1",
    channel_id="chan",
    lamport_timestamp=1_700_000_000_001,
    causal_history=(HistoryEntry("h1", b"\x01\x02", "bob"), HistoryEntry("h2")),
    bloom_filter=b"\x00\xff",
    repair_request=(HistoryEntry("r1", None, "carol"),),
    content=b"hello",
)
# from @waku/sds: new Message("m1","chan","alice",[...],1700000000001n,...).encode()
FULL_HEX = (
    "0a05616c69636512026d311a046368616e5081d095ffbc315a0d0a026831120201021a03626f625a040a02"
    "6832620200ff6a0b0a0272311a056361726f6ca2010568656c6c6f"
)
EPHEMERAL = SdsMessage("alice", "e1", "chan", content=b"hi")
EPHEMERAL_HEX = "0a05616c696365120265311a046368616ea201026869"  # from @waku/sds
SYNC = SdsMessage("alice", "s1", "", 5, (HistoryEntry("h1", None, "bob"),))
SYNC_HEX = "0a05616c6963651202733150055a090a0268311a03626f62"  # from @waku/sds


@pytest.mark.parametrize(
    ("msg", "hexbytes"), [(FULL, FULL_HEX), (EPHEMERAL, EPHEMERAL_HEX), (SYNC, SYNC_HEX)]
)
def test_encoding_matches_waku_sds_vectors(msg: SdsMessage, hexbytes: str) -> None:
    assert encode(msg).hex() == hexbytes
    assert encode_message_fast(msg).hex() == hexbytes
    assert decode(bytes.fromhex(hexbytes)) == msg


def test_kinds_follow_field_presence() -> None:
    assert FULL.kind is MessageKind.CONTENT
    assert EPHEMERAL.kind is MessageKind.EPHEMERAL
    assert SYNC.kind is MessageKind.SYNC
    assert SdsMessage("a", "b", "c", 1, content=b"").kind is MessageKind.SYNC


def test_message_id_is_lowercase_hex_sha256() -> None:
    assert message_id_of(b"abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


ids = st.text(min_size=1, max_size=20)
entries = st.builds(
    HistoryEntry, ids, st.none() | st.binary(max_size=10), st.none() | st.text(max_size=10)
)
messages = st.builds(
    SdsMessage,
    ids,
    ids,
    st.text(max_size=10),
    st.none() | st.integers(0, 2**64 - 1),
    st.lists(entries, max_size=5).map(tuple),
    st.none() | st.binary(max_size=40),
    st.lists(entries, max_size=3).map(tuple),
    st.binary(min_size=1, max_size=40),
)


@settings(deadline=None)
@given(messages)
def test_fast_encoder_equals_protobuf_runtime(msg: SdsMessage) -> None:
    data = encode(msg)
    assert encode_message_fast(msg) == data
    assert decode(data) == msg


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_raises_only_typed_decode_errors(data: bytes) -> None:
    try:
        decode(data)
    except SdsDecodeError as e:
        assert isinstance(e.reason, DropReason)


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (SdsMessage("a", "", "c", 1, content=b"x"), DropReason.MISSING_FIELD),
        (SdsMessage("", "m", "c", 1, content=b"x"), DropReason.MISSING_FIELD),
        (SdsMessage("a", "m", "c"), DropReason.UNKNOWN_KIND),
        (SdsMessage("a", "m" * 300, "c", 1), DropReason.OVERSIZED),
        (SdsMessage("a", "m", "c", 1, (HistoryEntry(""),)), DropReason.MISSING_FIELD),
        (SdsMessage("a", "m", "c", 1, content=b"x" * 100), DropReason.OVERSIZED),
        (SdsMessage("a", "m", "c", 1, (HistoryEntry("h", b"x" * 2000),)), DropReason.OVERSIZED),
    ],
)
def test_invalid_messages_name_their_reason(msg: SdsMessage, reason: DropReason) -> None:
    with pytest.raises(SdsDecodeError) as e:
        decode(encode(msg), Limits(max_content_bytes=50))
    assert e.value.reason is reason


def test_truncated_protobuf_is_malformed() -> None:
    with pytest.raises(SdsDecodeError) as e:
        decode(bytes.fromhex(FULL_HEX)[:-3])
    assert e.value.reason is DropReason.MALFORMED
