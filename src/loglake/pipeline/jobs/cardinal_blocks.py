"""``cardinal-blocks``: Cardinal blocks as Parquet tables, by Structured Streaming, exactly once.

A streaming query follows every partition of a Cardinal application's topics (the
``loglake-ranges`` source: the ``loglake`` source's offsets, a micro-batch's index ranges as its
rows, ``cardinal_blocks_source``); the driver (``foreachBatch``) reads each micro-batch's
records where they lie, as one Arrow table, and:

1. assembles blocks (``Assembler``): each record's envelope is opened
   (``cardinal.transport.open_envelope``), block messages are gathered by block hash, and a
   block's messages so far go to ``cardinal.consumer.assemble_block`` — ``BlockAssembler``'s
   rules, not a second implementation. Incomplete blocks wait in the assembly state; a complete
   block is emitted once and leaves a tombstone, so a redundant producer's late copies are
   dropped; messages that do not decode or that the rules drop (index past ItemCount, more
   messages than a prefix announced, a key under no announced prefix …) come out as rejects;
   Reorg/ReorgComplete/Ping go on to the ordering, and records that do not decode are rejects
   with the decoder's reason;
2. orders blocks: the completed blocks of the micro-batch, in (number, hash) order, go to
   ``cardinal.ordering.OrderedConsumer.add_block`` (the processor's reorg rules), and a Reorg
   read on a topic waits (``OrderedConsumer.reorg_ready``) until the chain has reached its
   ancestor, then its reorg channel ``<default topic>-re-<ancestor hex>`` is read to its first
   ReorgComplete and fed to the same consumer, as ``StreamConsumer`` does.

Why on the driver: the ordering is one sequence and runs there anyway; assembling beside it
costs no hand-off of the records at all (the driver reads them; through the ``loglake`` source
they crossed executor Python, the JVM and Arrow twice, about half the job's CPU). Assembling
in a stateful Python stage (``applyInPandasWithState``, plans 1 and 2) cost a shuffle, a state
store, pandas frames and a second trip of every block back to the driver: about twice the CPU a
message.

Tables under ``out_dir`` (Parquet, one file per table per micro-batch): ``blocks`` (a row per
update or delete of a block, or one row for a block with neither), ``chain_updates`` (what each
update removed and added, and reorg notices, in ``seq`` order) and ``rejects`` (topic,
partition, offset, reason). ``loglake.pipeline.cardinal`` reads them (``tables``,
``canonical``).

Exactly once: Spark's checkpoint holds the source offsets; the driver's assembly and
ordering state is saved per micro-batch (``_state/<batch>.pkl``, a pickle of the sans-I/O
``OrderedConsumer``, written by this job for this job) and each micro-batch's files are named
by its id and written atomically (temp file + rename), then ``_batches/<batch>.json`` marks the
batch complete. A micro-batch run again after a crash starts from the ordering state of the
batch before it and, its input being the same (Spark replays the same offsets; assembly and
ordering are deterministic), rewrites the same files. Readers only read batches with a marker.

Known limits: a block whose Batch never comes stays in the assembly state (no timeout yet); the
job reads a data dir (``url`` nodes: not yet).
"""

from __future__ import annotations

import gc
import json
import math
import os
import pickle
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from loglake.cardinal import (
    DEFAULT_REORG_THRESHOLD,
    MAX_REORG_THRESHOLD,
    REORG,
    REORG_COMPLETE,
    ZERO_HASH,
    Block,
    BlockRef,
    CardinalDecodeError,
    ChainUpdate,
    Checkpoint,
    OrderedConsumer,
    Reorg,
    ReorgEvent,
    UnknownAncestor,
    assemble_block,
    assemble_blocks,
    channel_segment,
    decode,
    heaviest_batch,
    open_envelope,
    reorg_channel_name,
    source_name,
)
from loglake.log.api import INT64_MAX, STREAM_NAME_RE
from loglake.pipeline.errors import BadOption, raises_task_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

JOB_FILE = "_job.json"
BATCHES = "_batches"
STATE = "_state"
CHECKPOINT = "_checkpoint"
TABLES = ("blocks", "chain_updates", "rejects")
KEEP_STATES = 3
MAX_PENDING_REORGS = 32
PLAN = 4
"""The query's shape, recorded in ``_job.json``: 1 = route records in a ``mapInArrow`` stage,
then assemble in ``applyInPandasWithState`` (two Python stages); 2 = group key computed in the
JVM, the same stateful assembly (one Python stage); 3 = no stateful operator: the records go
to the driver, which assembles and orders them, the assembly state saved with the ordering
state; 4 = as 3, but the query's source is ``loglake-ranges`` (a micro-batch's index ranges)
and the driver reads the records itself. Spark's checkpoint holds the plan's sources,
operators and state: one of another plan cannot resume this query, so such an output is
refused."""

