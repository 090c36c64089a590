"""An operator's reset and delete of a consumer's index over the node's HTTP API: through the
app with a real log (status codes, typed errors, the owner shown), and against a real node
process whose stream service a real client uses — a consumer stuck at 2^64-1 is un-stuck."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from loglake.streams import StreamClient
from tests.node.conftest import ApiNode
from tests.procs import free_port, process

TOP = 2**64 - 1


def test_reset_and_delete_a_consumer(api_node: ApiNode) -> None:
    c = api_node.client
    c.post("/api/streams", json={"name": "s", "partitions": 2})
    api_node.log.save_index_as("billing", "s", TOP, "cn:bob", partition=1)
    [row] = c.get("/api/streams/s/consumers").json()
    assert (row["index"], row["owner"]) == (TOP, "cn:bob")
    r = c.post("/api/streams/s/consumers/reset", json={"client_id": "billing", "partition": 1})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "client_id": "billing",
        "stream": "s",
        "partition": 1,
        "before": TOP,
        "index": 0,
    }
    [row] = c.get("/api/consumers").json()
    assert (row["index"], row["owner"]) == (0, "cn:bob")  # a reset keeps the owner
    r = c.post("/api/streams/s/consumers/delete", json={"client_id": "billing", "partition": 1})
    assert r.status_code == 200 and r.json()["before"] == 0 and r.json()["index"] is None
    assert c.get("/api/consumers").json() == []


def test_reset_errors_are_typed_and_need_the_token(api_node: ApiNode) -> None:
    c = api_node.client
    c.post("/api/streams", json={"name": "s"})
    body = {"client_id": "x"}
    r = c.post("/api/streams/nope/consumers/reset", json=body)
    assert r.status_code == 404 and r.json()["error"] == "UnknownStream"
    r = c.post("/api/streams/s/consumers/reset", json={**body, "partition": 3})
    assert r.status_code == 404 and r.json()["error"] == "UnknownPartition"
    for bad in ({}, {"client_id": ""}, {**body, "index": -1}, {**body, "index": 2**64}):
        r = c.post("/api/streams/s/consumers/reset", json=bad)
        assert r.status_code == 422, (bad, r.text)
    r = c.post("/api/streams/s/consumers/delete", json={"client_id": "x", "partition": "a"})
    assert r.status_code == 422
    for path in ("/api/streams/s/consumers/reset", "/api/streams/s/consumers/delete"):
        r = api_node.anonymous.post(path, json=body)
        assert r.status_code == 401


@pytest.mark.slow
def test_a_real_node_unsticks_a_consumer_stuck_at_the_top(tmp_path: Path) -> None:
    http_port, stream_port = free_port(), free_port()
    cfg = tmp_path / "loglake.toml"
    cfg.write_text(
        f'data_dir = "{tmp_path / "data"}"\nconsole = false\n'
        f"[http]\nport = {http_port}\n[streams]\nport = {stream_port}\n"
    )
    cmd = [sys.executable, "-m", "loglake.cli", "node", "--config", str(cfg)]
    out = tmp_path / "node.out"
    with out.open("wb") as f, process(cmd, http_port, stdout=f, stderr=subprocess.STDOUT):
        token = (tmp_path / "data" / "node.token").read_text().strip()
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{http_port}", headers={"Authorization": f"Bearer {token}"}
        )
        with StreamClient(port=stream_port, timeout=10) as c:
            c.create_stream("orders")
            c.push_many("orders", [b"a", b"b", b"c"])
            c.save_index("billing", "orders", TOP)  # any client may: no authentication
            assert c.save_index("billing", "orders", 2) == TOP  # stuck
            r = api.post("/api/streams/orders/consumers/reset", json={"client_id": "billing"})
            assert r.status_code == 200 and r.json()["before"] == TOP
            assert c.save_index("billing", "orders", 2) == 2
            [row] = api.get("/api/consumers").json()
            assert (row["index"], row["lag"]) == (2, 1)
    banner = " ".join(out.read_text().split())
    assert "any client can save, and so move, any consumer's index" in banner
