"""``loglake node --config`` as a process: started, fed real data over the stream service,
driven and scraped over HTTP with its token, stopped with SIGTERM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from loglake.streams import StreamClient
from tests.procs import free_port, process


def _write_config(tmp_path: Path, http_port: int, stream_port: int) -> Path:
    cfg = tmp_path / "loglake.toml"
    cfg.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        "console = false\n"
        f"[http]\nport = {http_port}\n"
        f"[streams]\nport = {stream_port}\n"
        '[sds]\nenabled = true\nparticipants = ["alice", "bob"]\n'
    )
    return cfg


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{") or line.startswith(f"{name} "):
            got = line[line.find("{") + 1 : line.find("}")] if "{" in line else ""
            if ",".join(sorted(got.split(","))) == want:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{want}}} not in /metrics")


@pytest.mark.slow
def test_node_process_serves_streams_api_and_metrics(tmp_path: Path) -> None:
    http_port, stream_port = free_port(), free_port()
    cfg = _write_config(tmp_path, http_port, stream_port)
    cmd = [sys.executable, "-m", "loglake.cli", "node", "--config", str(cfg)]
    with process(cmd, http_port, stderr=subprocess.PIPE, text=True) as proc:
        token = (tmp_path / "data" / "node.token").read_text().strip()
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{http_port}", headers={"Authorization": f"Bearer {token}"}
        )
        assert httpx.get(f"http://127.0.0.1:{http_port}/api/streams").status_code == 401
        with StreamClient(port=stream_port) as c:
            c.create_stream("orders", 2)
            c.push_many("orders", [b"o%d" % i for i in range(50)], 1)
            assert len(c.pull("orders", 0, 20, 1)) == 20
            c.get_index("billing", "orders", 1)
            c.save_index("billing", "orders", 20, 1)
        [orders] = [s for s in api.get("/api/streams").json() if s["name"] == "orders"]
        assert (orders["records"], orders["pushed_records"], orders["pulled_records"]) == (
            50,
            50,
            20,
        )
        parts = api.get("/api/streams/orders/partitions").json()
        assert [p["next_index"] for p in parts] == [0, 50] and parts[1]["fsyncs"] >= 1
        page = api.get("/api/streams/orders/partitions/1/records?start=48").json()
        assert [r["index"] for r in page["records"]] == [48, 49]
        [lag] = api.get("/api/consumers").json()
        assert (lag["client_id"], lag["lag"]) == ("billing", 30)
        sent = api.post(
            "/api/sds/channels/chat/messages", json={"sender": "alice", "text": "hello"}
        )
        assert sent.status_code == 201
        m = api.get("/metrics").text
        assert _metric(m, "loglake_push_records_total", stream="orders") == 50
        # pulls count every read through the node: 20 over TCP + the 2 the range read returned
        assert _metric(m, "loglake_pull_records_total", stream="orders") == 22
        lag_labels = {"consumer": "billing", "stream": "orders", "partition": "1"}
        assert _metric(m, "loglake_consumer_lag", **lag_labels) == 30
        assert _metric(m, "loglake_partition_records", stream="orders", partition="1") == 50
        assert _metric(m, "loglake_fsyncs_total", stream="orders", partition="1") >= 1
        assert _metric(m, "loglake_push_latency_seconds_count", stream="orders") >= 1
        assert _metric(m, "loglake_sds_sent_total", channel="chat", participant="alice") == 1
        assert "loglake_events_received_total" not in m  # ICRC is off in this config
        assert api.get("/api/events").json()["error"] == "PartDisabled"
    assert proc.returncode == 0
    banner = proc.stderr.read() if proc.stderr else ""
    assert f"access token (printed once; kept in {tmp_path / 'data' / 'node.token'})" in banner
    assert token in banner and "stopped" in banner