BLOCKS_SCHEMA = pa.schema(
    [
        ("number", pa.int64()),
        ("hash", pa.string()),
        ("parent", pa.string()),
        ("weight", pa.string()),
        ("time", pa.int64()),
        ("key", pa.string()),
        ("value", pa.binary()),
        ("deleted", pa.bool_()),
        ("batch_id", pa.int64()),
    ]
)
"""``weight`` is a decimal string (256 bits fit no Spark number); ``hash``/``parent`` are hex;
``time`` is the log timestamp (ns) of the newest record that made the block; ``key`` is null
(and ``deleted`` false) on the one row of a block with no updates and no deletes."""

CHAIN_UPDATES_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("position", pa.int32()),
        ("action", pa.string()),
        ("number", pa.int64()),
        ("hash", pa.string()),
        ("parent", pa.string()),
        ("weight", pa.string()),
        ("batch_id", pa.int64()),
    ]
)
"""One ``seq`` per ``ChainUpdate`` or ``ReorgEvent``, in the order the application applies them;
``action`` is ``remove`` (oldest first, listed first), ``add``, ``reorg`` (number/hash: the
common ancestor; everything above it is reverted) or ``reorg_complete``."""

REJECTS_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("reason", pa.string()),
        ("batch_id", pa.int64()),
    ]
)

SCHEMAS = {
    "blocks": BLOCKS_SCHEMA,
    "chain_updates": CHAIN_UPDATES_SCHEMA,
    "rejects": REJECTS_SCHEMA,
}

# -- options --------------------------------------------------------------------------------

MAX_FOLLOW_SECONDS = 86_400.0
"""The longest ``--follow`` (seconds between micro-batches): a day."""


@dataclass(frozen=True)
class CardinalBlocksOptions:
    """What the job needs; ``validate()`` checks it before Spark does anything."""

    data_dir: str
    topics: tuple[str, ...]
    """The application's topics; the first is the default topic (Reorgs, reorg channels)."""
    out_dir: str
    checkpoint_dir: str | None = None
    """Spark's checkpoint (default ``<out_dir>/_checkpoint``)."""
    reorg_threshold: int = DEFAULT_REORG_THRESHOLD
    prefixes: tuple[str, ...] = (".*",)
    max_records_per_trigger: int | None = None
    """Per topic and micro-batch (the ``loglake`` source's ``maxRecordsPerTrigger``)."""
    follow_seconds: float | None = None
    """None: read what is there and stop (``availableNow``); else keep running, one
    micro-batch every this many seconds."""

    def validate(self) -> CardinalBlocksOptions:
        """Normalised options, or ``BadOption`` naming the option; touches nothing."""
        from loglake.pipeline.options import parse_options, resolve_stream

        data_dir = Path(self.data_dir).expanduser().resolve()
        if not data_dir.is_dir():
            raise BadOption("--data-dir", self.data_dir, "not a directory")
        if not self.topics:
            raise BadOption("--topic", "", "give at least one topic")
        for t in self.topics:
            if not STREAM_NAME_RE.fullmatch(t):
                raise BadOption("--topic", t, "not a valid stream name")
            try:
                resolve_stream(parse_options({"data_dir": str(data_dir), "stream": t}))
            except BadOption as e:
                raise BadOption("--topic", t, e.reason) from None
        if len(set(self.topics)) != len(self.topics):
            raise BadOption("--topic", ",".join(self.topics), "a topic is given twice")
        if (
            isinstance(self.reorg_threshold, bool)
            or not isinstance(self.reorg_threshold, int)
            or not 1 <= self.reorg_threshold <= MAX_REORG_THRESHOLD
        ):
            raise BadOption(
                "--reorg-threshold",
                self.reorg_threshold,
                f"expected an integer from 1 to {MAX_REORG_THRESHOLD}",
            )
        if not self.prefixes:
            raise BadOption("--prefix", "", "give at least one prefix (.* tracks all)")
        for p in self.prefixes:
            try:
                re.compile(p)
            except re.error as e:
                raise BadOption("--prefix", p, f"not a regular expression: {e}") from None
        m = self.max_records_per_trigger
        if m is not None and (
            isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= INT64_MAX
        ):
            raise BadOption(
                "--max-records-per-trigger", m, f"expected an integer from 1 to {INT64_MAX}"
            )
        f = self.follow_seconds
        if f is not None and not (isinstance(f, int | float) and 0 <= f <= MAX_FOLLOW_SECONDS):
            raise BadOption("--follow", f, "expected seconds between 0 and 86400")
        if not str(self.out_dir).strip():
            raise BadOption("--out", self.out_dir, "required")
        out = Path(self.out_dir).expanduser().resolve()
        if out.exists() and not out.is_dir():
            raise BadOption("--out", self.out_dir, "exists and is not a directory")
        if out == data_dir or data_dir in out.parents:
            raise BadOption("--out", self.out_dir, "must not be inside the data dir")
        cp = Path(self.checkpoint_dir).expanduser().resolve() if self.checkpoint_dir else None
        opts = CardinalBlocksOptions(
            str(data_dir),
            tuple(self.topics),
            str(out),
            str(cp) if cp else str(out / CHECKPOINT),
            self.reorg_threshold,
            tuple(self.prefixes),
            m,
            f,
        )
        job = out / JOB_FILE
        if job.exists():
            before = json.loads(job.read_text())
            if before.get("plan", 1) != PLAN:
                raise BadOption(
                    "--out",
                    opts.out_dir,
                    f"was built by plan {before.get('plan', 1)} of this job (its checkpoint "
                    f"holds that query's operators and state), this is plan {PLAN}: start "
                    "again with another --out (and checkpoint)",
                )
            for name, flag in (
                ("topics", "--topic"),
                ("reorg_threshold", "--reorg-threshold"),
                ("prefixes", "--prefix"),
                ("data_dir", "--data-dir"),
            ):
                now = opts.identity()[name]
                if before.get(name) != now:
                    raise BadOption(
                        flag,
                        now,
                        f"{opts.out_dir} was built with {name}={before.get(name)!r}; "
                        "use another --out (and checkpoint) to change it",
                    )
        return opts

    def identity(self) -> dict[str, Any]:
        """What the outputs depend on: a restart must not change it."""
        return {
            "plan": PLAN,
            "data_dir": self.data_dir,
            "topics": list(self.topics),
            "reorg_threshold": self.reorg_threshold,
            "prefixes": list(self.prefixes),
        }


