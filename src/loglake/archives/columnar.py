"""WakuMessage records decoded a column at a time: what a Spark job over a community stream
reads of each record (time, topic, payload size), with the layout's own ``decode_record`` as
the authority for any record the vectorised path cannot vouch for.

Why here and not in the job: it is the archives layouts' decoding, testable and benchmarked
without Spark (``tests/archives/test_columnar.py``, ``benchmarks/archives.py --decode``); the
job (``pipeline/jobs/archives_build.py``) only schedules it. Why numpy: one protobuf parse and
one Python ``bytes`` per record was most of each pass's Python time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from loglake.archives.errors import BadRecord
from loglake.archives.layout import Layout, get_layout
from loglake.wire.varint import decode_uleb_batch

try:  # the C kernel (setup.py builds it where a compiler is): the numpy paths are the fallback
    from loglake.archives import _waku  # type: ignore[attr-defined, unused-ignore]
except ImportError:  # pragma: no cover - a build without a C compiler
    _waku = None

if TYPE_CHECKING:
    import pyarrow as pa


NULL_RECORD = "record is null (a null in the column), not a WakuMessage"
"""The error of a null record. Found from outside: a null reached ``decode_record`` and was
a bare ``TypeError`` ("expected bytes, NoneType found") that stopped the whole batch, where any
other record the layout does not take is a ``BadRecord`` of its own row."""


def _nullable(decode: Callable[[bytes], Any]) -> Callable[[bytes | None], Any]:
    """``decode``, with a null record a ``BadRecord`` (``NULL_RECORD``)."""

    def decode_or_null(raw: bytes | None) -> Any:
        if raw is None:
            raise BadRecord(NULL_RECORD)
        return decode(raw)

    return decode_or_null


def decode_all(decode: Callable[[bytes], Any], raws: list[bytes]) -> tuple[list[Any], list[Any]]:
    """``decode`` of every record (the layout's ``decode_record``): a fast path for batches
    without a bad record; otherwise each bad one becomes ``(0, None, raw, 0)`` with its error
    in the second list (None for the good ones)."""
    try:
        return list(map(decode, raws)), []
    except BadRecord:
        msgs: list[Any] = []
        bads: list[str | None] = []
        for raw in raws:
            try:
                msgs.append(decode(raw))
                bads.append(None)
            except BadRecord as e:
                msgs.append((0, None, raw, 0))
                bads.append(str(e))
        return msgs, bads


@dataclass(frozen=True)
class _WakuFields:
    """Where a layout's ``WakuMessage`` keeps what the job needs, read from its descriptor:
    field number → wire type (0 varint, 2 length-delimited), and the roles of the fields."""

    wire: dict[int, int]
    ts: int
    ts_zigzag: bool
    ts_scale: int
    topic: int
    topic_utf8: bool
    cap: tuple[int, ...]
    strings: frozenset[int]
    """Other string fields: their UTF-8 is checked by protobuf, so a record holding one takes
    the slow path."""


@functools.cache
def _waku_fields(layout_name: str) -> _WakuFields:
    """The layout's ``_WakuFields``, read from its descriptor once per process (why cached:
    ``decode_waku_batch`` asks for it every batch; with the kernel's tables, ``_slots``, that
    was 13 µs a batch, 0.3 ms a lake file). Callers only read it."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    from loglake.archives.messages import NS
    from loglake.wire.pb import archives_spec_pb2 as spec_pb
    from loglake.wire.pb import archives_statusgo_pb2 as sg_pb

    spec = layout_name == "spec"
    desc = (spec_pb if spec else sg_pb).WakuMessage.DESCRIPTOR
    length = {FD.TYPE_BYTES, FD.TYPE_STRING}
    varint = {FD.TYPE_UINT32, FD.TYPE_UINT64, FD.TYPE_SINT64, FD.TYPE_BOOL}
    wire: dict[int, int] = {}
    for f in desc.fields:
        if f.type in length:
            wire[f.number] = 2
        elif f.type in varint:
            wire[f.number] = 0
        else:  # pragma: no cover - the schemas hold no other type
            raise TypeError(f"WakuMessage field {f.name} of type {f.type}")
    by = desc.fields_by_name
    topic = by["content_topic" if spec else "topic"].number
    return _WakuFields(
        wire=wire,
        ts=by["timestamp"].number,
        ts_zigzag=by["timestamp"].type == FD.TYPE_SINT64,
        ts_scale=1 if spec else NS,
        topic=topic,
        topic_utf8=by["content_topic" if spec else "topic"].type == FD.TYPE_STRING,
        cap=(by["payload"].number,) if spec else (by["payload"].number, by["sig"].number),
        strings=frozenset(
            f.number for f in desc.fields if f.type == FD.TYPE_STRING and f.number != topic
        ),
    )


