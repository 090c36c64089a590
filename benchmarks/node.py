"""Node benchmark (issue 14): what metrics cost on the push path, and API latency under load.

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
end. Run: ``.venv/bin/python benchmarks/node.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.procs

from tests.procs import free_port, process

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
    ap.add_argument("--size", type=int, default=1024, help="bytes per message")
    ap.add_argument("--window", type=int, default=1000, help="messages in flight")
    ap.add_argument("--count", type=int, default=50_000, help="messages per push run")
    ap.add_argument("--rounds", type=int, default=20, help="push runs per configuration")
    ap.add_argument("--scrape", type=float, default=15.0, help="seconds between /metrics reads")
    ap.add_argument("--rate", type=int, default=20_000, help="pushes/s during the API phase")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the API phase")
    ap.add_argument("--no-api", action="store_true", help="skip the API latency phase")
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
