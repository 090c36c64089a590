"""Cross-check of the stream payload codec with an independent BARE implementation:
@bare-ts/lib 0.6.0 (npm, in interop/node), driven by ``interop/bare_ts_stream.mjs`` which
declares the spec's schemas with it. Both directions: its bytes equal ours, and each side
decodes the other's; and it rejects the malformed inputs we reject."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

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

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "interop" / "node"
SCRIPT = Path(__file__).parent / "interop" / "bare_ts_stream.mjs"

pytestmark = [
    pytest.mark.interop,
    pytest.mark.peer(
        "node + @bare-ts/lib",
        shutil.which("node") is not None and (NODE_DIR / "node_modules/@bare-ts/lib").exists(),
        "make node-deps",
    ),
]


def node(mode: str, items: list) -> list:
    out = subprocess.run(
        ["node", str(SCRIPT), str(NODE_DIR)],
        input=json.dumps({"mode": mode, "items": items}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def to_js(msg: object) -> tuple[str, dict]:
    """(kind, JSON value) for the script; uints as decimal strings, data as hex."""

    def u(v: int | None) -> str | None:
        return None if v is None else str(v)

    match msg:
        case CreateStreamRequest(name):
            return "create_request", {"stream_name": name}
        case Init(name):
            return "init", {"stream_name": name}
        case CreatePartitionedStreamRequest(name, n):
            return "create_partitions_request", {"stream_name": name, "partitions": u(n)}
        case CreatePartitionedStreamResponse(name, p):
            return "create_partitions_response", {"stream_name": name, "partition": u(p)}
        case PushRequest(rid, data):
            return "push_request", {"request_id": u(rid), "data": data.hex()}
        case PushConfirm(rid, status, index):
            return "push_confirm", {"request_id": u(rid), "status": status, "index": u(index)}
        case PullRequest(rid, index, limit):
            return "pull_request", {"request_id": u(rid), "index": u(index), "limit": u(limit)}
        case PullResponse(rid, msgs):
            ms = [{"index": u(m.index), "data": m.data.hex()} for m in msgs]
            return "pull_response", {"request_id": u(rid), "messages": ms}
        case GetIndex(c, s):
            return "index_request", {"tag": 0, "value": {"client_id": c, "stream_name": s}}
        case SaveIndex(c, s, i):
            value = {"client_id": c, "stream_name": s, "index": u(i)}
            return "index_request", {"tag": 1, "value": value}
        case Index(c, s, i):
            return "index", {"client_id": c, "stream_name": s, "index": u(i)}
        case GetPartitionIndex(c, s, p):
            value = {"client_id": c, "stream_name": s, "partition": u(p)}
            return "partition_index_request", {"tag": 0, "value": value}
        case SavePartitionIndex(c, s, p, i):
            value = {"client_id": c, "stream_name": s, "partition": u(p), "index": u(i)}
            return "partition_index_request", {"tag": 1, "value": value}
        case PartitionIndex(c, s, p, i):
            value = {"client_id": c, "stream_name": s, "partition": u(p), "index": u(i)}
            return "partition_index", value
        case Error(reason):
            return "error", {"reason": reason}
    raise AssertionError(msg)


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


def test_bare_ts_encodes_every_message_to_our_bytes() -> None:
    ours = [codec.encode_payload(m).hex() for m in MESSAGES]
    assert node("encode", [to_js(m) for m in MESSAGES]) == ours


def test_bare_ts_decodes_our_bytes_to_the_same_values() -> None:
    items = [(to_js(m)[0], codec.encode_payload(m).hex()) for m in MESSAGES]
    got = node("decode", items)
    assert [g.get("ok") for g in got] == [to_js(m)[1] for m in MESSAGES]


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
def test_random_messages_agree_both_ways(msgs: list) -> None:
    assert node("encode", [to_js(m) for m in msgs]) == [codec.encode_payload(m).hex() for m in msgs]


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


def test_both_implementations_reject_the_same_malformed_payloads() -> None:
    got = node("decode", [(kind, payload.hex()) for kind, payload in MALFORMED])
    for (kind, payload), theirs in zip(MALFORMED, got, strict=True):
        assert "error" in theirs, (kind, payload.hex(), theirs)
        with pytest.raises(DecodeError):
            if kind in ("push_confirm", "init"):
                codec.decode_response(payload, PushConfirm if kind == "push_confirm" else Init)
            else:
                codec.decode_request(payload)
