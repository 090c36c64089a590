"""Differential fuzzing of loglake's stream service payloads (``streams.codec`` over
``wire.bare``) against @bare-ts/lib 0.6.0, an independent, maintained BARE implementation,
for every message of specs/ockam-stream-service.txt ("Payload BARE specs").

Per batch drawn by hypothesis:

- the same value gives the same bytes from loglake's schema encoder, its hot-path encoders
  (``encode_push_request``, ``encode_push_confirm(s)``, ``encode_pull_response``) and
  @bare-ts; @bare-ts decodes loglake's bytes to the same value;
- mutants of the valid payloads: loglake's decode under the message's schema and @bare-ts's
  accept or reject alike, with equal values and protocol names; loglake's public entry points
  (``decode_request``, ``decode_response``) and its hot-path decoders (``decode_push_request``,
  ``decode_push_confirm``, ``decode_pull_response``: a second reading of the same bytes) agree
  with that answer; anything but loglake's ``DecodeError`` is a disagreement too.

No rules: BARE leaves nothing to choose here (minimal uints, UTF-8 strings, 0/1 optionals,
declared enum values and union tags, no trailing bytes), and both sides follow it.
"""

from __future__ import annotations

import random
from typing import Any

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
from loglake.wire import bare
from tests.differential.mutate import RNGS, mutations, sweep
from tests.differential.peer import DiffPeer

MUTANTS_PER_MESSAGE = 15
SWEPT_PER_BATCH = 3
"""Messages per batch whose every octet is also swept (``mutate.sweep``): ~400 cases each."""

# kind (the peer's name) -> (protocol, loglake schema, response class or None for a request)
KINDS: dict[str, tuple[str, bare.BareType, type | None]] = {
    "create_request": (codec.STREAM_CREATE, codec.CREATE_REQUEST, None),
    "init": (codec.STREAM_CREATE, codec.INIT, Init),
    "create_partitions_request": (
        codec.STREAM_CREATE_PARTITIONS,
        codec.CREATE_PARTITIONS_REQUEST,
        None,
    ),
    "create_partitions_response": (
        codec.STREAM_CREATE_PARTITIONS,
        codec.CREATE_PARTITIONS_RESPONSE,
        CreatePartitionedStreamResponse,
    ),
    "push_request": (codec.STREAM_PUSH, codec.PUSH_REQUEST, None),
    "push_confirm": (codec.STREAM_PUSH, codec.PUSH_CONFIRM, PushConfirm),
    "pull_request": (codec.STREAM_PULL, codec.PULL_REQUEST, None),
    "pull_response": (codec.STREAM_PULL, codec.PULL_RESPONSE, PullResponse),
    "index_request": (codec.STREAM_INDEX, codec.INDEX_REQUEST, None),
    "index": (codec.STREAM_INDEX, codec.INDEX, Index),
    "partition_index_request": (codec.STREAM_INDEX, codec.PARTITION_INDEX_REQUEST, None),
    "partition_index": (codec.STREAM_INDEX, codec.PARTITION_INDEX, PartitionIndex),
    "error": (codec.ERROR, codec.ERROR_SCHEMA, None),
}


def _u(v: int | None) -> str | None:
    return None if v is None else str(v)


