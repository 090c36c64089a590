"""``archives-build``: the due 7-day archives of one community stream, or of many, on Spark.

Why: the control node builds archives in one Python process, through its SQLite working store
(issue 11 §1). This job builds the same bytes from the stream itself, with Spark doing the heavy
work: records come through ``loglake.pipeline.read`` (sealed history by Spark's native Parquet
reader, the live tail through the ``loglake`` source). Two passes in executors:

- scan: each record decoded (``decode_waku_batch``: numpy over the Arrow buffers, with the
  layout's own ``decode_record`` for any record it cannot vouch for); out come only, per community
  and hour of message time, the index range and oldest time of its messages, and the bad
  records (so a bad record fails the job before any build work, and windows are planned from
  the oldest message without keeping decoded records around);
- build: each record decoded again (from the first index the planned windows need), its window
  assigned in the JVM, records grouped by (community, window) through a shuffle, and each window
  built by the archives part's sans-I/O ``ArchiveBuilder`` (framing, padding, status-go chunks,
  SHA-1 piece hashes) — a window's archives are padded to whole pieces, so its pieces and hashes
  do not depend on any other window. Nothing of the protocol is written here.

Tried and dropped: keeping the decoded records (``persist(DISK_ONLY)``) instead of decoding
twice (the cache write cost more than the decode), and one ``read`` per window's index range
instead of the shuffle (1.6–2× slower here: a read is planned on the driver, a task per window).

The driver then does what only depends on order: offsets by prefix sum (``Layout.make_entry``
at the real offset gives each keccak-256 key), the index (``Layout.encode_index``) and the
torrent (``ArchiveBuilder.torrent``), and writes the files ``ControlNode`` writes —
``<root>/<community id>/{data,index}`` and ``<root>/<community id>.torrent`` — plus
``<root>/<community id>.magnet``. Windows follow ``ControlNode.build``: from the end of the last
archive (the index, or the control node's store if it recorded a later end), else from the
oldest valid message of the stream (``plan_windows``: full windows, catch-up builds every
missed one; ``partial`` adds the unfinished one). So the bytes are the control node's, for both
layouts, and a control node started on ``root`` afterwards continues from them: its builder
resumes at the index's last window, and its store (new or lagging) is re-flagged from the
archives at its next ingest (``ControlNode._reflag``: a row is archived iff its record is in an
archive), so it neither rebuilds nor re-exports.

Atomic and re-runnable (issue 11 §1, "a job killed midway leaves no partial archive visible"):

1. Executors write each window's archive bytes to ``<root>/.archives-build/_parts-<job>/``.
2. The driver stages the community's new files in ``<root>/.archives-build/<community id>/``:
   ``data`` (the live ``data`` up to the end of its last indexed archive, copied in the kernel
   with ``copy_file_range``, then each window's part), ``index``, ``torrent``, ``magnet``; every
   file and folder fsync'd.
3. ``COMMIT`` (a JSON plan, written atomically: ``fs.replace_file_atomic``) is the commit point.
4. Roll forward: ``data``, then ``index``, then the torrent, then the magnet are renamed into
   place (each folder fsync'd). Between the first two renames a reader sees the old index over a
   longer ``data``: the unindexed tail every reader ignores (``ControlNode`` truncates it).

A crash before ``COMMIT`` leaves only staging, removed by the next run, which rebuilds the same
bytes (the build is a pure function of the stream and the committed files); a crash after it is
rolled forward by the next run. One job per ``root`` at a time (``flock``); a ``ControlNode``
must not build the same community while the job runs (it does not take the lock).

Bad input: a record that is not the layout's ``WakuMessage`` fails the job with
``BadCommunityRecord`` naming the stream and index (nothing is written), or with
``on_bad_record="skip"`` is skipped (as ``ControlNode`` skips it) and counted in the report.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import os
import pickle
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw
import numpy as np

from loglake.archives.builder import WINDOW_NS, ArchiveBuilder, plan_windows
from loglake.archives.errors import BadRecord
from loglake.archives.layout import Layout, get_layout
from loglake.archives.messages import IndexEntry
from loglake.archives.torrent import PieceHashes
from loglake.log import fs
from loglake.pipeline.errors import BadOption, JobFailed

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

STAGING_DIR = ".archives-build"
"""Under ``root``; hidden (a dot folder), and not a community folder (those are ``0x…``)."""
PARTS_PREFIX = "_parts-"
COMMIT = "COMMIT"
LOCK = ".archives-build.lock"
ON_BAD_RECORD = ("fail", "skip")
BAD_SAMPLE = 10
"""Bad records named per community in the report (all are counted)."""


class BadCommunityRecord(JobFailed, BadRecord):
    """A community stream record is not the layout's ``WakuMessage`` (``on_bad_record=fail``)."""

    def __init__(self, stream: str, index: int, reason: str, count: int = 1) -> None:
        more = f" ({count} bad records in all)" if count > 1 else ""
        super().__init__(
            f"stream {stream!r} index {index}: {reason}{more}; "
            "rerun with --on-bad-record skip to skip such records"
        )
        self.stream, self.index, self.reason, self.count = stream, index, reason, count