@dataclass
class _Columns:
    """What ``decode_waku_batch`` has read of a batch's ``n`` records, per field number: which
    records hold the field, and its value (varint) or its start and length in the batch's
    data buffer (length-delimited)."""

    n: int
    seen: dict[int, np.ndarray] = field(default_factory=dict)
    values: dict[int, np.ndarray] = field(default_factory=dict)
    starts: dict[int, np.ndarray] = field(default_factory=dict)
    lengths: dict[int, np.ndarray] = field(default_factory=dict)

    def store(
        self,
        num: int,
        wire: int,
        rows: np.ndarray,
        m: np.ndarray,
        good: np.ndarray,
        val: np.ndarray,
        start: np.ndarray,
        length: np.ndarray,
    ) -> np.ndarray:
        """Field ``num`` (wire type ``wire``) read this round at positions ``m`` (records
        ``rows[m]``; ``val``, ``start``, ``length`` are the round's arrays): a record that
        already held the field is marked not ``good`` (protobuf keeps the last of a repeated
        field: the slow path decides), the others' value or start and length are kept.
        Returns the positions kept. One step for the uniform-shape and mixed-shape rounds."""
        r = rows[m]
        seen = self.seen.setdefault(num, np.zeros(self.n, dtype=bool))
        dup = seen[r]
        if dup.any():
            good[m[dup]] = False
            m, r = m[~dup], r[~dup]
        seen[r] = True
        if wire == 2:
            self.starts.setdefault(num, np.zeros(self.n, dtype=np.int64))[r] = start[m]
            self.lengths.setdefault(num, np.zeros(self.n, dtype=np.int64))[r] = length[m]
        else:
            self.values.setdefault(num, np.zeros(self.n, dtype=np.uint64))[r] = val[m]
        return m


