"""Principals and signed calls (loglake.events.identity)."""

from __future__ import annotations

import hashlib

import pytest

from loglake.events.identity import (
    Identity,
    PrincipalError,
    SignatureError,
    principal_from_text,
    verify_call,
)

NOW = 1_700_000_000_000_000_000


def test_self_authenticating_principal_is_sha224_of_der_key_plus_0x02():
    # IC interface spec, "Principals": sha224(DER public key) · 0x02, 29 bytes.
    me = Identity.from_seed(bytes(32))
    assert me.principal.bytes == hashlib.sha224(me.public_der).digest() + b"\x02"
    assert me.public_der.startswith(bytes.fromhex("302a300506032b6570032100"))


def test_text_form_vectors_from_the_ic_spec():
    # The anonymous principal is 2vxsx-fae; the management canister aaaaa-aa (IC spec).
    assert principal_from_text("2vxsx-fae").bytes == b"\x04"
    assert principal_from_text("aaaaa-aa").bytes == b""


def test_upper_case_and_bad_checksums_are_rejected():
    with pytest.raises(PrincipalError):
        principal_from_text("2VXSX-FAE")  # @dfinity/principal rejects upper case too
    with pytest.raises(PrincipalError):
        principal_from_text("2vxsx-faf")


def test_a_signed_call_verifies_to_the_callers_principal():
    me = Identity.generate()
    h = me.sign_call("icrc77_register_replay", b"DIDL\x00\x00", NOW)
    assert verify_call("icrc77_register_replay", b"DIDL\x00\x00", h, NOW) == me.principal


@pytest.mark.parametrize(
    "tamper",
    [
        lambda m, a, h: ("icrc77_cancel_replay", a, h),  # other method
        lambda m, a, h: (m, a + b"\x00", h),  # other argument
        lambda m, a, h: (m, a, {**h, "x-icp-sender-sig": "00" * 64}),
        lambda m, a, h: (m, a, {**h, "x-icp-sender-pubkey": Identity.generate().public_der.hex()}),
        lambda m, a, h: (m, a, {k: v for k, v in h.items() if k != "x-icp-sender-sig"}),
        lambda m, a, h: (m, a, {**h, "x-icp-ingress-expiry": "1"}),
    ],
)
def test_tampered_calls_are_rejected(tamper):
    me = Identity.generate()
    h = me.sign_call("icrc77_register_replay", b"arg", NOW)
    m, a, h2 = tamper("icrc77_register_replay", b"arg", h)
    with pytest.raises(SignatureError):
        verify_call(m, a, h2, NOW)
