"""Benchmark of community history archives (issue 8, "Benchmark").

1. Build: one 7-day window of N messages (default 1,000,000, ≈300-byte payloads) through the
   sans-I/O ``ArchiveBuilder`` (framing, padding, keccak-256 index, SHA-1 of every piece,
   torrent info dict): messages/s and MB/s, beside this machine's SHA-1 and keccak-256 rates
   over the same archive bytes (the hashing limit). Target: build ≥ 50% of the limit.
2. Fetch: the same torrent seeded by our libtorrent seeder on loopback, downloaded by our
   fetcher (libtorrent, all pieces), by aria2c (through a local tracker) and by transmission-cli
   (our seeder dials it): MB/s each, same run, same bytes.

    .venv/bin/python benchmarks/archives.py [--messages 1000000] [--layout spec] [--no-fetch]

3. ``--job`` (issue 11): a 52-week catch-up of ``--messages`` (10,000,000 by default in this
   mode) 300-byte messages from a loglake stream, ``ControlNode`` end to end (ingest the stream
   into its SQLite store, then build) vs ``loglake job archives-build`` on ``local[*]``, same run,
   same bytes (info hashes compared), beside the SHA-1 per-piece rate of the same ``data``;
   then ``--communities`` × ``--per-community`` (100 × 100,000) in one job vs one
   ``ControlNode`` build per community. Targets: job ≥ 4× the control node, ≥ 50% of SHA-1.
   Also timed: the job's ``data`` written once more and fdatasync'd, twice: a kernel copy
   (through the page cache) and past the page cache (``O_DIRECT``, as the job writes); the
   faster of the two is the write floor, the least any build writes on this disk (on this
   project's VM the buffered copy is often the slower), beside the SHA-1 budget.

    .venv/bin/python benchmarks/archives.py --job [--messages 10000000] [--weeks 52]
        [--communities 100 --per-community 100000] [--no-many] [--no-catchup]

4. ``--decode``: the job's record decoder (``decode_waku_batch``, numpy over an Arrow column)
   vs ``layout.decode_record`` over ``to_pylist()``, on batches of ``--batch`` (Spark's 10,000)
   records of ``--payload`` bytes, best of 7, both layouts; results compared.

    .venv/bin/python benchmarks/archives.py --decode [--batch 10000]

Bounded: every client gets a time limit; temporary files are removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from Crypto.Hash import keccak
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.archives.tracker

from proctree import tree_cpu

from loglake.archives.builder import WINDOW_NS, ArchiveBuilder
from loglake.archives.layout import NS, PIECE_LENGTH, DecodedMessage, get_layout
from loglake.streams.api import LocalStreams
from tests.archives.helpers import run_transmission
from tests.procs import free_port

console = Console()
START = 1577836800 * NS


def make_messages(layout, n: int, size: int) -> list[DecodedMessage]:
    blob = os.urandom(size * 1024)
    step = WINDOW_NS // n
    topic = bytes.fromhex("d7a5d2c3") if layout.name == "status-go" else "/status/1/c/proto"
    out = []
    for i in range(n):
        off = (i * 7919) % (len(blob) - size)
        ts = START + i * step
        extra = {"sig": blob[:65]} if layout.name == "status-go" else {}
        raw = layout.make_record(
            payload=blob[off : off + size], topic=topic, timestamp_ns=ts, **extra
        )
        out.append(DecodedMessage(ts, topic, raw, size + (65 if extra else 0)))
    return out


def best_of(fn, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_build(layout, msgs) -> tuple[dict, ArchiveBuilder]:
    """Messages are in time order, as the store returns them: ``presorted=True`` like the
    control node."""
    builders = []

    def run():
        b = ArchiveBuilder(layout, "0x02" + "ab" * 32)
        r = b.build([(START, START + WINDOW_NS)], msgs, presorted=True)
        builders[:] = [(b, r)]  # keep one result: three 335 MB copies would skew the runs

    t = best_of(run, 3)
    b, r = builders[-1]
    data = b"".join(a.data_bytes() for a in r.archives)
    mb = len(data) / 1e6
    mv = memoryview(data)

    def sha1_pieces():
        for i in range(0, len(data), PIECE_LENGTH):
            hashlib.sha1(mv[i : i + PIECE_LENGTH]).digest()

    t_sha1 = best_of(lambda: hashlib.sha1(data).digest())
    t_sha1p = best_of(sha1_pieces)
    t_kec = best_of(lambda: keccak.new(data=data, digest_bits=256).digest())
    return {
        "messages": len(msgs),
        "archives": len(r.archives),
        "bytes": len(data),
        "build_s": t,
        "build_msgs_s": len(msgs) / t,
        "build_MB_s": mb / t,
        "sha1_MB_s": mb / t_sha1,
        "sha1_pieces_MB_s": mb / t_sha1p,
        "keccak_MB_s": mb / t_kec,
    }, b


def bench_control(layout, msgs) -> dict:
    """The control node's whole build: SQLite store → builder → ``data``/``index``/torrent files
    (fsync'd). Ingest into the store is timed separately."""
    from coincurve import PrivateKey

    from loglake.archives.control import ControlNode
    from loglake.archives.store import MessageStore

    tmp = Path(tempfile.mkdtemp(prefix="loglake-bench-control-"))
    try:
        store = MessageStore(tmp / "store.sqlite")
        t0 = time.perf_counter()
        store.add(msgs)
        t_ingest = time.perf_counter() - t0
        node = ControlNode(tmp / "root", PrivateKey(), layout, store)
        t0 = time.perf_counter()
        out = node.build(START + WINDOW_NS)
        t_build = time.perf_counter() - t0
        size = node.builder.data_size
        store.close()
        return {
            "ingest_msgs_s": len(msgs) / t_ingest,
            "build_s": t_build,
            "build_MB_s": size / 1e6 / t_build,
            "build_msgs_s": len(msgs) / t_build,
            "archives": len(out.new),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_fetch(layout, msgs, budget: float) -> list[tuple[str, float | None, str]]:
    from loglake.archives.bt import Fetcher, Seeder
    from tests.archives.tracker import Tracker

    tmp = Path(tempfile.mkdtemp(prefix="loglake-bench-archives-"))
    tracker = Tracker()
    seeder = Seeder()
    results = []
    try:
        b = ArchiveBuilder(layout, "0x02" + "cd" * 32, announce=(tracker.url,))
        r = b.build([(START, START + WINDOW_NS)], msgs)
        folder = tmp / "seed" / b.name
        folder.mkdir(parents=True)
        with open(folder / "data", "wb") as f:
            for a in r.archives:
                f.write(a.data_bytes())
        (folder / "index").write_bytes(r.index)
        meta = r.torrent.metainfo()
        (tmp / "a.torrent").write_bytes(meta)
        seeder.seed(meta, tmp / "seed", timeout=120)
        size = (folder / "data").stat().st_size + len(r.index)
        mb = size / 1e6
        magnet = r.torrent.magnet(b.name, (seeder.peer,))

        # ours: libtorrent fetcher, all pieces
        t0 = time.perf_counter()
        f = Fetcher(tmp / "ours")
        try:
            f.metadata(magnet, timeout=20)
            f.start()
            f.download(range(f.info.num_pieces()), timeout=budget)
            dt = time.perf_counter() - t0
            ok = (tmp / "ours" / b.name / "data").read_bytes() == (folder / "data").read_bytes()
            results.append(("loglake (libtorrent 2.1)", mb / dt, "identical" if ok else "DIFFER"))
        finally:
            f.close()

        if shutil.which("aria2c"):
            out = tmp / "aria2"
            t0 = time.perf_counter()
            p = subprocess.run(
                [
                    "aria2c", "--enable-dht=false", "--enable-dht6=false",
                    "--bt-enable-lpd=false", "--enable-peer-exchange=false", "--seed-time=0",
                    f"--dir={out}", f"--listen-port={free_port()}", "--quiet=true",
                    "--file-allocation=none", "--bt-stop-timeout=60", str(tmp / "a.torrent"),
                ],
                capture_output=True, timeout=budget, check=False,
            )  # fmt: skip
            dt = time.perf_counter() - t0
            same = (
                p.returncode == 0
                and (out / b.name / "data").read_bytes() == (folder / "data").read_bytes()
            )
            results.append(("aria2c 1.36", mb / dt, "identical" if same else f"rc={p.returncode}"))
        if shutil.which("transmission-cli"):
            results.append(transmission(tmp, meta, seeder, folder, b.name, mb, budget))
    finally:
        seeder.close()
        tracker.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def transmission(tmp, meta, seeder, folder, name, mb, budget):
    got = run_transmission(meta, tmp, seeder, budget)
    if got is None:
        return ("transmission-cli 3.00", None, "did not finish")
    out, dt = got
    same = (out / name / "data").read_bytes() == (folder / "data").read_bytes()
    return ("transmission-cli 3.00", mb / dt, "identical" if same else "DIFFER")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--payload", type=int, default=300)
    ap.add_argument("--layout", choices=["spec", "status-go"], default="spec")
    ap.add_argument("--no-fetch", action="store_true")
    ap.add_argument(
        "--no-control", action="store_true", help="skip the control-node build (also in --job)"
    )
    ap.add_argument("--budget", type=float, default=180.0, help="seconds per fetch client")
    ap.add_argument("--job", action="store_true", help="job archives-build vs ControlNode")
    ap.add_argument("--weeks", type=int, default=52, help="--job: weeks of the catch-up")
    ap.add_argument("--communities", type=int, default=100, help="--job: communities")
    ap.add_argument("--per-community", type=int, default=100_000, help="--job: messages each")
    ap.add_argument("--no-many", action="store_true", help="--job: skip the many-communities run")
    ap.add_argument("--no-catchup", action="store_true", help="--job: skip the catch-up run")
    ap.add_argument("--tmp", default=None, help="--job: folder for the streams and outputs")
    ap.add_argument(
        "--data",
        default=None,
        help="--job: the catch-up stream's data dir, written if absent and kept (so runs of "
        "two source trees, alternated, read the same lake)",
    )
    ap.add_argument("--runs", type=int, default=1, help="--job: job + write floor pairs")
    ap.add_argument(
        "--scratch",
        choices=["auto", "memory", "disk"],
        default="auto",
        help="--job: where the scan's spills go (the command's --scratch)",
    )
    ap.add_argument("--decode", action="store_true", help="the job's decoder vs decode_record")
    ap.add_argument("--batch", type=int, default=10_000, help="--decode: records per batch")
    args = ap.parse_args()
    layout = get_layout(args.layout)
    if args.decode:
        bench_decode(args.batch, args.payload)
        return
    if args.job:
        main_job(args, layout)
        return
    console.print(f"generating {args.messages:,} messages ({args.payload} B payloads)…")
    msgs = make_messages(layout, args.messages, args.payload)
    res, _ = bench_build(layout, msgs)
    t = Table(title=f"archive build, one 7-day window, layout={args.layout} (best of 3)")
    for c in ("what", "MB/s", "msgs/s", "note"):
        t.add_column(c, justify="right" if c != "what" and c != "note" else "left")
    limit = min(res["sha1_MB_s"], res["keccak_MB_s"])
    t.add_row(
        "loglake build",
        f"{res['build_MB_s']:.0f}",
        f"{res['build_msgs_s']:,.0f}",
        f"{res['bytes'] / 1e6:.1f} MB, {res['archives']} archive(s), {res['build_s']:.2f} s",
    )
    t.add_row("SHA-1, one stream", f"{res['sha1_MB_s']:.0f}", "", "hashlib, same bytes")
    t.add_row(
        "SHA-1, per 100 KiB piece", f"{res['sha1_pieces_MB_s']:.0f}", "", "what a torrent needs"
    )
    t.add_row("keccak-256", f"{res['keccak_MB_s']:.0f}", "", "pycryptodome, same bytes")
    console.print(t)
    console.print(
        f"build / SHA-1 piece rate = {res['build_MB_s'] / res['sha1_pieces_MB_s']:.0%}; "
        f"build / keccak-256 rate = {res['build_MB_s'] / res['keccak_MB_s']:.0%}; "
        f"build / slower hash = {res['build_MB_s'] / limit:.0%} (target ≥ 50%)"
    )
    if not args.no_control:
        c = bench_control(layout, msgs)
        console.print(
            f"control node (SQLite store → files, fsync): build {c['build_s']:.2f} s = "
            f"{c['build_MB_s']:.0f} MB/s, {c['build_msgs_s']:,.0f} msgs/s; "
            f"store ingest {c['ingest_msgs_s']:,.0f} msgs/s"
        )
    if args.no_fetch:
        return
    rows = bench_fetch(layout, msgs, args.budget)
    ft = Table(title="fetch of the same torrent over loopback from our libtorrent seeder")
    for c in ("client", "MB/s", "files"):
        ft.add_column(c)
    for name, rate, note in rows:
        ft.add_row(name, "-" if rate is None else f"{rate:.0f}", note)
    console.print(ft)


def bench_decode(n: int, size: int) -> None:
    """``decode_waku_batch`` vs ``decode_record`` over ``to_pylist()`` (what the job did
    before), on one Arrow batch of ``n`` records, best of 7 each; the results must agree."""
    import pyarrow as pa

    from loglake.archives.columnar import decode_all, decode_waku_batch

    t = Table(title=f"record decoding, {n:,} records × {size} B per batch (best of 7)")
    for c in ("layout", "decode_record, ms", "decode_waku_batch, ms", "speed-up"):
        t.add_column(c, justify="left" if c == "layout" else "right")
    for name in ("spec", "status-go"):
        layout = get_layout(name)
        col = pa.array([m[2] for m in make_messages(layout, n, size)], type=pa.binary())
        slow = best_of(lambda: decode_all(layout.decode_record, col.to_pylist()), 7)  # noqa: B023
        fast = best_of(lambda: decode_waku_batch(name, col), 7)  # noqa: B023
        ts, topics, cap, bads = decode_waku_batch(name, col)
        msgs, _ = decode_all(layout.decode_record, col.to_pylist())
        same = not bads and [
            (int(a), b, int(c)) for a, b, c in zip(ts, topics.to_pylist(), cap, strict=True)
        ] == [(m[0], m[1], m[3]) for m in msgs]
        if not same:
            raise SystemExit(f"{name}: decode_waku_batch differs from decode_record")
        t.add_row(name, f"{slow * 1e3:.1f}", f"{fast * 1e3:.1f}", f"{slow / fast:.1f}×")
    console.print(t)


# -- --job: loglake job archives-build vs ControlNode (issue 11) ---------------------------------


def write_community_stream(data_dir: Path, stream: str, layout, n: int, weeks: int, size: int):
    """``n`` messages of ``size``-byte payloads spread evenly over ``weeks`` weeks, appended to
    a loglake stream (one partition, default segments: most of it sealed to the lake)."""
    from loglake.log import Entry, StreamConfig, open_log

    blob = os.urandom(size * 1024)
    step = weeks * WINDOW_NS // n
    topic = bytes.fromhex("d7a5d2c3") if layout.name == "status-go" else "/status/1/c/proto"
    extra = {"sig": blob[:65]} if layout.name == "status-go" else {}
    with open_log(data_dir) as log:
        log.create_stream(stream, StreamConfig(partitions=1))
        for lo in range(0, n, 50_000):
            batch = []
            for i in range(lo, min(n, lo + 50_000)):
                off = (i * 7919) % (len(blob) - size)
                raw = layout.make_record(
                    payload=blob[off : off + size],
                    topic=topic,
                    timestamp_ns=START + i * step,
                    **extra,
                )
                batch.append(Entry(raw))
            log.append_many(stream, batch)


def control_end_to_end(data_dir: Path, root: Path, key, layout, stream: str, now: int) -> dict:
    """``ControlNode``: ingest the stream into its SQLite store, then build (fsync'd files)."""
    from loglake.archives.control import ControlNode
    from loglake.archives.signing import community_id
    from loglake.archives.store import MessageStore
    from loglake.log import open_log

    cid = community_id(key)
    root.mkdir(parents=True, exist_ok=True)
    store = MessageStore(root / f"{cid}.sqlite")
    node = ControlNode(root, key, layout, store)
    t0 = time.perf_counter()
    with open_log(data_dir, readonly=True) as log:
        n = node.ingest_streams(LocalStreams(log), stream)
    t1 = time.perf_counter()
    node.build(now)
    t2 = time.perf_counter()
    store.close()
    return {
        "messages": n,
        "ingest_s": t1 - t0,
        "build_s": t2 - t1,
        "total_s": t2 - t0,
        "bytes": node.builder.data_size,
        "torrent": (root / f"{cid}.torrent").read_bytes(),
    }


def sha1_piece_rate(path: Path, limit: int = 300 * 1024 * 1024) -> float:
    """SHA-1 per 100 KiB piece over (the first 300 MiB of) ``path``, in memory, best of 3."""
    with open(path, "rb") as f:
        data = f.read(limit)
    mv = memoryview(data)

    def run():
        for i in range(0, len(data), PIECE_LENGTH):
            hashlib.sha1(mv[i : i + PIECE_LENGTH]).digest()

    return len(data) / 1e6 / best_of(run)


def write_floor(path: Path) -> float:
    """Seconds to write ``path``'s bytes once more to a new file on the same disk and
    ``fdatasync`` it (a kernel copy: no Python buffer). Every build must write its ``data``
    at least once, durably, so this is a floor under the job on this machine's disk. The
    bytes are read into the page cache first, untimed: the job writes its archives past the
    page cache (``O_DIRECT``), and a floor that read them back from the disk would be a read
    and a write."""
    from loglake.pipeline.jobs.archives_build import _copy_range  # the job's own copy

    copy = path.with_name(path.name + ".floor")
    size = path.stat().st_size
    buf = bytearray(8 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    t0 = time.perf_counter()
    with open(path, "rb") as src, open(copy, "wb") as dst:
        _copy_range(src.fileno(), dst.fileno(), size)
        os.fdatasync(dst.fileno())
    secs = time.perf_counter() - t0
    copy.unlink()
    return secs


def write_floor_direct(path: Path) -> float | None:
    """Seconds to write ``path``'s bytes once more past the page cache (``O_DIRECT``, 8 MiB
    at a time from two aligned buffers, a writer thread writing one while the other is
    filled from the page cache) and ``fdatasync`` it: how the job writes its ``data``. On
    this project's VM a buffered write (``write_floor``) is often the slower of the two, so
    the floor is the faster one. None where ``O_DIRECT`` cannot be used here."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    flag = getattr(os, "O_DIRECT", 0)
    copy = path.with_name(path.name + ".floor")
    size = path.stat().st_size
    chunk = 8 << 20
    try:
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag) if flag else None
    except OSError:
        fd = None
    if fd is None:
        return None
    bufs = [mmap.mmap(-1, chunk), mmap.mmap(-1, chunk)]
    try:
        with open(path, "rb", buffering=0) as src, ThreadPoolExecutor(1) as writer:
            t0 = time.perf_counter()
            pending, off, turn = None, 0, 0
            while off < size:
                buf = bufs[turn]
                n = src.readinto(buf)
                if not n:
                    break
                if pending is not None:
                    pending.result()
                # a short last chunk: written whole pages (O_DIRECT), then cut to size
                view = memoryview(buf)[: -(-n // 4096) * 4096]
                pending = writer.submit(os.pwrite, fd, view, off)
                off, turn = off + n, turn ^ 1
            if pending is not None:
                pending.result()
            os.ftruncate(fd, size)
            os.fdatasync(fd)
            secs = time.perf_counter() - t0
    finally:
        os.close(fd)
        copy.unlink()
    return secs


def load() -> str:
    """The 1/5/15-minute load averages: this machine is shared, so every figure carries it."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def catchup(args, layout, spark, tmp: Path, n: int) -> None:
    """The catch-up run: ``--runs`` pairs of (job into a new root, its ``data`` written once
    more and fdatasync'd), beside ``ControlNode`` end to end unless ``--no-control``."""
    from coincurve import PrivateKey

    from loglake.archives.signing import community_id
    from loglake.pipeline.jobs.archives_build import ArchivesBuildOptions, Community, run

    weeks = args.weeks
    now = START + weeks * WINDOW_NS + 1
    data_dir = Path(args.data) if args.data else tmp / "data"
    if not data_dir.exists() or not any(data_dir.iterdir()):
        t0 = time.perf_counter()
        write_community_stream(data_dir, "community", layout, n, weeks, args.payload)
        console.print(
            f"wrote {n:,} messages over {weeks} weeks in {time.perf_counter() - t0:.1f} s"
        )
    else:
        console.print(f"reading the stream already in {data_dir} (--data)")
    key = PrivateKey(hashlib.sha256(b"loglake archives benchmark").digest())  # fixed: the
    # info hash of one run compares with another's (two source trees, alternated)
    cid = community_id(key)
    c = None
    if not args.no_control:
        c = control_end_to_end(data_dir, tmp / "control", key, layout, "community", now)
    opts = [
        ArchivesBuildOptions(
            str(data_dir),
            str(tmp / f"job-{i}"),
            (Community("community", cid),),
            layout=layout.name,
            now_ns=now,
            scratch=args.scratch,
        )
        for i in range(args.runs)
    ]
    for i, o in enumerate(opts):
        console.print(f"load average {load()} before job run {i + 1}")
        t0, c0 = time.perf_counter(), tree_cpu()
        rep = run(spark, o)
        t_job, c_job = time.perf_counter() - t0, tree_cpu() - c0
        out = Path(o.root)
        data = out / cid / "data"
        torrent = (out / f"{cid}.torrent").read_bytes()
        same = "no ControlNode" if c is None else str(torrent == c["torrent"])
        t_kernel = write_floor(data)
        t_direct = write_floor_direct(data)
        t_write = min(t_kernel, t_direct or t_kernel)
        sha1 = sha1_piece_rate(data)
        mb = data.stat().st_size / 1e6
        t = Table(
            title=f"{weeks}-week catch-up, {n:,} messages × {args.payload} B, "
            f"layout={layout.name}: {mb:,.0f} MB of data, {rep.new_archives} archives"
        )
        for col in ("what", "s", "MB/s", "msgs/s", "note"):
            t.add_column(col, justify="left" if col in ("what", "note") else "right")
        if c is not None:
            t.add_row(
                "ControlNode end to end",
                f"{c['total_s']:.1f}",
                f"{mb / c['total_s']:.0f}",
                f"{n / c['total_s']:,.0f}",
                f"ingest {c['ingest_s']:.1f} s + build {c['build_s']:.1f} s",
            )
            t.add_row(
                "ControlNode build only",
                f"{c['build_s']:.1f}",
                f"{mb / c['build_s']:.0f}",
                f"{n / c['build_s']:,.0f}",
                "SQLite store → files",
            )
        secs = ", ".join(f"{k} {v:.1f}" for k, v in rep.seconds.items() if k != "total")
        t.add_row(
            "job archives-build, local[*]",
            f"{t_job:.1f}",
            f"{mb / t_job:.0f}",
            f"{n / t_job:,.0f}",
            f"{secs}; CPU {c_job:.1f} s (process tree); identical: {same}; "
            f"info hash {rep.communities[0].info_hash}",
        )
        t.add_row("SHA-1 per 100 KiB piece", "", f"{sha1:.0f}", "", "same data, same run")
        t.add_row(
            "data written once + fdatasync",
            f"{t_kernel:.1f}",
            f"{mb / t_kernel:.0f}",
            "",
            "a kernel copy of the job's data",
        )
        if t_direct is not None:
            t.add_row(
                "data written once past the page cache + fdatasync",
                f"{t_direct:.1f}",
                f"{mb / t_direct:.0f}",
                "",
                "O_DIRECT, as the job writes",
            )
        console.print(t)
        vs_control = (
            "" if c is None else f"job / ControlNode = {c['total_s'] / t_job:.1f}× (target ≥ 4×); "
        )
        console.print(
            f"job {t_job:.1f} s wall, {c_job:.1f} s CPU (process tree); {secs}; "
            f"info hash {rep.communities[0].info_hash}",
            soft_wrap=True,
        )
        console.print(
            f"{vs_control}job / write floor (the faster of the two writes, {t_write:.1f} s) = "
            f"{t_write / t_job:.0%} (target ≥ 50%: the job in "
            f"≤ {2 * t_write:.1f} s); job / SHA-1 piece rate = {mb / t_job / sha1:.0%}; "
            f"load average {load()}"
        )
        shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(tmp / "control", ignore_errors=True)
    if not args.data:
        shutil.rmtree(data_dir, ignore_errors=True)


def main_job(args, layout) -> None:
    from coincurve import PrivateKey

    from loglake.archives.signing import community_id
    from loglake.pipeline import build_session
    from loglake.pipeline.jobs.archives_build import ArchivesBuildOptions, Community, run

    n = args.messages if "--messages" in sys.argv else 10_000_000
    if args.tmp:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="loglake-bench-job-", dir=args.tmp))
    console.print(f"temporary folder {tmp}")
    try:
        t0 = time.perf_counter()
        # the session the CLI's archives-build starts (C1 only: session.C1_ONLY; no data
        # source registered), so the figures are the command's
        spark = build_session(app_name="loglake-archives-build", c1_only=True, data_source=False)
        console.print(
            f"Spark {spark.sparkContext.master} started in {time.perf_counter() - t0:.1f} s"
        )
        if not args.no_catchup:
            catchup(args, layout, spark, tmp, n)
        if not args.no_many:
            k, per = args.communities, args.per_community
            data_dir = tmp / "many"
            weeks = 4
            now = START + weeks * WINDOW_NS + 1
            keys = [PrivateKey() for _ in range(k)]
            t0 = time.perf_counter()
            for i in range(k):
                write_community_stream(
                    data_dir, f"community-{i:03d}", layout, per, weeks, args.payload
                )
            console.print(
                f"wrote {k} streams × {per:,} messages in {time.perf_counter() - t0:.1f} s"
            )
            t0 = time.perf_counter()
            torrents = []
            total_bytes = 0
            for i, key in enumerate(keys):
                c = control_end_to_end(
                    data_dir, tmp / "many-control", key, layout, f"community-{i:03d}", now
                )
                torrents.append(c["torrent"])
                total_bytes += c["bytes"]
            t_ctl = time.perf_counter() - t0
            comms = tuple(
                Community(f"community-{i:03d}", community_id(key)) for i, key in enumerate(keys)
            )
            opts = ArchivesBuildOptions(
                str(data_dir),
                str(tmp / "many-job"),
                comms,
                layout=layout.name,
                now_ns=now,
                scratch=args.scratch,
            )
            t0 = time.perf_counter()
            rep = run(spark, opts)
            t_job = time.perf_counter() - t0
            same = all(
                (tmp / "many-job" / f"{c.community_id}.torrent").read_bytes() == tor
                for c, tor in zip(comms, torrents, strict=True)
            )
            mb = total_bytes / 1e6
            t = Table(
                title=f"{k} communities × {per:,} messages ({weeks} weeks each): {mb:,.0f} MB"
            )
            for col in ("what", "s", "MB/s", "msgs/s", "note"):
                t.add_column(col, justify="left" if col in ("what", "note") else "right")
            t.add_row(
                f"{k} ControlNode builds (ingest + build)",
                f"{t_ctl:.1f}",
                f"{mb / t_ctl:.0f}",
                f"{k * per / t_ctl:,.0f}",
                "one after another",
            )
            t.add_row(
                "one job archives-build, local[*]",
                f"{t_job:.1f}",
                f"{mb / t_job:.0f}",
                f"{k * per / t_job:,.0f}",
                f"{rep.new_archives} archives; identical: {same}",
            )
            console.print(t)
            console.print(f"job / ControlNode builds = {t_ctl / t_job:.1f}×; load average {load()}")
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