def decode_waku_batch(
    layout_name: str, column: pa.Array
) -> tuple[np.ndarray, pa.Array, np.ndarray, list[str | None]]:
    """``layout.decode_record`` of every record of an Arrow binary column, vectorised over its
    buffers with numpy (why: one protobuf parse and one Python ``bytes`` per record was most
    of each pass's Python time): (time ns, topic, cap = payload(+sig) size, bad), ``bad``
    empty when every record is good, else one error or None per record (bad rows get time 0).

    The fast path takes records made only of the schema's fields, each at most once, with
    their wire types, in bounds; a record it cannot vouch for (an unknown or repeated field,
    another string field, a missing spec timestamp, an over-long varint, bad UTF-8...) goes
    through ``decode_record`` itself, so the result is the layout's, record for record. The
    topics come dictionary-encoded where the C kernel could (``_topic_codes``), else plain:
    the same values either way. A null is a bad record (``NULL_RECORD``) on every path: the
    fast one reads a null's slot (whatever bytes its offsets span) and does not vouch for
    it, so the C kernel and numpy agree on it as on any record."""
    import pyarrow as pa

    f = _waku_fields(layout_name)
    layout = get_layout(layout_name)
    topic_type = pa.string() if f.topic_utf8 else pa.binary()
    n = len(column)
    if column.type != pa.binary():
        return _decode_slow(layout, column.to_pylist(), topic_type)
    bufs = column.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=column.offset + n + 1)[column.offset :]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    ok, cols = _read_fields(f, data, offs)
    if column.null_count:
        ok &= column.is_valid().to_numpy(zero_copy_only=False)
    for num in f.strings:
        if num in cols.seen:
            ok &= ~cols.seen[num]
    has_ts = cols.seen.get(f.ts, np.zeros(n, dtype=bool))
    raw_ts = cols.values.get(f.ts, np.zeros(n, dtype=np.uint64))
    if f.ts_zigzag:
        ts = (raw_ts >> np.uint64(1)).astype(np.int64) ^ -(raw_ts & np.uint64(1)).astype(np.int64)
        # no timestamp, or one before 1970: BadRecord, named by decode_record
        ok &= has_ts & (ts >= 0)
    else:
        big = raw_ts > np.uint64((2**63 - 1) // f.ts_scale)
        ok &= ~big & (raw_ts != 0)  # no timestamp: BadRecord, named by decode_record
        ts = np.where(big, 0, raw_ts).astype(np.int64) * f.ts_scale
    cap = np.zeros(n, dtype=np.int64)
    for num in f.cap:
        if num in cols.lengths:
            cap += cols.lengths[num]
    t_start = cols.starts.get(f.topic, np.zeros(n, dtype=np.int64))
    t_len = np.where(ok, cols.lengths.get(f.topic, np.zeros(n, dtype=np.int64)), 0)
    coded = _topic_codes(data, t_start, t_len, topic_type)
    if coded is not None:
        topics: pa.Array = coded
    else:
        topics = _topics_plain(data, t_start, t_len, ok, topic_type)
    slow = np.flatnonzero(~ok)
    if not len(slow):
        return ts, topics, cap, []
    bads: list[str | None] = [None] * n
    topic_list = topics.to_pylist()
    decode = _nullable(layout.decode_record)
    for i in slow.tolist():
        raw = column[i].as_py()
        try:
            msg = decode(raw)
        except BadRecord as e:
            bads[i] = str(e)
            ts[i], cap[i], topic_list[i] = 0, 0, None
            continue
        ts[i], topic_list[i], cap[i] = msg[0], msg[1], msg[3]
    if not any(b is not None for b in bads):
        bads = []
    return ts, pa.array(topic_list, type=topic_type), cap, bads


MAX_TAG = 5
"""Octets of a field tag the layout's parser reads (upb: a 32-bit varint, so up to 5 octets,
padded or not); a longer one is a bad record there, so the fast paths do not vouch for it."""
TOPIC_CODES_MAX = 64
"""Distinct topics a batch may hold for ``_topic_codes`` (each record is compared with the one
before it, then with each distinct topic so far): a community has a few content topics."""


def _topic_codes(
    data: np.ndarray, start: np.ndarray, length: np.ndarray, topic_type: pa.DataType
) -> pa.Array | None:
    """The topics ``data[start[i] : start[i] + length[i]]`` dictionary-encoded by the C kernel
    (``_waku.topic_codes``): int32 codes into the distinct values, which alone are checked as
    ``topic_type`` (UTF-8). None where the kernel was not built, the batch holds more than
    ``TOPIC_CODES_MAX`` topics or a topic is not UTF-8: ``_topics_plain`` then.

    Why: a binary array of every record's topic, each value checked as UTF-8, then
    dictionary-encoded for the job's spill (hashing every value again) cost about a tenth of
    the scan's CPU; a batch's records mostly share one topic."""
    import pyarrow as pa

    n = len(start)
    if _waku is None or not n:
        return None
    codes = np.empty(n, dtype=np.int32)
    distinct = _waku.topic_codes(
        data,
        np.ascontiguousarray(start, dtype=np.int64),
        np.ascontiguousarray(length, dtype=np.int64),
        codes,
        TOPIC_CODES_MAX,
    )
    if distinct is None:
        return None
    try:
        values = pa.array(distinct, type=pa.binary()).cast(topic_type)
    except pa.ArrowInvalid:  # a topic that is not UTF-8: its records take the slow path
        return None
    return pa.DictionaryArray.from_arrays(pa.array(codes), values)


def _topics_plain(
    data: np.ndarray,
    t_start: np.ndarray,
    t_len: np.ndarray,
    ok: np.ndarray,
    topic_type: pa.DataType,
) -> pa.Array:
    """Every record's topic as a plain array of ``topic_type`` (``_gather``, then checked as
    UTF-8); a record whose topic is not UTF-8 is marked not ``ok`` (the slow path decides)."""
    import pyarrow as pa

    topic_bin = _gather(data, t_start, t_len)
    topics: pa.Array = topic_bin
    if topic_type == pa.string():
        try:
            topics = topic_bin.cast(pa.string())
        except pa.ArrowInvalid:  # some topic is not UTF-8: those records take the slow path
            py = topic_bin.to_pylist()
            for i, t in enumerate(py):
                try:
                    t.decode()
                except UnicodeDecodeError:
                    ok[i] = False
                    py[i] = b""
            topics = pa.array([t.decode() for t in py], type=pa.string())
    return topics


def _read_fields(f: _WakuFields, data: np.ndarray, offs: np.ndarray) -> tuple[np.ndarray, _Columns]:
    """Every record's fields (``_Columns``) and whether the fast path vouches for it: the C
    kernel (``_waku.fields``) where it was built, else ``_read_fields_numpy`` (the reference;
    the tests hold the two equal)."""
    if _waku is None:
        return _read_fields_numpy(f, data, offs)
    return _read_fields_c(f, data, offs)


def _slots(f: _WakuFields) -> tuple[tuple[int, ...], bytes, bytes]:
    """The schema's field numbers, and the kernel's tables: output slot per field number
    (255: not in the schema), wire type per slot (built once per schema: ``_slot_tables``)."""
    return _slot_tables(tuple(sorted(f.wire.items())))


@functools.cache
def _slot_tables(wire: tuple[tuple[int, int], ...]) -> tuple[tuple[int, ...], bytes, bytes]:
    nums = tuple(num for num, _ in wire)
    slots = bytearray(b"\xff" * 256)
    for k, num in enumerate(nums):
        slots[num] = k
    return nums, bytes(slots), bytes(w for _, w in wire)


def _read_fields_c(
    f: _WakuFields, data: np.ndarray, offs: np.ndarray
) -> tuple[np.ndarray, _Columns]:
    """``_read_fields_numpy`` in one C pass over the records (why: the numpy rounds were
    about a third of the scan's CPU)."""
    assert _waku is not None
    n = len(offs) - 1
    nums, slots, wires = _slots(f)
    ns = len(nums)
    seen = np.empty((n, ns), dtype=np.uint8)
    value = np.empty((n, ns), dtype=np.uint64)
    length = np.empty((n, ns), dtype=np.int64)
    ok = np.empty(n, dtype=np.uint8)
    _waku.fields(
        data, np.ascontiguousarray(offs, dtype=np.int32), slots, wires, seen, value, length, ok
    )
    cols = _Columns(n)
    for k, num in enumerate(nums):
        cols.seen[num] = seen[:, k].astype(bool)
        if f.wire[num] == 2:
            cols.starts[num] = value[:, k].astype(np.int64)
            cols.lengths[num] = length[:, k].copy()
        else:
            cols.values[num] = value[:, k].copy()
    return ok.astype(bool), cols


def _read_fields_numpy(
    f: _WakuFields, data: np.ndarray, offs: np.ndarray
) -> tuple[np.ndarray, _Columns]:
    """The fields of every record read a round at a time, one field of every unfinished record
    per round (numpy over whole arrays): ``(ok, columns)``, ``ok`` False for a record the fast
    path cannot vouch for (an unknown or repeated field, another wire type, an over-long
    varint, a length past the record's end)."""
    n = len(offs) - 1
    pos = offs[:-1].astype(np.int64)
    end = offs[1:].astype(np.int64)
    ok = np.ones(n, dtype=bool)
    cols = _Columns(n)
    rows = np.flatnonzero(pos < end)
    for _ in range(len(f.wire) + 1):  # one field of every unfinished record per round
        if not len(rows):
            break
        er = end[rows]
        tag, p, good = decode_uleb_batch(data, pos[rows], er)
        good &= p - pos[rows] <= MAX_TAG
        val, p2, vok = decode_uleb_batch(data, p, er)  # the value, or the length
        good &= vok
        t0 = int(tag[0])
        if bool((tag == tag[0]).all()):
            # every record holds the same field next (one producer's records mostly have one
            # shape): whole-array operations, no mask per schema field
            num, wt = t0 >> 3, t0 & 7
            if f.wire.get(num) != wt:
                ok[rows] = False  # an unknown field or another wire type: the slow path
                rows = rows[:0]
                break
            if wt == 2:
                over = val > np.uint64(1 << 31)
                ln = np.where(over, np.uint64(0), val).astype(np.int64)
                good &= ~over & (p2 + ln <= er)
            else:
                ln = np.zeros(len(rows), dtype=np.int64)
            cols.store(num, wt, rows, np.flatnonzero(good), good, val, p2, ln)
        else:
            field_no = (tag >> np.uint64(3)).astype(np.int64)
            wtype = (tag & np.uint64(7)).astype(np.int64)
            is_len = wtype == 2
            over = is_len & (val > np.uint64(1 << 31))
            ln = np.where(is_len & ~over, val, np.uint64(0)).astype(np.int64)
            good &= ~(over | (is_len & (p2 + ln > er)))
            matched = np.zeros(len(rows), dtype=bool)
            for num, want in f.wire.items():
                m = np.flatnonzero(good & (field_no == num) & (wtype == want))
                if len(m):
                    matched[cols.store(num, want, rows, m, good, val, p2, ln)] = True
            good &= matched
        ok[rows[~good]] = False
        rows, nxt = rows[good], (p2 + ln)[good]
        pos[rows] = nxt
        rows = rows[nxt < end[rows]]
    ok[rows] = False  # more fields than the schema has: repeated ones
    return ok, cols


def frame_records(column: pa.Array) -> pa.Array | None:
    """Every record of a binary column as the spec layout's archive holds it, ``0x1a
    varint(len) record`` (``frame_parts`` of the records, joined), as one large binary array
    whose data buffer is their concatenation: built by the C kernel in one pass (why: the
    job's scan frames every record it keeps, and the build writes slices of that buffer).
    None where the kernel was not built or the column is not plain binary without nulls:
    the caller frames another way (the pipeline's pyarrow path, or ``frame_parts``)."""
    import pyarrow as pa

    if _waku is None or column.type != pa.binary() or column.null_count:
        return None
    n = len(column)
    bufs = column.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=column.offset + n + 1)[column.offset :]
    data = bufs[2] if bufs[2] is not None else b""
    out = _waku.frame(data, offs)
    if out is None:  # pragma: no cover - pyarrow validates offsets
        return None
    body, body_offs = out
    return pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(body_offs), pa.py_buffer(body)]
    )


