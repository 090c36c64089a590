"""``sds-audit``: what happened in an SDS group chat, as Parquet tables and an HTML report.

Reads a stored SDS channel (a loglake stream, one partition) and:

1. decodes every record in executors with ``loglake.sds.codec`` (``parse`` + ``parse_entry``:
   the same checks a participant makes); a record that does not decode, names another channel,
   or carries a bloom filter of the wrong length becomes a ``rejects`` row (partition, index,
   reason, detail) and the job goes on. The records never enter the JVM: the driver plans
   units from metadata (``loglake.pipeline.units``, as ``job archives-build``: the lake's
   visible files and the live tail's ranges), plain tasks read their units' columns where they
   lie, in index order, decode them (``decode_batches``) and write the decoded rows as zstd
   Parquet part files under ``_work/decoded`` themselves; Spark reads those back. Why: through
   ``loglake.pipeline.read`` + ``mapInArrow`` the JVM copied every record (~20 KB with a
   200-entry history) from the lake into Arrow for Python, and the decoded rows back for the
   write: most of the decode stage (docs/sds.md, "Auditing a channel"). This needs ``data_dir`` and
   ``out_dir`` on a filesystem shared by the driver and every executor (``local[*]``, the
   standalone cluster on one machine); the driver fails with ``JobFailed`` naming a part file
   it cannot see;
2. keeps the first copy of each message id (later copies of a content message are resends or
   SDS-R repair responses) and computes, per participant (grouped by sender, ``applyInArrow``),
   which content messages of others it *showed it held* in its own later messages — the id in
   the message's causal history or in its bloom filter (``loglake.sds.bloom.contains``, the
   filter's own bit layout) — with the first such message's position and time: an
   acknowledgement and its latency;
3. joins causal histories with first positions (dependencies never on the channel, and
   dependencies referenced before they appeared), repair requests with the copies that answered
   them, and writes the tables and ``report.html``. The two large tables are written by tasks
   with pyarrow, not Spark's writer (docs/sds.md, "Auditing a channel"): ``acks`` by each sender's
   sweep task, ``messages`` by a task per decoded part file, which reads the causal histories
   from that file itself (``_write_part``: temporary name, then rename).

Definitions (docs/sds.md "Auditing a channel" has them with the ground-truth mapping):
- *acknowledged by j at position q*: q is the first message authored by j (a content or sync
  message whose ``sender_id`` is j, first copy) after the message's first position whose causal
  history lists it or whose bloom filter contains it;
- *ack latency*: timestamp of q minus timestamp of the message's first copy (log time);
- *delivery ratio of j*: messages acknowledged by j / content messages of others whose first copy
  precedes j's last message (what j could have shown);
- *unresolved dependencies of j*: ids in the causal histories of messages j acknowledged (or
  sent) that j never acknowledged;
- *never delivered*: a causal-history id with no content message on the channel.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from loglake.log.api import STREAM_NAME_RE
from loglake.pipeline.errors import BadOption
from loglake.pipeline.output_dir import staged_output
from loglake.pipeline.units import Unit
from loglake.sds import DECODED_SCHEMA, decode_batches, history_lists

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TABLES = ("messages", "acks", "participants", "repairs", "rejects")
MESSAGES_COLUMNS = (
    "message_id",
    "partition",
    "first_index",
    "first_timestamp_ns",
    "kind",
    "sender",
    "lamport",
    "causal_history",
    "repair_request",
    "content_bytes",
    "copies",
    "never_delivered_deps",
    "deps_seen_later",
    "acknowledged_by",
    "first_ack_ms",
    "last_ack_ms",
    "repair_requests",
    "repair_responses",
)
WORK_DIR = "_work"  # the decoded records while the job runs (removed at the end)

ACKS_SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("participant", pa.string()),
        ("ack_index", pa.int64()),
        ("ack_timestamp_ns", pa.int64()),
        ("latency_ms", pa.float64()),
        ("via", pa.string()),  # causal_history | bloom_filter
    ]
)

PARTICIPANT_SWEEP_SCHEMA = pa.schema(
    [
        ("participant", pa.string()),
        ("messages_sent", pa.int64()),
        ("syncs_sent", pa.int64()),
        ("last_index", pa.int64()),
        ("expected", pa.int64()),
        ("acknowledged", pa.int64()),
        ("delivery_ratio", pa.float64()),
        ("ack_p50_ms", pa.float64()),
        ("ack_p90_ms", pa.float64()),
        ("ack_p99_ms", pa.float64()),
        ("not_acknowledged", pa.list_(pa.string())),
    ]
)


@dataclass(frozen=True)
class SdsAuditOptions:
    data_dir: str
    stream: str
    out_dir: str
    channel: str | None = None  # default: the stream name without "sds."
    partition: int = 0
    report: bool = True
    overwrite: bool = False

    def validate(self) -> SdsAuditOptions:
        """Every option checked before any work; errors name the option."""
        d = Path(self.data_dir).expanduser()
        if not d.is_dir():
            raise BadOption("--data-dir", self.data_dir, "not a directory")
        if not STREAM_NAME_RE.match(self.stream or ""):
            raise BadOption("--stream", self.stream, "not a stream name")
        if self.partition < 0:
            raise BadOption("--partition", self.partition, "must be >= 0")
        from loglake.pipeline.options import parse_options, resolve_stream

        try:
            layout = resolve_stream(parse_options({"data_dir": str(d), "stream": self.stream}))
        except Exception as e:
            raise BadOption("--stream", self.stream, f"no such stream in {d} ({e})") from None
        if self.partition not in layout.partitions:
            raise BadOption("--partition", self.partition, f"{self.stream} has no such partition")
        if self.channel is not None and not self.channel:
            raise BadOption("--channel", self.channel, "empty channel id")
        out = Path(self.out_dir).expanduser()
        if out.exists() and not out.is_dir():
            raise BadOption("--out", self.out_dir, "exists and is not a directory")
        earlier = (out / "summary.json").exists()
        if out.exists() and any(out.iterdir()) and not self.overwrite and not earlier:
            raise BadOption("--out", self.out_dir, "not empty and not an earlier audit")
        return SdsAuditOptions(
            str(d.resolve()),
            self.stream,
            str(out.resolve()),
            self.channel if self.channel is not None else _channel_of(self.stream),
            self.partition,
            self.report,
            self.overwrite,
        )


def _channel_of(stream: str) -> str:
    return stream[4:] if stream.startswith("sds.") else stream


@dataclass
class AuditSummary:
    stream: str
    channel: str
    records: int = 0
    rejects: int = 0
    content_messages: int = 0
    sync_messages: int = 0
    ephemeral_messages: int = 0
    duplicate_copies: int = 0
    participants: int = 0
    acks: int = 0
    repair_requests: int = 0
    repair_responses: int = 0
    never_delivered: int = 0
    seconds: float = 0.0
    reject_reasons: dict[str, int] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # wall time per output

    def lap(self, stage: str, since: float) -> float:
        now = time.monotonic()
        self.stage_seconds[stage] = round(now - since, 3)
        return now

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- executors -------------------------------------------------------------------------------


def nearest_rank(sorted_xs: list[float], p: float) -> float | None:
    """The percentile used everywhere here (and by ``loglake.sds.sim``): ``xs[min(n-1, ⌊p·n⌋)]``
    of the sorted values; None when there are none."""
    if not sorted_xs:
        return None
    return sorted_xs[min(len(sorted_xs) - 1, int(p * len(sorted_xs)))]


def sweep_participant(
    participant: str,
    own: pa.Table,
    content_ids: list[str],
    content_first: list[int],
    content_ts: list[int],
    content_sender: list[str],
    positions: Positions | None = None,
) -> tuple[pa.Table, pa.Table]:
    """One participant's acknowledgements (``ACKS_SCHEMA``) and figures
    (``PARTICIPANT_SWEEP_SCHEMA``). ``own``: its first-copy content and sync messages (index,
    timestamp_ns, kind, causal_new, bloom_filter), ordered by index; ``content_*``: every
    content message's first copy, ordered by position. Without bloom filters the sweep is
    ``_sweep_arrays`` (the same result, in Arrow and numpy), with ``positions`` if given."""
    if own.column("bloom_filter").null_count == own.num_rows:
        return _sweep_arrays(
            participant,
            own,
            _ContentArrays.of(content_ids, content_first, content_ts, content_sender),
            positions,
        )
    return _sweep_loop(participant, own, content_ids, content_first, content_ts, content_sender)


@dataclass
class _ContentArrays:
    """Every content message's first copy (ordered by position) as Arrow/numpy arrays, made
    once per Python worker and broadcast (``of`` keeps the last one)."""

    ids: pa.Array
    first: Any  # np.ndarray[int64]
    ts: Any  # np.ndarray[int64]
    sender: pa.Array

    @staticmethod
    def of(ids: list[str], first: list[int], ts: list[int], sender: list[str]) -> _ContentArrays:
        import numpy as np

        key = (id(ids), id(first), id(ts), id(sender))
        hit = _CONTENT_CACHE.get(key)
        if hit is None or hit[0] is not ids:
            arrays = _ContentArrays(
                pa.array(ids, pa.string()),
                np.array(first, dtype=np.int64),
                np.array(ts, dtype=np.int64),
                pa.array(sender, pa.string()),
            )
            _CONTENT_CACHE.clear()
            _CONTENT_CACHE[key] = hit = (ids, arrays)
        return hit[1]


_CONTENT_CACHE: dict[tuple[int, ...], tuple[list[str], _ContentArrays]] = {}


Positions = tuple[Any, pa.Array, Any]
"""``_causal_positions``'s answer: (rows ndarray, ids, positions ndarray)."""


