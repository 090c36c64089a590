"""loglake.wire.candid (the one Candid decoder) agrees with icp_candid, an independent decoder,
on every value our encoder writes, under our own header and under another table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_candid import Types, decode, encode

from loglake.errors import DecodeError
from loglake.wire import candid, icrc16
from tests.wire.test_icrc16 import values


@settings(max_examples=150, deadline=None)
@given(values)
def test_the_plan_and_icp_candid_decode_icrc16_values_alike(v):
    data = icrc16.encode(v)
    assert data.startswith(candid.header(icrc16.ICRC16))  # our own header: the exact plan
    assert candid.decode(data, [icrc16.ICRC16]) == [decode(data, [icrc16.ICRC16])[0]["value"]]


def test_another_encoders_table_decodes_through_a_plan_of_its_own():
    # a record with an extra field and a reordered table: not our header, same values
    wire = Types.Record({"a": Types.Vec(Types.Nat), "zz_extra": Types.Text})
    data = encode([{"type": wire, "value": {"a": [1, 2], "zz_extra": "x"}}])
    expected = Types.Record({"a": Types.Vec(Types.Nat), "b": Types.Opt(Types.Text)})
    assert candid.decode(data, [expected]) == [{"a": [1, 2], "b": []}]


@settings(max_examples=100, deadline=None)
@given(values, st.data())
def test_trailing_bytes_and_truncation_are_decode_errors(v, data):
    b = icrc16.encode(v)
    with pytest.raises(DecodeError):
        icrc16.decode(b + b"\x00")
    cut = data.draw(st.integers(len(icrc16.MESSAGE_PREFIX), len(b) - 1))
    with pytest.raises(DecodeError):
        icrc16.decode(b[:cut])
