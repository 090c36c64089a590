"""An in-process node (the real app around a real ``SegmentLog`` in a temp dir) for API tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from loglake.log import Log, open_log
from loglake.node.api.context import NodeContext
from loglake.node.app import create_app
from loglake.node.metrics import InstrumentedLog, NodeMetrics

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
