"""loglake.wire.varint: known vectors, and the seven hand-written varints it replaced as oracles.

The ``_old_*`` functions are the implementations as they stood before issue 18 (BARE
``decode_uint``/``encode_uint``, the Candid type-table check's ``_uleb``/``_sleb``, the fast
Candid reader's ``_uleb``/``_sleb``, Avro ``write_long``/``Reader.long``, and the protobuf
``varint`` of archives and sds), copied here so the shared module is checked against what each
codec did: same values and positions on every input, an error exactly where they raised one.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal import avro
from loglake.cardinal.errors import CardinalDecodeError
from loglake.errors import DecodeError
from loglake.wire import bare
from loglake.wire.varint import (
    CANDID_MAX_OCTETS,
    MAX_OCTETS_64,
    NON_MINIMAL,
    OVERFLOW,
    TOO_LONG,
    TRUNCATED,
    UINT64_MAX,
    VarintError,
    decode_candid_sleb,
    decode_candid_uleb,
    decode_sleb,
    decode_uleb,
    decode_uleb_batch,
    decode_uleb_batch_uniform,
    encode_sleb,
    encode_uleb,
    encode_zigzag,
    uleb_size,
    unzigzag,
    zigzag,
)


# -- the old implementations -------------------------------------------------------------------
class _OldError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _old_protobuf_varint(n: int) -> bytes:  # archives/layout.py, sds/codec.py, streams _uint
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _old_bare_decode_uint(buf: bytes, pos: int) -> tuple[int, int]:
    start, end = pos, len(buf)
    if pos >= end:
        raise _OldError("truncated uint")
    value = shift = 0
    while True:
        if pos >= end:
            raise _OldError("truncated uint")
        if pos - start >= 10:
            raise _OldError("uint longer than 10 octets")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            if b == 0 and pos - start > 1:
                raise _OldError("non-minimal uint encoding")
            if value > UINT64_MAX:
                raise _OldError("uint exceeds 64 bits")
            return value, pos


def _old_candid_fast_sleb(b: bytes, i: int) -> tuple[int, int]:  # the former wire/candid_fast.py
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            if c & 0x40:
                n -= 1 << shift
            return n, i


def _old_avro_long(data: bytes, pos: int) -> tuple[int, int]:  # cardinal/avro.py Reader.long
    shift = z = 0
    while True:
        if pos >= len(data):
            raise _OldError("varint runs past the end")
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift >= 70:
            raise _OldError("varint longer than 10 bytes")
    n = (z >> 1) ^ -(z & 1)
    if not -(2**63) <= n <= 2**63 - 1:
        raise _OldError("overflows a long")
    return n, pos


def _old_avro_write_long(n: int) -> bytes:
    z = (n << 1) if n >= 0 else ((-n) << 1) - 1
    return _old_protobuf_varint(z)


def _outcome(f, *args):
    try:
        return ("ok", f(*args))
    except (_OldError, VarintError, DecodeError, IndexError):
        return ("error", None)


# inputs: short runs of bytes biased towards continuation octets, long runs, and zeros
varint_bytes = st.one_of(
    st.binary(max_size=14),
    st.lists(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0x81, 0xFF]), max_size=14).map(bytes),
    st.integers(0, 2**80).map(lambda n: encode_uleb(n)),
)


# -- known vectors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "hex_"),
    [  # LEB128 as Wikipedia, the protobuf docs ("150 → 96 01") and BARE §3.1 write them
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),
        (150, "9601"),
        (300, "ac02"),
        (16383, "ff7f"),
        (16384, "808001"),
        (624485, "e58e26"),
        (UINT64_MAX, "ffffffffffffffffff01"),
    ],
)
def test_unsigned_leb128_vectors(n: int, hex_: str) -> None:
    assert encode_uleb(n).hex() == hex_
    assert decode_uleb(bytes.fromhex(hex_) + b"\xaa", 0) == (n, len(hex_) // 2)
    assert uleb_size(n) == len(hex_) // 2


@pytest.mark.parametrize(
    ("n", "hex_"),
    [
        (0, "00"),
        (2, "02"),
        (-1, "7f"),
        (63, "3f"),
        (64, "c000"),
        (-64, "40"),
        (-65, "bf7f"),
        (-123456, "c0bb78"),
        (127, "ff00"),
    ],
)
def test_signed_leb128_vectors(n: int, hex_: str) -> None:
    """Candid spec "Notation": sleb128 (two's complement; -123456 is the Wikipedia example)."""
    assert encode_sleb(n).hex() == hex_
    assert decode_sleb(bytes.fromhex(hex_), 0) == (n, len(hex_) // 2)


@pytest.mark.parametrize(
    ("n", "hex_"), [(0, "00"), (-1, "01"), (1, "02"), (-2, "03"), (64, "8001"), (-65, "8101")]
)
def test_zigzag_vectors(n: int, hex_: str) -> None:
    """Avro spec "Binary Encoding": 0→00, -1→01, 1→02, -2→03, 64→80 01."""
    assert encode_zigzag(n).hex() == hex_
    assert unzigzag(zigzag(n)) == n


def test_decoder_errors_name_their_kind_and_offset() -> None:
    with pytest.raises(VarintError) as e:
        decode_uleb(b"\x00\x80", 1)
    assert (e.value.kind, e.value.offset) == (TRUNCATED, 1)
    with pytest.raises(VarintError) as e:
        decode_uleb(b"\x80" * 11, 0, MAX_OCTETS_64)
    assert e.value.kind == TOO_LONG
    with pytest.raises(VarintError) as e:
        decode_uleb(b"\xff\x00", 0, minimal=True)
    assert e.value.kind == NON_MINIMAL
    with pytest.raises(VarintError) as e:
        decode_uleb(bytes.fromhex("ffffffffffffffffff02"), 0, 10, max_value=UINT64_MAX)
    assert e.value.kind == OVERFLOW
    with pytest.raises(ValueError):
        encode_uleb(-1)


# -- the shared module against the old behaviours ------------------------------------------------
@settings(max_examples=500)
@given(st.integers(0, 2**80))
def test_encode_uleb_matches_the_protobuf_varints(n: int) -> None:
    assert encode_uleb(n) == _old_protobuf_varint(n)
    assert uleb_size(n) == len(encode_uleb(n))


@settings(max_examples=500)
@given(st.integers(-(2**63), 2**63 - 1))
def test_avro_long_writer_matches_the_old_one(n: int) -> None:
    assert avro.long_bytes(n) == _old_avro_write_long(n)
    out = bytearray(b"\x01")
    avro.write_long(out, n)
    assert bytes(out) == b"\x01" + _old_avro_write_long(n)


@settings(max_examples=1000)
@given(varint_bytes, st.integers(0, 3))
def test_bare_uint_decoder_matches_the_old_one(data: bytes, pos: int) -> None:
    """Same value and end on valid input; an error where the old one raised. One reason differs
    by design: ten continuation octets then the end are now "longer than 10 octets" (what they
    are), where the old loop said "truncated"."""
    old, new = _outcome(_old_bare_decode_uint, data, pos), _outcome(bare.decode_uint, data, pos)
    assert old == new
    if old[0] == "ok" and pos == 0:
        assert bare.encode_uint(old[1][0]) == data[: old[1][1]]


@settings(max_examples=1000)
@given(varint_bytes)
def test_candid_fast_leb128_matches_the_old_one(data: bytes) -> None:
    """Unbounded LEB128 for ``nat``/``int`` values (old: IndexError when truncated, now a
    VarintError; both are "malformed Candid" to ``icrc16.candid_decode``)."""
    assert _outcome(_old_candid_fast_sleb, data, 0) == _outcome(decode_sleb, data, 0)


@settings(max_examples=1000)
@given(varint_bytes)
def test_avro_long_reader_matches_the_old_one(data: bytes) -> None:
    def new(d: bytes, pos: int) -> tuple[int, int]:
        r = avro.Reader(d, "test", pos)
        try:
            return r.long(), r.pos
        except CardinalDecodeError as e:
            raise _OldError(str(e)) from e

    assert _outcome(_old_avro_long, data, 0) == _outcome(new, data, 0)


@settings(max_examples=500)
@given(st.integers(-(2**100), 2**100))
def test_signed_leb128_round_trips(n: int) -> None:
    enc = encode_sleb(n)
    assert decode_sleb(enc + b"\x00", 0) == (n, len(enc))
    assert _old_candid_fast_sleb(enc, 0) == (n, len(enc))


@pytest.mark.parametrize("data", ["8001", "ff7f", "808001"])
def test_max_value_applies_to_every_length(data: str) -> None:
    with pytest.raises(VarintError) as e:
        decode_uleb(bytes.fromhex(data), 0, max_value=100)
    assert e.value.kind == OVERFLOW


# -- long varints: linear time, bounded for Candid ----------------------------------------------
@settings(max_examples=300)
@given(st.integers(0, 1 << 4000), st.integers(-(1 << 4000), 1 << 4000))
def test_long_varints_decode_to_the_value_their_groups_spell(n: int, m: int) -> None:
    """Above a dozen octets the decoder switches to a linear method: the value must still be
    the sum of each 7-bit group shifted by 7 x its position (the LEB128 definition)."""
    raw = encode_uleb(n)
    assert sum((c & 0x7F) << (7 * k) for k, c in enumerate(raw)) == n
    assert decode_uleb(raw + b"\x05", 0) == (n, len(raw))
    assert decode_uleb(memoryview(b"\x00" + raw), 1) == (n, len(raw) + 1)
    assert decode_sleb(encode_sleb(m), 0) == (m, len(encode_sleb(m)))


def test_a_500_kb_leb128_is_handled_in_linear_time() -> None:
    """500 kB of ``ff`` in a Candid nat took 21 s to reject (quadratic big-integer shifts);
    bounded, it is rejected at once, and even unbounded it is read in well under a second."""
    hostile = b"\xff" * 500_000 + b"\x01"
    t = time.perf_counter()
    with pytest.raises(VarintError) as e:
        decode_candid_uleb(hostile, 0)
    assert e.value.kind == TOO_LONG
    with pytest.raises(VarintError):
        decode_candid_sleb(hostile, 0)
    with pytest.raises(VarintError) as e:
        decode_uleb(hostile[:-1], 0)
    assert e.value.kind == TRUNCATED
    value, end = decode_uleb(hostile, 0)
    assert end == len(hostile) and value == (1 << 3_500_001) - 1
    assert time.perf_counter() - t < 3.0  # old code: 21 s for the unbounded read alone


def test_candid_bound_accepts_its_longest_encoding() -> None:
    n = (1 << (7 * CANDID_MAX_OCTETS)) - 1
    assert decode_candid_uleb(encode_uleb(n), 0) == (n, CANDID_MAX_OCTETS)
    with pytest.raises(VarintError):
        decode_candid_uleb(encode_uleb(n + 1), 0)


# -- the vectorised decoder (numpy) ------------------------------------------------------------
def _scalar_rows(data: bytes, pos: list[int], end: list[int]) -> list[tuple[int, int] | None]:
    """What ``decode_uleb`` with protobuf's bounds says of each row: (value, next) or None."""
    out: list[tuple[int, int] | None] = []
    for p, e in zip(pos, end, strict=True):
        try:
            out.append(decode_uleb(data[:e], p, MAX_OCTETS_64, max_value=UINT64_MAX))
        except VarintError:
            out.append(None)
    return out


def _batch_rows(data: bytes, pos: list[int], end: list[int]) -> list[tuple[int, int] | None]:
    import numpy as np

    value, nxt, ok = decode_uleb_batch(
        np.frombuffer(data, dtype=np.uint8), np.array(pos, np.int64), np.array(end, np.int64)
    )
    return [
        (int(v), int(x)) if k else None
        for v, x, k in zip(value.tolist(), nxt.tolist(), ok.tolist(), strict=True)
    ]


EDGE_VARINTS = [
    "00",
    "7f",
    "8001",
    "ff7f",
    "808001",
    "8000",  # non-minimal: protobuf accepts it
    "ffffffffffffffff7f",  # 9 octets, 63 bits
    "80808080808080808001",  # 10 octets, 2**63
    "ffffffffffffffffff01",  # UINT64_MAX
    "ffffffffffffffffff00",  # 10 octets, non-minimal
    "ffffffffffffffffff02",  # above 64 bits: OVERFLOW
    "ffffffffffffffffff7f",  # above 64 bits
    "ffffffffffffffffff8001",  # 11 octets: TOO_LONG
    "ff",  # TRUNCATED
    "ffffffffffffffffffff",  # 10 continuation octets
    "",
]


def test_vectorised_uleb_equals_the_scalar_decoder_on_edge_inputs() -> None:
    # each edge varint alone in its row, then every row cut at every length (truncations)
    blob = b"".join(bytes.fromhex(h) for h in EDGE_VARINTS)
    pos, end, p = [], [], 0
    for h in EDGE_VARINTS:
        size = len(bytes.fromhex(h))
        for cut in range(size + 1):
            pos.append(p)
            end.append(p + cut)
        p += size
    pos += [len(blob), len(blob) + 5, 3]  # at the end, past it, and pos beyond its row's end
    end += [len(blob), len(blob) + 9, 1]
    assert _batch_rows(blob, pos, end) == _scalar_rows(blob, pos, end)
    assert _batch_rows(bytes.fromhex("ffffffffffffffffff01"), [0], [10]) == [(UINT64_MAX, 10)]
    assert _batch_rows(b"\x96\x01", [0], [2]) == [(150, 2)]  # protobuf docs' "150 → 96 01"
    assert _batch_rows(b"", [0, 1], [0, 4]) == [None, None]  # no bytes at all
    # a row whose end lies past the buffer reads nothing from beyond it (the last byte, clamped,
    # once passed for a one-octet varint at every position past the end)
    assert _batch_rows(b"\x01", [0, 1, 3], [1, 5, 5]) == [(1, 1), None, None]


@given(
    st.binary(min_size=0, max_size=40) | st.lists(varint_bytes, max_size=6).map(b"".join),
    st.lists(st.tuples(st.integers(0, 45), st.integers(0, 45)), max_size=12),
)
@settings(max_examples=200)
def test_vectorised_uleb_equals_the_scalar_decoder_on_random_inputs(
    data: bytes, rows: list[tuple[int, int]]
) -> None:
    pos = [p for p, _ in rows]
    end = [e for _, e in rows]
    assert _batch_rows(data, pos, end) == _scalar_rows(data, pos, end)


def test_vectorised_uleb_is_bounded_on_hostile_bytes() -> None:
    """A megabyte of continuation octets read from every position: ten passes at most, every
    row refused, no read outside the buffer (positions and ends past it included)."""
    import numpy as np

    data = np.full(1_000_000, 0xFF, dtype=np.uint8)
    pos = np.arange(0, 1_000_000, dtype=np.int64)
    t = time.perf_counter()
    _, nxt, ok = decode_uleb_batch(data, pos, pos + 50)
    assert not ok.any() and int(nxt.max()) <= 1_000_000 + MAX_OCTETS_64
    _, _, ok = decode_uleb_batch(data, np.array([-1, 2_000_000]), np.array([5, 3_000_000]))
    assert not ok.any()
    assert time.perf_counter() - t < 5.0


@given(
    st.binary(min_size=0, max_size=40) | st.lists(varint_bytes, max_size=6).map(b"".join),
    st.lists(st.integers(-2, 45), min_size=1, max_size=12),
    st.booleans(),
)
@settings(max_examples=300)
def test_the_uniform_path_agrees_with_the_scalar_decoder_whenever_it_answers(
    data: bytes, pos: list[int], values: bool
) -> None:
    """The one-width fast path (the events codec's scans step by its width) answers only when
    every row is a valid number of the first row's width inside the buffer, and then each row
    is what ``decode_uleb`` reads there."""
    import numpy as np

    got = decode_uleb_batch_uniform(
        np.frombuffer(data, dtype=np.uint8), np.array(pos, np.int64), values
    )
    scalar = _scalar_rows(data, [max(p, 0) for p in pos], [len(data)] * len(pos))
    if got is None:
        widths = {
            None if r is None or p < 0 else r[1] - p for r, p in zip(scalar, pos, strict=True)
        }
        assert len(widths) != 1 or None in widths
        return
    w, value = got
    assert all(p >= 0 and r is not None and r[1] == p + w for r, p in zip(scalar, pos, strict=True))
    if values:
        assert value is not None
        assert value.tolist() == [r[0] for r in scalar if r is not None]
    else:
        assert value is None


def test_the_uniform_path_leaves_mixed_widths_to_the_general_one() -> None:
    import numpy as np

    data = np.frombuffer(encode_uleb(5) + encode_uleb(300) + encode_uleb(7), dtype=np.uint8)
    got = decode_uleb_batch_uniform(data, np.array([0, 3], np.int64))
    assert got is not None and got[0] == 1 and got[1] is not None and got[1].tolist() == [5, 7]
    assert decode_uleb_batch_uniform(data, np.array([0, 1], np.int64)) is None  # 1 and 2 octets
    value, nxt, ok = decode_uleb_batch(data, np.array([0, 1, 3], np.int64), np.array([4, 4, 4]))
    assert ok.all() and value.tolist() == [5, 300, 7] and nxt.tolist() == [1, 3, 4]