def _causal_positions(own: pa.Table, content: _ContentArrays) -> Positions:
    """Every ``causal_new`` entry of ``own``: its row (``rows``), its id (``values``) and the
    position of that id among the content ids (``pos``, -1 where none), from one ``index_in``.
    The sweep and ``dependency_figures`` both need it for the same table: the sweep's task
    computes it once and passes it to both."""
    import numpy as np
    import pyarrow.compute as pc

    causal = own.column("causal_new").combine_chunks()
    offs = np.asarray(causal.offsets, dtype=np.int64)
    n_own = len(causal)
    rows = np.repeat(np.arange(n_own, dtype=np.int64), np.diff(offs))
    values = causal.values.slice(int(offs[0]), int(offs[-1] - offs[0])) if n_own else causal.values
    found = pc.fill_null(pc.index_in(values, value_set=content.ids), -1)
    pos = np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)
    return rows, values, pos


def _sweep_arrays(
    participant: str, own: pa.Table, content: _ContentArrays, positions: Positions | None = None
) -> tuple[pa.Table, pa.Table]:
    """``_sweep_loop`` for messages without bloom filters: message c (of another sender) is
    acknowledged at the first own message q after its first copy whose ``causal_new`` lists it;
    the (q, c) pairs come from one ``index_in`` of all the ids against the content ids, and the
    first q per c from a stable sort."""
    import numpy as np
    import pyarrow.compute as pc

    idxs = own.column("index").to_numpy()
    tss = own.column("timestamp_ns").to_numpy()
    kinds = own.column("kind")
    n_own = len(idxs)
    rows, _, pos = positions or _causal_positions(own, content)
    hit = pos >= 0
    j, c = rows[hit], pos[hit]
    others = np.asarray(pc.not_equal(content.sender, participant).to_numpy(zero_copy_only=False))
    keep = others[c] & (content.first[c] < idxs[j])
    j, c = j[keep], c[keep]
    order = np.argsort(c, kind="stable")  # j ascending within each c
    c_sorted = c[order]
    uc, at = np.unique(c_sorted, return_index=True)
    uj = j[order][at]
    by_q = np.lexsort((uc, uj))  # acks in the loop's order: by q, then position
    uc, uj = uc[by_q], uj[by_q]
    lat = (tss[uj] - content.ts[uc]) / 1e6
    n_acked = len(uc)
    acks = pa.table(
        [
            content.ids.take(pa.array(uc)),
            pa.array([participant] * n_acked, pa.string()),
            pa.array(idxs[uj], pa.int64()),
            pa.array(tss[uj], pa.int64()),
            pa.array(lat, pa.float64()),
            pa.array(["causal_history"] * n_acked, pa.string()),
        ],
        schema=ACKS_SCHEMA,
    )
    last_q = int(idxs[-1]) if n_own else None
    k = 0 if last_q is None else int(np.searchsorted(content.first, last_q, side="left"))
    pending = others[:k].copy()
    pending[uc] = False
    not_acked = content.ids.take(pa.array(np.flatnonzero(pending)))
    not_acked = not_acked.take(pc.sort_indices(not_acked))
    seen = int(others[:k].sum())
    latencies = np.sort(lat).tolist()
    row = {
        "participant": [participant],
        "messages_sent": [pc.sum(pc.equal(kinds, "content")).as_py() or 0],
        "syncs_sent": [pc.sum(pc.equal(kinds, "sync")).as_py() or 0],
        "last_index": [last_q],
        "expected": [seen],
        "acknowledged": [n_acked],
        "delivery_ratio": [n_acked / seen if seen else None],
        "ack_p50_ms": [nearest_rank(latencies, 0.5)],
        "ack_p90_ms": [nearest_rank(latencies, 0.9)],
        "ack_p99_ms": [nearest_rank(latencies, 0.99)],
        "not_acknowledged": [not_acked.to_pylist()],
    }
    return acks, pa.Table.from_pydict(row, schema=PARTICIPANT_SWEEP_SCHEMA)


