"""The control node's signature on special-channel messages, exactly as status-go makes it.

status-go protocol/v1/status_message.go ``WrapMessageV1``: ``signature =
crypto.Sign(crypto.Keccak256(payload), identity)`` — go-ethereum's 65-byte recoverable secp256k1
signature ``R || S || V`` with ``V`` in {0, 1} — placed in ``ApplicationMetadataMessage
{signature = 1, payload = 2, type = 3}`` (protocol/protobuf/application_metadata_message.proto),
``type = COMMUNITY_ARCHIVE_MAGNETLINK (43)``, payload = ``CommunityMessageArchiveMagnetlink
{clock = 1, magnet_uri = 2}`` (protocol/protobuf/communities.proto). The community id is the
control node's compressed public key, ``0x`` + 66 hex (status-go ``types.HexBytes.String()``);
a member recovers the signer's key from the signature and compares it.

coincurve (libsecp256k1) signs and recovers; its ``sign_recoverable`` output is the same
``R || S || recid`` layout as go-ethereum.
"""

from __future__ import annotations

from coincurve import PrivateKey, PublicKey
from google.protobuf.message import DecodeError as PbDecodeError

from loglake.archives.errors import (
    ArchiveConfigError,
    BadMagnetMessage,
    UnsignedMessage,
    WrongSigner,
)
from loglake.archives.layout import keccak256
from loglake.archives.messages import MagnetLinkMessage
from loglake.wire.pb import archives_statusgo_pb2 as sg_pb

COMMUNITY_ARCHIVE_MAGNETLINK = 43
"""application_metadata_message.proto: ``ApplicationMetadataMessage.Type``."""

SIGNATURE_LENGTH = 65


def community_id(key: PrivateKey | PublicKey | bytes) -> str:
    if isinstance(key, PrivateKey):
        key = key.public_key
    if isinstance(key, bytes):
        key = PublicKey(key)
    return "0x" + key.format(compressed=True).hex()


def load_private_key(hex_or_bytes: str | bytes) -> PrivateKey:
    try:
        raw = (
            bytes.fromhex(hex_or_bytes.removeprefix("0x"))
            if isinstance(hex_or_bytes, str)
            else hex_or_bytes
        )
        # coincurve left-pads a short secret ("abcd" became the scalar 0xabcd, a key anyone
        # could guess); go-ethereum's crypto.HexToECDSA, which status-go loads keys with,
        # refuses any length but 32 bytes ("invalid length, need 256 bits"): so do we
        if len(raw) != 32:
            raise ValueError(f"expected 32 bytes (64 hex digits), got {len(raw)}")
        return PrivateKey(raw)
    except ValueError as e:
        raise ArchiveConfigError(f"not a secp256k1 private key: {e}") from None


def sign_payload(payload: bytes, key: PrivateKey) -> bytes:
    return key.sign_recoverable(keccak256(payload), hasher=None)


def recover_signer(payload: bytes, signature: bytes) -> str:
    if not signature:
        raise UnsignedMessage("special-channel message is not signed")
    if len(signature) != SIGNATURE_LENGTH or signature[64] > 3:
        raise WrongSigner(
            f"signature must be 65 bytes R||S||V with V in 0..3, got {len(signature)} bytes"
        )
    try:
        pub = PublicKey.from_signature_and_message(signature, keccak256(payload), hasher=None)
    except Exception as e:  # coincurve raises plain Exception/ValueError for bad points
        raise WrongSigner(f"signature does not recover a public key: {e}") from e
    return community_id(pub)


def encode_magnet_message(clock: int, magnet_uri: str, key: PrivateKey) -> bytes:
    payload = sg_pb.CommunityMessageArchiveMagnetlink(
        clock=clock, magnet_uri=magnet_uri
    ).SerializeToString(deterministic=True)
    amm = sg_pb.ApplicationMetadataMessage(
        signature=sign_payload(payload, key),
        payload=payload,
        type=sg_pb.ApplicationMetadataMessage.COMMUNITY_ARCHIVE_MAGNETLINK,  # 43
    )
    return amm.SerializeToString(deterministic=True)


def decode_magnet_message(raw: bytes, expected_signer: str | None) -> MagnetLinkMessage:
    """Decode and authenticate; ``expected_signer`` is the community id (None: accept any
    valid signature, e.g. to display it)."""
    amm = sg_pb.ApplicationMetadataMessage()
    try:
        amm.ParseFromString(raw)
    except (PbDecodeError, RuntimeError, ValueError) as e:
        raise BadMagnetMessage(f"not an ApplicationMetadataMessage: {e}") from e
    if amm.type != COMMUNITY_ARCHIVE_MAGNETLINK:
        raise BadMagnetMessage(f"ApplicationMetadataMessage type {amm.type}, expected 43")
    signer = recover_signer(amm.payload, amm.signature)
    if expected_signer is not None and signer != expected_signer.lower():
        raise WrongSigner(f"signed by {signer[:14]}…, not the control node {expected_signer[:14]}…")
    link = sg_pb.CommunityMessageArchiveMagnetlink()
    try:
        link.ParseFromString(amm.payload)
    except (PbDecodeError, RuntimeError, ValueError) as e:
        raise BadMagnetMessage(f"payload is not a CommunityMessageArchiveMagnetlink: {e}") from e
    if not link.magnet_uri.startswith("magnet:?"):
        raise BadMagnetMessage(f"not a magnet URI: {link.magnet_uri[:40]!r}")
    return MagnetLinkMessage(link.clock, link.magnet_uri, signer)
