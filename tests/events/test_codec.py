"""Method codecs (loglake.events.codec): round trips and malformed input → DecodeError only."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.errors import DecodeError
from loglake.events.codec import METHODS
from loglake.events.messages import Ok, ReplayRegistration
from loglake.wire.icrc16 import ICRC16Error, RawValue
from loglake.wire.icrc16 import encode as icrc16_encode


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(METHODS)), st.binary(max_size=80))
def test_random_bytes_never_raise_anything_but_decode_error(name, data):
    m = METHODS[name]
    for decode in (m.decode_arg, m.decode_ret):
        with contextlib.suppress(DecodeError):
            decode(b"DIDL" + data)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_truncated_register_replay_arguments_are_decode_errors(data):
    m = METHODS["icrc77_register_replay"]
    body = m.encode_arg([ReplayRegistration("a.b", 1, None, [("skip", {"Nat": 2})], b"m")])
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(DecodeError):
        m.decode_arg(body[:cut])


def test_another_methods_argument_is_a_decode_error():
    body = METHODS["icrc77_cancel_replay"].encode_arg([1, 2])
    with pytest.raises(DecodeError):
        METHODS["icrc77_register_replay"].decode_arg(body)


def test_values_are_validated_before_encoding():
    m = METHODS["icrc77_register_replay"]
    with pytest.raises(ICRC16Error):
        m.encode_arg([ReplayRegistration("a.b", True, None)])  # bool is not a nat
    with pytest.raises(ICRC16Error):
        m.encode_arg([ReplayRegistration("a.b", 0, None, [("k", {"Nat": -1})])])


def test_raw_values_splice_into_events_like_decoded_ones():
    from icp_principal import Principal

    from loglake.events.messages import Event

    m = METHODS["icrc72_publish"]
    data = {"Map": [("x", {"Text": "y"})]}
    raw = RawValue.from_message(icrc16_encode(data))
    a = Event(1, 0, 5, "n", raw, Principal(b"\x01"), None)
    b = Event(1, 0, 5, "n", data, Principal(b"\x01"), None)
    assert m.encode_arg([a]) == m.encode_arg([b])
    got = m.decode_arg(m.encode_arg([a]))[0]
    # a received event's data stays its checked bytes (the broadcaster splices it on)
    assert got == a and got.data.decode() == data


def test_results_round_trip():
    m = METHODS["icrc77_replay_status"]
    from loglake.events.messages import Err

    rs = [Ok(None), Err("GenericError", {"error_code": 401, "message": "no"})]
    assert m.decode_ret(m.encode_ret(rs)) == rs


@pytest.mark.parametrize(
    "table",
    [
        b"\x01\x6d\x7f",  # vec null
        b"\x01\x6d\x70",  # vec reserved
        b"\x02\x6d\x01\x6c\x00",  # vec record {}
        b"\x02\x6d\x01\x6c\x01\x00\x7f",  # vec record { null }
    ],
)
def test_a_vector_of_zero_sized_elements_is_refused_before_decoding(table):
    # 2**63 elements of nothing: icp_candid would loop (and allocate) until memory runs out.
    bomb = b"DIDL" + table + b"\x01\x00" + b"\xff" * 8 + b"\x7f"
    with pytest.raises(DecodeError, match="zero-sized"):
        METHODS["icrc77_get_replays"].decode_ret(bomb)


@pytest.mark.parametrize("name", ["icrc77_cancel_replay", "icrc72_confirm_notifications"])
@pytest.mark.parametrize("bad", [5, None, "12", [1, -1], [True]])
def test_a_vec_nat_argument_that_is_not_a_list_of_nats_is_the_callers_error(name, bad):
    with pytest.raises(ICRC16Error):
        METHODS[name].encode_arg(bad)
