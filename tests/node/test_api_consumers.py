"""An operator's reset and delete of a consumer's index over the node's HTTP API: through the
app with a real log (status codes, typed errors, the owner shown), and against a real node
process whose stream service a real client uses — a consumer stuck at 2^64-1 is un-stuck."""

from __future__ import annotations

import base64
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


def test_consumer_lists_are_paged_with_a_total(api_node: ApiNode) -> None:
    """520 saved indexes with 200-character client ids (anyone may save them over the stream
    service): a list answers a page (500 by default) with the total and the next page's cursor
    in headers. Before: every row in one answer (the reviewer's 20,000 with 1,024-character
    ids: 22 MB, polled by the console every 2 s)."""
    c, log = api_node.client, api_node.log
    c.post("/api/streams", json={"name": "s"})
    log.append_payloads("s", [b"x"] * 10)
    ids = [f"{i:05d}" + "A" * 195 for i in range(520)]
    for i, cid in enumerate(ids):
        log.save_index(cid, "s", i % 10)
    for path in ("/api/consumers", "/api/streams/s/consumers"):
        r = c.get(path)
        assert r.status_code == 200 and len(r.json()) == 500, len(r.json())
        assert r.headers["X-Total-Count"] == "520"
        seen = [row["client_id"] for row in r.json()]
        while "X-Next-After" in r.headers:
            r = c.get(path, params={"after": r.headers["X-Next-After"], "limit": 7})
            assert r.status_code == 200 and r.headers["X-Total-Count"] == "520"
            seen += [row["client_id"] for row in r.json()]
        assert seen == ids  # every row once, in client order
    # the console's view: the most behind first (one page: test_the_lag_order_is_one_page…)
    r = c.get("/api/consumers", params={"order": "lag", "limit": 5})
    assert [row["lag"] for row in r.json()] == [10] * 5
    assert [row["client_id"] for row in r.json()] == ids[0:50:10]
    deep = base64.urlsafe_b64encode(b"[" * 12_000).decode()
    for bad in ("nope", "WzFd", "!!", deep):
        r = c.get("/api/consumers", params={"after": bad})
        assert r.status_code == 400, (bad, r.text)
    for bad_limit in (0, 5001):
        assert c.get("/api/consumers", params={"limit": bad_limit}).status_code == 422


def test_a_short_consumer_list_is_answered_as_before(api_node: ApiNode) -> None:
    c = api_node.client
    c.post("/api/streams", json={"name": "s"})
    api_node.log.save_index("b", "s", 0)
    api_node.log.save_index("a", "s", 0)
    r = c.get("/api/consumers")
    assert [row["client_id"] for row in r.json()] == ["a", "b"]
    assert r.headers["X-Total-Count"] == "2" and "X-Next-After" not in r.headers


def test_consumer_lists_filter_by_client_id_or_stream(api_node: ApiNode) -> None:
    """``contains`` finds a consumer the most-behind view leaves out: 200 index-0 consumers on
    a long stream (anyone may save them) filled the console's top 200 and hid the real one."""
    c, log = api_node.client, api_node.log
    c.post("/api/streams", json={"name": "orders"})
    c.post("/api/streams", json={"name": "0junk"})
    log.append_payloads("orders", [b"x"] * 3)
    log.append_payloads("0junk", [b"y"] * 200)
    log.save_index("billing", "orders", 1)
    for i in range(200):
        log.save_index(f"fake{i:03d}", "0junk", 0)
    top = c.get("/api/consumers", params={"order": "lag", "limit": 200})
    assert "billing" not in {row["client_id"] for row in top.json()}
    for needle in ("BILL", "order"):  # the client id or the stream, case-insensitive
        r = c.get("/api/consumers", params={"order": "lag", "limit": 200, "contains": needle})
        assert r.status_code == 200, r.text
        assert [row["client_id"] for row in r.json()] == ["billing"]
        assert r.headers["X-Total-Count"] == "1"
    r = c.get("/api/consumers", params={"contains": "fake19", "limit": 4})
    assert [row["client_id"] for row in r.json()] == [f"fake{i}" for i in range(190, 194)]
    assert r.headers["X-Total-Count"] == "10"
    r = c.get(
        "/api/consumers",
        params={"contains": "fake19", "limit": 4, "after": r.headers["X-Next-After"]},
    )
    assert [row["client_id"] for row in r.json()] == [f"fake{i}" for i in range(194, 198)]
    # one stream's list: its name is not matched (every row would be), the client id is
    r = c.get("/api/streams/0junk/consumers", params={"contains": "junk"})
    assert r.json() == [] and r.headers["X-Total-Count"] == "0"
    r = c.get("/api/streams/0junk/consumers", params={"contains": "fake007"})
    assert [row["client_id"] for row in r.json()] == ["fake007"]
    assert c.get("/api/consumers", params={"contains": "x" * 201}).status_code == 422


def test_the_lag_order_is_one_page_and_refuses_a_cursor(api_node: ApiNode) -> None:
    """``order=lag`` is a top-N view: its key moves as records are pushed, so a keyset cursor
    skipped the rows whose lag rose past it between two pages (the reviewer's 11 consumers,
    paged 2 at a time with pushes between pages, came back as fewer). It gives no cursor now,
    and ``after`` with it is a 400 saying to page by client id."""
    c, log = api_node.client, api_node.log
    c.post("/api/streams", json={"name": "s"})
    log.append_payloads("s", [b"x"] * 10)
    for i in range(5):
        log.save_index(f"c{i}", "s", i)
    r = c.get("/api/consumers", params={"order": "lag", "limit": 2})
    assert [row["client_id"] for row in r.json()] == ["c0", "c1"]
    assert r.headers["X-Total-Count"] == "5" and "X-Next-After" not in r.headers
    by_client = c.get("/api/consumers", params={"limit": 2})
    for path in ("/api/consumers", "/api/streams/s/consumers"):
        r = c.get(path, params={"order": "lag", "after": by_client.headers["X-Next-After"]})
        assert r.status_code == 400, r.text
        assert "order=client" in r.text