# -- stage 1: assemble (driver, with the ordering state) -----------------------------------


def _is_block_key(k: bytes) -> bool:
    """A block message's key: type 0-4, then the 32-byte block hash."""
    return len(k) >= 33 and k[0] <= 0x04


@dataclass
class AssemblyState:
    """The blocks being assembled, kept with the ordering state (pickled per micro-batch)."""

    pending: dict[bytes, tuple[int, list[tuple[bytes, bytes, str, int]]]] = field(
        default_factory=dict
    )
    """Incomplete blocks: hash → (newest log time in ns or -1, the messages ``assemble_block``
    kept)."""
    done: dict[bytes, int] = field(default_factory=dict)
    """Tombstones of complete blocks (hash → number), kept while within ``4 × reorg_threshold``
    of the highest one, as ``BlockAssembler`` keeps completed hashes: a redundant producer's
    late copies are dropped."""


@dataclass
class Assembled:
    """What one micro-batch's records made."""

    blocks: list[tuple[Block, int]] = field(default_factory=list)
    """Complete blocks with the log time (ns, -1 if none) of their newest record."""
    control: list[tuple[str, int, int, bytes, bytes]] = field(default_factory=list)
    """Reorg, ReorgComplete and Ping records: (topic, partition, offset, key, value)."""
    rejects: list[dict] = field(default_factory=list)


