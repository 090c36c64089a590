"""ICRC-77 calls encoded by @dfinity/candid with type tables unlike loglake's own — its entry
order, an extra record field, a variant with fewer tags (a subtype) — are read as the same
call, and a corrupted one is rejected as @dfinity/candid rejects it.

The defect this guards: a replay range ``[10, 20)`` whose ``opt`` end flag was 3 was registered
as ``[10, null)`` (to the head of the log) when the table was not loglake's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loglake.errors import DecodeError
from loglake.events.codec import METHODS
from loglake.events.messages import ReplayRegistration
from tests.conftest import require_peer
from tests.differential.peer import NODE_DIR, DiffPeer, available

pytestmark = pytest.mark.interop

NAT, TEXT = {"k": "nat"}, {"k": "text"}
CONFIG_VALUE = {"k": "variant", "f": [["Nat", NAT], ["Text", TEXT]]}  # a subtype of ICRC16


def registration(extra: bool) -> dict[str, Any]:
    fields = [
        ["namespace", TEXT],
        ["range", {"k": "record", "f": [["_0_", NAT], ["_1_", {"k": "opt", "t": NAT}]]}],
        ["config", {"k": "vec", "t": {"k": "record", "f": [["_0_", TEXT], ["_1_", CONFIG_VALUE]]}}],
        ["memo", {"k": "vec", "t": {"k": "nat8"}}],
    ]
    if extra:  # a field loglake does not know: ignored, as the spec's record subtyping says
        fields.append(["note", TEXT])
    return {"k": "vec", "t": {"k": "record", "f": fields}}


def value(end: list[str], extra: bool) -> list[dict[str, Any]]:
    v: dict[str, Any] = {
        "namespace": "ns",
        "range": {"_0_": "10", "_1_": end},
        "config": [{"_0_": "k", "_1_": {"Nat": "7"}}],
        "memo": [1, 2],
    }
    if extra:
        v["note"] = "hello"
    return [v]


@pytest.fixture(scope="module")
def peer() -> Iterator[DiffPeer]:
    ok = available() and (NODE_DIR / "node_modules" / "@dfinity" / "candid").exists()
    require_peer("node + @dfinity/candid", ok, "make node-deps")
    with DiffPeer() as p:
        yield p


def _encode(peer: DiffPeer, t: dict[str, Any], v: Any) -> bytes:
    (h,) = peer.call("candid_encode", [{"type": t, "value": v}])
    assert isinstance(h, str), h
    return bytes.fromhex(h)


@pytest.mark.parametrize("extra", [False, True], ids=["reference-table", "extra-field"])
def test_a_bounded_replay_range_never_reads_as_open_ended(peer: DiffPeer, extra: bool) -> None:
    t = registration(extra)
    bounded = _encode(peer, t, value(["20"], extra))
    open_ended = _encode(peer, t, value([], extra))
    decode = METHODS["icrc77_register_replay"].decode_arg
    assert bounded != open_ended
    want = ReplayRegistration("ns", 10, 20, [("k", {"Nat": 7})], b"\x01\x02")
    assert decode(bounded) == [want]
    assert decode(open_ended) == [ReplayRegistration("ns", 10, None, want.config, want.memo)]
    flag = next(i for i, (a, b) in enumerate(zip(bounded, open_ended, strict=False)) if a != b)
    assert bounded[flag] == 1
    for bad_flag in (2, 3, 0x80, 0xFF):
        corrupt = bounded[:flag] + bytes([bad_flag]) + bounded[flag + 1 :]
        (ref,) = peer.call("candid_decode", [{"type": t, "hex": corrupt.hex()}])
        assert "throws" in ref, ref  # the reference rejects it ...
        with pytest.raises(DecodeError):  # ... and so does loglake (was: [10, null))
            decode(corrupt)
    for tail in (b"\x00", b"\x01\x02\x03"):
        (ref,) = peer.call("candid_decode", [{"type": t, "hex": (bounded + tail).hex()}])
        assert "throws" in ref, ref
        with pytest.raises(DecodeError):
            decode(bounded + tail)
