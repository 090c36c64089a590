"""Every Candid decoding path rejects what the Candid spec rejects, whatever the type table.

Messages whose header is not byte for byte loglake's own (another encoder's table: an unused
entry, entries in another order, extra fields, subtypes) took icp_candid's lax path, which
read an ``opt`` flag of 3 as none and accepted leftover bytes. Spec: "Binary format" →
"Deserialisation" (opt flag 0/1, no leftover bytes, field ids strictly increasing, table
entries are constructors, type indexes in range). The same rules on loglake's own header (the
compiled fast path) are checked alongside.
"""

from __future__ import annotations

import pytest
from icp_candid import Types

from loglake.errors import DecodeError
from loglake.wire.icrc16 import candid_decode

OPT_NAT = Types.Opt(Types.Nat)
OWN = b"DIDL\x01\x6e\x7d\x01\x00"  # what loglake's encoder writes for ``opt nat``
FOREIGN = b"DIDL\x02\x6d\x7b\x6e\x7d\x01\x01"  # valid: an unused ``vec nat8`` entry first


@pytest.mark.parametrize("head", [OWN, FOREIGN], ids=["own-table", "foreign-table"])
def test_opt_nat_is_read_under_either_table(head: bytes) -> None:
    assert candid_decode(head + b"\x01\x14", [OPT_NAT]) == [[20]]
    assert candid_decode(head + b"\x00", [OPT_NAT]) == [[]]


@pytest.mark.parametrize("head", [OWN, FOREIGN], ids=["own-table", "foreign-table"])
@pytest.mark.parametrize(
    "body",
    [b"\x03\x14", b"\x02", b"\xff\x14", b"\x01\x14\x00", b"\x00\x00", b"\x01", b""],
    ids=[
        "flag-3",
        "flag-2",
        "flag-ff",
        "leftover-after-some",
        "leftover-after-none",
        "cut",
        "none",
    ],
)
def test_bad_opt_flags_and_leftover_bytes_are_rejected(head: bytes, body: bytes) -> None:
    with pytest.raises(DecodeError):
        candid_decode(head + body, [OPT_NAT])


@pytest.mark.parametrize(
    ("data", "t"),
    [
        (b"DIDL\x01\x6e\x05\x01\x00\x00", OPT_NAT),  # entry refers to type 5 of 1
        (b"DIDL\x01\x6e\x7d\x01\x03\x00", OPT_NAT),  # argument type 3 of 1
        (b"DIDL\x01\x7d\x01\x00\x05", Types.Nat),  # a primitive as a table entry
        (b"DIDL\x01\x6e\x7d\x01\x00", OPT_NAT),  # no value at all
        # record { 1: nat; 0: nat }: field ids must strictly increase
        (b"DIDL\x01\x6c\x02\x01\x7d\x00\x7d\x01\x00\x05\x06", Types.Tuple(Types.Nat, Types.Nat)),
        # record { 0: nat; 0: nat }: a duplicate id
        (b"DIDL\x01\x6c\x02\x00\x7d\x00\x7d\x01\x00\x05\x06", Types.Tuple(Types.Nat, Types.Nat)),
        (b"DIDL\x01\x6d\x7b\x01\x7e\x02", Types.Bool),  # bool 2, foreign table
        # variant { 0: nat } with index 1
        (b"DIDL\x01\x6b\x01\x00\x7d\x01\x00\x01\x05", Types.Variant({"_0_": Types.Nat})),
        (b"DIDL\x01\x6d\x7b\x01\x71\x02\xc3\x28", Types.Text),  # not UTF-8, foreign table
        (b"DIDL\x01\x6d\x7b\x01\x7d" + b"\xff" * 2000 + b"\x01", Types.Nat),  # over the bound
        (b"DIDL\x01\x6d\x7b\x01\x7c" + b"\x80" * 2000 + b"\x00", Types.Int),
        (b"DIDL\x01\x6d\x7b\x01\x68\x00", Types.Principal),  # opaque reference
    ],
    ids=[
        "entry-index",
        "arg-index",
        "primitive-entry",
        "missing-value",
        "fields-unsorted",
        "fields-duplicate",
        "bool-2",
        "variant-index",
        "text-not-utf8",
        "nat-too-long",
        "int-too-long",
        "opaque-principal",
    ],
)
def test_invalid_messages_under_foreign_tables_are_rejected(data: bytes, t: object) -> None:
    with pytest.raises(DecodeError):
        candid_decode(data, [t])


def test_extra_arguments_are_read_and_checked_then_ignored() -> None:
    # two arguments (nat, opt nat) where one is expected: the second must still be valid
    head = b"DIDL\x01\x6e\x7d\x02\x7d\x00"
    assert candid_decode(head + b"\x05\x01\x14", [Types.Nat]) == [5]
    with pytest.raises(DecodeError):
        candid_decode(head + b"\x05\x03\x14", [Types.Nat])


