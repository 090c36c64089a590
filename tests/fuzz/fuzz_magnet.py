"""Fuzz the special-channel magnet announcements (``archives.signing.decode_magnet_message``):
the status-go ``ApplicationMetadataMessage`` protobuf, its secp256k1 recoverable signature
over keccak-256 of the payload, and the ``CommunityMessageArchiveMagnetlink`` inside.

Typed error: ``BadMagnetMessage`` (with ``UnsignedMessage`` and ``WrongSigner``). Beyond "no
crash": a message accepted for the control node's community id was signed by its key (for a
fuzzed message that means the payload and signature are the seeds' own, untouched).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from coincurve import PrivateKey

from loglake.archives.errors import BadMagnetMessage
from loglake.archives.signing import (
    community_id,
    decode_magnet_message,
    encode_magnet_message,
)
from tests.fuzz import _harness

EXPECTED = (BadMagnetMessage,)
INSTRUMENT = ("loglake.archives.signing",)
KEY = PrivateKey(bytes.fromhex("66" * 32))
COMMUNITY = community_id(KEY)


def one(data: bytes) -> None:
    if not data:
        return
    msg = decode_magnet_message(data[1:], COMMUNITY if data[0] & 1 else None)
    assert msg.magnet_uri.startswith("magnet:?")
    if data[0] & 1:
        assert msg.signer == COMMUNITY


def seeds() -> list[bytes]:
    magnet = "magnet:?xt=urn:btih:" + "ab" * 20 + "&dn=" + COMMUNITY + "&x.pe=127.0.0.1:6881"
    out = []
    for clock in (0, 1_700_000_000, 2**63 - 1):
        m = encode_magnet_message(clock, magnet, KEY)
        out += [b"\x00" + m, b"\x01" + m]
    out.append(b"\x01" + encode_magnet_message(5, magnet, PrivateKey(bytes.fromhex("55" * 32))))
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
