"""A NATS monitoring endpoint (``[streams] nats_monitor``) answering ``/jsz`` with valid JSON of
the wrong shape — a list where a name goes, a number past any int, ``replicas`` not a list, a
replica's name an object. Before: ``read_meta`` raised (TypeError, OverflowError, a pydantic
ValidationError) and ``ClusterView`` let it through, so ``GET /api/cluster`` and the whole
``/metrics`` scrape were 500s. Now each is that monitor's error, the rest of the view as before.
Real HTTP servers and a real nats-server on loopback; every wait bounded."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loglake.node import cluster
from tests.conftest import require_peer
from tests.nats_cluster import NATS_HINT, NatsCluster, have_nats_server
from tests.node.conftest import background_node
from tests.waiting import wait_until

R2 = '{"name": "n2", "lag": %s}'
GOOD = {"meta_cluster": {"leader": "n1", "replicas": [{"name": "n2", "current": True, "lag": 3}]}}
BAD = {
    "leader is a list": {"meta_cluster": {"leader": ["n1"], "replicas": []}},
    "lag is 1e400": '{"meta_cluster": {"leader": "n1", "replicas": [%s]}}' % (R2 % "1e400"),
    "lag past int64": {"meta_cluster": {"replicas": [{"name": "n2", "lag": 10**400}]}},
    "replicas is a number": {"meta_cluster": {"leader": "n1", "replicas": 5}},
    "replica name is a dict": {"meta_cluster": {"leader": "n1", "replicas": [{"name": {"a": 1}}]}},
    "replica is a string": {"meta_cluster": {"leader": "n1", "replicas": ["n2"]}},
    "active is huge": {"meta_cluster": {"replicas": [{"name": "n2", "active": 10**400}]}},
    "cluster_size is text": {"meta_cluster": {"leader": "n1", "cluster_size": "3"}},
}


class _Jsz(http.server.BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:
        body = type(self).body
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def monitor() -> Iterator[tuple[str, type[_Jsz]]]:
    handler = type("Jsz", (_Jsz,), {"body": json.dumps(GOOD).encode()})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", handler
    finally:
        srv.shutdown()
        srv.server_close()


def _body(shape: object) -> bytes:
    return (shape if isinstance(shape, str) else json.dumps(shape)).encode()


@pytest.mark.parametrize("label", list(BAD))
def test_a_monitor_of_the_wrong_shape_is_that_monitors_error(
    monitor: tuple[str, type[_Jsz]], label: str
) -> None:
    url, handler = monitor
    handler.body = _body(BAD[label])
    meta = cluster.read_meta((url,))
    assert meta is not None and meta.leader is None and meta.peers == []
    assert meta.monitors[url].startswith("not a NATS monitoring endpoint ("), meta.monitors


def test_a_well_formed_monitor_is_read_as_before(monitor: tuple[str, type[_Jsz]]) -> None:
    url, _ = monitor
    meta = cluster.read_meta((url,))
    assert meta is not None and meta.monitors == {url: "ok"} and meta.leader == "n1"
    assert [(p.name, p.leader, p.lag) for p in meta.peers] == [("n1", True, 0), ("n2", False, 3)]


@pytest.mark.slow
def test_the_cluster_page_and_the_scrape_survive_a_monitor_of_the_wrong_shape(
    monitor: tuple[str, type[_Jsz]], tmp_path: Path
) -> None:
    require_peer("nats-server", have_nats_server(), NATS_HINT)
    url, handler = monitor
    one = NatsCluster(1).start()
    node = None
    try:
        node = background_node(
            one.url, tmp_path / "n", "shape" + uuid.uuid4().hex[:6], nats_monitor=url
        )
        api = httpx.Client(
            base_url=node.url, headers={"Authorization": f"Bearer {node.token}"}, timeout=30
        )
        with api:
            for label in ("leader is a list", "lag is 1e400", "replica name is a dict"):
                handler.body = _body(BAD[label])

                def says_so(label: str = label) -> bool:  # past the status cache (CACHE_S)
                    r = api.get("/api/cluster")
                    assert r.status_code == 200, (label, r.text)
                    got = r.json()["meta"]["monitors"][url]
                    return got.startswith("not a NATS monitoring endpoint")

                wait_until(says_so, 10)
                m = api.get("/metrics")
                assert m.status_code == 200, (label, m.text[:300])
                assert "loglake_jetstream_reachable 1.0" in m.text
    finally:
        if node is not None:
            node.stop()
        one.close()
