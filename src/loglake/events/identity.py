"""Principals and signed calls.

Principals follow the IC interface specification ("Principals"): a self-authenticating principal
is ``sha224(DER-encoded public key) || 0x02``; the text form is base32(CRC32 || bytes), lower
case, grouped by five with dashes. We use icp-py-core's ``icp_principal`` for both. Its parser
also accepts upper case text, which @dfinity/principal rejects (FIELD-NOTES "ICRC-72/77"); we
reject it too, so a principal has exactly one text form in loglake.

Calls are signed with Ed25519 (``cryptography``). The IC signs a request id over a CBOR
envelope; our transport is plain HTTP, so we sign a smaller envelope with the same ingredients
(domain separator, method, sha256 of the Candid argument, expiry, nonce) — see
:func:`call_digest`. The callee derives the caller's principal from the public key, so the
caller principal that decides authorisation cannot be forged without the key.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from icp_principal import Principal

from loglake.errors import DecodeError, RemoteProtocolError

ANONYMOUS = Principal.anonymous()
DOMAIN_SEPARATOR = b"\x0cloglake-call"
"""Like the IC's ``\\x0Aic-request``: a length-prefixed tag so no other signed message collides."""
MAX_EXPIRY_NS = 5 * 60 * 1_000_000_000
"""The IC accepts ingress expiring up to 5 minutes ahead; we use the same window."""


class PrincipalError(DecodeError):
    """Text that is not a principal's canonical text form."""


class SignatureError(RemoteProtocolError):
    """A call's signature, key or expiry does not verify."""


def principal_from_text(text: str) -> Principal:
    if not isinstance(text, str) or text != text.lower():
        raise PrincipalError(f"not a canonical (lower case) principal: {text!r}")
    try:
        return Principal.from_str(text)
    except (ValueError, TypeError) as e:
        raise PrincipalError(f"not a principal: {text!r} ({e})") from e


@dataclass(frozen=True)
class Identity:
    """An Ed25519 key pair and its self-authenticating principal."""

    key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        if len(seed) != 32:
            raise ValueError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def seed(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    @property
    def public_der(self) -> bytes:
        return self.key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @property
    def principal(self) -> Principal:
        return Principal.self_authenticating(self.public_der)

    def sign_call(self, method: str, arg: bytes, now_ns: int) -> dict[str, str]:
        """HTTP headers that authenticate a call of ``method`` with Candid ``arg``."""
        expiry = now_ns + MAX_EXPIRY_NS // 2
        nonce = os.urandom(16)
        sig = self.key.sign(call_digest(method, arg, expiry, nonce))
        return {
            "x-icp-sender-pubkey": self.public_der.hex(),
            "x-icp-sender-sig": sig.hex(),
            "x-icp-ingress-expiry": str(expiry),
            "x-icp-nonce": nonce.hex(),
        }


def call_digest(method: str, arg: bytes, expiry_ns: int, nonce: bytes) -> bytes:
    m = method.encode()
    return (
        DOMAIN_SEPARATOR
        + struct.pack(">H", len(m))
        + m
        + hashlib.sha256(arg).digest()
        + struct.pack(">Q", expiry_ns)
        + nonce
    )


def verify_call(method: str, arg: bytes, headers: dict[str, str], now_ns: int) -> Principal:
    """Check the signature headers of a call; return the caller's principal."""
    try:
        der = bytes.fromhex(headers["x-icp-sender-pubkey"])
        sig = bytes.fromhex(headers["x-icp-sender-sig"])
        expiry = int(headers["x-icp-ingress-expiry"])
        nonce = bytes.fromhex(headers.get("x-icp-nonce", ""))
    except (KeyError, ValueError) as e:
        raise SignatureError(f"missing or malformed signature headers ({e})") from e
    if not now_ns <= expiry <= now_ns + MAX_EXPIRY_NS:
        raise SignatureError("call expired or expiry too far in the future")
    try:
        pub = serialization.load_der_public_key(der)
    except (ValueError, TypeError) as e:
        raise SignatureError("sender public key is not DER") from e
    if not isinstance(pub, Ed25519PublicKey):
        raise SignatureError("only Ed25519 sender keys are accepted")
    try:
        pub.verify(sig, call_digest(method, arg, expiry, nonce))
    except InvalidSignature as e:
        raise SignatureError("signature does not verify") from e
    return Principal.self_authenticating(der)
