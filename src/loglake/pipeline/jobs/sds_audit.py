"""``sds-audit``: what happened in an SDS group chat, as Parquet tables and an HTML report.

Reads a stored SDS channel (a loglake stream, one partition) and:

1. decodes every record in executors with ``loglake.sds.codec`` (``parse`` + ``parse_entry``:
   the same checks a participant makes); a record that does not decode, names another channel,
   carries a bloom filter of the wrong length or is a content message whose id is not its
   content's SHA-256 becomes a ``rejects`` row (partition, index, reason, detail) and the job
   goes on; a bloom filter over-full for its capacity is read as none (it acknowledges
   nothing, as a participant counts it). The records never enter the JVM: the driver plans
   units from metadata (``loglake.pipeline.units``, as ``job archives-build``: the lake's
   visible files and the live tail's ranges), plain tasks read their units' columns where they
   lie, in index order, decode them (``decode_batches``) and write the decoded rows as Arrow
   IPC files (lz4 buffers) under ``_work/decoded`` themselves, the bloom filters apart, a
   record batch per sender, and the dictionary-encoded ids (``causal_new``, the stored
   histories) as codes into each batch's dictionary, in files beside (``WORK_SCHEMA``); later
   stages read those.
   Why: through ``loglake.pipeline.read`` + ``mapInArrow`` the JVM copied every record
   (~20 KB with a 200-entry history) from the lake into Arrow for Python, and the decoded rows
   back for the write: most of the decode stage (docs/sds.md, "Auditing a channel"). This
   needs ``data_dir`` and ``out_dir`` on a filesystem shared by the driver and every executor
   (``local[*]``, the standalone cluster on one machine); the driver fails with ``JobFailed``
   naming a part file it cannot see (the driver also reads the decoded files and the written
   tables itself);
2. on the driver, from the small columns of every decoded record read with pyarrow (no
   history, no bloom filter): the rejects, the first copy of each message id (later copies of a
   content message are resends or SDS-R repair responses) and the content messages;
3. sweeps, in plain tasks each holding a group of senders, which content messages of others
   each participant *showed it held* in its own later messages — the id in the message's
   causal history or in its bloom filter (``loglake.sds.bloom.contains_batch``, the filter's
   own bit layout) — with the first such message's position and time: an acknowledgement and its
   latency (``_sweep_task``: each sender's ``acks`` part file written with pyarrow);
4. joins, on the driver, what is keyed by id or index and small (acks per message, repairs,
   dependencies seen later) and has ``messages`` written by a task per decoded part file, which
   reads the causal histories from that file itself (``_messages_task``); then the
   participants' unresolved dependencies and the report. Why no Spark SQL: each join or
   aggregate was a Spark job (67 for a 1,000-message audit), most of the job's fixed cost.

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

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from loglake.log.api import STREAM_NAME_RE
from loglake.pipeline.errors import BadOption, raises_task_errors
from loglake.pipeline.output_dir import staged_output
from loglake.pipeline.units import Unit
from loglake.sds import (
    DECODED_SCHEMA,
    HISTORY_DICTIONARY,
    HISTORY_RUN_COLUMNS,
    IdIndex,
    decode_batches,
    dictionary_reference,
    first_rows,
    history_dictionary,
    history_lists,
    value_indices,
)
from loglake.wire import value_offsets

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from loglake.pipeline.options import SourceOptions

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
SESSION_CONF = {
    "spark.executorEnv.MIMALLOC_PURGE_DELAY": "-1",
    "spark.executorEnv.NUMPY_MADVISE_HUGEPAGE": "0",
    "spark.executorEnv.MIMALLOC_ALLOW_THP": "0",
    "spark.executorEnv.MALLOC_MMAP_MAX_": "0",
    "spark.executorEnv.MALLOC_TRIM_THRESHOLD_": str(1 << 36),
}
"""What the job's own session sets (``session_conf``: the CLI's and the benchmark's) for its
Python workers (their daemon reads them before it imports pyarrow and numpy).

