"""``/metrics`` shows a partition failing on a failed fsync and the log's own reopen of it
(issue 15 §3 through the node's eyes): ``loglake_partition_failing{kind="storage"}``,
``loglake_partition_reopens_total``. The log's clock is the test's; no sleeps."""

from __future__ import annotations

import errno

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from loglake.log import StorageFailed, fs, open_log
from loglake.node.api.context import NodeContext
from loglake.node.app import create_app
from loglake.node.metrics import InstrumentedLog, NodeMetrics
from tests.log.clock import ManualClock
from tests.node.conftest import AUTH, TOKEN


def _samples(client: TestClient) -> dict[tuple[str, str], float]:
    """(sample name, kind label or "") → value, for partition s/0."""
    text = client.get("/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("stream") == "s" and s.labels.get("partition") == "0":
                out[(s.name, s.labels.get("kind", ""))] = s.value
    return out


def test_metrics_show_a_failed_partition_and_its_reopen(tmp_path, monkeypatch) -> None:
    clock = ManualClock()
    metrics = NodeMetrics()
    log = InstrumentedLog(open_log(tmp_path, clock=clock), metrics)
    node = NodeContext(log=log, data_dir=tmp_path, metrics=metrics)
    metrics.attach(node)
    try:
        with TestClient(create_app(node, token=TOKEN, console=False), headers=AUTH) as c:
            log.create_stream("s")
            log.append_payloads("s", [b"before"])
            real = fs.fdatasync

            def failing(fd: int) -> None:
                raise OSError(errno.EIO, "injected")

            monkeypatch.setattr(fs, "fdatasync", failing)
            with pytest.raises(StorageFailed):
                log.append_payloads("s", [b"lost"])
            monkeypatch.setattr(fs, "fdatasync", real)  # the fault clears
            m = _samples(c)
            assert m[("loglake_partition_failing", "storage")] == 1
            assert m[("loglake_partition_reopens_total", "")] == 0

            clock.advance(0.2)  # past the first back-off: the next append reopens it
            log.append_payloads("s", [b"after"])
            m = _samples(c)
            assert m[("loglake_partition_failing", "storage")] == 0
            assert m[("loglake_partition_reopens_total", "")] == 1
            assert m[("loglake_partition_reopen_attempts", "")] == 0
    finally:
        log.close()
