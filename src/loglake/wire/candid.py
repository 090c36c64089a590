"""The one Candid codec: a spec-strict decoder with the spec's subtyping, compiled once per
(wire type table, expected type) pair, and the one encoder.

Why (hand-written): every ICRC-72/77 call's argument and reply is one Candid message. The
runtime loglake depends on for Candid types (icp-py-core's ``icp_candid``) decodes lax where
the spec is strict (an ``opt`` flag of 3 read as "none", bytes left over ignored, type-table
indexes unchecked, a LEB128 read in quadratic time) and at ~28 µs per ICRC-72 event; a second,
fast decoder for loglake's own header and a check in front of icp_candid for every other header
drifted apart (a mutated message accepted by one and refused by the other). Here one decoder
serves every header: the wire type table is read and checked once, then a *plan* — closures
that read exactly the wire types and build exactly the expected type's values — is compiled
for the (wire type table, expected type) pair and cached by the header's bytes. For loglake's
own header the plan reads values with no type checks at all (the wire types *are* the expected
types); for another encoder's table (@dfinity/candid, Motoko, Rust) the same plan applies the
subtyping rules as it is compiled, so the per-value cost stays a closure call.

Rules (Candid spec, "Binary format" → "Deserialisation", and "Coercion"):

- Header: ``DIDL``; the type table holds only constructed types; every type reference is a
  primitive opcode or an index inside the table; record and variant field ids strictly
  increase; service method names strictly increase (sorted, no duplicates), and each method's
  type is a table entry that is a ``func``; a ``func`` has at most one annotation (``query``,
  ``oneway`` or ``composite_query``), and a ``oneway`` one no results.
- Values: ``bool`` is 0 or 1; the ``opt`` flag is 0 or 1; a variant index is below its field
  count; text is UTF-8; a reference (principal, service, func) has flag 1 (loglake never holds
  opaque references); ``empty`` has no value; every byte is consumed (leftover bytes are an
  error).
- Subtyping, applied to the wire type against the expected type: ``nat <: int``; anything
  ``<: reserved`` (read and dropped); a record on the wire may carry fields the expected record
  lacks (read by their wire type and dropped), and an expected field missing from the wire
  reads as null if its type is ``opt``, ``null`` or ``reserved``, else the types do not match;
  a variant value whose tag the expected variant lacks does not match; the ``opt`` rule: under
  an expected ``opt t``, a wire ``null``/``reserved`` reads as null, a wire ``opt t'`` whose
  value does not coerce to ``t`` reads as null, and a wire ``t'`` that is not ``opt``/``null``/
  ``reserved`` reads as ``opt`` of its coercion to ``t`` (or null if it does not coerce) —
  whatever ``t`` is: at ``opt opt t`` it lifts twice, and under an ``opt`` that is ``opt`` all
  the way down (``type Opt = opt Opt``) it is an error, as the reference's tests say. A value that
  does not match anywhere else is an error. Missing trailing arguments of type ``opt``/
  ``null``/``reserved`` read as null; extra arguments are read and dropped.
- loglake's own bounds, where the spec sets none: LEB128 of at most ``varint.CANDID_MAX_OCTETS``;
  at most ``MAX_TYPE_ENTRIES`` table entries; values nested at most ``MAX_NESTING`` deep; no
  ``vec`` of a zero-sized element type (a few bytes could declare 2**60 elements); principals of
  at most ``MAX_PRINCIPAL_BYTES``. Work linear in the message's size: a value that fails to
  coerce under an ``opt`` is skipped again, and nested failures meet the values inner ones
  skipped again instead of walking them again (:class:`_Skips`: no budget, every valid message
  read as the spec says; dfinity/candid's Rust decoder refuses past a fixed skipping quota
  instead); a record's zero-sized fields are skipped at no cost per value.

Where the reference @dfinity/candid (3.4.3, ``idl.js``) differs from the spec, this module
follows the spec and says so: it reads a wire ``nat`` as an expected ``int`` (the reference
refuses), fills a missing record field of type ``null`` (the reference fills only ``opt``
and ``reserved``), reads missing trailing ``opt`` arguments as null (the reference refuses),
checks a ``vec`` of fixed-size ints element type against the wire's (the reference reads
the bytes at the expected width), lifts a value that is not ``opt`` into an ``opt opt t``
(the reference reads it as null, or refuses it if its wire type is constructed), and refuses
a func type in the type table with more than one annotation (as dfinity/candid's Rust decoder
does; the spec is silent) or ``oneway`` with results (the spec forbids it; the reference takes
both). :func:`decode_with_reference_quirks` decodes with those departures, so the differential
fuzzer can tell them from defects.

What icp_candid is still for: its type objects (``Types.Record`` …) are how the ICRC types are
declared (``events/candid_types.py``, ``wire/icrc16.py``); they are converted once into this
module's :class:`Node` graph. Its encoder and decoder are never called at runtime (the tests
use them as a second, independent implementation). The values built are icp_candid's
value form, so the converters of ``events/codec.py`` apply unchanged: records as dicts (tuple
records as lists), ``opt`` as ``[]``/``[v]``, ``vec nat8`` as bytes, principals as
``icp_principal.Principal``, variants as one-key dicts. A slot typed
``icrc16.ICRC16_RAW_AWARE`` whose wire type is exactly ICRC-16's is read — every byte checked —
and returned as an ``icrc16.RawValue`` of its bytes, so whoever passes it on splices it.

A type can be *shaped* instead (:func:`shaped`: the same type table, another Python form), so
the plan builds the caller's objects directly rather than a dict per record to be converted
after: ``opt`` as None or the value, a record as a dataclass or a tuple (:class:`RecordForm`),
a value that every item of a batch repeats read once a message. ICRC-16 values in loglake's
form (``icrc16.VALUE``) and the replay batches as ``Event`` / ``EventNotification``
(``events/fastcodec.py``) are read and written that way: one decoder and one encoder for every
form. A long batch whose items repeat parts is read by this codec's batch executor
(``wire/candid_vec.py``: offsets per item and field, checked at once with the numpy kernels of
``wire/candid_batch.py`` and the plan's own field readers), which leaves any doubt to the plan.

The plan runs over ``bytes`` (a memoryview is copied once on entry): CPython indexes and slices
``bytes`` faster than a memoryview, and every value read from a slice must be copied anyway.
Value layout: Candid spec, "Binary format" → "Memory" (M) encodings.

The encoder (:func:`encode`) writes loglake's own header — the type table laid out as
icp-py-core lays it out, so every message and stored value keeps the bytes it had — then each
value from the same value form, checked as it is written (``icrc16.ICRC16Error``: the caller's
fault). :func:`own_writer` writes one value without the header, for a caller that puts
several in one message (the replay batches' kernels).
"""

from __future__ import annotations

import contextlib
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from icp_candid import candid as C
from icp_principal import Principal

from loglake.wire.varint import (
    VarintError,
    decode_candid_sleb,
    decode_candid_uleb,
    encode_sleb,
    encode_uleb,
)

MAX_TYPE_ENTRIES: Final = 1024
MAX_NESTING: Final = 200
"""Deeper values are refused (ICRC-16 values are bounded at ``icrc16.MAX_DEPTH`` anyway)."""
MAX_PRINCIPAL_BYTES: Final = 29
"""IC interface specification, "Principals": a principal is a blob of at most 29 bytes. The
encoder refuses longer ones (``icrc16.validate``), so the decoder does too: a value that decodes
always encodes again."""
MAX_PLANS: Final = 256
"""Compiled plans kept (by header bytes): a client sending ever new type tables cannot grow
memory; loglake's own headers stay hot."""
# Candid spec, "Binary format" → "Types": the type opcodes (sleb128).
NULL, BOOL, NAT, INT = -1, -2, -3, -4
NAT8, NAT16, NAT32, NAT64 = -5, -6, -7, -8
INT8, INT16, INT32, INT64 = -9, -10, -11, -12
FLOAT32, FLOAT64, TEXT, RESERVED, EMPTY = -13, -14, -15, -16, -17
OPT, VEC, RECORD, VARIANT, FUNC, SERVICE = -18, -19, -20, -21, -22, -23
QUERY, ONEWAY, COMPOSITE_QUERY = 1, 2, 3
"""Func annotations: Candid spec, "Binary format" → "Types": ``T(query) = i8(1)``,
``T(oneway) = i8(2)``, ``T(composite_query) = i8(3)``."""
PRINCIPAL: Final = -24
_PRIMITIVES: Final = frozenset(range(-17, 0)) | {PRINCIPAL}
_STRUCTS: Final = {
    NAT8: struct.Struct("<B"),
    NAT16: struct.Struct("<H"),
    NAT32: struct.Struct("<I"),
    NAT64: struct.Struct("<Q"),
    INT8: struct.Struct("<b"),
    INT16: struct.Struct("<h"),
    INT32: struct.Struct("<i"),
    INT64: struct.Struct("<q"),
    FLOAT32: struct.Struct("<f"),
    FLOAT64: struct.Struct("<d"),
}


class CandidError(ValueError):
    """Bytes that are not a valid Candid message of the expected type; the text says what."""