``NUMPY_MADVISE_HUGEPAGE=0``: numpy asks for transparent huge pages for its large arrays (the
sweep's positions and permutations, ~80 MB each at 1M messages), which this kernel then
zeroes 2 MB at a time, compacting memory for them: two 1M sweep tasks at once, 4
alternations, system time 2.4-6.1 s without it, 1.6-2.8 s with it (1.9 s with it alone).

``MIMALLOC_PURGE_DELAY=-1``: the Arrow memory pool (mimalloc) keeps the memory it frees for
the tasks' next allocations instead of handing it back to the system 10 ms later. Why: the
tasks allocate and free buffers of hundreds of MB (decoded files' columns), and every page
handed back came back as a fresh one the kernel zeroed: two 1M sweep tasks at once, 4
alternations, system time 2.1-8.5 -> 1.6-3.8 s; the whole job at 1M, 5 alternations under load 2-5,
49.3-54.7 CPU-s (median 51.2) against 49.1-55.9 (median 53.6), inside this machine's noise.
The cost: a worker holds its peak (~1.3-2 GB at 1M messages) until it exits (Spark ends
idle workers after a minute).

``MIMALLOC_ALLOW_THP=0``: the Arrow memory pool asks for transparent huge pages for what it
maps, and the kernel zeroes each 2 MB page at its first touch: the decode's Parquet reads grow
~60 MB buffers by reallocation and the sweep allocates and frees large ones. With it, 1M
messages, quiet, 2 alternations against the same code without it: job 26.1/26.5 s against
26.9/26.8 s, 46.6/47.5 CPU-s against 48.0/48.1; system time of the decode 1.3/1.4 s against
2.9/3.0 (its user time grows about as much: more TLB misses on small pages) and of the sweep
2.6/2.7 against 3.8/3.6.

``MALLOC_MMAP_MAX_=0`` and ``MALLOC_TRIM_THRESHOLD_=2**36``: what ``MIMALLOC_PURGE_DELAY``
does for Arrow's pool, for glibc's malloc, numpy's allocator: its arrays of 128 KB and more
were each a fresh ``mmap`` handed back at ``free`` (the sweep's positions, permutations and
offsets, ~150 MB each at 1M messages, made and freed sender by sender), so every one was
faulted in again; from the heap, kept, they reuse the pages the last one freed. 1M messages,
two alternated pairs on a loaded machine: the sweep's minor page faults 0.69/0.72 M -> 0.53/
0.56 M (the fault count, not the time: its system time per fault here follows the load). The
cost is the same as mimalloc's: a worker holds its peak until it exits."""

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
        if not STREAM_NAME_RE.fullmatch(self.stream or ""):
            raise BadOption("--stream", self.stream, "not a stream name")
        if self.partition < 0:
            raise BadOption("--partition", self.partition, "must be >= 0")
        from loglake.pipeline.options import parse_options

        try:
            partitions = _stream_partitions(
                parse_options({"data_dir": str(d), "stream": self.stream})
            )
        except Exception as e:
            raise BadOption("--stream", self.stream, f"no such stream in {d} ({e})") from None
        if self.partition not in partitions:
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


def session_conf(conf: dict[str, str] | None = None) -> dict[str, str]:
    """The Spark configuration of the job's own session: ``SESSION_CONF`` under ``conf`` (a
    user's ``--spark-conf`` wins)."""
    return {**SESSION_CONF, **(conf or {})}


def _stream_partitions(opts: SourceOptions) -> set[int]:
    """The stream's partitions, as ``options.resolve_stream`` finds them; for the embedded log
    from its streams' configuration, without opening a partition. Why: opening one (as
    ``resolve_stream`` does, for the bounds) recovers it, reading every segment's index — about
    a CPU-second at 200,000 messages of this job's benchmark channel — and the plan
    (``units.plan_units``) opens it again for the same bounds."""
    from loglake.pipeline.lake import lake_partitions
    from loglake.pipeline.livelog import open_log_readonly
    from loglake.pipeline.options import resolve_stream

    if opts.backend or opts.url or not opts.data_dir:
        return set(resolve_stream(opts).partitions)
    parts = set(lake_partitions(opts.data_dir, opts.stream))
    try:
        log = open_log_readonly(opts.data_dir)
    except Exception:  # a lake-only data dir has no log to open
        log = None
    if log is not None:
        with log:
            if log.has_stream(opts.stream):
                parts |= set(range(log.partition_count(opts.stream)))
    if not parts:
        raise BadOption("stream", opts.stream, f"unknown stream in data_dir {opts.data_dir}")
    return parts


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


def _nearest_rank_of(sorted_xs: Any, p: float) -> float | None:
    """``nearest_rank`` of a sorted numpy array, as a Python float: the reference
    ``_nearest_ranks`` (what the sweep reads) is tested equal to."""
    n = len(sorted_xs)
    return float(sorted_xs[min(n - 1, int(p * n))]) if n else None


def _nearest_ranks(xs: Any, ps: tuple[float, ...]) -> list[float | None]:
    """``_nearest_rank_of`` of ``xs`` sorted, for each of ``ps``, from one ``np.partition``
    at those ranks instead of a sort: the same values (the k-th smallest is the k-th of the
    sorted array), without sorting a sender's ~950,000 latencies at 1M messages for three."""
    import numpy as np

    n = len(xs)
    if not n:
        return [None] * len(ps)
    ks = [min(n - 1, int(p * n)) for p in ps]
    part = np.partition(xs, sorted(set(ks)))
    return [float(part[k]) for k in ks]


@dataclass
class _ContentArrays:
    """Every content message's first copy (ordered by position) as Arrow/numpy arrays, made
    once per sweep task from the driver's file (``_content_arrays``; ``of`` keeps the last one)."""

    ids: pa.Array
    first: Any  # np.ndarray[int64]
    ts: Any  # np.ndarray[int64]
    sender: pa.Array
    _bloom_positions: Any = None  # ``bloom_positions``, made on first use

    def bloom_positions(self) -> Any:
        """Every content id's bloom-filter bit positions ((n, k) ``positions_batch``), made
        once and kept: every sender of a task checks the same ids."""
        if self._bloom_positions is None:
            from loglake.sds import positions_batch

            self._bloom_positions = positions_batch(self.ids)
        return self._bloom_positions

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

    def lists(self) -> tuple[list[str], list[int], list[int], list[str]]:
        """The arrays as the lists ``_sweep_loop`` takes."""
        return self.ids.to_pylist(), self.first.tolist(), self.ts.tolist(), self.sender.to_pylist()


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
    """``_sweep_loop`` on arrays: message c (of another sender) is acknowledged at the first own
    message q after its first copy whose ``causal_new`` lists it or whose bloom filter contains
    it; the (q, c) pairs of the histories come from one ``index_in`` of all the ids against the
    content ids and the first q per c from a stable sort; the bloom filters are searched only
    before that q (``_bloom_acks``)."""
    acks, figures, _ = _sweep_positions(participant, own, content, positions)
    return acks, figures


def _sweep_positions(
    participant: str, own: pa.Table, content: _ContentArrays, positions: Positions | None = None
) -> tuple[pa.Table, pa.Table, Any]:
    """``_sweep_arrays`` and the content positions of its acknowledgements, in the acks' order
    (the sweep task adds up per-message figures by position)."""
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
    # each c's first row in that order (np.unique would sort the sorted array again)
    starts = np.ones(len(c_sorted), dtype=bool)
    starts[1:] = c_sorted[1:] != c_sorted[:-1]
    at = np.flatnonzero(starts)
    uc = c_sorted[at]
    uj = j[order][at]
    by_bloom = np.zeros(len(uc), dtype=bool)
    if "bloom_filter" in own.column_names and own.column("bloom_filter").null_count < n_own:
        uc, uj, by_bloom = _bloom_acks(own, content, others, uc, uj)
    by_q = np.lexsort((uc, uj))  # acks by q, then position
    uc, uj, by_bloom = uc[by_q], uj[by_q], by_bloom[by_q]
    lat = (tss[uj] - content.ts[uc]) / 1e6
    n_acked = len(uc)
    acks = pa.table(
        [
            content.ids.take(pa.array(uc)),
            pa.repeat(pa.scalar(participant, pa.string()), n_acked),
            pa.array(idxs[uj], pa.int64()),
            pa.array(tss[uj], pa.int64()),
            pa.array(lat, pa.float64()),
            _VIA.take(pa.array(by_bloom.astype(np.int8))),
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
    p50, p90, p99 = _nearest_ranks(lat, (0.5, 0.9, 0.99))
    row = {
        "participant": [participant],
        "messages_sent": [pc.sum(pc.equal(kinds, "content")).as_py() or 0],
        "syncs_sent": [pc.sum(pc.equal(kinds, "sync")).as_py() or 0],
        "last_index": [last_q],
        "expected": [seen],
        "acknowledged": [n_acked],
        "delivery_ratio": [n_acked / seen if seen else None],
        "ack_p50_ms": [p50],
        "ack_p90_ms": [p90],
        "ack_p99_ms": [p99],
        "not_acknowledged": [not_acked.to_pylist()],
    }
    return acks, pa.Table.from_pydict(row, schema=PARTICIPANT_SWEEP_SCHEMA), uc


_VIA = pa.array(["causal_history", "bloom_filter"], pa.string())
BLOOM_CHECKS = 500_000
"""At most this many (id, filter) checks at once in ``_bloom_acks`` (each reads k bytes)."""


def _bloom_acks(
    own: pa.Table, content: _ContentArrays, others: Any, uc: Any, uj: Any
) -> tuple[Any, Any, Any]:
    """The acknowledgements of one sender (``own``, in index order) with its bloom filters:
    ``uc``/``uj`` (content position, own row) those of the causal histories; returned, the
    same with every content message a filter shows earlier, and which came from a filter.

    What the message-by-message loop does, without a Python step per (message, pending id):
    a content message c is acknowledged at the first own message after c's first copy whose
    history lists c or whose filter contains c (``_sweep_loop``: the history first); so only
    the filters of the own messages after c's first copy and before its history
    acknowledgement can move it earlier. All such (c, filter) checks go in rounds: each
    round checks, for every c not yet found, its next filters (1, 2, 4, ... of them), with
    ``bloom.contains_batch`` over the filters as one byte matrix; a c is settled at its first
    hit or once its filters are used up. The work is the loop's (a pending id is checked
    against each filter until one contains it), the rounds are logarithmic in the longest
    wait, and each round is a few array operations."""
    import numpy as np

    from loglake.sds import contains_batch

    idxs = own.column("index").to_numpy()
    n_own = len(idxs)
    brow, filters = _bloom_matrix(own.column("bloom_filter"))
    k = int(np.searchsorted(content.first, idxs[-1], side="left"))  # first before the last q
    hist_row = np.full(k, n_own, dtype=np.int64)
    hist_row[uc] = uj
    cand = np.flatnonzero(others[:k])
    start = np.searchsorted(idxs[brow], content.first[cand], side="right")
    end = np.searchsorted(brow, hist_row[cand], side="left")
    live = start < end
    cand, cur, end = cand[live], start[live], end[live]
    pos = content.bloom_positions()[cand] if len(cand) else np.zeros((0, 1), dtype=np.int64)
    found = np.full(len(cand), -1, dtype=np.int64)
    left = np.arange(len(cand))
    width = 1
    while len(left):
        n = np.minimum(width, end[left] - cur[left])
        first = np.cumsum(n) - n
        seg = np.repeat(np.arange(len(left)), n)
        r = cur[left][seg] + (np.arange(int(n.sum())) - first[seg])
        hit = contains_batch(filters, r, pos[left[seg]])
        at = np.minimum.reduceat(np.where(hit, r, n_own + len(brow)), first)
        got = at < len(brow)
        found[left[got]] = at[got]
        cur[left] += n
        left = left[~got & (cur[left] < end[left])]
        width = max(1, min(2 * width, BLOOM_CHECKS // max(1, len(left))))
    ack_row = np.full(k, -1, dtype=np.int64)
    ack_row[uc] = uj
    by_bloom = np.zeros(k, dtype=bool)
    hit_c = found >= 0
    ack_row[cand[hit_c]] = brow[found[hit_c]]
    by_bloom[cand[hit_c]] = True
    acked = np.flatnonzero(ack_row >= 0)
    return acked, ack_row[acked], by_bloom[acked]


def _bloom_matrix(col: pa.ChunkedArray) -> tuple[Any, Any]:
    """A sender's bloom filters: the rows that carry one, and the filters as an (n, bytes)
    uint8 matrix (one copy of their bytes; a filter of another length is a reject of the
    decode, so all have the one length)."""
    import numpy as np
    import pyarrow.compute as pc

    from loglake.sds import BloomFilter

    width = BloomFilter().n_bytes
    valid = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)
    rows = np.flatnonzero(valid)
    pieces = []
    for ch in col.chunks:
        if ch.null_count == len(ch):
            continue
        offs = value_offsets(ch)
        lens = np.diff(offs)
        ok = np.asarray(ch.is_valid())
        data = np.frombuffer(ch.buffers()[2], dtype=np.uint8)
        if np.all(lens[ok] == width) and not lens[~ok].any():  # the filters end to end
            pieces.append(data[offs[0] : offs[-1]])
        else:
            for i in np.flatnonzero(ok).tolist():
                if lens[i] != width:
                    raise ValueError(f"a bloom filter of {lens[i]} bytes, not {width}")
                pieces.append(data[offs[i] : offs[i + 1]])
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint8)
    return rows, flat.reshape(len(rows), width)


def _sweep_loop(
    participant: str,
    own: pa.Table,
    content_ids: list[str],
    content_first: list[int],
    content_ts: list[int],
    content_sender: list[str],
) -> tuple[pa.Table, pa.Table]:
    """The sweep message by message; ``own`` sorted. The reference ``_sweep_arrays`` (what
    the job runs) is tested equal to."""
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


SweepResult = tuple[pa.Table, pa.Table, list[str], list[str], str]
"""A sweep task's answer: its participants' rows (``PARTICIPANT_SWEEP_SCHEMA``), the
dependency figures of their messages (``LATE_SCHEMA``, and the ids never on the channel), the
``acks`` part files it wrote, and the file of its per-message acknowledgement figures."""

SWEEP_COLUMNS = [
    "index",
    "timestamp_ns",
    "kind",
    "message_id",
    "sender",
    "causal_codes",
]
"""What the sweep reads of every decoded file (the bloom filters are in the bloom files)."""
BLOOMS_SCHEMA = pa.schema([DECODED_SCHEMA.field("index"), DECODED_SCHEMA.field("bloom_filter")])
"""A decode task's bloom file: the bloom filters of its decoded content and sync messages
(``_blooms_by_sender``), a record batch per sender (``BloomFiles`` names them)."""
CODED = {"history_stored": "history_codes", "causal_new": "causal_codes"}
"""The decoded columns a decoded file holds as codes (``WORK_SCHEMA``), and their names there."""
WORK_SCHEMA = pa.schema(
    [
        pa.field(CODED[f.name], pa.list_(pa.int32())) if f.name in CODED else f
        for f in DECODED_SCHEMA
        if f.name != "bloom_filter"
    ]
)
"""A decoded file in ``_work/decoded``: every decoded column but the bloom filters, which
the task writes by sender into its bloom file: a sweep task then reads only its own
senders' filters, and holds one sender's at a time (~18 KB a message: a task's senders'
filters at once were ~9 GB at 1M messages; 100,000 messages with filters, same machine:
peak worker memory 2.8-2.9 GB -> 0.76-0.85, sweep 3.6-3.9 s -> 1.7-1.8).

The dictionary-encoded columns (``CODED``: ``causal_new``, ``history_stored``) as their
codes: each id as its position in its record batch's dictionary, which the part's ids file
of that column holds (``_ids_path``, a record batch of ``IDS_SCHEMA`` per record batch of
the part, in the same order; ``_codes``). Why: an Arrow IPC file keeps one dictionary a
column for all its batches, and the decoder's differ batch by batch; and an id the channel
sends is in the ``causal_new`` and the stored history of about one message per sender, so a
batch's ids are ~20 copies of ~1 a row. Written as strings, the decode compressed ~3 KB a row
and each sweep task hashed every kept copy against the content ids (~10M lookups a task at
1M messages of 20 senders); as codes, a sweep task looks up each batch's distinct ids once
and takes the codes' positions (numpy), and the ``messages`` task gives the writer the
decoder's dictionary (``history_dictionary``)."""
IDS_SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False)])
"""A record batch of a part's ids file: the dictionary of a record batch of the part's column,
the decoder's (distinct ids, in order of first appearance)."""


def _ids_path(part: str, column: str) -> str:
    """The ids file of ``column`` (of ``CODED``) of the decoded part file ``part``, beside
    it."""
    import os

    folder, name = os.path.split(part)
    return os.path.join(folder, f"ids-{column}-" + name.removeprefix("part-"))


def _codes(col: pa.ListArray) -> tuple[pa.ListArray, pa.Array]:
    """A decoded dictionary-encoded column (``CODED``) as codes (the same offsets and nulls)
    and the ids they point into (its dictionary, as it is)."""
    import numpy as np
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(col.type.value_type):
        raise TypeError(f"a column of {col.type}: a list of dictionary-encoded ids expected")
    offs = value_offsets(col)
    lo, hi = int(offs[0]), int(offs[-1])
    offsets = pa.array((offs - lo).astype(np.int32), pa.int32())
    mask = None if col.null_count == 0 else pc.invert(col.is_valid())
    codes = col.values.indices.slice(lo, hi - lo).cast(pa.int32())
    return pa.ListArray.from_arrays(offsets, codes, mask=mask), col.values.dictionary


def _decoded(codes: pa.ListArray, ids: pa.Array) -> pa.ListArray:
    """A decoded dictionary-encoded column again from its codes and its batch's ids
    (``_codes`` undone)."""
    import pyarrow.compute as pc

    offs = value_offsets(codes)
    lo, hi = int(offs[0]), int(offs[-1])
    values = pa.DictionaryArray.from_arrays(codes.values.slice(lo, hi - lo), ids)
    offsets = pa.array((offs - lo).astype("int32"), pa.int32())
    mask = None if codes.null_count == 0 else pc.invert(codes.is_valid())
    return pa.ListArray.from_arrays(offsets, values, mask=mask)


_SWEPT_KINDS = pa.array(["content", "sync"])
"""The kinds of message a sweep reads (the others acknowledge nothing)."""


def _sweep_task(
    decoded: list[str],
    bloom_files: BloomFiles,
    later: Any,
    content_path: str,
    acks_dir: str,
    work_dir: str,
) -> Callable[[tuple[int, list[str]]], SweepResult]:
    """One sweep task: the first-copy content and sync messages of its senders, read from
    every decoded part file with pyarrow (``later``: the indexes of the later copies, left
    out), swept one sender at a time (``_sweep_positions``, with the sender's bloom filters
    from the bloom files, ``_sender_blooms``) with the
    dependency figures from the same ``index_in``
    (``dependency_figures``). Each sender's acknowledgements become a part file of ``acks``
    (``_write_part``, named by the sender); the task's per-message figures (how many
    acknowledged each content message, the first and last latency) go to one ``.npy`` file in
    ``work_dir``, indexed by the content message's position, for the driver to add up. Why
    plain tasks and not a ``groupBy(sender)``: the rows, their histories and bloom filters
    never pass through the JVM, and the whole sweep is one Spark job."""

    def run(task: tuple[int, list[str]]) -> SweepResult:
        import hashlib
        import os

        import numpy as np
        import pyarrow.compute as pc

        k, senders = task
        content = _content_arrays(content_path)
        n_content = len(content.ids)
        # each decoded file's rows of these senders (first copies of content and sync
        # messages), kept as the file is read: the task holds its own rows, not every
        # file's whole columns at once (the largest allocation of the task, faulted in by
        # each fresh worker). Then every sender's rows together, in index order (their small
        # columns taken once), and every causal_new id's content position from one
        # ``index_in`` for the whole task (one hash table of the content ids, not one a
        # sender)
        mine = pa.array(senders, pa.string())
        copies = pa.array(later) if len(later) else None
        index = IdIndex(content.ids)  # the content ids' hash table, for the whole task
        parts, lens_read, pos_parts, miss_at, miss_ids = [], [], [], [], []
        done = 0
        for f in decoded:
            t = _read_work(f, ["ok", *SWEEP_COLUMNS])
            keep = pc.and_(
                pc.and_(t.column("ok"), pc.is_in(t.column("kind"), _SWEPT_KINDS)),
                pc.is_in(t.column("sender"), mine),
            )
            if copies is not None:
                keep = pc.and_(keep, pc.invert(pc.is_in(t.column("index"), copies)))
            keep = pc.fill_null(keep, False).combine_chunks()
            at = np.flatnonzero(np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool))
            if len(at):
                parts.append(t.select(_SWEEP_ROWS).take(pa.array(at)))
                lens, pos, missing = _kept_causal(
                    t.column("causal_codes"), _column_ids(f, "causal_new"), at, index
                )
                lens_read.append(lens)
                pos_parts.append(pos)
                if len(missing):
                    miss_at.append(done + np.flatnonzero(pos < 0))
                    miss_ids.append(missing)
                done += len(pos)
        rows = pa.concat_tables(parts) if parts else _work_schema(_SWEEP_ROWS).empty_table()
        order = np.asarray(
            pc.sort_indices(
                rows.select(["sender", "index"]),
                sort_keys=[("sender", "ascending"), ("index", "ascending")],
            ).to_numpy(),
            dtype=np.int64,
        )
        small = rows.select(["index", "timestamp_ns", "kind", "message_id", "sender"]).take(
            pa.array(order)
        )
        # the histories are never taken: every kept causal_new id's content position was
        # looked up in its file's column (``_kept_causal``), in the order read, and the
        # (sender, index) order is a permutation of those positions (numpy); the ids of no
        # content message alone were taken (``dependency_figures`` names them)
        offs_read = np.zeros(1 + sum(len(x) for x in lens_read), dtype=np.int64)
        np.cumsum(np.concatenate([np.zeros(0, dtype=np.int64), *lens_read]), out=offs_read[1:])
        pos_read = np.concatenate([np.zeros(0, dtype=np.int64), *pos_parts])
        miss_where = np.concatenate([np.zeros(0, dtype=np.int64), *miss_at])
        missing_ids = pa.concat_arrays(miss_ids) if miss_ids else pa.array([], pa.string())
        del rows, parts, pos_parts  # the rows as read let go
        starts_read = offs_read[:-1][order]  # each sorted row's first entry as read
        lens = np.diff(offs_read)[order]
        offs = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lens, out=offs[1:])

        def sender_positions(a: int, b: int) -> Positions:
            """The ``causal_new`` entries of sorted rows [a, b) (one sender): each one's row
            (from 0), id (taken only where some are of no content message: the only ones
            ``dependency_figures`` reads) and content position. Gathered a sender at a time,
            not for the whole task at once: the task-wide permutation and its gathers were
            ~5 arrays of 8 bytes an entry (~0.4 GB a task at 1M messages), each faulted into
            fresh pages, where one sender's are a few MB the next sender reuses."""
            ln = lens[a:b]
            lo, hi = int(offs[a]), int(offs[b])
            read_at = np.repeat(starts_read[a:b] - offs[a:b], ln)
            read_at += np.arange(lo, hi, dtype=np.int64)
            pos = pos_read[read_at]
            rows = np.repeat(np.arange(b - a, dtype=np.int64), ln)
            miss = pos < 0
            if not bool(miss.any()):
                return rows, pa.nulls(hi - lo, pa.string()), pos
            at = np.zeros(hi - lo, dtype=np.int64)
            at[miss] = np.searchsorted(miss_where, read_at[miss])
            return rows, missing_ids.take(pa.array(at, mask=~miss)), pos

        sender_of = small.column("sender").to_numpy(zero_copy_only=False)
        stats = np.zeros((3, n_content), dtype=np.float64)
        stats[1], stats[2] = np.inf, -np.inf
        figures, lates, never, files = [], [], set(), []
        for participant in senders:
            a = int(np.searchsorted(sender_of, participant, side="left"))
            b = int(np.searchsorted(sender_of, participant, side="right"))
            own = small.slice(a, b - a)
            positions = sender_positions(a, b)
            blooms = _sender_blooms(bloom_files, participant, own.column("index"))
            if blooms is not None:
                own = own.append_column("bloom_filter", blooms)
            acks, part, at = _sweep_positions(participant, own, content, positions)
            lat = acks.column("latency_ms").to_numpy()
            stats[0, at] += 1  # a sender acknowledges a message once: ``at`` has no repeats
            stats[1, at] = np.minimum(stats[1, at], lat)
            stats[2, at] = np.maximum(stats[2, at], lat)
            late, nev = dependency_figures(own, content, positions)
            key = hashlib.sha1(str(participant).encode()).hexdigest()[:20]
            path, _ = _write_part(
                acks_dir, f"part-{key}.zstd.parquet", ACKS_SCHEMA, acks.to_batches()
            )
            figures.append(part)
            lates.append(late)
            never.update(nev)
            files.append(path)
        stats_path = os.path.join(work_dir, f"acks-{k:05d}.npy")
        np.save(stats_path, stats)
        return (
            pa.concat_tables(figures) if figures else PARTICIPANT_SWEEP_SCHEMA.empty_table(),
            pa.concat_tables(lates) if lates else LATE_SCHEMA.empty_table(),
            sorted(never),
            files,
            stats_path,
        )

    return run