class Assembler:
    """Opens each record's envelope, gathers block messages by block hash and hands each
    block's messages so far to ``cardinal.consumer.assemble_block`` — ``BlockAssembler``'s
    rules, not a second implementation. Runs on the driver beside the ordering, which needs
    every block in order anyway: one hand-off of the records (Arrow, JVM → driver) instead of a
    shuffle into a stateful Python stage whose output came back to the driver."""

    def __init__(self, prefixes: Sequence[str], reorg_threshold: int, topics: Sequence[str]):
        self.tracked = tuple(prefixes)
        self.names = tuple(topics)
        self.reach = 4 * reorg_threshold
        self._sources: dict[tuple[int, int], str] = {}

    def _reject(self, out: Assembled, t: int, part: int, off: int, why: str) -> None:
        out.rejects.append(BatchWriter._reject(self.names[t], part, off, why))

    def _control(self, out: Assembled, data: bytes | None, t: int, part: int, off: int) -> None:
        """A record that is no block message: passed on, or a reject with the reason."""
        try:
            k, v = open_envelope(data or b"")
            if _is_block_key(k):  # a block message goes to its block: never here
                raise CardinalDecodeError("envelope", "block message outside its block's group")
            decode(k, v)  # Reorg, ReorgComplete, Ping, or a reject with the reason
        except CardinalDecodeError as e:
            self._reject(out, t, part, off, str(e))
            return
        out.control.append((self.names[t], part, off, k, v))

    def _source(self, t: int, part: int) -> str:
        src = self._sources.get((t, part))
        if src is None:
            src = self._sources[(t, part)] = source_name(self.names[t], part)
        return src

    def _one(
        self,
        out: Assembled,
        new: dict[bytes, list[tuple[bytes, bytes, str, int, int]]],
        done: dict[bytes, int],
        rec: tuple[bytes | None, int, int, int, int],
    ) -> None:
        """One record, the reference way: its envelope opened in Python."""
        data, t, part, off, ts = rec
        try:
            k, v = open_envelope(data or b"")
        except CardinalDecodeError as e:
            self._reject(out, t, part, off, str(e))
            return
        if not _is_block_key(k):  # a short key of a block type: the decoder's reason
            self._control(out, data, t, part, off)
            return
        h = k[1:33]
        if h not in done:  # else a late copy of a complete block
            new.setdefault(h, []).append((k, v, self._source(t, part), off, ts))

    def run_reference(self, records: pa.Table, st: AssemblyState) -> Assembled:
        """``run`` record by record in Python (the reference the kernels are tested against)."""
        out = Assembled()
        new: dict[bytes, list[tuple[bytes, bytes, str, int, int]]] = {}
        cols = [records.column(c).to_pylist() for c in _IN_COLUMNS]
        for rec in zip(*cols, strict=True):
            self._one(out, new, st.done, rec)
        return self._assemble(out, new, st, shared=False)

    def run(self, records: pa.Table, st: AssemblyState) -> Assembled:
        """Assemble one micro-batch's ``records`` (columns ``_IN_COLUMNS``) onto ``st``: the
        block messages found and their exact copies dropped by the columnar kernels
        (``cardinal_blocks_kernel``), each distinct one then opened in Python; every other
        record the reference way, in record order (so rejects come in the same order)."""
        import numpy as np

        from loglake.pipeline.jobs.cardinal_blocks_kernel import envelope_heads, first_copies

        out = Assembled()
        new: dict[bytes, list[tuple[bytes, bytes, str, int, int]]] = {}
        data = records.column("data").combine_chunks()
        heads = envelope_heads(data)
        cols = {c: records.column(c).to_numpy() for c in _IN_COLUMNS[1:]}
        t_col, p_col, o_col, ts_col = (cols[c] for c in _IN_COLUMNS[1:])
        slow = np.flatnonzero(~heads.fast)
        if len(slow):
            sub = records.take(pa.array(slow))
            for rec in zip(*(sub.column(c).to_pylist() for c in _IN_COLUMNS), strict=True):
                self._one(out, new, st.done, rec)
        rows = np.flatnonzero(heads.fast)
        if len(rows):
            # rank of (source name, offset), the order assemble_block keeps copies in
            tp = (t_col[rows].astype(np.int64) << 32) | p_col[rows].astype(np.int64)
            pairs, which = np.unique(tp, return_inverse=True)
            names = [self._source(int(u) >> 32, int(u) & 0xFFFFFFFF) for u in pairs]
            rank_of = np.empty(len(pairs), dtype=np.int64)
            rank_of[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(pairs))
            order = np.empty(len(rows), dtype=np.int64)
            order[np.lexsort((o_col[rows], rank_of[which.reshape(-1)]))] = np.arange(len(rows))
            survivors, groups = first_copies(data, rows, order)
            newest = np.full(len(survivors), -1, dtype=np.int64)
            np.maximum.at(newest, groups, ts_col[rows])
            done = st.done
            source_of = np.empty(len(data), dtype=np.int64)  # a row's index into ``names``
            source_of[rows] = which.reshape(-1)
            for d, v, n, src, off, ts in zip(
                data.take(pa.array(survivors)).to_pylist(),
                heads.vlen[survivors].tolist(),
                heads.klen[survivors].tolist(),
                np.array(names, dtype=object)[source_of[survivors]].tolist(),
                o_col[survivors].tolist(),
                newest.tolist(),
                strict=True,
            ):
                k = d[v : v + n]
                h = k[1:33]
                if h not in done:
                    new.setdefault(h, []).append((k, d[v + n :], src, off, ts))
        return self._assemble(out, new, st)

    def _assemble(
        self,
        out: Assembled,
        new: dict[bytes, list[tuple[bytes, bytes, str, int, int]]],
        st: AssemblyState,
        shared: bool = True,
    ) -> Assembled:
        """Each block's messages so far through ``assemble_block``'s rules, in hash order:
        ``shared`` through one assembler for all (``assemble_blocks``), else one
        ``assemble_block`` call a block (the reference ``run_reference`` keeps)."""
        done, pending = st.done, st.pending
        hashes = sorted(new)
        groups = [pending.get(h, (-1, []))[1] + [m[:4] for m in new[h]] for h in hashes]
        if shared:
            results = assemble_blocks(groups, self.tracked)
        else:
            results = [assemble_block(g, self.tracked) for g in groups]
        for h, result in zip(hashes, results, strict=True):
            time = pending.get(h, (-1, []))[0]
            for m in new[h]:
                if m[4] > time:
                    time = m[4]
            for source, offset, why in result.rejected:
                topic, _, part = source.rpartition(":")
                out.rejects.append(BatchWriter._reject(topic, int(part), offset, why))
            if result.block is not None:
                out.blocks.append((result.block, time))
                done[h] = result.block.number
                pending.pop(h, None)
            else:
                pending[h] = (time, result.kept)
        if len(done) > 2 * self.reach + 16:
            cut = max(done.values()) - self.reach
            st.done = {h: n for h, n in done.items() if n >= cut}
        return out