def _sweep_loop(
    participant: str,
    own: pa.Table,
    content_ids: list[str],
    content_first: list[int],
    content_ts: list[int],
    content_sender: list[str],
) -> tuple[pa.Table, pa.Table]:
    """The sweep message by message (any message with a bloom filter); ``own`` sorted."""
    from loglake.sds import BloomFilter, contains

    positions_of = BloomFilter().positions
    idxs = own.column("index").to_pylist()
    tss = own.column("timestamp_ns").to_pylist()
    kinds = own.column("kind").to_pylist()
    causal = own.column("causal_new").to_pylist()
    blooms = own.column("bloom_filter").to_pylist()
    pending: dict[str, tuple[int, int, tuple[int, ...] | None]] = {}
    acks: dict[str, list[Any]] = {n: [] for n in ACKS_SCHEMA.names}
    latencies: list[float] = []
    k = 0
    seen = 0
    n_content = len(content_ids)
    for q, ts, hist, bloom in zip(idxs, tss, causal, blooms, strict=True):
        while k < n_content and content_first[k] < q:
            if content_sender[k] != participant:
                pending[content_ids[k]] = (content_first[k], content_ts[k], None)
                seen += 1
            k += 1
        if not pending:
            continue
        hits: list[tuple[str, str]] = []
        in_hist: set[str] = set()
        for mid in hist or ():
            if mid in pending and mid not in in_hist:  # an id twice in a history: one ack
                in_hist.add(mid)
                hits.append((mid, "causal_history"))
        if bloom is not None:
            for mid, (first, t0, pos) in list(pending.items()):
                if mid in in_hist:
                    continue
                if pos is None:
                    pos = positions_of(mid)
                    pending[mid] = (first, t0, pos)
                if contains(bloom, pos):
                    hits.append((mid, "bloom_filter"))
        for mid, via in hits:
            _, t0, _ = pending.pop(mid)
            lat = (ts - t0) / 1e6
            latencies.append(lat)
            for col, v in zip(ACKS_SCHEMA.names, (mid, participant, q, ts, lat, via), strict=True):
                acks[col].append(v)
    latencies.sort()
    n_acked = len(latencies)
    row = {
        "participant": [participant],
        "messages_sent": [kinds.count("content")],
        "syncs_sent": [kinds.count("sync")],
        "last_index": [idxs[-1] if idxs else None],
        "expected": [seen],
        "acknowledged": [n_acked],
        "delivery_ratio": [n_acked / seen if seen else None],
        "ack_p50_ms": [nearest_rank(latencies, 0.5)],
        "ack_p90_ms": [nearest_rank(latencies, 0.9)],
        "ack_p99_ms": [nearest_rank(latencies, 0.99)],
        "not_acknowledged": [sorted(pending)],
    }
    return (
        pa.Table.from_pydict(acks, schema=ACKS_SCHEMA),
        pa.Table.from_pydict(row, schema=PARTICIPANT_SWEEP_SCHEMA),
    )


