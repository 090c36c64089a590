"""The JetStream servers every JetStream test module shares (``jetstream_fixtures.py``): one
single server and one 3-node R3 cluster for the whole session, started on first use. Each test
works in its own namespace (``prefix``), so sharing hides nothing between tests; the fault tests,
which kill nodes, start their own clusters (``test_jetstream_faults.py``)."""

from tests.streams.jetstream_fixtures import cluster, js_log, nats_r3, nats_single  # noqa: F401
