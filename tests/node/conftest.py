"""Fixtures of the node's tests: an in-process node (the real app around a real ``SegmentLog`` in a
temp dir) for API tests; a 3-server JetStream cluster for a module (``nats3``); and ``loglake
node`` processes on it — ``NodeProcess`` and ``started_pair``, two nodes sharing one history."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from fastapi.testclient import TestClient

from loglake.log import Log, open_log
from loglake.node.api.context import NodeContext
from loglake.node.app import create_app
from loglake.node.config import load_config
from loglake.node.metrics import InstrumentedLog, NodeMetrics
from tests.conftest import require_peer
from tests.nats_cluster import NATS_HINT, NatsCluster, have_nats_server
from tests.procs import free_port, process
from tests.waiting import wait_until

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class ApiNode:
    client: TestClient
    """Sends the token on every request."""
    anonymous: TestClient
    log: Log
    node: NodeContext


@pytest.fixture
def api_node(tmp_path: Path) -> Iterator[ApiNode]:
    metrics = NodeMetrics()
    log = InstrumentedLog(open_log(tmp_path), metrics)
    node = NodeContext(log=log, data_dir=tmp_path, metrics=metrics)
    metrics.attach(node)
    app = create_app(node, token=TOKEN, console=False)
    try:
        with TestClient(app, headers=AUTH) as c, TestClient(app) as anon:
            yield ApiNode(c, anon, log, node)
    finally:
        log.close()


def background_node(url: str, data_dir: Path, prefix: str, **streams: Any) -> Any:
    """An in-process node (``BackgroundNode``, started) on the JetStream ``url`` under
    ``prefix``: R3 on a 3-server URL, else R1; leases of 2 s; ``streams`` adds ``[streams]``
    options. Stop it with ``.stop()``."""
    from loglake.node.runner import BackgroundNode

    cfg = load_config(
        data={
            "data_dir": str(data_dir),
            "http": {"port": 0},
            "streams": {
                "port": 0,
                "backend": url,
                "replicas": 3 if url.count(",") >= 2 else 1,
                "nats_prefix": prefix,
                "lease_ttl": 2,
                **streams,
            },
        },
        env={},
    )
    return BackgroundNode(cfg, say=lambda _: None).start()


@pytest.fixture(scope="module")
def nats3() -> Iterator[NatsCluster]:
    """Three JetStream servers on loopback (the product's ``LocalNatsCluster``), one per module:
    some tests kill and restart a server, so a module's tests share it, not the session's."""
    require_peer("nats-server", have_nats_server(), NATS_HINT)
    c = NatsCluster(3).start()
    yield c
    c.close()


EVENTS_NS = "demo.events"
"""The namespace the ICRC roles of a ``NodeProcess`` serve."""


class NodeProcess:
    """A ``loglake node --backend … --replicas 3`` process (started by ``process(n.cmd, …)``)
    with the ICRC roles on ``EVENTS_NS``, leases of ``ttl`` seconds and a replay pace of
    ``rate`` events a second (0: none); the other parts off unless a test adds them."""

    def __init__(
        self, root: Path, name: str, url: str, prefix: str, rate: float, ttl: float = 2
    ) -> None:
        self.data = root / name
        self.http, self.stream_port = free_port(), free_port()
        self.cmd = [
            sys.executable, "-m", "loglake.cli", "node", "--no-console",
            "--data-dir", str(self.data), "--http-port", str(self.http),
            "--streams-port", str(self.stream_port),
            "--backend", url, "--replicas", "3", "--streams-nats-prefix", prefix,
            "--streams-lease-ttl", str(ttl), "--streams-seal-interval", "0.5",
            "--events-enabled", "--events-namespaces", EVENTS_NS,
            "--events-replay-rate", str(rate),
            "--no-archives-enabled", "--no-sds-enabled", "--no-jobs-enabled",
        ]  # fmt: skip
        self.api: httpx.Client | None = None

    def log(self) -> IO[Any]:
        """The node's stderr, kept in a file beside its data dir (read it when a test fails)."""
        return (self.data.parent / f"{self.data.name}.stderr").open("w")

    def connect(self) -> httpx.Client:
        token = (self.data / "node.token").read_text().strip()
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.http}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        return self.api

    def publish(self, texts: list[str]) -> httpx.Response:
        assert self.api is not None
        return self.api.post(f"/api/events/namespaces/{EVENTS_NS}/events", json={"texts": texts})

    def holds_events(self) -> bool:
        """Whether this node runs the ICRC roles now (another holding the journal: 503); a
        probe event is published when it does."""
        r = self.publish(["probe"])
        assert r.status_code in (200, 503), r.text
        return r.status_code == 200


@contextlib.contextmanager
def started_pair(
    a: NodeProcess, b: NodeProcess, before_b: Callable[[], None] | None = None
) -> Iterator[Any]:
    """A started, holding the ICRC roles; then B (the same identities: the keys are in the
    cluster's key bucket; and whatever ``before_b`` does), refusing what A holds. Yields A's
    process (a test kills or stops it); both are stopped at the end."""
    with process(a.cmd, a.http, stderr=a.log()) as proc_a:
        a.connect()
        wait_until(a.holds_events, 15, "node A runs the ICRC roles")
        if before_b is not None:
            before_b()
        with process(b.cmd, b.http, stderr=b.log()):
            b.connect()
            yield proc_a