_IN_COLUMNS = ("data", "t", "partition", "offset", "ts")
"""What the assembler reads: the record, its topic as an index into the job's topics, and its
log time in ns (-1 if none)."""


# -- stage 3: order and write (driver, foreachBatch) ----------------------------------------


@dataclass
class OrderingState:
    """The driver's state between micro-batches (pickled per batch)."""

    core: OrderedConsumer
    seq: int = 0
    pending: list[tuple[str, int, int, bytes, bytes]] = field(default_factory=list)
    """Reorgs read on a topic whose ancestor the chain has not reached: (topic, partition,
    offset, key, value), oldest first."""
    followed: list[str] = field(default_factory=list)
    """Reorg channels read to their first ReorgComplete by states written before
    ``channel_ends`` (kept to read those)."""
    channel_ends: dict[str, int] = field(default_factory=dict)
    """Reorg channel -> the index after the last ReorgComplete read there (at most
    ``MAX_PENDING_REORGS``): a Reorg naming it again reads on from there."""
    open_follow: tuple[tuple[str, int, int, bytes, bytes], int] | None = None
    """A reorg channel read to its end before its ReorgComplete: (its Reorg, the next index);
    the next micro-batch reads on from there first."""
    emitted: dict[bytes, int] = field(default_factory=dict)
    """Blocks written to ``blocks`` (hash → number), within the window's reach."""
    assembly: AssemblyState = field(default_factory=AssemblyState)


def _hex(b: bytes) -> str:
    return b.hex()


