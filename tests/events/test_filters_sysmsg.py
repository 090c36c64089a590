"""Filter grammar, skip rule and system-message decoding (loglake.events.filters, .sysmsg)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_principal import Principal

from loglake.events import sysmsg
from loglake.events.filters import Filter, ImproperConfig, Skip, parse_skip
from loglake.wire.icrc16 import Property

DATA = {
    "Map": [
        ("kind", {"Text": "order"}),
        ("amount", {"Nat": 42}),
        ("price", {"Float": 2.5}),
        ("paid", {"Bool": True}),
        ("user", {"Class": [Property("name", {"Text": "Joan"}, False)]}),
        ("tags", {"Array": [{"Text": "red"}, {"Text": "big"}]}),
        ("maybe", {"Option": {"Int": -3}}),
        ("nothing", {"Option": None}),
        ("com.example.host", {"Text": "h1"}),
        ("grid", {"Array": [{"Array": [{"Nat": 4}, {"Nat": 5}]}]}),
    ]
}


@pytest.mark.parametrize(
    "text,expected",
    [
        ('kind == "order"', True),
        ("kind != 'order'", False),
        ("amount > 41", True),
        ("amount >= 43", False),
        ("price < 3", True),
        ("paid == true", True),
        ('user.name ~= "Jo"', True),
        ('tags.1 == "big"', True),
        ('tags ~= "red"', True),
        ("tags.5", False),
        ("maybe < 0", True),  # #Option is unwrapped
        ("nothing", False),  # #Option(null) is a missing path
        ('"com.example.host" == "h1"', True),  # quoted names may hold dots
        ("amount == 'x'", False),  # a type mismatch does not match
        ("absent", False),
        ("kind", True),  # existence
        ("grid.0.1 == 5", True),  # index after index: not the decimal 0.1
        ("grid.0.1.0", False),
        ("grid.0.0 < 4.5", True),  # a decimal literal still reads as one
    ],
)
def test_filter_semantics(text, expected):
    assert Filter.parse(text).matches(DATA) is expected


@pytest.mark.parametrize(
    "text",
    [
        *("", "   ", "a ==", "== 1", "a == 1 2", "a.b.", "a >> 1", "a == b", "paid < true"),
        "tags.\u0661 == 1",  # an index is ASCII digits: ARABIC-INDIC ONE was read as 1
        "grid.0.1e5",
        "grid.-1",
    ],
)
def test_malformed_filters_are_improper_config(text):
    with pytest.raises(ImproperConfig):
        Filter.parse(text)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.integers(0, 50), st.integers(0, 10_000))
def test_skip_delivers_i_iff_i_plus_offset_mod_mod_is_zero(mod, offset, i):
    s = parse_skip({"Array": [{"Nat": mod}, {"Nat": offset}]})
    assert s == Skip(mod, offset)
    assert s.keeps(i) == ((i + offset) % mod == 0)


@pytest.mark.parametrize(
    "v",
    [
        {"Array": [{"Nat": 0}]},
        {"Array": []},
        {"Array": [{"Nat": 1}, {"Nat": 1}, {"Nat": 1}]},
        {"Array": [{"Int": 2}]},
        {"Nat": 3},
    ],
)
def test_unsupported_skip_is_improper_config(v):
    with pytest.raises(ImproperConfig):
        parse_skip(v)


def test_skip_accepts_option_wrapping_and_a_missing_offset():
    assert parse_skip({"Option": {"Array": [{"Nat": 4}]}}) == Skip(4, 0)
    assert parse_skip({"Option": None}) is None


P = Principal(b"\x01" * 29)


def test_system_payloads_round_trip_in_the_spec_shapes():
    add = sysmsg.BroadcasterReplayAdd(7, "ns", P, P, "a == 1", Skip(3, 1), P)
    [(key, payload)] = sysmsg.entries(sysmsg.broadcaster_replay_add([add]))
    assert key == "icrc77:broadcaster:replay:add"
    assert len(payload["Array"][0]["Array"]) == 7
    assert sysmsg.read_broadcaster_replay_add(payload) == [add]
    padd = sysmsg.PublisherReplayAdd(7, "ns", 5, None, P)
    [(_, pp)] = sysmsg.entries(sysmsg.publisher_replay_add([padd]))
    assert pp["Array"][0]["Array"][3] == {"Option": None}
    assert sysmsg.read_publisher_replay_add(pp) == [padd]
    # an open-ended item carries the end it was priced at as a sixth element; a closed one not
    priced = sysmsg.PublisherReplayAdd(7, "ns", 5, None, P, 40)
    [(_, pp)] = sysmsg.entries(sysmsg.publisher_replay_add([priced]))
    assert pp["Array"][0]["Array"][5] == {"Nat": 40}
    assert sysmsg.read_publisher_replay_add(pp) == [priced]
    closed = sysmsg.PublisherReplayAdd(7, "ns", 5, 9, P, 40)
    [(_, pp)] = sysmsg.entries(sysmsg.publisher_replay_add([closed]))
    assert len(pp["Array"][0]["Array"]) == 5
    [(_, rm)] = sysmsg.entries(sysmsg.publisher_replay_remove([7, 8]))
    assert rm == {"Array": [{"Nat": 7}, {"Nat": 8}]}


@pytest.mark.parametrize(
    "payload",
    [
        {"Nat": 1},
        {"Array": [{"Nat": 1}]},
        {"Array": [{"Array": [{"Nat": 1}, {"Text": "ns"}]}]},
        {
            "Array": [
                {
                    "Array": [
                        {"Text": "1"},
                        {"Text": "ns"},
                        {"Nat": 0},
                        {"Option": None},
                        {"Blob": b""},
                    ]
                }
            ]
        },
        {
            "Array": [
                {
                    "Array": [
                        {"Nat": 1},
                        {"Text": "ns"},
                        {"Nat": 0},
                        {"Option": None},
                        {"Blob": b"x" * 30},
                    ]
                }
            ]
        },
        {
            "Array": [
                {
                    "Array": [
                        {"Nat": 1},
                        {"Text": "ns"},
                        {"Nat": 0},
                        {"Option": {"Nat": 3}},
                        {"Blob": b"x"},
                        {"Nat": 2},
                    ]
                }
            ]
        },
    ],
)
def test_malformed_system_payloads_raise_a_typed_error(payload):
    with pytest.raises(sysmsg.SysMessageError):
        sysmsg.read_publisher_replay_add(payload)