def _sender_blooms(bloom_files: BloomFiles, sender: str, index: pa.ChunkedArray) -> pa.Array | None:
    """The bloom filters of ``sender``'s messages at ``index`` (ascending; null where a
    message has none), read from the bloom files' batches of that sender only; None when it
    has none."""

    batches = []
    for path, names in bloom_files:
        if sender in names:
            with pa.OSFile(path) as f:
                reader = pa.ipc.open_file(f)
                batches += [reader.get_batch(i) for i, n in enumerate(names) if n == sender]
    if not batches:
        return None
    held = pa.Table.from_batches(batches, BLOOMS_SCHEMA)
    at, found = _find_sorted(held.column("index").to_numpy(), index.to_numpy())
    return held.column("bloom_filter").take(pa.array(at, mask=~found)).combine_chunks()


def _find_sorted(keys: Any, values: Any) -> tuple[Any, Any]:
    """Where each of ``values`` is among ``keys`` (indexes, ascending): its position (any
    position where it is not) and whether it is there; one binary search each."""
    import numpy as np

    keys = np.asarray(keys, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    if not len(keys):
        return np.zeros(len(values), dtype=np.int64), np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return at, keys[at] == values


_SWEEP_ROWS = [c for c in SWEEP_COLUMNS if c != "causal_codes"]
"""What a sweep task takes of its rows (their ``causal_new`` codes stay where read)."""


def _kept_causal(
    col: pa.ChunkedArray, ids: list[pa.Array], at: Any, index: IdIndex
) -> tuple[Any, Any, pa.Array]:
    """The ``causal_new`` ids of rows ``at`` (ascending) of a decoded file, from its
    ``causal_codes`` column (a chunk per record batch) and each batch's ids (``ids``, its ids
    file): each row's count of ids, each id's content position (``index``; -1 for none) and
    the ids of no content message, in order (the only ids ``dependency_figures`` reads). Each
    batch's distinct ids are looked up once (``index``, the content ids' hash table kept for
    the task), and the kept codes take their positions: the ids are never copied."""
    import numpy as np

    chunks = []
    first = 0
    for ch, dictionary in zip(col.chunks, ids, strict=True):
        lo, hi = np.searchsorted(at, [first, first + len(ch)])
        rows = at[lo:hi] - first
        first += len(ch)
        if len(rows):
            offs = np.asarray(value_offsets(ch), dtype=np.int64)
            chunks.append((ch, dictionary, offs[rows], offs[rows + 1]))
    whole = [(d, np.zeros(1, np.int64), np.full(1, len(d), np.int64)) for _, d, _, _ in chunks]
    found = index.positions(whole) if whole else np.zeros(0, dtype=np.int64)
    lens, pos, missing = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], []
    k = 0
    for ch, dictionary, starts, ends in chunks:
        codes = np.asarray(ch.values.to_numpy(), dtype=np.int64)[value_indices(starts, ends)]
        if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= len(dictionary)):
            raise ValueError("decoded causal_codes outside their batch's ids")
        p = found[k : k + len(dictionary)][codes]
        k += len(dictionary)
        lens.append(ends - starts)
        pos.append(p)
        miss = p < 0
        if miss.any():
            missing.append(dictionary.take(pa.array(codes[miss])))
    out = pa.concat_arrays(missing) if missing else pa.array([], pa.string())
    return np.concatenate(lens), np.concatenate(pos), out


