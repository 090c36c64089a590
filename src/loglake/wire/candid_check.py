"""Spec-strict check of a whole Candid message against its own wire type table.

Why (hand-written): messages whose header is not byte for byte loglake's own — another
encoder's type table, reordered or extra fields, subtypes — are decoded by icp_candid, which is
lax where the Candid spec is strict: it reads an ``opt`` flag of 3 as "none" (so a replay range
``[10, 20)`` registered as ``[10, null)``), ignores bytes left after the arguments, never checks
type-table indexes or field order, and reads a LEB128 in time quadratic in its length. This
module walks the message once, driven only by the wire type table, and raises
:class:`CandidError` for everything the spec rejects, before icp_candid reads a byte; what it
accepts, icp_candid maps onto the expected type (subtyping).

Rules (Candid spec, "Binary format" → "Serialisation" / "Deserialisation"):
- ``DIDL`` magic; the type table holds only constructed types (opt, vec, record, variant, func,
  service); every type reference is a primitive opcode or an index inside the table;
  record and variant field ids strictly increase; service method names strictly increase.
- Values: ``bool`` is 0 or 1; the ``opt`` flag is 0 or 1; a variant index is below its field
  count; text is UTF-8; a reference (principal, service, func) has flag 1 (loglake never
  holds opaque references); ``empty`` has no value; every byte is consumed ("leftover bytes").
- loglake's own bounds, where the spec sets none: LEB128 of at most
  ``varint.CANDID_MAX_OCTETS``; at most ``MAX_TYPE_ENTRIES`` table entries; values nested at
  most ``MAX_NESTING`` deep; no ``vec`` of a zero-sized element type (a few bytes could declare
  2**60 elements that icp_candid would build one by one; no ICRC type has one).
"""

from __future__ import annotations

from typing import Final, cast

from loglake.wire.varint import VarintError, decode_candid_sleb, decode_candid_uleb

MAX_TYPE_ENTRIES: Final = 1024
MAX_NESTING: Final = 200
"""Deeper values are refused (ICRC-16 values are bounded at ``icrc16.MAX_DEPTH`` anyway)."""

OPT, VEC, RECORD, VARIANT, FUNC, SERVICE = -18, -19, -20, -21, -22, -23
PRINCIPAL: Final = -24
_FIXED: Final = {-5: 1, -6: 2, -7: 4, -8: 8, -9: 1, -10: 2, -11: 4, -12: 8, -13: 4, -14: 8}
_PRIMITIVES: Final = frozenset(range(-17, 0)) | {PRINCIPAL}


class CandidError(ValueError):
    """Bytes that are not a valid Candid message; the text says what and where."""


Entry = tuple[int, object]
"""(opcode, payload): opt/vec → element ref; record/variant → list of (id, ref)."""


def _leb(data: bytes, i: int, signed: bool = False) -> tuple[int, int]:
    try:
        return (decode_candid_sleb if signed else decode_candid_uleb)(data, i)
    except VarintError as e:
        raise CandidError(f"{'s' if signed else ''}leb128 {e.kind} at byte {e.offset}") from None


def read_header(data: bytes) -> tuple[list[Entry], list[int], int]:
    """The type table, the argument types and where the values start."""
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
            for _ in range(2):
                k, i = _leb(data, i)
                for _ in range(k):
                    _, i = ref(i)
            k, i = _leb(data, i)
            for _ in range(k):
                if i >= len(data) or data[i] not in (1, 2, 3):
                    raise CandidError(f"bad func annotation at byte {i}")
                i += 1
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
                _, i = ref(i)
            table.append((op, None))
        else:
            raise CandidError(f"type table entry at byte {at}: opcode {op} is not a constructor")
    m, i = _leb(data, i)
    args = []
    for _ in range(m):
        t, i = ref(i)
        args.append(t)
    _check_no_zero_sized_vec(table)
    return table, args, i


