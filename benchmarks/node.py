"""Node benchmark: the node on the embedded log vs on NATS JetStream (one node, two nodes),
and (``--metrics-cost``) what metrics cost on the push path and API latency under load.

**The comparison** (the default). Same run, three configurations, each on fresh processes:
``embedded`` (one ``loglake node`` on the embedded log), ``js-1`` (one node on a local 3-node
JetStream cluster, R3), ``js-2`` (two nodes on one such cluster, same ``nats_prefix``: node A
runs every part, node B the stream service only — ICRC roles, the archives control node and SDS
run on one node, docs/node.md). The same workload runs against each:

- push: ``--pushes`` 1 KB records over TCP by two client threads (``StreamClient``, 1,000 in
  flight), one per partition of a 2-partition stream; with two nodes, one thread per node;
- ICRC: ``--events`` published through the API (batches of 100) before a subscription, then
  one ICRC-77 replay of all of them to the new subscriber, timed to ``completed``;
- Cardinal: a ``--blocks`` chain produced through node A, consumed (exactly once, from the
  checkpoint) through node B (the same node with one node);
- SDS: ``--sds`` messages sent by alice through the API, one by one;
- archives: ``--archive-messages`` community messages of a closed week, then one control
  round (``POST /api/archives/build``) timed.

Reported: ops/s of each path per configuration (and against the embedded log), and CPU seconds
of every process of the configuration (nats-servers, nodes and their children, this client)
per 10,000 operations during the workload; the target is two nodes ≤ 1.1× one node (the
coordination a second node adds: its leases, its connection, reads through it).

**Lease failover** (``--failover-rounds``, default 5): two nodes on one cluster with
``--ttl`` s leases and a 0.2 s seal interval; records are pushed, the sealer's holder is
SIGKILLed, and two times are measured: until the lease key in the KV bucket names the other
node, and until the other node has sealed every record (the next leased operation succeeding
there); a fresh node replaces the killed one for the next round. Bound: ttl + 2 s at the p50.

The Spark push → micro-batch figure is ``benchmarks/spark_jetstream.py``'s.

    .venv/bin/python benchmarks/node.py                        # the comparison + failover
    .venv/bin/python benchmarks/node.py --pushes 5000 --failover-rounds 3
    .venv/bin/python benchmarks/node.py --metrics-cost         # the metrics part below

**Metrics cost** (``--metrics-cost``):

1. Push throughput with metrics on vs off, same run: two ``loglake node`` processes (temp data
   dirs, free ports, console and protocol parts off), one with ``--no-http-metrics``; a
   ``StreamClient`` pushes ``--count`` 1 KB messages (``--window`` in flight, ``batch``
   durability) to each in turn, ``--rounds`` times, alternating which goes first. While the
   metrics-on node is pushed to, a scraper reads its ``/metrics`` once per ``--scrape`` seconds
   of its push time (15 s, as Prometheus's example config; its global default is 60 s); five
   more reads at the end time one scrape, so the cost of a tighter interval can be read off.
   Reported per path: the median rate of each, and the cost as the median of the per-round
   paired costs ``1 - on/off`` with a bootstrap 90% interval of that median (target ≤ 5%):
   pairing cancels the load drift that hits both nodes of one round alike.
   Also the same cost in process, without TCP: ``append_payloads`` of ``--window`` records
   through ``InstrumentedLog`` vs the bare log, alternated; and the wrapper's own time per
   batch, over ``MemoryLog`` (no disk, so the difference is the wrapper alone), set against the
   time the TCP path takes per batch: that ratio bounds the cost with far less noise than any
   throughput run on a shared machine.
2. API p99 under load: the metrics-on node takes ``--rate`` pushes/s (default 20,000, paced in
   batches from a separate process) for ``--seconds``; meanwhile this process calls
   ``GET /api/streams`` and ``GET /api/streams/bench`` in turn and times each answer.
   Reported: p50/p99/max per route, calls made, and the push rate the node actually took.

Bounded: every phase has a count and a time limit; processes and temp dirs are removed at the
end. Run: ``.venv/bin/python benchmarks/node.py --metrics-cost`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.procs

from tests.procs import free_port, process, wait_port
from tests.procs import stop as stop_proc

console = Console(width=200)


def node_cmd(data_dir: Path, http_port: int, stream_port: int, metrics: bool) -> list[str]:
    return [
        sys.executable, "-m", "loglake.cli", "node", "--data-dir", str(data_dir),
        "--no-console", "--http-port", str(http_port), "--streams-port", str(stream_port),
        "--http-metrics" if metrics else "--no-http-metrics",
    ]  # fmt: skip


def push_rate(port: int, count: int, size: int, window: int, stream: str) -> float:
    from loglake.streams.client import StreamClient

    with StreamClient(port=port, window=window) as c:
        c.create_stream(stream)
        data = os.urandom(size)
        t = time.perf_counter()
        done = len(c.push_many(stream, [data] * count))
        return done / (time.perf_counter() - t)


SCRAPES: list[float] = []
"""Seconds each ``/metrics`` read took (client side: the node's collect + text exposition)."""


def _scraper(
    http_port: int, token: str, every: float, active: threading.Event, stop: threading.Event
) -> None:
    """Read ``/metrics`` like Prometheus does, once per ``every`` seconds of time spent with
    ``active`` set (the metrics-on node's runs), until ``stop``."""
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        since = 0.0
        while not stop.wait(0.02):
            if not active.is_set():
                continue
            since += 0.02
            if since >= every:
                since = 0.0
                t = time.perf_counter()
                http.get(f"http://127.0.0.1:{http_port}/metrics").raise_for_status()
                SCRAPES.append(time.perf_counter() - t)


def bench_push(tmp: Path, a: argparse.Namespace) -> dict[str, list[float]]:
    ports = {m: (free_port(), free_port()) for m in (True, False)}
    rates: dict[str, list[float]] = {"on": [], "off": []}
    on_cmd = node_cmd(tmp / "on", *ports[True], True)
    off_cmd = node_cmd(tmp / "off", *ports[False], False)
    with process(on_cmd, ports[True][0]), process(off_cmd, ports[False][0]):
        token = (tmp / "on" / "node.token").read_text().strip()
        active, stop = threading.Event(), threading.Event()
        scraper = threading.Thread(
            target=_scraper, args=(ports[True][0], token, a.scrape, active, stop), daemon=True
        )
        scraper.start()
        try:
            for r in range(a.rounds):
                order = (True, False) if r % 2 == 0 else (False, True)
                for metrics in order:
                    if metrics:
                        active.set()
                    try:
                        rate = push_rate(ports[metrics][1], a.count, a.size, a.window, f"b{r}")
                    finally:
                        active.clear()
                    rates["on" if metrics else "off"].append(rate)
        finally:
            stop.set()
            scraper.join()
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
            for _ in range(5):
                t = time.perf_counter()
                http.get(f"http://127.0.0.1:{ports[True][0]}/metrics").raise_for_status()
                SCRAPES.append(time.perf_counter() - t)
    return rates


def bench_inprocess(tmp: Path, a: argparse.Namespace) -> dict[str, list[float]]:
    """The wrapper's cost alone: batches of ``--window`` records, bare log vs instrumented,
    alternated in many short trials (``--rounds`` × 10) so that load drift hits both alike."""
    from loglake.log import open_log
    from loglake.node.metrics import InstrumentedLog, NodeMetrics

    rates: dict[str, list[float]] = {"on": [], "off": []}
    data = [os.urandom(a.size)] * a.window
    trials = a.rounds * 10
    batches = max(1, a.count // a.window // 10)
    with open_log(tmp / "inproc") as raw:
        wrapped = InstrumentedLog(raw, NodeMetrics())
        raw.create_stream("b")
        for r in range(trials * 2):
            log = wrapped if r % 2 == 0 else raw
            t = time.perf_counter()
            for _ in range(batches):
                log.append_payloads("b", data)
            rates["on" if log is wrapped else "off"].append(
                batches * a.window / (time.perf_counter() - t)
            )
    return rates


def wrapper_overhead(a: argparse.Namespace) -> tuple[float, float]:
    """Seconds per ``append_payloads`` batch through ``InstrumentedLog`` and bare, over a
    ``MemoryLog`` whose append returns at once: the difference is the wrapper's own work
    (clock reads, byte count, counters, histogram), free of any storage time and its noise.
    Best of 10 trials × 2,000 batches, alternated."""
    from loglake.log.memory import MemoryLog
    from loglake.node.metrics import InstrumentedLog, NodeMetrics

    indexes = list(range(a.window))

    class InstantLog(MemoryLog):
        def append_payloads(self, stream: str, datas, *, partition: int = 0) -> list[int]:  # type: ignore[override]
            return indexes

    data = [b"x" * a.size] * a.window
    bare = InstantLog()
    bare.create_stream("b")
    logs = {"off": bare, "on": InstrumentedLog(bare, NodeMetrics())}
    best = {"on": float("inf"), "off": float("inf")}
    n = 2000
    for _ in range(10):
        for name, log in logs.items():
            t = time.perf_counter()
            for _ in range(n):
                log.append_payloads("b", data)
            best[name] = min(best[name], (time.perf_counter() - t) / n)
    return best["on"], best["off"]


def paired_cost(on: list[float], off: list[float]) -> tuple[float, float, float]:
    """Median of the per-round costs ``1 - on/off`` and a bootstrap 90% interval of it."""
    costs = [1 - x / y for x, y in zip(on, off, strict=True)]
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(costs, k=len(costs))) for _ in range(2000))
    return statistics.median(costs), meds[100], meds[1899]