class BatchWriter:
    """The ``foreachBatch`` function: order, then write the micro-batch's files."""

    def __init__(self, opts: CardinalBlocksOptions) -> None:
        self.opts = opts
        self.out = Path(opts.out_dir)
        self.assembler = Assembler(opts.prefixes, opts.reorg_threshold, opts.topics)

    # -- state files
    def _state_path(self, batch_id: int) -> Path:
        return self.out / STATE / f"{batch_id:012d}.pkl"

    def load_state(self, batch_id: int) -> OrderingState:
        folder = self.out / STATE
        ids = (
            sorted(int(p.stem) for p in folder.glob("*.pkl") if p.stem.isdigit())
            if folder.is_dir()
            else []
        )
        before = [i for i in ids if i < batch_id]
        if before:
            with open(self._state_path(before[-1]), "rb") as f:
                state = pickle.load(f)
            assert isinstance(state, OrderingState)
            if not hasattr(state, "channel_ends"):  # written before they existed
                state.channel_ends, state.open_follow = {}, None
            return state
        start = Checkpoint.starting_at(-1, ZERO_HASH, 0)  # as `loglake cardinal consume`
        return OrderingState(OrderedConsumer(self.opts.reorg_threshold, self.opts.prefixes, start))

    def _write_atomic(self, path: Path, data: bytes) -> None:
        """Temp file, fsync, rename, fsync of the folder; the folders made durable first (a
        folder whose own name never reached the disk takes its files with it on power loss)."""
        from loglake.log import fs

        fs.makedirs_durable(path.parent)
        fs.replace_file_atomic(path, data)

    def _write_table(self, name: str, batch_id: int, rows: list[dict] | _Columns) -> int:
        path = self.out / name / f"batch-{batch_id:012d}.parquet"
        if not len(rows):
            path.unlink(missing_ok=True)
            return 0
        if isinstance(rows, _Columns):
            table = pa.Table.from_pydict(rows.cols, schema=SCHEMAS[name])
        else:
            table = pa.Table.from_pylist(rows, schema=SCHEMAS[name])
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        self._write_atomic(path, sink.getvalue().to_pybytes())
        return len(rows)

    # -- the batch
    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """The micro-batch's rows are its index ranges (``cardinal_blocks_source``); the
        records are read here, on the driver, where they lie."""
        from loglake.pipeline.jobs.cardinal_blocks_source import read_records

        self.process(read_records(self.opts.data_dir, self.opts.topics, df.toArrow()), batch_id)

    def process(self, records: pa.Table, batch_id: int) -> dict[str, int]:
        """Assemble, order and write one micro-batch's records (columns ``_IN_COLUMNS``).

        The cyclic garbage collector is paused meanwhile: a micro-batch makes tens of
        thousands of short-lived objects (messages, blocks, rows), none in a cycle, all freed
        by reference counts, and the collections their allocations set off walked them again
        and again — about a quarter of the driver's CPU at 80,000 messages. It runs again
        after the batch."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._process(records, batch_id)
        finally:
            if enabled:
                gc.enable()

    def _process(self, records: pa.Table, batch_id: int) -> dict[str, int]:
        st = self.load_state(batch_id)
        got = self.assembler.run(records, st.assembly)
        blocks, control, rejects = got.blocks, got.control, got.rejects
        out = _Output(batch_id, st)
        for blk, time in sorted(blocks, key=lambda bt: (bt[0].number, bt[0].hash)):
            if out.new_block(blk, time):
                out.chain(st.core.add_block(blk))
        for c in sorted(control, key=lambda c: (c[0], c[1], c[2])):
            topic, part, offset, key, value = c
            if key[:1] == bytes((REORG,)) and topic == self.opts.topics[0]:
                st.pending.append(c)
            elif key[:1] == bytes((REORG_COMPLETE,)):
                out.receive(key, value, source_name(topic, part), offset, topic, rejects)
        self._reorgs(st, out, rejects)
        for r in rejects:
            r["batch_id"] = batch_id
        # prune what the driver remembers to the window's reach
        head = st.core.head
        if head is not None and len(st.emitted) > 8 * self.opts.reorg_threshold + 64:
            cut = head.number - 4 * self.opts.reorg_threshold
            st.emitted = {h: n for h, n in st.emitted.items() if n >= cut}
        counts = {
            "blocks": self._write_table("blocks", batch_id, out.block_rows),
            "chain_updates": self._write_table("chain_updates", batch_id, out.update_rows),
            "rejects": self._write_table("rejects", batch_id, rejects),
        }
        summary = {
            "batch_id": batch_id,
            "new_blocks": out.new_blocks,
            "rows": counts,
            "rejects": len(rejects),
            "head": [head.number, head.hash.hex()] if head else None,
            "pending_reorgs": len(st.pending),
            "late_blocks": out.late,
        }
        self._write_atomic(
            self._state_path(batch_id), pickle.dumps(st, protocol=pickle.HIGHEST_PROTOCOL)
        )
        self._write_atomic(
            self.out / BATCHES / f"{batch_id:012d}.json", json.dumps(summary).encode()
        )
        for old in sorted((self.out / STATE).glob("*.pkl"))[:-KEEP_STATES]:
            if old.stem.isdigit() and int(old.stem) < batch_id:
                old.unlink(missing_ok=True)
        return counts

    @staticmethod
    def _reject(topic: str, partition: int, offset: int, reason: str) -> dict:
        return {"topic": topic, "partition": partition, "offset": offset, "reason": reason}

    def _reorgs(self, st: OrderingState, out: _Output, rejects: list[dict]) -> None:
        """Apply every pending Reorg whose ancestor the chain has reached, oldest ready first,
        until none is ready (one may make the next ready)."""
        if st.open_follow is not None:  # a channel read to its end: read on first
            reorg, pos = st.open_follow
            self._follow(st, out, reorg, rejects, pos)
        progress = True
        while progress and st.pending:
            progress = False
            for i, (topic, part, offset, key, value) in enumerate(st.pending):
                msg = decode(key, value)
                assert isinstance(msg, Reorg)
                if not st.core.reorg_ready(msg.number, msg.hash):
                    continue
                del st.pending[i]
                self._take(st, out, (topic, part, offset, key, value), rejects)
                progress = True
                break
        while len(st.pending) > MAX_PENDING_REORGS:
            topic, part, offset, _k, _v = st.pending.pop(0)
            rejects.append(
                self._reject(topic, part, offset, "Reorg whose ancestor never came: dropped")
            )

    def _take(self, st: OrderingState, out: _Output, reorg: tuple, rejects: list[dict]) -> None:
        """A Reorg read on the default topic is ready: follow its channel (as
        ``StreamConsumer._take_reorg``). While a channel is open (read to its end before its
        ReorgComplete), another producer's Reorg for it changes nothing, and a Reorg for
        another channel means its producer moved on: the open one is left where it is."""
        channel = reorg_channel_name(self.opts.topics[0], reorg[3][1:])
        if st.open_follow is not None:
            (_t, _p, _o, open_key, _v), pos = st.open_follow
            open_channel = reorg_channel_name(self.opts.topics[0], open_key[1:])
            if open_channel == channel:
                return
            st.channel_ends[open_channel] = pos
            st.open_follow = None
        self._follow(st, out, reorg, rejects)

    def _follow(
        self,
        st: OrderingState,
        out: _Output,
        reorg: tuple,
        rejects: list[dict],
        resume: int | None = None,
    ) -> None:
        """Read the reorg channel to its next ReorgComplete (spec "Reorg/Consumers"), from
        where it was left (``channel_ends``; ``resume``: an open channel). A later segment of a
        channel read before is told apart as ``StreamConsumer`` does
        (``transport.channel_segment``: by its heaviest block): a redundant producer's copy is
        skipped, a new reorg to the same ancestor applied. Read to its end before the
        ReorgComplete, the channel stays open (``open_follow``)."""
        topic, part, offset, key, value = reorg
        channel = reorg_channel_name(self.opts.topics[0], key[1:])
        records = self._channel(channel)
        start = resume if resume is not None else st.channel_ends.get(channel)
        if start is None and channel in st.followed:  # a state from before channel_ends
            start = next(
                (i + 1 for i, d in records if d[: len(_RC_ENVELOPE)] == _RC_ENVELOPE), None
            )
        if start is None:
            if not records:  # no channel: apply the Reorg itself
                out.receive(key, value, source_name(topic, part), offset, topic, rejects)
                return
            start = 0
        src = source_name(channel, 0)
        rest = [(i, d) for i, d in records if i >= start]
        if resume is None and start > 0:
            if not rest:
                return
            first = _opened(rest[0][1])[0]
            if first[:1] == bytes((REORG,)):
                heaviest = heaviest_batch(_opened(d) for i, d in records if i < start)
                verdict = channel_segment(heaviest, ((i, *_opened(d)) for i, d in rest))
                if verdict == "open":
                    st.open_follow = (reorg, start)
                    return
                if isinstance(verdict, int):  # a copy of a segment before it
                    self._ended(st, channel, verdict)
                    return
                st.core.expect_new_reorg(first[1:], src, rest[0][0])
        pos = start
        for index, data in rest:
            pos = index + 1
            try:
                k, v = open_envelope(data)
            except CardinalDecodeError as e:
                rejects.append(self._reject(channel, 0, index, str(e)))
                continue
            out.receive(k, v, src, index, channel, rejects)
            if k[:1] == bytes((REORG_COMPLETE,)):
                self._ended(st, channel, pos)
                return
        st.open_follow = (reorg, pos)

    @staticmethod
    def _ended(st: OrderingState, channel: str, pos: int) -> None:
        st.open_follow = None
        st.channel_ends.pop(channel, None)
        st.channel_ends[channel] = pos
        while len(st.channel_ends) > MAX_PENDING_REORGS:
            del st.channel_ends[next(iter(st.channel_ends))]

    def _channel(self, channel: str) -> list[tuple[int, bytes]]:
        """The channel's records (index, data), read on the driver with the source's reader."""
        from loglake.pipeline.datasource import RangeSplit, read_range
        from loglake.pipeline.options import parse_options, resolve_stream

        opts = parse_options({"data_dir": self.opts.data_dir, "stream": channel})
        try:
            layout = resolve_stream(opts)
        except BadOption:
            return []
        if 0 not in layout.partitions:
            return []
        from loglake.pipeline.datasource import _partition_bounds

        first, nxt = _partition_bounds(opts, layout, 0)
        out: list[tuple[int, bytes]] = []
        for b in read_range(opts, RangeSplit(0, first, nxt)):
            out += zip(b.column("index").to_pylist(), b.column("data").to_pylist(), strict=True)
        return out


_RC_ENVELOPE = bytes((66, REORG_COMPLETE))
"""A ReorgComplete record's first bytes: the envelope's key length (33, an Avro long) and the
key's type."""


