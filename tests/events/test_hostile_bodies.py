"""A role server under hostile request bodies keeps serving everyone else.

A Candid ``nat`` is a LEB128 with no length in the spec; 500 kB of ``ff`` once took 8–21 s to
reject, on the event loop, so every other client waited that long; and bodies up to 256 MiB
were read. Here a real subscriber role serves over loopback TCP while one client sends
hostile bodies (signed, so they reach the decoder) and another makes ordinary calls.
"""

from __future__ import annotations

import threading
import time
import tracemalloc

import pytest

from loglake.events import Registration
from loglake.events.client import CallRejected, HttpEventsClient, InboxReader, post_raw
from loglake.events.codec import METHODS
from loglake.events.identity import Identity
from loglake.events.server import HttpRoleServer
from loglake.events.subscriber import Subscriber
from loglake.wire.varint import encode_uleb
from tests.events.served import serve, serve_orchestrator
from tests.wire.test_candid_cost import nested_opt_failures

_LEB = b"\xff" * 500_000 + b"\x01"
HOSTILE_NAT = b"DIDL\x01\x6c\x02\x00\x7d\x01\x7d\x01\x00" + _LEB + b"\x00"
"""``loglake_inbox``'s argument (``record { nat; nat }``) with its first ``nat`` as 500 kB of
LEB128 continuation octets."""
HOSTILE_FOREIGN = b"DIDL\x02\x6e\x7d\x6c\x02\x00\x7d\x01\x7d\x01\x01" + _LEB + b"\x00"
"""The same through another encoder's type table (an unused ``opt nat`` entry first): not
loglake's own header, so a plan of its own reads the value."""


def _serve(max_body_bytes: int | None = None):
    me = Identity.generate()
    core = Subscriber(me.principal, Identity.generate().principal)
    kw = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
    port, stop = serve(HttpRoleServer(core, me, {}, **kw))
    return me, f"http://127.0.0.1:{port}", stop


def _hostile(url: str, body: bytes) -> CallRejected:
    attacker = Identity.generate()  # any key signs: the signature is checked before decoding
    headers = attacker.sign_call("loglake_inbox", body, time.time_ns())
    with pytest.raises(CallRejected) as e:
        post_raw(url, "loglake_inbox", body, headers, 30)
    return e.value


def test_hostile_leb128_bodies_are_rejected_while_others_are_served():
    me, url, stop = _serve()
    try:
        client = HttpEventsClient(url, me, timeout=30)
        assert InboxReader(client).read(10) == []
        rejected: list[CallRejected] = []
        took: list[float] = []

        def attack() -> None:
            for body in [HOSTILE_NAT, HOSTILE_FOREIGN] * 3:
                t = time.perf_counter()
                rejected.append(_hostile(url, body))
                took.append(time.perf_counter() - t)

        attacker = threading.Thread(target=attack)
        attacker.start()
        latencies = []
        while attacker.is_alive() or not latencies:
            t = time.perf_counter()
            assert InboxReader(client).read(10) == []
            latencies.append(time.perf_counter() - t)
        attacker.join(60)
        assert len(rejected) == 6
        for r in rejected:
            assert r.status == 400 and "malformed Candid" in r.reason, r.reason
            assert "too long" in r.reason
        assert max(took) < 2.0, took  # was 8-21 s each
        assert max(latencies) < 1.0, latencies  # the other client was not held up
    finally:
        stop()


def test_a_body_over_the_limit_gets_413_before_decoding():
    me, url, stop = _serve(max_body_bytes=64 * 1024)
    try:
        err = _hostile(url, HOSTILE_NAT)
        assert err.status == 413, err
        assert InboxReader(HttpEventsClient(url, me, timeout=30)).read(10) == []
    finally:
        stop()


def test_the_body_limit_is_checked():
    me = Identity.generate()
    with pytest.raises(ValueError, match="max_body_bytes"):
        HttpRoleServer(Subscriber(me.principal, me.principal), me, {}, max_body_bytes=10)