def _content_arrays(path: str) -> _ContentArrays:
    """The content messages' first copies (``message_id``, ``index``, ``timestamp_ns``,
    ``sender``), an Arrow IPC file the driver wrote in ``_work``, as ``_ContentArrays``. Why a
    file and not a broadcast: the broadcast pickled the table in the driver, through the JVM
    and into each worker (~70 MB at 1M messages, faulted in by each of them); the sweep's
    tasks read the decoded files from the same filesystem anyway."""
    import numpy as np

    with pa.OSFile(path) as f:
        t = pa.ipc.open_file(f).read_all()
    return _ContentArrays(
        t.column("message_id").combine_chunks(),
        np.asarray(t.column("index").to_numpy(), dtype=np.int64),
        np.asarray(t.column("timestamp_ns").to_numpy(), dtype=np.int64),
        t.column("sender").combine_chunks(),
    )


MESSAGES_SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("partition", pa.int32()),
        ("first_index", pa.int64()),
        ("first_timestamp_ns", pa.int64()),
        ("kind", pa.string()),
        ("sender", pa.string()),
        ("lamport", pa.int64()),
        ("causal_history", pa.list_(pa.string())),
        ("repair_request", pa.list_(pa.string())),
        ("content_bytes", pa.int64()),
        ("copies", pa.int64()),
        pa.field("never_delivered_deps", pa.list_(pa.string()), nullable=False),
        pa.field("deps_seen_later", pa.int64(), nullable=False),
        pa.field("acknowledged_by", pa.int64(), nullable=False),
        ("first_ack_ms", pa.float64()),
        ("last_ack_ms", pa.float64()),
        pa.field("repair_requests", pa.int64(), nullable=False),
        pa.field("repair_responses", pa.int64(), nullable=False),
    ]
)
"""``messages`` as Spark wrote it before the job wrote it itself (the figures filled with 0
are never null)."""
DICTIONARY_PAGE_LIMIT = 1 << 20
"""pyarrow's ``dictionary_pagesize_limit`` (its default, which ``_write_part`` keeps): a
column chunk whose dictionary reaches it, PLAIN-encoded (4 + length octets an id), goes on in
plain encoding. Given a dictionary-encoded column, the writer keeps the dictionary whole
instead, so a ``messages`` file past it would not be the file strings make
(``_messages_task``)."""


class _PastDictionaryLimit(Exception):
    """A batch's history dictionary at ``DICTIONARY_PAGE_LIMIT``: its file goes as strings."""


def _dictionary_bytes(dictionary: pa.Array) -> int:
    """The PLAIN-encoded size Parquet's writer measures a dictionary by."""
    offs = value_offsets(dictionary)
    return int(offs[-1] - offs[0]) + 4 * len(dictionary) if len(dictionary) else 0


MESSAGES_WRITE_SCHEMA = MESSAGES_SCHEMA.set(
    MESSAGES_SCHEMA.get_field_index("causal_history"),
    pa.field("causal_history", HISTORY_DICTIONARY),
)
"""What ``_messages_task`` hands Parquet's writer: ``causal_history`` dictionary-encoded, the
same Parquet column (the file says ``MESSAGES_SCHEMA``)."""
MESSAGE_FIGURES = (
    "copies",
    "deps_seen_later",
    "acknowledged_by",
    "first_ack_ms",
    "last_ack_ms",
    "repair_requests",
    "repair_responses",
)
"""The columns of ``messages`` the driver computes (``_messages_task`` gets them per file)."""
EDGES_SCHEMA = pa.schema([("message_id", pa.string()), ("dep", pa.string())])
"""A causal-history reference to a candidate for "unresolved" (``_messages_task``)."""