def _opened(data: bytes) -> tuple[bytes, bytes]:
    """A channel record's key and value; empty if its envelope does not open."""
    try:
        return open_envelope(data)
    except CardinalDecodeError:
        return b"", b""


class _Columns:
    """A table's rows as tuples in ``SCHEMAS`` order, handed to Arrow as one list per column
    (``cols``, one transpose): no dict a row to build and take apart again, and one
    ``append`` a row instead of one a column (a block row a message at 1 update a block)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.names = schema.names
        self.rows: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, *values: Any) -> None:
        self.rows.append(values)

    @property
    def cols(self) -> dict[str, list[Any]]:
        if not self.rows:
            return {n: [] for n in self.names}
        return dict(zip(self.names, map(list, zip(*self.rows, strict=True)), strict=True))


class _Output:
    """Rows of one micro-batch, built as the ordering runs."""

    def __init__(self, batch_id: int, st: OrderingState) -> None:
        self.batch_id, self.st = batch_id, st
        self.block_rows = _Columns(BLOCKS_SCHEMA)
        self.update_rows = _Columns(CHAIN_UPDATES_SCHEMA)
        self.new_blocks = 0
        self.late = 0

    def new_block(self, blk: Block, time: int) -> bool:
        """Write ``blk``'s rows unless it was written before; True if it is new."""
        if blk.hash in self.st.emitted:
            return False
        head = self.st.core.head
        if (
            head is not None
            and blk.number < head.number - 4 * self.st.core.ordering.reorg_threshold
        ):
            # completed far below the head (a copy whose tombstone is gone, or a block the
            # window dropped): the consumer drops it too (BlockAssembler's window)
            self.late += 1
            return False
        self.st.emitted[blk.hash] = blk.number
        self.new_blocks += 1
        n, h, p, w = blk.number, blk.hash.hex(), blk.parent.hex(), str(blk.weight)
        t = time if time >= 0 else None
        add, bid, values = self.block_rows.rows.append, self.batch_id, blk.values
        for k in sorted(values) if len(values) > 1 else values:
            add((n, h, p, w, t, k, values[k], False, bid))
        for k in sorted(blk.deletes):
            add((n, h, p, w, t, k, None, True, bid))
        if not values and not blk.deletes:
            add((n, h, p, w, t, None, None, False, bid))
        return True

    def chain(self, events: Sequence[ChainUpdate | ReorgEvent]) -> None:
        for ev in events:
            seq = self.st.seq
            self.st.seq += 1
            if isinstance(ev, ReorgEvent):
                self._row(seq, 0, "reorg_complete" if ev.complete else "reorg", ev.number, ev.hash)
                continue
            pos = 0
            for b in ev.removed:
                self._row(seq, pos, "remove", b.number, b.hash, b)
                pos += 1
            for b in ev.added:
                self._row(seq, pos, "add", b.number, b.hash, b)
                pos += 1

    def _row(
        self,
        seq: int,
        pos: int,
        action: str,
        number: int,
        hash_: bytes,
        b: Block | BlockRef | None = None,
    ) -> None:
        self.update_rows.add(
            seq,
            pos,
            action,
            number,
            _hex(hash_),
            _hex(b.parent) if b is not None else None,
            str(b.weight) if b is not None else None,
            self.batch_id,
        )

    def receive(
        self, key: bytes, value: bytes, source: str, offset: int, topic: str, rejects: list[dict]
    ) -> None:
        """One message through the driver's ``OrderedConsumer`` (reorg channels, Reorg and
        ReorgComplete): blocks it completes are written, updates recorded."""
        core = self.st.core
        _, _, part = source.rpartition(":")
        try:
            if key[:1] in (bytes((REORG,)), bytes((REORG_COMPLETE,))):
                self.chain(core.receive(key, value, source, offset))
                return
            core.readmit(key, source)  # a block a Reorg removed, re-sent by its channel
            for ev in core.consumer.receive(key, value, source, offset):
                if isinstance(ev, Block):
                    self.new_block(ev, -1)
                    self.chain(core.add_block(ev))
        except (CardinalDecodeError, UnknownAncestor) as e:
            rejects.append(BatchWriter._reject(topic, int(part), offset, str(e)))


