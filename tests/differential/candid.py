"""Differential fuzzing of loglake's Candid codec (``wire.icrc16.candid_decode`` and
``wire.candid.encode`` — the paths every ICRC-72/77 call's argument and reply takes) against
@dfinity/candid, the reference implementation.

Per batch drawn by hypothesis: random Candid types (records, variants, opts, vecs of the
primitives, nested) and values of them;

- @dfinity/candid encodes each value; loglake decodes the bytes to the same value (its type
  tables and field order are the reference's, not loglake's own: the foreign-header path);
- loglake encodes each value; @dfinity/candid decodes it to the same value;
- mutants of the reference's bytes, decoded as the same type by both: both accept or both
  reject, and accepted values are equal. Anything but loglake's ``DecodeError`` is a
  disagreement too.

Known, documented differences are not counted: loglake's own bounds where the spec sets none
(``wire/candid.py``: LEB128 length, nesting, ``vec`` of zero-sized elements, principals
over 29 bytes) — a mutant loglake rejects for one of those is skipped. And one defect of the
reference: @dfinity/candid reads a ``vec`` of fixed-size numbers (``nat8`` … ``nat64``) with
``Pipe.read`` rather than ``safeRead`` (``idl.js``, ``VecClass.decodeValue``), so a vector cut
short by the end of the message is accepted with fewer elements (@dfinity/candid 3.4.3 decodes
``DIDL 01 6d 7b 01 00 03 01`` to ``[1]``); the spec has no such value, and loglake rejects it
as truncated. A mutant loglake rejects as truncated while the reference accepts it is skipped
(never the other way round). One more defect of the reference, where loglake follows the spec:
skipping a value through a recursive wire type it can refuse a type as not equal to itself
("type mismatch: type on the wire vec rec_1, expect type vec rec_1"); such mutants are skipped.

Where the reference departs from the spec otherwise (a wire ``nat`` read as ``int``, a missing
record field of type ``null``, missing trailing ``opt`` arguments, a ``vec`` of fixed-size ints
read at the expected element's width whatever the wire's, a value that is not ``opt`` under an
``opt opt t`` — the spec's Coercion → Options rule lifts it, the reference reads it as null, or
for a constructed wire type fails on the self-mismatch above, which an ``opt`` around it reads as
null: ``wire/candid.py``), a disagreement
is counted in :data:`SPEC_OVER_REFERENCE` — not a failure — when loglake's decoder with those
departures (``decode_with_reference_quirks``) gives the reference's answer.
"""

from __future__ import annotations

import random
import re
from typing import Any

from hypothesis import strategies as st
from icp_candid import Types
from icp_principal import Principal

from loglake.errors import DecodeError
from loglake.wire.candid import CandidError, decode_with_reference_quirks, encode, read_header
from loglake.wire.icrc16 import candid_decode
from tests.differential.mutate import mutations
from tests.differential.peer import DiffPeer

MUTANTS_PER_VALUE = 12
_INT_BITS = {"8": 8, "16": 16, "32": 32, "64": 64}
_PRIMS = ["null", "bool", "nat", "int", "text", "principal", "reserved"] + [
    f"{s}{b}" for s in ("nat", "int") for b in _INT_BITS
]
_TRUNCATED = ("longer than the message", "truncated", "read past the end")
SPEC_OVER_REFERENCE: list[str] = []
"""Mutants where loglake follows the spec and @dfinity/candid does not (``wire/candid.py``
docstring): not disagreements; ``benchmarks/fuzz.py`` prints how many."""
_LOGLAKE_BOUNDS = ("leb128 too long", "nested deeper", "zero-sized", "29 bytes", "Principal")


# -- types and values ---------------------------------------------------------------------------
_names = st.sampled_from(["a", "b", "c", "id", "start", "end", "data", "x_1", "Ok", "Err"])


def _fields(inner: st.SearchStrategy[Any], min_size: int) -> st.SearchStrategy[Any]:
    return st.lists(
        st.tuples(_names, inner), min_size=min_size, max_size=4, unique_by=lambda f: f[0]
    )


def _zero_sized(t: dict[str, Any]) -> bool:
    """Values of ``t`` take no bytes: loglake refuses a ``vec`` of them (a documented bound)."""
    if t["k"] == "record":
        return all(_zero_sized(ft) for _, ft in t["f"])
    return t["k"] in ("null", "reserved")