def _messages_task(
    out_dir: str, never: list[str], cands: list[str]
) -> Callable[[tuple[str, str]], tuple[str, pa.Table]]:
    """One ``messages`` task per decoded part file: the first copies in that file (``figures``
    from the driver, an Arrow IPC file in ``_work`` the task reads: their indexes and
    ``MESSAGE_FIGURES``, in index order; through Spark they were pickled into the JVM and out
    again, ~64 MB at 1M messages, which the JVM's heap faulted in) read with their
    causal histories from the file with pyarrow, a row group at a time, and written as a part
    file of ``messages`` (``_write_part``). On the way, from the same expanded histories: each
    message's ``never_delivered_deps`` (its history's ids in ``never``) and the references to
    the candidates for "unresolved" (``cands``; ``EDGES_SCHEMA``, returned). Ephemeral
    messages count in neither, as before. Why: the histories (13 KB a row with 200 ids) go
    from the decoded file to the table's file inside one Python process. They go to the
    writer dictionary-encoded (``history_dictionary``; ``MESSAGES_WRITE_SCHEMA``), a row
    group a batch, and the file's bytes are the same: Parquet's writer had hashed every entry
    to build that dictionary. Where the ids themselves are read (``never``, ``cands``) or rows
    are left out (later copies), the batch's ``history_lists`` are encoded as the writer
    would (``dictionary_reference``). A batch whose dictionary reaches
    ``DICTIONARY_PAGE_LIMIT`` (~15,000 distinct ids of 64 characters; a 10,000-row batch of
    the benchmark's channel holds ~10,200) has the whole file written again from strings: the
    writer would have gone on in plain encoding there, and keeps a given dictionary whole."""

    def run(task: tuple[str, str]) -> tuple[str, pa.Table]:
        import os

        import numpy as np
        import pyarrow.compute as pc

        source, figures_path = task
        with pa.OSFile(figures_path) as f:
            figures = pa.ipc.open_file(f).read_all()
        # the first copies' indexes, ascending as the file's: a row is one when a binary
        # search finds its index there (an ``is_in`` built the same hash set for every batch)
        want = np.asarray(figures.column("first_index").to_numpy(), dtype=np.int64)
        never_set = pa.array(never, pa.string())
        cand_set = pa.array(cands, pa.string())
        edges: list[pa.RecordBatch] = []
        kept = [
            "partition",
            "index",
            "timestamp_ns",
            "kind",
            "message_id",
            "sender",
            "lamport",
            "repair_request",
            "content_bytes",
        ]
        columns = [*kept, "history_stored", *HISTORY_RUN_COLUMNS]

        def batches(coded: bool) -> Iterator[pa.RecordBatch]:
            """The table's rows a decoded batch at a time; ``coded``: the histories
            dictionary-encoded (``MESSAGES_WRITE_SCHEMA``), else as strings."""
            done = 0
            for b in _work_batches(source, columns):
                first = _find_sorted(want, b.column("index").to_numpy())[1]
                if not first.any():
                    continue
                # the histories rebuilt from the whole batch (a run's base may be a resend);
                # all first copies (a channel without resends): the batch as read, as a
                # filter would copy its histories (13 KB a row with 200 ids) to keep every row
                got, n = b.select(kept), int(first.sum())
                plain = bool(n < len(first) or len(never) or len(cands))
                hist = history_lists(b) if plain or not coded else history_dictionary(b)
                if n < len(first):
                    keep = pa.array(first)
                    got, hist = got.filter(keep), hist.filter(keep)
                part = figures.slice(done, n)
                if not part.column("first_index").combine_chunks().equals(got.column("index")):
                    raise ValueError(f"{source}: decoded rows out of step with the first copies")
                done += n
                never_deps = pa.ListArray.from_arrays(
                    pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string())
                )
                if len(never) or len(cands):  # each id's row: only to look ids up
                    offs = np.asarray(hist.offsets, dtype=np.int64)
                    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(offs))
                    values = hist.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
                    held = np.asarray(
                        pc.not_equal(got.column("kind"), "ephemeral").to_numpy(zero_copy_only=False)
                    )
                if len(never):
                    hit = np.asarray(pc.is_in(values, never_set).to_numpy(zero_copy_only=False))
                    hit &= held[rows]
                    if hit.any():
                        never_deps = _distinct_sorted_lists(n, rows[hit], values.filter(hit))
                if len(cands):
                    hit = np.asarray(pc.is_in(values, cand_set).to_numpy(zero_copy_only=False))
                    hit &= held[rows]
                    edges.append(
                        pa.RecordBatch.from_arrays(
                            [
                                got.column("message_id").take(pa.array(rows[hit])),
                                values.filter(hit),
                            ],
                            schema=EDGES_SCHEMA,
                        )
                    )
                cols = {
                    "message_id": got.column("message_id"),
                    "partition": got.column("partition"),
                    "first_index": got.column("index"),
                    "first_timestamp_ns": got.column("timestamp_ns"),
                    "kind": got.column("kind"),
                    "sender": got.column("sender"),
                    "lamport": got.column("lamport"),
                    "causal_history": dictionary_reference(hist) if coded and plain else hist,
                    "repair_request": got.column("repair_request"),
                    "content_bytes": got.column("content_bytes"),
                    "never_delivered_deps": never_deps,
                }
                if coded and (
                    _dictionary_bytes(cols["causal_history"].values.dictionary)
                    >= DICTIONARY_PAGE_LIMIT
                ):
                    raise _PastDictionaryLimit
                yield pa.RecordBatch.from_arrays(
                    [
                        cols[n] if n in cols else part.column(n).combine_chunks()
                        for n in MESSAGES_SCHEMA.names
                    ],
                    schema=MESSAGES_WRITE_SCHEMA if coded else MESSAGES_SCHEMA,
                )
            if done != figures.num_rows:
                raise ValueError(f"{source}: {figures.num_rows - done} first copies not found")

        name = os.path.basename(source).split(".")[0]  # part-00003 (the decode task's)
        try:
            path, _ = _write_part(
                out_dir,
                f"{name}.zstd.parquet",
                MESSAGES_WRITE_SCHEMA,
                batches(coded=True),
                file_schema=MESSAGES_SCHEMA,
            )
        except _PastDictionaryLimit:  # the file again, as strings (the partial one is gone)
            edges.clear()
            path, _ = _write_part(
                out_dir, f"{name}.zstd.parquet", MESSAGES_SCHEMA, batches(coded=False)
            )
        return path, pa.Table.from_batches(edges, EDGES_SCHEMA)

    return run


def _distinct_sorted_lists(n: int, rows: Any, values: pa.Array) -> pa.ListArray:
    """``n`` lists: row r's list holds the distinct ``values`` at ``rows == r``, sorted."""
    t = (
        pa.table({"r": pa.array(rows, pa.int64()), "v": values})
        .group_by("r")
        .aggregate([("v", "distinct")])
    )
    out: list[list[str]] = [[] for _ in range(n)]
    for r, vs in zip(t.column("r").to_pylist(), t.column("v_distinct").to_pylist(), strict=True):
        out[r] = sorted(vs)
    return pa.array(out, pa.list_(pa.string()))


def _write_part(
    folder: str,
    name: str,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    work: bool = False,
    file_schema: pa.Schema | None = None,
) -> tuple[str, int]:
    """``batches`` written by a task as ``folder/name``, a zstd Parquet file of ``schema``,
    under a hidden temporary name, then renamed: a retried or speculative attempt rewrites the
    same file whole. Why zstd: rows that repeat their neighbours' (causal histories, ids)
    stay small. Returns the file's path and its row count. ``work``: one of the job's own
    intermediate files (``_work``), an Arrow IPC file with lz4 buffers instead (``_read_work``
    reads it back). Why lz4 there: the file is written once and read by two later passes on
    the same machine, where decompressing zstd cost more than the bigger files do (1M messages
    of the benchmark's channel, four alternated pairs at load 4-6: the audit's CPU 2.0-3.8 s
    less with lz4, 42.5-46.6 against 45.6-50.2 CPU-s, most of it in the ``messages`` stage's
    reads of the histories; the files 364 MB against 176 MB). ``file_schema``: as
    ``output_dir.write_part``'s."""
    from loglake.pipeline.output_dir import write_part

    casts = (batch.cast(schema) for batch in batches)
    return write_part(
        folder,
        name,
        schema,
        casts,
        compression="lz4" if work else "zstd",
        arrow_ipc=work,
        file_schema=file_schema,
    )


def _read_work(path: str, columns: Iterable[str]) -> pa.Table:
    """``columns`` of a decoded file in ``_work`` (an Arrow IPC file of ``WORK_SCHEMA``,
    ``_write_part(work=True)``): only their buffers are read and decompressed."""
    return pa.Table.from_batches(list(_work_batches(path, columns)), _work_schema(columns))


def _work_batches(path: str, columns: Iterable[str]) -> Iterator[pa.RecordBatch]:
    """``_read_work`` a record batch at a time (as the decode task wrote them). Asked for a
    decoded column of ``CODED``, that column again (``_decoded`` of its codes and its ids
    file), in its codes' place."""
    columns = list(columns)
    decoded = [c for c in CODED if c in columns]
    fields = sorted(WORK_SCHEMA.get_field_index(CODED.get(c, c)) for c in columns)
    options = pa.ipc.IpcReadOptions(included_fields=fields)
    with pa.OSFile(path) as f:
        reader = pa.ipc.open_file(f, options=options)
        n = reader.num_record_batches
        ids = {c: _column_ids(path, c) for c in decoded} if n else {}
        for i in range(n):
            b = reader.get_batch(i)
            for c in decoded:
                at = b.schema.get_field_index(CODED[c])
                b = b.set_column(at, DECODED_SCHEMA.field(c), _decoded(b.column(at), ids[c][i]))
            yield b


