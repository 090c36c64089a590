"""``GET /api/cluster`` and the cluster's ``/metrics`` series, against real nodes on a real 3-node
JetStream cluster (loopback): who holds the sealer's lease as both nodes see it, the meta leader
and the stream groups' replicas (and a server killed showing offline), the sealer's lag in
records and seconds on the node that seals; and what a node says when its monitoring URLs are
wrong or its whole cluster is gone (a 200 naming the reason, within a few seconds)."""

from __future__ import annotations

import http.server
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from loglake.log import Entry
from loglake.node.backend import ONCE_ONLY
from loglake.node.config import ConfigError, load_config
from loglake.node.localcluster import CLUSTER_NAME
from loglake.node.runner import BackgroundNode
from loglake.streams.jetstream import JetStreamLog
from tests.conftest import require_peer
from tests.nats_cluster import NATS_HINT, NatsCluster, have_nats_server
from tests.node.conftest import background_node
from tests.waiting import wait_until


def api(node: BackgroundNode) -> httpx.Client:
    return httpx.Client(
        base_url=node.url, headers={"Authorization": f"Bearer {node.token}"}, timeout=30
    )


Labels = tuple[tuple[str, str], ...]


def lab(**labels: str) -> Labels:
    return tuple(sorted(labels.items()))


def series(text: str, name: str) -> dict[Labels, float]:
    """``{labels: value}`` of one series in a Prometheus exposition."""
    out = {}
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        labels = re.findall(r'(\w+)="([^"]*)"', m.group(1) or "")
        out[tuple(sorted(labels))] = float(m.group(2))
    return out


def _sealer_lease(view: dict[str, Any]) -> dict[str, Any]:
    """The sealer's lease in a node's ``/api/cluster`` view (each once-only work has its own)."""
    return next(x for x in view["leases"] if x["name"] == "sealer")


def test_an_embedded_node_says_it_has_no_cluster(api_node: Any) -> None:
    r = api_node.client.get("/api/cluster")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["backend"] == "embedded" and body["reachable"] and body["leases"] == []
    assert body["groups"] == [] and body["meta"] is None and body["sealer"] is None
    assert "loglake_lease_held" not in api_node.client.get("/metrics").text
    assert api_node.anonymous.get("/api/cluster").status_code == 401


