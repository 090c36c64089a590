"""Soak: a real ``loglake serve`` under 20 pushing-and-pulling clients and 500 idle connections
for up to 10 minutes (issue 15 §4).

What it does (everything bounded: ``--minutes`` at most 10):

- starts ``loglake serve`` (``batch`` durability, 4 MiB segments sealed to the lake, 16 MiB
  retention per stream, applied every 5 s) on a temporary data dir and a free loopback port.
  A segment that has been read keeps its read descriptor until it is closed, so file fds (and
  RSS, measured) grow with the retained segments until retention bounds them (a 10-minute run
  with 256 MiB per stream grew until minute 8, then stayed flat): a small retention reaches
  that bound early, and growth after it is what the verdicts judge;
- ``--clients`` clients (threads spread over ``--procs`` processes, so the clients are not one
  GIL), each on its own stream: ``push_many`` of ``--batch`` messages of ``--size`` bytes, then
  ``pull`` of the same amount from its cursor, and again; every call's latency is recorded;
- for the first ``--baseline`` seconds no idle connection exists (the reference figures); then
  ``--idle`` connections are opened and left idle — most after the protocol's version byte, a
  tenth without sending anything (the server closes those after its version-byte timeout, 5 s
  as the reference) — until the end;
- every 5 s: the server's RSS, open file descriptors and threads (``/proc``), and a probe: a
  new client connects, pushes one message and pulls it back (a blocked accept loop or event
  loop would show here first).

Report, per minute: messages pushed and pulled per second, p50/p99 of push and pull calls, RSS,
fds, the probe's worst latency, the machine's mean 1-minute load average, the server's CPU per
message pushed (µs; it does the pull too), and the CPU used outside the soak (cores: every
process but the server, the clients and this one) and taken by the hypervisor (steal). On a
shared machine neighbours move the figures: a slow minute whose server cost per message is as
usual while CPU went elsewhere is the machine, not the server, and the report says so for each
minute off the bounds (the verdicts stay as measured). Verdicts: throughput and p99
steady (every full minute within 25% / 2x of the median minute), RSS growth from the end of
the first soak minute to the end at most 10%, socket fds constant once the idle connections are
open and file fds not growing, every idle connection that said hello still open at the end and
every silent one closed. Exit status 1
if a verdict fails.

    .venv/bin/python benchmarks/soak.py --minutes 3
    .venv/bin/python benchmarks/soak.py --minutes 10 --clients 20 --idle 500
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.procs
from tests.procs import free_port, process  # noqa: E402

MAX_MINUTES = 10.0
SAMPLE_S = 5.0
_HZ = os.sysconf("SC_CLK_TCK")


class Sample(NamedTuple):
    """One look every ``SAMPLE_S``; CPU figures are totals so far (differences give rates)."""

    t: float
    """Seconds since the start."""
    rss: int
    socks: int
    files: int
    threads: int
    probe: float
    """Seconds the probe took."""
    load: float
    """The machine's 1-minute load average."""
    server_cpu: float
    """CPU seconds of the server process (all its threads)."""
    soak_cpu: float
    """CPU seconds of the client processes and of this one."""
    busy: float
    """CPU seconds the machine spent busy, all cores (``/proc/stat``: user, nice, system,
    irq, softirq)."""
    steal: float
    """CPU seconds the hypervisor gave to other guests while ours waited (``/proc/stat``)."""


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 once it is gone)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / _HZ


def _machine_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq) / _HZ, steal / _HZ


# -- clients (in worker processes) -----------------------------------------------------------
def _client(port: int, name: str, batch: int, size: int, until: float, out: dict) -> None:
    from loglake.streams.client import StreamClient

    t_push, l_push, t_pull, l_pull = array("d"), array("d"), array("d"), array("d")
    errors: list[str] = []
    payloads = [os.urandom(size) for _ in range(batch)]
    try:
        with StreamClient("127.0.0.1", port, timeout=60) as c:
            c.create_stream(name)
            cursor = 0
            while time.monotonic() < until:
                t0 = time.monotonic()
                c.push_many(name, payloads)
                t1 = time.monotonic()
                got = c.pull(name, cursor, batch)
                t2 = time.monotonic()
                t_push.append(t1)
                l_push.append(t1 - t0)
                t_pull.append(t2)
                l_pull.append(t2 - t1)
                if got:
                    cursor = got[-1].index + 1
    except Exception as e:  # reported, and fails the run
        errors.append(f"{name}: {type(e).__name__}: {e}")
    out[name] = (t_push, l_push, t_pull, l_pull, errors)


