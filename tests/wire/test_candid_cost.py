"""The Candid decoder's work is linear in the message's size, whatever its type table.

Found from outside (review of the ICRC-72/77 part): the ``opt`` rule is applied to values, so a
value under an ``opt`` that fails to coerce is read up to the failure, then skipped whole. An
ICRC-16 value sent with a type table of one extra variant tag, nested 31 levels deep as
``#Option(opt #Array[<next level>, #ZZZ_extra])`` over a vector of ``#Nat``, made each level
skip its whole child again: a 400 KB body took 17.75 s (an honest 1 MB one 1.04 s). A budget
on the bytes skipped again then refused valid messages of that shape (three levels over
200 KB): now a level jumps over what the level inside it skipped again, and every one reads as
the spec says. And a record's zero-sized fields (``null``, ``reserved``, ``record {}``) cost a
step each per value for no byte: 10,000 of them in a 3,000-item vector, 33 KB, took 3.6 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from icp_candid import Types
from icp_candid.candid import idl_hash

from loglake.events.codec import METHODS
from loglake.wire import candid, icrc16
from loglake.wire.varint import encode_sleb, encode_uleb

REGISTER = METHODS["icrc72_register_subscription"]


def nested_opt_failures(depth: int, nats: int) -> bytes:
    """``icrc72_register_subscription``'s argument, its config one ICRC-16 value sent with its
    own table: the variant ``{Array; Nat; Option; ZZZ_extra : null}`` (a tag ICRC-16 lacks),
    ``depth`` levels of ``#Option(opt #Array[<next level>, #ZZZ_extra])`` over ``#Array`` of
    ``nats`` ``#Nat(1)``. Each level reads as ``#Option(null)``: its array holds a tag the
    expected variant lacks (the spec's "Coercion" → "Options")."""
    u, s = encode_uleb, encode_sleb
    cases = sorted([(idl_hash("Array"), 1), (idl_hash("Nat"), -3), (idl_hash("Option"), 2)])
    cases = sorted([*cases, (idl_hash("ZZZ_extra"), -1)])
    tag = {h: k for k, (h, _) in enumerate(cases)}
    fields = sorted([(idl_hash("namespace"), -15), (idl_hash("config"), 4), (idl_hash("memo"), 7)])
    table = [
        s(-21) + u(len(cases)) + b"".join(u(h) + s(t) for h, t in cases),  # 0 the value
        s(-19) + s(0),  # 1 vec value
        s(-18) + s(0),  # 2 opt value
        s(-20) + u(2) + u(0) + s(-15) + u(1) + s(0),  # 3 record { text; value }
        s(-19) + s(3),  # 4 vec 3: the config
        s(-20) + u(3) + b"".join(u(h) + s(t) for h, t in fields),  # 5 the registration
        s(-19) + s(5),  # 6 vec 5: the argument
        s(-19) + s(-5),  # 7 vec nat8: the memo
    ]
    head = b"DIDL" + u(len(table)) + b"".join(table) + u(1) + s(6)

    def case(name: str) -> bytes:
        return u(tag[idl_hash(name)])

    v = case("Array") + u(nats) + (case("Nat") + b"\x01") * nats
    for _ in range(depth):
        v = case("Option") + b"\x01" + case("Array") + u(2) + v + case("ZZZ_extra")
    values = {"namespace": u(3) + b"bom", "config": u(1) + u(1) + b"k" + v, "memo": u(0)}
    return head + u(1) + b"".join(values[n] for _, n in sorted((idl_hash(n), n) for n in values))


def nested_lift_failures(depth: int, nats: int, top_ok: bool = True) -> bytes:
    """A value of wire type ``W = variant { base : vec nat; more : record { sub : W; status :
    variant { bad; ok } } }``: ``depth`` levels of ``#more { sub = <next level>; status = #bad
    }`` over ``#base`` of ``nats`` 1s, under one ``#more { …; status = #ok }`` (``top_ok``). Read
    as :data:`LIFTED` (``sub : opt E``, a ``W`` lifted into it, and no ``bad``), each level reads
    its ``sub`` (the field ids put it first), fails at its status and reads as null: the other
    failure site (a value that is not ``opt`` under an ``opt``)."""
    u, s = encode_uleb, encode_sleb
    base, more, sub, status, bad, ok = map(idl_hash, ["base", "more", "sub", "status", "bad", "ok"])
    assert sub < status
    w = sorted([(base, 1), (more, 2)])
    tags = sorted([(bad, -1), (ok, -1)])
    table = [
        s(-21) + u(2) + b"".join(u(h) + s(t) for h, t in w),  # 0 W
        s(-19) + s(-3),  # 1 vec nat
        s(-20) + u(2) + u(sub) + s(0) + u(status) + s(3),  # 2 the record
        s(-21) + u(2) + b"".join(u(h) + s(t) for h, t in tags),  # 3 the status
    ]
    case = {h: u(k) for k, (h, _) in enumerate(w)}
    tag_of = {h: u(k) for k, (h, _) in enumerate(tags)}
    v = case[base] + u(nats) + b"\x01" * nats
    for _ in range(depth):
        v = case[more] + v + tag_of[bad]
    if top_ok:
        v = case[more] + v + tag_of[ok]
    return b"DIDL" + u(len(table)) + b"".join(table) + u(1) + s(0) + v


def _lifted() -> Any:
    e = Types.Rec()
    status = Types.Variant({"ok": Types.Null})
    more = Types.Record({"sub": Types.Opt(e), "status": status})
    e.fill(Types.Variant({"base": Types.Vec(Types.Nat), "more": more}))
    return e


LIFTED = _lifted()
"""The expected type of :func:`nested_lift_failures`: ``E = variant { base : vec nat; more :
record { sub : opt E; status : variant { ok } } }``."""
LIFTED_NULL = {"more": {"sub": [], "status": {"ok": None}}}
""":func:`nested_lift_failures` read as :data:`LIFTED`, at any depth from 1: its one good level
over a child that did not coerce (null)."""


# (depth, nats): refused as "decoding cost exceeds the limit" by the re-skip budget this
# replaced (twice the message plus 64 KiB skipped again), read in 0.16 s before it
REVIEWED = [(3, 100_000), (4, 25_000), (6, 15_000)]


@pytest.mark.parametrize(("depth", "nats"), [(1, 100_000), (2, 100_000), *REVIEWED])
def test_nested_opt_values_that_fail_to_coerce_read_as_null(depth: int, nats: int):
    [reg] = REGISTER.decode_arg(nested_opt_failures(depth, nats))
    assert reg.namespace == "bom"
    assert reg.config == [("k", {"Option": None})]  # the spec's "Coercion" → "Options"


@pytest.mark.parametrize(("depth", "nats"), REVIEWED)
def test_nested_lifted_values_that_fail_to_coerce_read_as_null(depth: int, nats: int):
    assert candid.decode(nested_lift_failures(depth, nats), [LIFTED]) == [LIFTED_NULL]


def _timed(read: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    got = read()
    return got, time.perf_counter() - t


def test_nested_failed_opt_coercions_read_in_linear_time():
    # the review's bomb: 31 levels over 400 KB, 17.75 s when each level skipped its child again
    _, honest_s = _timed(lambda: REGISTER.decode_arg(nested_opt_failures(0, 200_000)))
    got, took = _timed(lambda: REGISTER.decode_arg(nested_opt_failures(31, 200_000)))
    assert got[0].config == [("k", {"Option": None})]
    # alone here: 0.4 s, the honest one 0.3 s; bounded on a busy machine too
    assert took < 3 * honest_s + 0.5, f"{took:.2f} s (honest body {honest_s:.2f} s)"


def test_nested_failed_lifts_read_in_linear_time():
    _, honest_s = _timed(lambda: candid.decode(nested_lift_failures(0, 300_000), [LIFTED]))
    got, took = _timed(lambda: candid.decode(nested_lift_failures(90, 300_000), [LIFTED]))
    assert got == [LIFTED_NULL]
    assert took < 3 * honest_s + 0.5, f"{took:.2f} s (honest body {honest_s:.2f} s)"


def deep_under_family(wraps: int, arrays: int = 60) -> bytes:
    """``wraps`` vectors of one ``opt record { v : <an ICRC-16 value>; tag = #bad }``, with its
    own table (``ZZZ_extra``: a tag ICRC-16 lacks; ``tag : variant { bad; ok }``); the value
    ``#Option(opt #Array[<arrays> nested #Array of #Nat(1)>, #ZZZ_extra])``. Read as
    :func:`deep_under_family_type`, the ``Option`` fails inside ICRC-16's family (whose depth
    counts from 0, one level an ICRC-16 value), then the record (its tag) at depth
    ``wraps``, whose re-skip walks into the value every constructed level counted."""
    u, s = encode_uleb, encode_sleb
    cases = sorted([(idl_hash(n), t) for n, t in [("Array", 1), ("Nat", -3), ("Option", 2)]])
    cases = sorted([*cases, (idl_hash("ZZZ_extra"), -1)])
    tags = sorted([(idl_hash("bad"), -1), (idl_hash("ok"), -1)])
    rec = sorted([(idl_hash("tag"), 4), (idl_hash("v"), 0)])
    table = [
        s(-21) + u(len(cases)) + b"".join(u(h) + s(t) for h, t in cases),  # 0 the value
        s(-19) + s(0),  # 1 vec value
        s(-18) + s(0),  # 2 opt value
        s(-20) + u(2) + b"".join(u(h) + s(t) for h, t in rec),  # 3 the record
        s(-21) + u(2) + b"".join(u(h) + s(t) for h, t in tags),  # 4 the tag
        s(-18) + s(3),  # 5 opt record
    ]
    table += [s(-19) + s(5 + k) for k in range(wraps)]
    tag = {h: u(k) for k, (h, _) in enumerate(cases)}

    def case(name: str) -> bytes:
        return tag[idl_hash(name)]

    a = case("Nat") + b"\x01"
    for _ in range(arrays):
        a = case("Array") + u(1) + a
    v = case("Option") + b"\x01" + case("Array") + u(2) + a + case("ZZZ_extra")
    fields = {idl_hash("tag"): u([h for h, _ in tags].index(idl_hash("bad"))), idl_hash("v"): v}
    value = b"\x01" + b"".join(fields[h] for h, _ in rec)
    for _ in range(wraps):
        value = u(1) + value
    return b"DIDL" + u(len(table)) + b"".join(table) + u(1) + s(5 + wraps) + value


def deep_under_family_type(wraps: int) -> candid.Node:
    t = Types.Opt(Types.Record({"v": icrc16.ICRC16, "tag": Types.Variant({"ok": Types.Null})}))
    for _ in range(wraps):
        t = Types.Vec(t)
    return candid.shaped(t, icrc16.loglake_form)


def test_a_jump_over_a_value_skipped_before_is_too_deep_where_its_walk_was():
    # The Option's content is skipped again at family depth 1 (its 60 arrays then 121 levels
    # deep); the record's re-skip meets it 4 levels below the record, whose depth is `wraps`.
    # Walked again (before), 75 wraps went past MAX_NESTING: the jump is refused there too.
    for wraps in (0, 74):
        want: Any = []
        for _ in range(wraps):
            want = [want]
        assert candid.decode(deep_under_family(wraps), [deep_under_family_type(wraps)]) == [want]
    for wraps in (75, 90):
        with pytest.raises(candid.CandidError, match="nested deeper than 200"):
            candid.decode(deep_under_family(wraps), [deep_under_family_type(wraps)])


@pytest.mark.parametrize("nats", [10_000, 10_001])
def test_the_record_of_re_skips_is_per_message(nats: int):
    # messages alike but for where each level ends, one after another and on two threads
    bodies = [nested_opt_failures(2, nats), nested_opt_failures(2, nats + 7)] * 10
    with ThreadPoolExecutor(2) as pool:
        for got in pool.map(REGISTER.decode_arg, bodies):
            assert got[0].config == [("k", {"Option": None})]
    lifts = [nested_lift_failures(3, nats), nested_lift_failures(3, nats + 7)] * 10
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda b: candid.decode(b, [LIFTED]), lifts)) == [[LIFTED_NULL]] * 20


