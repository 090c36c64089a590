"""Fuzz the SDS protobuf decoder (``loglake.sds.codec``): ``decode`` (an ``SdsMessage`` with every
field checked against the limits), ``parse`` (history entries left encoded) and ``parse_entry``.

Typed error: ``SdsDecodeError`` (a ``DecodeError`` with a ``DropReason``). Beyond "no crash": a
decoded message encodes again — with the protobuf runtime and with the hand-assembled fast
encoder, to the same bytes — and decodes back to itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.sds import codec
from loglake.sds.errors import SdsDecodeError
from loglake.sds.messages import HistoryEntry, SdsMessage
from tests.fuzz import _harness

EXPECTED = (SdsDecodeError,)
INSTRUMENT = ("loglake.sds.codec",)
LIMITS = codec.Limits(max_content_bytes=512, max_causal_history=8, max_repair_request=4)


def one(data: bytes) -> None:
    if not data:
        return
    body = data[1:]
    if data[0] & 1:
        for raw in codec.parse(body, LIMITS).causal_history:
            codec.parse_entry(raw, LIMITS)
        return
    msg = codec.decode(body, LIMITS)
    again = codec.encode(msg)
    assert codec.encode_message_fast(msg) == again
    assert codec.decode(again, LIMITS) == msg


def seeds() -> list[bytes]:
    hist = (HistoryEntry("m1"), HistoryEntry("m2", b"hint", "alice"), HistoryEntry("m3", None, "b"))
    msgs = [
        SdsMessage(
            "alice", "id1", "chan", 5, hist, bytes(32), (HistoryEntry("m0", b"\x01"),), b"hi"
        ),
        SdsMessage("bob", "id2", "chan", 2**64 - 1),  # sync
        SdsMessage("carol", "id3", "", None, content=b"ephemeral"),
    ]
    return [bytes((k,)) + codec.encode(m) for m in msgs for k in (0, 1)]


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
