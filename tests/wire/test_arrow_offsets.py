"""``value_offsets`` against the lengths pyarrow itself reports, for every variable-length
type the kernels read, sliced and not, with nulls and without an offsets buffer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.wire.arrow_offsets import value_offsets

TYPES = [
    (pa.string(), np.int32),
    (pa.large_string(), np.int64),
    (pa.binary(), np.int32),
    (pa.large_binary(), np.int64),
    (pa.list_(pa.string()), np.int32),
    (pa.large_list(pa.string()), np.int64),
]


def _values(typ: pa.DataType, rows: list[list[str] | None]) -> list:
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return rows
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return [None if r is None else "".join(r).encode() for r in rows]
    return [None if r is None else "".join(r) for r in rows]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(TYPES),
    st.lists(st.one_of(st.none(), st.lists(st.text(max_size=4), max_size=4)), max_size=30),
    st.data(),
)
def test_offsets_give_each_rows_length_from_the_slice_on(typ_dtype, rows, data):
    typ, dtype = typ_dtype
    arr = pa.array(_values(typ, rows), typ)
    lo = data.draw(st.integers(0, len(arr)))
    hi = data.draw(st.integers(lo, len(arr)))
    part = arr.slice(lo, hi - lo)
    offs = value_offsets(part)
    assert offs.dtype == dtype and len(offs) == len(part) + 1
    lengths = pc.fill_null(
        pc.list_value_length(part) if typ in (TYPES[4][0], TYPES[5][0]) else pc.binary_length(part),
        0,
    )
    assert np.diff(offs).tolist() == lengths.to_pylist()
    assert np.all(np.diff(offs) >= 0)


def test_a_view_not_a_copy_and_an_array_without_offsets_is_a_zero():
    arr = pa.array(["a", "bc", "def"])
    offs = value_offsets(arr.slice(1))
    assert offs.tolist() == [1, 3, 6]
    assert np.shares_memory(offs, np.frombuffer(arr.buffers()[1], dtype=np.int32))
    # an array that comes without an offsets buffer (pyarrow's own constructors always make
    # one; an array imported through the C data interface may not): zeros, never an error

    class Bare:
        type, offset = pa.string(), 0

        def __len__(self) -> int:
            return 2

        def buffers(self) -> list[None]:
            return [None, None, None]

    assert value_offsets(Bare()).tolist() == [0, 0, 0]  # type: ignore[arg-type]


@pytest.mark.parametrize("typ", [pa.string(), pa.binary(), pa.list_(pa.int8())])
def test_empty_arrays(typ):
    assert value_offsets(pa.array([], typ)).tolist() == [0]
