"""The Candid codec's batch writers (``loglake.wire.candid_vec``: :func:`start`,
:func:`head_of`, :func:`write_nat_vec`, :func:`write_runs`) write, for random inputs, the bytes
the plain encoder (``candid.encode``) writes for the same values — and @dfinity/candid, the
reference, decodes them to those values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_candid import Types

from loglake.wire import candid, candid_vec
from tests.conftest import require_peer
from tests.differential.candid import from_icp
from tests.differential.peer import DiffPeer, available

NATS = Types.Vec(Types.Nat)
NATS_HEADER = candid.header(NATS)
RESULT = Types.Opt(
    Types.Variant(
        {
            "Ok": Types.Vec(Types.Nat),
            "Err": Types.Variant({"Unauthorized": Types.Null, "Busy": Types.Null}),
        }
    )
)
"""The shape of ``icrc72_publish``'s item result: ``opt variant { Ok : vec nat; Err : … }``."""
RESULTS = Types.Vec(RESULT)
RESULTS_HEADER = candid.header(RESULTS)
_write_result = candid.own_writer(RESULT)
BUSY = {"Err": {"Busy": None}}

NATS_JSON = {"k": "vec", "t": {"k": "nat"}}
RESULTS_JSON = {
    "k": "vec",
    "t": {
        "k": "opt",
        "t": {
            "k": "variant",
            "f": [
                ["Ok", NATS_JSON],
                [
                    "Err",
                    {
                        "k": "variant",
                        "f": [["Unauthorized", {"k": "null"}], ["Busy", {"k": "null"}]],
                    },
                ],
            ],
        },
    },
}

nats = st.one_of(st.integers(0, 300), st.integers(0, 2**40), st.integers(0, 2**64 - 1))


def written(write: Any, v: Any) -> bytes:
    out = bytearray()
    write(v, out)
    return bytes(out)


def run_values(first: int, count: int, per: int, busy: int) -> list[Any]:
    """The values :func:`candid_vec.write_runs` writes, one by one."""
    ok = [[{"Ok": list(range(first + k * per, first + (k + 1) * per))}] for k in range(count)]
    return ok + [[BUSY]] * busy


def write_runs(first: int, count: int, per: int, busy: int) -> bytes:
    head = candid_vec.head_of(_write_result, [{"Ok": [0] * per}], per)
    tail = written(_write_result, [BUSY])
    return candid_vec.write_runs(RESULTS_HEADER, head, first, count, per, tail, busy)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.lists(nats, max_size=3))
def test_start_is_the_plain_encoders_vector_up_to_its_items(n, items):
    assert candid.encode([NATS], [[0] * n]) == bytes(candid_vec.start(NATS_HEADER, n)) + bytes(n)
    whole = candid_vec.start(NATS_HEADER, len(items))
    for x in items:
        candid_vec.write_nat(x, whole)
    assert bytes(whole) == candid.encode([NATS], [items])


def test_head_of_is_the_writers_bytes_before_the_last_nats_and_refuses_other_values():
    assert candid_vec.head_of(_write_result, [{"Ok": [0]}], 1) == b"\x01\x00\x01"
    assert candid_vec.head_of(_write_result, [{"Ok": []}], 0) == b"\x01\x00\x00"
    with pytest.raises(ValueError, match="does not end with"):
        candid_vec.head_of(_write_result, [{"Ok": [5]}], 1)
    with pytest.raises(ValueError, match="does not end with"):
        candid_vec.head_of(candid_vec.write_nat, 0, 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(nats, max_size=200))
def test_write_nat_vec_writes_the_plain_encoders_bytes(ids):
    got = candid_vec.write_nat_vec(NATS_HEADER, ids)
    if len(ids) >= candid_vec.AT_ONCE:
        assert got == candid.encode([NATS], [ids])
    else:
        assert got is None  # a short vector: the codec's writer writes it
    assert candid_vec.write_nat_vec(NATS_HEADER, [*ids, 2**64] * 64) is None  # not a uint64


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(st.integers(0, 300), st.integers(0, 2**62)),
    st.integers(0, 150),
    st.one_of(st.integers(0, 3), st.integers(0, 20)),
    st.integers(0, 80),
)
def test_write_runs_writes_the_plain_encoders_bytes(first, count, per, busy):
    data = write_runs(first, count, per, busy)
    assert data == candid.encode([RESULTS], [run_values(first, count, per, busy)])
    if per == 1:  # and the run kernel reads it back
        got = candid_vec.runs(data, RESULTS_HEADER, b"\x01\x00\x01", written(_write_result, [BUSY]))
        assert got is not None
        assert [candid_vec.nat(x) for x in got[0]] == list(range(first, first + count))
        assert got[1] == busy


@pytest.fixture(scope="module")
def peer() -> Iterator[DiffPeer]:
    require_peer("node + @dfinity/candid", available(), "make node-deps")
    with DiffPeer() as p:
        yield p


@pytest.mark.interop
def test_dfinity_candid_decodes_what_the_batch_writers_write(peer):
    """Long vectors (the kernels) and short ones (the writers one by one), numbers of one to
    ten octets."""
    cases: list[tuple[dict[str, Any], Any, bytes]] = []
    for ids in ([7] * 64, list(range(2**20, 2**20 + 100)), [2**64 - 1, 0, 2**35] * 30):
        data = candid_vec.write_nat_vec(NATS_HEADER, ids)
        assert data is not None
        cases.append((NATS_JSON, ids, data))
    for first, count, per, busy in [(0, 100, 1, 20), (2**40, 70, 3, 0), (5, 3, 1, 2), (9, 4, 0, 1)]:
        values = run_values(first, count, per, busy)
        cases.append((RESULTS_JSON, values, write_runs(first, count, per, busy)))
    answers = peer.call("candid_decode", [{"type": t, "hex": d.hex()} for t, _, d in cases])
    for (t, v, _), got in zip(cases, answers, strict=True):
        assert got == {"value": from_icp(t, v)}