types: st.SearchStrategy[Any] = st.recursive(
    st.sampled_from(_PRIMS).map(lambda k: {"k": k}),
    lambda inner: st.one_of(
        inner.map(lambda t: {"k": "opt", "t": t}),
        inner.filter(lambda t: not _zero_sized(t)).map(lambda t: {"k": "vec", "t": t}),
        _fields(inner, 1).map(lambda f: {"k": "record", "f": [list(x) for x in f]}),
        _fields(inner, 1).map(lambda f: {"k": "variant", "f": [list(x) for x in f]}),
    ),
    max_leaves=8,
)


def values(t: dict[str, Any]) -> st.SearchStrategy[Any]:
    k = t["k"]
    if k in ("null", "reserved"):
        return st.none()
    if k == "bool":
        return st.booleans()
    if k == "text":
        return st.text(max_size=8)
    if k == "principal":
        return st.binary(max_size=29).map(lambda b: Principal(b).to_str())
    if k in ("nat", "int"):
        lo = 0 if k == "nat" else -(1 << 200)
        return st.one_of(st.integers(lo, 300), st.integers(lo, 1 << 200)).map(str)
    if k[:3] in ("nat", "int") and k[3:] in _INT_BITS:
        bits = _INT_BITS[k[3:]]
        lo, hi = (0, (1 << bits) - 1) if k[:3] == "nat" else (-(1 << bits - 1), (1 << bits - 1) - 1)
        ints = st.integers(lo, hi)
        return ints.map(str) if bits == 64 else ints
    if k == "opt":
        return st.one_of(st.just([]), values(t["t"]).map(lambda v: [v]))
    if k == "vec":
        return st.lists(values(t["t"]), max_size=3)
    if k == "record":
        return st.fixed_dictionaries({n: values(ft) for n, ft in t["f"]})
    return st.one_of(*[values(ft).map(lambda v, n=n: {n: v}) for n, ft in t["f"]])


@st.composite
def _typed_values(draw: Any) -> tuple[dict[str, Any], list[Any]]:
    t = draw(types)
    return t, draw(st.lists(values(t), min_size=1, max_size=3))


batches = st.tuples(st.lists(_typed_values(), min_size=1, max_size=6), st.integers(0, 2**32))


# -- loglake's side -------------------------------------------------------------------------------
def icp_type(t: dict[str, Any]) -> Any:
    k = t["k"]
    if k == "opt":
        return Types.Opt(icp_type(t["t"]))
    if k == "vec":
        return Types.Vec(icp_type(t["t"]))
    if k in ("record", "variant"):
        fields = {n: icp_type(ft) for n, ft in t["f"]}
        return Types.Record(fields) if k == "record" else Types.Variant(fields)
    return getattr(Types, {"nat": "Nat", "int": "Int", "text": "Text"}.get(k, k.capitalize()))


def to_icp(t: dict[str, Any], v: Any) -> Any:
    k = t["k"]
    if k in ("nat", "int", "nat64", "int64"):
        return int(v)
    if k == "principal":
        return Principal.from_str(v)
    if k == "opt":
        return [to_icp(t["t"], v[0])] if v else []
    if k == "vec":
        return [to_icp(t["t"], x) for x in v]
    if k == "record":
        return {n: to_icp(ft, v[n]) for n, ft in t["f"]}
    if k == "variant":
        ((tag, x),) = v.items()
        return {tag: to_icp(dict(t["f"])[tag], x)}
    return v


def from_icp(t: dict[str, Any], v: Any) -> Any:
    k = t["k"]
    if k in ("nat", "int", "nat64", "int64"):
        return str(v)
    if k in ("null", "reserved"):
        return None
    if k == "principal":
        return v.to_str()
    if k == "opt":
        return [from_icp(t["t"], v[0])] if v else []
    if k == "vec":
        return [from_icp(t["t"], x) for x in v]
    if k == "record":
        return {n: from_icp(ft, v[n]) for n, ft in t["f"]}
    if k == "variant":
        ((tag, x),) = v.items()
        return {tag: from_icp(dict(t["f"])[tag], x)}
    return v


def loglake_decode(t: dict[str, Any], data: bytes) -> dict[str, Any]:
    """``{"value": …}`` or ``{"rejects": reason}``; any other exception is left to raise."""
    try:
        return {"value": from_icp(t, candid_decode(data, [icp_type(t)])[0])}
    except DecodeError as e:
        return {"rejects": str(e)}


def loglake_decode_as_reference(t: dict[str, Any], data: bytes) -> dict[str, Any]:
    """loglake's decoder with @dfinity/candid's documented departures from the spec."""
    try:
        return {"value": from_icp(t, decode_with_reference_quirks(data, [icp_type(t)])[0])}
    except CandidError as e:
        return {"rejects": str(e)}


