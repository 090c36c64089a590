"""loglake.sds against @waku/sds by differential fuzzing (rules in ``tests/differential/sds.py``):
message bytes both ways, mutated messages accepted or rejected alike, bloom filters identical.
Seeded and bounded (``LOGLAKE_DIFF_EXAMPLES``, ``LOGLAKE_DIFF_SEED``); the long run is
``benchmarks/fuzz.py --diff``."""

from __future__ import annotations

import pytest

from loglake.sds.codec import decode, encode
from loglake.sds.errors import SdsDecodeError
from loglake.sds.messages import SdsMessage
from tests.differential import sds
from tests.differential.conftest import EXAMPLES, MAX_SECONDS, SEED
from tests.differential.fuzzers import FUZZERS
from tests.differential.peer import DiffPeer


def test_sds_messages_agree_with_waku_sds(peer: DiffPeer) -> None:
    out = FUZZERS["sds-messages"].run(peer, examples=EXAMPLES, seed=SEED, max_seconds=MAX_SECONDS)
    assert out.cases > 0
    assert not out.disagreements, out.report()


def test_sds_bloom_filters_agree_with_waku_sds(peer: DiffPeer) -> None:
    out = FUZZERS["sds-blooms"].run(
        peer, examples=max(40, EXAMPLES), seed=SEED, max_seconds=MAX_SECONDS
    )
    assert out.cases > 0
    assert not out.disagreements, out.report()


def test_rule_vectors_hold(peer: DiffPeer) -> None:
    """The module's rules, each on one vector, so a reference upgrade that drops a deviation
    shows here (and the rule can go)."""
    m = SdsMessage("a", "b", "c", 2**31, content=b"x")
    (theirs,) = peer.call("sds_encode", [sds.to_json(m)])
    # protons' broken uint64: a varint whose continuation bits are missing (its four bytes
    # after the first are not even deterministic: seen 00000000 and ca82527c)
    assert theirs.startswith("0a01611201621a016350") and theirs.endswith("a2010178")
    assert len(theirs) == len("0a01611201621a0163500000000000a2010178")
    assert theirs != encode(m).hex()
    assert encode(m).hex() == "0a01611201621a0163508080808008a2010178"
    (ref,) = peer.call("sds_decode", [encode(m).hex()])
    assert ref["message"]["lamport_timestamp"] == str(2**31)  # it reads ours right
    # invalid UTF-8 in sender_id: protons takes it, a strict reading and loglake refuse it
    bad_utf8 = bytes.fromhex("0a01ff12016d5005")
    (ref,) = peer.call("sds_decode", [bad_utf8.hex()])
    assert ref["message"] is not None and not ref["utf8_valid"]
    with pytest.raises(SdsDecodeError):
        decode(bad_utf8)
    # sender_id (field 1) written as a varint: protons reads a string anyway, upb skips it
    wrong_wire = bytes.fromhex("080112016d5005")
    assert not sds.well_typed(wrong_wire)
    assert sds.compare_decode(wrong_wire, peer.call("sds_decode", [wrong_wire.hex()])[0]) is None
