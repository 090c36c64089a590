"""Batch kernels of the Candid codec (``wire/candid.py``): the small LEB128 fields around each
item of a long ``vec`` written or read for the whole vector at once with numpy.

Why: a replay batch is thousands of records shaped alike — the same LEB128 widths, the same
repeated parts — and one Python call per field and item was the bulk of a hop's time. Here the
fields are *rows* of a byte matrix: written for every item at once (:func:`rows`) and joined
with the items' values (:func:`interleave`), or read at given offsets of a message at once
(:func:`uleb_at`, :func:`is_at`). The codec's plan still reads every value and decides every
doubt: a kernel answers None where a batch is not of its shape. Layout: Candid spec, "Binary
format" (LEB128, ``opt``); the vectorised LEB128 decoders are ``wire.varint``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loglake.wire.varint import decode_uleb_batch, decode_uleb_batch_uniform

_SHIFTS = (7 * np.arange(10)).astype(np.uint64)
_LEB_LIMITS = [1 << (7 * k) for k in range(1, 10)]


def leb_widths(x: np.ndarray) -> np.ndarray:
    """The LEB128 length of each ``uint64`` (1 to 10 bytes)."""
    w = np.ones(len(x), np.int64)
    for limit in _LEB_LIMITS:
        w += x >= limit
    return w


def _put_leb(mat: np.ndarray, col: int, x: np.ndarray, width: int) -> None:
    """Write each ``x`` (all ``width`` bytes long in LEB128) into ``mat[:, col:col+width]``."""
    for j in range(width):
        v = (x >> _SHIFTS[j]) & 0x7F
        mat[:, col + j] = v | 0x80 if j < width - 1 else v


def rows(n: int, pieces: list[Any]) -> list[bytes]:
    """``n`` byte strings, each the concatenation of ``pieces``: ``bytes`` (the same in every
    row), ``("leb", x)`` (row k: LEB128 of ``x[k]``, a ``uint64`` array), ``("opt", x,
    present)`` (``opt nat``: ``\\x01`` + LEB128 of ``x[k]`` where ``present[k]``, else
    ``\\x00``) or ``("copy", buf, starts, widths)`` (row k: ``buf[starts[k]:starts[k] +
    widths[k]]``, ``buf`` a ``uint8`` array)."""
    if n == 0:
        return []
    var: list[np.ndarray] = []
    for p in pieces:
        if type(p) is bytes:
            continue
        if p[0] == "leb":
            var.append(leb_widths(p[1]))
        elif p[0] == "opt":
            var.append(np.where(p[2], 1 + leb_widths(p[1]), 1))
        else:
            var.append(np.asarray(p[3], np.int64))
    if all(bool((w == w[0]).all()) for w in var):
        return _build_rows(pieces, [int(w[0]) for w in var], None, n)
    shapes, group = np.unique(np.stack(var, axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1)
    out = np.empty(n, dtype=object)
    for g, shape in enumerate(shapes.tolist()):
        idx = np.flatnonzero(group == g)
        out[idx] = _build_rows(pieces, shape, idx, len(idx))
    return list(out.tolist())


def _build_rows(
    pieces: list[Any], widths: list[int], idx: np.ndarray | None, m: int
) -> list[bytes]:
    """The rows ``idx`` (None: all) of :func:`rows`, whose variable pieces are ``widths``
    bytes long."""
    total = sum(len(p) for p in pieces if type(p) is bytes) + sum(widths)
    if total == 0:
        return [b""] * m
    mat = np.empty((m, total), np.uint8)
    col = v = 0
    for p in pieces:
        if type(p) is bytes:
            if p:
                mat[:, col : col + len(p)] = np.frombuffer(p, np.uint8)
                col += len(p)
            continue
        w = widths[v]
        v += 1
        kind = p[0]
        if kind == "leb":
            _put_leb(mat, col, p[1] if idx is None else p[1][idx], w)
        elif kind == "opt":
            mat[:, col] = 0 if w == 1 else 1
            if w > 1:
                _put_leb(mat, col + 1, p[1] if idx is None else p[1][idx], w - 1)
        elif w:
            starts = p[2] if idx is None else p[2][idx]
            mat[:, col : col + w] = p[1][starts[:, None] + np.arange(w)]
        col += w
    return list(mat.view(f"V{total}").ravel().tolist())


def interleave(*columns: list[bytes]) -> bytes:
    """``columns[0][0] + columns[1][0] + … + columns[0][1] + …``: the rows joined in order."""
    k = len(columns)
    parts: list[bytes] = [b""] * (k * len(columns[0]))
    for j, c in enumerate(columns):
        parts[j::k] = c
    return b"".join(parts)


def nat_array(xs: Sequence[Any] | np.ndarray) -> np.ndarray | None:
    """``xs`` as a ``uint64`` array if every one is an ``int`` in ``[0, 2**64)``, else None."""
    if isinstance(xs, np.ndarray):
        if xs.dtype.kind == "u" or (xs.dtype.kind == "i" and not bool((xs < 0).any())):
            return xs.astype(np.uint64)
        return None
    if set(map(type, xs)) != {int}:
        return None
    try:
        return np.array(xs, dtype=np.uint64)
    except (OverflowError, ValueError):
        return None


PAD = b"\xff" * 16  # after the message: a LEB128 running into it never ends


def _rows_of(buf: np.ndarray, width: int) -> np.ndarray:
    """Every ``width`` consecutive bytes of ``buf`` as a row (a view: row ``k`` starts at
    offset ``k``)."""
    return np.ndarray((len(buf) - width + 1, width), np.uint8, buffer=buf, strides=(1, 1))


def uleb_at(buf: np.ndarray, at: np.ndarray, values: bool) -> tuple[Any, Any] | None:
    """``(width, value)`` of the LEB128 numbers at ``at`` (``buf`` padded with ``PAD``), read
    by the one vectorised decoder (``wire.varint``): ``width`` an ``int`` when all are as long
    (the usual case, which the scans then step by), else an array; ``value`` None unless
    ``values``. None: a number longer than 9 bytes (the scalar walk decides those)."""
    got = decode_uleb_batch_uniform(buf, at, values)
    if got is not None:
        return None if got[0] > 9 else got
    value, nxt, ok = decode_uleb_batch(buf, at, np.full(len(at), len(buf), np.int64))
    w = nxt - at
    if not bool(ok.all()) or bool((w > 9).any()):
        return None
    return w, (value if values else None)


def is_at(buf: np.ndarray, at: np.ndarray, lit: bytes) -> bool:
    """``lit`` is at every offset ``at``."""
    if not lit:
        return True
    return bool(_rows_of(buf, len(lit))[at].tobytes() == lit * len(at))
