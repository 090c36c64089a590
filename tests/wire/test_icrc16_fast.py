"""loglake.wire.candid_fast agrees with icp_candid on every value our encoder writes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_candid import Types, decode, encode

from loglake.errors import DecodeError
from loglake.wire import icrc16
from loglake.wire.candid_fast import FastDecoder
from tests.wire.test_icrc16 import values


@settings(max_examples=150, deadline=None)
@given(values)
def test_fast_and_icp_candid_decode_icrc16_values_alike(v):
    data = icrc16.encode(v)
    fast = FastDecoder(icrc16.ICRC16).decode(data)
    assert fast is not None  # our own header: the fast path is taken
    assert fast == [decode(data, [icrc16.ICRC16])[0]["value"]]


def test_another_encoders_header_falls_back_to_icp_candid():
    # same value, a type table with an extra unused entry: not our header, still decodes
    data = encode([{"type": Types.Vec(Types.Nat), "value": [1, 2]}])
    assert FastDecoder(Types.Vec(Types.Text)).decode(data) is None


@settings(max_examples=100, deadline=None)
@given(values, st.data())
def test_trailing_bytes_and_truncation_are_decode_errors(v, data):
    b = icrc16.encode(v)
    with pytest.raises(DecodeError):
        icrc16.decode(b + b"\x00")
    cut = data.draw(st.integers(len(icrc16.MESSAGE_PREFIX), len(b) - 1))
    with pytest.raises(DecodeError):
        icrc16.decode(b[:cut])