# Service types in the type table (never an ICRC value, but any header may carry one): spec,
# "Binary format" → "Types": methods sorted by name, and "the serialised data type representing
# a method type must denote a function type". Each message's one argument is ``null``.
FUNC = b"\x6a\x00\x00\x00"  # func () -> ()
SERVICES = {
    "method-of-type-nat": b"DIDL\x01\x69\x01\x01m\x7d\x01\x7f",
    "method-of-type-null": b"DIDL\x01\x69\x01\x01m\x7f\x01\x7f",
    "method-of-a-vec-entry": b"DIDL\x02\x69\x01\x01m\x01\x6d\x7d\x01\x7f",
    "method-of-the-service-itself": b"DIDL\x01\x69\x01\x01m\x00\x01\x7f",
    "second-method-not-a-func": b"DIDL\x02\x69\x02\x01a\x01\x01b\x7d" + FUNC + b"\x01\x7f",
    "methods-unsorted": b"DIDL\x02\x69\x02\x01b\x01\x01a\x01" + FUNC + b"\x01\x7f",
    "methods-duplicate": b"DIDL\x02\x69\x02\x01m\x01\x01m\x01" + FUNC + b"\x01\x7f",
}
VALID_SERVICE = b"DIDL\x02\x69\x02\x01a\x01\x01b\x01" + FUNC + b"\x01\x7f"


@pytest.mark.parametrize("data", SERVICES.values(), ids=SERVICES.keys())
def test_a_service_type_whose_methods_are_not_sorted_funcs_is_rejected(data: bytes) -> None:
    with pytest.raises(DecodeError):
        candid_decode(data, [Types.Null])


def test_a_service_type_of_sorted_func_methods_is_accepted() -> None:
    # the method refers ahead to its func (the table is checked whole)
    assert candid_decode(VALID_SERVICE, [Types.Null]) == [None]


# Func types in the type table: at most one annotation (dfinity/candid's Rust decoder,
# binary_parser.rs: "function annotation length should be at most 1", its count one byte; the
# spec's grammar is silent on how many), and a oneway func has no results (spec, "Function
# References" → "Structure": "The result list of a oneway function must be empty"). Each
# message is ``DIDL``, one func entry, one argument of type ``null``.
def _func(args: bytes, rets: bytes, anns: bytes) -> bytes:
    return b"DIDL\x01\x6a" + args + rets + anns + b"\x01\x7f"


NO_ARGS = b"\x00"
ONE_NAT = b"\x01\x7d"
BAD_FUNCS = {
    "query-and-oneway": _func(NO_ARGS, NO_ARGS, b"\x02\x01\x02"),
    "query-and-composite-query": _func(NO_ARGS, ONE_NAT, b"\x02\x01\x03"),
    "query-twice": _func(NO_ARGS, ONE_NAT, b"\x02\x01\x01"),
    "three-annotations": _func(NO_ARGS, NO_ARGS, b"\x03\x01\x02\x03"),
    "count-as-overlong-leb": _func(NO_ARGS, ONE_NAT, b"\x81\x00\x01"),  # 1, in two bytes
    "oneway-with-a-result": _func(NO_ARGS, ONE_NAT, b"\x01\x02"),
    "oneway-with-two-results": _func(ONE_NAT, b"\x02\x7d\x71", b"\x01\x02"),
    "annotation-4": _func(NO_ARGS, NO_ARGS, b"\x01\x04"),
    "annotations-cut": _func(NO_ARGS, NO_ARGS, b"")[:-2],
}
GOOD_FUNCS = {
    "none": _func(NO_ARGS, ONE_NAT, b"\x00"),
    "query": _func(ONE_NAT, ONE_NAT, b"\x01\x01"),
    "oneway-no-results": _func(ONE_NAT, NO_ARGS, b"\x01\x02"),
    "composite-query": _func(NO_ARGS, ONE_NAT, b"\x01\x03"),
}


@pytest.mark.parametrize("data", BAD_FUNCS.values(), ids=BAD_FUNCS.keys())
def test_a_func_type_with_several_annotations_or_a_oneway_with_results_is_rejected(
    data: bytes,
) -> None:
    with pytest.raises(DecodeError):
        candid_decode(data, [Types.Null])


@pytest.mark.parametrize("data", GOOD_FUNCS.values(), ids=GOOD_FUNCS.keys())
def test_a_func_type_with_at_most_one_annotation_is_accepted(data: bytes) -> None:
    assert candid_decode(data, [Types.Null]) == [None]
