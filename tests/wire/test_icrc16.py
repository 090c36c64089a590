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


def _nested_options(levels: int) -> bytes:
    """A message of ``levels`` nested ``#Option`` around ``#Nat 1``, written by hand."""
    option, nat = icrc16.TAGS.index("Option"), icrc16.TAGS.index("Nat")
    return icrc16.MESSAGE_PREFIX + bytes([option, 1]) * levels + bytes([nat, 1])


@pytest.mark.parametrize("levels", [icrc16.MAX_DEPTH - 1, icrc16.MAX_DEPTH, icrc16.MAX_DEPTH + 1])
def test_the_depth_bound_is_the_same_reading_and_writing(levels):
    """What decodes encodes again and the other way round: the codec counts ICRC-16 levels
    the same way both ways (and as validate does), from the value's root."""
    v: dict = {"Nat": 1}
    for _ in range(levels):
        v = {"Option": v}
    data = _nested_options(levels)
    if levels <= icrc16.MAX_DEPTH:
        icrc16.validate(v)
        assert icrc16.encode(v) == data
        assert icrc16.decode(data) == v
        assert icrc16.decode_map(icrc16.encode_map([("k", v)])) == [("k", v)]
    else:
        for bad in (icrc16.validate, icrc16.encode, lambda v: icrc16.encode_map([("k", v)])):
            with pytest.raises(ICRC16Error):
                bad(v)
        with pytest.raises(ICRC16DecodeError, match="nested deeper"):
            icrc16.decode(data)


def test_values_read_straight_into_loglakes_form():
    """Option as the value or None, map items as tuples, Class as Property: no icp_candid
    value form in between (and the same values icp_candid's decoder gives, converted)."""
    from icp_candid import decode as icp_decode

    v = {
        "Map": [
            ("o", {"Option": None}),
            ("p", {"Option": {"Nat": 3}}),
            ("c", {"Class": [Property("n", {"Text": "x"}, True)]}),
            ("vm", {"ValueMap": [({"Nat": 1}, {"Bool": False})]}),
        ]
    }
    data = icrc16.encode(v)
    got = icrc16.decode(data)
    assert got == v and type(got["Map"][0]) is tuple
    assert got == icrc16.from_candid(icp_decode(data, [icrc16.ICRC16])[0]["value"])


# -- decode_bounded: a value is refused before more than its budget of elements is built -------


def test_decode_bounded_reads_what_decode_reads_within_its_budget() -> None:
    v = icrc16.validate(
        {
            "Map": [
                ("a", {"Array": [icrc16.nat(i) for i in range(50)]}),
                ("b", {"Class": [Property("p", icrc16.text("x"), True)]}),
                ("c", {"ValueMap": [(icrc16.nat(1), {"Set": [icrc16.text("s")]})]}),
                ("d", {"Blob": b"\x00" * 10_000}),  # bytes: one value, however long
            ]
        }
    )
    data = icrc16.encode(v)
    # 4 map items + 50 + 1 + 1 + 1 elements
    assert icrc16.decode_bounded(data, 57) == icrc16.decode(data) == v
    with pytest.raises(icrc16.ICRC16TooLarge, match="more than 56 elements"):
        icrc16.decode_bounded(data, 56)
    m = [("k", {"Array": [icrc16.nat(1)] * 3})]
    assert icrc16.decode_bounded(icrc16.encode_map(m), 4, as_map=True) == m
    with pytest.raises(icrc16.ICRC16TooLarge):
        icrc16.decode_bounded(icrc16.encode_map(m), 3, as_map=True)
    assert icrc16.decode(data) == v  # the ordinary decode has no budget, after a refusal too


def test_decode_bounded_refuses_a_nested_value_before_building_it() -> None:
    """200,000 tiny values nested in arrays of 1,000 (400 KB): the plain decode builds them all
    (tens of MB); the bounded one stops at its budget."""
    import tracemalloc

    data = icrc16.encode({"Array": [{"Array": [icrc16.nat(0)] * 1000}] * 200})
    tracemalloc.start()
    try:
        with pytest.raises(icrc16.ICRC16TooLarge):
            icrc16.decode_bounded(data, 5_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak
