"""ICRC-16 values (loglake.wire.icrc16): round trips, validation, malformed input.

The variant list is the ICRC-72 candidate's (icdevs/ICEventsWG candidate-ICRC72-20240924.md,
"Event Data"); cross-library checks live in tests/events/test_candid_interop.py.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_principal import Principal

from loglake.errors import DecodeError
from loglake.wire import icrc16
from loglake.wire.icrc16 import ICRC16DecodeError, ICRC16Error, Property

leaf = st.one_of(
    st.builds(lambda n: {"Nat": n}, st.integers(min_value=0, max_value=2**100)),
    st.builds(lambda n: {"Int": n}, st.integers(min_value=-(2**100), max_value=2**100)),
    st.builds(lambda n: {"Int8": n}, st.integers(-128, 127)),
    st.builds(lambda n: {"Nat64": n}, st.integers(0, 2**64 - 1)),
    st.builds(lambda n: {"Nat16": n}, st.integers(0, 2**16 - 1)),
    st.builds(lambda s: {"Text": s}, st.text(max_size=20)),
    st.builds(lambda b: {"Blob": b}, st.binary(max_size=20)),
    st.builds(lambda b: {"Bytes": b}, st.binary(max_size=5)),
    st.builds(lambda b: {"Bool": b}, st.booleans()),
    st.builds(lambda f: {"Float": f}, st.floats(allow_nan=False)),
    st.builds(lambda fs: {"Floats": fs}, st.lists(st.floats(allow_nan=False), max_size=3)),
    st.builds(lambda ns: {"Nats": ns}, st.lists(st.integers(0, 2**70), max_size=3)),
    st.builds(lambda b: {"Principal": Principal(b)}, st.binary(max_size=29)),
)
values = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.builds(lambda xs: {"Array": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda xs: {"Set": xs}, st.lists(inner, max_size=3)),
        st.builds(
            lambda xs: {"Map": xs}, st.lists(st.tuples(st.text(max_size=5), inner), max_size=3)
        ),
        st.builds(lambda xs: {"ValueMap": xs}, st.lists(st.tuples(inner, inner), max_size=2)),
        st.builds(
            lambda xs: {"Class": [Property(n, v, i) for n, v, i in xs]},
            st.lists(st.tuples(st.text(max_size=5), inner, st.booleans()), max_size=3),
        ),
        st.builds(lambda x: {"Option": x}, st.one_of(st.none(), inner)),
    ),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(values)
def test_every_value_round_trips(v):
    assert icrc16.decode(icrc16.encode(v)) == v


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_raise_a_typed_decode_error(data):
    with contextlib.suppress(ICRC16DecodeError):
        icrc16.decode(data)


@settings(max_examples=150, deadline=None)
@given(values, st.data())
def test_truncated_or_flipped_encodings_raise_only_typed_errors(v, data):
    b = icrc16.encode(v)
    cut = data.draw(st.integers(0, len(b) - 1))
    with pytest.raises(DecodeError):
        icrc16.decode(b[:cut])  # every byte of a Candid message is needed
    pos = data.draw(st.integers(0, len(b) - 1))
    flipped = b[:pos] + bytes([b[pos] ^ 0xFF]) + b[pos + 1 :]
    with contextlib.suppress(DecodeError):
        icrc16.decode(flipped)


@pytest.mark.parametrize(
    "bad",
    [
        {"Nat": True},  # icp-py-core would encode it; @dfinity/candid rejects it
        {"Nat": -1},
        {"Int8": 128},
        {"Nat64": 2**64},
        {"Float": 1},
        {"Option": []},  # icp_candid's opt form is not ours
        {"Nat": 1, "Text": "x"},  # two-key variant
        {"Ints": [1]},  # not in ICRC-16 as ICRC-72 lists it
        {"Map": [("k",)]},
        {"Class": [("name", {"Nat": 1})]},
        {"Principal": "aaaaa-aa"},
        "Nat",
    ],
)
def test_invalid_values_are_rejected_before_encoding(bad):
    with pytest.raises(ICRC16Error):
        icrc16.encode(bad)


def test_a_map_is_a_list_of_pairs_and_map_get_finds_the_first():
    m = [("a", {"Nat": 1}), ("a", {"Nat": 2})]
    assert icrc16.decode_map(icrc16.encode_map(m)) == m
    assert icrc16.map_get(m, "a") == {"Nat": 1}
    assert icrc16.map_get(m, "b") is None


def test_nesting_beyond_the_limit_is_refused():
    v = {"Nat": 0}
    for _ in range(icrc16.MAX_DEPTH + 2):
        v = {"Array": [v]}
    with pytest.raises(ICRC16Error):
        icrc16.encode(v)


def test_wrong_candid_type_is_a_decode_error():
    from icp_candid import Types, encode

    with pytest.raises(ICRC16DecodeError):
        icrc16.decode(encode([{"type": Types.Text, "value": "x"}]))
