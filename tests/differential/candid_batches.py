"""Differential fuzzing of the Candid codec's batch executor (``wire.candid_vec``) against
@dfinity/candid: long ``vec record`` batches shaped like the replay data plane's (ids and
timestamps, parts every item repeats, one value of any case, an ``opt nat``).

Why beside ``candid.py``: the executor takes only loglake's own header, and only vectors long
enough for its numpy kernels, so the random types and short values there never reach it. Here
loglake encodes a long batch (own header: the executor's input), the reference decodes it to
the same value, and mutants of its values — random ones and a sweep of single-octet changes over
one item — are decoded by both. loglake's answer is what the replay path trusts: where the
executor takes the bytes, the batch it reports (the first item's repeated parts for every item,
the ``nat`` columns from its kernels, every other field read at the offsets it found, each
ending where it says the next field starts); where it does not, the plan's answer. Both must
accept or both reject, with equal values.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import strategies as st
from icp_candid import Types
from icp_principal import Principal

from loglake.errors import DecodeError
from loglake.wire import candid, candid_vec
from loglake.wire.icrc16 import candid_decode
from tests.differential.candid import _TRUNCATED, from_icp, to_icp
from tests.differential.mutate import mutations, sweep
from tests.differential.peer import DiffPeer

MUTANTS = 24
SWEPT_ITEMS = 1
_DATA = {
    "k": "variant",
    "f": [
        ["Blob", {"k": "vec", "t": {"k": "nat8"}}],
        ["Text", {"k": "text"}],
        ["Nat", {"k": "nat"}],
    ],
}
ITEM = {
    "k": "record",
    "f": [
        ["eventId", {"k": "nat"}],
        ["source", {"k": "principal"}],
        ["data", _DATA],
        ["headers", {"k": "text"}],
        ["prevEventId", {"k": "opt", "t": {"k": "nat"}}],
        ["timestamp", {"k": "nat"}],
        ["namespace", {"k": "text"}],
    ],
}
BATCH = {"k": "vec", "t": ITEM}
_REPEATED = {"source", "headers", "namespace"}
_ITEM_ICP = Types.Record(
    {
        "eventId": Types.Nat,
        "source": Types.Principal,
        "data": Types.Variant(
            {"Blob": Types.Vec(Types.Nat8), "Text": Types.Text, "Nat": Types.Nat}
        ),
        "headers": Types.Text,
        "prevEventId": Types.Opt(Types.Nat),
        "timestamp": Types.Nat,
        "namespace": Types.Text,
    }
)


def _shape(find: Any) -> None:
    for _, name, n in find(_ITEM_ICP).fields:
        n.repeats = name in _REPEATED


VEC = candid.shaped(Types.Vec(_ITEM_ICP), _shape)
LAYOUT = candid_vec.RecordVec(VEC)
NATS = [f.name for f in LAYOUT.fields if f.kind == candid_vec.NAT]

_nats = st.one_of(st.integers(0, 300), st.integers(0, 2**40), st.integers(0, 2**70)).map(str)
_data = st.one_of(
    st.binary(max_size=40).map(lambda b: {"Blob": list(b)}),
    st.binary(max_size=40).map(lambda b: {"Blob": list(b)}),
    st.text(max_size=6).map(lambda s: {"Text": s}),
    _nats.map(lambda n: {"Nat": n}),
)


@st.composite
def _batch(draw: Any) -> tuple[list[dict[str, Any]], int]:
    src = Principal(draw(st.binary(min_size=1, max_size=29))).to_str()
    hs, ns = draw(st.text(max_size=12)), draw(st.text(min_size=1, max_size=8))
    n = draw(st.integers(candid_vec.AT_ONCE, 200))
    first = draw(st.integers(0, 2**21))
    step = draw(st.sampled_from([0, 1, 1, 1, 7]))
    ts = draw(_nats)
    blob = draw(st.binary(max_size=40))
    mixed = draw(st.booleans())  # values of other cases and lengths, or all one blob
    items = []
    for k in range(n):
        i = first + k * step
        items.append(
            {
                "eventId": str(i),
                "source": src,
                "data": draw(_data) if mixed else {"Blob": list(blob)},
                "headers": hs,
                "prevEventId": [str(i - 1)] if i else [],
                "timestamp": ts if not mixed else draw(_nats),
                "namespace": ns,
            }
        )
    return items, draw(st.integers(0, 2**32))


batches = _batch()


def _from_run(run: candid_vec.Run, data: bytes) -> dict[str, Any]:
    """The batch as the executor reports it (module docstring)."""
    out = []
    fields = LAYOUT.fields
    rows = run.at.tolist()
    for k in range(len(run)):
        row = rows[k]
        item: dict[str, Any] = {}
        for j, f in enumerate(fields):
            if f.kind == candid_vec.SAME:
                item[f.name] = run.first[j]
            elif f.kind == candid_vec.NAT:
                item[f.name] = run.nats[f.name][k]
            else:
                try:
                    v, end = f.read(data, row[j], 0)
                except (DecodeError, ValueError, IndexError) as e:
                    return {"kernel-error": f"item {k} field {f.name}: {e}"}
                if end != row[j + 1]:
                    return {
                        "kernel-error": f"item {k} field {f.name} ends at {end}, not {row[j + 1]}"
                    }
                item[f.name] = v
        out.append(item)
    return {"value": from_icp(BATCH, out)}


def loglake_decode(data: bytes) -> dict[str, Any]:
    """What the replay path trusts: the executor's batch, else the plan's answer."""
    run = candid_vec.scan(LAYOUT, data, NATS)
    if run is not None:
        return _from_run(run, data)
    try:
        return {"value": from_icp(BATCH, candid_decode(data, [VEC])[0])}
    except DecodeError as e:
        return {"rejects": str(e)}


_LOGLAKE_BOUNDS = ("leb128 too long",)


def check(peer: DiffPeer, batch: Any) -> tuple[int, list[str]]:
    items, seed = batch
    rng = random.Random(seed)
    bad: list[str] = []
    data = candid.encode([VEC], [to_icp(BATCH, items)])
    [ref] = peer.call("candid_decode", [{"type": BATCH, "hex": data.hex()}])
    if ref.get("value", object()) != items:
        bad.append(f"loglake's batch of {len(items)} items: reference decodes {ref}")
    mine = loglake_decode(data)
    if mine.get("value", object()) != items:
        bad.append(f"loglake's batch of {len(items)} items: executor {str(mine)[:300]}")
    head = len(LAYOUT.header)
    probes = [data[:head] + m for m in mutations([data[head:]], MUTANTS, rng)]
    # one item swept octet by octet: its flags, lengths and numbers hit at every value
    run = candid_vec.scan(LAYOUT, data, NATS)
    if run is not None:
        for k in rng.sample(range(len(run)), SWEPT_ITEMS):
            a, b = int(run.at[k, 0]), int(run.at[k, -1])
            probes += [data[:a] + s + data[b:] for s in sweep(data[a:b])]
    answers = peer.call("candid_decode", [{"type": BATCH, "hex": m.hex()} for m in probes])
    cases = 2
    for m, ref in zip(probes, answers, strict=True):
        cases += 1
        mine = loglake_decode(m)
        if "rejects" in mine and "throws" in ref:
            continue
        if "rejects" in mine and any(s in mine["rejects"] for s in _LOGLAKE_BOUNDS):
            continue
        if "rejects" in mine and "value" in ref and any(s in mine["rejects"] for s in _TRUNCATED):
            continue  # the reference's short read of a cut ``vec nat8`` (candid.py's docstring)
        if mine.get("value", object()) != ref.get("value", object()):
            bad.append(f"mutant {m.hex()[:400]}…: loglake {str(mine)[:300]}, reference {ref}"[:900])
    return cases, bad