def _gather(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> pa.Array:
    """The binary array of ``data[start[i] : start[i] + length[i]]``, built with numpy: when
    every value has one length (a community's few content topics are often alike), one row
    of a strided view per value (no index per byte); otherwise one index per byte."""
    import pyarrow as pa

    n = len(start)
    offs = np.zeros(n + 1, dtype=np.int32)
    if n and int(length.min()) == int(length.max()):
        w = int(length[0])
        offs[1:] = np.arange(1, n + 1, dtype=np.int32) * w
        values = np.lib.stride_tricks.sliding_window_view(data, w)[start] if w else data[:0]
    else:
        np.cumsum(length, out=offs[1:])
        at = np.repeat(start - offs[:-1], length) + np.arange(int(offs[-1]), dtype=np.int64)
        values = data[at]
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offs), pa.py_buffer(values.tobytes())]
    )


def _decode_slow(
    layout: Layout, raws: list[Any], topic_type: pa.DataType
) -> tuple[np.ndarray, pa.Array, np.ndarray, list[str | None]]:
    """``decode_waku_batch`` record by record (a column that is not plain binary)."""
    import pyarrow as pa

    msgs, bads = decode_all(_nullable(layout.decode_record), raws)
    return (
        np.fromiter((m[0] for m in msgs), dtype=np.int64, count=len(msgs)),
        pa.array([m[1] for m in msgs], type=topic_type),
        np.fromiter((m[3] for m in msgs), dtype=np.int64, count=len(msgs)),
        bads,
    )
