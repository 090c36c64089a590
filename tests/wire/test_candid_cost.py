"""The Candid decoder's work is bounded by the message's size, whatever its type table.

Found from outside (review of the ICRC-72/77 part): the ``opt`` rule is applied to values, so a
value under an ``opt`` that fails to coerce is read up to the failure, then skipped whole. An
ICRC-16 value sent with a type table of one extra variant tag, nested 31 levels deep as
``#Option(opt #Array[<next level>, #ZZZ_extra])`` over a vector of ``#Nat``, made each level
skip its whole child again: a 400 KB body took 17.75 s (an honest 1 MB one 1.04 s). And a
record's zero-sized fields (``null``, ``reserved``, ``record {}``) cost a step each per value
for no byte: 10,000 of them in a 3,000-item vector, 33 KB, took 3.6 s. dfinity/candid's Rust
decoder bounds the same work (``DecoderConfig::set_skipping_quota``, "Decoding cost exceeds
the limit").
"""

from __future__ import annotations

import time

import pytest
from icp_candid import Types
from icp_candid.candid import idl_hash

from loglake.errors import DecodeError
from loglake.events.codec import METHODS
from loglake.wire import candid
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


def test_nested_failed_opt_coercions_are_refused_in_bounded_time():
    honest = nested_opt_failures(0, 200_000)  # the same vector, no failure: read once
    t = time.perf_counter()
    REGISTER.decode_arg(honest)
    honest_s = time.perf_counter() - t
    body = nested_opt_failures(31, 200_000)  # 400 KB: 17.75 s before, 70 times the honest one
    t = time.perf_counter()
    with pytest.raises(DecodeError, match="decoding cost exceeds the limit"):
        REGISTER.decode_arg(body)
    took = time.perf_counter() - t
    # alone here: 0.35 s, the honest one 0.25 s; bounded on a busy machine too
    assert took < 3 * honest_s + 0.5, f"{took:.2f} s (honest body {honest_s:.2f} s)"


@pytest.mark.parametrize("depth", [1, 2])
def test_an_opt_value_that_fails_to_coerce_still_reads_as_null(depth: int):
    # one failure (or one inside another) skips at most twice the message: read as before
    body = nested_opt_failures(depth, 100_000)
    [reg] = REGISTER.decode_arg(body)
    assert reg.namespace == "bom"
    assert reg.config == [("k", {"Option": None})]


def test_the_budget_is_per_message():
    # many messages each within the budget, one after another on one thread
    body = nested_opt_failures(2, 10_000)
    for _ in range(20):
        assert REGISTER.decode_arg(body)[0].config == [("k", {"Option": None})]


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
