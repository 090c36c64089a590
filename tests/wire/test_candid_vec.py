"""The Candid codec's batch executor (``loglake.wire.candid_vec``) against its plan: whatever it
takes — valid batches, and hostile bytes — reads as the plan reads it, and what the plan refuses
it never takes (module docstring). The kernels (whole-vector numpy) are also compared with the
executor's own walk item by item with the plan's readers."""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from icp_candid import Types
from icp_principal import Principal

from loglake.wire import candid, candid_vec
from loglake.wire.candid import CandidError
from loglake.wire.icrc16 import ICRC16DecodeError, candid_decode
from loglake.wire.varint import CANDID_MAX_OCTETS

ITEM = Types.Record(
    {
        "id": Types.Nat,
        "src": Types.Principal,
        "body": Types.Variant({"Blob": Types.Vec(Types.Nat8), "Text": Types.Text, "N": Types.Nat}),
        "tag": Types.Text,
        "prev": Types.Opt(Types.Nat),
        "ts": Types.Nat,
        "ns": Types.Text,
    }
)
REPEATED = {"src", "tag", "ns"}


def _shape(find: Any) -> None:
    for _, name, n in find(ITEM).fields:
        n.repeats = name in REPEATED


VEC = candid.shaped(Types.Vec(ITEM), _shape)
LAYOUT = candid_vec.RecordVec(VEC)
WANT = ("id", "ts")


@contextmanager
def at_once_from(n: int):
    old, candid_vec.AT_ONCE = candid_vec.AT_ONCE, n
    try:
        yield
    finally:
        candid_vec.AT_ONCE = old


def plan(data: bytes) -> list[Any] | None:
    try:
        return candid_decode(data, [VEC])[0]
    except ICRC16DecodeError:
        return None


def key(run: candid_vec.Run | None) -> Any:
    if run is None:
        return None
    return run.at.tolist(), run.first, {k: list(v) for k, v in run.nats.items()}


def check(data: bytes) -> candid_vec.Run | None:
    """The executor's answer, checked against the plan and against its item-by-item walk."""
    run = candid_vec.scan(LAYOUT, data, WANT)
    with at_once_from(10**9):
        assert key(candid_vec.scan(LAYOUT, data, WANT)) == key(run)
    want = plan(data)
    if run is None:
        return None
    assert want is not None, "the executor took bytes the plan refuses"
    assert len(run) == len(want)
    rows = run.at.tolist()
    assert rows[-1][-1] == len(data)
    for k, item in enumerate(want):
        row = rows[k]
        for j, f in enumerate(LAYOUT.fields):
            v, end = f.read(data, row[j], 0)
            assert end == row[j + 1] and v == item[f.name]
            if f.kind == candid_vec.SAME:
                assert run.first[j] == v
        for name in WANT:
            assert run.nats[name][k] == item[name]
        if k + 1 < len(want):
            assert row[-1] == rows[k + 1][0]
    return run


def encode(items: list[dict[str, Any]]) -> bytes:
    return candid.encode([VEC], [items])


nats = st.one_of(st.integers(0, 300), st.integers(0, 2**40), st.integers(0, 2**70))
bodies = st.one_of(
    st.binary(max_size=30).map(lambda b: {"Blob": b}),
    st.text(max_size=5).map(lambda s: {"Text": s}),
    nats.map(lambda n: {"N": n}),
)


@st.composite
def batches(draw: Any, min_size: int = 1, max_size: int = 120) -> list[dict[str, Any]]:
    src = Principal(draw(st.binary(max_size=29)))
    tag, ns = draw(st.text(max_size=12)), draw(st.text(max_size=6))
    rows = draw(
        st.lists(
            st.tuples(nats, bodies, st.none() | nats, nats), min_size=min_size, max_size=max_size
        )
    )
    same_body = draw(st.booleans())
    return [
        {
            "id": i,
            "src": src,
            "body": rows[0][1] if same_body else b,
            "tag": tag,
            "prev": [] if p is None else [p],
            "ts": t,
            "ns": ns,
        }
        for i, b, p, t in rows
    ]


