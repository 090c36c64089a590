"""Signed ICRC calls are good once, before their expiry (issue 15 §1).

The guard alone (expiry window, nonce memory, its cap), then a real role server: a request the
real client sent is captured on the wire by a recording proxy and replayed byte for byte — the
server refuses it with a clear 401; expired and far-future calls are refused the same way.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from loglake.events.broadcaster import Broadcaster
from loglake.events.client import CallRejected, HttpEventsClient, InboxReader, post_raw
from loglake.events.codec import METHODS
from loglake.events.identity import (
    MAX_EXPIRY_NS,
    Identity,
    ReplayCacheFull,
    ReplayedCall,
    ReplayGuard,
    SignatureError,
    verify_call,
)
from loglake.events.server import HttpRoleServer
from loglake.events.subscriber import Subscriber
from tests.events.served import serve

NOW = 1_700_000_000_000_000_000
S = 1_000_000_000


# -- the rules, without a server --------------------------------------------------------------
def test_a_call_is_accepted_once_within_its_expiry():
    me, guard = Identity.generate(), ReplayGuard()
    h = me.sign_call("icrc77_register_replay", b"arg", NOW)
    assert verify_call("icrc77_register_replay", b"arg", h, NOW, guard) == me.principal
    with pytest.raises(ReplayedCall, match="already accepted"):
        verify_call("icrc77_register_replay", b"arg", h, NOW + 1 * S, guard)
    # a fresh signature of the same call (new nonce) is a new call
    h2 = me.sign_call("icrc77_register_replay", b"arg", NOW + 2 * S)
    assert verify_call("icrc77_register_replay", b"arg", h2, NOW + 2 * S, guard) == me.principal


def test_an_expired_call_is_refused():
    me = Identity.generate()
    h = me.sign_call("m", b"a", NOW)  # expires 2.5 minutes after NOW
    with pytest.raises(SignatureError, match="call expired"):
        verify_call("m", b"a", h, NOW + MAX_EXPIRY_NS, ReplayGuard())


def test_a_call_expiring_more_than_5_minutes_ahead_is_refused():
    me = Identity.generate()
    far = me.sign_call("m", b"a", NOW + MAX_EXPIRY_NS)  # signed with a clock 5 min fast
    with pytest.raises(SignatureError, match=r"ahead; at most 300 s"):
        verify_call("m", b"a", far, NOW, ReplayGuard())


def test_a_call_without_a_proper_nonce_is_refused():
    me = Identity.generate()
    h = me.sign_call("m", b"a", NOW)
    with pytest.raises(SignatureError, match="missing or malformed"):
        verify_call("m", b"a", {k: v for k, v in h.items() if k != "x-icp-nonce"}, NOW)
    with pytest.raises(SignatureError, match="nonce must be"):
        verify_call("m", b"a", {**h, "x-icp-nonce": ""}, NOW)


def test_the_guard_forgets_a_call_once_it_expired():
    guard = ReplayGuard()
    guard.accept(b"me", "m", b"n" * 16, NOW + 10 * S, NOW)
    assert len(guard) == 1
    guard.accept(b"me", "m", b"o" * 16, NOW + 20 * S, NOW + 11 * S)  # the first one expired
    assert len(guard) == 1


def test_at_the_cap_new_calls_wait_rather_than_a_nonce_being_forgotten():
    guard = ReplayGuard(capacity=3)
    for i in range(3):
        guard.accept(b"me", "m", bytes([i]) * 16, NOW + (10 + i) * S, NOW)
    with pytest.raises(ReplayCacheFull, match="the cap"):
        guard.accept(b"me", "m", b"x" * 16, NOW + 10 * S, NOW)
    with pytest.raises(ReplayedCall):  # still remembered: not evicted to make room
        guard.accept(b"me", "m", bytes([0]) * 16, NOW + 10 * S, NOW + 5 * S)
    guard.accept(b"me", "m", b"x" * 16, NOW + 30 * S, NOW + 10 * S + 1)  # one expired: room


def test_one_sender_cannot_fill_the_cache_for_everyone():
    guard = ReplayGuard(capacity=10, per_sender=3)
    for i in range(3):
        guard.accept(b"flood", "m", bytes([i]) * 16, NOW + (10 + i) * S, NOW)
    with pytest.raises(ReplayCacheFull, match="this sender"):
        guard.accept(b"flood", "m", b"x" * 16, NOW + 10 * S, NOW)
    guard.accept(b"other", "m", b"x" * 16, NOW + 10 * S, NOW)  # others still get in
    assert len(guard) == 4
    guard.accept(b"flood", "m", b"y" * 16, NOW + 30 * S, NOW + 10 * S + 1)  # one of its expired
    with pytest.raises(ReplayedCall):  # its unexpired calls are still remembered
        guard.accept(b"flood", "m", bytes([2]) * 16, NOW + 30 * S, NOW + 10 * S + 1)


def test_several_keys_at_the_cap_hold_off_only_themselves():
    """Ten keys, each within its share, filled the cap: every other caller got 503 for up to
    5 minutes. At the cap a sender holding fewer calls than the largest holder now gets in,
    the largest holder's earliest calls dropped and its floor raised, so none of its dropped
    nonces is ever accepted again while valid."""
    guard = ReplayGuard(capacity=100, per_sender=10)
    flood = [bytes([k]) * 29 for k in range(10)]
    sent = []
    for i in range(10):
        for who in flood:
            nonce = bytes([i]) * 16
            guard.accept(who, "m", nonce, NOW + (100 + i) * S, NOW)
            sent.append((who, nonce, NOW + (100 + i) * S))
    assert len(guard) == 100
    for k in range(20):  # honest callers: each gets in (they got "the cap" before)
        guard.accept(b"honest%d" % k, "m", b"h" * 16, NOW + 150 * S, NOW + S)
    for who in flood:  # the flooders, at the largest share, do not
        with pytest.raises(ReplayCacheFull):
            guard.accept(who, "m", b"z" * 16, NOW + 300 * S, NOW + S)
    assert len(guard) + len(guard.floors) <= guard.capacity
    dropped = 0
    for who, nonce, expiry in sent:  # none of the flood's calls is accepted twice
        with pytest.raises((ReplayedCall, ReplayCacheFull)) as e:
            guard.accept(who, "m", nonce, expiry, NOW + 2 * S)
        dropped += e.type is ReplayCacheFull
    assert dropped > 0  # (some were dropped from the cache, and their floor refused them)
    # a floor passes with the calls it stands for: the key may call again after
    guard.accept(flood[0], "m", b"y" * 16, NOW + 400 * S, NOW + 200 * S)


def test_a_full_guard_still_lets_an_honest_caller_through_a_real_server():
    """Over HTTP, the review's attack scaled down: ten fresh keys sign calls up to their share
    until the guard is full; an honest caller's call goes through (it was refused 503)."""
    me = Identity.generate()
    guard = ReplayGuard(capacity=60, per_sender=6)
    core = Broadcaster(me.principal, Identity.generate().principal)
    port, stop = serve(HttpRoleServer(core, me, {}, replays=guard))
    url = f"http://127.0.0.1:{port}"
    try:
        m = "icrc72_confirm_notifications"
        body = METHODS[m].encode_arg([])
        for _k in range(10):
            key = Identity.generate()
            for _ in range(6):
                h = key.sign_call(m, body, time.time_ns())
                post_raw(url, m, body, h, 10)
        assert len(guard) == 60
        with pytest.raises(CallRejected) as e:  # a flooder is at the cap's largest share
            post_raw(url, m, body, key.sign_call(m, body, time.time_ns()), 10)
        assert e.value.status == 503
        honest = HttpEventsClient(url, Identity.generate(), timeout=10)
        assert honest.call(m, []) is None  # answered (not 503)
        assert len(guard) + len(guard.floors) <= 60
    finally:
        stop()