def _paced_pusher(port: int, rate: int, seconds: float, size: int, start, q) -> None:
    """Push ``rate`` messages/s in batches every 50 ms for ``seconds``; report what was done."""
    from loglake.streams.client import StreamClient

    with StreamClient(port=port, window=2000) as c:
        c.create_stream("bench")
        data = os.urandom(size)
        per_tick = max(1, rate // 20)
        start.wait()
        t0 = time.perf_counter()
        done, tick = 0, 0
        while time.perf_counter() - t0 < seconds:
            done += len(c.push_many("bench", [data] * per_tick))
            tick += 1
            delay = t0 + tick * 0.05 - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        q.put((done, time.perf_counter() - t0))


def bench_api(tmp: Path, a: argparse.Namespace) -> tuple[dict[str, list[float]], float]:
    http_port, stream_port = free_port(), free_port()
    data_dir = tmp / "api"
    with process(node_cmd(data_dir, http_port, stream_port, True), http_port):
        token = (data_dir / "node.token").read_text().strip()
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{http_port}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        from loglake.streams.client import StreamClient

        with StreamClient(port=stream_port) as c:  # a few more streams to list
            for i in range(10):
                c.create_stream(f"other{i}", 4)
                c.push_many(f"other{i}", [b"x" * 100] * 100)
        ctx = mp.get_context("spawn")
        start, q = ctx.Event(), ctx.Queue()
        pusher = ctx.Process(
            target=_paced_pusher, args=(stream_port, a.rate, a.seconds, a.size, start, q)
        )
        pusher.start()
        time.sleep(2.0)  # the pusher connects and creates the stream
        lat: dict[str, list[float]] = {"GET /api/streams": [], "GET /api/streams/bench": []}
        start.set()
        t_end = time.perf_counter() + a.seconds
        while time.perf_counter() < t_end:
            for route, path in (
                ("GET /api/streams", "/api/streams"),
                ("GET /api/streams/bench", "/api/streams/bench"),
            ):
                t = time.perf_counter()
                r = api.get(path)
                lat[route].append(time.perf_counter() - t)
                r.raise_for_status()
            time.sleep(0.01)
        pusher.join(timeout=a.seconds + 60)
        done, took = q.get(timeout=10)
        api.close()
    return lat, done / took


def _spread(xs: list[float]) -> str:
    """All runs when few; min..max of many."""
    if len(xs) <= 4:
        return " ".join(f"{x:,.0f}" for x in xs)
    return f"{len(xs)} runs, {min(xs):,.0f}..{max(xs):,.0f}"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--metrics-cost", action="store_true", help="run the metrics-cost part instead")
    g = ap.add_argument_group("comparison (default)")
    g.add_argument("--pushes", type=int, default=20_000, help="1 KB records pushed")
    g.add_argument("--events", type=int, default=500, help="ICRC events published, replayed")
    g.add_argument("--blocks", type=int, default=40, help="Cardinal chain length")
    g.add_argument("--sds", type=int, default=200, help="SDS messages sent")
    g.add_argument("--archive-messages", type=int, default=2000, help="messages archived")
    g.add_argument(
        "--only",
        default="embedded,js-1,js-2",
        help="configurations to run ('' for none: the failover part alone)",
    )
    g.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    g.add_argument("--failover-rounds", type=int, default=5, help="SIGKILLs (0: none)")
    g.add_argument("--ttl", type=int, default=3, help="lease TTL in the failover runs, s")
    g = ap.add_argument_group("--metrics-cost")
    g.add_argument("--size", type=int, default=1024, help="bytes per message")
    g.add_argument("--window", type=int, default=1000, help="messages in flight")
    g.add_argument("--count", type=int, default=50_000, help="messages per push run")
    g.add_argument("--rounds", type=int, default=20, help="push runs per configuration")
    g.add_argument("--scrape", type=float, default=15.0, help="seconds between /metrics reads")
    g.add_argument("--rate", type=int, default=20_000, help="pushes/s during the API phase")
    g.add_argument("--seconds", type=float, default=10.0, help="length of the API phase")
    g.add_argument("--no-api", action="store_true", help="skip the API latency phase")
    a = ap.parse_args()
    if not a.metrics_cost:
        sys.exit(compare(a))
    metrics_cost(a)


def metrics_cost(a: argparse.Namespace) -> None:
    console.print(f"cores: {os.cpu_count()}, load: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="loglake-bench-node-") as d:
        tmp = Path(d)
        t = Table(title="push throughput, metrics on vs off (msgs/s, median of runs)")
        for col in ("path", "metrics on", "metrics off", "cost (paired)", "90% interval",
                    "runs on", "runs off"):  # fmt: skip
            t.add_column(col, justify="right")
        tcp_batch_s = 0.0
        for name, fn in (("TCP, node process", bench_push), ("in process, log", bench_inprocess)):
            r = fn(tmp, a)
            on, off = statistics.median(r["on"]), statistics.median(r["off"])
            cost, lo, hi = paired_cost(r["on"], r["off"])
            tcp_batch_s = tcp_batch_s or a.window / off
            t.add_row(
                name,
                f"{on:,.0f}",
                f"{off:,.0f}",
                f"{cost * 100:+.1f}%",
                f"{lo * 100:+.1f}%..{hi * 100:+.1f}%",
                _spread(r["on"]),
                _spread(r["off"]),
            )
        console.print(t)
        if SCRAPES:
            console.print(
                f"/metrics reads: {len(SCRAPES)} (5 after the runs), median "
                f"{statistics.median(SCRAPES) * 1e3:.1f} ms, max {max(SCRAPES) * 1e3:.1f} ms "
                f"({a.rounds} streams of 1 partition in the node)"
            )
        w_on, w_off = wrapper_overhead(a)
        extra = w_on - w_off
        console.print(
            f"InstrumentedLog's own time per append_payloads of {a.window:,} (over an instant "
            f"MemoryLog, best of 10): {w_on * 1e6:,.1f} µs vs {w_off * 1e6:,.1f} µs bare = "
            f"{extra * 1e6:+,.1f} µs per batch; a batch of {a.window:,} takes "
            f"{tcp_batch_s * 1e3:,.2f} ms on the TCP path (metrics off, median), so the wrapper "
            f"is {extra / tcp_batch_s * 100:.3f}% of it"
        )
        if a.no_api:
            return
        lat, took = bench_api(tmp, a)
        t = Table(
            title=f"API latency while the node takes {a.rate:,} pushes/s "
            f"(achieved {took:,.0f}/s, {a.seconds:g} s)"
        )
        for col in ("route", "calls", "p50 ms", "p99 ms", "max ms"):
            t.add_column(col, justify="right")
        for route, xs in lat.items():
            t.add_row(
                route,
                str(len(xs)),
                f"{pct(xs, 0.5) * 1e3:.2f}",
                f"{pct(xs, 0.99) * 1e3:.2f}",
                f"{max(xs) * 1e3:.2f}",
            )
        console.print(t)


# -- the comparison: embedded log vs JetStream, one node vs two --------------------------------

CONFIGS = ("embedded", "js-1", "js-2")
NAMESPACE = "demo.events"
CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of ``pids`` and of every live descendant, plus what they reaped
    (cutime + cstime), from /proc."""
    stats: dict[int, tuple[int, float]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid = int(fields[1])
        ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        stats[int(d.name)] = (ppid, ticks / CLK)
    wanted, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in wanted:
            continue
        wanted.add(pid)
        todo += [c for c, (pp, _) in stats.items() if pp == pid]
    return sum(stats[p][1] for p in wanted if p in stats)


class NodeProc:
    """One ``loglake node`` process on free ports; ``parts`` turns on ICRC, archives, SDS."""

    def __init__(self, data_dir: Path, parts: bool, backend: list[str]) -> None:
        self.data_dir = data_dir
        self.http_port, self.stream_port = free_port(), free_port()
        cmd = [
            sys.executable, "-m", "loglake.cli", "node", "--no-console",
            "--data-dir", str(data_dir), "--http-port", str(self.http_port),
            "--streams-port", str(self.stream_port), *backend,
        ]  # fmt: skip
        if parts:
            cmd += [
                "--events-enabled", "--events-namespaces", NAMESPACE,
                "--archives-enabled", "--no-archives-member", "--sds-enabled",
            ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(self.http_port, self.proc, 120)
        except BaseException:
            self.stop()
            raise
        token = (data_dir / "node.token").read_text().strip()
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.http_port}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
        )

    def call(self, method: str, path: str, **kw: object) -> object:
        r = self.api.request(method, path, **kw)  # type: ignore[arg-type]
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            stop_proc(self.proc, 30)
        api = getattr(self, "api", None)
        if api is not None:
            api.close()


def _wait(what: str, probe, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.02)
    raise TimeoutError(f"{what}: not within {timeout}s")


def workload(nodes: list[NodeProc], a: argparse.Namespace) -> dict[str, tuple[int, float]]:
    """The protocols' main paths against ``nodes`` (the first runs every part, the last
    serves the second pusher and the Cardinal consumer); {path: (operations, seconds)}."""
    from loglake.archives import get_layout
    from loglake.cardinal.cli import consume_topic, produce_chain
    from loglake.streams.client import StreamClient

    first, last = nodes[0], nodes[-1]
    out: dict[str, tuple[int, float]] = {}
    data = os.urandom(1024)
    with StreamClient(port=first.stream_port) as c:
        c.create_stream("bench.push", 2)
    half = a.pushes // 2

    def pusher(node: NodeProc, partition: int) -> None:
        with StreamClient(port=node.stream_port, window=1000) as c:
            c.push_many("bench.push", [data] * half, partition=partition)

    threads = [threading.Thread(target=pusher, args=(n, p)) for p, n in enumerate((first, last))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out["push"] = (2 * half, time.perf_counter() - t)

    publish = f"/api/events/namespaces/{NAMESPACE}/events"
    ids: list[int] = []
    t = time.perf_counter()
    for i in range(0, a.events, 100):
        texts = [f"event {j}" for j in range(i, min(a.events, i + 100))]
        ids += first.call("POST", publish, json={"texts": texts})["ids"]  # type: ignore[index]
    out["ICRC publish"] = (len(ids), time.perf_counter() - t)
    first.call("POST", "/api/events/subscriptions", json={"namespace": NAMESPACE})
    t = time.perf_counter()
    rid = first.call(
        "POST",
        "/api/events/replays",
        json={"namespace": NAMESPACE, "start": ids[0], "end": ids[-1] + 1},
    )["id"]  # type: ignore[index]
    _wait(
        "ICRC replay",
        lambda: first.call("GET", f"/api/events/replays/{rid}")["status"] == "completed",  # type: ignore[index]
    )
    out["ICRC replay"] = (len(ids), time.perf_counter() - t)

    with StreamClient(port=first.stream_port) as pc, StreamClient(port=last.stream_port) as cc:
        t = time.perf_counter()
        sent, _ = produce_chain(pc, "bench.chain", a.blocks, partitions=2)
        out["Cardinal produce"] = (sent, time.perf_counter() - t)
        idle = 0.3
        t = time.perf_counter()
        consume_topic(cc, "bench.chain", "bench", idle_seconds=idle)
        out["Cardinal consume"] = (sent, time.perf_counter() - t - idle)

    ch = first.call("GET", "/api/sds/channels")[0]["channel"]  # type: ignore[index]
    t = time.perf_counter()
    for i in range(a.sds):
        first.call(
            "POST", f"/api/sds/channels/{ch}/messages", json={"sender": "alice", "text": f"m{i}"}
        )
    out["SDS send"] = (a.sds, time.perf_counter() - t)

    info = first.call("GET", "/api/archives")
    layout = get_layout("spec")
    day = 86400 * 10**9
    start = time.time_ns() - 9 * day  # one whole 7-day window that has closed
    step = 6 * day // max(1, a.archive_messages)
    records = [
        layout.make_record(
            payload=f"community message {i}".encode() * 8,
            topic="/status/1/community-chat/proto",
            timestamp_ns=start + i * step,
        )
        for i in range(a.archive_messages)
    ]
    with StreamClient(port=first.stream_port) as c:
        c.create_stream(info["stream"])  # type: ignore[index]
        c.push_many(info["stream"], records)  # type: ignore[index]
    t = time.perf_counter()
    built = first.call("POST", "/api/archives/build", json={})
    out["archive build"] = (a.archive_messages, time.perf_counter() - t)
    if not built.get("new_archives"):  # type: ignore[union-attr]
        console.print(f"[yellow]archive build answered {built}[/]")
    return out


def run_config(name: str, tmp: Path, a: argparse.Namespace) -> tuple[dict, float, float, int]:
    """Start ``name``'s processes, run the workload, stop them: (paths, cluster-side CPU s,
    client CPU s, operations)."""
    from loglake.node.localcluster import LocalNatsCluster

    root = tmp / name
    with contextlib.ExitStack() as stack:
        backend: list[str] = []
        pids: list[int] = []
        if name != "embedded":
            nats = stack.enter_context(LocalNatsCluster(3))
            pids += [p.pid for p in nats.procs]
            backend = [
                "--backend", nats.url, "--replicas", "3", "--streams-nats-prefix", "bench",
                "--streams-nats-monitor", nats.monitor_urls,
            ]  # fmt: skip
        nodes = []
        for i in range(2 if name == "js-2" else 1):
            n = NodeProc(root / f"node{i}", parts=i == 0, backend=backend)
            stack.callback(n.stop)
            nodes.append(n)
        pids += [n.proc.pid for n in nodes]
        time.sleep(1.0)  # parts settle (first rounds, lease contention)
        cpu0, client0 = cpu_seconds(pids), sum(os.times()[:2])
        paths = workload(nodes, a)
        cpu1, client1 = cpu_seconds(pids), sum(os.times()[:2])
        if name == "js-2":
            c = nodes[1].call("GET", "/api/cluster")
            held = {x["name"]: x["holder"] for x in c["leases"]}  # type: ignore[index]
            console.print(f"js-2 leases at the end: {held}")
    ops = sum(n for n, _ in paths.values())
    return paths, cpu1 - cpu0, client1 - client0, ops


def sealed_records(data_dir: Path, stream: str) -> int:
    from loglake.log.lake import list_lake_files, visible_lake_files
    from loglake.log.lake_schema import lake_partition_dir

    files = visible_lake_files(list_lake_files(lake_partition_dir(data_dir, stream, 0)))
    return sum(f.last - f.first + 1 for f in files)


def failover(tmp: Path, a: argparse.Namespace) -> list[tuple[float, float]]:
    """Seconds from SIGKILL of the sealer's holder to the lease key naming the other node, and
    to the other node having sealed every record, per round (see the module docstring)."""
    from loglake.node.cluster import read_lease
    from loglake.node.localcluster import LocalNatsCluster
    from loglake.streams.jetstream import JetStreamLog

    times: list[tuple[float, float]] = []
    with LocalNatsCluster(3) as nats, contextlib.ExitStack() as stack:
        backend = [
            "--backend", nats.url, "--replicas", "3", "--streams-nats-prefix", "fo",
            "--streams-lease-ttl", str(a.ttl), "--streams-seal-interval", "0.2",
            "--no-streams-enabled",
        ]  # fmt: skip
        log = JetStreamLog(nats.url, prefix="fo")
        stack.callback(log.close)
        log.create_stream_replicated("orders", None, 3)
        count = 0

        def start(i: int) -> NodeProc:
            n = NodeProc(tmp / "failover" / f"node{i}", parts=False, backend=backend)
            stack.callback(n.stop)
            return n

        nodes = [start(0), start(1)]

        def holder() -> NodeProc | None:
            for n in nodes:
                c = n.call("GET", "/api/cluster")
                if any(x["name"] == "sealer" and x["held_here"] for x in c["leases"]):  # type: ignore[index]
                    return n
            return None

        for r in range(a.failover_rounds):
            held = _wait("a sealer holder", holder, 30)
            other = next(n for n in nodes if n is not held)
            log.append_payloads("orders", [b"r%d-%d" % (r, i) for i in range(100)], partition=0)
            count += 100
            _wait(
                "the holder seals",
                lambda n=held, want=count: sealed_records(n.data_dir, "orders") == want,
                30,
            )
            time.sleep(a.ttl / 3 * 2)  # the holder renews meanwhile
            log.append_payloads("orders", [b"k%d-%d" % (r, i) for i in range(10)], partition=0)
            count += 10
            name = other.call("GET", "/api/cluster")["node"]  # type: ignore[index]
            held.proc.kill()
            killed = time.monotonic()
            moved = sealed = None
            while sealed is None or moved is None:  # the lease key, read as the cluster has it
                now = time.monotonic() - killed
                if now > a.ttl + 30:
                    raise TimeoutError(f"failover round {r + 1}: not done in {now:.0f}s")
                if moved is None and log.call(read_lease(log.js, "fo_leases", "sealer"))[0] == name:
                    moved = now
                if sealed is None and sealed_records(other.data_dir, "orders") == count:
                    sealed = now
                time.sleep(0.05)
            times.append((moved, sealed))
            console.print(
                f"failover round {r + 1}: the sealer's lease on the other node {moved:.2f}s, "
                f"its next seal done {sealed:.2f}s after SIGKILL"
            )
            held.stop()
            nodes = [other, start(r + 2)]
    return times


def compare(a: argparse.Namespace) -> int:
    # the workload's imports, before any CPU is counted: the first configuration must not pay
    # them in "client" (they took ~2 s of a 2,580-operation run)
    import loglake.archives
    import loglake.cardinal.cli
    import loglake.node.localcluster
    import loglake.streams.client
    import loglake.streams.jetstream  # noqa: F401

    console.print(f"cores: {os.cpu_count()}, load: {os.getloadavg()[0]:.1f}")
    configs = [c for c in a.only.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        console.print(
            f"[red]--only: unknown configuration {bad[0]!r} (one of {', '.join(CONFIGS)})[/]"
        )
        return 2
    runs: dict[str, list[tuple[dict, float, float, int]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="loglake-bench-node-") as d:
        tmp = Path(d)
        for r in range(a.repeat):  # configurations alternate: load drift hits each alike
            for name in configs if r % 2 == 0 else configs[::-1]:
                console.print(f"run {r + 1}/{a.repeat}: {name} …")
                runs[name].append(run_config(name, tmp / str(r), a))
        times = failover(tmp, a) if a.failover_rounds > 0 else []
    med = statistics.median
    t = Table(
        title=f"throughput of each path (ops/s, median of {a.repeat}; × = against the embedded log)"
    )
    t.add_column("path")
    for name in configs:
        t.add_column(name, justify="right")
    rates = {
        name: {
            path: med(
                n / secs if secs > 0 else float("inf") for n, secs in (x[0][path] for x in rs)
            )
            for path in rs[0][0]
        }
        for name, rs in runs.items()
    }
    for path in rates[configs[0]] if configs else ():  # --only '': the failover part alone
        row = [path]
        for name in configs:
            cell = f"{rates[name][path]:,.0f}"
            if name != "embedded" and "embedded" in rates:
                cell += f" ({rates[name][path] / rates['embedded'][path]:.2f}×)"
            row.append(cell)
        t.add_row(*row)
    console.print(t)
    t = Table(title=f"CPU seconds per 10,000 operations during the workload (median of {a.repeat})")
    for col in ("configuration", "operations", "servers + nodes", "client", "all processes"):
        t.add_column(col, justify="right")
    per10k: dict[str, list[float]] = {}
    for name in configs:
        rs = runs[name]
        ops = rs[0][3]
        per10k[name] = [(side + client) / n * 10_000 for _, side, client, n in rs]
        t.add_row(
            name,
            f"{ops:,}",
            f"{med(side / n * 10_000 for _, side, _, n in rs):.2f}",
            f"{med(client / n * 10_000 for _, _, client, n in rs):.2f}",
            f"{med(per10k[name]):.2f}",
        )
    console.print(t)
    ok = True
    if "js-1" in per10k and "js-2" in per10k:
        pairs = [x / y for x, y in zip(per10k["js-2"], per10k["js-1"], strict=True)]
        ratio = med(pairs)
        ok &= ratio <= 1.1
        console.print(
            f"two nodes / one node (JetStream R3), CPU per 10k ops: {ratio:.3f} (median of "
            f"the runs' ratios {', '.join(f'{x:.3f}' for x in pairs)}; target ≤ 1.1: "
            f"{'met' if ratio <= 1.1 else 'NOT met'})"
        )
    if "embedded" in per10k and "js-1" in per10k:
        js_vs_embedded = med(per10k["js-1"]) / med(per10k["embedded"])
        console.print(f"JetStream R3 / embedded log, CPU per 10k ops: {js_vs_embedded:.2f}")
    if times:
        bound = a.ttl + 2
        moved, sealed = [m for m, _ in times], [x for _, x in times]
        p50 = statistics.median(sealed)
        ok &= p50 <= bound
        console.print(
            f"lease failover, ttl {a.ttl}s, {len(times)} SIGKILLs: lease held by the other node "
            f"p50 {statistics.median(moved):.2f}s (max {max(moved):.2f}s); its next seal done "
            f"p50 {p50:.2f}s (max {max(sealed):.2f}s); bound ttl + 2 = {bound}s: "
            f"{'met' if p50 <= bound else 'NOT met'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    main()
