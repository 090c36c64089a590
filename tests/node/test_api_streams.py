"""The streams and consumers API against a real log: what a caller sees, and typed errors."""

from __future__ import annotations

import base64

from loglake.log import open_log
from tests.node.conftest import ApiNode


def test_create_list_info_and_partition_stats(api_node: ApiNode) -> None:
    c = api_node.client
    r = c.post("/api/streams", json={"name": "orders", "partitions": 3, "durability": "batch"})
    assert r.status_code == 201
    assert r.json()["config"]["durability"] == "batch"
    assert c.post("/api/streams", json={"name": "orders", "partitions": 3}).status_code == 200
    api_node.log.append_payloads("orders", [b"a", b"bb", b"ccc"], partition=2)
    [row] = c.get("/api/streams").json()
    assert (row["name"], row["partitions"], row["records"], row["pushed_records"]) == (
        "orders",
        3,
        3,
        3,
    )
    parts = c.get("/api/streams/orders/partitions").json()
    assert [p["next_index"] for p in parts] == [0, 0, 3]
    assert parts[2]["fsyncs"] >= 1 and parts[2]["storage_failed"] is None
    assert c.get("/api/streams/orders").json()["partition_stats"] == parts


def test_create_with_more_partitions_grows_the_stream_as_the_stream_service_does(
    api_node: ApiNode,
) -> None:
    """POST of an existing stream with more partitions grows it, as a CREATE over the stream
    service does (the Ockam reference's ``ensure_streams``); with fewer it is left as it is.
    Both were a 409 before."""
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    c = api_node.client
    assert c.post("/api/streams", json={"name": "s", "partitions": 2}).status_code == 201
    api_node.log.append_payloads("s", [b"a", b"b"], partition=1)
    r = c.post("/api/streams", json={"name": "s", "partitions": 4})
    assert r.status_code == 200, r.text
    assert r.json()["config"]["partitions"] == 4 and r.json()["partitions"] == 4
    assert [p["next_index"] for p in r.json()["partition_stats"]] == [0, 2, 0, 0]
    r = c.post("/api/streams", json={"name": "s", "partitions": 1})
    assert r.status_code == 200 and r.json()["partitions"] == 4
    assert c.post("/api/streams", json={"name": "s"}).json()["partitions"] == 4
    # the stream service, on the node's log, now sees the 4 partitions and the old records
    with (
        BackgroundServer(StreamService(api_node.log), port=0) as srv,
        StreamClient(port=srv.port) as sc,
    ):
        assert sc.partitions("s") == 4
        assert [m.data for m in sc.pull("s", 0, 10, partition=1)] == [b"a", b"b"]
        assert sc.push("s", b"x", partition=3) == 0
    parts = c.get("/api/streams/s/partitions").json()
    assert [p["next_index"] for p in parts] == [0, 2, 0, 1]


def test_read_a_range_gives_raw_bytes_index_and_size(api_node: ApiNode) -> None:
    c = api_node.client
    c.post("/api/streams", json={"name": "raw"})
    payloads = [bytes([i]) * (i + 1) for i in range(10)]
    api_node.log.append_payloads("raw", payloads)
    page = c.get("/api/streams/raw/partitions/0/records", params={"start": 3, "limit": 4}).json()
    assert [r["index"] for r in page["records"]] == [3, 4, 5, 6]
    assert [base64.b64decode(r["data"]) for r in page["records"]] == payloads[3:7]
    assert [r["size"] for r in page["records"]] == [4, 5, 6, 7]
    assert page["next"] == 7 and page["next_index"] == 10 and not page["truncated"]
    end = c.get("/api/streams/raw/partitions/0/records", params={"start": 10}).json()
    assert end["records"] == [] and end["next"] == 10


def test_consumers_and_lag(api_node: ApiNode) -> None:
    c = api_node.client
    c.post("/api/streams", json={"name": "s", "partitions": 2})
    api_node.log.append_payloads("s", [b"x"] * 5, partition=1)
    api_node.log.save_index("billing", "s", 2, partition=1)
    want = {"client_id": "billing", "stream": "s", "partition": 1, "index": 2}
    [row] = c.get("/api/consumers").json()
    assert row == {**want, "next_index": 5, "lag": 3, "owner": None}
    assert c.get("/api/streams/s/consumers").json() == [row]


def test_unknown_things_are_404_with_a_json_body(api_node: ApiNode) -> None:
    c = api_node.client
    c.post("/api/streams", json={"name": "s"})
    for path, kind in (
        ("/api/streams/nope", "UnknownStream"),
        ("/api/streams/nope/consumers", "UnknownStream"),
        ("/api/streams/s/partitions/7/records", "UnknownPartition"),
        ("/api/no-such-route", "HTTPError"),
    ):
        r = c.get(path)
        assert r.status_code == 404 and r.json()["error"] == kind, (path, r.text)


def test_bad_requests_are_4xx_naming_the_field(api_node: ApiNode) -> None:
    c = api_node.client
    r = c.post("/api/streams", json={"name": "a/b"})
    assert r.status_code == 422 and r.json()["message"].startswith("body.name")
    r = c.post("/api/streams", json={"name": "s", "partitions": 0})
    assert r.status_code == 422 and "partitions" in r.json()["message"]
    # 2**62 ms was taken: past int64 once nanoseconds (JetStream's max_age)
    r = c.post("/api/streams", json={"name": "s", "retention_ms": 2**62})
    assert r.status_code == 422 and "retention_ms" in r.json()["message"]
    r = c.get("/api/streams/s/partitions/0/records", params={"limit": 0})
    assert r.status_code == 422