# -- the query -------------------------------------------------------------------------------


@dataclass
class JobSummary:
    batches: int = 0
    blocks: int = 0
    block_rows: int = 0
    chain_updates: int = 0
    rejects: int = 0
    head: list | None = None
    pending_reorgs: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(out_dir: str) -> JobSummary:
    s = JobSummary()
    folder = Path(out_dir) / BATCHES
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        d = json.loads(p.read_text())
        s.batches += 1
        s.blocks += d["new_blocks"]
        s.block_rows += d["rows"]["blocks"]
        s.chain_updates += d["rows"]["chain_updates"]
        s.rejects += d["rejects"]
        s.head = d["head"] or s.head
        s.pending_reorgs = d["pending_reorgs"]
    return s


def build_query(spark: SparkSession, opts: CardinalBlocksOptions) -> StreamingQuery:
    """Start the streaming query (options already validated)."""
    from loglake.log import fs

    out = Path(opts.out_dir)
    fs.makedirs_durable(out)
    job = out / JOB_FILE
    if not job.exists():
        fs.replace_file_atomic(job, json.dumps(opts.identity(), indent=1).encode())
    from loglake.pipeline.jobs.cardinal_blocks_source import FORMAT, RangesDataSource

    spark.dataSource.register(RangesDataSource)
    frames = []
    for i, t in enumerate(opts.topics):
        r = spark.readStream.format(FORMAT).option("data_dir", opts.data_dir).option("stream", t)
        if opts.max_records_per_trigger:
            r = r.option("maxRecordsPerTrigger", str(opts.max_records_per_trigger))
        # a micro-batch's index ranges, topic by topic: ``BatchWriter`` reads their records
        frames.append(r.load().selectExpr(f"CAST({i} AS INT) AS t", "partition", "start", "end"))
    records = frames[0]
    for f in frames[1:]:
        records = records.unionByName(f)
    writer = (
        records.writeStream.foreachBatch(BatchWriter(opts))
        .option("checkpointLocation", opts.checkpoint_dir)
        .queryName(f"cardinal-blocks-{os.getpid()}")
    )
    if opts.follow_seconds is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(opts.follow_seconds * 1000)} milliseconds")
    return writer.start()


@raises_task_errors
def run(
    spark: SparkSession, opts: CardinalBlocksOptions, timeout: float | None = None
) -> JobSummary:
    """Validate, run to the end (``availableNow``) or until ``timeout``/interrupted (``follow``),
    and summarise every micro-batch written so far."""
    from loglake.pipeline.output_dir import output_lock

    opts = opts.validate()
    # one job per --out: found from outside, a second run on the same --out failed with ~100
    # lines of Spark's SparkConcurrentModificationException (two queries on one checkpoint)
    with output_lock(opts.out_dir):
        q = build_query(spark, opts)
        try:
            if timeout is None:
                q.awaitTermination()
            else:
                q.awaitTermination(max(1, math.ceil(timeout)))  # whole seconds
        finally:
            if q.isActive:
                q.stop()
    exc = q.exception()
    if exc is not None:
        from loglake.pipeline.errors import JobFailed

        raise JobFailed(f"cardinal-blocks failed: {exc}")
    return summarize(opts.out_dir)