class _Skips:
    """What the re-skips of one message found: where each value skipped again after a failed
    coercion ends, and how deep its skip went, by (start, wire type) (:func:`_at`).

    Found from outside: the ``opt`` rule is applied to values here, so a value under an ``opt``
    that fails to coerce (the spec's "Coercion" → "Options": null) is read up to the failure,
    then skipped whole; 31 nested ``opt vec {<child>; <a tag the type lacks>}`` levels over a
    vector made each level skip its whole child again — work depth × size, a 400 KB body
    17.75 s (an honest 1 MB one 1.04 s), holding a server's decode thread for every caller. A
    budget on the bytes skipped again (twice the message plus 64 KiB) bounded that, but refused
    valid messages: three such levels over 200 KB, four over 50 KB, six over 30 KB (each read
    as null, 0.16 s, before). Now each re-skip is recorded, and a later re-skip that meets it
    (the failing level around it: the same start and wire type, as a value's start and wire
    type do not depend on who skips it) jumps to its end, so the re-skips of a message walk
    each byte at most once: linear work, every valid message read as before, no budget.
    (dfinity/candid's Rust decoder refuses such messages instead, by a caller's fixed
    ``DecoderConfig::set_skipping_quota``.) ``reach``: the deepest nesting check of the walk
    under way, so a jump is refused exactly where walking the value would have been too deep
    (its depth may differ from the first skip's: readers count a family's levels, skippers
    every level). Memory: an entry per value skipped again, each a value a reader had begun;
    dropped at the thread's next decode."""

    __slots__ = ("ends", "msg", "reach")

    def __init__(self, msg: bytes) -> None:
        self.msg = msg
        self.ends: dict[int, tuple[int, int]] = {}
        """``_at(start, w)`` -> (end, deepest check - depth it was skipped at)."""
        self.reach = _NO_REACH


_NO_REACH: Final = -(1 << 62)
_W_BITS: Final = MAX_TYPE_ENTRIES.bit_length()


def _at(i: int, w: int) -> int:
    """The key of a value of wire type ``w`` (a table index) starting at byte ``i``."""
    return i << _W_BITS | w


class _ThisThread(threading.local):
    """The :class:`_Skips` of the message decoded on this thread, made at its first failed
    coercion: per thread, as the role servers decode on worker threads; per message, as
    :meth:`Plan.run` drops it (one store) and a re-skip checks it is its message's."""

    skips: _Skips | None = None
    elements: int = 1 << 62
    """Elements the ``counted`` vecs of the decode running on this thread may still build
    (:func:`element_budget`)."""


_THIS_THREAD = _ThisThread()


class CandidTooLarge(CandidError):
    """A decode under :func:`element_budget` met more ``vec`` elements than it allows."""


@contextlib.contextmanager
def element_budget(n: int) -> Iterator[None]:
    """Decodes on this thread inside the block build at most ``n`` elements of ``counted``
    vecs together (:class:`Node`); the one past it raises :class:`CandidTooLarge` before
    its vec is built. Why: a vec's length is bounded only by the message's bytes (a byte an
    element), and a few MB of tiny elements decoded into Python objects cost hundreds of MB;
    a caller that shows a value (the console) charges a budget instead. Only graphs whose
    shape marks vecs ``counted`` pay the check (their plans are their own)."""
    before = _THIS_THREAD.elements
    _THIS_THREAD.elements = n
    try:
        yield
    finally:
        _THIS_THREAD.elements = before


def _jump(got: tuple[int, int], d: int, s: _Skips) -> int:
    """A value already re-skipped, met again at depth ``d``: its end, or too deep where its
    walk would have been."""
    end, rel = got
    if d + rel > s.reach:
        s.reach = d + rel
        if s.reach > MAX_NESTING:
            raise _too_deep()
    return end


class _Mismatch(Exception):
    """A value that does not coerce to the expected type (a variant tag the expected variant
    lacks): an ``opt`` above reads it as null (the spec's ``opt`` rule); at the top, an error."""


Reader = Callable[[bytes, int, int], tuple[Any, int]]
"""``(message, offset, depth) -> (value, next offset)``."""
Skipper = Callable[[bytes, int, int], int]
Reskipper = Callable[[bytes, int, int, "_Skips"], int]
"""A skipper that meets the values its message's earlier re-skips recorded (:class:`_Skips`)."""


# --- expected types ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordForm:
    """A record whose Python value is an object, not a dict: ``make`` builds it from the
    fields' values in field-id order, ``take`` gives them back in that order (after checking
    ``type(v) is cls``; a ``tuple`` form takes a list too). How the ICRC dataclasses
    (``Event``, ``Property``, a map's ``(key, value)``) are read and written without a dict
    each and a conversion after."""

    cls: type
    make: Callable[..., Any]
    take: Callable[[Any], Any]


TUPLE: Final = RecordForm(tuple, lambda *a: a, lambda v: v)
"""A tuple record read as a Python ``tuple`` (``icp_candid``'s form is a list)."""


class Node:
    """An expected type: ``op`` is the Candid opcode; constructed types carry their parts.

    The Python form of its values is icp_candid's unless :func:`shaped` says otherwise:
    ``optional`` (an ``opt`` read as None or its value), ``form`` (a record as an object),
    ``repeats`` (a value met again and again in one message, e.g. a batch's namespace: equal
    bytes are not read again, the same object is returned). A *family* (``limit`` on its
    root, ``flat`` on the types below it) counts its own nesting — only the root's levels,
    from 0 where the family is entered — and refuses more than ``limit`` levels, reading and
    writing alike (ICRC-16 values, ``icrc16.MAX_DEPTH``)."""

    __slots__ = (
        "alias",
        "as_tuple",
        "blob",
        "counted",
        "fields",
        "flat",
        "form",
        "inner",
        "limit",
        "op",
        "optional",
        "raw",
        "repeats",
        "splice",
    )

    def __init__(self, op: int) -> None:
        self.op = op
        self.inner: Node | None = None  # opt, vec
        self.fields: list[tuple[int, str, Node]] = []  # record, variant: (hash, name, type)
        self.as_tuple = False  # a record with fields 0..n-1: its value is a list
        self.blob = False  # vec nat8: its value is bytes
        self.counted = False  # a vec whose elements are charged to ``element_budget``
        self.raw = False  # icrc16.ICRC16_RAW_AWARE: kept as bytes when the wire type is exact
        self.alias: Node | None = None  # a raw node: the type it is (one type table entry)
        self.optional = False
        self.form: RecordForm | None = None
        self.repeats = False
        self.limit: int | None = None
        self.flat = False
        self.splice = False  # the writer takes an icrc16.RawValue here (its bytes spliced)

    @property
    def family(self) -> bool:
        return self.flat or self.limit is not None


_NODES: dict[int, tuple[Any, Node]] = {}
_MEMO: dict[int, Node] = {}
_KEPT: list[Any] = []
"""Every type object ``_MEMO`` has an entry for, kept alive: the memo is keyed by ``id``, and a
collected type's id is reused by the next object allocated at its address, which would then
read as the old type (a wrong expected type, seen as a replay that never ended in a long test
run). ``_NODES`` keeps its keys alive the same way."""
"""Every constructed type converted so far, by icp_candid object: one type object is one
:class:`Node` across messages, as it is one type table entry (icp_candid's identity rule)."""


def node(t: Any) -> Node:
    """The :class:`Node` graph of the icp_candid type ``t`` (cached per type object); a
    :class:`Node` (from :func:`shaped`) is itself."""
    if type(t) is Node:
        return t
    got = _NODES.get(id(t))
    if got is None:
        got = _NODES[id(t)] = (t, _convert(t, _MEMO))
    return got[1]


def _convert(t: Any, memo: dict[int, Node]) -> Node:
    if getattr(t, "raw_aware", False):  # icrc16.ICRC16_RAW_AWARE
        inner = _convert(t.get_type(), memo)
        if id(t) not in memo:
            n = memo[id(t)] = Node(inner.op)
            _KEPT.append(t)
            n.inner, n.fields, n.raw, n.alias = inner.inner, inner.fields, True, inner
        return memo[id(t)]
    if isinstance(t, C.RecClass):
        target = t.get_type()
        if id(target) in memo:
            return memo[id(target)]
        return _convert(target, memo)
    if id(t) in memo:
        return memo[id(t)]
    simple = {
        C.NullClass: NULL,
        C.BoolClass: BOOL,
        C.NatClass: NAT,
        C.IntClass: INT,
        C.TextClass: TEXT,
        C.ReservedClass: RESERVED,
        C.EmptyClass: EMPTY,
        C.PrincipalClass: PRINCIPAL,
    }
    for cls, op in simple.items():
        if isinstance(t, cls):
            return Node(op)
    if isinstance(t, C.FixedNatClass):
        return Node({8: NAT8, 16: NAT16, 32: NAT32, 64: NAT64}[t._bits])
    if isinstance(t, C.FixedIntClass):
        return Node({8: INT8, 16: INT16, 32: INT32, 64: INT64}[t._bits])
    if isinstance(t, C.FloatClass):
        return Node(FLOAT32 if t._bits == 32 else FLOAT64)
    if isinstance(t, C.OptClass | C.VecClass):
        n = memo[id(t)] = Node(OPT if isinstance(t, C.OptClass) else VEC)
        _KEPT.append(t)
        n.inner = _convert(t._type, memo)
        n.blob = isinstance(t, C.VecClass) and bool(t._is_blob)
        return n
    if isinstance(t, C.RecordClass | C.VariantClass):
        n = memo[id(t)] = Node(RECORD if isinstance(t, C.RecordClass) else VARIANT)
        _KEPT.append(t)
        n.as_tuple = isinstance(t, C.RecordClass) and bool(t.tryAsTuple())
        n.fields = [
            (h, t._field_map[h][0], _convert(t._field_map[h][1], memo)) for h in t._sorted_hashes
        ]
        return n
    raise TypeError(f"loglake's Candid decoder does not take expected type {t!r}")


def shaped(t: Any, shape: Callable[[Callable[[Any], Node]], None]) -> Node:
    """A new :class:`Node` graph of the icp_candid type ``t`` — the same type table as
    ``node(t)``'s — whose Python form ``shape`` sets on its nodes: it is called with ``find``,
    which gives the node of one of ``t``'s constructed type objects."""
    memo: dict[int, Node] = {}
    root = _convert(t, memo)

    def find(x: Any) -> Node:
        if isinstance(x, C.RecClass) and not getattr(x, "raw_aware", False):
            x = x.get_type()
        return memo[id(x)]

    shape(find)
    return root