def _skipped(n: int) -> bytes:
    """``loglake_inbox``'s argument (``record { 0; 0 }``) and an extra argument ``vec record {
    0 : opt nat }`` of ``n`` items of one octet each (the opt flag 0): well-formed, the extra one
    dropped."""
    table = b"\x04" + b"\x6e\x7d" + b"\x6c\x01\x00\x00" + b"\x6d\x01"  # opt nat, record, vec
    table += b"\x6c\x02\x00\x7d\x01\x7d"  # record { nat; nat }
    return b"DIDL" + table + b"\x02\x03\x02" + b"\x00\x00" + encode_uleb(n) + b"\x00" * n


def test_a_skipped_value_is_not_built_first():
    # A value only skipped (an extra argument, a record field the expected type lacks) was
    # built whole and then dropped: ~250 bytes of heap per body byte (0.4 MB of body peaked
    # at 99 MB; 8 MB took 2 GB and 12 s), decoded before any authorization.
    body = _skipped(400_000)
    tracemalloc.start()
    try:
        assert METHODS["loglake_inbox"].decode_arg(body) == (0, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(body), f"peak {peak / 1e6:.0f} MB for a {len(body) / 1e6:.1f} MB body"


def test_a_large_skipped_argument_does_not_hold_other_clients_up():
    me, url, stop = _serve()
    try:
        client = HttpEventsClient(url, me, timeout=60)
        assert InboxReader(client).read(10) == []
        body = _skipped(1_000_000)
        attacker = Identity.generate()

        def attack() -> None:
            with pytest.raises(CallRejected):  # 403: not the subscriber's inbox
                post_raw(
                    url,
                    "loglake_inbox",
                    body,
                    attacker.sign_call("loglake_inbox", body, time.time_ns()),
                    60,
                )

        th = threading.Thread(target=attack)
        th.start()
        time.sleep(0.1)  # the hostile body is being decoded
        t = time.perf_counter()
        assert InboxReader(client).read(10) == []
        latency = time.perf_counter() - t
        th.join(60)
        assert latency < 1.0, f"an ordinary call waited {latency:.1f} s"
    finally:
        stop()


def _timed_call(url: str, who: Identity, body: bytes, out: dict) -> None:
    """Post ``body`` as ``icrc72_register_subscription`` signed by ``who``; its rejection (or
    None) and seconds into ``out``."""
    t = time.perf_counter()
    try:
        headers = who.sign_call("icrc72_register_subscription", body, time.time_ns())
        post_raw(url, "icrc72_register_subscription", body, headers, 90)
        out["rejected"] = None
    except CallRejected as e:
        out["rejected"] = e
    out["took"] = time.perf_counter() - t


def _small_call_latency(url: str) -> float:
    honest = HttpEventsClient(url, Identity.generate(), timeout=60)
    t = time.perf_counter()
    honest.call("icrc72_register_subscription", [Registration("orders")])
    return time.perf_counter() - t


def test_a_nested_opt_decode_bomb_is_read_in_linear_time_and_holds_no_one_up():
    # Found from outside: one signed call from a fresh key whose config nests 31 ICRC-16
    # #Option levels that each fail to coerce (tests/wire/test_candid_cost.py) took 17.75 s to
    # decode at 400 KB (1 MB: 60 s live), on the one decode worker every small call queued
    # behind while it was busy. Calls still reach the role in arrival order (the worker's
    # docstring says why), so what it holds others up is what its own decode costs: now about
    # an honest body's of its size (each level reads as #Option(null), as the spec says).
    _, url, stop = serve_orchestrator()
    try:
        bomb = nested_opt_failures(31, 200_000)
        got: dict = {}
        th = threading.Thread(target=_timed_call, args=(url, Identity.generate(), bomb, got))
        th.start()
        time.sleep(0.1)  # the bomb is being read and decoded
        latency = _small_call_latency(url)
        th.join(120)
        r = got["rejected"]
        assert r is None or "malformed Candid" not in r.reason, r.reason
        assert got["took"] < 3.0, got
        assert latency < 3.0, f"an ordinary call waited {latency:.1f} s"
    finally:
        stop()