@dataclass(frozen=True)
class Community:
    stream: str
    community_id: str
    """``0x`` + compressed public key hex: the torrent's name and the folder's."""


@dataclass(frozen=True)
class ArchivesBuildOptions:
    data_dir: str
    root: str
    communities: tuple[Community, ...]
    layout: str = "spec"
    now_ns: int | None = None
    """Build as of this time (default: now)."""
    partial: bool = False
    period_ns: int = WINDOW_NS
    topics: tuple[bytes | str, ...] | None = None
    announce: tuple[str, ...] = ()
    on_bad_record: str = "fail"

    def __post_init__(self) -> None:
        if not Path(self.data_dir).is_dir():
            raise BadOption("data_dir", self.data_dir, "no such directory")
        if not self.communities:
            raise BadOption("streams", "", "no community stream to build")
        if self.on_bad_record not in ON_BAD_RECORD:
            raise BadOption("on_bad_record", self.on_bad_record, "use fail or skip")
        if self.period_ns <= 0:
            raise BadOption("period_ns", self.period_ns, "must be positive")
        get_layout(self.layout)  # ArchiveConfigError for an unknown layout
        ids = [c.community_id for c in self.communities]
        if len(set(ids)) != len(ids):
            raise BadOption("communities", ids, "two streams share a community id")


def match_streams(data_dir: str, pattern: str) -> list[str]:
    """Streams of ``data_dir`` (live log and lake) whose name matches ``pattern`` (fnmatch);
    a plain name matches itself."""
    from loglake.log import open_log
    from loglake.pipeline.lake import lake_streams

    names = set(lake_streams(data_dir))
    # a lake-only data dir has no log to open
    with contextlib.suppress(Exception), open_log(data_dir, readonly=True) as log:
        names |= set(log.streams())
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def communities_from_keys(
    data_dir: str, pattern: str, key_file: str | None = None, key_dir: str | None = None
) -> tuple[Community, ...]:
    """Each stream matching ``pattern`` with its community id: from ``key_file`` (one stream),
    or from ``key_dir/<stream>.key`` (a control node key, hex, as ``archives keygen`` writes)."""
    from loglake.archives.signing import community_id, load_private_key

    streams = match_streams(data_dir, pattern)
    if not streams:
        raise BadOption("streams", pattern, f"no stream of {data_dir} matches")
    if key_file is not None:
        if len(streams) != 1:
            raise BadOption(
                "key_file", key_file, f"one key for {len(streams)} streams: use --key-dir"
            )
        key = load_private_key(Path(key_file).read_text().strip())
        return (Community(streams[0], community_id(key)),)
    if key_dir is None:
        raise BadOption("key_dir", None, "give --key-file (one stream) or --key-dir")
    out = []
    for s in streams:
        path = Path(key_dir) / f"{s}.key"
        if not path.exists():
            raise BadOption("key_dir", key_dir, f"no key {path.name} for stream {s!r}")
        out.append(Community(s, community_id(load_private_key(path.read_text().strip()))))
    return tuple(out)


# -- results ---------------------------------------------------------------------------------


@dataclass
class CommunityReport:
    stream: str
    community_id: str
    windows: int = 0
    """7-day windows consumed by this build (empty ones included)."""
    new_archives: int = 0
    records: int = 0
    """Records in the windows built (before topic filtering and status-go's size cap)."""
    bad_records: int = 0
    bad_sample: list[tuple[int, str]] = field(default_factory=list)
    appended_bytes: int = 0
    data_bytes: int = 0
    info_hash: str | None = None
    magnet: str | None = None


@dataclass
class ArchivesBuildReport:
    communities: list[CommunityReport] = field(default_factory=list)
    recovered: int = 0
    """Committed builds of an earlier, killed run rolled forward."""
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def new_archives(self) -> int:
        return sum(c.new_archives for c in self.communities)

    @property
    def bad_records(self) -> int:
        return sum(c.bad_records for c in self.communities)

    @property
    def appended_bytes(self) -> int:
        return sum(c.appended_bytes for c in self.communities)

    def to_json(self) -> dict[str, Any]:
        return {
            "communities": [c.__dict__ for c in self.communities],
            "recovered": self.recovered,
            "new_archives": self.new_archives,
            "bad_records": self.bad_records,
            "appended_bytes": self.appended_bytes,
            "seconds": self.seconds,
        }


Progress = Callable[[str, int, int], None]
Fault = Callable[[str], None]
"""``fault(point)``: called between stages (``parts``, ``staged``, ``committing``); tests kill
the job there."""


# -- executors -------------------------------------------------------------------------------


