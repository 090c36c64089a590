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

Replay (docs/security.md): a signed call is good for one use before its expiry. The callee
refuses a call that has expired, one whose expiry is more than 5 minutes ahead (the IC's ingress
window, ``MAX_EXPIRY_NS``) and one it has already accepted: ``ReplayGuard`` remembers each accepted
call's (sender, method, nonce) until the call expires — after that the expiry check refuses it
anyway — so its memory is bounded by the calls accepted in 5 minutes, and a hard cap
(``ReplayGuard.capacity``) bounds it whatever the rate. At the cap it refuses new calls
(``ReplayCacheFull``, HTTP 503) until entries expire, rather than forget a nonce whose call is
still valid: forgetting would reopen exactly the replay this guards against. One sender may
hold at most ``per_sender`` of those entries (``ReplayCacheFull`` for it alone past that), so a
single busy or hostile key cannot fill the cap and hold every other caller off for 5 minutes.
"""

from __future__ import annotations

import collections
import hashlib
import heapq
import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from icp_principal import Principal

from loglake.errors import DecodeError, LoglakeError, RemoteProtocolError, shown

ANONYMOUS = Principal.anonymous()
DOMAIN_SEPARATOR = b"\x0cloglake-call"
"""Like the IC's ``\\x0Aic-request``: a length-prefixed tag so no other signed message collides."""
MAX_EXPIRY_NS = 5 * 60 * 1_000_000_000
"""The IC accepts ingress expiring up to 5 minutes ahead; we use the same window."""
NONCE_BYTES = (8, 32)
"""A nonce's length bounds: long enough to be unique per call, short enough to keep."""
DEFAULT_REPLAY_CAPACITY = 200_000
"""Calls remembered at most (~25 MB): 5 minutes at ~660 accepted calls/s."""
DEFAULT_REPLAY_PER_SENDER = 20_000
"""Calls of one sender remembered at most: 5 minutes at ~66 accepted calls/s, a tenth of the cap."""


class PrincipalError(DecodeError):
    """Text that is not a principal's canonical text form."""


class SignatureError(RemoteProtocolError):
    """A call's signature, key or expiry does not verify."""


class ReplayedCall(SignatureError):
    """This signed call was accepted before (same sender, method and nonce): a replay."""


class ReplayCacheFull(LoglakeError):
    """The replay guard holds ``capacity`` unexpired calls: new calls wait until some expire."""


def principal_from_text(text: str) -> Principal:
    if not isinstance(text, str) or text != text.lower():
        raise PrincipalError(f"not a canonical (lower case) principal: {shown(text)}")
    try:
        return Principal.from_str(text)
    except (ValueError, TypeError) as e:
        raise PrincipalError(f"not a principal: {shown(text)} ({e})") from e


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


class ReplayGuard:
    """The calls accepted and not yet expired, by (sender, method, nonce): refuses a second
    use. Not thread-safe (one event loop calls it). See the module docstring for the cap."""

    def __init__(
        self,
        capacity: int = DEFAULT_REPLAY_CAPACITY,
        per_sender: int = DEFAULT_REPLAY_PER_SENDER,
    ) -> None:
        if capacity < 1 or per_sender < 1:
            raise ValueError("capacity and per_sender must be >= 1")
        self.capacity = capacity
        self.per_sender = per_sender
        self._seen: set[tuple[bytes, str, bytes]] = set()
        self._of_sender: collections.Counter[bytes] = collections.Counter()
        self._by_expiry: list[tuple[int, tuple[bytes, str, bytes]]] = []  # a heap

    def __len__(self) -> int:
        return len(self._seen)

    def _evict(self, now_ns: int) -> None:
        heap = self._by_expiry
        while heap and heap[0][0] < now_ns:  # expired: the expiry check refuses it from now on
            key = heapq.heappop(heap)[1]
            self._seen.discard(key)
            left = self._of_sender[key[0]] - 1
            if left:
                self._of_sender[key[0]] = left
            else:
                del self._of_sender[key[0]]

    def accept(self, sender: bytes, method: str, nonce: bytes, expiry_ns: int, now_ns: int) -> None:
        """Record a verified call; ``ReplayedCall`` if it was recorded before and has not
        expired, ``ReplayCacheFull`` at the cap or at the sender's share (nothing recorded
        then)."""
        key = (sender, method, nonce)
        self._evict(now_ns)
        if key in self._seen:
            raise ReplayedCall(
                f"replayed call: {method} with this nonce was already accepted from this "
                "sender; sign a new call (a fresh nonce) to call again"
            )
        if len(self._seen) >= self.capacity:
            raise ReplayCacheFull(
                f"{len(self._seen)} signed calls remembered (the cap): try again once some "
                "expire (at most 5 minutes)"
            )
        if self._of_sender[sender] >= self.per_sender:
            raise ReplayCacheFull(
                f"{self._of_sender[sender]} signed calls of this sender remembered (its share "
                f"of the cache): try again once some expire (at most 5 minutes)"
            )
        self._of_sender[sender] += 1
        self._seen.add(key)
        heapq.heappush(self._by_expiry, (expiry_ns, key))


def verify_call(
    method: str,
    arg: bytes,
    headers: dict[str, str],
    now_ns: int,
    replays: ReplayGuard | None = None,
) -> Principal:
    """Check the signature headers of a call; return the caller's principal. With ``replays``,
    a call is accepted once: a second use raises ``ReplayedCall``. The guard only records
    calls whose signature verified, so forged calls cannot fill it."""
    try:
        der = bytes.fromhex(headers["x-icp-sender-pubkey"])
        sig = bytes.fromhex(headers["x-icp-sender-sig"])
        expiry = int(headers["x-icp-ingress-expiry"])
        nonce = bytes.fromhex(headers["x-icp-nonce"])
    except (KeyError, ValueError) as e:
        raise SignatureError(f"missing or malformed signature headers ({e})") from e
    if not NONCE_BYTES[0] <= len(nonce) <= NONCE_BYTES[1]:
        raise SignatureError(f"the nonce must be {NONCE_BYTES[0]}..{NONCE_BYTES[1]} bytes")
    if expiry < now_ns:
        raise SignatureError(
            f"call expired: ingress expiry {expiry} ns is {(now_ns - expiry) / 1e9:.1f} s ago"
        )
    if expiry > now_ns + MAX_EXPIRY_NS:
        raise SignatureError(
            f"ingress expiry {expiry} ns is {(expiry - now_ns) / 1e9:.1f} s ahead; at most "
            f"{MAX_EXPIRY_NS // 1_000_000_000} s are accepted"
        )
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
    caller = Principal.self_authenticating(der)
    if replays is not None:
        replays.accept(caller.bytes, method, nonce, expiry, now_ns)
    return caller