def _check_no_zero_sized_vec(table: list[Entry]) -> None:
    zero = {-1, -16}  # null, reserved
    changed = True
    while changed:  # records whose fields are all zero-sized (fixpoint over recursion)
        changed = False
        for idx, (op, payload) in enumerate(table):
            if op == RECORD and idx not in zero:
                assert isinstance(payload, list)
                if all(t in zero for _, t in payload):
                    zero.add(idx)
                    changed = True
    for op, payload in table:
        if op == VEC and payload in zero:
            raise CandidError("Candid vec of a zero-sized type is not accepted")


def _utf8(raw: bytes, at: int) -> None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CandidError(f"text at byte {at} is not UTF-8") from None


def check_message(data: bytes) -> None:
    """Raise :class:`CandidError` unless ``data`` is one valid Candid message, every byte used."""
    table, args, i = read_header(data)
    end = len(data)

    def take(i: int, n: int) -> int:
        j = i + n
        if j > end:
            raise CandidError(f"value truncated at byte {i}")
        return j

    def reference(i: int) -> int:
        if i >= end:
            raise CandidError(f"value truncated at byte {i}")
        if data[i] != 1:
            raise CandidError(f"reference flag {data[i]} at byte {i} (only 1 is accepted)")
        n, i = _leb(data, i + 1)
        return take(i, n)

    def value(t: int, i: int, depth: int) -> int:
        if depth > MAX_NESTING:
            raise CandidError(f"Candid value nested deeper than {MAX_NESTING}")
        if t < 0:
            if t in (-1, -16):  # null, reserved
                return i
            if t == -2:
                if i >= end:
                    raise CandidError(f"value truncated at byte {i}")
                if data[i] > 1:
                    raise CandidError(f"bool byte {data[i]} at byte {i} (must be 0 or 1)")
                return i + 1
            if t == -3:
                return _leb(data, i)[1]
            if t == -4:
                return _leb(data, i, True)[1]
            if t == -15:
                n, j = _leb(data, i)
                k = take(j, n)
                _utf8(data[j:k], j)
                return k
            if t == -17:
                raise CandidError("a value of type empty cannot exist")
            if t == PRINCIPAL:
                return reference(i)
            return take(i, _FIXED[t])
        op, payload = table[t]
        if op == OPT:
            if i >= end:
                raise CandidError(f"value truncated at byte {i}")
            flag = data[i]
            if flag == 0:
                return i + 1
            if flag != 1:
                raise CandidError(f"opt flag {flag} at byte {i} (must be 0 or 1)")
            return value(payload, i + 1, depth + 1)  # type: ignore[arg-type]
        if op == VEC:
            n, i = _leb(data, i)
            if payload in (-5, -9):  # blob: one byte each
                return take(i, n)
            if n > end - i:  # every element takes at least one byte (zero-sized: refused)
                raise CandidError(f"vec of {n} elements in {end - i} bytes: truncated")
            for _ in range(n):
                i = value(payload, i, depth + 1)  # type: ignore[arg-type]
            return i
        if op == RECORD:
            for _, ft in cast(list[tuple[int, int]], payload):
                i = value(ft, i, depth + 1)
            return i
        if op == VARIANT:
            at = i
            k, i = _leb(data, i)
            if k >= len(payload):  # type: ignore[arg-type]
                raise CandidError(f"variant index {k} at byte {at} out of range")
            return value(payload[k][1], i, depth + 1)  # type: ignore[index]
        if op == SERVICE:
            return reference(i)
        # func: flag 1, a service reference, then a method name
        if i >= end or data[i] != 1:
            raise CandidError(f"func reference at byte {i} must have flag 1")
        i = reference(i + 1)
        n, j = _leb(data, i)
        k = take(j, n)
        _utf8(data[j:k], j)
        return k

    for t in args:
        i = value(t, i, 0)
    if i != end:
        raise CandidError(f"{end - i} bytes left over after the Candid arguments")
