"""Abuse: each hostile-client attack against a real ``loglake serve``, beside a good client.

For every attack a fresh ``loglake serve`` (default limits unless ``--serve-arg`` adds some) is
started on a temp data dir holding a 12 MiB stream ``big`` (so a pull's reply is the full
8 MiB). A well-behaved client (this process) pushes one record and pulls it back, over and
over, for ``--seconds``; the attack runs in a separate process at the same time. Then, the
attack still running, the server gets SIGTERM and the time to exit is measured. Printed per
attack: the server's peak RSS and open descriptors (sampled from /proc every 50 ms), the good
client's p50/p99 round trip and rounds/s against the same client with no attack, the SIGTERM
exit time, and what the attack saw. Targets (docs/security.md): RSS ≤ 512 MiB, good client
≥ 50% of its unattacked rate and p99 ≤ 100 ms, SIGTERM ≤ 5 s, descriptors ≤ the connection
cap plus the log's files.

Attacks (issue "the stream service holds against hostile and careless clients"):
- ``puller``: 4 connections send pulls of 8 MiB replies and never read (one replaced by a new
  one every 2 s: a closed connection's queued work must go);
- ``partial``: 200 connections each announce a 32 MiB frame and send part of it, reconnecting
  when closed;
- ``stalled``: 600 connections, half silent after the version byte, half stopped mid-length,
  then 700 more (over the per-peer cap);
- ``create``: three anonymous CREATEs of 4,096 partitions (the storage side's fix);
- ``index``: another client's consumer index saved as 2^64-1 (the storage side's fix);
- ``badinput``: non-ASCII partition numbers, a 70 KB client id and stream name, in a loop.

Run: ``.venv/bin/python benchmarks/abuse.py`` (``--help``); loopback only, bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loglake.errors import DecodeError
from loglake.log import StreamConfig, open_log
from loglake.streams import codec
from loglake.streams.client import StreamClient
from loglake.streams.limits import MiB, ServerLimits
from loglake.streams.messages import (
    CreatePartitionedStreamRequest,
    Error,
    GetIndex,
    PullRequest,
    PushRequest,
    SaveIndex,
)
from loglake.wire.ockam import RoutingMessage, TcpConnection, encode_frame, route
from tests.procs import free_port, wait_port

RECORD = 256 * 1024
U64_MAX = 2**64 - 1


# -- the attacks (each in its own process, until ``until``) ----------------------------------
ATTACKER_HOST = "127.0.0.2"
"""Attacks come from another loopback address than the good client (127.0.0.1), as from
another machine: the per-peer connection cap is the attacker's, not the good client's."""


def _raw(port: int, rcvbuf: int | None = None, hello: bool = True) -> socket.socket:
    s = socket.socket()
    s.bind((ATTACKER_HOST, 0))
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    if hello:
        s.sendall(TcpConnection.initial_bytes())
    return s


def _frame(to: str, msg: object, protocol: str | None = None) -> bytes:
    return encode_frame(RoutingMessage(route(to), route("a"), codec.encode_payload(msg, protocol)))


def _ask(s: socket.socket, wire: TcpConnection, frame: bytes, n: int = 1) -> list:
    s.sendall(frame)
    got: list = []
    while len(got) < n:
        data = s.recv(1 << 20)
        if not data:
            break
        got += wire.receive_data(data)
    return got


def attack_puller(port: int, until: float, out) -> None:
    pulls = b"".join(_frame("stream_service/big/0", PullRequest(i, 0, 100)) for i in range(2000))
    socks: list[socket.socket] = []
    sent = replaced = 0
    last = time.monotonic()
    while time.monotonic() < until:
        while len(socks) < 4:
            s = _raw(port, rcvbuf=4096)
            s.setblocking(False)
            socks.append([s, 0])  # type: ignore[arg-type]
        for entry in socks:
            s, off = entry  # type: ignore[misc]
            with contextlib.suppress(BlockingIOError, OSError):
                n = s.send(pulls[off : off + 65536])
                entry[1] = (off + n) % len(pulls)  # type: ignore[index]
                sent += n
        if time.monotonic() - last > 2:  # a client that leaves: its queued pulls must go
            socks.pop(0)[0].close()  # type: ignore[index]
            replaced += 1
            last = time.monotonic()
        time.sleep(0.01)
    out.put(f"sent {sent / MiB:.1f} MiB of pulls on 4 connections, {replaced} replaced")


def attack_partial(port: int, until: float, out) -> None:
    head = (32 * MiB).to_bytes(4, "big")
    chunk = b"\0" * (1 * MiB)
    socks: dict[int, list] = {}
    closed = sent = 0
    while time.monotonic() < until:
        for k in range(200):
            entry = socks.get(k)
            if entry is None:
                try:
                    s = _raw(port)
                    s.sendall(head)
                except OSError:
                    continue
                s.setblocking(False)
                socks[k] = entry = [s, 0]
            s, off = entry
            if off >= 31 * MiB:  # never completes the frame
                continue
            try:
                n = s.send(chunk)
                entry[1] += n
                sent += n
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                del socks[k]
                closed += 1
            if time.monotonic() >= until:
                break
        time.sleep(0.02)
    out.put(f"sent {sent / MiB:.0f} MiB of partial frames; server closed {closed} connections")


def attack_stalled(port: int, until: float, out) -> None:
    socks = []
    refused = 0
    for k in range(1300):
        try:
            s = _raw(port, hello=k % 2 == 0)
            if k % 2:
                s.sendall(b"\x01\x00\x00")  # version byte, then half a length
            socks.append(s)
        except OSError:
            refused += 1
        if time.monotonic() >= until:
            break
    time.sleep(0.5)
    closed = 0
    while time.monotonic() < until - 1.0:  # counted before the server gets SIGTERM
        time.sleep(0.1)
    for s in socks:  # what the server closed by now (it sends a version byte first)
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            try:
                while s.recv(16):
                    pass
                closed += 1
            except OSError as e:
                closed += not isinstance(e, BlockingIOError)
    out.put(f"opened {len(socks)} silent/stalled connections ({refused} refused at connect); "
            f"{closed} closed by the server")  # fmt: skip


def attack_create(port: int, until: float, out) -> None:
    results = []
    for name in ("huge_a", "huge_b", "huge_c"):
        s = _raw(port)
        wire = TcpConnection()
        s.settimeout(60)
        try:
            got = _ask(
                s, wire, _frame("stream_service", CreatePartitionedStreamRequest(name, 4096))
            )
            try:  # an Error, or the first worker's CreatePartitionedStreamResponse
                res = codec.decode_response(got[0].payload, Error) if got else None
            except (KeyError, DecodeError):
                res = None
            ok = not isinstance(res, Error) or res is None
            results.append("ok" if ok else f"error: {res.reason[:60]}")  # type: ignore[union-attr]
        except Exception as e:
            results.append(f"{type(e).__name__}")
        s.close()
    while time.monotonic() < until:
        time.sleep(0.1)
    out.put("CREATE 4096 partitions x3: " + "; ".join(results))


def attack_index(port: int, until: float, out) -> None:
    time.sleep(1.0)  # the good client has made its stream and consumer by then
    s = _raw(port)
    wire = TcpConnection()
    s.settimeout(10)
    got = _ask(s, wire, _frame("stream_index_service", SaveIndex("good-consumer", "good", U64_MAX)))
    from loglake.streams.messages import Index

    res = codec.decode_response(got[0].payload, Index) if got else None
    got = _ask(s, wire, _frame("stream_index_service", GetIndex("good-consumer", "good")))
    after = codec.decode_response(got[0].payload, Index) if got else None
    s.close()
    while time.monotonic() < until:
        time.sleep(0.1)
    out.put(f"save 2^64-1 for another's consumer: {res}; its index now {after}")


def attack_badinput(port: int, until: float, out) -> None:
    from loglake.streams.messages import Index, PushConfirm

    s = _raw(port)
    wire = TcpConnection()
    s.settimeout(10)
    asks = [
        (_frame("stream_service/big/٣", PushRequest(1, b"x")), PushConfirm),
        (_frame("stream_service/big/３", PushRequest(1, b"x")), PushConfirm),
        (_frame("stream_service/big/³", PushRequest(1, b"x")), PushConfirm),
        (_frame("stream_index_service", GetIndex("c" * 70_000, "big")), Index),
        (_frame("stream_index_service", GetIndex("c", "s" * 70_000)), Index),
    ]
    n = internal = accepted = 0
    while time.monotonic() < until:
        for frame, expect in asks:
            try:
                got = _ask(s, wire, frame)
            except OSError:
                got = []
            if not got:  # the server stopped (SIGTERM at the end of the run)
                until = 0.0
                break
            res = codec.decode_response(got[0].payload, expect)
            n += 1
            if isinstance(res, Error):
                internal += res.reason.startswith("internal error")
            else:
                accepted += 1
    s.close()
    out.put(f"{n} bad requests: {internal} internal errors, {accepted} accepted")


ATTACKS = {
    "puller": attack_puller,
    "partial": attack_partial,
    "stalled": attack_stalled,
    "create": attack_create,
    "index": attack_index,
    "badinput": attack_badinput,
}


# -- measuring ----------------------------------------------------------------------------
class Sampler(threading.Thread):
    """The server's RSS and open descriptors every 50 ms (peaks)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.rss, self.fds = pid, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        self.rss = max(self.rss, int(line.split()[1]) * 1024)
                self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
            time.sleep(0.05)


