"""Fuzz the BARE payloads of the Ockam stream service (``loglake.streams.codec`` over
``loglake.wire.bare``): server-side ``decode_request``, client-side ``decode_response`` for every
response type, and the push/pull fast paths.

Typed errors: ``DecodeError`` (``BareDecodeError``, ``UnknownProtocol``). The fast paths never
raise: they return None for anything but exactly their message, and when they return a value it
must equal what the generic BARE decoder reads from the same bytes (tested here: the fast paths
are a second decoder of the same format).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.errors import DecodeError
from loglake.streams import codec
from loglake.streams import messages as m
from loglake.streams.api import StreamMessage
from tests.fuzz import _harness

EXPECTED = (DecodeError,)
INSTRUMENT = ("loglake.streams.codec", "loglake.wire.bare", "loglake.wire.varint")
RESPONSES = (
    m.Init,
    m.CreatePartitionedStreamResponse,
    m.PushConfirm,
    m.PullResponse,
    m.Index,
    m.PartitionIndex,
    m.StreamInfoResponse,
)


def _generic(payload: bytes, expect: type) -> object:
    try:
        return codec.decode_response(payload, expect)
    except DecodeError:
        return None


def one(data: bytes) -> None:
    if not data:
        return
    sel, payload = data[0], data[1:]
    fast_req = codec.decode_push_request(payload)
    if fast_req is not None:
        _name, req = codec.decode_request(payload)
        assert req == m.PushRequest(*fast_req), (fast_req, req)
    fast_conf = codec.decode_push_confirm(payload)
    if fast_conf is not None:
        rid, ok, index = fast_conf
        assert _generic(payload, m.PushConfirm) == m.PushConfirm(
            rid, "OK" if ok else "ERROR", index
        )
    fast_pull = codec.decode_pull_response(payload)
    if fast_pull is not None:
        assert _generic(payload, m.PullResponse) == fast_pull, fast_pull
    if sel % 2 == 0:
        codec.decode_request(payload)
    else:
        codec.decode_response(payload, RESPONSES[(sel >> 1) % len(RESPONSES)])


def seeds() -> list[bytes]:
    reqs = [
        m.CreateStreamRequest("s"),
        m.CreateStreamRequest(None),
        m.CreatePartitionedStreamRequest("s", 4),
        m.PushRequest(7, b"hello"),
        m.PullRequest(1, 2, 100),
        m.GetIndex("c", "s"),
        m.SaveIndex("c", "s", 300),
        m.GetPartitionIndex("c", "s", 1),
        m.SavePartitionIndex("c", "s", 1, 2**40),
        m.StreamInfoRequest("s"),
    ]
    resps = [
        m.Init("s"),
        m.CreatePartitionedStreamResponse("s", 2),
        m.PushConfirm(7, "OK", 9),
        m.PullResponse(1, (StreamMessage(2, b"a"), StreamMessage(3, b"bc" * 100))),
        m.Index("c", "s", None),
        m.Index("c", "s", 5),
        m.PartitionIndex("c", "s", 1, 5),
        m.StreamInfoResponse((m.StreamSummary("s", (m.PartitionSummary(0, 1, 2, 3),)),)),
        m.Error("no such stream"),
    ]
    out = [b"\x00" + codec.encode_payload(r) for r in reqs]
    for r in resps:
        k = RESPONSES.index(type(r)) if type(r) in RESPONSES else 0
        out.append(bytes((1 + 2 * k,)) + codec.encode_payload(r))
    out.append(b"\x00" + codec.encode_push_request(2**20, b"x" * 200))
    out.append(b"\x05" + codec.encode_push_confirm(2**20, 2**35, ok=False))
    out.append(b"\x07" + codec.encode_pull_response(3, [(4, b"d"), (2**30, b"")]))
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
