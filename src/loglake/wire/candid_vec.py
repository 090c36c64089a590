"""The Candid codec's batch executor: a long ``vec record`` whose items repeat some fields'
bytes, read as *where each field of each item starts* rather than as an object per item; and
the same for two other long vectors of the replay data plane, a ``vec nat`` and a vector of
items that are each one of two fixed shapes.

Why: a replay batch is thousands of records laid out alike — LEB128 numbers, parts every item
repeats (source, headers, namespace), one value of any length — and a caller that only splices
the items' bytes into another message (a Broadcaster turning ``icrc72_publish`` into
``icrc72_handle_notification``) needs their offsets, not the records. Here the plan's own field
readers read the first item; the other items are then checked field by field against it for
the whole vector at once (numpy, ``candid_batch``'s kernels): repeated fields byte for byte
equal to the first item's (the plan's readers are deterministic, so equal bytes are equal
values), LEB128 numbers and ``opt`` flags as the plan reads them, and the one variable value
either as a ``vec nat8`` variant case (a tag, a length and that many bytes) or by the plan's
reader of that field. Anything the kernels do not cover — or any doubt: a LEB128 of more than 9
octets, an ``opt`` flag above 1, items that do not repeat the first one's parts, bytes left
over, a vector longer than the bytes left — answers None, and the caller runs the plain plan
(``candid.decode``), which accepts or refuses with the typed error. So a kernel never accepts
what the plan refuses, and what it returns is what the plan reads (checked by hypothesis tests
on valid and hostile bytes, and by the differential fuzzer against @dfinity/candid).

The same vectors are written here (:func:`start`, :func:`write_nat_vec`, :func:`write_runs`,
with :func:`write_head` for the fixed bytes of an item): from the plan's own writers — the bytes of
an item's fixed part are what the codec's writer of that item type writes, never spelled out by
the caller — and the numpy kernels of ``candid_batch`` for the numbers of a long vector. What
they write is what ``candid.encode`` writes for the same values (hypothesis tests, and
@dfinity/candid decodes it).

Layout: Candid spec, "Binary format" → "Memory" (``M``): a record is its fields in field-id
order, ``opt`` a flag byte then the value, a variant its index then the value, ``vec nat8`` a
length then the bytes; numbers are LEB128 (at most ``varint.CANDID_MAX_OCTETS`` octets, as the
plan reads them). Only loglake's own header is taken (the caller checks the header's bytes);
another encoder's table goes through the plan with the spec's subtyping.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

import numpy as np
from icp_candid import Types

from loglake.wire import candid
from loglake.wire import candid_batch as kernels
from loglake.wire.varint import CANDID_MAX_OCTETS, decode_candid_uleb

AT_ONCE: Final = 64
"""Vectors of fewer items are walked item by item with the plan's readers: numpy's fixed cost
per call (5–10 µs) would cost a short vector (a live publish of one event) more than the walk."""

ULEB: Final = rb"[\x80-\xff]{0,%d}[\x00-\x7f]" % (CANDID_MAX_OCTETS - 1)
"""One LEB128 number as the plan reads it: at most ``CANDID_MAX_OCTETS`` octets."""

SAME, NAT, OPT_NAT, VALUE = "same", "nat", "opt nat", "value"


@dataclass(frozen=True)
class Field:
    """One field of the record, in wire order: ``kind`` is :data:`SAME` (every item repeats
    the first one's bytes: a field shaped ``repeats``), :data:`NAT`, :data:`OPT_NAT` or
    :data:`VALUE` (anything else: read by the plan's reader)."""

    name: str
    kind: str
    read: candid.Reader


class RecordVec:
    """A ``vec record`` type (a :class:`candid.Node`, loglake's own header) laid out for the
    batch executor: at most one field of :data:`VALUE` kind; ``blob_tags``: the indexes of that
    value's variant cases that are ``vec nat8`` (a ``#Blob`` is checked by its length alone).
    ``same``: fields besides those shaped ``repeats`` that the batches taken repeat in every
    item (a batch that does not is left to the plan)."""

    def __init__(self, vec: candid.Node, same: frozenset[str] = frozenset()) -> None:
        rec = vec.inner
        if vec.op != candid.VEC or rec is None or rec.op != candid.RECORD:
            raise TypeError("a batch executor needs a vec record type")
        self.header = candid.header(vec)
        self.fields: list[Field] = []
        for _, name, n in rec.fields:
            if n.repeats or name in same:
                kind = SAME
            elif n.op == candid.NAT:
                kind = NAT
            elif n.op == candid.OPT and n.inner is not None and n.inner.op == candid.NAT:
                kind = OPT_NAT
            else:
                kind = VALUE
            self.fields.append(Field(name, kind, candid.own_reader(n)))
        values = [k for k, f in enumerate(self.fields) if f.kind == VALUE]
        if len(values) > 1:
            raise TypeError(f"a batch executor reads one value field, not {len(values)}")
        self.value = values[0] if values else None
        self.blob_tags: frozenset[int] = frozenset()
        if self.value is not None:
            v = rec.fields[self.value][2]
            v = v.alias or v
            if v.op == candid.VARIANT:
                self.blob_tags = frozenset(
                    k for k, (_, _, c) in enumerate(v.fields) if c.blob and k < 0x80
                )
        self.column = {f.name: k for k, f in enumerate(self.fields)}


@dataclass
class Run:
    """What :func:`scan` found: ``cols[j][k]`` is where field ``j`` of item ``k`` starts
    (``cols[len(fields)]``: where each item ends); ``first`` the first item's field values as the
    plan reads them; ``nats`` the values of the ``nat`` fields asked for. Columns, not a
    matrix: the kernels make each column once and a caller takes the few it needs."""

    cols: list[np.ndarray]
    first: list[Any]
    nats: dict[str, list[int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.cols[0])

    @property
    def at(self) -> np.ndarray:
        """The offsets as a matrix: row ``k``, column ``j`` (tests, tools)."""
        return np.stack(self.cols, axis=1)


def count(b: bytes, i: int) -> tuple[int, int]:
    """A vector's length at ``i`` and where its items start; a length above the bytes left is
    refused (every item of the vectors read here takes at least one byte)."""
    n, i = decode_candid_uleb(b, i)
    if n > len(b) - i:
        raise candid.CandidError("vector longer than the message")
    return n, i


def scan(layout: RecordVec, b: bytes, want: Sequence[str] = ()) -> Run | None:
    """The items of the vector that follows ``layout.header`` in ``b``, if they repeat the
    first item's :data:`SAME` fields and every byte reads as the plan reads it to the end of
    the message; None otherwise (the plan decides, and reports any damage)."""
    if not b.startswith(layout.header):
        return None
    try:
        n, s0 = count(b, len(layout.header))
        if n == 0:
            return None
        if n < AT_ONCE:
            return _walk_items(layout, b, s0, n, want)
        first = _first(layout, b, s0)
        got = _chained(layout, b, s0, n, first, want)
        if got is None:
            got = _walked(layout, b, s0, n, first, want)
        if got is None:
            return _walk_items(layout, b, s0, n, want)
        return got
    except (ValueError, IndexError, RecursionError):  # the plan reports it
        return None


# --- item by item: the plan's field readers ------------------------------------------------------
def _walk_items(layout: RecordVec, b: bytes, s0: int, n: int, want: Sequence[str]) -> Run | None:
    """Every item read by the plan's field readers, its :data:`SAME` fields compared with the
    first item's bytes."""
    fields = layout.fields
    F = len(fields)
    at = np.empty((n, F + 1), np.int64)
    row = [0] * (F + 1)
    same: list[bytes | None] = [None] * F
    first: list[Any] = []
    keep = [f.name in want for f in fields]
    nats: dict[str, list[int]] = {name: [] for name in want}
    i = s0
    for k in range(n):
        for j, f in enumerate(fields):
            row[j] = i
            enc = same[j]
            if enc is not None:
                if not b.startswith(enc, i):
                    return None
                i += len(enc)
                continue
            v, nxt = f.read(b, i, 0)
            if keep[j]:
                nats[f.name].append(v)
            if k == 0:
                first.append(v)
                if f.kind == SAME:
                    same[j] = b[i:nxt]
            i = nxt
        row[F] = i
        at[k] = row
    if i != len(b):
        return None
    return Run([at[:, j] for j in range(F + 1)], first, nats)


@dataclass(frozen=True)
class _First:
    """The first item: its field values, where each field starts (and the item ends), and the
    bytes of each :data:`SAME` field."""

    values: list[Any]
    at: list[int]
    enc: dict[int, bytes]


def _first(layout: RecordVec, b: bytes, i: int) -> _First:
    at, vals = [], []
    for f in layout.fields:
        at.append(i)
        v, i = f.read(b, i, 0)
        vals.append(v)
    at.append(i)
    enc = {j: b[at[j] : at[j + 1]] for j, f in enumerate(layout.fields) if f.kind == SAME}
    return _First(vals, at, enc)


# --- the whole vector at once -------------------------------------------------------------------
def _forward(
    layout: RecordVec,
    buf: np.ndarray,
    first: _First,
    fields: range,
    at: np.ndarray,
    cols: list[Any],
    want: Sequence[str],
    nats: dict[str, list[int]],
) -> np.ndarray | None:
    """From ``at`` (where field ``fields[0]`` of every item starts) over the fields ``fields``,
    none of them the value: each field's starts into ``cols``; where the last one ends, or None
    if some item's bytes do not read so."""
    for j in fields:
        f = layout.fields[j]
        cols[j] = at
        if f.kind == SAME:
            enc = first.enc[j]
            if not kernels.is_at(buf, at, enc):
                return None
            at = at + len(enc)
        elif f.kind == NAT:
            got = kernels.uleb_at(buf, at, f.name in want)
            if got is None:
                return None
            if f.name in want:
                nats[f.name] = got[1].tolist()
            at = at + got[0]
        else:  # OPT_NAT: a flag 0, or 1 and a nat
            flags = buf[at]
            if not _opt_flags(flags):
                return None
            at = at + 1
            has = flags == 1
            if bool(has.any()):
                got = kernels.uleb_at(buf, at[has], False)
                if got is None:
                    return None
                at[has] += got[0]
    return at


def _opt_flags(flags: np.ndarray) -> bool:
    """Every ``opt`` flag is 0 or 1 (Candid spec: ``M(opt)``; anything else is malformed)."""
    return not bool((flags > 1).any())


def _offsets(
    layout: RecordVec,
    b: bytes,
    buf: np.ndarray,
    s0: int,
    D: np.ndarray,
    first: _First,
    want: Sequence[str],
    blob_tag: int | None,
) -> Run | None:
    """Every item's field starts, given where each item's value ends (``D``): the fields after
    it read forward from ``D`` (the last item must end the message), each item's start is the
    previous one's end, and the fields before the value read forward from there. With
    ``blob_tag``, each value is checked to be that ``vec nat8`` case ending exactly at ``D``
    (the guess is then proved by induction from the first item); without, the caller has
    checked the values."""
    v = layout.value
    assert v is not None
    F = len(layout.fields)
    n = len(D)
    cols: list[Any] = [None] * (F + 1)
    nats: dict[str, list[int]] = {}
    E = _forward(layout, buf, first, range(v + 1, F), D, cols, want, nats)
    if E is None or int(E[-1]) != len(b):
        return None
    cols[F] = E
    S = np.empty(n, np.int64)
    S[0] = s0
    S[1:] = E[:-1]
    V = _forward(layout, buf, first, range(v), S, cols, want, nats)
    if V is None:
        return None
    cols[v] = V
    if blob_tag is not None:
        if not bool((buf[V] == blob_tag).all()):
            return None
        got = kernels.uleb_at(buf, V + 1, True)
        if got is None:
            return None
        if not bool((V + 1 + got[0] + got[1].astype(np.int64) == D).all()):
            return None
    return Run(cols, first.values, nats)


def _chained(
    layout: RecordVec, b: bytes, s0: int, n: int, first: _First, want: Sequence[str]
) -> Run | None:
    """Values that are all one ``vec nat8`` case: each item's value end guessed at the first
    item's stride (items as long as the first), else by splitting the message at the bytes of
    the first :data:`SAME` field after the value (if long enough to be rare inside data); the
    guess holds only if :func:`_offsets` proves it."""
    v = layout.value
    if v is None or not layout.blob_tags:
        return None
    tag = b[first.at[v]]
    if tag not in layout.blob_tags:
        return None
    size = len(b)
    buf = np.frombuffer(b + kernels.PAD, np.uint8)
    d0, e0 = first.at[v + 1], first.at[-1]
    D = d0 + np.arange(n, dtype=np.int64) * (e0 - s0)
    if int(D[-1]) < size:
        try:
            got = _offsets(layout, b, buf, s0, D, first, want, tag)
        except IndexError:  # a guess running past the end: not this shape, try the split
            got = None
        if got is not None:
            return got
    after = [first.enc[j] for j in range(v + 1, len(layout.fields)) if j in first.enc]
    if v + 1 not in first.enc or len(after[0]) < 8:
        return None
    sep = after[0]
    pieces = b.split(sep)
    if len(pieces) != n + 1:
        return None
    D = np.cumsum(np.fromiter(map(len, pieces[:n]), np.int64, n))
    D[1:] += np.arange(1, n, dtype=np.int64) * len(sep)
    return _offsets(layout, b, buf, s0, D, first, want, tag)


def _pattern(layout: RecordVec, first: _First, cols: range) -> bytes:
    parts = []
    for j in cols:
        kind = layout.fields[j].kind
        if kind == SAME:
            parts.append(re.escape(first.enc[j]))
        elif kind == NAT:
            parts.append(ULEB)
        else:
            parts.append(rb"(?:\x00|\x01" + ULEB + b")")
    return b"".join(parts)


@lru_cache(maxsize=64)
def _compiled(head: bytes, tail: bytes, blob: bytes) -> tuple[re.Pattern[bytes], ...]:
    """``(first, first_any, step, step_any, last)``: ``first`` reads the first item up to its
    ``vec nat8`` value's length (``first_any``: up to its value, any case), ``step`` an item's
    fields after its value and the next item up to its value's length (``step_any``: up to its
    value), ``last`` the last item's fields after its value, to the end."""
    b = blob + b"(" + ULEB + b")"
    return (
        re.compile(head + b, re.DOTALL),
        re.compile(head, re.DOTALL),
        re.compile(tail + head + b, re.DOTALL),
        re.compile(tail + head, re.DOTALL),
        re.compile(tail, re.DOTALL),
    )


_Match = Callable[[bytes, int], "re.Match[bytes] | None"]


def _walked(
    layout: RecordVec, b: bytes, s0: int, n: int, first: _First, want: Sequence[str]
) -> Run | None:
    """Values of any case: one pattern match per item walks the vector from one value's end
    to the next value (a ``vec nat8`` case by its length, any other by the plan's reader of
    the value), then :func:`_offsets` reads the fields around the values at once."""
    v = layout.value
    if v is None:
        return None
    F = len(layout.fields)
    tag = b[first.at[v]]
    blob = re.escape(bytes([tag])) if tag in layout.blob_tags else b"(?!)"
    pats = _compiled(
        _pattern(layout, first, range(v)), _pattern(layout, first, range(v + 1, F)), blob
    )
    p_first, p_first_any, p_step, p_step_any, p_last = pats
    read = layout.fields[v].read
    got = _value_end(b, s0, p_first.match, p_first_any.match, read)
    if got is None:
        return None
    d = got
    ds = [d]
    add = ds.append
    sm, sam = p_step.match, p_step_any.match
    for _ in range(n - 1):
        got = _value_end(b, d, sm, sam, read)
        if got is None:
            return None
        d = got
        add(d)
    if p_last.fullmatch(b, d) is None:
        return None
    buf = np.frombuffer(b + kernels.PAD, np.uint8)
    return _offsets(layout, b, buf, s0, np.array(ds, np.int64), first, want, None)


def _value_end(b: bytes, i: int, blob: _Match, other: _Match, read: candid.Reader) -> int | None:
    """Where the value after the match at ``i`` ends: ``blob`` matches up to a ``vec nat8``'s
    length (its last group), ``other`` up to any value (read by the plan's reader)."""
    m = blob(b, i)
    if m is not None:
        d = m.end() + decode_candid_uleb(m.group(m.lastindex or 0), 0)[0]
        return d if d <= len(b) else None
    m = other(b, i)
    if m is None:
        return None
    return int(read(b, m.end(), 0)[1])


# --- vec nat ---------------------------------------------------------------------------------
def _after(b: bytes, header: bytes) -> tuple[int, int] | None:
    """The length of the vector after ``header`` and where its items start; None if ``b`` does
    not start with ``header`` or the length does not read (the plan reports it)."""
    if not b.startswith(header):
        return None
    try:
        return count(b, len(header))
    except ValueError:
        return None


def nat_vec(b: bytes, header: bytes) -> list[int] | None:
    """The ``vec nat`` after ``header`` (loglake's own) read at once; None for a short vector
    or anything unusual (a nat of more than 9 octets, malformed bytes): the plan decides."""
    vec = _after(b, header)
    if vec is None or vec[0] < AT_ONCE:
        return None
    n, i = vec
    size = len(b) - i
    body = np.frombuffer(b[i:] + kernels.PAD, np.uint8)
    ends = np.flatnonzero(body[:size] < 0x80)
    if len(ends) != n or ends[-1] != size - 1:
        return None
    starts = np.empty(n, np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    got = kernels.uleb_at(body, starts, True)
    if got is None:
        return None
    return list(got[1].tolist())


# --- a run of one item shape, then a run of another ----------------------------------------------
def runs(b: bytes, header: bytes, head: bytes, tail: bytes) -> tuple[list[bytes], int] | None:
    """The vector after ``header``: items ``head · nat`` (their nats' bytes, in order), then
    items equal to ``tail`` (their number) — e.g. ``Ok([id])``… then ``Err(#Busy)``…; None
    for anything else (the plan decides)."""
    vec = _after(b, header)
    if vec is None:
        return None
    n, i = vec
    whole, each = _runs_patterns(head, tail)
    m = whole.fullmatch(b, i)
    if m is None:
        return None
    nats = each.findall(b, i, m.end(1))  # the head items tile [i, end(1)): one match each
    rest, extra = divmod(len(b) - m.end(1), len(tail))
    if extra or len(nats) + rest != n:
        return None
    return nats, rest


def nat(raw: bytes) -> int:
    """The value of one of the nats :func:`runs` returns (its bytes, bounded as the plan
    bounds them)."""
    return int(decode_candid_uleb(raw, 0)[0])


@lru_cache(maxsize=8)
def _runs_patterns(head: bytes, tail: bytes) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """The whole vector's pattern (group 1: the ``head · nat`` items), and one such item's
    (group 1: its nat)."""
    one = re.escape(head) + ULEB
    whole = re.compile(b"((?:" + one + b")*)(?:" + re.escape(tail) + b")*", re.DOTALL)
    return whole, re.compile(re.escape(head) + b"(" + ULEB + b")", re.DOTALL)


# --- writing: the same vectors, from the plan's own writers -----------------------------------
write_nat: Final = candid.own_writer(Types.Nat)
"""The codec's writer of a ``nat`` (LEB128, checked: an ``int >= 0``)."""


def start(header: bytes, n: int) -> bytearray:
    """``header`` and a vector's length ``n``: a message of one vector argument up to its
    items (Candid spec, ``M(vec)``: the length is a LEB128 as a ``nat`` is)."""
    out = bytearray(header)
    write_nat(n, out)
    return out


def write_head(write: candid.Writer, value: Any, nats: int, out: bytearray) -> None:
    """Append to ``out`` what ``write`` writes for ``value`` but its last ``nats`` nats, which
    ``value`` holds as 0 (one octet each): the fixed part of an item whose last parts are
    numbers, for a caller that writes those numbers itself (kernels, or numbers known only
    later)."""
    at = len(out)
    write(value, out)
    end = len(out) - nats
    if end < at or any(out[end:]):
        del out[at:]
        raise ValueError(f"the value does not end with {nats} nats of 0")
    del out[end:]


def head_of(write: candid.Writer, value: Any, nats: int) -> bytes:
    """:func:`write_head`'s bytes on their own."""
    out = bytearray()
    write_head(write, value, nats, out)
    return bytes(out)


def write_nat_vec(header: bytes, ids: Sequence[Any]) -> bytes | None:
    """The ``vec nat`` message after ``header`` (loglake's own) of a long vector, its LEB128
    numbers written at once; None for a short one or anything unusual (not all ``int`` in
    ``[0, 2**64)``): the codec's writer writes it, and checks it."""
    if not isinstance(ids, list | tuple) or len(ids) < AT_ONCE:
        return None
    arr = kernels.nat_array(ids)
    if arr is None:
        return None
    return bytes(start(header, len(ids))) + b"".join(kernels.rows(len(ids), [("leb", arr)]))


_RUN_KERNEL_NATS: Final = 16
"""Items of more nats than this are written one by one (the kernels build a column per nat)."""


def write_runs(
    header: bytes, head: bytes, first: int, count: int, per: int, tail: bytes, busy: int
) -> bytes:
    """The vector after ``header`` that :func:`runs` reads: ``count`` items ``head · nat ·
    …`` with ``per`` nats each, numbered ``first``, ``first + 1``, … in order, then ``busy``
    items equal to ``tail`` — e.g. ``Ok([id])``… then ``Err(#Busy)``…, ``head`` and ``tail``
    written by the item type's writer (:func:`head_of`)."""
    out = start(header, count + busy)
    last = first + count * per
    if count >= AT_ONCE and 0 < per <= _RUN_KERNEL_NATS and first >= 0 and last < 1 << 63:
        ids = np.arange(count, dtype=np.uint64) * np.uint64(per) + np.uint64(first)
        pieces: list[Any] = [head] + [("leb", ids + np.uint64(j)) for j in range(per)]
        out += b"".join(kernels.rows(count, pieces))
    else:
        for k in range(count):
            out += head
            base = first + k * per
            for x in range(base, base + per):
                write_nat(x, out)
    out += tail * busy
    return bytes(out)