def _zero_fields(fields: int, items: int) -> bytes:
    """A ``vec record { a : nat8; 1000 : null; …; <999 + fields> : null }`` of ``items``
    items (``a``'s id is 97)."""
    u, s = encode_uleb, encode_sleb
    nulls = b"".join(u(1000 + h) + s(-1) for h in range(fields))
    rec = s(-20) + u(fields + 1) + u(idl_hash("a")) + s(-5) + nulls
    head = b"DIDL" + u(2) + rec + s(-19) + s(0) + u(1) + s(1)
    return head + u(items) + b"\x07" * items


def test_zero_sized_fields_cost_no_step_per_value():
    body = _zero_fields(10_000, 3_000)  # 33 KB: 3.6 s before
    t = time.perf_counter()
    assert candid.decode(body, []) == []  # skipped: an extra argument
    wanted = Types.Vec(Types.Record({"a": Types.Nat8}))
    assert candid.decode(body, [wanted]) == [[{"a": 7}] * 3_000]  # the nulls are extra fields
    took = time.perf_counter() - t
    assert took < 0.5, f"{took:.1f} s for a {len(body)} byte body"


def _nested_empty_records(levels: int) -> bytes:
    """An argument of type ``record { 0 : record { 0 : … record {} } }``, ``levels`` deep, and
    ``record { 0 : <that>; 1 : nat8 }`` around it; no value bytes but the ``nat8``."""
    u, s = encode_uleb, encode_sleb
    table = [s(-20) + u(0)]
    table += [s(-20) + u(1) + u(0) + s(k) for k in range(levels - 1)]
    table.append(s(-20) + u(2) + u(0) + s(levels - 1) + u(1) + s(-5))
    return b"DIDL" + u(len(table)) + b"".join(table) + u(1) + s(len(table) - 1) + b"\x07"


@pytest.mark.parametrize("levels", [candid.MAX_NESTING - 1, candid.MAX_NESTING + 5])
def test_zero_sized_values_are_still_nested_at_most_max_nesting(levels: int):
    body = _nested_empty_records(levels)
    wanted = Types.Record({"_1_": Types.Nat8})
    if levels + 1 > candid.MAX_NESTING + 1:  # the outer record at depth 0, the innermost below
        with pytest.raises(candid.CandidError, match="nested deeper"):
            candid.decode(body, [])
        with pytest.raises(candid.CandidError, match="nested deeper"):
            candid.decode(body, [wanted])
    else:
        assert candid.decode(body, []) == []
        assert candid.decode(body, [wanted]) == [{"_1_": 7}]