def _worker(port: int, names: list[str], batch: int, size: int, until: float, q) -> None:
    out: dict = {}
    ts = [threading.Thread(target=_client, args=(port, n, batch, size, until, out)) for n in names]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put(out)


# -- the server's footprint --------------------------------------------------------------------
def _footprint(pid: int) -> tuple[int, int, int, int]:
    """(RSS bytes, socket fds, other fds, threads) of ``pid``."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    socks = files = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            where = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if where.startswith("socket:"):
            socks += 1
        else:
            files += 1
    return rss, socks, files, threads


def _probe(port: int) -> float:
    """Seconds for a new client to connect, push one message and read it back."""
    from loglake.streams.client import StreamClient

    t0 = time.monotonic()
    with StreamClient("127.0.0.1", port, timeout=60) as c:
        c.create_stream("soak-probe")
        i = c.push("soak-probe", b"probe")
        assert c.pull("soak-probe", i, 1)[0].data == b"probe"
    return time.monotonic() - t0


def _open_idle(port: int, n: int) -> tuple[list[socket.socket], list[socket.socket]]:
    """``n`` idle connections: (those that sent the version byte, those that sent nothing)."""
    from loglake.streams.client import ClientCore

    hello, silent = [], []
    for k in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        if k % 10:  # nine in ten have said hello (the version byte), one in ten nothing
            s.sendall(ClientCore.initial_bytes())
            hello.append(s)
        else:
            silent.append(s)
    return hello, silent


def _alive(s: socket.socket) -> bool:
    """Whether the server still holds the connection open. What it sent is read first (its
    version byte, sent on accept): a peek would see that byte before a close behind it."""
    s.setblocking(False)  # a socket with a timeout would wait for data before each recv
    try:
        while s.recv(65536):
            pass
        return False  # the end of the stream: closed
    except BlockingIOError:
        return True
    except OSError:  # reset: closed
        return False


def until_of(samples: list[Sample], start: float) -> float:
    """When the last sample was taken (monotonic clock)."""
    return start + samples[-1][0]


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


# -- the run -------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help=f"soak length (max {MAX_MINUTES})")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--procs", type=int, default=4, help="processes the clients run in")
    ap.add_argument("--idle", type=int, default=500, help="idle connections")
    ap.add_argument("--baseline", type=float, default=30.0, help="seconds before idle conns")
    ap.add_argument("--batch", type=int, default=100, help="messages per push / pull")
    ap.add_argument("--size", type=int, default=1024, help="bytes per message")
    ap.add_argument("--segment-mib", type=int, default=4, help="serve --segment-bytes, MiB")
    ap.add_argument(
        "--retention-mib",
        type=int,
        default=16,
        help="serve --retention-bytes per stream, MiB: small, so the retained set (segments, "
        "their fds and indexes) is at its bound before the first soak minute ends",
    )
    a = ap.parse_args()
    minutes = min(max(a.minutes, 0.5), MAX_MINUTES)
    tmp = Path(tempfile.mkdtemp(prefix="loglake-soak-"))
    port = free_port()
    cmd = [
        sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(tmp / "data"),
        "--port", str(port), "--durability", "batch", "--segment-bytes", str(a.segment_mib << 20),
        "--retention-bytes", str(a.retention_mib << 20), "--retention-interval", "5",
        # every idle connection comes from 127.0.0.1: above the default per-peer cap (256)
        "--limits-max-connections-per-peer", str(a.idle + a.clients + 16),
    ]  # fmt: skip
    stderr = open(tmp / "serve.log", "wb")  # noqa: SIM115 - closed in finally
    rc = 0
    try:
        with process(cmd, port, stderr=stderr) as proc:
            rc = _soak(a, minutes, port, proc.pid)
            if proc.poll() is not None:
                print(f"the server exited with {proc.returncode} during the soak")
                rc = 1
    finally:
        stderr.close()
        tail = (tmp / "serve.log").read_bytes()[-2000:].decode(errors="replace")
        if rc and tail.strip():
            print("server log tail:\n" + tail)
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


def _soak(a: argparse.Namespace, minutes: float, port: int, pid: int) -> int:
    start = time.monotonic()
    soak_start = start + a.baseline
    until = soak_start + minutes * 60
    print(
        f"soak: loglake serve pid {pid} on 127.0.0.1:{port}; {a.clients} clients in {a.procs} "
        f"processes, push_many/pull of {a.batch} x {a.size} B; {a.baseline:.0f} s baseline, "
        f"then {a.idle} idle connections for {minutes:g} min",
        flush=True,
    )
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    names = [f"soak-{i}" for i in range(a.clients)]
    workers = [
        ctx.Process(target=_worker, args=(port, names[k :: a.procs], a.batch, a.size, until, q))
        for k in range(a.procs)
    ]
    for w in workers:
        w.start()
    samples: list[Sample] = []
    ours = [os.getpid(), *(w.pid for w in workers if w.pid is not None)]
    idle: list[socket.socket] = []
    silent: list[socket.socket] = []
    opened = False
    try:
        while time.monotonic() < until:
            now = time.monotonic()
            if not opened and now >= soak_start:
                t0 = time.monotonic()
                (idle, silent), opened = _open_idle(port, a.idle), True
                print(
                    f"  {len(idle) + len(silent)} idle connections open "
                    f"({len(silent)} silent; {time.monotonic() - t0:.1f} s)"
                )
            rss, socks, files, threads = _footprint(pid)
            cpu = (_cpu_s(pid), sum(_cpu_s(p) for p in ours), *_machine_s())
            probe = _probe(port)
            load = float(Path("/proc/loadavg").read_text().split()[0])
            samples.append(Sample(now - start, rss, socks, files, threads, probe, load, *cpu))
            time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - now)))
        results: dict = {}
        for _ in workers:
            results.update(q.get(timeout=120))
        for w in workers:
            w.join(60)
        alive = sum(_alive(s) for s in idle)
        silent_alive = sum(_alive(s) for s in silent)
    finally:
        for s in idle + silent:
            s.close()
        for w in workers:
            if w.is_alive():
                w.kill()
    return _report(
        a, results, samples, start, soak_start, until, alive, len(idle), silent_alive, len(silent)
    )


class _Row(NamedTuple):
    period: int
    """0: the baseline; k: soak minute k."""
    rate: float
    p99: float
    full: bool
    server_us: float
    """Server CPU µs per message pushed (and pulled back)."""
    outside: float
    """Cores busy outside the soak (other processes, the kernel's own work for them) plus
    steal."""


def _attribute(soak: list[_Row], med_rate: float, med_p99: float) -> None:
    """Say, for each minute off the steadiness bounds, whether the server did more work per
    message then (its cost went up: the server) or the machine had less to give it (other
    processes or the hypervisor took CPU while the server's cost per message stayed: the
    machine). The verdicts above stay as measured; this says where to look."""
    med_us = statistics.median(r.server_us for r in soak)
    med_out = statistics.median(r.outside for r in soak)
    for r in soak:
        if abs(r.rate - med_rate) <= 0.25 * med_rate and r.p99 <= 2 * med_p99:
            continue
        if r.server_us > 1.15 * med_us:
            why = "the server: more CPU per message than the median minute"
        elif r.outside >= med_out + 0.25:
            why = "the machine: CPU taken outside the soak, server cost per message unchanged"
        else:
            why = "not explained by CPU (server cost per message and outside CPU as usual)"
        print(
            f"  min {r.period}: {r.rate:,.0f} msg/s ({r.rate / med_rate - 1:+.0%}), p99 "
            f"{r.p99:.1f} ms ({r.p99 / med_p99:.1f}x); server {r.server_us:.1f} µs CPU per "
            f"message (median {med_us:.1f}); outside the soak {r.outside:.2f} cores incl. steal "
            f"(median {med_out:.2f}): {why}"
        )


def _report(
    a: argparse.Namespace,
    results: dict,
    samples: list[Sample],
    start: float,
    soak_start: float,
    until: float,
    alive: int,
    idle: int,
    silent_alive: int,
    silent: int,
) -> int:
    minutes = (until - soak_start) / 60
    errors = [e for r in results.values() for e in r[4]]

    # buckets: 0 = the baseline (no idle connections), k >= 1 = soak minute k
    def bucket(t: float) -> int:
        return 0 if t < soak_start else 1 + int((t - soak_start) // 60)

    n = 1 + int(minutes + 0.999)
    push_lat: list[list[float]] = [[] for _ in range(n + 1)]
    pull_lat: list[list[float]] = [[] for _ in range(n + 1)]
    for t_push, l_push, t_pull, l_pull, _ in results.values():
        for t, lat in zip(t_push, l_push, strict=True):
            if t <= until:  # a call in flight at the end finishes after it: not counted
                push_lat[min(bucket(t), n)].append(lat)
        for t, lat in zip(t_pull, l_pull, strict=True):
            if t <= until:
                pull_lat[min(bucket(t), n)].append(lat)

    def span(b: int) -> float:
        lo = start if b == 0 else soak_start + (b - 1) * 60
        hi = soak_start if b == 0 else min(soak_start + b * 60, soak_start + minutes * 60)
        return max(hi - lo, 1e-9)

    def at(b: int) -> list[Sample]:
        return [s for s in samples if bucket(start + s[0]) == b]

    def cpu(b: int) -> tuple[float, float, float]:
        """(server, outside the soak, steal) in cores over period ``b``: from the last
        sample before it to its last one."""
        sm = at(b)
        if not sm:
            return (float("nan"),) * 3
        before = [s for s in samples if s.t < sm[0].t]
        s0, s1 = (before[-1] if before else sm[0]), sm[-1]
        dt = s1.t - s0.t
        if dt <= 0:
            return (float("nan"),) * 3
        server = (s1.server_cpu - s0.server_cpu) / dt
        others = (s1.busy - s0.busy) / dt - server - (s1.soak_cpu - s0.soak_cpu) / dt
        return server, max(0.0, others), (s1.steal - s0.steal) / dt

    print(
        f"{'period':>10} {'push msg/s':>11} {'pull msg/s':>11} {'push p50/p99 ms':>16} "
        f"{'pull p50/p99 ms':>16} {'RSS MiB':>8} {'sockets':>7} {'files':>5} {'thr':>4} "
        f"{'probe max ms':>12} {'load':>5} {'srv µs/msg':>10} {'others':>6} {'steal':>5}"
    )
    rows = []
    for b in range(n + 1):
        if not push_lat[b]:
            continue
        sm = at(b)
        rss = sm[-1][1] / 2**20 if sm else float("nan")
        socks = sm[-1][2] if sm else -1
        files = max((s[3] for s in sm), default=-1)
        thr = sm[-1][4] if sm else -1
        probe = max((s[5] for s in sm), default=float("nan")) * 1000
        load = statistics.mean(s[6] for s in sm) if sm else float("nan")
        push_rate = len(push_lat[b]) * a.batch / span(b)
        pull_rate = len(pull_lat[b]) * a.batch / span(b)
        p = (_pct(push_lat[b], 0.5) * 1e3, _pct(push_lat[b], 0.99) * 1e3)
        q = (_pct(pull_lat[b], 0.5) * 1e3, _pct(pull_lat[b], 0.99) * 1e3)
        label = "baseline" if b == 0 else f"min {b}"
        full = b == 0 or span(b) >= 59
        server, others, steal = cpu(b)
        per_msg = server / push_rate * 1e6 if push_rate else float("nan")
        rows.append(_Row(b, push_rate, p[1], full, per_msg, others + steal))
        print(
            f"{label:>10} {push_rate:11,.0f} {pull_rate:11,.0f} {p[0]:7.1f} /{p[1]:7.1f} "
            f"{q[0]:7.1f} /{q[1]:7.1f} {rss:8.1f} {socks:7d} {files:5d} {thr:4d} {probe:12.1f} "
            f"{load:5.1f} {per_msg:10.1f} {others:6.2f} {steal:5.2f}",
            flush=True,
        )
    ok = True
    soak = [r for r in rows if r.period >= 1 and r.full]
    if errors:
        ok = False
        print(f"FAIL: {len(errors)} client errors, e.g. {errors[:3]}")
    if soak:
        med_rate = statistics.median(r.rate for r in soak)
        med_p99 = statistics.median(r.p99 for r in soak)
        steady_rate = all(abs(r.rate - med_rate) <= 0.25 * med_rate for r in soak)
        steady_p99 = all(r.p99 <= 2 * med_p99 for r in soak)
        base = [r for r in rows if r.period == 0]
        vs = f" (baseline without idle connections: {base[0].rate:,.0f} msg/s)" if base else ""
        print(
            f"throughput steady (each full minute within 25% of the median {med_rate:,.0f} "
            f"msg/s){vs}: {'yes' if steady_rate else 'NO'}"
        )
        print(f"p99 steady (each full minute <= 2x the median {med_p99:.1f} ms): "
              f"{'yes' if steady_p99 else 'NO'}")  # fmt: skip
        ok &= steady_rate and steady_p99
        _attribute(soak, med_rate, med_p99)
    first_min = [s for s in samples if 60 <= start + s[0] - soak_start < 70]
    if first_min and samples:
        r0, r1 = first_min[0][1], samples[-1][1]
        growth = (r1 - r0) / r0
        print(
            f"RSS: {r0 / 2**20:.1f} MiB after the first soak minute, {r1 / 2**20:.1f} MiB at the "
            f"end: {growth:+.1%} (limit +10%): {'ok' if growth <= 0.10 else 'NO'}"
        )
        ok &= growth <= 0.10
        # sockets: the clients' and idle connections (+ the probe's, when sampled) — constant;
        # files: segments, indexes and lake files come and go with rolls, seals and retention —
        # no growth from the first soak minute to the last
        live = [s for s in samples if start + s[0] >= soak_start + SAMPLE_S]
        sock_fds = [s[2] for s in live]
        # the max over a whole minute at each end: one retention cycle's swing either way
        first_files = max(s[3] for s in live if start + s[0] < soak_start + 60) if live else 0
        last_files = max(s[3] for s in live if start + s[0] >= until_of(samples, start) - 60)
        sock_ok = max(sock_fds) - min(sock_fds) <= 2
        file_ok = last_files <= first_files * 1.10 + 2
        print(
            f"socket fds with idle connections open: min {min(sock_fds)} max {max(sock_fds)} "
            f"({'constant' if sock_ok else 'NOT constant'}); file fds: at most {first_files} in "
            f"the first soak minute, {last_files} in the last "
            f"({'no growth' if file_ok else 'GROWING'})"
        )
        ok &= sock_ok and file_ok
    else:
        print("RSS/fds verdicts need at least one full soak minute (--minutes >= 1.2)")
    probes = [s[5] for s in samples]
    print(
        f"probe (new client: connect, push 1, pull 1): max {max(probes) * 1e3:.1f} ms, "
        f"median {statistics.median(probes) * 1e3:.1f} ms over {len(probes)} probes; "
        f"idle connections still open at the end: {alive}/{idle}; silent ones (no version "
        f"byte) closed by the server: {silent - silent_alive}/{silent}"
    )
    ok &= alive == idle and silent_alive == 0
    total = sum(len(r[0]) for r in results.values()) * a.batch
    print(f"{'OK' if ok else 'FAILED'}: {total:,} messages pushed and pulled back in total")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
