"""``/metrics`` stays bounded however many consumer indexes clients save: the most behind
consumers keep their ``loglake_consumer_lag`` series (ids cut to ``CONSUMER_LABEL_CHARS``), and
the ``loglake_consumers*`` aggregates cover every one of them.

Found from outside: every saved index was a series, so 20,000 ids of ~1 KB saved over the stream
service made each scrape over 20 MB. Here a real node (``BackgroundNode``: the embedded log, the
stream server, the HTTP app) is given those indexes by a real client over TCP, and scraped over
HTTP with its token.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loglake.node.config import load_config
from loglake.node.runner import BackgroundNode
from loglake.streams import StreamClient
from loglake.streams.client import AsyncStreamClient

RECORDS = 300
"""Records in the consumers' partition: a consumer's lag is 300 minus its saved index."""
MANY = 20_000
ID_BYTES = 1024
"""``[limits] max_client_id``'s default: the longest id the stream service takes."""
IN_FLIGHT = 500
"""Saves sent at once on the client's connection (the server queues at most 20,000)."""
MEMORY_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
"""The crowded node's data dir: a tmpfs where there is one, as the consumer store fsyncs each of
the 20,000 saves (a minute and more on a loaded machine's disk; the fsyncs are not what is
tested)."""

SCRAPE_BOUND = 256 * 1024
"""Bytes a scrape may take with the default ``[http] metrics_consumers`` (100): the other
families of a node with one stream are a few KB, and 100 lag series of ~1 KB ids cut to 128
characters some 20 KB (before the bound: over 20 MB)."""


def _id(i: int) -> str:
    return f"{i:05d}-".ljust(ID_BYTES, "x")


def _lag(i: int) -> int:
    return i % 250


def _node(data_dir: Path, **http: Any) -> BackgroundNode:
    cfg = load_config(
        data={
            "data_dir": str(data_dir),
            "console": False,
            "http": {"port": 0, **http},
            "streams": {"port": 0},
        },
        env={},
    )
    return BackgroundNode(cfg, say=lambda _: None)


def _stream_port(node: BackgroundNode) -> int:
    address = node.context.stream_address
    assert address is not None
    return address[1]


async def _save_many(port: int, ids: list[tuple[str, int]]) -> None:
    """Each ``(client id, index)`` saved on "orders" 0, ``IN_FLIGHT`` at a time."""
    c = await AsyncStreamClient.connect("127.0.0.1", port)
    try:
        for k in range(0, len(ids), IN_FLIGHT):
            chunk = ids[k : k + IN_FLIGHT]
            await asyncio.wait_for(
                asyncio.gather(*(c.save_index(cid, "orders", ix, 0) for cid, ix in chunk)), 60
            )
    finally:
        await c.close()


@pytest.fixture(scope="module")
def crowded(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[BackgroundNode, httpx.Client]]:
    """One node for the module (its consumers take seconds to save), with "orders"
    (``RECORDS`` records), the consumer "billing" at index 0, and ``MANY`` consumers of
    ``ID_BYTES``-byte ids with lags 0-249 (``_lag``)."""
    root = tempfile.TemporaryDirectory(dir=MEMORY_DIR or tmp_path_factory.mktemp("crowded"))
    with root as data, _node(Path(data)) as node:
        port = _stream_port(node)
        with StreamClient(port=port) as c:
            c.create_stream("orders", 1)
            c.push_many("orders", [b"o%d" % i for i in range(RECORDS)], 0)
            assert c.save_index("billing", "orders", 0, 0) == 0
        asyncio.run(_save_many(port, [(_id(i), RECORDS - _lag(i)) for i in range(MANY)]))
        with httpx.Client(
            base_url=node.url, headers={"Authorization": f"Bearer {node.token}"}, timeout=60
        ) as api:
            yield node, api