LATE_SCHEMA = pa.schema([("message_id", pa.string()), ("deps_seen_later", pa.int64())])


def dependency_figures(
    own: pa.Table, content: _ContentArrays, positions: Positions | None = None
) -> tuple[pa.Table, list[str]]:
    """From one sender's first-copy content and sync messages (``message_id``, ``index``,
    ``causal_new``): per message, how many of its ``causal_new`` entries are content messages
    whose first copy comes after it (``LATE_SCHEMA``; messages with a count above 0 only), and
    the ``causal_new`` ids of no content message (never delivered; distinct, sorted).

    ``causal_new`` is enough, as in the sweep: an id left out of it was in the same sender's
    earlier message, where it was counted (a reference made before the message was on the
    channel counts where it was made first), and every id of every history is in some
    message's ``causal_new``. One ``index_in`` a sender, in the sweep's task: no exploded
    (message, id) rows and no join in Spark."""
    import numpy as np

    n_own = own.num_rows
    rows, values, pos = positions or _causal_positions(own, content)
    hit = pos >= 0
    idxs = own.column("index").to_numpy()
    later = np.zeros(len(pos), dtype=bool)
    later[hit] = content.first[pos[hit]] > idxs[rows[hit]]
    counts = np.bincount(rows[later], minlength=n_own)
    some = np.flatnonzero(counts > 0)
    late = pa.table(
        [
            own.column("message_id").combine_chunks().take(pa.array(some)),
            pa.array(counts[some], pa.int64()),
        ],
        schema=LATE_SCHEMA,
    )
    missing = values.filter(pa.array(~hit))
    never = sorted(set(missing.to_pylist()))
    return late, never


SWEEP_OUT_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("acks_file", pa.string()),  # "participant": the part file of ``acks`` it wrote
        ("participant", pa.struct(list(PARTICIPANT_SWEEP_SCHEMA))),
        ("message_id", pa.string()),  # "late": a message with references seen later ...
        ("deps_seen_later", pa.int64()),  # ... and how many
        ("dep", pa.string()),  # "never": a referenced id of no content message
    ]
)


def _sweep_group(content_bc: Any, acks_dir: str) -> Callable[[pa.Table], pa.Table]:
    """The ``applyInArrow`` function, one sender's first-copy content and sync messages in:
    its acknowledgements written as a part file of ``acks`` in ``acks_dir`` (``_write_part``,
    named by the sender: the table's rows never pass through Spark's writer, which turned
    them from Arrow into JVM rows), its figures (one "participant" row, naming the file), and
    the dependency figures of its messages (``dependency_figures``: "late" and "never"
    rows)."""

    def run(own: pa.Table) -> pa.Table:
        import hashlib

        content = content_bc.value
        participant = own.column("sender")[0].as_py()
        own = own.sort_by("index")
        arrays = _ContentArrays.of(
            content["ids"], content["first"], content["ts"], content["sender"]
        )
        positions = _causal_positions(own, arrays)  # one index_in, for both below
        acks, part = sweep_participant(
            participant,
            own,
            content["ids"],
            content["first"],
            content["ts"],
            content["sender"],
            positions,
        )
        late, never = dependency_figures(own, arrays, positions)
        key = hashlib.sha1(str(participant).encode()).hexdigest()[:20]
        path, _ = _write_part(acks_dir, f"part-{key}.zstd.parquet", ACKS_SCHEMA, acks.to_batches())
        n_late, n_never = late.num_rows, len(never)
        n = 1 + n_late + n_never
        lead = 1
        part_struct = pa.StructArray.from_arrays(
            [c.combine_chunks() for c in part.columns], fields=list(PARTICIPANT_SWEEP_SCHEMA)
        )
        tables = pa.array(
            ["participant"] + ["late"] * n_late + ["never"] * n_never,
            pa.string(),
        )
        file_col = pa.array([path] + [None] * (n - 1), pa.string())
        part_col = pa.concat_arrays([part_struct, pa.nulls(n - lead, part_struct.type)])
        mid_col = pa.concat_arrays(
            [
                pa.nulls(lead, pa.string()),
                late.column("message_id").combine_chunks(),
                pa.nulls(n_never, pa.string()),
            ]
        )
        late_col = pa.concat_arrays(
            [
                pa.nulls(lead, pa.int64()),
                late.column("deps_seen_later").combine_chunks(),
                pa.nulls(n_never, pa.int64()),
            ]
        )
        dep_col = pa.concat_arrays(
            [pa.nulls(lead + n_late, pa.string()), pa.array(never, pa.string())]
        )
        return pa.Table.from_arrays(
            [tables, file_col, part_col, mid_col, late_col, dep_col], schema=SWEEP_OUT_SCHEMA
        )

    return run