def _decoded_schema(layout: Layout) -> str:
    topic = "string" if layout.name == "spec" else "binary"
    return f"sid int, idx long, ts long, topic {topic}, cap long, data binary"


def _decode_all(decode: Callable[[bytes], Any], raws: list[bytes]) -> tuple[list[Any], list[Any]]:
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


SUMMARY_SCHEMA = "sid int, bucket long, lo long, hi long, n long, mints long, bad string"
BUCKET_NS = 3600 * 1_000_000_000
"""The summary pass records, per community and hour of message time, the stream index range
holding its messages: the build pass reads each stream from the first index of an hour its
windows overlap (a weekly build does not re-read archived history)."""


def _summary_batches(
    layout_name: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow, the first pass: every record decoded; out come, per (community, hour of
    message time), the index range and count of its messages and their oldest time, and one
    row per bad record (``bad`` = the error). Small: windows are planned from it."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for b in batches:
            ts, _, _, bads = decode_waku_batch(layout_name, b.column(2))
            sid = np.asarray(b.column(0).to_numpy(zero_copy_only=False), dtype=np.int64)
            idx = np.asarray(b.column(1).to_numpy(zero_copy_only=False), dtype=np.int64)
            good = np.ones(len(ts), dtype=bool)
            cols: list[list[Any]] = [[], [], [], [], [], [], []]
            if bads:
                good = np.array([x is None for x in bads], dtype=bool)
                for i in np.flatnonzero(~good).tolist():
                    for c, v in zip(
                        cols, (int(sid[i]), 0, int(idx[i]), int(idx[i]), 0, 0, bads[i]), strict=True
                    ):
                        c.append(v)
            if good.any():
                s_, i_, t_ = sid[good], idx[good], ts[good]
                bucket = t_ // BUCKET_NS
                order = np.lexsort((bucket, s_))
                s_, i_, t_, bucket = s_[order], i_[order], t_[order], bucket[order]
                edge = np.flatnonzero((np.diff(s_) != 0) | (np.diff(bucket) != 0)) + 1
                starts = np.concatenate(([0], edge))
                values: list[np.ndarray] = [
                    s_[starts],
                    bucket[starts],
                    np.minimum.reduceat(i_, starts),
                    np.maximum.reduceat(i_, starts),
                    np.diff(np.concatenate((starts, [len(s_)]))),
                    np.minimum.reduceat(t_, starts),
                ]
                for col, arr in zip(cols, values, strict=False):
                    col.extend(arr.tolist())
                cols[6].extend([None] * len(starts))
            types = [
                pa.int32(),
                pa.int64(),
                pa.int64(),
                pa.int64(),
                pa.int64(),
                pa.int64(),
                pa.string(),
            ]
            yield pa.RecordBatch.from_arrays(
                [pa.array(c, type=t) for c, t in zip(cols, types, strict=True)],
                names=["sid", "bucket", "lo", "hi", "n", "mints", "bad"],
            )

    return run


def _decode_batches(
    layout_name: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow, the build pass: every record through ``decode_waku_batch``: its
    time, topic and size for the cap, the record itself passed through untouched (Arrow, no
    copy); bad records are dropped (the summary pass reported them). Windows are assigned in
    the JVM afterwards (``_windowed``)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:

        import pyarrow as pa

        for b in batches:
            ts, topics, cap, bads = decode_waku_batch(layout_name, b.column(2))
            out = pa.RecordBatch.from_arrays(
                [b.column(0), b.column(1), pa.array(ts), topics, pa.array(cap), b.column(2)],
                names=["sid", "idx", "ts", "topic", "cap", "data"],
            )
            if bads:
                out = out.filter(pa.array([x is None for x in bads]))
            yield out

    return run


def _windowed(decoded: DataFrame, plan: Mapping[int, tuple[int, int, int]]) -> DataFrame:
    """Each record's window ``w = (ts - start) // period`` (``plan[sid] = (start, period,
    end)``), in the JVM; records outside the planned windows are dropped (windows are never
    reopened, as in ``ControlNode``)."""
    from pyspark.sql import functions as F

    def lookup(pos: int):
        pairs = [F.lit(x) for sid, p in plan.items() for x in (sid, p[pos])]
        return F.element_at(F.create_map(*pairs), F.col("sid"))

    start, period, end = lookup(0), lookup(1), lookup(2)
    return decoded.where(
        start.isNotNull() & (F.col("ts") >= start) & (F.col("ts") < end)
    ).withColumn("w", F.floor((F.col("ts") - start) / period).cast("int"))


ENCODED_SCHEMA = (
    "sid int, w int, path string, nbytes long, hashes binary, entries binary, records long"
)


def _build_window(
    layout: Layout,
    sid: int,
    w: int,
    window: tuple[int, int],
    rows: list[Any],
    topics: Sequence[bytes | str] | None,
    parts_dir: str,
) -> pa.Table:
    """``ArchiveBuilder.build`` of one window (its own builder, so offsets are window-local and
    the hashes are the window's pieces; ``rows`` in the store's order, time then index), the
    archive bytes written to a part file; returns sizes, piece hashes and the entries'
    (metadata, local offset, size, padding) as one row of ``ENCODED_SCHEMA``."""
    builder = ArchiveBuilder(layout, "")
    result = builder.build([window], rows, topics, presorted=True)
    path = os.path.join(parts_dir, f"{sid}-{w}")
    if result.archives:
        with open(path, "wb") as f:
            for a in result.archives:
                f.writelines(a.parts)
                if a.trailing_zeros:
                    f.write(bytes(a.trailing_zeros))
    entries = [
        (a.entry.metadata, a.entry.offset, a.entry.size, a.entry.padding) for a in result.archives
    ]
    return _encoded_row(
        sid,
        w,
        path if result.archives else "",
        builder.data_size,
        b"".join(builder.hashes.hashes),
        pickle.dumps(entries),
        len(rows),
    )


def _window_of(plan: Mapping[int, tuple[int, int, int]], sid: int, w: int) -> tuple[int, int]:
    start, period, end = plan[sid]
    frm = start + w * period
    return frm, min(frm + period, end)


def _encode_groups(
    layout_name: str,
    plan: Mapping[int, tuple[int, int, int]],
    topics: Sequence[bytes | str] | None,
    parts_dir: str,
) -> Callable[[tuple[Any, ...], pa.Table], pa.Table]:
    """applyInArrow per (community, window): sorted in the store's order, ``_build_window``."""

    def run(key: tuple[Any, ...], table: pa.Table) -> pa.Table:
        sid, w = int(key[0].as_py()), int(key[1].as_py())
        t = table.sort_by([("ts", "ascending"), ("idx", "ascending")])  # the store's order
        rows = list(
            zip(
                t.column("ts").to_pylist(),
                t.column("topic").to_pylist(),
                t.column("data").to_pylist(),
                t.column("cap").to_pylist(),
                strict=True,
            )
        )
        layout = get_layout(layout_name)
        return _build_window(layout, sid, w, _window_of(plan, sid, w), rows, topics, parts_dir)

    return run


def _encoded_row(*values: Any) -> pa.Table:
    import pyarrow as pa

    names = ["sid", "w", "path", "nbytes", "hashes", "entries", "records"]
    types = [pa.int32(), pa.int32(), pa.string(), pa.int64(), pa.binary(), pa.binary(), pa.int64()]
    return pa.table(
        [pa.array([v], type=t) for v, t in zip(values, types, strict=True)], names=names
    )


# -- vectorised WakuMessage decoding ---------------------------------------------------------


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


def _waku_fields(layout_name: str) -> _WakuFields:
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


_SHIFTS = (7 * np.arange(10)).astype(np.uint64)


def _read_varints(
    data: np.ndarray, pos: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unsigned LEB128 varint at ``pos`` of each row (bounded by ``end``), all rows at
    once: (value, position after it, ok). Not ok: truncated, or longer than protobuf's 10
    bytes / above 64 bits (such rows take the slow path)."""
    n = len(pos)
    value = np.zeros(n, dtype=np.uint64)
    size = np.zeros(n, dtype=np.int64)
    going = np.ones(n, dtype=bool)
    top = len(data) - 1
    b = np.zeros(n, dtype=np.uint8)
    for k in range(10):  # byte k of every varint at once; most stop after one or two
        if top < 0 or not going.any():
            break
        b = data[np.minimum(pos + k, top)]
        value |= ((b & 0x7F).astype(np.uint64) << _SHIFTS[k]) * going
        size += going
        going &= b >= 0x80
    # refused: still going after 10 bytes, past the record's end, or above 64 bits
    ok = ~going & (pos + size <= end) & ~((size == 10) & (b > 1))
    return value, pos + size, ok


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
    through ``decode_record`` itself, so the result is the layout's, record for record."""
    import pyarrow as pa

    f = _waku_fields(layout_name)
    layout = get_layout(layout_name)
    topic_type = pa.string() if f.topic_utf8 else pa.binary()
    n = len(column)
    if column.type != pa.binary() or column.null_count:
        return _decode_slow(layout, column.to_pylist(), topic_type)
    bufs = column.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=column.offset + n + 1)[column.offset :]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    pos = offs[:-1].astype(np.int64)
    end = offs[1:].astype(np.int64)
    ok = np.ones(n, dtype=bool)
    seen: dict[int, np.ndarray] = {}
    values: dict[int, np.ndarray] = {}
    starts: dict[int, np.ndarray] = {}
    lengths: dict[int, np.ndarray] = {}
    rows = np.flatnonzero(pos < end)
    for _ in range(len(f.wire) + 1):  # one field of every unfinished record per round
        if not len(rows):
            break
        tag, p, good = _read_varints(data, pos[rows], end[rows])
        field_no = (tag >> np.uint64(3)).astype(np.int64)
        wt = (tag & np.uint64(7)).astype(np.int64)
        val, p2, vok = _read_varints(data, p, end[rows])  # the value, or the length
        good &= vok
        is_len = wt == 2
        over = is_len & (val > np.uint64(1 << 31))
        ln = np.where(is_len & ~over, val, np.uint64(0)).astype(np.int64)
        good &= ~(over | (is_len & (p2 + ln > end[rows])))
        matched = np.zeros(len(rows), dtype=bool)
        for num, want in f.wire.items():
            m = np.flatnonzero(good & (field_no == num) & (wt == want))
            if not len(m):
                continue
            r = rows[m]
            s = seen.setdefault(num, np.zeros(n, dtype=bool))
            dup = s[r]  # repeated: protobuf keeps the last; the slow path decides
            good[m[dup]] = False
            m, r = m[~dup], r[~dup]
            s[r] = True
            matched[m] = True
            if want == 2:
                starts.setdefault(num, np.zeros(n, dtype=np.int64))[r] = p2[m]
                lengths.setdefault(num, np.zeros(n, dtype=np.int64))[r] = ln[m]
            else:
                values.setdefault(num, np.zeros(n, dtype=np.uint64))[r] = val[m]
        good &= matched
        ok[rows[~good]] = False
        rows, nxt = rows[good], (p2 + ln)[good]
        pos[rows] = nxt
        rows = rows[nxt < end[rows]]
    ok[rows] = False  # more fields than the schema has: repeated ones
    for num in f.strings:
        if num in seen:
            ok &= ~seen[num]
    has_ts = seen.get(f.ts, np.zeros(n, dtype=bool))
    raw_ts = values.get(f.ts, np.zeros(n, dtype=np.uint64))
    if f.ts_zigzag:
        ok &= has_ts  # no timestamp: BadRecord, named by decode_record
        ts = (raw_ts >> np.uint64(1)).astype(np.int64) ^ -(raw_ts & np.uint64(1)).astype(np.int64)
    else:
        big = raw_ts > np.uint64((2**63 - 1) // f.ts_scale)
        ok &= ~big
        ts = np.where(big, 0, raw_ts).astype(np.int64) * f.ts_scale
    cap = np.zeros(n, dtype=np.int64)
    for num in f.cap:
        if num in lengths:
            cap += lengths[num]
    t_start = starts.get(f.topic, np.zeros(n, dtype=np.int64))
    t_len = np.where(ok, lengths.get(f.topic, np.zeros(n, dtype=np.int64)), 0)
    t_offs = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(t_len, out=t_offs[1:])
    gather = np.repeat(t_start - t_offs[:-1], t_len) + np.arange(int(t_offs[-1]), dtype=np.int64)
    topic_bin = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(t_offs), pa.py_buffer(data[gather].tobytes())]
    )
    topics: pa.Array = topic_bin
    if f.topic_utf8:
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
    slow = np.flatnonzero(~ok)
    if not len(slow):
        return ts, topics, cap, []
    bads: list[str | None] = [None] * n
    topic_list = topics.to_pylist()
    for i in slow.tolist():
        raw = column[i].as_py()
        try:
            msg = layout.decode_record(raw)
        except BadRecord as e:
            bads[i] = str(e)
            ts[i], cap[i], topic_list[i] = 0, 0, None
            continue
        ts[i], topic_list[i], cap[i] = msg[0], msg[1], msg[3]
    if not any(b is not None for b in bads):
        bads = []
    return ts, pa.array(topic_list, type=topic_type), cap, bads


def _decode_slow(
    layout: Layout, raws: list[Any], topic_type: pa.DataType
) -> tuple[np.ndarray, pa.Array, np.ndarray, list[str | None]]:
    """``decode_waku_batch`` record by record (a column that is not plain binary)."""
    import pyarrow as pa

    msgs, bads = _decode_all(layout.decode_record, raws)
    return (
        np.fromiter((m[0] for m in msgs), dtype=np.int64, count=len(msgs)),
        pa.array([m[1] for m in msgs], type=topic_type),
        np.fromiter((m[3] for m in msgs), dtype=np.int64, count=len(msgs)),
        bads,
    )


# -- driver: state of a community's files ------------------------------------------------------


@dataclass
class _State:
    community: Community
    folder: Path
    entries: list[IndexEntry]
    indexed_end: int
    """End of the last indexed archive in ``data`` (bytes beyond it are a torn tail)."""
    start_ns: int | None
    """Where the next window starts (None: at the oldest message)."""


def _store_end(root: Path, cid: str) -> int | None:
    """The last window end a control node recorded in its store (``archives build`` keeps it
    at ``<root>/<community id>.sqlite``), read-only: it may be later than the index's last
    archive when the node consumed empty windows."""
    path = root / f"{cid}.sqlite"
    if not path.exists():
        return None
    try:  # apsw, as the store: two SQLite libraries on one file in one process can drop
        # each other's POSIX locks (sqlite.org/howtocorrupt.html §2.2.1)
        db = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            rows = db.execute("SELECT value FROM meta WHERE key='last_archive_end_ns'").fetchall()
        finally:
            db.close()
    except apsw.Error:
        return None
    return int(str(rows[0][0])) if rows else None  # meta values are TEXT


def _load_state(root: Path, c: Community, layout: Layout) -> _State:
    folder = root / c.community_id
    entries: list[IndexEntry] = []
    index_path = folder / "index"
    if index_path.exists():
        entries = layout.decode_index(index_path.read_bytes())
    end = entries[-1].offset + entries[-1].size if entries else 0
    data_path = folder / "data"
    size = data_path.stat().st_size if data_path.exists() else 0
    if size < end:
        raise JobFailed(f"{data_path} holds {size} bytes, its index describes {end}")
    ends = [t for t in (_store_end(root, c.community_id),) if t is not None]
    ends += [max(e.metadata.to_ns for e in entries)] if entries else []
    return _State(c, folder, entries, end, max(ends) if ends else None)


# -- driver: staging and commit --------------------------------------------------------------


def _copy_range(src_fd: int, dst_fd: int, count: int, src_off: int = 0) -> None:
    """``count`` bytes of ``src_fd`` from ``src_off`` appended to ``dst_fd``, in the kernel."""
    done = 0
    while done < count:
        n = os.copy_file_range(src_fd, dst_fd, count - done, src_off + done)
        if n <= 0:
            raise JobFailed(f"copy_file_range returned {n} with {count - done} bytes left")
        done += n


def _write_file(path: Path, data: bytes) -> None:
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fs.write_all(fd, data)
        fs.fsync(fd)
    finally:
        fs.close(fd)


def _targets(root: Path, cid: str) -> dict[str, Path]:
    """Staged file name → where the commit puts it (in commit order: ``data`` first)."""
    return {
        "data": root / cid / "data",
        "index": root / cid / "index",
        "torrent": root / f"{cid}.torrent",
        "magnet": root / f"{cid}.magnet",
    }


def commit_staged(root: Path, stage: Path) -> None:
    """Roll a staged build with ``COMMIT`` forward (idempotent): rename each staged file into
    place, in order, fsync'ing each folder; then drop the staging folder."""
    plan = json.loads((stage / COMMIT).read_text())
    cid = plan["community_id"]
    fs.makedirs_durable(root / cid)
    for name, dest in _targets(root, cid).items():
        src = stage / name
        if src.exists():
            fs.replace(src, dest)
            fs.fsync_dir(dest.parent)
    shutil.rmtree(stage)
    fs.fsync_dir(stage.parent)


def recover(root: Path) -> int:
    """Roll forward the committed builds of a killed run; drop everything else it staged."""
    base = root / STAGING_DIR
    if not base.is_dir():
        return 0
    done = 0
    for d in sorted(base.iterdir()):
        if d.is_dir() and not d.name.startswith(PARTS_PREFIX) and (d / COMMIT).exists():
            commit_staged(root, d)
            done += 1
        else:
            shutil.rmtree(d, ignore_errors=True)
    fs.fsync_dir(base)
    return done


@contextlib.contextmanager
def job_lock(root: Path) -> Iterator[None]:
    """One archives-build job per ``root`` at a time (``flock``); a second fails at once."""
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobFailed(f"archives-build: another job is running on {root}") from None
        yield
    finally:
        os.close(fd)


def _stage_community(
    root: Path,
    st: _State,
    layout: Layout,
    rows: list[Any],
    end_ns: int,
    announce: tuple[str, ...],
    report: CommunityReport,
) -> Path | None:
    """Offsets by prefix sum, index, torrent, magnet; stage the new files and ``COMMIT``.
    None when the build adds no archive (nothing to write, as for ``ControlNode``)."""
    cid = st.community.community_id
    new: list[IndexEntry] = []
    new_hashes: list[bytes] = []
    base = st.indexed_end
    for r in rows:
        for meta, local, size, padding in pickle.loads(r["entries"]):
            new.append(layout.make_entry(meta, base + local, size, padding))
        h = r["hashes"]
        new_hashes += [h[i : i + 20] for i in range(0, len(h), 20)]
        base += r["nbytes"]
    if not new:
        return None
    hashes = PieceHashes(layout.piece_length)
    data_path = st.folder / "data"
    if st.indexed_end:
        with open(data_path, "rb") as f:  # earlier pieces, as ControlNode._load hashes them
            left = st.indexed_end
            while left:
                chunk = f.read(min(left, layout.piece_length * 256))
                hashes.extend(chunk)
                left -= len(chunk)
    hashes.hashes += new_hashes
    builder = ArchiveBuilder(layout, cid, st.entries + new, hashes, end_ns, announce)
    index = layout.encode_index(builder.entries)
    torrent = builder.torrent(index)
    stage = root / STAGING_DIR / cid
    shutil.rmtree(stage, ignore_errors=True)
    fs.makedirs_durable(stage)
    fd = fs.open(stage / "data", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if st.indexed_end:
            src = os.open(data_path, os.O_RDONLY)
            try:
                _copy_range(src, fd, st.indexed_end)
            finally:
                os.close(src)
        for r in rows:
            if r["path"]:
                src = os.open(r["path"], os.O_RDONLY)
                try:
                    _copy_range(src, fd, r["nbytes"])
                finally:
                    os.close(src)
        if os.fstat(fd).st_size != hashes.data_size:
            raise JobFailed(f"staged data of {cid} is not {hashes.data_size} bytes")
        fs.fsync(fd)
    finally:
        fs.close(fd)
    magnet = torrent.magnet(cid)
    _write_file(stage / "index", index)
    _write_file(stage / "torrent", torrent.metainfo())
    _write_file(stage / "magnet", (magnet + "\n").encode())
    fs.fsync_dir(stage)
    report.new_archives = len(new)
    report.appended_bytes = hashes.data_size - st.indexed_end
    report.data_bytes = hashes.data_size
    report.info_hash = torrent.info_hash
    report.magnet = magnet
    return stage


# -- the job ---------------------------------------------------------------------------------


DRIVER_TAIL_RECORDS = 0
"""``read``'s ``driver_tail_records``: off (the live tail goes through the source in
executors). Reading 100 small tails on the driver was tried for many small streams and was
slower here (one run: the scan pass 26 s → 104 s for 100 streams × 2,000 records)."""


def _records(
    spark: SparkSession,
    opts: ArchivesBuildOptions,
    sids: Sequence[int],
    first_index: Mapping[int, int | None] | None = None,
    frames: dict[tuple[int, int | None], DataFrame] | None = None,
) -> DataFrame:
    """The community streams' records (``sid``, ``index``, ``data``) through ``pipeline.read``
    (sealed history by the native Parquet reader, the live tail through the source), from
    ``first_index[sid]`` on if given; ``frames`` keeps each read for the next pass (a read is
    planned on the driver: it lists the lake and opens the live log)."""
    from pyspark.sql import functions as F

    from loglake.pipeline.read import read

    out = None
    for sid in sids:
        c = opts.communities[sid]
        lo = (first_index or {}).get(sid)
        df = None if frames is None else frames.get((sid, lo))
        if df is None:
            df = read(
                spark,
                opts.data_dir,
                c.stream,
                partitions=[0],
                start_index=lo,
                driver_tail_records=DRIVER_TAIL_RECORDS,
            ).select(F.lit(sid).cast("int").alias("sid"), "index", "data")
            if frames is not None:
                frames[(sid, lo)] = df
        out = df if out is None else out.unionByName(df)
    assert out is not None
    return out


def run(
    spark: SparkSession,
    opts: ArchivesBuildOptions,
    progress: Progress | None = None,
    fault: Fault | None = None,
) -> ArchivesBuildReport:
    """Recover a killed run, plan windows, build them on Spark, stage, commit."""
    root = Path(opts.root).resolve()
    fs.makedirs_durable(root)
    with job_lock(root):
        return _run(
            spark, opts, root, progress or (lambda s, d, t: None), fault or (lambda p: None)
        )


def _run(
    spark: SparkSession,
    opts: ArchivesBuildOptions,
    root: Path,
    progress: Progress,
    fault: Fault,
) -> ArchivesBuildReport:
    t0 = time.perf_counter()
    report = ArchivesBuildReport()
    report.recovered = recover(root)
    layout = get_layout(opts.layout)
    now = time.time_ns() if opts.now_ns is None else opts.now_ns
    states = [_load_state(root, c, layout) for c in opts.communities]
    report.communities = [CommunityReport(c.stream, c.community_id) for c in opts.communities]
    all_sids = list(range(len(states)))

    # pass 1 (executors): every record decoded; per community and hour of message time, the
    # index range of its messages; bad records. Small, collected.
    progress("scan", 0, 1)
    frames: dict[tuple[int, int | None], DataFrame] = {}
    summary = (
        _records(spark, opts, all_sids, frames=frames)
        .mapInArrow(_summary_batches(opts.layout), SUMMARY_SCHEMA)
        .collect()
    )
    progress("scan", 1, 1)
    buckets: dict[int, dict[int, list[int]]] = {sid: {} for sid in all_sids}
    bad_rows: dict[int, list[tuple[int, str]]] = {}
    stream_first: dict[int, int] = {}  # the first index read of each stream
    for r in summary:
        stream_first[r["sid"]] = min(stream_first.get(r["sid"], r["lo"]), r["lo"])
        if r["bad"] is not None:
            bad_rows.setdefault(r["sid"], []).append((r["lo"], r["bad"]))
            continue
        cur = buckets[r["sid"]].get(r["bucket"])
        if cur is None:
            buckets[r["sid"]][r["bucket"]] = [r["lo"], r["hi"], r["n"], r["mints"]]
        else:
            cur[0], cur[1] = min(cur[0], r["lo"]), max(cur[1], r["hi"])
            cur[2], cur[3] = cur[2] + r["n"], min(cur[3], r["mints"])
    for sid, bads in bad_rows.items():
        bads.sort()
        report.communities[sid].bad_records = len(bads)
        report.communities[sid].bad_sample = bads[:BAD_SAMPLE]
    if bad_rows and opts.on_bad_record == "fail":
        first = report.communities[min(bad_rows)]
        index, reason = first.bad_sample[0]
        raise BadCommunityRecord(first.stream, index, reason, report.bad_records)
    report.seconds["scan"] = time.perf_counter() - t0

    # windows: from the last archive's end, else from the oldest valid message
    windows: dict[int, list[tuple[int, int]]] = {}
    plan: dict[int, tuple[int, int, int]] = {}
    first_index: dict[int, int | None] = {}  # first index holding a planned message
    for sid in all_sids:
        bk = buckets[sid]
        start = states[sid].start_ns
        if start is None and bk:
            start = min(v[3] for v in bk.values())
        if start is None:
            continue  # no valid message at all: nothing to build
        ws = plan_windows(start, now, period_ns=opts.period_ns, partial=opts.partial)
        if not ws:
            continue
        windows[sid] = ws
        plan[sid] = (start, opts.period_ns, ws[-1][1])
        report.communities[sid].windows = len(ws)
        lo_b, hi_b = ws[0][0] // BUCKET_NS, (ws[-1][1] - 1) // BUCKET_NS
        los = [v[0] for b, v in bk.items() if lo_b <= b <= hi_b]
        if los:
            # from the first index its windows need (the whole stream's read when that is all)
            lo = min(los)
            first_index[sid] = lo if lo > stream_first[sid] else None
    if not first_index:  # nothing due anywhere: nothing to build, nothing written
        report.seconds["total"] = time.perf_counter() - t0
        return report

    # pass 2 (executors): each window built by the archives part's builder, pieces hashed
    t1 = time.perf_counter()
    job = uuid.uuid4().hex[:12]
    parts_dir = root / STAGING_DIR / f"{PARTS_PREFIX}{job}"
    fs.makedirs_durable(parts_dir)
    try:
        progress("build", 0, len(first_index))
        decoded = _records(spark, opts, sorted(first_index), first_index, frames).mapInArrow(
            _decode_batches(opts.layout), _decoded_schema(layout)
        )
        rows = (
            _windowed(decoded, plan)
            .groupBy("sid", "w")
            .applyInArrow(
                _encode_groups(opts.layout, plan, opts.topics, str(parts_dir)), ENCODED_SCHEMA
            )
            .collect()
        )
        progress("build", len(first_index), len(first_index))
        report.seconds["build"] = time.perf_counter() - t1
        fault("parts")

        by_sid: dict[int, list[Any]] = {}
        for r in rows:
            by_sid.setdefault(r["sid"], []).append(r)
            report.communities[r["sid"]].records += r["records"]

        # driver: prefix sums, index, torrent, magnet; stage every community, then commit
        t2 = time.perf_counter()
        staged = []
        for sid, ws in windows.items():
            wrows = sorted(by_sid.get(sid, []), key=lambda r: r["w"])
            stage = _stage_community(
                root, states[sid], layout, wrows, ws[-1][1], opts.announce, report.communities[sid]
            )
            if stage is not None:
                payload = {"community_id": opts.communities[sid].community_id, "job": job}
                fs.replace_file_atomic(stage / COMMIT, json.dumps(payload).encode())
                staged.append(stage)
            progress("stage", len(staged), len(windows))
        report.seconds["stage"] = time.perf_counter() - t2
        fault("staged")
        t3 = time.perf_counter()
        for stage in staged:
            _commit_with_fault(root, stage, fault)
        report.seconds["commit"] = time.perf_counter() - t3
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
    for sid in all_sids:
        rep = report.communities[sid]
        if not rep.info_hash:  # nothing new: describe what is there
            st = states[sid]
            rep.data_bytes = st.indexed_end
    report.seconds["total"] = time.perf_counter() - t0
    return report


def _commit_with_fault(root: Path, stage: Path, fault: Fault) -> None:
    """``commit_staged``, with the ``committing`` fault point after the ``data`` rename (the
    moment a reader sees the old index over a longer ``data``)."""
    plan = json.loads((stage / COMMIT).read_text())
    dest = _targets(root, plan["community_id"])["data"]
    fs.makedirs_durable(dest.parent)
    fs.replace(stage / "data", dest)
    fs.fsync_dir(dest.parent)
    fault("committing")
    commit_staged(root, stage)