def make_family(root: Node, limit: int) -> None:
    """Make ``root`` and every constructed type below it a family (see :class:`Node`)."""
    root.limit = limit
    seen, stack = {id(root)}, [root]
    while stack:
        n = stack.pop()
        for k in [n.inner, n.alias, *(t for _, _, t in n.fields)]:
            if k is not None and k.op not in _PRIMITIVES and id(k) not in seen:
                seen.add(id(k))
                k.flat = True
                stack.append(k)


def _nesting(e: Node) -> tuple[int, int]:
    """``(limit, step)`` of a constructed type's reader and writer: a value deeper than
    ``limit`` is refused, its parts are at ``depth + step``."""
    if e.limit is not None:
        return e.limit, 1
    if e.flat:
        return 1 << 62, 0  # counted by its family's root
    return MAX_NESTING, 1


# --- the header ----------------------------------------------------------------------------------
Entry = tuple[int, Any]
"""(opcode, payload): opt/vec → element ref; record/variant → list of (id, ref); func/service →
None."""


def _leb(data: bytes, i: int, signed: bool = False) -> tuple[int, int]:
    try:
        return (decode_candid_sleb if signed else decode_candid_uleb)(data, i)
    except VarintError as e:
        raise CandidError(f"{'s' if signed else ''}leb128 {e.kind} at byte {e.offset}") from None


def read_header(data: bytes, reference_quirks: bool = False) -> tuple[list[Entry], list[int], int]:
    """The type table, the argument types and where the values start (checked as above).
    ``reference_quirks``: func annotations read as @dfinity/candid reads them
    (:func:`_func_annotations`)."""
    if data[:4] != b"DIDL":
        raise CandidError("not Candid (missing DIDL magic)")
    n, i = _leb(data, 4)
    if n > MAX_TYPE_ENTRIES:
        raise CandidError(f"Candid type table has {n} entries (limit {MAX_TYPE_ENTRIES})")

    def ref(i: int) -> tuple[int, int]:
        t, j = _leb(data, i, True)
        if not (0 <= t < n or t in _PRIMITIVES):
            raise CandidError(f"type reference {t} at byte {i} is out of range")
        return t, j

    def fields(i: int) -> tuple[list[tuple[int, int]], int]:
        k, i = _leb(data, i)
        out: list[tuple[int, int]] = []
        for _ in range(k):
            at = i
            h, i = _leb(data, i)
            if h >= 1 << 32:
                raise CandidError(f"field id {h} at byte {at} is not a 32-bit hash")
            if out and h <= out[-1][0]:
                raise CandidError(f"field ids not strictly increasing at byte {at}")
            t, i = ref(i)
            out.append((h, t))
        return out, i

    table: list[Entry] = []
    methods: list[tuple[bytes, int, int]] = []  # (name, type reference, at byte)
    for _ in range(n):
        at = i
        op, i = _leb(data, i, True)
        if op in (OPT, VEC):
            t, i = ref(i)
            table.append((op, t))
        elif op in (RECORD, VARIANT):
            fs, i = fields(i)
            table.append((op, fs))
        elif op == FUNC:
            for _ in range(2):  # arguments, then results: ``k`` is the results' count
                k, i = _leb(data, i)
                for _ in range(k):
                    _, i = ref(i)
            i = _func_annotations(data, i, k, reference_quirks)
            table.append((op, None))
        elif op == SERVICE:
            k, i = _leb(data, i)
            last: bytes | None = None
            for _ in range(k):
                ln, i = _leb(data, i)
                name = data[i : i + ln]
                if len(name) != ln:
                    raise CandidError("truncated service method name")
                _utf8(name, i)
                if last is not None and name <= last:
                    raise CandidError(f"service methods not strictly increasing at byte {i}")
                last, i = name, i + ln
                t, j = ref(i)
                methods.append((name, t, i))
                i = j
            table.append((op, None))
        else:
            raise CandidError(f"type table entry at byte {at}: opcode {op} is not a constructor")
    for name, t, at in methods:  # once the table is whole: a method may refer ahead
        if t < 0 or table[t][0] != FUNC:
            # spec, "Binary format" → "Types": "The serialised data type representing a method
            # type must denote a function type" (dfinity/candid's Rust decoder: "Method … has a
            # non-function type"; @dfinity/candid: "services can only contain functions")
            raise CandidError(
                f"service method {name.decode()!r} at byte {at}: its type is not a func"
            )
    m, i = _leb(data, i)
    args = []
    for _ in range(m):
        t, i = ref(i)
        args.append(t)
    _check_no_zero_sized_vec(table)
    return table, args, i


def _func_annotations(data: bytes, i: int, results: int, reference_quirks: bool) -> int:
    """Check a func type's annotations at byte ``i`` (the func has ``results`` results);
    returns where they end.

    At most one annotation, its count one byte: the spec's grammar writes ``<funcann>*`` and
    is silent on how many, so this follows dfinity/candid's Rust decoder
    (rust/candid/src/binary_parser.rs ``FuncType``: the count read as a ``u8``, "function
    annotation length should be at most 1"; its type checker says "cannot have more than one
    mode", candid_parser/src/typing.rs). A oneway func has no results: the spec's "The result
    list of a ``oneway`` function must be empty" (the Rust type checker: "oneway function has
    non-unit return type"; its binary decoder does not check). Each annotation is 1, 2 or 3,
    one byte, as the Rust decoder reads it. ``reference_quirks``: @dfinity/candid's reading
    (3.4.3 ``idl.js``: a LEB128 count, any number, results under ``oneway`` unchecked)."""
    if reference_quirks:
        k, i = _leb(data, i)
    else:
        if i >= len(data):
            raise CandidError(f"truncated func type at byte {i}")
        k = data[i]
        if k > 1:
            raise CandidError(
                f"func type at byte {i}: annotation count byte {k:#04x}, at most one annotation"
            )
        i += 1
    for _ in range(k):
        if i >= len(data) or data[i] not in (QUERY, ONEWAY, COMPOSITE_QUERY):
            raise CandidError(f"bad func annotation at byte {i}")
        if data[i] == ONEWAY and results and not reference_quirks:
            raise CandidError(
                f"func type at byte {i}: oneway with {results} result(s); a oneway func has none"
            )
        i += 1
    return i


def _zero_sized(table: list[Entry]) -> dict[int, int]:
    """The wire types whose values take no bytes (``null``, ``reserved``, records of only
    those), each with its *height*: how many record levels deep its values go (0 for the
    primitives). Such a type is never recursive (the fixpoint starts from the primitives)."""
    zero = {NULL: 0, RESERVED: 0}
    changed = True
    while changed:  # records whose fields are all zero-sized (fixpoint over recursion)
        changed = False
        for idx, (op, payload) in enumerate(table):
            if op == RECORD and idx not in zero and all(t in zero for _, t in payload):
                zero[idx] = 1 + max((zero[t] for _, t in payload), default=0)
                changed = True
    return zero


def _check_no_zero_sized_vec(table: list[Entry]) -> None:
    zero = _zero_sized(table)
    for op, payload in table:
        if op == VEC and payload in zero:
            raise CandidError("Candid vec of a zero-sized type is not accepted")