def _references(
    cand_bc: Any,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: (message_id, history_ids, history_lens) → (message_id, dep)
    for every causal-history entry that is a candidate (``cand_bc``), in C per batch."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np
        import pyarrow.compute as pc

        wanted = pa.array(cand_bc.value, pa.string())
        for batch in batches:
            hist = history_lists(batch.column("history_ids"), batch.column("history_lens"))
            offs = np.asarray(hist.offsets, dtype=np.int64)
            rows = np.repeat(np.arange(len(hist), dtype=np.int64), np.diff(offs))
            values = (
                hist.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
                if len(hist)
                else hist.values
            )
            hit = np.asarray(pc.is_in(values, value_set=wanted).to_numpy(zero_copy_only=False))
            yield pa.RecordBatch.from_arrays(
                [
                    batch.column("message_id").take(pa.array(rows[hit])),
                    values.filter(pa.array(hit)),
                ],
                names=["message_id", "dep"],
            )

    return run


def _write_part(
    folder: str, name: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch]
) -> tuple[str, int]:
    """``batches`` written by a task as ``folder/name``, a zstd Parquet file of ``schema``,
    under a hidden temporary name, then renamed: a retried or speculative attempt rewrites the
    same file whole. Why zstd: rows that repeat their neighbours' (causal histories, ids)
    stay small, as for the decoded rows. Returns the file's path and its row count."""
    import os
    import uuid

    import pyarrow.parquet as pq

    path = os.path.join(folder, name)
    tmp = os.path.join(folder, f".{name}-{uuid.uuid4().hex[:8]}.tmp")
    rows = 0
    with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
        for batch in batches:
            w.write_batch(batch.cast(schema))
            rows += batch.num_rows
    os.replace(tmp, path)
    return path, rows


def _write_messages(out_dir: str, schema: pa.Schema) -> Callable[[pa.Table], pa.Table]:
    """The ``applyInArrow`` function that writes ``messages`` itself, one part file
    (``_write_part``) per decoded part file: the group is the first copies whose decoded row
    is in that file (every column but the history), and the task reads their causal histories
    from the file with pyarrow, a row group at a time, in index order, and expands them
    (``history_lists``). Why: Spark's writer turned each of the 200 ids of every history from
    Arrow into a JVM row, and then the JVM still read the packed histories (13 KB a row) to
    hand them to a task as Arrow; now the histories go from the decoded file to the table's
    file inside one Python process."""

    def run(rows: pa.Table) -> pa.Table:
        import os
        from urllib.parse import unquote, urlparse

        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        uri = rows.column(DECODED_FILE)[0].as_py()
        source = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
        rows = rows.drop_columns([DECODED_FILE]).sort_by("first_index")
        want = rows.column("first_index").combine_chunks()

        def batches() -> Iterator[pa.RecordBatch]:
            done = 0
            columns = ["index", "history_ids", "history_lens"]
            for b in pq.ParquetFile(source).iter_batches(DECODE_BATCH, columns=columns):
                got = b.filter(pc.is_in(b.column("index"), value_set=want))
                if not got.num_rows:
                    continue
                part = rows.slice(done, got.num_rows)
                if not part.column("first_index").combine_chunks().equals(got.column("index")):
                    raise ValueError(f"{source}: decoded rows out of step with the first copies")
                done += got.num_rows
                hist = history_lists(got.column("history_ids"), got.column("history_lens"))
                cols = [
                    hist if n == "causal_history" else part.column(n).combine_chunks()
                    for n in schema.names
                ]
                yield pa.RecordBatch.from_arrays(cols, names=schema.names)
            if done != rows.num_rows:
                raise ValueError(f"{source}: {rows.num_rows - done} first copies not found")

        name = os.path.basename(source).split(".")[0]  # part-00003 (the decode task's)
        path, _ = _write_part(out_dir, f"{name}.zstd.parquet", schema, batches())
        return pa.table({"path": [path]})

    return run


def _messages_schema(schema: Any) -> Any:
    """The ``messages`` table's Spark schema, from that of its other columns."""
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType

    fields = {f.name: f for f in schema.fields}
    out: list[Any] = []
    for name in MESSAGES_COLUMNS:
        if name == "causal_history":
            out.append(StructField(name, ArrayType(StringType(), True), True))
        elif name in _FILLED:  # never null (filled with 0), as written before
            out.append(StructField(name, fields[name].dataType, False))
        else:
            out.append(fields[name])
    return StructType(out)


_FILLED = ("acknowledged_by", "repair_requests", "repair_responses", "deps_seen_later")


# -- driver ----------------------------------------------------------------------------------