def test_the_same_nonce_from_another_sender_or_method_is_another_call():
    guard = ReplayGuard()
    guard.accept(b"alice", "m", b"n" * 16, NOW + S, NOW)
    guard.accept(b"bob", "m", b"n" * 16, NOW + S, NOW)
    guard.accept(b"alice", "other", b"n" * 16, NOW + S, NOW)
    assert len(guard) == 3


# -- a real role server -----------------------------------------------------------------------
class RecordingProxy:
    """Forwards one TCP connection at a time to ``target`` and keeps what the client sent."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.sent: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with client, socket.create_connection(("127.0.0.1", self.target)) as up:
                got = bytearray()
                client.settimeout(5)
                while b"\r\n\r\n" not in got or len(got) < _length(got):
                    chunk = client.recv(65536)
                    if not chunk:
                        break
                    got += chunk
                self.sent.append(bytes(got))
                up.sendall(got)
                while chunk := up.recv(65536):
                    client.sendall(chunk)

    def close(self) -> None:
        self.sock.close()


def _length(request: bytes) -> int:
    head, _, _ = request.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(head) + 4


def send_raw(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as is; return the status and the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = bytearray()
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@pytest.fixture
def subscriber_server():
    """A subscriber role served over HTTP on loopback (its inbox method needs no storage)."""
    me = Identity.generate()
    core = Subscriber(me.principal, Identity.generate().principal)
    port, stop = serve(HttpRoleServer(core, me, {}))
    try:
        yield me, port
    finally:
        stop()


def test_a_captured_request_replayed_byte_for_byte_is_refused(subscriber_server):
    me, port = subscriber_server
    proxy = RecordingProxy(port)
    try:
        client = HttpEventsClient(f"http://127.0.0.1:{proxy.port}", me, timeout=10)
        assert InboxReader(client).read(10) == []  # the real client, through the proxy
    finally:
        proxy.close()
    (captured,) = proxy.sent
    assert b"x-icp-nonce" in captured.lower()
    status, body = send_raw(port, captured)  # the same bytes again, straight to the server
    assert status == 401
    assert b"replayed call: loglake_inbox" in body and b"sign a new call" in body
    # the real client signs each call anew: calling again is not a replay
    assert InboxReader(HttpEventsClient(f"http://127.0.0.1:{port}", me)).read(10) == []


def test_expired_and_far_future_calls_are_refused_by_the_server(subscriber_server):
    me, port = subscriber_server
    url = f"http://127.0.0.1:{port}"
    body = METHODS["loglake_inbox"].encode_arg((0, 10))
    old = me.sign_call("loglake_inbox", body, time.time_ns() - MAX_EXPIRY_NS)
    with pytest.raises(CallRejected) as e:
        post_raw(url, "loglake_inbox", body, old, 10)
    assert e.value.status == 401 and "call expired" in e.value.reason
    ahead = me.sign_call("loglake_inbox", body, time.time_ns() + MAX_EXPIRY_NS)
    with pytest.raises(CallRejected) as e:
        post_raw(url, "loglake_inbox", body, ahead, 10)
    assert e.value.status == 401 and "at most 300 s" in e.value.reason