def _spec_difference(t: dict[str, Any], m: bytes, ref: dict[str, Any]) -> bool:
    """The reference's answer is what loglake gives with the reference's departures from
    the spec (``wire.candid.decode_with_reference_quirks``): loglake follows the spec there."""
    quirk = loglake_decode_as_reference(t, m)
    if "rejects" in quirk:
        return "throws" in ref
    return quirk.get("value", object()) == ref.get("value", object())


_SELF_MISMATCH = re.compile(r"type mismatch: type on the wire (.+), expect type \1$")


def _reference_defect(m: bytes, mine: dict[str, Any], ref: dict[str, Any]) -> bool:
    """A defect of @dfinity/candid 3.4.3 (``idl.js``) the spec settles (module docstring)."""
    # it refuses a wire type as not equal to itself (skipping through a recursive type)
    return _SELF_MISMATCH.match(ref.get("throws", "")) is not None


def loglake_encode(t: dict[str, Any], v: Any) -> bytes:
    return encode([icp_type(t)], [to_icp(t, v)])


# -- the comparison -------------------------------------------------------------------------------
def _same(t: dict[str, Any], a: Any, b: Any) -> bool:
    return a == b


def check(peer: DiffPeer, batch: Any, header_mutants: bool = False) -> tuple[int, list[str]]:
    typed, seed = batch
    rng = random.Random(seed)
    bad: list[str] = []
    cases = 0
    items = [(t, v) for t, vs in typed for v in vs]
    theirs = peer.call("candid_encode", [{"type": t, "value": v} for t, v in items])
    ours = [loglake_encode(t, v) for t, v in items]
    back = peer.call(
        "candid_decode",
        [{"type": t, "hex": b.hex()} for (t, _), b in zip(items, ours, strict=True)],
    )
    probes: list[tuple[dict[str, Any], bytes]] = []
    for (t, v), h, got in zip(items, theirs, back, strict=True):
        cases += 2
        if not isinstance(h, str):
            bad.append(f"reference cannot encode {t} {v!r}: {h}")
            continue
        data = bytes.fromhex(h)
        mine = loglake_decode(t, data)
        if mine.get("value", object()) != v:
            bad.append(f"reference bytes {h} of {t}: loglake {mine}, wanted {v!r}")
        if got.get("value", object()) != v:
            bad.append(f"loglake bytes of {t} {v!r}: reference decodes {got}")
        if header_mutants:
            probes += [(t, m) for m in mutations([data], MUTANTS_PER_VALUE, rng)]
        else:  # the reference's type table kept, its values mutated
            head = read_header(data)[2]
            probes += [
                (t, data[:head] + m) for m in mutations([data[head:]], MUTANTS_PER_VALUE, rng)
            ]
    answers = peer.call("candid_decode", [{"type": t, "hex": m.hex()} for t, m in probes])
    for (t, m), ref in zip(probes, answers, strict=True):
        cases += 1
        why = compare(t, m, ref)
        if why is not None:
            bad.append(f"mutant {why}")
    return cases, bad


def compare(t: dict[str, Any], m: bytes, ref: dict[str, Any]) -> str | None:
    """The disagreement between loglake and the reference's answer ``ref`` on the message ``m``
    decoded as ``t``, or None: both reject, both give the same value, or the difference is a
    documented one (module docstring; a spec difference is noted in
    :data:`SPEC_OVER_REFERENCE`)."""
    mine = loglake_decode(t, m)
    if "rejects" in mine and "throws" in ref:
        return None
    if "rejects" in mine and any(s in mine["rejects"] for s in _LOGLAKE_BOUNDS):
        return None
    if "rejects" in mine and "value" in ref and any(s in mine["rejects"] for s in _TRUNCATED):
        return None  # the reference's short read of a cut ``vec nat8`` (module docstring)
    if mine.get("value", object()) == ref.get("value", object()):
        return None
    if _reference_defect(m, mine, ref):
        return None
    if _spec_difference(t, m, ref):
        SPEC_OVER_REFERENCE.append(f"{m.hex()} as {t}: loglake {mine}, reference {ref}")
        return None
    return f"{m.hex()} as {t}: loglake {mine}, reference {ref}"


def check_both(peer: DiffPeer, batch: Any) -> tuple[int, list[str]]:
    """Both passes on one batch: value mutants under the reference's type table, then mutants
    anywhere, type table included (the subtyping rules); what ``make test`` runs."""
    cases, bad = check(peer, batch)
    more, worse = check(peer, batch, header_mutants=True)
    return cases + more, bad + worse
