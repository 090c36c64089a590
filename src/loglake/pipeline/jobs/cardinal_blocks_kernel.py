"""Columnar steps of ``cardinal-blocks``' assembler: numpy over a micro-batch's Arrow records.

Why: a micro-batch's records reach the driver as one Arrow table, and a redundant producer
sends every message twice (or more). Opening each envelope in Python and handing every copy to
``assemble_block`` cost most of the job's Python; these kernels find, over the whole column at
once, which records are block messages (and where their key ends) and which records are exact
copies of one another, so Python sees each distinct block message once.

The pure-Python reference is ``Assembler.run_reference`` in ``cardinal_blocks.py`` (one
``open_envelope`` a record); ``tests/pipeline/test_job_cardinal_kernel.py`` checks the two give
equal results, state and rejects on well-formed, copied, corrupt and odd-varint records.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class EnvelopeHeads:
    """Per record of a ``data`` column (envelope ``zigzag-varint(len(key)) key value``)."""

    fast: np.ndarray
    """True where the record is a block message whose varint is the one- or two-octet form
    ``avro.Reader.long`` reads inline (the key then starts at ``vlen``): key type 0-4, at least
    33 key bytes (type + block hash), key inside the record. Every other record (null, short,
    longer varints, other types, a key past the end) goes the reference way, one at a time."""
    vlen: np.ndarray
    """Octets of the varint (1 or 2) where ``fast``."""
    klen: np.ndarray
    """Key length where ``fast``."""


def _binary_buffers(data: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, values, valid) of a binary or large binary array, as numpy."""
    if pa.types.is_binary_view(data.type):
        data = data.cast(pa.large_binary())
    _, off_buf, val_buf = data.buffers()[:3]
    width = np.int64 if pa.types.is_large_binary(data.type) else np.int32
    offsets = np.frombuffer(off_buf, dtype=width)[data.offset : data.offset + len(data) + 1]
    values = (
        np.frombuffer(val_buf, dtype=np.uint8) if val_buf is not None else np.zeros(0, np.uint8)
    )
    valid = (
        np.ones(len(data), dtype=bool)
        if data.null_count == 0
        else np.asarray(data.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    )
    return offsets.astype(np.int64), values, valid


def envelope_heads(data: pa.Array) -> EnvelopeHeads:
    """Where each record's key is, for the block messages the fast path takes (see
    ``EnvelopeHeads.fast``). Mirrors ``avro.Reader.long``'s inline cases exactly: one octet
    below 0x80, or an octet with the high bit then one in 1..0x7F."""
    offsets, values, valid = _binary_buffers(data)
    start, size = offsets[:-1], offsets[1:] - offsets[:-1]
    pad = np.concatenate([values, np.zeros(4, np.uint8)])  # reads past the end stay in bounds
    at = np.where(valid, start, 0)
    b0 = pad[at].astype(np.int64)
    b1 = pad[at + 1].astype(np.int64)
    one = valid & (size >= 1) & (b0 < 0x80)
    two = valid & ~one & (size >= 2) & (b0 >= 0x80) & (b1 > 0) & (b1 < 0x80)
    z = np.where(one, b0, (b0 & 0x7F) | (b1 << 7))
    vlen = np.where(one, 1, np.where(two, 2, 0))
    klen = (z >> 1) ^ -(z & 1)
    kind = pad[np.where(one | two, at + vlen, 0)]
    fast = (one | two) & (klen >= 33) & (vlen + klen <= size) & (kind <= 0x04)
    return EnvelopeHeads(fast, vlen, klen)


def first_copies(
    data: pa.Array, rows: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Of ``rows`` (indexes into ``data``), the one row per distinct ``data`` value that comes
    first by ``order`` (a rank per row of ``rows``, all different); returns (survivors, the
    group of each row of ``rows``), survivor ``g`` being group ``g``'s, so callers can
    aggregate over all copies. Equal envelopes are equal (key, value) pairs, which
    ``assemble_block`` would merge keeping the lowest (source, offset): dropping the others
    first changes nothing it returns."""
    if len(rows) == 0:
        return rows, rows
    ids = pc.dictionary_encode(data.take(pa.array(rows))).indices.to_numpy(zero_copy_only=False)
    ids = ids.astype(np.int64)
    by = np.lexsort((order, ids))  # by group, then by rank
    first = np.ones(len(by), dtype=bool)
    first[1:] = ids[by][1:] != ids[by][:-1]
    return rows[by[first]], ids