def _samples(text: str) -> dict[str, list[Any]]:
    """Family name → its samples, read by Prometheus' own text parser."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _value(samples: dict[str, list[Any]], name: str) -> float:
    [sample] = samples[name]
    return float(sample.value)


@pytest.mark.slow
def test_a_scrape_is_bounded_however_many_consumers_saved_an_index(
    crowded: tuple[BackgroundNode, httpx.Client],
) -> None:
    _, api = crowded
    r = api.get("/metrics")
    assert r.status_code == 200
    assert len(r.content) < SCRAPE_BOUND, f"{len(r.content)} bytes"
    lags = _samples(r.text)["loglake_consumer_lag"]
    assert len(lags) == 100
    assert all(len(s.labels["consumer"]) <= 128 for s in lags)


@pytest.mark.slow
def test_the_most_behind_consumers_keep_their_series_and_labels(
    crowded: tuple[BackgroundNode, httpx.Client],
) -> None:
    _, api = crowded
    text = api.get("/metrics").text
    # an honest consumer's series is the one it always was
    assert 'loglake_consumer_lag{consumer="billing",partition="0",stream="orders"} 300.0' in text
    lags = _samples(text)["loglake_consumer_lag"]
    shown = {s.labels["consumer"]: s.value for s in lags}
    # then the 80 ids at lag 249, and the first 19 (by id) at 248: ties go by client id
    at_249 = [i for i in range(MANY) if _lag(i) == 249]
    at_248 = [i for i in range(MANY) if _lag(i) == 248][:19]
    for i in at_249 + at_248:
        full = _id(i)
        label = f"{full[:111]}…{hashlib.sha256(full.encode()).hexdigest()[:16]}"
        assert shown.pop(label) == _lag(i), i
    assert shown == {"billing": 300}
    assert {(s.labels["stream"], s.labels["partition"]) for s in lags} == {("orders", "0")}


@pytest.mark.slow
def test_the_aggregates_cover_every_consumer(
    crowded: tuple[BackgroundNode, httpx.Client],
) -> None:
    _, api = crowded
    samples = _samples(api.get("/metrics").text)
    assert _value(samples, "loglake_consumers") == MANY + 1
    assert _value(samples, "loglake_consumers_lag_max") == RECORDS  # billing's
    assert _value(samples, "loglake_consumers_lag") == sum(map(_lag, range(MANY))) + RECORDS
    assert _value(samples, "loglake_consumers_omitted") == MANY + 1 - 100


def test_metrics_consumers_sets_how_many_have_a_series(tmp_path: Path) -> None:
    with _node(tmp_path / "data", metrics_consumers=2) as node:
        with StreamClient(port=_stream_port(node)) as c:
            c.create_stream("orders", 1)
            c.push_many("orders", [b"o%d" % i for i in range(10)], 0)
            for client, index in (("a", 9), ("b", 2), ("c", 5), ("d", 10)):
                c.save_index(client, "orders", index, 0)
        auth = {"Authorization": f"Bearer {node.token}"}
        with httpx.Client(base_url=node.url, headers=auth) as api:
            samples = _samples(api.get("/metrics").text)
    assert {s.labels["consumer"]: s.value for s in samples["loglake_consumer_lag"]} == {
        "b": 8,
        "c": 5,
    }
    assert _value(samples, "loglake_consumers") == 4
    assert _value(samples, "loglake_consumers_lag_max") == 8
    assert _value(samples, "loglake_consumers_lag") == 8 + 5 + 1 + 0
    assert _value(samples, "loglake_consumers_omitted") == 2


def test_an_id_made_to_equal_a_cut_one_is_not_a_second_series(tmp_path: Path) -> None:
    """A cut id's label is a string any client may save an index under, too: the two would be
    one series twice in a scrape (a duplicate Prometheus drops with an error), so the second is
    left out and counted."""
    long = "y" * 300
    made = f"{long[:111]}…{hashlib.sha256(long.encode()).hexdigest()[:16]}"
    with _node(tmp_path / "data") as node:
        with StreamClient(port=_stream_port(node)) as c:
            c.create_stream("orders", 1)
            c.push_many("orders", [b"o%d" % i for i in range(10)], 0)
            c.save_index(long, "orders", 4, 0)
            c.save_index(made, "orders", 3, 0)
        auth = {"Authorization": f"Bearer {node.token}"}
        with httpx.Client(base_url=node.url, headers=auth) as api:
            samples = _samples(api.get("/metrics").text)
    assert [(s.labels["consumer"], s.value) for s in samples["loglake_consumer_lag"]] == [
        (made, 6)  # the long id's (first by client id), its lag
    ]
    assert _value(samples, "loglake_consumers") == 2
    assert _value(samples, "loglake_consumers_lag") == 6 + 7
    assert _value(samples, "loglake_consumers_omitted") == 1
