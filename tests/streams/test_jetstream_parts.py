"""Every part over a JetStream R3 cluster, unchanged (issue 13: "One end-to-end test per part
against the cluster"): the SDS channel, the Cardinal transport, the archives control node (in
process, on ``JetStreamStreams``), and the ICRC roles through ``loglake serve --backend``."""

from __future__ import annotations

import pytest

from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from loglake.streams.jetstream import JetStreamLog, JetStreamStreams
from tests.cardinal.test_partitions import (  # noqa: F401 - run here on JetStream
    test_consumer_reads_the_partition_count_the_producer_created,
    test_producer_defaults_and_adopts_an_existing_count,
)
from tests.sds.conftest import Clock
from tests.sds.test_channel import (  # noqa: F401 - run here on JetStream
    test_chat_session_shows_delivery_and_ack_state,
    test_late_joiner_fetches_missing_history_by_hint,
    test_messages_travel_on_the_stream_with_position_hints,
)
from tests.streams import jetstream_fixtures as fx

pytestmark = pytest.mark.slow


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def streams(nats_r3):
    log = JetStreamLog(nats_r3.url, prefix=fx.new_prefix(), replicas=3)
    yield JetStreamStreams(log)
    log.close()


def _tree(root) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_archives_control_node_builds_the_same_archives_from_jetstream(streams, tmp_path) -> None:
    from loglake.archives.control import ControlNode
    from loglake.archives.layout import get_layout
    from loglake.archives.store import MessageStore
    from tests.archives.helpers import START, WEEK, fill_weeks
    from tests.archives.test_nodes import KEY

    layout = get_layout("status-go")
    local = MemoryLog()
    fill_weeks(local, "community", layout, range(3), 40)
    streams.create_stream("community")
    streams.push_many("community", [r.data for r in local.read("community", 0)])
    out = {}
    for name, source in (("local", LocalStreams(local)), ("jetstream", streams)):
        node = ControlNode(tmp_path / name, KEY, layout, MessageStore(tmp_path / f"{name}.db"))
        assert node.ingest_streams(source, "community") == 120
        assert node.ingest_streams(source, "community") == 0  # exactly once
        node.build(START + 3 * WEEK)
        node.publish_magnet(source, "special", clock=1)
        out[name] = _tree(tmp_path / name)
    assert out["jetstream"] == out["local"] and out["local"]
    assert streams.pull("special", 0, 10)[0].data  # the magnet went through JetStream


def test_icrc_roles_publish_and_replay_through_serve_backend(nats_r3, tmp_path) -> None:
    import sys

    from loglake.events import (
        CallRejected,
        GetReplays,
        Ok,
        Registration,
        ReplayRegistration,
        ReplayState,
        StreamsStore,
    )
    from tests.events.cluster import Cluster
    from tests.events.wait import STATUS_POLL_S, gather, wait_until
    from tests.procs import free_port, process

    n = 300
    port = free_port()
    prefix = fx.new_prefix()
    serve = [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(tmp_path / "node"),
             "--port", str(port), "--backend", nats_r3.url, "--replicas", "3",
             "--nats-prefix", prefix]  # fmt: skip
    with process(serve, port):
        c = Cluster(tmp_path, streams=["--streams-port", str(port)])
        c.extra["orchestrator"] = ["--mint", f"{c.principal('subscriber')}=1000"]
        c.start()
        try:
            pub = c.client("publisher")
            items = [({"Map": [("i", {"Nat": i})]}, None) for i in range(n)]
            ids = wait_until(
                lambda: pub.call("loglake_publish", (c.namespace, items)),
                what="the publisher up",
                retry_on=(CallRejected,),
            )
            assert ids == list(range(n)), c.logs()
            sub = c.client("orchestrator", "subscriber")
            [r] = sub.call("icrc72_register_subscription", [Registration(c.namespace, [])])
            assert isinstance(r, Ok), r
            wait_until(lambda: c.known_head() == n, what="the head at the orchestrator")
            inbox = c.inbox()
            [r1] = sub.call("icrc77_register_replay", [ReplayRegistration(c.namespace, 100, 250)])

            def final():
                [st] = [
                    s
                    for s in sub.call("icrc77_get_replays", GetReplays())
                    if s.replay_id == r1.value
                ]
                return st if st.status.final else None

            st = wait_until(final, 30, what="replay final", interval=STATUS_POLL_S)
            assert st.status == ReplayState("completed", 150)
            notes = gather(lambda: inbox.read(100_000), lambda g: len(g) >= 150, 20)
            assert [x.event_id for x in notes] == list(range(100, 250))
        except BaseException:
            print(c.logs())
            raise
        finally:
            c.stop()
    # the namespace lives in JetStream
    log = JetStreamLog(nats_r3.url, prefix=prefix)
    try:
        assert StreamsStore(JetStreamStreams(log)).bounds(c.namespace) == (0, n)
    finally:
        log.close()