def good_client(port: int, seconds: float) -> tuple[list[float], float]:
    """Push one record, pull it back, for ``seconds``: the round trips and the rounds/s."""
    lat: list[float] = []
    with StreamClient(port=port, timeout=30) as c:
        c.create_stream("good")
        c.save_index("good-consumer", "good", 0)
        t0 = time.perf_counter()
        i = 0
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            idx = c.push("good", b"good %d" % i)
            assert c.pull("good", idx, 1)[0].data == b"good %d" % i
            lat.append(time.perf_counter() - t)
            i += 1
        took = time.perf_counter() - t0
    return lat, len(lat) / took


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def _cap_memory() -> None:
    """In the child before ``exec``: an address-space cap, so a server without the limits
    (``--server-src`` of an older revision) fails instead of taking the machine's memory."""
    import resource

    cap = 3 * 1024 * MiB
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def run_one(
    attack: str | None, seconds: float, serve_args: list[str], server_src: str | None = None
) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="loglake-abuse-"))
    log = open_log(tmp / "data")
    log.create_stream("big", StreamConfig(durability="none"))
    log.append_payloads("big", [bytes([i]) * RECORD for i in range(48)])
    log.close()
    port = free_port()
    cmd = [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(tmp / "data"),
           "--port", str(port), *serve_args]  # fmt: skip
    errlog = open(tmp / "serve.log", "wb")  # noqa: SIM115 - closed below
    env = dict(os.environ)
    if server_src:  # e.g. `git archive REV src | tar -x -C DIR`, then DIR/src
        env["PYTHONPATH"] = server_src
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=errlog, env=env, preexec_fn=_cap_memory
    )
    row: dict = {"attack": attack or "(none)"}
    try:
        wait_port(port, proc)
        sampler = Sampler(proc.pid)
        sampler.start()
        q: mp.Queue = mp.Queue()
        until = time.monotonic() + seconds + 1.5  # the attack outlives the good client's run
        child = None
        if attack:
            child = mp.Process(target=ATTACKS[attack], args=(port, until, q), daemon=True)
            child.start()
            time.sleep(0.5)  # the attack under way before the good client starts
        try:
            lat, rate = good_client(port, seconds)
            row.update(p50=_pct(lat, 0.5), p99=_pct(lat, 0.99), rate=rate, error="")
        except Exception as e:
            row.update(p50=float("nan"), p99=float("nan"), rate=0.0, error=repr(e)[:80])
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
            row["sigterm"] = time.monotonic() - t
        except subprocess.TimeoutExpired:
            row["sigterm"] = float("inf")
            proc.kill()
            proc.wait()
        sampler.stop.set()
        sampler.join()
        row.update(rss=sampler.rss, fds=sampler.fds)
        if child is not None:
            with contextlib.suppress(Exception):
                row["saw"] = q.get(timeout=max(1.0, until - time.monotonic() + 5))
            child.join(5)
            if child.is_alive():
                child.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        errlog.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="each attack's run (max 60)")
    ap.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `serve` argument")
    ap.add_argument(
        "--server-src",
        help="run the server from this source folder (an older revision's src/, for a before "
        "figure); every server is capped at 3 GiB of address space",
    )
    a = ap.parse_args()
    seconds = min(max(a.seconds, 2.0), 60.0)
    limits = ServerLimits()
    base = run_one(None, seconds, a.serve_arg, a.server_src)
    rows = [base] + [
        run_one(x, seconds, a.serve_arg, a.server_src) for x in a.attacks.split(",") if x
    ]
    print(f"abuse: {seconds:g} s per attack, loglake serve {' '.join(a.serve_arg)} (default "
          f"limits: connections {limits.max_connections}, {limits.max_connections_per_peer} per "
          f"peer)")  # fmt: skip
    head = f"{'attack':<10} {'RSS MiB':>8} {'fds':>6} {'p50 ms':>7} {'p99 ms':>7} "
    print(head + f"{'rounds/s':>9} {'vs none':>8} {'SIGTERM s':>9}  targets")
    failed = 0
    for r in rows:
        ratio = r["rate"] / base["rate"] if base["rate"] else float("nan")
        misses = []
        if r["rss"] > 512 * MiB:
            misses.append("RSS")
        if r["attack"] != "(none)" and not ratio >= 0.5:
            misses.append("throughput")
        if not r["p99"] <= 0.1:
            misses.append("p99")
        if not r["sigterm"] <= 5.0:
            misses.append("SIGTERM")
        if r["fds"] > limits.max_connections + 128:
            misses.append("fds")
        failed += bool(misses)
        print(f"{r['attack']:<10} {r['rss'] / MiB:>8.0f} {r['fds']:>6} {r['p50'] * 1e3:>7.1f} "
              f"{r['p99'] * 1e3:>7.1f} {r['rate']:>9.0f} {ratio:>8.2f} {r['sigterm']:>9.2f}  "
              f"{'missed: ' + ', '.join(misses) if misses else 'met'}")  # fmt: skip
        for key in ("saw", "error"):
            if r.get(key):
                print(f"{'':<10} {key}: {r[key]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