@pytest.mark.slow
def test_two_nodes_agree_on_the_lease_holder_and_the_sealer_reports_its_lag(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    prefix = "ops" + uuid.uuid4().hex[:8]
    # a seal round only at start: what is pushed afterwards waits, so the lag is seen
    a = background_node(
        nats3.url, tmp_path / "a", prefix, nats_monitor=nats3.monitor_urls, seal_interval=3600
    )
    b = background_node(
        nats3.url, tmp_path / "b", prefix, nats_monitor=nats3.monitor_urls, seal_interval=3600
    )
    log = JetStreamLog(nats3.url, prefix=prefix)
    try:
        with api(a) as ha, api(b) as hb:

            def views() -> tuple[dict, dict] | None:
                va, vb = ha.get("/api/cluster").json(), hb.get("/api/cluster").json()
                la, lb = _sealer_lease(va), _sealer_lease(vb)
                if la and lb and la["holder"] and la["holder"] == lb["holder"]:
                    return va, vb
                return None

            va, vb = wait_until(views, 15, "both nodes see one sealer holder")
            for v in (va, vb):
                assert v["backend"] == "jetstream" and v["reachable"] and v["error"] is None
                assert v["replicas"] == 3 and v["prefix"] == prefix
                assert [x["name"] for x in v["leases"]] == sorted(ONCE_ONLY)
            holder_view, other_view = (va, vb) if _sealer_lease(va)["held_here"] else (vb, va)
            holder_http, other_http = (ha, hb) if holder_view is va else (hb, ha)
            held, other = _sealer_lease(holder_view), _sealer_lease(other_view)
            assert held["this_node"] and held["token"]
            assert not other["held_here"] and not other["this_node"]
            assert held["holder"] == holder_view["node"]
            assert other_view["node"] != holder_view["node"]

            # the meta group from /jsz: a leader and its two peers, all current
            meta = holder_view["meta"]
            assert meta["cluster"] == CLUSTER_NAME and meta["size"] == 3
            assert meta["leader"] in {"n1", "n2", "n3"}
            assert sorted(p["name"] for p in meta["peers"]) == ["n1", "n2", "n3"]
            assert set(meta["monitors"].values()) == {"ok"}

            log.create_stream_replicated("orders", None, 3)
            # a writer's own timestamps (a day old): the lag is the time JetStream has held them
            day_ago = time.time_ns() - 86400 * 10**9
            log.append_many(
                "orders", [Entry(b"x%d" % i, timestamp_ns=day_ago) for i in range(20)], partition=0
            )
            time.sleep(1.2)  # the oldest unsealed record ages; the cached answer expires

            def stamped() -> dict | None:
                """The view once the node read the oldest record's stamp: a direct get, which a
                replica that has not applied this process's push yet answers "not found"
                (docs/jetstream.md: another process may briefly miss a push), lag 0."""
                v = holder_http.get("/api/cluster").json()
                lag = [x for x in v["sealer"]["lag"] if x["stream"] == "orders"]
                return v if lag and lag[0]["lag_seconds"] > 0 else None

            v = wait_until(stamped, 10, "the sealer's lag of orders/0, with its age")
            groups = {g["jetstream_stream"]: g for g in v["groups"]}
            orders = groups[log.js_name("orders", 0)]
            assert orders["stream"] == "orders" and orders["partition"] == 0
            assert orders["leader"] in {"n1", "n2", "n3"} and orders["last_seq"] == 20
            assert len(orders["replicas"]) == 3 and orders["replicas"][0]["leader"]
            assert f"KV_{prefix}_leases" in groups and f"KV_{prefix}_indexes" in groups
            assert v["sealer"]["here"] and v["sealer"]["interval_s"] == 3600
            lag = {(x["stream"], x["partition"]): x for x in v["sealer"]["lag"]}
            assert lag[("orders", 0)]["lag_records"] == 20
            assert lag[("orders", 0)]["sealed_next"] == 0 and lag[("orders", 0)]["next_index"] == 20
            assert 1.0 <= lag[("orders", 0)]["lag_seconds"] < 60
            ov = other_http.get("/api/cluster").json()
            assert not ov["sealer"]["here"] and ov["sealer"]["lag"] == []
            assert ov["sealer"]["holder"] == holder_view["node"]

            text = holder_http.get("/metrics").text
            other_text = other_http.get("/metrics").text
            held_a, held_b = (
                series(text, "loglake_lease_held"),
                series(other_text, "loglake_lease_held"),
            )
            assert held_a[lab(lease="sealer")] == 1.0 and held_b[lab(lease="sealer")] == 0.0
            # every once-only work is held by exactly one of the two nodes
            assert set(held_a) == set(held_b) == {lab(lease=n) for n in ONCE_ONLY}
            assert all(held_a[k] + held_b[k] == 1.0 for k in held_a), (held_a, held_b)
            who = lab(lease="sealer", holder=holder_view["node"])
            assert series(text, "loglake_lease_holder")[who] == 1.0
            assert series(other_text, "loglake_lease_holder")[who] == 1.0
            assert series(text, "loglake_jetstream_reachable") == {(): 1.0}
            js_orders = log.js_name("orders", 0)
            leaders = series(text, "loglake_jetstream_leader")
            assert leaders[lab(jetstream_stream=js_orders, server=orders["leader"])] == 1
            assert leaders[lab(jetstream_stream="$meta", server=meta["leader"])] == 1
            assert (
                series(text, "loglake_jetstream_leaderless")[lab(jetstream_stream=js_orders)] == 0
            )
            lag_series = series(text, "loglake_sealer_lag_records")
            assert lag_series[lab(stream="orders", partition="0")] == 20
            assert (
                series(text, "loglake_sealer_lag_seconds")[lab(stream="orders", partition="0")] > 1
            )
            assert "loglake_sealer_lag_records" not in other_text  # only the sealer reports it

            # a NATS server killed: the groups and the meta group show it offline or behind
            victim = next(n for n in ("n1", "n2", "n3") if n != meta["leader"])
            nats3.kill(nats3.index_of(victim))
            try:

                def down() -> dict | None:
                    v = holder_http.get("/api/cluster").json()
                    peers = {p["name"]: p for p in v["meta"]["peers"]}
                    g = {x["jetstream_stream"]: x for x in v["groups"]}.get(js_orders)
                    if g is None:  # the node's connection moving off the killed server
                        return None
                    rep = {p["name"]: p for p in g["replicas"]}
                    gone = victim not in rep or rep[victim]["offline"] or not rep[victim]["current"]
                    meta_gone = peers[victim]["offline"] or not peers[victim]["current"]
                    return (
                        v
                        if gone
                        and meta_gone
                        and v["meta"]["monitors"].get(
                            f"http://127.0.0.1:{nats3.http_ports[nats3.index_of(victim)]}"
                        )
                        != "ok"
                        else None
                    )

                v = wait_until(down, 30, f"{victim} seen down")
                assert v["reachable"]  # two of three answer: the cluster has its quorum
                text = holder_http.get("/metrics").text
                off = series(text, "loglake_jetstream_replica_offline")
                assert off[lab(jetstream_stream="$meta", server=victim)] == 1
            finally:
                nats3.start_node(nats3.index_of(victim))
                nats3.wait_placement()
    finally:
        log.close()
        for n in (a, b):
            n.stop()


class _NotNats(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html>not a NATS server</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.slow
def test_bad_monitoring_urls_and_a_dead_cluster_are_reported_not_raised(tmp_path: Path) -> None:
    require_peer("nats-server", have_nats_server(), NATS_HINT)
    from tests.procs import free_port

    junk = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotNats)
    threading.Thread(target=junk.serve_forever, daemon=True).start()
    junk_url, dead_url = f"http://127.0.0.1:{junk.server_port}", f"http://127.0.0.1:{free_port()}"
    one = NatsCluster(1).start()
    node = None
    try:
        node = background_node(
            one.url,
            tmp_path / "n",
            "bad" + uuid.uuid4().hex[:6],
            nats_monitor=f"{junk_url},{dead_url}",
        )
        with api(node) as http_:
            v = http_.get("/api/cluster").json()
            assert v["reachable"] and [x["name"] for x in v["leases"]] == sorted(ONCE_ONLY)
            assert v["meta"]["leader"] is None and v["meta"]["peers"] == []
            assert v["meta"]["monitors"][junk_url].startswith("not a NATS monitoring endpoint")
            assert v["meta"]["monitors"][dead_url].startswith("unreachable")

            one.kill(0)  # the whole cluster gone
            time.sleep(1.1)  # past the cached answer
            t = time.monotonic()
            r = http_.get("/api/cluster")
            took = time.monotonic() - t
            assert r.status_code == 200, r.text
            v = r.json()
            assert not v["reachable"] and v["error"], v
            assert took < 10, took
            m = http_.get("/metrics")
            assert m.status_code == 200
            assert series(m.text, "loglake_jetstream_reachable") == {(): 0.0}
    finally:
        if node is not None:
            node.stop()
        one.close()
        junk.shutdown()


def test_streams_another_client_made_under_the_prefix_do_not_break_the_view(tmp_path: Path) -> None:
    """JetStream streams named under the node's prefix by another client, with ``loglake.*``
    metadata loglake never writes. Before: ``int()`` of their partition ("²", "zero") failed
    every ``/api/cluster`` read (400, "ValueError: invalid literal for int()")."""
    require_peer("nats-server", have_nats_server(), NATS_HINT)
    from nats.js import api as jsapi

    one = NatsCluster(1).start()
    node = None
    prefix = "junk" + uuid.uuid4().hex[:6]
    try:
        node = background_node(one.url, tmp_path / "n", prefix)
        log = JetStreamLog(one.url, prefix=prefix)
        try:
            log.create_stream("ok")
            log.push_many("ok", 0, [b"1"])
            foreign = {
                f"{prefix}-junk": {"loglake.stream": "junk", "loglake.partition": "zero"},
                f"{prefix}-up": {"loglake.stream": "../../up", "loglake.partition": "²"},
                f"{prefix}-odd-0": {"loglake.stream": "other", "loglake.partition": "0"},
            }
            for i, (name, meta) in enumerate(foreign.items()):
                cfg = jsapi.StreamConfig(name=name, subjects=[f"x{i}.{prefix}"], metadata=meta)
                log.call(log.js.add_stream(cfg))
        finally:
            log.close()
        with api(node) as http_:
            r = http_.get("/api/cluster")
            assert r.status_code == 200, r.text
            v = r.json()
            assert v["reachable"], v
            groups = {g["jetstream_stream"]: g for g in v["groups"]}
            assert set(foreign) <= set(groups)  # listed, as JetStream has them
            assert groups[f"{prefix}-up"]["partition"] is None
            assert [(x["stream"], x["partition"]) for x in v["sealer"]["lag"]] == [("ok", 0)]
            m = http_.get("/metrics")
            assert m.status_code == 200, m.text
            assert series(m.text, "loglake_jetstream_reachable") == {(): 1.0}
    finally:
        if node is not None:
            node.stop()
        one.close()


@pytest.mark.parametrize("value", ["ftp://x:1", "127.0.0.1:8222", "http://a:1,,nats://b:2"])
def test_a_bad_monitoring_url_names_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"\[streams\] nats_monitor: expected http://"):
        load_config(data={"data_dir": str(tmp_path), "streams": {"nats_monitor": value}}, env={})