def _column_ids(part: str, column: str) -> list[pa.Array]:
    """The ids of each record batch of the decoded part ``part``'s ``column`` (its ids file,
    in order)."""
    with pa.OSFile(_ids_path(part, column)) as f:
        reader = pa.ipc.open_file(f)
        return [reader.get_batch(i).column(0) for i in range(reader.num_record_batches)]


def _work_schema(columns: Iterable[str]) -> pa.Schema:
    """The schema ``_read_work`` gives: ``columns`` in ``WORK_SCHEMA``'s order (a decoded
    column of ``CODED`` as decoded, in its codes' place)."""
    want = {CODED.get(c, c): c for c in columns}
    return pa.schema(
        [
            DECODED_SCHEMA.field(want[f.name]) if want[f.name] in CODED else f
            for f in WORK_SCHEMA
            if f.name in want
        ]
    )


# -- driver ----------------------------------------------------------------------------------


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


DECODE_COLUMNS = ("partition", "index", "timestamp_ns", "data")
DECODE_BATCH = 10_000
"""Records of a batch of the decoded file (a row group of ``messages``): Spark's Arrow batch
size, which the decode was tuned with."""
DECODE_PIECE = 1_000
"""Records the decoder takes at once (``read_unit_pieces``; a batch is its pieces decoded,
then concatenated). Why: pieces of ~20 MB (1,000 records of 200-entry histories) are read
and walked in the CPU's cache. 1M messages, 60 lake files in one process: 3.01-3.14 CPU-s
against 3.25-3.44 for whole batches; 500 or 1,500 records were no better than whole
batches."""


DecodedPart = tuple[str, int, dict[str, int], str, list[str]]
"""A decode task's answer: its part file, its row count, its rejects per reason, its bloom
file and the sender of each of that file's record batches."""


