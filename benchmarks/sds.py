"""SDS per-message cost: loglake.sds beside @waku/sds 0.0.8, driven the same way in one run.

Two participants of one channel take turns: one sends a content message, the other receives and
delivers it (``send + receive + deliver``), so both logs grow by one message per step and acks
flow through causal histories. Reported: wall time and process CPU time (the machine is shared;
CPU time is what the loop itself used), as the mean cost per message over the 1,000 messages
ending at 1k, 10k and 100k messages in the log (default options: causal history 200, bloom
filter 10,000 / 0.001, SDS-R on — the @waku/sds defaults). @waku/sds runs the same loop inside
Node (interop/node/diff_peer.mjs ``sds_pingpong``), capped in count and time because its cost grows
with the log.

    .venv/bin/python benchmarks/sds.py [--max 100000] [--js-max 4000] [--js-seconds 60]

``--audit``: ``loglake job sds-audit`` on ``local[*]`` over a generated channel of
``--audit-messages`` content messages (default 1,000,000) from ``--audit-participants`` senders
taking turns, each with a ``--history``-entry causal history (200) built by ``sds.codec`` like a
participant's; ``--audit-bloom`` adds the 18,752-byte bloom filter to every message (37 KB a
message then: 1M messages are ~37 GB). Reports generation, then the audit's wall time and
messages/s (Spark start excluded), against the 100,000 messages/s target. ``--audit-repeat N``
runs the tables-only audit N times in one session: the first run pays the cold start (JIT,
Python workers, the live tail's planner; most of a 20k run), the later ones show the
per-message cost.

    .venv/bin/python benchmarks/sds.py --audit [--audit-messages 1000000] [--audit-bloom]
        [--audit-dir DIR [--audit-reuse]] [--audit-no-report] [--audit-repeat N] [--audit-floor]

``--audit-floor``: after the audit (Spark stopped), the I/O it cannot skip on this machine,
timed alone on both cores (``io_floor``): the bound under any audit here, and the floor's share
of the first tables-only run (issue 35's target: at least 50%).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.differential.peer

from proctree import tree_cpu, tree_faults, tree_user_sys

from loglake.sds.participant import Participant, ParticipantOptions
from tests.differential.peer import NodePeer, available

MARKS = (1_000, 10_000, 100_000)
WINDOW = 1_000


def run_python(max_messages: int, history: int) -> dict[int, float]:
    clock_ms = [1_700_000_000_000]
    opts = ParticipantOptions(causal_history_size=history)
    a = Participant("bench", "py-a", lambda: clock_ms[0], opts)
    b = Participant("bench", "py-b", lambda: clock_ms[0], opts)
    pairs = ((a, b), (b, a))
    stamps: dict[int, tuple[float, float]] = {}
    t, c = time.perf_counter(), time.process_time()
    for i in range(max_messages):
        s, d = pairs[i % 2]
        out = s.send(b"m%d" % i)
        d.receive(out.to_send[0].data)
        done = i + 1
        if done % WINDOW == 0:
            stamps[done] = (time.perf_counter() - t, time.process_time() - c)
    assert len(a.log) == len(b.log) == max_messages
    out: dict[int, tuple[float, float]] = {}
    for m in MARKS:
        if m in stamps:
            w0, c0 = stamps.get(m - WINDOW, (0.0, 0.0))
            out[m] = ((stamps[m][0] - w0) / WINDOW * 1e3, (stamps[m][1] - c0) / WINDOW * 1e3)
    return out


def run_js(max_messages: int, seconds: float) -> tuple[dict[int, tuple[float, float]], int]:
    marks = list(range(500, max_messages + 1, 500))
    with NodePeer() as js:
        r = js.request(
            "sds_pingpong", channel="bench", count=max_messages, marks=marks, max_ms=seconds * 1e3
        )
    stamps = {int(n): (ms, cpu) for n, ms, cpu in r["marks"]}
    windows = {}
    for n in sorted(stamps):
        prev = max((m for m in stamps if m < n), default=0)
        w0, c0 = stamps.get(prev, (0.0, 0.0))
        windows[n] = ((stamps[n][0] - w0) / (n - prev), (stamps[n][1] - c0) / (n - prev))
    return windows, r["done"]


def make_channel(
    data_dir: str, messages: int, participants: int, history: int, bloom: bool
) -> tuple[int, float]:
    """A lossless channel: senders take turns; each message's causal history is the newest
    ``history`` messages (encoded once each, as a participant caches them). (bytes, seconds)"""
    from collections import deque

    from loglake.log import Entry, StreamConfig, open_log
    from loglake.sds.bloom import BloomFilter
    from loglake.sds.channel import encode_hint
    from loglake.sds.codec import encode_fast, encode_history_entry
    from loglake.sds.messages import HistoryEntry, message_id_of

    t0 = time.perf_counter()
    stream = "sds.bench"
    window: deque[bytes] = deque(maxlen=history)
    filters = [BloomFilter() for _ in range(participants)] if bloom else []
    total = 0
    ts0 = 1_700_000_000_000
    with open_log(data_dir) as log:
        log.create_stream(stream, StreamConfig(durability="none"))
        batch: list[Entry] = []
        for k in range(messages):
            who = k % participants
            sender = f"p{who:03d}"
            content = b"message %d from %s" % (k, sender.encode())
            mid = message_id_of(content)
            bf = None
            if bloom:
                f = filters[who]
                bf = f.to_bytes()
            data = encode_fast(sender, mid, "bench", ts0 + k, b"".join(window), bf, b"", content)
            if bloom:
                pos = filters[0].positions(mid)
                for f in filters:
                    f.insert(mid, pos)
            window.append(
                encode_history_entry(HistoryEntry(mid, encode_hint(stream, 0, k), sender))
            )
            batch.append(Entry(data, timestamp_ns=(ts0 + k) * 1_000_000))
            total += len(data)
            if len(batch) == 1000:
                log.append_many(stream, batch)
                batch = []
        if batch:
            log.append_many(stream, batch)
    return total, time.perf_counter() - t0


def io_floor(data: Path, out: Path, n: int) -> float:
    """Prints the seconds of the input and output the audit cannot skip, on both cores with
    nothing else running: read the lake's records (pyarrow: Parquet + zstd, two threads,
    nothing done with them; the live tail is left out) and write the ``messages`` and ``acks``
    tables the audit wrote (read first, untimed; written zstd, two files at a time). The lake
    is read as the audit's decode reads it, in record batches of ``DECODE_PIECE`` records. Issue
    12's 100,000 messages/s is a budget of 10 s for 1,000,000 messages: this floor says how
    much of it the machine's I/O takes before any decoding, sweeping or Spark."""
    import glob
    import shutil
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    from loglake.pipeline.jobs.sds_audit import DECODE_PIECE

    def read(f: str) -> int:
        # record batches of the decode's piece size, as the audit reads the lake: a whole
        # file at once (``read_table``) took twice as long here (4.6-5.1 s against 2.2-2.6 s
        # at 1 M), which made this part of the floor slower than the job's own read
        cols = ["index", "timestamp_ns", "data"]
        pieces = pq.ParquetFile(f).iter_batches(DECODE_PIECE, columns=cols, use_threads=False)
        return sum(b.num_rows for b in pieces)

    def rewrite(job: tuple[pa.Table, str]) -> None:
        pq.write_table(job[0], job[1], compression="zstd")

    lake = sorted(glob.glob(f"{data}/lake/*/partition=*/*.parquet"))
    secs: dict[str, float] = {}
    cpu0 = time.process_time()  # the untimed reads included: an upper bound
    with ThreadPoolExecutor(2) as pool:
        t0 = time.perf_counter()
        records = sum(pool.map(read, lake))
        secs["read"] = time.perf_counter() - t0
        for table in ("messages", "acks"):
            files = sorted(glob.glob(f"{out}/{table}/*.parquet"))
            scratch = tempfile.mkdtemp(prefix=f"sds-floor-{table}-", dir=out)
            secs[table] = 0.0
            for i in range(0, len(files), 2):  # two in memory at a time, read untimed
                jobs = [
                    (pq.read_table(f, use_threads=False), f"{scratch}/{k}.parquet")
                    for k, f in enumerate(files[i : i + 2], i)
                ]
                t0 = time.perf_counter()
                list(pool.map(rewrite, jobs))
                secs[table] += time.perf_counter() - t0
                del jobs
            shutil.rmtree(scratch)
    floor = secs["read"] + secs["messages"] + secs["acks"]
    print(
        f"  I/O floor (both cores, nothing else): read {records:,} lake records "
        f"{secs['read']:.1f} s + write messages {secs['messages']:.1f} s + acks "
        f"{secs['acks']:.1f} s = {floor:.1f} s, i.e. at most {n / floor:,.0f} messages/s "
        f"before any decoding ({time.process_time() - cpu0:.1f} CPU-s with the untimed reads, "
        f"{load()})"
    )
    if records < 0.9 * n:
        print("  (most of this channel is still in the live tail, which the floor leaves out)")
    return floor