def to_js(msg: object) -> tuple[str, dict]:
    """(kind, the peer's JSON value): uints as decimal strings, data as hex."""
    match msg:
        case CreateStreamRequest(name):
            return "create_request", {"stream_name": name}
        case Init(name):
            return "init", {"stream_name": name}
        case CreatePartitionedStreamRequest(name, n):
            return "create_partitions_request", {"stream_name": name, "partitions": _u(n)}
        case CreatePartitionedStreamResponse(name, p):
            return "create_partitions_response", {"stream_name": name, "partition": _u(p)}
        case PushRequest(rid, data):
            return "push_request", {"request_id": _u(rid), "data": data.hex()}
        case PushConfirm(rid, status, index):
            return "push_confirm", {"request_id": _u(rid), "status": status, "index": _u(index)}
        case PullRequest(rid, index, limit):
            return "pull_request", {"request_id": _u(rid), "index": _u(index), "limit": _u(limit)}
        case PullResponse(rid, msgs):
            ms = [{"index": _u(m.index), "data": m.data.hex()} for m in msgs]
            return "pull_response", {"request_id": _u(rid), "messages": ms}
        case GetIndex(c, s):
            return "index_request", {"tag": 0, "value": {"client_id": c, "stream_name": s}}
        case SaveIndex(c, s, i):
            value = {"client_id": c, "stream_name": s, "index": _u(i)}
            return "index_request", {"tag": 1, "value": value}
        case Index(c, s, i):
            return "index", {"client_id": c, "stream_name": s, "index": _u(i)}
        case GetPartitionIndex(c, s, p):
            value = {"client_id": c, "stream_name": s, "partition": _u(p)}
            return "partition_index_request", {"tag": 0, "value": value}
        case SavePartitionIndex(c, s, p, i):
            value = {"client_id": c, "stream_name": s, "partition": _u(p), "index": _u(i)}
            return "partition_index_request", {"tag": 1, "value": value}
        case PartitionIndex(c, s, p, i):
            value = {"client_id": c, "stream_name": s, "partition": _u(p), "index": _u(i)}
            return "partition_index", value
        case Error(reason):
            return "error", {"reason": reason}
    raise AssertionError(f"no kind for {msg!r}")


# -- strategies ------------------------------------------------------------------------------

uints = (
    st.integers(0, 300)
    | st.integers(0, bare.UINT_MAX)
    | st.sampled_from([0x7F, 0x80, 0x3FFF, 0x4000, 2**32 - 1, 2**53, 2**63, bare.UINT_MAX])
)
texts = st.text(max_size=16)
datas = st.binary(max_size=40)
messages = st.one_of(
    st.builds(CreateStreamRequest, st.none() | texts),
    st.builds(Init, texts),
    st.builds(CreatePartitionedStreamRequest, st.none() | texts, uints),
    st.builds(CreatePartitionedStreamResponse, texts, uints),
    st.builds(PushRequest, uints, datas),
    st.builds(PushConfirm, uints, st.sampled_from(["OK", "ERROR"]), uints),
    st.builds(PullRequest, uints, uints, uints),
    st.builds(
        PullResponse,
        uints,
        st.lists(st.builds(StreamMessage, uints, datas), max_size=4).map(tuple),
    ),
    st.builds(GetIndex, texts, texts),
    st.builds(SaveIndex, texts, texts, uints),
    st.builds(Index, texts, texts, st.none() | uints),
    st.builds(GetPartitionIndex, texts, texts, uints),
    st.builds(SavePartitionIndex, texts, texts, uints, uints),
    st.builds(PartitionIndex, texts, texts, uints, st.none() | uints),
    st.builds(Error, texts),
)
batches = st.tuples(st.lists(messages, min_size=1, max_size=30), RNGS)


def _fast_encodings(msg: object) -> list[tuple[str, bytes]]:
    match msg:
        case PushRequest(rid, data):
            return [("encode_push_request", codec.encode_push_request(rid, data))]
        case PushConfirm(rid, status, index):
            ok = status == "OK"
            out = [("encode_push_confirm", codec.encode_push_confirm(rid, index, ok))]
            if ok:
                out.append(("encode_push_confirms", codec.encode_push_confirms([rid], [index])[0]))
            return out
        case PullResponse(rid, msgs):
            pairs = [(m.index, m.data) for m in msgs]
            return [("encode_pull_response", codec.encode_pull_response(rid, pairs))]
    return []


def _ours(kind: str, payload: bytes) -> tuple[str | None, Any, str | None]:
    """(protocol, JSON value or None, error) of loglake's decode under ``kind``'s schema."""
    protocol: str | None = None
    try:
        base = codec.decode_base(payload)
        protocol = base.protocol
        return protocol, to_js(bare.decode(KINDS[kind][1], base.data))[1], None
    except DecodeError as e:
        return protocol, None, str(e)


