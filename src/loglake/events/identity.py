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
Several keys can (ten at the defaults' ratio), so at the cap the guard is fair rather than
shut: a sender holding fewer calls than the largest holder gets a slot taken from that holder,
whose earliest-expiring calls are dropped and whose calls expiring at or before them are
refused from then on (its *floor*), so no dropped nonce is ever accepted again while valid
(``ReplayGuard``).
"""

from __future__ import annotations

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
    use. Not thread-safe (one event loop calls it). See the module docstring for the cap.

    At the cap, room is made for a sender holding fewer calls than the largest holder (by
    two or more): that holder's earliest-expiring calls are dropped and its *floor* rises to
    the latest expiry dropped, so every call of that holder expiring at or before its floor is
    refused from then on (``ReplayCacheFull``) — a dropped nonce can never be accepted again
    while its call is valid. A floor takes a slot of the cap until it passes. Why: ten fresh
    keys, each within ``per_sender``, filled the cap and every other caller got 503 for up
    to 5 minutes."""

    def __init__(
        self,
        capacity: int = DEFAULT_REPLAY_CAPACITY,
        per_sender: int = DEFAULT_REPLAY_PER_SENDER,
    ) -> None:
        if capacity < 1 or per_sender < 1:
            raise ValueError("capacity and per_sender must be >= 1")
        self.capacity = capacity
        self.per_sender = per_sender
        self._seen: dict[tuple[bytes, str, bytes], int] = {}
        """Each remembered call's expiry."""
        self._of_sender: dict[bytes, list[tuple[int, str, bytes]]] = {}
        """Each sender's remembered calls, a heap by expiry (exactly the live ones)."""
        self._by_expiry: list[tuple[int, bytes, str, bytes]] = []
        """All calls by expiry, a heap; an item whose call was dropped early is stale."""
        self._holders: dict[int, set[bytes]] = {}
        """Senders by how many calls they hold, so the largest holder is found in O(1)."""
        self._most = 0
        self.floors: dict[bytes, int] = {}
        """Sender → the latest expiry of its calls dropped at the cap: its calls expiring at
        or before it are refused until it passes."""
        self._floor_heap: list[tuple[int, bytes]] = []

    def __len__(self) -> int:
        return len(self._seen)

    def held(self, sender: bytes) -> int:
        """Calls of ``sender`` remembered."""
        calls = self._of_sender.get(sender)
        return 0 if calls is None else len(calls)

    def _move(self, sender: bytes, old: int, new: int) -> None:
        """Re-file ``sender`` from holding ``old`` calls to ``new``."""
        if old:
            group = self._holders[old]
            group.discard(sender)
            if not group:
                del self._holders[old]
                if self._most == old:
                    self._most = max(self._holders, default=0) if new < old else new
        if new:
            self._holders.setdefault(new, set()).add(sender)
            self._most = max(self._most, new)

    def _drop_first(self, sender: bytes) -> int:
        """Forget ``sender``'s earliest-expiring call; its expiry."""
        calls = self._of_sender[sender]
        expiry, method, nonce = heapq.heappop(calls)
        del self._seen[(sender, method, nonce)]
        if not calls:
            del self._of_sender[sender]
        self._move(sender, len(calls) + 1, len(calls))
        return expiry

    def _evict(self, now_ns: int) -> None:
        heap = self._by_expiry
        while heap and heap[0][0] < now_ns:  # expired: the expiry check refuses it from now on
            expiry, sender, method, nonce = heapq.heappop(heap)
            if self._seen.get((sender, method, nonce)) == expiry:  # else dropped at the cap
                self._drop_first(sender)  # its sender's earliest too (the same order)
        floors, fheap = self.floors, self._floor_heap
        while fheap and fheap[0][0] < now_ns:
            expiry, sender = heapq.heappop(fheap)
            if floors.get(sender) == expiry:
                del floors[sender]
        if len(heap) > 2 * len(self._seen) + 64:  # mostly stale: rebuilt, amortised O(1)
            self._by_expiry = [(e, *k) for k, e in self._seen.items()]
            heapq.heapify(self._by_expiry)

    def _make_room(self, sender: bytes) -> bool:
        """At the cap: free a slot from the largest holder if ``sender`` holds at least two
        fewer calls than it; False if not."""
        most = self._most
        mine = self.held(sender)
        if most < mine + 2:
            return False
        victim = next(iter(self._holders[most]))
        floor = self.floors.get(victim)
        top = self._drop_first(victim)
        if floor is None:  # the floor takes a slot: drop one more call to free one
            top = self._drop_first(victim)
        top = max(top, floor or 0)
        self.floors[victim] = top
        heapq.heappush(self._floor_heap, (top, victim))
        return True

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
        floor = self.floors.get(sender)
        if floor is not None and expiry_ns <= floor:
            raise ReplayCacheFull(
                "calls of this sender expiring by its latest call dropped from the full cache "
                "are refused (one of them may be a replay): sign the call again"
            )
        held = self.held(sender)
        if held >= self.per_sender:
            raise ReplayCacheFull(
                f"{held} signed calls of this sender remembered (its share "
                f"of the cache): try again once some expire (at most 5 minutes)"
            )
        if len(self._seen) + len(self.floors) >= self.capacity and not self._make_room(sender):
            raise ReplayCacheFull(
                f"{len(self._seen)} signed calls remembered (the cap), this sender's share "
                "among them: try again once some expire (at most 5 minutes)"
            )
        self._seen[key] = expiry_ns
        heapq.heappush(self._of_sender.setdefault(sender, []), (expiry_ns, method, nonce))
        self._move(sender, held, held + 1)
        heapq.heappush(self._by_expiry, (expiry_ns, sender, method, nonce))


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
