"""Benchmark of the embedded log (issue 3 §2): in-process append of 1 KB records with ``batch``
durability against the physical limit measured in the same run — a plain file, the same bytes
per batch, one ``write`` + one ``fdatasync`` per batch (loglake's group commit uses
``fdatasync`` too). Target: loglake ≥ 50% of the limit. The two run interleaved, 10 batches
of one then 10 of the other, each side timed on its own, because the disk is shared with
whatever else runs on the machine; the ratio per round is the figure to read.

Also: single-record appends from 1 and from 8 threads (group commit shares fsyncs between
threads), ``always`` durability, and sequential reads.

    .venv/bin/python benchmarks/log.py [--records 100000] [--batch 100] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from loglake.log import Entry, SegmentLog, StreamConfig

RECORD = 1024


def raw_limit(path: Path, records: int, batch: int) -> float:
    """msgs/s of write + fdatasync per batch of ``batch`` pre-built 1 KB records."""
    buf = os.urandom(RECORD) * batch
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    t0 = time.perf_counter()
    for _ in range(records // batch):
        os.write(fd, buf)
        os.fdatasync(fd)
    dt = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return (records // batch) * batch / dt


def timed_threads(run, threads: int) -> float:
    """Seconds for ``threads`` threads each running ``run`` to all finish."""
    ts = [threading.Thread(target=run) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def loglake_batches(
    d: Path, records: int, batch: int, durability: str, threads: int = 1, seal: bool = True
):
    log = SegmentLog(d)
    cfg = StreamConfig(durability=durability, seal_to_lake=seal)  # type: ignore[arg-type]
    log.create_stream("b", cfg)
    data = os.urandom(RECORD)
    entries = [Entry(data) for _ in range(batch)]
    per_thread = records // batch // threads

    def run() -> None:
        for _ in range(per_thread):
            log.append_many("b", entries)

    dt = timed_threads(run, threads)
    n = per_thread * threads * batch
    fsyncs = log.fsync_count("b")
    log.close()
    return n / dt, fsyncs, log


def loglake_singles(d: Path, records: int, threads: int, durability: str = "batch"):
    log = SegmentLog(d)
    log.create_stream("b", StreamConfig(durability=durability))  # type: ignore[arg-type]
    data = os.urandom(RECORD)
    per = records // threads
    lat: list[float] = []

    def run() -> None:
        mine = []
        for _ in range(per):
            t = time.perf_counter()
            log.append("b", data)
            mine.append(time.perf_counter() - t)
        lat.extend(mine)

    dt = timed_threads(run, threads)
    fsyncs = log.fsync_count("b")
    log.close()
    lat.sort()
    p50, p99 = lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
    return per * threads / dt, fsyncs, p50, p99


def interleaved(
    root: Path, records: int, batch: int, seal: bool, chunk: int = 10
) -> tuple[float, float, int, float]:
    """Plain file and loglake side by side: alternate ``chunk`` batches of each, timing each
    side separately, so both see the same disk weather (the machine is shared). loglake is
    timed twice, on two logs: ``append_many`` of prebuilt ``Entry`` objects, and
    ``append_payloads`` of the raw ``bytes`` (the stream service's path). Returns
    (plain-file msgs/s, append_many msgs/s, append_many fsyncs, append_payloads msgs/s)."""
    raw_path = root / f"raw-{seal}.bin"
    fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    log = SegmentLog(root / f"inter-{seal}")
    log.create_stream("b", StreamConfig(durability="batch", seal_to_lake=seal))
    plog = SegmentLog(root / f"inter-payloads-{seal}")
    plog.create_stream("b", StreamConfig(durability="batch", seal_to_lake=seal))
    data = os.urandom(RECORD)
    raw_buf = data * batch
    entries = [Entry(data) for _ in range(batch)]
    datas = [data] * batch
    t_raw = t_ll = t_pl = 0.0
    n = records // batch
    for k in range(0, n, chunk):
        todo = min(chunk, n - k)
        t = time.perf_counter()
        for _ in range(todo):
            os.write(fd, raw_buf)
            os.fdatasync(fd)
        t_raw += time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(todo):
            log.append_many("b", entries)
        t_ll += time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(todo):
            plog.append_payloads("b", datas)
        t_pl += time.perf_counter() - t
    fsyncs = log.fsync_count("b")
    log.close()
    plog.close()
    os.close(fd)
    os.unlink(raw_path)
    return n * batch / t_raw, n * batch / t_ll, fsyncs, n * batch / t_pl


def read_all(d: Path, payloads: bool = False) -> float:
    """Sequential reads by a read-only reader, 1,000 at a time: ``read`` (``Record`` objects)
    or ``read_payloads`` (``(index, data)``, the stream service's pull)."""
    log = SegmentLog(d, readonly=True)
    t0 = time.perf_counter()
    n = 0
    pos = 0
    while True:
        if payloads:
            got_pairs = log.read_payloads("b", pos, limit=1000)
            if not got_pairs:
                break
            n += len(got_pairs)
            pos = got_pairs[-1][0] + 1
            continue
        got = log.read("b", pos, limit=1000)
        if not got:
            break
        n += len(got)
        pos = got[-1].index + 1
    dt = time.perf_counter() - t0
    log.close()
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--singles", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the main comparison")
    ap.add_argument("--dir", type=Path, default=None, help="folder on the disk to measure")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="loglake-bench-", dir=args.dir))
    console = Console(width=150)
    rows: list[tuple[str, float, str]] = []
    try:
        limits: list[float] = []
        ratios: list[float] = []
        pratios: list[float] = []
        for r in range(args.rounds):
            limit, ll, fs, pl = interleaved(root, args.records, args.batch, seal=True)
            limits.append(limit)
            ratios.append(ll / limit)
            pratios.append(pl / limit)
            rows.append(
                (f"round {r + 1}: plain file, write + fdatasync per {args.batch}", limit, "")
            )
            rows.append(
                (
                    f"round {r + 1}: loglake append_many({args.batch}), batch durability",
                    ll,
                    f"{fs} fsyncs; {ll / limit:.0%} of the plain file",
                )
            )
            rows.append(
                (
                    f"round {r + 1}: loglake append_payloads({args.batch}), batch durability",
                    pl,
                    f"{pl / limit:.0%} of the plain file",
                )
            )
            shutil.rmtree(root / "inter-True")
            shutil.rmtree(root / "inter-payloads-True")
        limit = statistics.median(limits)
        raw_ns, ll_ns, _, pl_ns = interleaved(root, args.records, args.batch, seal=False)
        rows.append(
            (
                "  append_many, seal_to_lake=False (one round)",
                ll_ns,
                f"{ll_ns / raw_ns:.0%} of its plain file ({raw_ns:,.0f}/s)",
            )
        )
        rows.append(
            (
                "  append_payloads, seal_to_lake=False (same round)",
                pl_ns,
                f"{pl_ns / raw_ns:.0%} of its plain file",
            )
        )
        loglake_batches(root / "ll-read", args.records, args.batch, "batch")
        rd = read_all(root / "ll-read")
        rdp = read_all(root / "ll-read", payloads=True)
        rate4, fs4, _ = loglake_batches(root / "ll4t", args.records, args.batch, "batch", 4)
        rows.append(
            (f"loglake append_many({args.batch}) × 4 threads, batch", rate4, f"{fs4} fsyncs")
        )
        for threads in (1, 8):
            rate, fsyncs, p50, p99 = loglake_singles(root / f"s{threads}", args.singles, threads)
            rows.append(
                (
                    f"loglake append(1) × {threads} threads, batch",
                    rate,
                    f"{fsyncs} fsyncs, p50 {p50:.0f} µs, p99 {p99:.0f} µs",
                )
            )
        rate, _, p50, p99 = loglake_singles(root / "always", args.singles, 1, "always")
        rows.append(("loglake append(1), always", rate, f"p50 {p50:.0f} µs, p99 {p99:.0f} µs"))
        rows.append(("loglake read(limit=1000), sequential", rd, "readonly reader"))
        rows.append(("loglake read_payloads(limit=1000), sequential", rdp, "readonly reader"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = Table(title=f"loglake.log, {RECORD} B records, {args.records} per batch row")
    table.add_column("what")
    table.add_column("msgs/s", justify="right")
    table.add_column("MB/s", justify="right")
    table.add_column("vs median plain", justify="right")
    table.add_column("notes")
    for what, rate, note in rows:
        table.add_row(
            what, f"{rate:,.0f}", f"{rate * RECORD / 1e6:,.0f}", f"{rate / limit:.0%}", note
        )
    console.print(table)
    ratio = statistics.median(ratios)
    verdict = "[green]meets[/]" if ratio >= 0.5 else "[red]misses[/]"
    console.print(
        "loglake append_many / plain file (same batches, interleaved), per round: "
        + ", ".join(f"{x:.0%}" for x in ratios)
        + f"; median {ratio:.0%} ({verdict} the ≥ 50% target)"
    )
    pratio = statistics.median(pratios)
    pverdict = "[green]meets[/]" if pratio >= 0.5 else "[red]misses[/]"
    console.print(
        "loglake append_payloads / plain file, per round: "
        + ", ".join(f"{x:.0%}" for x in pratios)
        + f"; median {pratio:.0%} ({pverdict} the ≥ 50% target)"
    )


if __name__ == "__main__":
    main()