def _entry_points(kind: str, payload: bytes, theirs: dict) -> list[str]:
    """loglake's public decoders and hot paths against the reference's answer."""
    bad = []
    protocol, _, response = KINDS[kind]
    agreed = "ok" in theirs and theirs["protocol"] == protocol
    try:
        if response is None:
            if kind != "error":
                got = codec.decode_request(payload)[1]
                if agreed and to_js(got) != (kind, theirs["ok"]):
                    bad.append(f"decode_request gives {got!r}, @bare-ts {kind} {theirs['ok']}")
                if not agreed and to_js(got)[0] == kind:
                    bad.append(f"decode_request accepts what @bare-ts refuses as {kind}")
        else:
            got = codec.decode_response(payload, response)
            if agreed and to_js(got) != (kind, theirs["ok"]):
                bad.append(f"decode_response gives {got!r}, @bare-ts {kind} {theirs['ok']}")
            if not agreed and not isinstance(got, Error):
                bad.append(f"decode_response accepts what @bare-ts refuses as {kind}")
    except DecodeError:
        if agreed:
            bad.append(f"loglake's public decoder refuses a {kind} @bare-ts accepts")
    fast: object | None = None
    if kind == "push_request" and (r := codec.decode_push_request(payload)) is not None:
        fast = PushRequest(*r)
    elif kind == "push_confirm" and (c := codec.decode_push_confirm(payload)) is not None:
        fast = PushConfirm(c[0], "OK" if c[1] else "ERROR", c[2])
    elif kind == "pull_response":
        fast = codec.decode_pull_response(payload)
    if fast is not None and (not agreed or to_js(fast) != (kind, theirs["ok"])):
        bad.append(f"hot-path decoder of {kind} gives {fast!r}, @bare-ts {theirs}")
    return [f"{b}: {payload.hex()}" for b in bad]


def compare_decode(kind: str, payload: bytes, theirs: dict) -> list[str]:
    try:
        protocol, value, err = _ours(kind, payload)
        bad = []
        if (err is None) != ("ok" in theirs):
            what = "accepts" if err is None else f"refuses ({err})"
            bad.append(f"loglake {what}, @bare-ts {theirs} as {kind}: {payload.hex()}")
        elif err is None and (protocol, value) != (theirs["protocol"], theirs["ok"]):
            bad.append(f"values differ as {kind}: {protocol} {value} / {theirs}: {payload.hex()}")
        return bad + _entry_points(kind, payload, theirs)
    except Exception as e:  # anything but the typed error is a finding
        return [f"loglake raised {type(e).__name__}: {e} on {kind} {payload.hex()}"]


def check(peer: DiffPeer, drawn: tuple[list[object], random.Random]) -> tuple[int, list[str]]:
    msgs, rng = drawn
    bad: list[str] = []
    js = [to_js(m) for m in msgs]
    ours = [codec.encode_payload(m) for m in msgs]
    theirs = peer.call("bare_encode", js)
    for m, a, b in zip(msgs, ours, theirs, strict=True):
        if a.hex() != b:
            bad.append(f"bytes differ for {m!r}: loglake {a.hex()} @bare-ts {b}")
        for name, fast in _fast_encodings(m):
            if fast != a:
                bad.append(f"{name} differs for {m!r}: {fast.hex()} vs {a.hex()}")
    cases: list[tuple[str, bytes]] = [(k, p) for (k, _), p in zip(js, ours, strict=True)]
    for (kind, _), payload in zip(js, ours, strict=True):
        cases += [(kind, x) for x in mutations([payload], MUTANTS_PER_MESSAGE, rng)]
    for i in rng.sample(range(len(js)), min(SWEPT_PER_BATCH, len(js))):
        cases += [(js[i][0], x) for x in sweep(ours[i])]
    answers = peer.call("bare_decode", [[k, p.hex()] for k, p in cases])
    for (kind, payload), ans in zip(cases, answers, strict=True):
        if "throws" in ans:
            bad.append(f"@bare-ts threw {ans['throws']} on {kind} {payload.hex()}")
            continue
        bad += compare_decode(kind, payload, ans)
    return len(msgs) + len(cases), bad