def _write_messages_table(messages: DataFrame, folder: Path) -> None:
    """``messages`` (every column but the history, and ``DECODED_FILE``) written to
    ``folder`` by ``_write_messages``, the histories added from the decoded files: the
    columns Spark's writer would have written, one file per decoded part file."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(_messages_schema(messages.schema))
    folder.mkdir(parents=True, exist_ok=True)
    written = (
        messages.groupBy(DECODED_FILE)
        .applyInArrow(_write_messages(str(folder), schema), "path string")
        .collect()
    )
    _check_parts(folder, [row["path"] for row in written], schema)


def _check_parts(folder: Path, paths: list[str], schema: pa.Schema, shared: str = "--out") -> None:
    """The part files tasks wrote into ``folder``, seen by the driver (``require_visible``;
    ``shared``: what must be on a shared filesystem); with none, the schema alone, for the
    readers of the table."""
    import pyarrow.parquet as pq

    from loglake.pipeline.units import require_visible

    for path in paths:
        require_visible(path, "sds-audit", shared)
    if not paths:
        pq.write_table(schema.empty_table(), folder / "part-empty.zstd.parquet")


def _spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


DECODE_COLUMNS = ("partition", "index", "timestamp_ns", "data")
DECODED_FILE = "_decoded_file"
"""The decoded part file a row was read from (Spark's ``_metadata.file_path``): the
``messages`` writer reads the row's causal history from there itself."""
DECODE_BATCH = 10_000
"""Records decoded at once (a row group of the part file): Spark's Arrow batch size, which
the decode was tuned with (a batch rebuilds the id array of the task's codes once)."""


DecodedPart = tuple[str, int, dict[str, int]]
"""A decode task's answer: its part file, its row count and its rejects per reason."""


def _decode_task(
    data_dir: str, channel: str, decoded_dir: str
) -> Callable[[tuple[int, list[Unit]]], DecodedPart]:
    """One decode task: its units (consecutive, in index order) read where they lie and
    decoded by one ``decode_batches`` state (``causal_new`` is against the previous message of
    the same sender read by this task), written as one part file of ``DECODED_SCHEMA``
    (``_write_part``). Returned: the file's path, its row count and its rejects per reason,
    counted as the rows pass: the summary's records and rejects then cost no Spark job."""

    def run(task: tuple[int, list[Unit]]) -> DecodedPart:
        import pyarrow.compute as pc

        from loglake.pipeline.units import read_unit_columns

        k, units = task
        reasons: dict[str, int] = {}

        def batches() -> Iterator[pa.RecordBatch]:
            for u in units:
                yield from read_unit_columns(data_dir, u, DECODE_COLUMNS, batch_rows=DECODE_BATCH)

        def counted(decoded: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for b in decoded:
                bad = b.column("reason").filter(pc.invert(b.column("ok")))
                for r in pc.value_counts(bad).to_pylist():
                    key = str(r["values"])  # as the table's groupBy("reason") names it
                    reasons[key] = reasons.get(key, 0) + int(r["counts"])
                yield b

        name = f"part-{k:05d}.zstd.parquet"
        path, rows = _write_part(
            decoded_dir, name, DECODED_SCHEMA, counted(decode_batches(channel)(batches()))
        )
        return path, rows, reasons

    return run


def _task_groups(units: list[Unit], n: int) -> list[list[Unit]]:
    """``units`` (sorted by index) cut into at most ``n`` runs of consecutive units of about
    equal record counts: each run one task, so a task reads a contiguous index range and its
    decode state carries from one unit to the next (a sender's first message in a task has
    all its history in ``causal_new``)."""
    total = sum(u.end - u.start for u in units)
    n = max(1, min(n, len(units)))
    groups: list[list[Unit]] = [[]]
    done = 0
    for u in units:
        if groups[-1] and done >= total * len(groups) / n:
            groups.append([])
        groups[-1].append(u)
        done += u.end - u.start
    return [g for g in groups if g]


def _decode_stage(
    spark: SparkSession, opts: SdsAuditOptions, decoded: Path
) -> tuple[int, dict[str, int]]:
    """Every record of the channel's partition decoded into ``decoded`` (Parquet part files of
    ``DECODED_SCHEMA``), by plain tasks over units planned here from metadata. Returned: the
    records decoded and the rejects per reason, from the tasks' own counts."""
    from loglake.pipeline.units import plan_units

    assert opts.channel is not None
    units = plan_units(opts.data_dir, {0: opts.stream}, opts.partition)[0]
    decoded.mkdir(parents=True, exist_ok=True)
    sc = spark.sparkContext
    groups = _task_groups(units, 2 * max(1, sc.defaultParallelism))
    task = _decode_task(opts.data_dir, opts.channel, str(decoded))
    parts = (
        sc.parallelize(list(enumerate(groups)), len(groups)).map(task).collect() if groups else []
    )
    # an empty channel: the schema alone, for the reads that follow
    _check_parts(decoded, [p[0] for p in parts], DECODED_SCHEMA, "--out (and the data dir)")
    reasons: dict[str, int] = {}
    for _, _, counts in parts:
        for k, v in counts.items():
            reasons[k] = reasons.get(k, 0) + v
    return sum(p[1] for p in parts), reasons


def run(spark: SparkSession, opts: SdsAuditOptions) -> AuditSummary:
    """The audit; ``opts`` must be ``validate()``d. Tables go to ``out/<table>/`` (Parquet),
    ``out/summary.json`` and ``out/report.html``."""
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    assert opts.channel is not None
    summary = AuditSummary(opts.stream, opts.channel)
    audit_files = {*TABLES, "summary.json", "report.html", WORK_DIR}

    # The audit is written into a staging folder beside --out and swapped in whole once
    # durable (pipeline.output_dir): a crash or a failure leaves the previous audit, whole.
    # Files in --out that are not the audit's (--overwrite) are carried over.
    with staged_output(opts.out_dir, keep=lambda name: name not in audit_files) as stage:
        staged = dataclasses.replace(opts, out_dir=str(stage))
        # decoded once, to Parquet: later passes read only the columns they need (the 200-id
        # causal histories twice: dependencies on candidates, the messages table), where a
        # cached DataFrame (DISK_ONLY: 13 KB a row) was read back whole by every pass. zstd,
        # not snappy: a packed history mostly repeats the previous row's, which snappy's 64 KB
        # blocks do not see across rows and zstd does (the benchmark's 20k channel: 149 → 4 MB)
        work = stage / WORK_DIR
        try:
            summary.records, reasons = _decode_stage(spark, staged, work / "decoded")
            summary.rejects = sum(reasons.values())
            summary.reject_reasons = dict(sorted(reasons.items()))
            decoded = spark.read.parquet(str(work / "decoded")).withColumn(
                DECODED_FILE, F.col("_metadata.file_path")
            )
            result = _audit(spark, staged, decoded, summary, t0, F)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return result


def _audit(
    spark: SparkSession,
    opts: SdsAuditOptions,
    decoded: DataFrame,
    summary: AuditSummary,
    t0: float,
    F: Any,  # pyspark.sql.functions, imported where Spark runs
) -> AuditSummary:
    out = Path(opts.out_dir)
    rejects = decoded.where(~F.col("ok")).select(
        "partition", "index", "timestamp_ns", "reason", "detail"
    )
    rejects.orderBy("index").write.parquet(str(out / "rejects"))
    lap = summary.lap("decode + rejects", t0)
    good = decoded.where(F.col("ok")).drop("ok", "reason", "detail")

    # first copy of each message id; later copies counted (resends, repair responses). Only
    # ids and indexes are shuffled: the first copies are the records minus the (few) later
    # copies, removed by a broadcast anti-join, so no row with its history moves
    firsts = (
        good.groupBy("message_id")
        .agg(F.min("index").alias("first_index"), F.count(F.lit(1)).alias("copies"))
        .persist()
    )
    later = (
        good.select("message_id", "index")
        .join(firsts, "message_id")
        .where(F.col("index") != F.col("first_index"))
        .select("index")
        .persist()
    )
    first = good.join(F.broadcast(later), "index", "left_anti")

    content = first.where(F.col("kind") == "content").select(
        "message_id", "index", "timestamp_ns", "sender"
    )
    # ordered here, not by Spark: a sort in Spark is two more jobs (sampling, range shuffle)
    ct = content.toArrow().sort_by("index")
    content_bc = spark.sparkContext.broadcast(
        {
            "ids": ct.column("message_id").to_pylist(),
            "first": ct.column("index").to_pylist(),
            "ts": ct.column("timestamp_ns").to_pylist(),
            "sender": ct.column("sender").to_pylist(),
        }
    )
    try:
        swept = (
            first.where(F.col("kind").isin("content", "sync"))
            .select(
                "sender",
                "message_id",
                "index",
                "timestamp_ns",
                "kind",
                "causal_new",
                "bloom_filter",
            )
            .groupBy("sender")
            .applyInArrow(
                _sweep_group(content_bc, str(out / "acks")), _spark_schema(SWEEP_OUT_SCHEMA)
            )
            .persist()
        )
        (out / "acks").mkdir(parents=True, exist_ok=True)
        files = (
            swept.where(F.col("table") == "participant")
            .select("acks_file", "participant.acknowledged", "participant.not_acknowledged")
            .collect()
        )
        _check_parts(out / "acks", [r[0] for r in files], ACKS_SCHEMA)
        # one row per sender, each naming its acks: the summary's counts, with no job of their own
        summary.participants = len(files)
        summary.acks = sum(int(r[1]) for r in files)
        acks = spark.read.parquet(str(out / "acks"))
        lap = summary.lap("first copies + ack sweep", lap)
        sweep_parts = swept.where(F.col("table") == "participant").select("participant.*")

        # dependencies, from the sweep's own pass over ``causal_new`` (``dependency_figures``):
        # the ids never on the channel, and "referenced before it was on the channel"
        # (made distinct here: the rows are few, and a distinct in Spark is a shuffle)
        never = sorted(
            {r[0] for r in swept.where(F.col("table") == "never").select("dep").collect()}
        )
        late = swept.where(F.col("table") == "late").select("message_id", "deps_seen_later")
        # candidates for "unresolved": never on the channel, or not acknowledged by someone
        not_acked = sweep_parts.select(
            "participant", F.explode("not_acknowledged").alias("dep")
        ).persist()
        # the full histories are read once, for the references to candidates only (none
        # when there is no candidate: every dependency on the channel and acknowledged); the
        # candidates come from the participants' rows the driver already holds
        cands = sorted({d for r in files for d in r[2] or ()} | set(never))
        if cands:
            cand_bc = spark.sparkContext.broadcast(cands)
            cand_edges = (
                first.where(F.col("kind") != "ephemeral")
                .select("message_id", "history_ids", "history_lens")
                .mapInArrow(_references(cand_bc), "message_id string, dep string")
                .persist()
            )
        else:
            cand_bc = None
            cand_edges = spark.createDataFrame([], "message_id string, dep string")
        never_df = spark.createDataFrame([(d,) for d in never], "dep string")
        dep_stats = (
            cand_edges.join(F.broadcast(never_df), "dep")
            .groupBy("message_id")
            .agg(F.sort_array(F.collect_set("dep")).alias("never_delivered_deps"))
        )
        ack_stats = acks.groupBy("message_id").agg(
            F.count(F.lit(1)).alias("acknowledged_by"),
            F.min("latency_ms").alias("first_ack_ms"),
            F.max("latency_ms").alias("last_ack_ms"),
        )

        # repair requests, answered by the first copy after them
        requests = first.select(
            F.col("sender").alias("requester"),
            F.col("index").alias("request_index"),
            F.col("timestamp_ns").alias("request_timestamp_ns"),
            F.explode("repair_request").alias("message_id"),
        )
        copies = good.where(F.col("kind") == "content").select(
            "message_id",
            F.col("index").alias("copy_index"),
            F.col("timestamp_ns").alias("copy_timestamp_ns"),
        )
        answered = (
            requests.join(copies, "message_id", "left")
            .where(F.col("copy_index").isNull() | (F.col("copy_index") > F.col("request_index")))
            .groupBy("requester", "request_index", "request_timestamp_ns", "message_id")
            .agg(F.min(F.struct("copy_index", "copy_timestamp_ns")).alias("r"))
        )
        # requests with no later copy are kept: the left join above kept nothing for them
        repairs = requests.join(
            answered.select("requester", "request_index", "message_id", "r"),
            ["requester", "request_index", "message_id"],
            "left",
        ).select(
            "message_id",
            "requester",
            "request_index",
            "request_timestamp_ns",
            F.col("r.copy_index").alias("response_index"),
            F.col("r.copy_timestamp_ns").alias("response_timestamp_ns"),
            ((F.col("r.copy_timestamp_ns") - F.col("request_timestamp_ns")) / 1e6).alias(
                "response_ms"
            ),
        )
        repairs.write.parquet(str(out / "repairs"))
        lap = summary.lap("dependencies + repairs", lap)

        # from the table just written: the plan of ``repairs`` (two joins) is not run again
        requested = (
            spark.read.parquet(str(out / "repairs"))
            .groupBy("message_id")
            .agg(
                F.count(F.lit(1)).alias("repair_requests"),
                F.count("response_index").alias("repair_responses"),
            )
        )
        # per-message figures, all keyed by id and small, broadcast to the first copies (a
        # shuffle join would move every causal history)
        stats = (
            firsts.select("message_id", "copies")
            .join(dep_stats, "message_id", "left")
            .join(late, "message_id", "left")
            .join(ack_stats, "message_id", "left")
            .join(requested, "message_id", "left")
        )
        messages = (
            first.select(
                F.col("partition"),
                F.col("index").alias("first_index"),
                F.col("timestamp_ns").alias("first_timestamp_ns"),
                "kind",
                "message_id",
                "sender",
                "lamport",
                "repair_request",
                "content_bytes",
                DECODED_FILE,
            )
            .join(F.broadcast(stats), "message_id", "left")
            .fillna(0, list(_FILLED))
            .withColumn(
                "never_delivered_deps",
                F.coalesce(F.col("never_delivered_deps"), F.array().cast("array<string>")),
            )
        )
        messages = messages.select(
            *[c for c in MESSAGES_COLUMNS if c != "causal_history"], DECODED_FILE
        )
        _write_messages_table(messages, out / "messages")
        lap = summary.lap("messages", lap)

        # unresolved: a dependency of a message j held (acknowledged or sent) that j never
        # acknowledged: never on the channel, or in j's not-acknowledged list
        held_cand = (
            acks.select("participant", "message_id")
            .join(F.broadcast(cand_edges.select("message_id").distinct()), "message_id")
            .unionByName(content.select(F.col("sender").alias("participant"), "message_id"))
            .join(F.broadcast(cand_edges), "message_id")
            .select("participant", "dep")
            .distinct()
        )
        missing_for = not_acked.unionByName(
            sweep_parts.select("participant").crossJoin(F.broadcast(never_df))
        ).distinct()
        unresolved = (
            held_cand.join(missing_for, ["participant", "dep"])
            .groupBy("participant")
            .agg(F.sort_array(F.collect_list("dep")).alias("unresolved_deps"))
        )
        participants = (
            sweep_parts.join(unresolved, "participant", "left")
            .withColumn(
                "unresolved_deps",
                F.coalesce(F.col("unresolved_deps"), F.array().cast("array<string>")),
            )
            .withColumn("unresolved", F.size("unresolved_deps"))
        )
        participants.write.parquet(str(out / "participants"))
        lap = summary.lap("participants", lap)

        # the rest of the summary from the written tables, one job each: records, rejects,
        # participants and acks were counted by the tasks that made them
        by_kind = (
            spark.read.parquet(str(out / "messages"))
            .groupBy("kind")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum(F.col("copies") - 1).alias("dups"),
                F.sum(F.col("repair_responses")).alias("resp"),
            )
            .collect()
        )
        kinds: dict[str, int] = {r["kind"]: int(r["n"]) for r in by_kind}
        summary.content_messages = int(kinds.get("content", 0))
        summary.sync_messages = int(kinds.get("sync", 0))
        summary.ephemeral_messages = int(kinds.get("ephemeral", 0))
        summary.duplicate_copies = sum(int(r["dups"] or 0) for r in by_kind)
        summary.repair_requests = spark.read.parquet(str(out / "repairs")).count()
        summary.repair_responses = sum(int(r["resp"] or 0) for r in by_kind)
        summary.never_delivered = len(never)
        for df in (not_acked, cand_edges, firsts, later):
            df.unpersist()
        swept.unpersist()
        if cand_bc is not None:
            cand_bc.unpersist()
    finally:
        content_bc.unpersist()
    lap = summary.lap("summary", lap)
    summary.seconds = round(time.monotonic() - t0, 3)
    if opts.report:
        from loglake.pipeline.jobs.sds_audit_report import write_report

        write_report(spark, out, summary)
        summary.lap("report", lap)
        summary.seconds = round(time.monotonic() - t0, 3)
    (out / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
    return summary


def table(spark: SparkSession, out_dir: str, name: str) -> DataFrame:
    """One of the audit's tables (``TABLES``) as a DataFrame."""
    if name not in TABLES:
        raise BadOption("table", name, f"one of {', '.join(TABLES)}")
    return spark.read.parquet(str(Path(out_dir) / name))


def summarize(out_dir: str) -> AuditSummary:
    return AuditSummary(**json.loads((Path(out_dir) / "summary.json").read_text()))