def load() -> str:
    import os

    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f}"


def run_audit(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from loglake.pipeline.jobs.sds_audit import SdsAuditOptions, run, session_conf
    from loglake.pipeline.session import build_session

    work = Path(args.audit_dir or tempfile.mkdtemp(prefix="sds-audit-bench-"))
    data, out = work / "data", work / "out"
    n, p = args.audit_messages, args.audit_participants
    print(
        f"sds-audit: {n:,} messages, {p} participants, causal history {args.history}, "
        f"bloom filter {'in every message' if args.audit_bloom else 'none'}"
    )
    if args.audit_reuse and data.is_dir():
        print(f"  reusing the channel in {data} (generated earlier with these options)")
    else:
        shutil.rmtree(work, ignore_errors=True)
        size, gen_s = make_channel(str(data), n, p, args.history, args.audit_bloom)
        print(f"  generated {size / 1e6:,.0f} MB in {gen_s:.1f} s")
    # the session the CLI's sds-audit starts (C1-only JVMs, session.C1_ONLY; SESSION_CONF)
    spark = build_session(
        master="local[*]",
        app_name="loglake-sds-audit",
        conf=session_conf(),
        c1_only=True,
        data_source=False,
    )
    stage_cpu = _stage_cpu()
    try:
        runs = [False] * args.audit_repeat + ([] if args.audit_no_report else [True])
        tables_s: list[float] = []  # each tables-only run's wall time, for the floor's ratio
        for k, report in enumerate(runs):
            opts = SdsAuditOptions(
                str(data), "sds.bench", str(out), report=report, overwrite=True
            ).validate()
            stage_cpu.clear()
            t0, c0 = time.perf_counter(), tree_cpu()
            stage_cpu.append(("", *tree_user_sys(), tree_faults()))
            summary = run(spark, opts)
            secs, cpu = time.perf_counter() - t0, tree_cpu() - c0
            if not report:
                tables_s.append(secs)
            rate = summary.records / secs
            verdict = "meets" if rate >= 100_000 else "below"
            print(
                f"  audit ({'tables + report' if report else 'tables'}"
                f"{', same session again' if k and not report else ''}): {secs:.1f} s, "
                f"{rate:,.0f} messages/s ({verdict} the 100,000/s target); "
                f"{summary.acks:,} acks, {summary.rejects} rejects; {cpu:.1f} CPU-s "
                f"(driver, JVM and Python workers), {load()}"
            )
            stages = ", ".join(f"{k} {v:.1f}" for k, v in summary.stage_seconds.items())
            print(f"    seconds per stage: {stages}")
            cpu_by = [
                f"{b[0]} {b[1] - a[1]:.1f} + {b[2] - a[2]:.1f}"
                for a, b in itertools.pairwise(stage_cpu)
                if b[1] - a[1] + b[2] - a[2] >= 0.05
            ]
            print(f"    CPU-s per stage (tree, user + system): {', '.join(cpu_by)}")
            faults_by = [
                f"{b[0]} {(b[3] - a[3]) / 1e6:.2f}" for a, b in itertools.pairwise(stage_cpu)
            ]
            print(f"    minor page faults per stage (tree, millions): {', '.join(faults_by)}")
        if args.audit_floor:
            spark.stop()  # the floor runs with nothing else
            floor = io_floor(data, out, n)
            if tables_s:  # the first run: what a ``loglake job sds-audit`` invocation takes
                print(
                    f"  floor / audit (tables, first run) = {floor / tables_s[0]:.0%} "
                    f"(target ≥ 50%: the audit in ≤ {2 * floor:.1f} s; it took {tables_s[0]:.1f} s)"
                )
    finally:
        spark.stop()
        if not args.audit_dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _stage_cpu() -> list[tuple[str, float, float, int]]:
    """The process tree's (stage, user, system) CPU seconds and minor page faults at each of
    the audit's stage laps (``AuditSummary.lap``, wrapped for this process): where the CPU
    goes, stage by stage, and how much of it is the kernel's (page faults, page-cache writes)
    rather than the job's; the fault counts, unlike the times, do not grow with the load."""
    from loglake.pipeline.jobs.sds_audit import AuditSummary

    marks: list[tuple[str, float, float, int]] = []
    lap = AuditSummary.lap

    def timed(self: AuditSummary, stage: str, since: float) -> float:
        now = lap(self, stage, since)
        marks.append((stage, *tree_user_sys(), tree_faults()))
        return now

    AuditSummary.lap = timed  # type: ignore[method-assign]
    return marks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=100_000, help="messages for loglake.sds")
    ap.add_argument("--history", type=int, default=200, help="causal history size")
    ap.add_argument("--js-max", type=int, default=4_000, help="message cap for @waku/sds")
    ap.add_argument("--js-seconds", type=float, default=60.0, help="time cap for @waku/sds")
    ap.add_argument("--audit", action="store_true", help="benchmark loglake job sds-audit")
    ap.add_argument("--audit-messages", type=int, default=1_000_000)
    ap.add_argument("--audit-participants", type=int, default=20)
    ap.add_argument("--audit-bloom", action="store_true", help="a bloom filter in every message")
    ap.add_argument("--audit-dir", default=None, help="work folder (default: a temp folder)")
    ap.add_argument(
        "--audit-reuse", action="store_true", help="audit the channel already in --audit-dir"
    )
    ap.add_argument("--audit-no-report", action="store_true", help="the tables-only run alone")
    ap.add_argument(
        "--audit-floor",
        action="store_true",
        help="then time the reads and writes the audit cannot skip (Spark stopped)",
    )
    ap.add_argument(
        "--audit-repeat",
        type=int,
        default=1,
        help="tables-only runs in the same session (after the first: JVM and workers warm)",
    )
    args = ap.parse_args()
    if args.audit_repeat < 1:
        ap.error("--audit-repeat: must be >= 1")
    if args.audit:
        return run_audit(args)

    print(f"loglake.sds: {args.max} messages, causal history {args.history}")
    py = run_python(args.max, args.history)
    for m, (ms, cpu) in py.items():
        verdict = "ok" if cpu <= 0.1 else "over the 0.1 ms target"
        print(
            f"  at {m:>7,} messages: {ms:.4f} ms/msg wall, {cpu:.4f} ms/msg CPU "
            f"(send+receive+deliver) {verdict}"
        )
    if args.history != 2:
        py2 = run_python(min(args.max, 10_000), 2)
        for m, (ms, cpu) in py2.items():
            print(f"  (causal history 2) at {m:>7,} messages: {ms:.4f} wall, {cpu:.4f} CPU ms/msg")
    if not available():
        print("@waku/sds: not installed (make node-deps); skipped")
        return 0
    print(f"@waku/sds 0.0.8 (same loop in Node, cap {args.js_max} msgs / {args.js_seconds:.0f} s)")
    js, done = run_js(args.js_max, args.js_seconds)
    for n, (ms, cpu) in js.items():
        if n in (500, 1_000, 2_000) or n % 1_000 == 0 or n == max(js):
            print(f"  messages {n:>6,}: {ms:.3f} ms/msg wall, {cpu:.3f} CPU (mean of last 500)")
    print(f"  reached {done} messages before the cap")
    return 0


if __name__ == "__main__":
    sys.exit(main())
