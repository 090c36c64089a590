"""The magnet message and its signature (status-go protocol/v1/status_message.go
``WrapMessageV1``: crypto.Sign(Keccak256(payload)) in ApplicationMetadataMessage, type 43),
cross-checked with eth-keys, an independent secp256k1 implementation (go-ethereum's format:
65 bytes R || S || V, V in {0, 1})."""

from __future__ import annotations

import pytest
from coincurve import PrivateKey
from eth_keys import keys
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.archives.errors import BadMagnetMessage, UnsignedMessage, WrongSigner
from loglake.archives.layout import keccak256
from loglake.archives.signing import (
    community_id,
    decode_magnet_message,
    encode_magnet_message,
    sign_payload,
)
from loglake.wire.pb import archives_statusgo_pb2 as sg_pb

KEY = PrivateKey(bytes.fromhex("11" * 32))
OTHER = PrivateKey(bytes.fromhex("22" * 32))
MAGNET = "magnet:?xt=urn:btih:" + "ab" * 20 + "&dn=0x02"


def test_community_id_is_compressed_public_key_hex():
    eth = keys.PrivateKey(bytes.fromhex("11" * 32))
    assert community_id(KEY) == "0x" + eth.public_key.to_compressed_bytes().hex()
    assert len(community_id(KEY)) == 2 + 66


def test_our_signature_verifies_with_eth_keys():
    payload = b"archive magnet payload"
    sig = sign_payload(payload, KEY)
    assert len(sig) == 65 and sig[64] in (0, 1)
    eth_sig = keys.Signature(signature_bytes=sig)
    pub = eth_sig.recover_public_key_from_msg_hash(keccak256(payload))
    assert pub == keys.PrivateKey(bytes.fromhex("11" * 32)).public_key
    assert eth_sig.verify_msg_hash(keccak256(payload), pub)


def test_eth_keys_signature_verifies_with_ours():
    link = sg_pb.CommunityMessageArchiveMagnetlink(clock=7, magnet_uri=MAGNET)
    payload = link.SerializeToString()
    sig = keys.PrivateKey(bytes.fromhex("11" * 32)).sign_msg_hash(keccak256(payload)).to_bytes()
    amm = sg_pb.ApplicationMetadataMessage(signature=sig, payload=payload, type=43)
    msg = decode_magnet_message(amm.SerializeToString(), community_id(KEY))
    assert (msg.clock, msg.magnet_uri, msg.signer) == (7, MAGNET, community_id(KEY))


def test_magnet_message_layout():
    raw = encode_magnet_message(5, MAGNET, KEY)
    amm = sg_pb.ApplicationMetadataMessage()
    amm.ParseFromString(raw)
    assert amm.type == 43  # COMMUNITY_ARCHIVE_MAGNETLINK
    link = sg_pb.CommunityMessageArchiveMagnetlink()
    link.ParseFromString(amm.payload)
    assert (link.clock, link.magnet_uri) == (5, MAGNET)
    # field order on the wire: signature (1), payload (2), type (3)
    assert raw[0] == 0x0A and raw[1] == 65 and raw[67] == 0x12
    assert raw.endswith(b"\x18\x2b")


def test_unsigned_magnet_message_is_rejected():
    payload = sg_pb.CommunityMessageArchiveMagnetlink(clock=1, magnet_uri=MAGNET)
    amm = sg_pb.ApplicationMetadataMessage(payload=payload.SerializeToString(), type=43)
    with pytest.raises(UnsignedMessage):
        decode_magnet_message(amm.SerializeToString(), community_id(KEY))


def test_magnet_message_signed_by_someone_else_is_rejected():
    with pytest.raises(WrongSigner):
        decode_magnet_message(encode_magnet_message(1, MAGNET, OTHER), community_id(KEY))


def test_tampered_payload_does_not_recover_the_control_node():
    amm = sg_pb.ApplicationMetadataMessage()
    amm.ParseFromString(encode_magnet_message(1, MAGNET, KEY))
    amm.payload = amm.payload.replace(b"ab", b"cd", 1)
    with pytest.raises(WrongSigner):
        decode_magnet_message(amm.SerializeToString(), community_id(KEY))


def test_wrong_type_is_rejected():
    amm = sg_pb.ApplicationMetadataMessage()
    amm.ParseFromString(encode_magnet_message(1, MAGNET, KEY))
    amm.type = 1
    with pytest.raises(BadMagnetMessage, match="type"):
        decode_magnet_message(amm.SerializeToString(), community_id(KEY))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_a_typed_error(raw):
    with pytest.raises(BadMagnetMessage):
        decode_magnet_message(raw, community_id(KEY))


def test_signature_bytes_equal_eth_keys_rfc6979():
    # libsecp256k1 (coincurve, and go-ethereum's crypto.Sign) and eth-keys all use RFC 6979
    # deterministic nonces, so the same key and keccak-256 hash give the same 65 bytes.
    payload = sg_pb.CommunityMessageArchiveMagnetlink(
        clock=3, magnet_uri=MAGNET
    ).SerializeToString()
    ours = sign_payload(payload, KEY)
    theirs = keys.PrivateKey(bytes.fromhex("11" * 32)).sign_msg_hash(keccak256(payload)).to_bytes()
    assert ours == theirs


@pytest.mark.parametrize("text", ["abcd", "01" * 31, "01" * 33, ""])
def test_a_private_key_of_another_length_than_32_bytes_is_refused(text: str) -> None:
    """coincurve pads a short secret ("abcd" was the key 0x00…abcd, anyone could guess it);
    go-ethereum's HexToECDSA (status-go) and eth_keys refuse it, and so does loglake."""
    from eth_keys.exceptions import ValidationError

    from loglake.archives.errors import ArchiveConfigError
    from loglake.archives.signing import load_private_key

    with pytest.raises(ValidationError):
        keys.PrivateKey(bytes.fromhex(text))
    with pytest.raises(ArchiveConfigError, match="32 bytes"):
        load_private_key(text)
    good = "07" * 32
    assert load_private_key(good).to_hex() == keys.PrivateKey(bytes.fromhex(good)).to_hex()[2:]
