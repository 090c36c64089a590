"""BARE codec: vectors computed by hand from the BARE specification (draft-devault-bare §3),
the reference's own vectors (build-trust/ockam test/ockam/protocol/bare_test.exs), hypothesis
round trips, and malformed input → DecodeError."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.errors import DecodeError
from loglake.wire import bare
from loglake.wire.bare import (
    DATA,
    INT,
    STRING,
    UINT,
    Array,
    BareEncodeError,
    Enum,
    Optional,
    Struct,
    Union,
)


@dataclass(frozen=True)
class A:
    x: int


@dataclass(frozen=True)
class B:
    s: str
    d: bytes


@dataclass(frozen=True)
class Rec:
    n: int
    name: str | None
    items: tuple[int, ...]


A_S = Struct(A, ("x", UINT))
B_S = Struct(B, ("s", STRING), ("d", DATA))
AB = Union("AB", [A_S, B_S])
REC = Struct(Rec, ("n", INT), ("name", Optional(STRING)), ("items", Array(UINT)))


# -- vectors by hand from BARE §3.1 (uint: 7 bits per octet, LSB group first, MSB = more) -----
@pytest.mark.parametrize(
    ("value", "hexbytes"),
    [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),  # 128 = 0b1_0000000 -> 0x80 (low 7 bits 0, more) then 0x01
        (300, "ac02"),  # 300 = 0b10_0101100 -> 0x2c|0x80, 0x02
        (16384, "808001"),
        ((1 << 64) - 1, "ffffffffffffffffff01"),  # 10 octets, the last holds bit 63
    ],
)
def test_uint_vectors(value: int, hexbytes: str) -> None:
    assert bare.encode(UINT, value).hex() == hexbytes
    assert bare.decode(UINT, bytes.fromhex(hexbytes)) == value


@pytest.mark.parametrize(
    ("value", "hexbytes"),
    [(0, "00"), (-1, "01"), (1, "02"), (-2, "03"), (0xAA, "d402"), (0xBB, "f602"), (0xCC, "9803")],
)
def test_int_zigzag_vectors(value: int, hexbytes: str) -> None:
    # 0xAA -> <<212, 2>>, 0xBB -> <<246, 2>>, 0xCC -> <<152, 3>> come from bare_test.exs
    assert bare.encode(INT, value).hex() == hexbytes
    assert bare.decode(INT, bytes.fromhex(hexbytes)) == value


def test_string_data_optional_array_vectors() -> None:
    assert bare.encode(STRING, "ockam").hex() == "05" + b"ockam".hex()
    assert bare.encode(STRING, "é").hex() == "02c3a9"  # length counts UTF-8 octets
    assert bare.encode(DATA, b"\x00\xff").hex() == "0200ff"
    assert bare.encode(Optional(UINT), None).hex() == "00"
    assert bare.encode(Optional(UINT), 5).hex() == "0105"
    assert bare.encode(Array(UINT), (1, 128)).hex() == "02" + "01" + "8001"


def test_reference_tuple_with_optional_vectors() -> None:
    # bare_test.exs: [0xAA, 0xBB, 0xCC] as {:tuple, [:int, :int, {:optional, :int}]}
    @dataclass(frozen=True)
    class T:
        a: int
        b: int
        c: int | None

    t = Struct(T, ("a", INT), ("b", INT), ("c", Optional(INT)))
    assert bare.encode(t, T(0xAA, 0xBB, 0xCC)) == bytes([212, 2, 246, 2, 1, 152, 3])
    assert bare.encode(t, T(0xAA, 0xBB, None)) == bytes([212, 2, 246, 2, 0])
    assert bare.decode(t, bytes([212, 2, 246, 2, 0])) == T(0xAA, 0xBB, None)


def test_union_tags_follow_declaration_order() -> None:
    assert bare.encode(AB, A(7)).hex() == "0007"
    assert bare.encode(AB, B("x", b"y")).hex() == "01017801" + "79"
    assert bare.decode(AB, bytes.fromhex("0007")) == A(7)


def test_enum_values() -> None:
    status = Enum("Status", ["OK", "ERROR"])
    assert bare.encode(status, "ERROR") == b"\x01"
    assert bare.decode(status, b"\x00") == "OK"
    with pytest.raises(BareEncodeError):
        bare.encode(status, "MAYBE")


# -- malformed input -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schema", "hexbytes", "why"),
    [
        (UINT, "", "truncated"),
        (UINT, "80", "truncated"),
        (UINT, "ffff", "truncated"),
        (UINT, "8080808080808080808001", "longer than 10"),  # 11 octets
        (UINT, "ffffffffffffffffff02", "exceeds 64 bits"),  # 10 octets, value >= 2**64
        (UINT, "8000", "non-minimal"),
        (UINT, "ff8000", "non-minimal"),
        (STRING, "05616263", "past the end"),
        (DATA, "02ff", "past the end"),
        (STRING, "02fffe", "UTF-8"),
        (STRING, "03c3", "past the end"),
        (Optional(UINT), "02", "0 or 1"),
        (Optional(UINT), "", "truncated"),
        (Array(UINT), "05", "past the end"),
        (AB, "02", "no tag"),
        (AB, "0007" + "00", "trailing"),
        (Enum("Status", ["OK", "ERROR"]), "02", "not a member"),
        (UINT, "0100", "trailing"),
    ],
)
def test_malformed_input_raises_decode_error(schema, hexbytes: str, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        bare.decode(schema, bytes.fromhex(hexbytes))


def test_invalid_utf8_in_string_is_reported() -> None:
    with pytest.raises(DecodeError, match="invalid UTF-8"):
        bare.decode(STRING, b"\x01\xc3")


# -- hypothesis round trips ------------------------------------------------------------------
@given(st.integers(0, (1 << 64) - 1))
def test_uint_round_trip(n: int) -> None:
    enc = bare.encode(UINT, n)
    assert len(enc) <= 10
    assert bare.decode(UINT, enc) == n


@given(st.integers(-(1 << 63), (1 << 63) - 1))
def test_int_round_trip(n: int) -> None:
    assert bare.decode(INT, bare.encode(INT, n)) == n


@given(
    st.builds(
        Rec,
        st.integers(-(1 << 63), (1 << 63) - 1),
        st.none() | st.text(),
        st.lists(st.integers(0, (1 << 64) - 1), max_size=20).map(tuple),
    )
)
def test_struct_round_trip(rec: Rec) -> None:
    assert bare.decode(REC, bare.encode(REC, rec)) == rec


@given(st.one_of(st.builds(A, st.integers(0, 1 << 40)), st.builds(B, st.text(), st.binary())))
def test_union_round_trip(v) -> None:
    assert bare.decode(AB, bare.encode(AB, v)) == v


@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_decode_error(buf: bytes) -> None:
    for schema in (REC, AB, UINT, STRING):
        try:
            value = bare.decode(schema, buf)
        except DecodeError:
            continue
        assert bare.encode(schema, value) == buf  # strict: whatever decodes re-encodes exactly


def test_encode_rejects_wrong_types() -> None:
    with pytest.raises(BareEncodeError):
        bare.encode(UINT, -1)
    with pytest.raises(BareEncodeError):
        bare.encode(UINT, True)
    with pytest.raises(BareEncodeError):
        bare.encode(STRING, b"bytes")
    with pytest.raises(BareEncodeError):
        bare.encode(AB, Rec(1, None, ()))