def _utf8(raw: bytes, at: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CandidError(f"text at byte {at} is not UTF-8") from None


# --- primitive readers ---------------------------------------------------------------------------
def _truncated(i: int) -> CandidError:
    return CandidError(f"value truncated at byte {i}")


def _r_null(b: bytes, i: int, d: int) -> tuple[Any, int]:
    return None, i


def _r_bool(b: bytes, i: int, d: int) -> tuple[Any, int]:
    c = b[i]
    if c > 1:
        raise CandidError(f"bool byte {c} at byte {i} (must be 0 or 1)")
    return c == 1, i + 1


def _r_nat(b: bytes, i: int, d: int) -> tuple[Any, int]:
    c = b[i]
    if c < 0x80:
        return c, i + 1
    v, shift, j = c & 0x7F, 7, i + 1
    while j < i + 10:  # up to 2**70 in line (ids, timestamps); longer: the bounded decoder
        c = b[j]
        j += 1
        if c < 0x80:
            return v | c << shift, j
        v |= (c & 0x7F) << shift
        shift += 7
    return _leb(b, i)


def _r_int(b: bytes, i: int, d: int) -> tuple[Any, int]:
    return _leb(b, i, True)


def _r_text(b: bytes, i: int, d: int) -> tuple[Any, int]:
    raw, j = _r_blob(b, i, d)
    try:  # the check in line, not through _utf8: a map's keys are most of its reads
        return str(raw, "utf-8"), j
    except UnicodeDecodeError:
        raise CandidError(f"text at byte {j - len(raw)} is not UTF-8") from None


def _r_blob(b: bytes, i: int, d: int) -> tuple[Any, int]:
    """A length, then that many bytes (``vec nat8``; text before its UTF-8 check)."""
    n = b[i]
    if n < 0x80:
        i += 1
    else:
        n, i = _leb(b, i)
    j = i + n
    if j > len(b):
        raise _truncated(i)
    return b[i:j], j


def _reference(b: bytes, i: int) -> tuple[int, int]:
    """A transparent reference: flag 1, then a length; returns (length, start of the bytes)."""
    if b[i] != 1:
        raise CandidError(f"reference flag {b[i]} at byte {i} (only 1 is accepted)")
    n, j = _leb(b, i + 1)
    if j + n > len(b):
        raise _truncated(j)
    return n, j


def _r_principal(b: bytes, i: int, d: int) -> tuple[Any, int]:
    n, j = _reference(b, i)
    if n > MAX_PRINCIPAL_BYTES:
        raise CandidError(f"principal of {n} bytes at byte {i} (at most 29 bytes)")
    return Principal(b[j : j + n]), j + n


def _r_service(b: bytes, i: int, d: int) -> tuple[Any, int]:
    n, j = _reference(b, i)
    return None, j + n


def _r_func(b: bytes, i: int, d: int) -> tuple[Any, int]:  # flag 1, a service, a method name
    if b[i] != 1:
        raise CandidError(f"func reference at byte {i} must have flag 1")
    n, j = _reference(b, i + 1)
    return None, _r_text(b, j + n, d)[1]


def _r_empty(b: bytes, i: int, d: int) -> tuple[Any, int]:
    raise CandidError("a value of type empty cannot exist")


def _fixed(s: struct.Struct) -> Reader:
    size, unpack = s.size, s.unpack_from

    def read(b: bytes, i: int, d: int) -> tuple[Any, int]:
        if i + size > len(b):
            raise _truncated(i)
        return unpack(b, i)[0], i + size

    return read


def _too_deep(limit: int = MAX_NESTING) -> CandidError:
    return CandidError(f"Candid value nested deeper than {limit}")


# --- the compiler --------------------------------------------------------------------------------
class _Compiler:
    """Plans for one wire type table: ``reader(w, e)`` reads a value of wire type ``w`` as the
    expected :class:`Node` ``e`` (None: the types do not match); ``skipper(w)`` checks and skips
    a value of wire type ``w``."""

    def __init__(self, table: list[Entry], reference_quirks: bool = False) -> None:
        self.table = table
        self.quirks = reference_quirks
        self.in_family = False  # compiling the parts of a family's type (see Node)
        self.entries: dict[tuple[int, int], Reader | None] = {}
        self.readers: dict[tuple[int, int], Reader | None] = {}
        self.skippers: dict[int, Skipper] = {}
        self.later = _Reskippers(self)
        self.wire_nodes: dict[int, Node] = {}
        self.exact: dict[tuple[int, int], bool] = {}
        self.zero = _zero_sized(table)

    # -- skipping a value by its wire type: every byte checked as its own type reads it --
    def skipper(self, w: int) -> Skipper:
        """Why not read and drop: a skipped value (an extra argument, a record field the
        expected type lacks) was built whole first, a dict per record and a list per vec and
        opt: a 0.4 MB argument of ``vec record { opt nat }`` peaked at 99 MB, an 8 MB one
        took 2 GB and 12 s, before any authorization. Composite wire types are skipped here
        without building anything, with the readers' checks and nesting limits."""
        got = self.skippers.get(w)
        if got is not None:
            return got
        slot: list[Skipper] = []

        def lazy(b: bytes, i: int, d: int) -> int:  # a recursive type
            return slot[0](b, i, d)

        self.skippers[w] = lazy
        got = self._skipper(w)
        slot.append(got)
        self.skippers[w] = got
        return got

    def _skipper(self, w: int) -> Skipper:
        if w in self.zero:
            return _skip_zero(self.zero[w])
        if w < 0:
            return self._dropped(w)
        op, payload = self.table[w]
        limit = MAX_NESTING
        if op == OPT:
            inner = self.skipper(payload)

            def opt(b: bytes, i: int, d: int) -> int:
                flag = b[i]
                if flag == 0:
                    return i + 1
                if flag != 1:
                    raise CandidError(f"opt flag {flag} at byte {i} (must be 0 or 1)")
                if d > limit:
                    raise _too_deep(limit)
                return inner(b, i + 1, d + 1)

            return opt
        if op == VEC and payload == NAT8:

            def blob(b: bytes, i: int, d: int) -> int:
                n, i = _leb(b, i)
                if i + n > len(b):
                    raise _truncated(i)
                return i + n

            return blob
        if op == VEC and not (self.quirks and NAT8 >= payload >= INT64):
            elem = self.skipper(payload)

            def vec(b: bytes, i: int, d: int) -> int:
                if d > limit:
                    raise _too_deep(limit)
                n, i = _leb(b, i)
                if n > len(b) - i:  # every element takes a byte (zero-sized: refused)
                    raise CandidError(f"vec of {n} elements in {len(b) - i} bytes: truncated")
                d += 1
                for _ in range(n):
                    i = elem(b, i, d)
                return i

            return vec
        if op == RECORD:
            fields = self._zero_fields([t for _, t in payload])
            fields += [self.skipper(t) for _, t in payload if t not in self.zero]

            def record(b: bytes, i: int, d: int) -> int:
                if d > limit:
                    raise _too_deep(limit)
                d += 1
                for skip in fields:
                    i = skip(b, i, d)
                return i

            return record
        if op == VARIANT:
            cases = [self.skipper(t) for _, t in payload]
            n = len(cases)

            def variant(b: bytes, i: int, d: int) -> int:
                if d > limit:
                    raise _too_deep(limit)
                k, i = _leb(b, i)
                if k >= n:
                    raise CandidError(f"variant index {k} before byte {i} out of range")
                return cases[k](b, i, d + 1)

            return variant
        return self._dropped(w)

    # -- skipping again, after a failed coercion: each byte walked once a message (_Skips) --
    def reskippers(self) -> dict[int, Reskipper]:
        """:meth:`skipper` of every table entry (and of the primitives among their parts),
        through the record of :class:`_Skips`: each constructed value's start is looked up
        (both ``except _Mismatch`` sites record a value by its own start and wire type, and a
        walk meets it there: an ``opt``'s content, a record's field, a variant's case, a
        vector's element). Made in a loop, each entry's parts filled in after: no recursion,
        as it runs from however deep a failure was read."""
        walks: dict[int, Reskipper] = {}
        parts: list[list[Reskipper]] = []
        for w in range(len(self.table)):
            parts.append([])
            walks[w] = self._reskipper(w, parts[-1])
        for w, (op, payload) in enumerate(self.table):
            if op in (OPT, VEC):
                types = [payload]
            elif op == RECORD:
                types = [t for _, t in payload if t not in self.zero]  # _zero_fields: the rest
            elif op == VARIANT:
                types = [t for _, t in payload]
            else:
                types = []
            for t in types:
                if t not in walks:
                    walks[t] = self._walked(t)  # a primitive
                parts[w].append(walks[t])
        return walks

    def _reskipper(self, w: int, parts: list[Reskipper]) -> Reskipper:
        """The same checks, in the same order, as :meth:`_skipper`'s, ``s.reach`` kept;
        ``parts``: the re-skippers of its parts, filled in once every entry has one."""
        op, payload = self.table[w]
        limit = MAX_NESTING
        if w in self.zero:
            return self._walked(w)
        if op == OPT:

            def opt(b: bytes, i: int, d: int, s: _Skips) -> int:
                got = s.ends.get(_at(i, w))
                if got is not None:
                    return _jump(got, d, s)
                flag = b[i]
                if flag == 0:
                    return i + 1
                if flag != 1:
                    raise CandidError(f"opt flag {flag} at byte {i} (must be 0 or 1)")
                if d > limit:
                    raise _too_deep(limit)
                if d > s.reach:
                    s.reach = d
                return parts[0](b, i + 1, d + 1, s)

            return opt
        if op == VEC and payload != NAT8 and not (self.quirks and NAT8 >= payload >= INT64):

            def vec(b: bytes, i: int, d: int, s: _Skips) -> int:
                got = s.ends.get(_at(i, w))
                if got is not None:
                    return _jump(got, d, s)
                if d > limit:
                    raise _too_deep(limit)
                if d > s.reach:
                    s.reach = d
                n, i = _leb(b, i)
                if n > len(b) - i:  # every element takes a byte (zero-sized: refused)
                    raise CandidError(f"vec of {n} elements in {len(b) - i} bytes: truncated")
                d += 1
                elem = parts[0]
                for _ in range(n):
                    i = elem(b, i, d, s)
                return i

            return vec
        if op == RECORD:
            zero = self._zero_fields([t for _, t in payload])
            height = max((self.zero[t] for _, t in payload if t in self.zero), default=0)

            def record(b: bytes, i: int, d: int, s: _Skips) -> int:
                got = s.ends.get(_at(i, w))
                if got is not None:
                    return _jump(got, d, s)
                if d > limit:
                    raise _too_deep(limit)
                d += 1
                for skip_zero in zero:
                    skip_zero(b, i, d)
                deepest = d - 1 + height  # the record at d - 1, its zero fields' below
                if deepest > s.reach:
                    s.reach = deepest
                for skip in parts:
                    i = skip(b, i, d, s)
                return i

            return record
        if op == VARIANT:
            n = len(payload)

            def variant(b: bytes, i: int, d: int, s: _Skips) -> int:
                got = s.ends.get(_at(i, w))
                if got is not None:
                    return _jump(got, d, s)
                if d > limit:
                    raise _too_deep(limit)
                if d > s.reach:
                    s.reach = d
                k, i = _leb(b, i)
                if k >= n:
                    raise CandidError(f"variant index {k} before byte {i} out of range")
                return parts[k](b, i, d + 1, s)

            return variant
        return self._walked(w)

    def _walked(self, w: int) -> Reskipper:
        """A primitive, a zero-sized type, a blob, a reference, quirks' fixed-width vec: walked
        as the plain skipper walks it (never long); only a zero-sized type's records check
        their nesting, its innermost at ``d + height - 1``."""
        plain = self.skipper(w)
        checked = self.zero.get(w, 0) - 1

        def walked(b: bytes, i: int, d: int, s: _Skips) -> int:
            j = plain(b, i, d)
            if checked >= 0 and d + checked > s.reach:
                s.reach = d + checked
            return j

        return walked

    def _zero_fields(self, types: list[int]) -> list[Skipper]:
        """One skipper for all the zero-sized types among a record's fields ``types``, or none.
        Found from outside: a record of 10,000 ``null`` fields and a ``nat8``, in a vector of
        3,000 (a 33 KB extra argument), took 3.6 s, a step per field per item for no byte;
        their values take no bytes and cannot fail, only their nesting is checked."""
        height = max((self.zero[t] for t in types if t in self.zero), default=0)
        return [_skip_zero(height)] if height else []

    def _dropped(self, w: int) -> Skipper:
        """A primitive (its value is small), a reference, quirks' fixed-width vec: read,
        dropped."""
        read = _PRIM_READERS[w] if w < 0 else self.reader(w, self._wire_node(w))
        assert read is not None  # a wire type always reads as itself

        def dropped(b: bytes, i: int, d: int) -> int:
            return read(b, i, d)[1]

        return dropped

    def _wire_node(self, w: int) -> Node:
        """The wire type ``w`` as an expected type (one :class:`Node` per table entry)."""
        if w < 0:
            return Node(w)
        got = self.wire_nodes.get(w)
        if got is not None:
            return got
        op, payload = self.table[w]
        n = self.wire_nodes[w] = Node(op)
        if op in (OPT, VEC):
            n.inner = self._wire_node(payload)
            n.blob = op == VEC and payload == NAT8
        elif op in (RECORD, VARIANT):
            n.fields = [(h, str(h), self._wire_node(t)) for h, t in payload]
        return n

    # -- whether the wire type is exactly the expected one (a RawValue keeps its bytes) --
    def is_exact(self, w: int, e: Node) -> bool:
        key = (w, id(e))
        if key in self.exact:
            return self.exact[key]
        if w < 0:
            return w == e.op and not e.fields and e.inner is None
        self.exact[key] = True  # co-inductive: a cycle that closes is exact
        op, payload = self.table[w]
        if op != e.op:
            same = False
        elif op in (OPT, VEC):
            assert e.inner is not None
            same = self.is_exact(payload, e.inner)
        elif op in (RECORD, VARIANT):
            same = len(payload) == len(e.fields) and all(
                h == eh and self.is_exact(t, et)
                for (h, t), (eh, _, et) in zip(payload, e.fields, strict=True)
            )
        else:
            same = False
        self.exact[key] = same
        return same

    # -- reading a value of wire type w as the expected type e --
    def reader(self, w: int, e: Node) -> Reader | None:
        if e.family and not self.in_family:
            return self._entry(w, e)
        key = (w, id(e))
        if key in self.readers:
            return self.readers[key]
        slot: list[Reader | None] = []

        def lazy(b: bytes, i: int, d: int) -> tuple[Any, int]:
            r = slot[0]
            if r is None:  # a cycle whose types turned out not to match
                raise _Mismatch("a recursive type that does not match")
            return r(b, i, d)

        self.readers[key] = lazy
        outer, self.in_family = self.in_family, e.family
        try:
            r = self._reader(w, e)
        finally:
            self.in_family = outer
        if r is not None and e.repeats:
            r = _repeating(r)
        slot.append(r)
        self.readers[key] = r
        if r is not None:
            _tie(r, lazy, r)
        return r

    def _entry(self, w: int, e: Node) -> Reader | None:
        """Where a family is entered: its nesting counts from 0 (see :class:`Node`)."""
        key = (w, id(e))
        if key not in self.entries:
            self.in_family = True
            try:
                inner = self.reader(w, e)
            finally:
                self.in_family = False
            if inner is None:
                self.entries[key] = None
            else:
                read = inner

                def entry(b: bytes, i: int, d: int) -> tuple[Any, int]:
                    return read(b, i, 0)

                self.entries[key] = entry
        return self.entries[key]

    def _reader(self, w: int, e: Node) -> Reader | None:
        eop = e.op
        if eop == RESERVED:  # t <: reserved: read and dropped
            skip = self.skipper(w)
            return _dropping(skip)
        if eop == OPT:
            return self._opt(w, e)
        if e.raw and self.is_exact(w, e):
            return self._raw(w, e)
        wop = w if w < 0 else self.table[w][0]
        if w < 0 or eop in _PRIMITIVES:
            if w == eop:
                return _PRIM_READERS[w]
            if eop == INT and w == NAT and not self.quirks:  # nat <: int (spec; not agent-js)
                return _r_nat
            return None
        payload = self.table[w][1]
        if eop != wop:
            return None
        if eop == VEC:
            assert e.inner is not None
            if self.quirks and NAT8 >= e.inner.op >= INT64:  # nat8 … int64
                return _vec_at_expected_width(e)
            if e.blob and payload == NAT8:
                return _r_blob
            elem = self.reader(payload, e.inner)
            make = _counted_vec if e.counted else _vec
            return make(elem or _mismatch("vec elements of another type"), *_nesting(e))
        if eop == RECORD:
            return self._record(payload, e)
        if eop == VARIANT:
            return self._variant(payload, e)
        return _r_service if eop == SERVICE else _r_func  # only ever read to be dropped

    def _raw(self, w: int, e: Node) -> Reader:
        from loglake.wire.icrc16 import RawValue

        skip: Skipper
        if e.alias is not None and e.alias.family:  # checked as the family reads it
            read = self.reader(w, e.alias)
            assert read is not None  # the wire type is exactly the alias's

            def skip_family(b: bytes, i: int, d: int) -> int:
                return read(b, i, d)[1]

            skip = skip_family
        else:
            skip = self.skipper(w)

        def raw(b: bytes, i: int, d: int) -> tuple[Any, int]:
            j = skip(b, i, d)
            return RawValue(b[i:j]), j

        return raw

    def _opt(self, w: int, e: Node) -> Reader:
        assert e.inner is not None
        optional = e.optional  # None / the value, else icp_candid's [] / [value]
        wop = w if w < 0 else self.table[w][0]
        if wop in (NULL, RESERVED):  # null <: opt t, reserved: null
            return lambda b, i, d: (None if optional else [], i)
        if wop == OPT:
            wi = self.table[w][1]
            inner = self.reader(wi, e.inner)
            skip = self.skipper(wi)
            later = self.later
            limit, step = _nesting(e)

            def opt(b: bytes, i: int, d: int) -> tuple[Any, int]:
                flag = b[i]
                if flag == 0:
                    return None if optional else [], i + 1
                if flag != 1:
                    raise CandidError(f"opt flag {flag} at byte {i} (must be 0 or 1)")
                if d > limit:
                    raise _too_deep(limit)
                if inner is not None:
                    try:
                        v, j = inner(b, i + 1, d + step)
                        return v if optional else [v], j
                    except _Mismatch:
                        return None if optional else [], later.skip(wi, b, i + 1, d + step)
                # the value does not coerce: null
                return None if optional else [], skip(b, i + 1, d + step)

            return opt
        # the opt rule for a wire type that is not opt/null/reserved: opt of its coercion to the
        # expected content, whatever that is. The spec's premise `not (null <: <t>)` is on the
        # wire type t (Candid spec 0.1.8, "Coercion" → "Options"), so an expected `opt opt t'`
        # lifts twice: dfinity/candid's test/construct.test.did reads `true : bool` at
        # `opt opt bool` as `opt opt true`, and its Rust decoder (`deserialize_option`) lifts
        # whatever the expected content is.
        skip = self.skipper(w)
        if self.quirks and e.inner.op in (NULL, OPT, RESERVED):
            return _no_lift(w, optional, skip)
        if _endless_opt(e):
            return _endless_lift
        inner = self.reader(w, e.inner)
        later = self.later

        def lift(b: bytes, i: int, d: int) -> tuple[Any, int]:
            if inner is not None:
                try:
                    v, j = inner(b, i, d)
                    return v if optional else [v], j
                except _Mismatch:
                    return None if optional else [], later.skip(w, b, i, d)
            return None if optional else [], skip(b, i, d)

        return lift

    def _record(self, wire: list[tuple[int, int]], e: Node) -> Reader | None:
        expected = {h: (name, t) for h, name, t in e.fields}
        steps: list[tuple[str | None, Any]] = []
        extra_zero = [t for h, t in wire if h not in expected and t in self.zero]
        steps += [(None, skip) for skip in self._zero_fields(extra_zero)]  # see _zero_fields
        for h, t in wire:
            if h in expected:
                name, et = expected[h]
                r = self.reader(t, et)
                steps.append((name, r or _mismatch(f"record field {name!r} of another type")))
            elif t not in self.zero:
                steps.append((None, self.skipper(t)))
        on_wire = {h for h, _ in wire}
        defaults: list[tuple[str, Any]] = []
        for h, name, et in e.fields:
            if h not in on_wire:
                if et.op == OPT:
                    defaults.append((name, None if et.optional else []))
                elif et.op == RESERVED or (et.op == NULL and not self.quirks):
                    defaults.append((name, None))  # the spec fills null; agent-js refuses
                else:
                    return _mismatch(f"record field {name!r} missing")
        names = [name for _, name, _ in e.fields]
        limit, step = _nesting(e)
        make: Callable[..., Any] | None = (
            e.form.make if e.form is not None else (lambda *a: list(a)) if e.as_tuple else None
        )
        if all(name is not None for name, _ in steps) and not defaults:
            return _exact_record([r for _, r in steps], names, make, limit, step)

        def subrecord(b: bytes, i: int, d: int) -> tuple[Any, int]:
            if d > limit:
                raise _too_deep(limit)
            out: dict[str, Any] = {}
            d += step
            for name, r in steps:
                if name is None:
                    i = r(b, i, d)
                else:
                    out[name], i = r(b, i, d)
            for name, v in defaults:
                out[name] = [] if v is not None else None  # a fresh list per value
            if make is not None:
                return make(*[out[n] for n in names]), i
            return out, i

        return subrecord

    def _variant(self, wire: list[tuple[int, int]], e: Node) -> Reader:
        expected = {h: (name, t) for h, name, t in e.fields}
        cases: list[tuple[str, Reader]] = []
        for k, (h, t) in enumerate(wire):
            r = None
            if h in expected:
                name, et = expected[h]
                r = self.reader(t, et)
            # a tag the expected variant lacks (or of a type that does not match)
            cases.append((name, r) if r is not None else ("", _lacking(k)))
        n = len(cases)
        limit, step = _nesting(e)

        def variant(b: bytes, i: int, d: int) -> tuple[Any, int]:
            if d > limit:
                raise _too_deep(limit)
            k = b[i]
            i += 1
            if k >= 0x80:  # an index of more than one octet: rare
                k, i = _leb(b, i - 1)
            if k >= n:
                raise CandidError(f"variant index {k} before byte {i} out of range")
            name, r = cases[k]
            v, i = r(b, i, d + step)
            return {name: v}, i

        return variant


class _Reskippers:
    """The re-skippers of one plan (:meth:`_Compiler.reskippers`), compiled at its first
    failed coercion: a plan whose messages never fail one pays nothing for them (a closure a
    failure site, made with every plan, cost a foreign ICRC-16 header's compile 8%)."""

    def __init__(self, comp: _Compiler) -> None:
        self.comp = comp
        self.walks: dict[int, Reskipper] = {}

    def skip(self, w: int, b: bytes, i: int, d: int) -> int:
        """Skip again the value of wire type ``w`` at ``b[i:]`` that did not coerce under an
        ``opt``: jump over the values the message's earlier re-skips recorded, record this
        one. Only the two ``except _Mismatch`` sites call it: the readers and the skippers of a
        message that fails no coercion never look at the record."""
        walk = (self.walks or self.compile())[w]
        s = _THIS_THREAD.skips
        if s is None or s.msg is not b:
            s = _THIS_THREAD.skips = _Skips(b)
        s.reach = _NO_REACH  # a re-skip never runs inside another's walk
        j = walk(b, i, d, s)
        if w >= 0:  # a primitive never fails to coerce (and is never long)
            s.ends[_at(i, w)] = (j, s.reach - d)
        return j

    def compile(self) -> dict[int, Reskipper]:
        with _COMPILING:  # the compiler's caches are not for two threads at once
            if not self.walks:
                walks = self.comp.reskippers()
                for w in list(self.comp.skippers):  # every wire type a site may skip
                    if w not in walks:
                        walks[w] = self.comp._walked(w)
                self.walks = walks  # whole, then published
        return self.walks


_COMPILING = threading.Lock()


def _exact_record(
    readers: list[Reader],
    names: list[str],
    make: Callable[..., Any] | None,
    limit: int,
    step: int,
) -> Reader:
    """A record whose wire fields are exactly the expected ones: a dict, or ``make`` of the
    values (a pair without the call: a map's items are most of an ICRC-16 map's work)."""
    if make is None:
        plain = list(zip(names, readers, strict=True))

        def record(b: bytes, i: int, d: int) -> tuple[Any, int]:
            if d > limit:
                raise _too_deep(limit)
            out = {}
            d += step
            for name, r in plain:
                out[name], i = r(b, i, d)
            return out, i

        return record
    if make is TUPLE.make and len(readers) == 2:
        r0, r1 = readers

        def pair(b: bytes, i: int, d: int) -> tuple[Any, int]:
            if d > limit:
                raise _too_deep(limit)
            d += step
            x, i = r0(b, i, d)
            y, i = r1(b, i, d)
            return (x, y), i

        return pair

    def made(b: bytes, i: int, d: int) -> tuple[Any, int]:
        if d > limit:
            raise _too_deep(limit)
        d += step
        args = []
        for r in readers:
            v, i = r(b, i, d)
            args.append(v)
        return make(*args), i

    return made


def _repeating(read: Reader) -> Reader:
    """``read``, but bytes equal to the last value's in the same message are not read again:
    the same object is returned (a deterministic reader makes equal values of equal bytes;
    a batch repeats its namespace, source and headers in every item)."""
    last: list[tuple[bytes, bytes, Any]] = [(b"", b"", None)]

    def repeating(b: bytes, i: int, d: int) -> tuple[Any, int]:
        msg, raw, v = last[0]
        if msg is b and raw and b.startswith(raw, i):
            return v, i + len(raw)
        v, j = read(b, i, d)
        last[0] = (b, b[i:j], v)
        return v, j

    return repeating


def _endless_opt(e: Node) -> bool:
    """``e`` is ``opt`` all the way down (``type Opt = opt Opt``): a value that is not ``opt``
    never ends lifting into it."""
    seen: set[int] = set()
    n: Node | None = e
    while n is not None and n.op == OPT:
        if id(n) in seen:
            return True
        seen.add(id(n))
        n = n.inner
    return False


def _endless_lift(b: bytes, i: int, d: int) -> tuple[Any, int]:
    """A value that is not ``opt`` under an endless ``opt``: an error, not null, as
    dfinity/candid's test/construct.test.did has it ("opt: parsing (true : bool) at "fix opt"
    fails"; its Rust decoder stops at its recursion limit). A CandidError, so an ``opt``
    above does not read it as null."""
    raise CandidError(f"value at byte {i} lifted into an endless opt type")


def _no_lift(w: int, optional: bool, skip: Skipper) -> Reader:
    """@dfinity/candid's reading of a wire value that is not ``opt``/``null``/``reserved`` at
    ``opt t`` where ``t`` is ``null``/``opt``/``reserved`` (quirks mode only). It puts the
    spec's premise ``not (null <: <t>)`` on the expected content (``OptClass.decodeValue``)
    and skips the value as null; skipping a constructed wire type, it calls the type's
    ``decodeValue`` with itself unwrapped, which ``checkType`` refuses ("type mismatch: type
    on the wire vec int32, expect type vec int32"): an error an ``opt`` above catches as
    null."""
    if w >= 0:
        return _mismatch("@dfinity/candid refuses a wire type as not equal to itself")
    return lambda b, i, d: (None if optional else [], skip(b, i, d))


def _skip_nothing(b: bytes, i: int, d: int) -> int:
    return i


def _skip_zero(height: int) -> Skipper:
    """The skipper of a zero-sized wire type (see :func:`_zero_sized`) of ``height`` record
    levels: nothing to read; too deep where its records, skipped one by one, would be."""
    if height == 0:
        return _skip_nothing
    limit = MAX_NESTING - height + 1

    def zero(b: bytes, i: int, d: int) -> int:
        if d > limit:
            raise _too_deep(MAX_NESTING)
        return i

    return zero


def _lacking(k: int) -> Reader:
    def lacking(b: bytes, i: int, d: int) -> tuple[Any, int]:
        raise _Mismatch(f"variant index {k} before byte {i}: a tag the type lacks")

    return lacking


def _tie(start: Any, lazy: Any, final: Any) -> None:
    """Replace ``lazy`` by ``final`` wherever the readers reachable from ``start`` hold it.

    A recursive type's readers are compiled before their own reader exists, so they hold a
    stand-in (``lazy``, one more call a level: an ICRC-16 value is recursive at every level,
    and the stand-in cost a map about a third of its reading time). Once ``final`` exists the
    knot is tied: every closure cell and list of this module's readers that holds the stand-in
    gets ``final`` instead (closure cells are writable: ``cell_contents``)."""
    seen: set[int] = set()
    stack = [start]
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if type(f) is list:
            for k, x in enumerate(f):
                if x is lazy:
                    f[k] = final
                elif type(x) is tuple and any(y is lazy for y in x):
                    f[k] = tuple(final if y is lazy else y for y in x)
                elif type(x) is tuple or callable(x):
                    stack.append(x)
            continue
        if type(f) is tuple:
            stack.extend(f)
            continue
        if getattr(f, "__module__", None) != __name__ or not getattr(f, "__closure__", None):
            continue
        for cell in f.__closure__:
            try:
                x = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if x is lazy and x is not f:
                cell.cell_contents = final
            elif type(x) in (list, tuple) or callable(x):
                stack.append(x)


def _mismatch(why: str) -> Reader:
    """The reader of a value whose wire type does not coerce to the expected one. Coercion is
    defined on values (Candid spec, "Coercion"), so it fails only when a value is there to
    read: an empty ``vec`` of it coerces, an ``opt`` above reads it as null."""

    def mismatch(b: bytes, i: int, d: int) -> tuple[Any, int]:
        raise _Mismatch(why)

    return mismatch


def _vec_at_expected_width(e: Node) -> Reader:
    """@dfinity/candid's reading of a ``vec`` of fixed-size ints: at the expected element's
    width, whatever the wire's element type (``VecClass.decodeValue``); quirks mode only."""
    assert e.inner is not None
    s = _STRUCTS[e.inner.op]

    def vec(b: bytes, i: int, d: int) -> tuple[Any, int]:
        n, i = _leb(b, i)
        j = i + n * s.size
        if j > len(b):
            raise _truncated(i)
        if e.blob:
            return b[i:j], j
        return [x for (x,) in s.iter_unpack(b[i:j])], j

    return vec


def _vec(elem: Reader, limit: int = MAX_NESTING, step: int = 1) -> Reader:
    def vec(b: bytes, i: int, d: int) -> tuple[Any, int]:
        if d > limit:
            raise _too_deep(limit)
        n = b[i]
        if n < 0x80:
            i += 1
        else:
            n, i = _leb(b, i)
        if n > len(b) - i:  # every element takes a byte (zero-sized: refused)
            raise CandidError(f"vec of {n} elements in {len(b) - i} bytes: truncated")
        out = []
        d += step
        for _ in range(n):
            v, i = elem(b, i, d)
            out.append(v)
        return out, i

    return vec


def _counted_vec(elem: Reader, limit: int = MAX_NESTING, step: int = 1) -> Reader:
    """:func:`_vec` whose elements are charged to this thread's :func:`element_budget`
    before any is built."""

    def vec(b: bytes, i: int, d: int) -> tuple[Any, int]:
        if d > limit:
            raise _too_deep(limit)
        n, i = _leb(b, i)
        if n > len(b) - i:  # every element takes a byte (zero-sized: refused)
            raise CandidError(f"vec of {n} elements in {len(b) - i} bytes: truncated")
        left = _THIS_THREAD.elements - n
        if left < 0:
            raise CandidTooLarge(f"vec of {n} elements at byte {i}: past the element budget")
        _THIS_THREAD.elements = left
        out = []
        d += step
        for _ in range(n):
            v, i = elem(b, i, d)
            out.append(v)
        return out, i

    return vec


# --- whole messages ------------------------------------------------------------------------------
class Plan:
    """The compiled reader of the arguments of one header as the expected types."""

    __slots__ = ("readers", "start")

    def __init__(self, start: int, readers: list[Reader]) -> None:
        self.start = start
        self.readers = readers

    def run(self, data: bytes) -> list[Any]:
        i, out = self.start, []
        # a fresh record of re-skips (the same bytes may be decoded again, under another plan):
        # one store, ~50 ns; a message that failed a coercion stays referenced until this
        # thread's next decode
        _THIS_THREAD.skips = None
        for r in self.readers:
            v, i = r(data, i, 0)
            out.append(v)
        if i != len(data):
            raise CandidError(f"{len(data) - i} bytes left over after the Candid arguments")
        return out


def compile_plan(data: bytes, expected: list[Node], reference_quirks: bool = False) -> Plan:
    """Read and check ``data``'s header, and compile its plan for ``expected``."""
    try:
        return _compile_plan(data, expected, reference_quirks)
    except RecursionError:  # a table of types nested too deep to compile (values never are)
        raise CandidError("Candid types nested deeper than this decoder compiles") from None


def _compile_plan(data: bytes, expected: list[Node], reference_quirks: bool) -> Plan:
    table, args, start = read_header(data, reference_quirks)
    comp = _Compiler(table, reference_quirks)
    readers: list[Reader] = []
    for k, e in enumerate(expected):
        if k >= len(args):  # a missing argument: null if null <: its type
            if e.op not in (OPT, NULL, RESERVED) or reference_quirks:
                raise CandidError(f"argument {k} missing from the Candid message")
            readers.append(_r_missing_opt if e.op == OPT else _r_null)
            continue
        r = comp.reader(args[k], e)
        readers.append(r or _mismatch(f"argument {k} is of another type"))
    for w in args[len(expected) :]:  # extra arguments: checked and dropped
        readers.append(_dropping(comp.skipper(w)))
    del comp.later  # the sites hold it, it holds the compiler: no cycle left for the collector
    return Plan(start, readers)


def _dropping(skip: Skipper) -> Reader:
    def drop(b: bytes, i: int, d: int) -> tuple[Any, int]:
        return None, skip(b, i, d)

    return drop


def _r_missing_opt(b: bytes, i: int, d: int) -> tuple[Any, int]:
    return [], i


_PLANS: dict[tuple[bytes, tuple[int, ...]], tuple[Plan, list[Any]]] = {}


def decode(data: bytes | bytearray | memoryview, types: list[Any]) -> list[Any]:
    """The values of a Candid message as the icp_candid ``types``; :class:`CandidError` if it
    is not one, or its values do not coerce to the types (subtyping as in the docstring)."""
    b = bytes(data)
    expected = [node(t) for t in types]
    ids = tuple(id(e) for e in expected)
    plan: Plan | None = None
    for header, (p, _) in _own_plans(ids, types):
        if b.startswith(header):
            plan = p
            break
    if plan is None:
        table_end = _header_end(b)
        key = (b[:table_end], ids)
        got = _PLANS.get(key)
        if got is None:
            if len(_PLANS) >= MAX_PLANS:
                del _PLANS[next(iter(_PLANS))]
            got = _PLANS[key] = (compile_plan(b, expected), types)
        plan = got[0]
    out = _run(plan, b)
    n = len(types)
    return out[:n]


def decode_with_reference_quirks(data: bytes, types: list[Any]) -> list[Any]:
    """:func:`decode` with @dfinity/candid's six departures from the spec: it refuses a wire
    ``nat`` as an ``int``, a missing record field of type ``null``, and missing trailing
    ``opt`` arguments, it reads a ``vec`` of fixed-size ints at the expected element's
    width without checking the wire's, it does not lift a value that is not ``opt`` into
    an ``opt opt t`` (:func:`_no_lift`), and it takes a func type with several annotations
    or a ``oneway`` one with results (:func:`_func_annotations`). Only for the differential
    fuzzer: a disagreement that vanishes here is one of those documented differences, not a
    defect. Never cached."""
    b = bytes(data)
    plan = compile_plan(b, [node(t) for t in types], reference_quirks=True)
    return _run(plan, b)[: len(types)]


def _run(plan: Plan, b: bytes) -> list[Any]:
    try:
        return plan.run(b)
    except _Mismatch as e:
        raise CandidError(f"not of the expected type: {e}") from None
    except IndexError:
        raise CandidError("value truncated") from None
    except RecursionError:
        raise _too_deep() from None


def _header_end(b: bytes) -> int:
    """Where the values start (the header is checked by :func:`compile_plan` on a miss)."""
    return read_header(b)[2]


_OWN: dict[tuple[int, ...], list[tuple[bytes, tuple[Plan, list[Any]]]]] = {}


def _own_plans(
    ids: tuple[int, ...], types: list[Any]
) -> list[tuple[bytes, tuple[Plan, list[Any]]]]:
    """loglake's own header for ``types`` and its plan, so the common case skips the header
    parse (a ``startswith``)."""
    got = _OWN.get(ids)
    if got is None:
        try:
            head = own_header_of(types)
        except Exception:  # a type icp_candid cannot write a table for: no shortcut
            got = _OWN[ids] = []
            return got
        plan = compile_plan(head, [node(t) for t in types])
        got = _OWN[ids] = [(head, (plan, types))]
    return got


def own_header_of(types: list[Any]) -> bytes:
    """What loglake's encoder writes before the values of ``types``: ``DIDL``, the type table,
    the argument types.

    The table is laid out as icp-py-core and @dfinity/candid lay theirs out (an entry reserved
    for a type when first met, depth first, record and variant fields in id order; one entry
    per type object), so stored values written before this encoder keep their prefix
    (``icrc16.MESSAGE_PREFIX``) byte for byte."""
    index: dict[int, int] = {}
    entries: list[bytes] = []

    def ref(n: Node) -> bytes:
        if n.op in _PRIMITIVES:
            return encode_sleb(n.op)
        n = n.alias or n
        if id(n) not in index:
            index[id(n)] = len(entries)
            entries.append(b"")
            if n.op in (OPT, VEC):
                assert n.inner is not None
                body = encode_sleb(n.op) + ref(n.inner)
            else:
                body = encode_sleb(n.op) + encode_uleb(len(n.fields))
                body += b"".join(encode_uleb(h) + ref(t) for h, _, t in n.fields)
            entries[index[id(n)]] = body
        return encode_sleb(index[id(n)])

    args = b"".join(ref(node(t)) for t in types)
    return b"DIDL" + encode_uleb(len(entries)) + b"".join(entries) + encode_uleb(len(types)) + args


# --- the encoder ---------------------------------------------------------------------------------
class Writer(Protocol):
    """``(value, out, depth=0)``: appends the value's bytes to ``out``."""

    def __call__(self, v: Any, out: bytearray, d: int = 0) -> None: ...


def _bad(what: str, v: Any) -> Exception:
    from loglake.wire.icrc16 import ICRC16Error  # the caller's fault, as icrc16.validate says

    return ICRC16Error(f"{what}, not {v!r:.80}")


def _w_null(v: Any, out: bytearray, d: int = 0) -> None:
    if v is not None:
        raise _bad("a Candid null is None", v)


def _w_bool(v: Any, out: bytearray, d: int = 0) -> None:
    if type(v) is not bool:
        raise _bad("a Candid bool is a bool", v)
    out.append(1 if v else 0)


def _w_nat(v: Any, out: bytearray, d: int = 0) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise _bad("a Candid nat is an int >= 0", v)
    if v < 0x80:
        out.append(v)
    elif v < 0x4000:
        out.append(v & 0x7F | 0x80)
        out.append(v >> 7)
    else:
        out += encode_uleb(v)


def _w_int(v: Any, out: bytearray, d: int = 0) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad("a Candid int is an int", v)
    out += encode_sleb(v)


def _w_text(v: Any, out: bytearray, d: int = 0) -> None:
    if not isinstance(v, str):
        raise _bad("a Candid text is a str", v)
    try:
        b = v.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad("a Candid text is encodable as UTF-8", v) from None
    n = len(b)
    out += _OCTETS[n] if n < 0x80 else encode_uleb(n)
    out += b


_OCTETS: Final = tuple(bytes([k]) for k in range(0x80))
"""The one-octet LEB128 numbers, as bytes."""


def _w_reserved(v: Any, out: bytearray, d: int = 0) -> None:
    return None


def _w_empty(v: Any, out: bytearray, d: int = 0) -> None:
    raise _bad("no value has the Candid type empty", v)


def _w_principal(v: Any, out: bytearray, d: int = 0) -> None:
    if not isinstance(v, Principal) or len(v.bytes) > MAX_PRINCIPAL_BYTES:
        raise _bad("a Candid principal is an icp_principal.Principal of at most 29 bytes", v)
    out.append(1)
    out += encode_uleb(len(v.bytes))
    out += v.bytes


def _w_blob(v: Any, out: bytearray, d: int = 0) -> None:
    if isinstance(v, list | tuple) and all(type(x) is int and 0 <= x < 256 for x in v):
        v = bytes(v)  # a vec nat8 given as numbers
    elif not isinstance(v, bytes | bytearray | memoryview):
        raise _bad("a Candid blob (vec nat8) is bytes", v)
    out += encode_uleb(len(v))
    out += v


def _w_fixed(op: int, s: struct.Struct) -> Writer:
    if op in (FLOAT32, FLOAT64):

        def w_float(v: Any, out: bytearray, d: int = 0) -> None:
            if not isinstance(v, float):  # as icrc16.validate: an int is not taken for one
                raise _bad("a Candid float is a float", v)
            out += s.pack(v)

        return w_float
    bits = s.size * 8
    lo, hi = (0, (1 << bits) - 1) if op >= NAT64 else (-(1 << bits - 1), (1 << bits - 1) - 1)

    def w_fixed(v: Any, out: bytearray, d: int = 0) -> None:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise _bad(f"this Candid number is an int in [{lo}, {hi}]", v)
        out += s.pack(v)

    return w_fixed


_PRIMS: Final[dict[int, tuple[Reader, Writer]]] = {
    NULL: (_r_null, _w_null),
    BOOL: (_r_bool, _w_bool),
    NAT: (_r_nat, _w_nat),
    INT: (_r_int, _w_int),
    TEXT: (_r_text, _w_text),
    RESERVED: (_r_null, _w_reserved),
    EMPTY: (_r_empty, _w_empty),
    PRINCIPAL: (_r_principal, _w_principal),
} | {op: (_fixed(s), _w_fixed(op, s)) for op, s in _STRUCTS.items()}
"""Each primitive type's reader and writer, by opcode."""
_PRIM_READERS: Final = {op: rw[0] for op, rw in _PRIMS.items()}
_PRIM_WRITERS: Final = {op: rw[1] for op, rw in _PRIMS.items()}


def _writer(n: Node, memo: dict[Any, Writer], in_family: bool = False) -> Writer:
    """The writer of values of ``n`` in its Python form (the form the decoder builds),
    checked as they are written."""
    if n.op in _PRIMITIVES:
        return _PRIM_WRITERS[n.op]
    if n.family and not in_family:  # a family entered: its nesting counts from 0
        key = ("entry", id(n))
        if key not in memo:
            inner = _writer(n, memo, True)

            def entry(v: Any, out: bytearray, d: int = 0) -> None:
                inner(v, out, 0)

            memo[key] = entry
        return memo[key]
    if id(n) in memo:
        return memo[id(n)]
    slot: list[Writer] = []

    def recursive(v: Any, out: bytearray, d: int = 0) -> None:  # a recursive type
        slot[0](v, out, d)

    memo[id(n)] = recursive
    w = _compile_writer(n, memo)
    if n.repeats:
        w = _repeating_writer(w)
    slot.append(w)
    memo[id(n)] = w
    _tie(w, recursive, w)
    return w


def _repeating_writer(write: Writer) -> Writer:
    """``write``, but the same object written again into the same message is copied from
    its first bytes (a batch's headers list, shared by its items)."""
    last: list[tuple[Any, Any, bytes]] = [(None, None, b"")]

    def repeating(v: Any, out: bytearray, d: int = 0) -> None:
        o, x, raw = last[0]
        if o is out and x is v:
            out += raw
            return
        at = len(out)
        write(v, out, d)
        last[0] = (out, v, bytes(out[at:]))

    return repeating


def _compile_writer(n: Node, memo: dict[Any, Writer]) -> Writer:
    fam = n.family
    limit, step = _nesting(n)
    if n.raw:
        from loglake.wire.icrc16 import RawValue

        assert n.alias is not None
        value = _writer(n.alias, memo, fam)

        def w_raw(v: Any, out: bytearray, d: int = 0) -> None:
            if type(v) is RawValue:
                out += v.value_bytes  # stored value bytes, spliced
            else:
                value(v, out, d)

        return w_raw
    if n.op == OPT:
        assert n.inner is not None
        inner = _writer(n.inner, memo, fam)
        if n.optional:

            def w_optional(v: Any, out: bytearray, d: int = 0) -> None:
                if v is None:
                    out.append(0)
                else:
                    out.append(1)
                    inner(v, out, d + step)

            return w_optional

        def w_opt(v: Any, out: bytearray, d: int = 0) -> None:
            if not isinstance(v, list | tuple) or len(v) > 1:
                raise _bad("a Candid opt is [] or [value]", v)
            if v:
                out.append(1)
                inner(v[0], out, d + step)
            else:
                out.append(0)

        return w_opt
    if n.op == VEC:
        if n.blob:
            return _w_blob
        assert n.inner is not None
        elem = _writer(n.inner, memo, fam)
        kind = list if fam else list | tuple  # a family's vec is a list (icrc16.validate)

        def w_vec(v: Any, out: bytearray, d: int = 0) -> None:
            if not isinstance(v, kind):
                raise _bad("a Candid vec is a list", v)
            n = len(v)
            if n < 0x80:
                out.append(n)
            else:
                out += encode_uleb(n)
            d += step
            for x in v:
                elem(x, out, d)

        return w_vec
    writers = [_writer(t, memo, fam) for _, _, t in n.fields]
    if n.op == RECORD:
        return _record_writer(n, [name for _, name, _ in n.fields], writers, step)
    tags = {name: (k, w) for k, ((_, name, _), w) in enumerate(zip(n.fields, writers, strict=True))}
    if n.splice:
        from loglake.wire.icrc16 import RawValue

        raw: Any = RawValue
    else:
        raw = None

    def w_variant(v: Any, out: bytearray, d: int = 0) -> None:
        if type(v) is raw:  # stored value bytes, spliced
            out += v.value_bytes
            return
        if d > limit:
            raise _bad(f"a value nested at most {limit} deep", v)
        if not isinstance(v, dict) or len(v) != 1:
            raise _bad("a Candid variant is a one-key dict", v)
        ((tag, x),) = v.items()
        case = tags.get(tag)
        if case is None:
            raise _bad(f"{tag!r} is not a tag of this Candid variant", v)
        k = case[0]
        if k < 0x80:
            out.append(k)
        else:
            out += encode_uleb(k)
        case[1](x, out, d + step)

    return w_variant


def _record_writer(n: Node, names: list[str], writers: list[Writer], step: int) -> Writer:
    """A record from a dict by field name, from a list (a tuple record), or from an object
    (:class:`RecordForm`)."""
    form = n.form
    if form is not None:
        cls, take = form.cls, form.take
        if form is TUPLE and len(writers) == 2:
            w0, w1 = writers

            def w_pair(v: Any, out: bytearray, d: int = 0) -> None:
                if (type(v) is not tuple and type(v) is not list) or len(v) != 2:
                    raise _bad("this Candid pair is a tuple of 2", v)
                d += step
                w0(v[0], out, d)
                w1(v[1], out, d)

            return w_pair

        def w_form(v: Any, out: bytearray, d: int = 0) -> None:
            if type(v) is not cls and not (cls is tuple and type(v) is list):
                raise _bad(f"this Candid record is a {cls.__name__}", v)
            parts = take(v)
            if len(parts) != len(writers):
                raise _bad(f"this Candid record has {len(writers)} fields", v)
            d += step
            for w, x in zip(writers, parts, strict=True):
                w(x, out, d)

        return w_form
    if n.as_tuple:
        order = [int(name) for name in names]  # fields 0..n-1: id order is index order

        def w_tuple(v: Any, out: bytearray, d: int = 0) -> None:
            if not isinstance(v, list | tuple) or len(v) != len(writers):
                raise _bad(f"this Candid tuple is a list of {len(writers)}", v)
            d += step
            for k, w in zip(order, writers, strict=True):
                w(v[k], out, d)

        return w_tuple
    fields = list(zip(names, writers, strict=True))

    def w_record(v: Any, out: bytearray, d: int = 0) -> None:
        if not isinstance(v, dict):
            raise _bad("a Candid record is a dict", v)
        d += step
        for name, w in fields:
            if name not in v:
                raise _bad(f"this Candid record has a field {name!r}", v)
            w(v[name], out, d)

    return w_record


_ENCODERS: dict[tuple[int, ...], tuple[list[Any], bytes, list[Writer]]] = {}


def encode(types: list[Any], values: list[Any]) -> bytes:
    """One Candid message of ``values`` as the icp_candid ``types`` (the one encoder: loglake's
    own header, then each value checked as it is written)."""
    key = tuple(id(t) for t in types)
    got = _ENCODERS.get(key)
    if got is None:
        memo: dict[Any, Writer] = {}
        got = _ENCODERS[key] = (
            list(types),
            own_header_of(types),
            [_writer(node(t), memo) for t in types],
        )
    if len(values) != len(types):
        raise _bad(f"{len(types)} Candid values", values)
    out = bytearray(got[1])
    for w, v in zip(got[2], values, strict=True):
        w(v, out, 0)
    return bytes(out)


def header(t: Any) -> bytes:
    """What loglake's encoder writes before the value of one argument of type ``t``."""
    return own_header_of([t])


def own_reader(t: Any) -> Reader:
    """The reader of a value of ``t`` under loglake's own table (no type checks: exact)."""
    head = header(t)
    table, args, _ = read_header(head)
    r = _Compiler(table).reader(args[0], node(t))
    assert r is not None
    return r


def own_writer(t: Any) -> Writer:
    """The writer of a value of ``t`` (no header: what :func:`encode` writes after
    :func:`header`), for callers that put several values in one message (the replay
    batches)."""
    return _writer(node(t), {})  # every writer's depth defaults to 0