def _decode_task(
    data_dir: str, channel: str, decoded_dir: str
) -> Callable[[tuple[int, list[Unit]]], DecodedPart]:
    """One decode task: its units (consecutive, in index order) read where they lie and
    decoded by one ``decode_batches`` state (``causal_new`` is against the previous message of
    the same sender read by this task), written as one file of ``DECODED_SCHEMA``
    (``_write_part(work=True)``: an Arrow IPC file with lz4 buffers; read back once, by
    pyarrow on the same machine, it needs no Parquet encoding: at 200,000 messages of the
    benchmark's channel the write and the later reads of its 2.6 GB of packed histories cost
    about a third of what zstd Parquet did). Returned: the file's path, its row count and its
    rejects per reason, counted as the rows pass: the summary's records and rejects then cost
    no Spark job."""

    def run(task: tuple[int, list[Unit]]) -> DecodedPart:
        import itertools
        import os

        import pyarrow.compute as pc

        from loglake.pipeline.output_dir import part_file
        from loglake.pipeline.units import read_unit_pieces

        k, units = task
        reasons: dict[str, int] = {}
        sizes: list[int] = []  # each batch's count of pieces, known before its first piece

        def pieces() -> Iterator[pa.RecordBatch]:
            for u in units:
                for group in read_unit_pieces(
                    data_dir, u, DECODE_COLUMNS, DECODE_BATCH, DECODE_PIECE
                ):
                    sizes.append(len(group))
                    yield from group

        def batches(decoded: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            """The decoded pieces put back together as the batches they were cut from (a
            decoded row's ``history_back`` counts rows of its own piece, so it holds in the
            batch)."""
            for i, first in enumerate(decoded):
                more = list(itertools.islice(decoded, sizes[i] - 1))
                yield pa.concat_batches([first, *more]) if more else first

        def counted(decoded: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for b in decoded:
                bad = b.column("reason").filter(pc.invert(b.column("ok")))
                for r in pc.value_counts(bad).to_pylist():
                    key = str(r["values"])  # as the table's groupBy("reason") names it
                    reasons[key] = reasons.get(key, 0) + int(r["counts"])
                yield b

        name = f"part-{k:05d}.arrow"
        bloom_name = f"blooms-{k:05d}.arrow"
        senders: list[str] = []
        options = pa.ipc.IpcWriteOptions(compression="lz4")  # as _write_part(work=True)
        with contextlib.ExitStack() as stack:
            ids_out = {}  # each coded column's ids file
            for c in CODED:
                ids_name = os.path.basename(_ids_path(name, c))
                ids_f = stack.enter_context(
                    pa.OSFile(stack.enter_context(part_file(decoded_dir, ids_name)), "wb")
                )
                ids_out[c] = stack.enter_context(
                    pa.ipc.new_file(ids_f, IDS_SCHEMA, options=options)
                )
            tmp = stack.enter_context(part_file(decoded_dir, bloom_name))
            f = stack.enter_context(pa.OSFile(tmp, "wb"))
            out = stack.enter_context(pa.ipc.new_file(f, BLOOMS_SCHEMA, options=options))
            pending: dict[str, list[pa.RecordBatch]] = {}
            held: dict[str, int] = {}

            def flush(sender: str) -> None:
                parts = pending.pop(sender)
                del held[sender]
                out.write_batch(parts[0] if len(parts) == 1 else pa.concat_batches(parts))
                senders.append(sender)

            def split(decoded: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                """Each decoded batch without its bloom filters, for the decoded file; those
                of its content and sync messages to the bloom file, gathered by sender into
                record batches of about ``BLOOM_BATCH_BYTES`` (a batch per sender and
                decoded batch is ~150 rows: per-batch costs in the writes and the reads)."""
                for b in decoded:
                    for sender, rows, size in _blooms_by_sender(b):
                        pending.setdefault(sender, []).append(rows)
                        held[sender] = held.get(sender, 0) + size
                        if held[sender] >= BLOOM_BATCH_BYTES:
                            flush(sender)
                    for c, coded in CODED.items():
                        codes, ids = _codes(b.column(c))
                        ids_out[c].write_batch(pa.record_batch([ids], schema=IDS_SCHEMA))
                        at = b.schema.get_field_index(c)
                        b = b.set_column(at, WORK_SCHEMA.field(coded), codes)
                    yield b.select(WORK_SCHEMA.names)
                for sender in list(pending):
                    flush(sender)

            path, rows = _write_part(
                decoded_dir,
                name,
                WORK_SCHEMA,
                split(counted(batches(decode_batches(channel)(pieces())))),
                work=True,
            )
        return path, rows, reasons, os.path.join(decoded_dir, bloom_name), senders

    return run


BLOOM_BATCH_BYTES = 16 << 20
"""About the size of a record batch of a bloom file (one sender's filters)."""


def _blooms_by_sender(b: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch, int]]:
    """The bloom filters of a decoded batch's content and sync messages (``BLOOMS_SCHEMA``),
    a record batch per sender in index order (one take of the rows, stably sorted by
    sender), with its size in bytes (about: its share of the rows' buffers)."""
    import itertools

    import numpy as np
    import pyarrow.compute as pc

    blooms = b.column("bloom_filter")
    if blooms.null_count == len(blooms):
        return
    keep = pc.fill_null(
        pc.and_(
            pc.and_(b.column("ok"), pc.is_valid(blooms)),
            pc.is_in(b.column("kind"), _SWEPT_KINDS),
        ),
        False,
    )
    at = np.flatnonzero(np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool))
    if not len(at):
        return
    senders = b.column("sender").take(pa.array(at))
    order = np.asarray(pc.sort_indices(senders).to_numpy(), dtype=np.int64)  # stable
    rows = b.select(BLOOMS_SCHEMA.names).take(pa.array(at[order]))
    names = senders.take(pa.array(order))
    cuts = np.flatnonzero(
        np.asarray(
            pc.not_equal(names.slice(1), names.slice(0, len(names) - 1)).to_numpy(
                zero_copy_only=False
            ),
            dtype=bool,
        )
    )
    bounds = [0, *(cuts + 1).tolist(), len(names)]
    per_row = rows.nbytes / max(1, rows.num_rows)
    for lo, hi in itertools.pairwise(bounds):
        yield str(names[lo].as_py()), rows.slice(lo, hi - lo), int(per_row * (hi - lo))


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


BloomFiles = list[tuple[str, list[str]]]
"""The decode tasks' bloom files (``BLOOMS_SCHEMA``), in index order, each with the sender of
each of its record batches."""


def _decode_stage(
    spark: SparkSession, opts: SdsAuditOptions, decoded: Path
) -> tuple[int, dict[str, int], list[str], BloomFiles]:
    """Every record of the channel's partition decoded into ``decoded`` (Arrow IPC files of
    ``WORK_SCHEMA``, and the bloom files), by plain tasks over units planned here from
    metadata. Returned: the records decoded and the rejects per reason, from the tasks' own
    counts, the part files in index order (an empty channel: one empty file) and the bloom
    files."""
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
    paths = [p[0] for p in parts]
    bloom_files = [(p[3], p[4]) for p in parts]
    from loglake.pipeline.units import require_visible

    ids_files = [_ids_path(p, c) for p in paths for c in CODED]
    for path in [*paths, *(s for s, _ in bloom_files), *ids_files]:
        require_visible(path, "sds-audit", "--out (and the data dir)")
    if not paths:  # an empty channel: the schema alone, for the reads that follow
        paths = [_write_part(str(decoded), "part-empty.arrow", WORK_SCHEMA, [], work=True)[0]]
    reasons: dict[str, int] = {}
    for p in parts:
        for k, v in p[2].items():
            reasons[k] = reasons.get(k, 0) + v
    return sum(p[1] for p in parts), reasons, paths, bloom_files


@raises_task_errors
def run(spark: SparkSession, opts: SdsAuditOptions) -> AuditSummary:
    """The audit; ``opts`` must be ``validate()``d. Tables go to ``out/<table>/`` (Parquet),
    ``out/summary.json`` and ``out/report.html``."""
    t0 = time.monotonic()
    assert opts.channel is not None
    summary = AuditSummary(opts.stream, opts.channel)
    audit_files = {*TABLES, "summary.json", "report.html", WORK_DIR}

    # The audit is written into a staging folder beside --out and swapped in whole once
    # durable (pipeline.output_dir): a crash or a failure leaves the previous audit, whole.
    # Files in --out that are not the audit's (--overwrite) are carried over.
    with staged_output(opts.out_dir, keep=lambda name: name not in audit_files) as stage:
        staged = dataclasses.replace(opts, out_dir=str(stage))
        # decoded once, to Arrow IPC files: later passes read only the columns they need (the
        # 200-id causal histories once, for the messages table), with lz4 buffers
        # (_write_part says why)
        work = stage / WORK_DIR
        try:
            summary.records, reasons, decoded, bloom_files = _decode_stage(
                spark, staged, work / "decoded"
            )
            summary.rejects = sum(reasons.values())
            summary.reject_reasons = dict(sorted(reasons.items()))
            result = _audit(spark, staged, decoded, bloom_files, work, summary, t0)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return result


META_COLUMNS = [
    "partition",
    "index",
    "timestamp_ns",
    "ok",
    "reason",
    "detail",
    "kind",
    "message_id",
    "sender",
    "repair_request",
]
"""What the driver reads of every decoded record (no history, no bloom filter)."""


def _audit(
    spark: SparkSession,
    opts: SdsAuditOptions,
    decoded: list[str],
    bloom_files: BloomFiles,
    work: Path,
    summary: AuditSummary,
    t0: float,
) -> AuditSummary:
    """Everything after the decode, as three waves of plain tasks and the driver's pyarrow in
    between: the driver reads the small columns of every record (``META_COLUMNS``) and finds
    the first copies, the content messages and the repairs; sweep tasks make ``acks`` and
    each sender's figures (``_sweep_task``); the driver adds up the per-message figures;
    ``messages`` tasks write that table with the histories (``_messages_task``). Why not Spark
    SQL for the joins: each was a Spark job of its own (67 for a 1,000-message audit, most of
    its time), and what they join is keyed by index or id and small enough for one process:
    the ids, indexes and times of the records, never their histories or bloom filters."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out = Path(opts.out_dir)
    sc = spark.sparkContext
    # two files at a time: pyarrow decompresses without the GIL, and the executors are idle
    with ThreadPoolExecutor(2) as pool:
        metas = list(pool.map(lambda f: _read_work(f, META_COLUMNS), decoded))
    meta = pa.concat_tables(metas)
    idx = meta.column("index").to_numpy()
    ends = np.cumsum([m.num_rows for m in metas])  # each file's last index: idx[end - 1]
    if len(idx) > 1 and not bool(np.all(np.diff(idx) > 0)):  # the tasks' files in index order
        raise ValueError("decoded records out of index order")
    ok = meta.column("ok").combine_chunks()
    rejects = meta.filter(pc.invert(ok)).select(
        ["partition", "index", "timestamp_ns", "reason", "detail"]
    )
    _write_table(out / "rejects", rejects)
    lap = summary.lap("decode + rejects", t0)

    # first copy of each message id (the records are in index order: the first occurrence);
    # later copies counted (resends, repair responses)
    # every record decoded (no reject): the table as read (the filter copied its 1M ids)
    good = meta if ok.null_count == 0 and ok.false_count == 0 else meta.filter(ok)
    # each row's first row of its id, from the ids' sorted hashes (``first_rows``; a
    # ``dictionary_encode`` + ``np.unique`` took ~0.9 s of the driver's one core at 1M
    # messages while the other idled)
    row = np.arange(good.num_rows, dtype=np.int64)
    first_row = first_rows(good.column("message_id"))  # no id (not decoded): its own
    is_first = first_row == row
    copies = pa.array(np.bincount(first_row, minlength=len(row))[is_first], pa.int64())
    # no later copy (no resend on the channel): the rows as read, not a copy of every column
    first = (good if bool(is_first.all()) else good.filter(pa.array(is_first))).append_column(
        "copies", copies
    )
    later = good.column("index").to_numpy()[~is_first]
    kind = first.column("kind")
    is_content = np.asarray(
        pc.fill_null(pc.equal(kind, "content"), False).to_numpy(zero_copy_only=False), dtype=bool
    )
    content = first.select(["message_id", "index", "timestamp_ns", "sender"])
    if not bool(is_content.all()):  # only content messages: the columns as read, not copied
        content = content.filter(pa.array(is_content))

    # the sweep: one job, a task per group of senders
    # each sender's content and sync messages counted from the one column (a filter of
    # ``first`` copied every column of its rows, then a group_by)
    swept = first.column("sender").filter(pc.is_in(kind, _SWEPT_KINDS))
    counts = pc.value_counts(swept)
    senders = pa.table({"sender": counts.field("values"), "index_count": counts.field("counts")})
    acks_dir = out / "acks"
    acks_dir.mkdir(parents=True, exist_ok=True)
    groups = _sender_groups(senders, _concurrent_tasks(sc))
    content_path = str(work / "content.arrow")
    with pa.ipc.new_file(content_path, content.schema) as w:
        w.write_table(content)
    task = _sweep_task(decoded, bloom_files, later, content_path, str(acks_dir), str(work))
    results = (
        sc.parallelize(list(enumerate(groups)), len(groups)).map(task).collect() if groups else []
    )
    ack_files = [p for r in results for p in r[3]]
    _check_parts(acks_dir, ack_files, ACKS_SCHEMA)
    figures = pa.concat_tables(
        [r[0] for r in results] or [PARTICIPANT_SWEEP_SCHEMA.empty_table()]
    ).sort_by("participant")
    late = pa.concat_tables([r[1] for r in results] or [LATE_SCHEMA.empty_table()])
    never = sorted({d for r in results for d in r[2]})
    n_content = content.num_rows
    acked = np.zeros(n_content, dtype=np.int64)
    lo = np.full(n_content, np.inf)
    hi = np.full(n_content, -np.inf)
    for r in results:
        s = np.load(r[4])
        acked += s[0].astype(np.int64)
        lo, hi = np.minimum(lo, s[1]), np.maximum(hi, s[2])
    summary.participants = figures.num_rows
    summary.acks = int(pc.sum(figures.column("acknowledged")).as_py() or 0)
    lap = summary.lap("first copies + ack sweep", lap)

    # repairs: each request answered by the first content copy after it
    repairs = _repairs(first, good)
    _write_table(out / "repairs", repairs)

    # the per-message figures, in the first copies' order
    n_first = first.num_rows
    ids = first.column("message_id")

    def at(keys: pa.Array) -> Any:
        if not len(keys):  # none: no need to hash every first copy's id
            return np.full(n_first, -1, dtype=np.int64)
        found = pc.index_in(ids, value_set=keys)
        return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), np.int64)

    late_at = at(late.column("message_id"))
    deps_seen_later = (
        np.where(late_at >= 0, late.column("deps_seen_later").to_numpy()[np.maximum(late_at, 0)], 0)
        if late.num_rows
        else np.zeros(n_first, dtype=np.int64)
    )
    # each first copy's row among the content messages (-1: not one): they are its rows of
    # kind content, in order, and the ids of first copies are distinct
    content_at = np.full(n_first, -1, dtype=np.int64)
    content_at[is_content] = np.arange(n_content, dtype=np.int64)
    has = content_at >= 0
    ack_n = np.where(has, acked[np.maximum(content_at, 0)] if n_content else 0, 0)
    some = has & (ack_n > 0)
    first_ack = np.where(some, lo[np.maximum(content_at, 0)] if n_content else 0, np.nan)
    last_ack = np.where(some, hi[np.maximum(content_at, 0)] if n_content else 0, np.nan)
    asked = repairs.group_by("message_id").aggregate(
        [("message_id", "count"), ("response_index", "count")]
    )
    asked_at = at(asked.column("message_id"))
    pick = np.maximum(asked_at, 0)
    n_req = asked.column("message_id_count").to_numpy()
    n_resp = asked.column("response_index_count").to_numpy()
    req = np.where(asked_at >= 0, n_req[pick] if asked.num_rows else 0, 0)
    resp = np.where(asked_at >= 0, n_resp[pick] if asked.num_rows else 0, 0)
    stats = pa.table(
        {
            "first_index": first.column("index"),
            "copies": first.column("copies"),
            "deps_seen_later": pa.array(deps_seen_later, pa.int64()),
            "acknowledged_by": pa.array(ack_n, pa.int64()),
            "first_ack_ms": pa.array(first_ack, pa.float64(), mask=~some),
            "last_ack_ms": pa.array(last_ack, pa.float64(), mask=~some),
            "repair_requests": pa.array(req, pa.int64()),
            "repair_responses": pa.array(resp, pa.int64()),
        }
    )
    lap = summary.lap("dependencies + repairs", lap)

    # messages: one task per decoded part file, with that file's first copies' figures
    not_acked = {
        p: set(na or ())
        for p, na in zip(
            figures.column("participant").to_pylist(),
            figures.column("not_acknowledged").to_pylist(),
            strict=True,
        )
    }
    cands = sorted(set().union(*not_acked.values(), never))
    msg_dir = out / "messages"
    msg_dir.mkdir(parents=True, exist_ok=True)
    items: list[tuple[str, str]] = []
    first_idx = first.column("index").to_numpy()
    figures_dir = work / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    done = 0
    for k, (f, n_to) in enumerate(zip(decoded, ends, strict=True)):
        last = int(idx[n_to - 1]) if n_to else -1
        end = int(np.searchsorted(first_idx, last, side="right"))
        if end > done:
            path = str(figures_dir / f"part-{k:05d}.arrow")
            with pa.ipc.new_file(path, stats.schema) as w:
                w.write_table(stats.slice(done, end - done))
            items.append((f, path))
        done = end
    written = (
        sc.parallelize(items, len(items)).map(_messages_task(str(msg_dir), never, cands)).collect()
        if items
        else []
    )
    _check_parts(msg_dir, [w[0] for w in written], MESSAGES_SCHEMA)
    edges = pa.concat_tables([w[1] for w in written] or [EDGES_SCHEMA.empty_table()])
    lap = summary.lap("messages", lap)

    # unresolved: a dependency of a message j held (acknowledged or sent) that j never
    # acknowledged: never on the channel, or in j's not-acknowledged list
    unresolved: dict[str, list[str]] = {}
    if edges.num_rows:
        mids = pc.unique(edges.column("message_id"))
        held = pq.read_table(
            acks_dir,
            columns=["participant", "message_id"],
            filters=pc.is_in(pc.field("message_id"), value_set=mids),
        )
        own = content.filter(pc.is_in(content.column("message_id"), value_set=mids))
        held = pa.concat_tables(
            [
                held,
                own.select(["sender", "message_id"]).rename_columns(["participant", "message_id"]),
            ]
        )
        pairs = held.join(edges, "message_id").select(["participant", "dep"])
        never_set = set(never)
        found: dict[str, set[str]] = {}
        for p, d in zip(
            pairs.column("participant").to_pylist(), pairs.column("dep").to_pylist(), strict=True
        ):
            if p in not_acked and (d in never_set or d in not_acked[p]):
                found.setdefault(p, set()).add(d)
        unresolved = {p: sorted(ds) for p, ds in found.items()}
    deps = [unresolved.get(p, []) for p in figures.column("participant").to_pylist()]
    participants = figures.append_column(
        pa.field("unresolved_deps", pa.list_(pa.string()), nullable=False),
        pa.array(deps, pa.list_(pa.string())),
    ).append_column(
        pa.field("unresolved", pa.int32(), nullable=False),
        pa.array([len(d) for d in deps], pa.int32()),
    )
    _write_table(out / "participants", participants)
    lap = summary.lap("participants", lap)

    kinds = {
        str(r["values"]): int(r["counts"])
        for r in pc.value_counts(first.column("kind")).to_pylist()
    }
    summary.content_messages = kinds.get("content", 0)
    summary.sync_messages = kinds.get("sync", 0)
    summary.ephemeral_messages = kinds.get("ephemeral", 0)
    summary.duplicate_copies = good.num_rows - n_first
    summary.repair_requests = repairs.num_rows
    summary.repair_responses = int(resp.sum()) if n_first else 0
    summary.never_delivered = len(never)
    lap = summary.lap("summary", lap)
    summary.seconds = round(time.monotonic() - t0, 3)
    if opts.report:
        from loglake.pipeline.jobs.sds_audit_report import write_report

        write_report(spark, out, summary)
        summary.lap("report", lap)
        summary.seconds = round(time.monotonic() - t0, 3)
    (out / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
    return summary


def _concurrent_tasks(sc: Any) -> int:
    """How many sweep tasks: as many as run at once. Why not ``defaultParallelism``: a sweep
    task reads the sweep columns of every decoded file whatever senders it holds, so a task
    more than the cores is that read again for no parallelism (``local[*]`` on 2 cores with
    loglake's default parallelism of 4 read them 4 times). A local master says its cores
    (``local``, ``local[N]``, ``local[N, F]``, ``local[*]``) and caps it; elsewhere the default
    parallelism, as before."""
    import os
    import re

    n = max(1, int(sc.defaultParallelism))
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?", str(getattr(sc, "master", "")))
    if m is None:
        return n
    cores = (
        1 if m.group(1) is None else (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))
    )
    return max(1, min(n, cores))


def _sender_groups(senders: pa.Table, n: int) -> list[list[str]]:
    """The senders (``sender``, ``index_count``) dealt to at most ``n`` tasks, the largest
    first to the least loaded, so the tasks sweep about as many messages each."""
    order = sorted(
        zip(
            senders.column("index_count").to_pylist(),
            senders.column("sender").to_pylist(),
            strict=True,
        ),
        key=lambda x: (-x[0], x[1]),
    )
    n = max(1, min(n, len(order)))
    groups: list[list[str]] = [[] for _ in range(n)]
    load = [0] * n
    for count, sender in order:
        k = load.index(min(load))
        groups[k].append(sender)
        load[k] += count
    return [sorted(g) for g in groups if g]


REPAIRS_SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("requester", pa.string()),
        ("request_index", pa.int64()),
        ("request_timestamp_ns", pa.int64()),
        ("response_index", pa.int64()),
        ("response_timestamp_ns", pa.int64()),
        ("response_ms", pa.float64()),
    ]
)


def _repairs(first: pa.Table, good: pa.Table) -> pa.Table:
    """Every repair request of a first copy (one row per id it asks for), answered by the first
    content copy of that id after it (null when none), in the requests' order."""
    import bisect

    import numpy as np
    import pyarrow.compute as pc

    req = first.column("repair_request").combine_chunks()
    at = np.asarray(pc.list_parent_indices(req).to_numpy(), dtype=np.int64)
    asked = pc.list_flatten(req)
    copies = good.filter(  # none asked: no need to hash every record's id
        pc.and_(
            pc.equal(good.column("kind"), "content"),
            pc.is_in(good.column("message_id"), value_set=pc.unique(asked)),
        )
        if len(asked)
        else pa.array(np.zeros(good.num_rows, dtype=bool))
    )
    by_id: dict[str, tuple[list[int], list[int]]] = {}
    for mid, i, ts in zip(
        copies.column("message_id").to_pylist(),
        copies.column("index").to_pylist(),
        copies.column("timestamp_ns").to_pylist(),
        strict=True,
    ):
        seen = by_id.setdefault(mid, ([], []))
        seen[0].append(i)  # in index order: the records are
        seen[1].append(ts)
    req_index = first.column("index").to_numpy()[at]
    req_ts = first.column("timestamp_ns").to_numpy()[at]
    resp_index: list[int | None] = []
    resp_ts: list[int | None] = []
    for mid, i in zip(asked.to_pylist(), req_index.tolist(), strict=True):
        got = by_id.get(mid)
        k = bisect.bisect_right(got[0], i) if got else 0
        if got and k < len(got[0]):
            resp_index.append(got[0][k])
            resp_ts.append(got[1][k])
        else:
            resp_index.append(None)
            resp_ts.append(None)
    rts = pa.array(resp_ts, pa.int64())
    return pa.table(
        [
            asked,
            first.column("sender").take(pa.array(at)),
            pa.array(req_index, pa.int64()),
            pa.array(req_ts, pa.int64()),
            pa.array(resp_index, pa.int64()),
            rts,
            pc.divide(pc.cast(pc.subtract(rts, pa.array(req_ts, pa.int64())), pa.float64()), 1e6),
        ],
        schema=REPAIRS_SCHEMA,
    )


def _write_table(folder: Path, t: pa.Table) -> None:
    """A small table written by the driver as one zstd Parquet file in ``folder``."""
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, folder / "part-00000.zstd.parquet", compression="zstd")


def table(spark: SparkSession, out_dir: str, name: str) -> DataFrame:
    """One of the audit's tables (``TABLES``) as a DataFrame."""
    if name not in TABLES:
        raise BadOption("table", name, f"one of {', '.join(TABLES)}")
    return spark.read.parquet(str(Path(out_dir) / name))


def summarize(out_dir: str) -> AuditSummary:
    return AuditSummary(**json.loads((Path(out_dir) / "summary.json").read_text()))