def test_no_token_or_a_wrong_one_is_401(api_node: ApiNode) -> None:
    anon = api_node.anonymous
    for path in ("/api/streams", "/api/node", "/api/consumers", "/metrics"):
        r = anon.get(path)
        assert r.status_code == 401 and r.json()["error"] == "HTTPError", path
        assert r.headers["www-authenticate"] == "Bearer"
        wrong = anon.get(path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    assert anon.get("/openapi.json").status_code == 200  # the schema holds no data


def test_metrics_can_be_public_on_request(tmp_path) -> None:
    """``metrics_public``: a scraper without the token reads /metrics; /api still needs it."""
    from fastapi.testclient import TestClient

    from loglake.log import open_log
    from loglake.node.api.context import NodeContext
    from loglake.node.app import create_app
    from loglake.node.metrics import InstrumentedLog, NodeMetrics

    metrics = NodeMetrics()
    with open_log(tmp_path) as raw:
        log = InstrumentedLog(raw, metrics)
        node = NodeContext(log=log, data_dir=tmp_path, metrics=metrics)
        metrics.attach(node)
        log.create_stream("m")
        log.append_payloads("m", [b"a", b"b"])
        app = create_app(node, token="t", console=False, metrics_public=True)
        with TestClient(app) as anon:
            text = anon.get("/metrics").text
            assert 'loglake_push_records_total{stream="m"} 2.0' in text
            assert anon.get("/api/streams").status_code == 401


def test_front_pages_root_leads_to_the_console_and_docs_lists_every_route(
    api_node: ApiNode,
) -> None:
    """``/docs`` was a 404 (Swagger UI needs a CDN): now a self-contained page of the API."""
    anon = api_node.anonymous
    r = anon.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/docs"  # this app has no console
    page = anon.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "cdn" not in page.text.lower() and "<script" not in page.text
    for path in anon.get("/openapi.json").json()["paths"]:
        assert f"<code>{path}</code>" in page.text


def test_root_redirects_to_the_console_when_the_node_serves_one(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from loglake.node.api.context import NodeContext
    from loglake.node.app import create_app

    with open_log(tmp_path) as log:
        app = create_app(NodeContext(log=log, data_dir=tmp_path), token="t", console=True)
        with TestClient(app) as c:
            r = c.get("/", follow_redirects=False)
            assert r.status_code == 307 and r.headers["location"] == "/console/"


def test_the_stream_list_is_paged_with_a_total(api_node: ApiNode) -> None:
    """Anyone on the stream service may create streams, and the console polls the list every
    second: it answers a page (500 by default), stats read for that page only, with the total
    and the next page's start in headers. Before: every stream in each answer."""
    names = sorted(f"s{i:04d}" for i in range(505))
    for name in names:
        api_node.log.create_stream(name)
    c = api_node.client
    r = c.get("/api/streams")
    assert r.status_code == 200 and len(r.json()) == 500, len(r.json())
    assert r.headers["X-Total-Count"] == "505" and r.headers["X-Next-After"] == names[499]
    rest = c.get("/api/streams", params={"after": r.headers["X-Next-After"]})
    assert [s["name"] for s in r.json() + rest.json()] == names
    assert "X-Next-After" not in rest.headers and rest.headers["X-Total-Count"] == "505"
    r = c.get("/api/streams", params={"limit": 2, "after": "s0100"})
    assert [s["name"] for s in r.json()] == ["s0101", "s0102"]
    assert c.get("/api/streams", params={"limit": 0}).status_code == 422


def test_the_stream_list_filters_by_part_of_the_name(api_node: ApiNode) -> None:
    """``contains`` finds a stream however many others sort before it: anyone on the stream
    service made 505 streams named ``0…``, and the real one was on no page the console showed
    (it polled the first page only). The total and the pages are of the filtered list."""
    for i in range(505):
        api_node.log.create_stream(f"0{i:04d}")
    for name in ("orders", "Orders-EU", "returns"):
        api_node.log.create_stream(name)
    c = api_node.client
    r = c.get("/api/streams", params={"contains": "ORDER"})
    assert r.status_code == 200, r.text
    assert [s["name"] for s in r.json()] == ["Orders-EU", "orders"]  # case-insensitive
    assert r.headers["X-Total-Count"] == "2" and "X-Next-After" not in r.headers
    r = c.get("/api/streams", params={"contains": "order", "limit": 1})
    assert [s["name"] for s in r.json()] == ["Orders-EU"] and r.headers["X-Next-After"]
    nxt = c.get(
        "/api/streams", params={"contains": "order", "limit": 1, "after": r.headers["X-Next-After"]}
    )
    assert [s["name"] for s in nxt.json()] == ["orders"] and "X-Next-After" not in nxt.headers
    r = c.get("/api/streams", params={"contains": "049"})
    assert [s["name"] for s in r.json()] == [f"0{i:04d}" for i in range(505) if "049" in f"{i:04d}"]
    r = c.get("/api/streams", params={"contains": "nothing-like-it"})
    assert r.json() == [] and r.headers["X-Total-Count"] == "0"
    assert c.get("/api/streams", params={"contains": ""}).headers["X-Total-Count"] == "508"
    assert c.get("/api/streams", params={"contains": "x" * 201}).status_code == 422
    doc = c.get("/openapi.json").json()
    params = {p["name"] for p in doc["paths"]["/api/streams"]["get"]["parameters"]}
    assert "contains" in params
