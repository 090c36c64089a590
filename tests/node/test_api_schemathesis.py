"""The API fuzzed with schemathesis against its own OpenAPI document.

Every operation gets schema-valid requests (positive) and schema-breaking ones (negative:
wrong types, missing fields, out-of-range values): whatever comes in, the answer is never a
500, always JSON, and a request the schema rejects is a 4xx. The node runs the streams,
ICRC, SDS and archives parts (Spark jobs are off: their routes answer 404 PartDisabled; a JVM
would not keep this test small). Examples per operation
are bounded (``EXAMPLES``) so the whole file stays under ~30 s here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from loglake.log import MemoryLog
from loglake.node.api.archives import ArchivesHandle
from loglake.node.api.context import NodeContext
from loglake.node.api.events import EventsHandle
from loglake.node.api.sds import SdsHandle
from loglake.node.app import create_app
from loglake.node.config import load_config
from loglake.node.metrics import InstrumentedLog, NodeMetrics
from tests.node.conftest import AUTH, TOKEN

EXAMPLES = 6


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    data = Path(tmp_path_factory.mktemp("fuzz"))
    cfg = load_config(
        data={
            "data_dir": str(data),
            "events": {"enabled": True, "namespaces": ["ns.a"]},
            "archives": {"enabled": True, "wait": 0.0},
        },
        env={},
    )
    metrics = NodeMetrics()
    log = InstrumentedLog(MemoryLog(), metrics)  # creating 256-partition streams on disk
    # hundreds of times would be the test's whole time; the disk path has its own tests
    node = NodeContext(log=log, data_dir=data, metrics=metrics)
    metrics.attach(node)
    node.events = EventsHandle.start(node, cfg.events)
    node.sds = SdsHandle.start(node, cfg.sds)
    node.archives = ArchivesHandle.start(node, cfg.archives)
    log.create_stream("s", None)
    log.append_payloads("s", [b"x", b"yy"])
    log.save_index("c", "s", 1)
    try:
        yield create_app(node, token=TOKEN, console=False)
    finally:
        node.archives.close()
        node.sds.close()
        node.events.close()
        log.close()


def _operations(app: object) -> list:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    return [r.ok() for r in schema.get_all_operations()]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_gets_a_500_and_errors_are_json(app: object, mode: GenerationMode) -> None:
    operations = _operations(app)
    assert len(operations) >= 20, [op.label for op in operations]
    strategy = st.one_of([op.as_strategy(generation_mode=mode) for op in operations])
    seen: dict[str, set[int]] = {}

    @settings(
        max_examples=EXAMPLES * len(operations),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: schemathesis.Case) -> None:
        case.headers = {**(case.headers or {}), **AUTH}  # the token, not a generated one
        response = case.call()
        seen.setdefault(case.operation.label, set()).add(response.status_code)
        assert response.status_code < 500, (case.operation.label, response.text)
        assert response.headers["content-type"][0].startswith("application/json"), response.text
        body = response.json()
        if response.status_code >= 400:
            assert {"error", "message", "status"} <= set(body), body

    run()
    assert len(seen) >= len(operations) // 2  # most operations were reached
