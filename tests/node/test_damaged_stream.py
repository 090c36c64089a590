"""A stream with a damaged partition beside healthy ones: the node reports the damage and keeps
listing and scraping the rest. Found from outside: one bad record inside a partition's fsynced
bytes turned ``GET /api/streams``, ``GET /api/consumers`` and the whole ``/metrics`` scrape
into 500s (the first ``CorruptSegment`` of a ``stream_info`` aborted each)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from loglake.log import Entry, StreamConfig, open_log
from loglake.node.api.context import NodeContext
from loglake.node.app import create_app
from loglake.node.metrics import InstrumentedLog, NodeMetrics
from tests.node.conftest import AUTH, TOKEN


@pytest.fixture
def damaged(tmp_path: Path) -> Iterator[TestClient]:
    with open_log(tmp_path) as log:
        log.create_stream("good", StreamConfig(partitions=1))
        log.append_many("good", [Entry(b"g")])
        log.create_stream("orders", StreamConfig(partitions=2))
        log.append_many("orders", [Entry(b"a%d" % i) for i in range(100)])
        log.save_index("billing", "orders", 5)
        log.save_index("billing", "good", 1)
    segment = tmp_path / "streams" / "orders" / "0" / "00000000000000000000.seg"
    with segment.open("r+b") as f:  # a bad record well inside the fsynced bytes
        f.seek(1000)
        f.write(b"\xff\xff\xff\xff")
    metrics = NodeMetrics()
    log = InstrumentedLog(open_log(tmp_path), metrics)
    node = NodeContext(log=log, data_dir=tmp_path, metrics=metrics)
    metrics.attach(node)
    try:
        with TestClient(create_app(node, token=TOKEN, console=False), headers=AUTH) as c:
            yield c
    finally:
        log.close()


def test_the_list_names_the_damaged_stream_and_keeps_the_healthy_ones(damaged) -> None:
    r = damaged.get("/api/streams")
    assert r.status_code == 200, r.text
    rows = {s["name"]: s for s in r.json()}
    assert rows["good"]["records"] == 1 and rows["good"]["error"] is None
    orders = rows["orders"]
    assert orders["partitions"] == 2 and orders["records"] is None
    error = orders["error"]
    assert error.startswith("CorruptSegment: ") and "00000000000000000000.seg" in error
    one = damaged.get("/api/streams/orders")  # the stream itself: the damage, named, as a 500
    assert (one.status_code, one.json()["error"]) == (500, "CorruptSegment")
    assert damaged.get("/api/streams/good").status_code == 200


def test_consumers_of_a_damaged_stream_are_listed_without_a_lag(damaged) -> None:
    r = damaged.get("/api/consumers")
    assert r.status_code == 200, r.text
    lags = {c["stream"]: c["lag"] for c in r.json()}
    assert lags == {"good": 0, "orders": None}


def test_the_scrape_reports_the_damage_and_the_healthy_streams(damaged) -> None:
    r = damaged.get("/metrics")
    assert r.status_code == 200, r.text[:300]
    text = r.text
    assert 'loglake_stream_unreadable{stream="orders"} 1.0' in text
    assert 'loglake_stream_unreadable{stream="good"} 0.0' in text
    assert 'loglake_partition_records{partition="0",stream="good"} 1.0' in text
    assert 'loglake_consumer_lag{consumer="billing",partition="0",stream="good"} 0.0' in text
    assert 'stream="orders"} ' not in text.replace('loglake_stream_unreadable{stream="orders"}', "")