def mutated(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2))):
        if not buf:
            break
        op, pos = rng.randrange(5), rng.randrange(len(buf))
        if op == 0:
            buf[pos] = rng.choice((0, 1, 2, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 1:
            buf.insert(pos, rng.randrange(256))
        elif op == 2:
            del buf[pos]
        elif op == 3:
            del buf[pos:]
        else:
            buf[pos:pos] = rng.choice((b"\x80\x00", b"\xff" * 9 + b"\x01", b"\xff" * 10))
    return bytes(buf)


@settings(max_examples=150, deadline=None)
@given(batches(), st.integers(0, 2**32), st.sampled_from([1, 8, 64]))
def test_the_executor_reads_valid_and_hostile_batches_as_the_plan(items, seed, at_once):
    data = encode(items)
    with at_once_from(at_once):
        run = check(data)
        if len(set(repr(i["src"]) + i["tag"] + i["ns"] for i in items)) == 1:
            assert run is not None  # a valid batch that repeats its parts is taken
        rng = random.Random(seed)
        for _ in range(20):
            check(mutated(data, rng))


def test_long_batches_take_the_kernels_and_damage_falls_to_the_plan():
    rng = random.Random(7)
    src = Principal(b"\x07" * 10)
    for body in ({"Blob": b"x" * 40}, {"Text": "abc"}):
        items = [
            {"id": 16_000 + k, "src": src, "body": body, "tag": "headers-of-the-batch", "prev": [k]}
            | {"ts": 10**18 + k, "ns": "ns"}
            for k in range(300)
        ]
        data = encode(items)
        assert check(data) is not None
        for _ in range(300):
            check(mutated(data, rng))


def test_an_opt_flag_above_one_is_refused_by_the_kernels_as_by_the_plan():
    src = Principal(b"\x07" * 10)
    items = [
        {"id": k, "src": src, "body": {"Blob": b"y"}, "tag": "t", "prev": [3], "ts": 5, "ns": "n"}
        for k in range(100)
    ]
    data = encode(items)
    run = check(data)
    assert run is not None
    at = int(run.at[50, LAYOUT.column["prev"]])
    assert data[at] == 1
    bad = data[:at] + b"\x02" + data[at + 1 :]
    assert check(bad) is None and plan(bad) is None


def test_a_vector_longer_than_the_message_is_refused_before_any_item_is_read():
    data = encode(
        [
            {"id": 1, "src": Principal(b""), "body": {"N": 1}, "tag": "", "prev": []}
            | {"ts": 1, "ns": ""}
        ]
    )
    at = len(LAYOUT.header)
    assert data[at] == 1
    huge = data[:at] + b"\xff\xff\xff\xff\x0f" + data[at + 1 :]
    assert check(huge) is None
    with pytest.raises(CandidError, match="longer than the message"):
        candid_vec.count(huge, at)


NATS_HEADER = candid.header(Types.Vec(Types.Nat))


@settings(max_examples=100, deadline=None)
@given(st.lists(nats, max_size=200), st.integers(0, 2**32))
def test_vec_nat_kernel_reads_as_the_plan(ids, seed):
    data = candid.encode([Types.Vec(Types.Nat)], [ids])
    rng = random.Random(seed)
    for b in [data] + [mutated(data, rng) for _ in range(20)]:
        got = candid_vec.nat_vec(b, NATS_HEADER)
        if got is not None:
            assert got == candid_decode(b, [Types.Vec(Types.Nat)])[0]


RUN_HEADER = b"DIDL\x02\x6d\x01\x6b\x02\x00\x7d\x01\x7f\x01\x00"
"""``vec variant {0: nat; 1: null}``: a run of ``0 · nat`` items, then ``1`` items."""
RUN_TYPE = Types.Vec(Types.Variant({"_0_": Types.Nat, "_1_": Types.Null}))


def test_runs_kernel_reads_as_the_plan_and_bounds_each_nat():
    assert candid.header(RUN_TYPE) == RUN_HEADER
    data = RUN_HEADER + b"\x05" + b"\x00\x07" * 3 + b"\x01" * 2
    assert candid_vec.runs(data, RUN_HEADER, b"\x00", b"\x01") == ([b"\x07"] * 3, 2)
    assert candid_decode(data, [RUN_TYPE])[0] == [{"_0_": 7}] * 3 + [{"_1_": None}] * 2
    # a nat of more than CANDID_MAX_OCTETS octets: the plan refuses it, so the kernel does too
    long = b"\x87" + b"\x80" * CANDID_MAX_OCTETS + b"\x00"
    bad = RUN_HEADER + b"\x02\x00" + long + b"\x01"
    assert candid_vec.runs(bad, RUN_HEADER, b"\x00", b"\x01") is None
    with pytest.raises(ICRC16DecodeError, match="too long"):
        candid_decode(bad, [RUN_TYPE])
    for cut in (b"\x01", b""):  # a count that does not match the items, a cut item
        assert candid_vec.runs(data[:-1] + cut + b"\x00", RUN_HEADER, b"\x00", b"\x01") is None
