"""The ICRC roles on a real ``loglake serve`` over TCP (issue 18): the orchestrator and the
publisher keep every stream — namespaces, system namespaces, the journal, the ledger — on one
stream-service node through the ``Streams`` API (``StreamClient``), not in a log of their own.
Publish, subscribe and replay end to end; the history, the journal and the ledger are then read
back from the node; an orchestrator restarted against the node still answers for its replays."""

from __future__ import annotations

import sys

import pytest

from loglake.events import (
    H_REPLAY_END_ID,
    H_REPLAY_ID,
    CallRejected,
    GetReplays,
    Ok,
    Registration,
    ReplayRegistration,
    ReplayState,
    StreamsStore,
)
from loglake.events.journal import stream_name
from loglake.events.ledger import ledger_stream
from loglake.streams import StreamClient
from loglake.wire.icrc16 import map_get
from tests.events.cluster import Cluster
from tests.events.wait import STATUS_POLL_S, gather, wait_until
from tests.procs import free_port, process

pytestmark = pytest.mark.slow
N = 1_500


def _final(sub, rid):
    [st] = [s for s in sub.call("icrc77_get_replays", GetReplays()) if s.replay_id == rid]
    return st if st.status.final else None


def test_roles_publish_subscribe_and_replay_through_a_loglake_serve_node(tmp_path):
    port = free_port()
    serve = [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(tmp_path / "node")]
    with process([*serve, "--port", str(port)], port):
        c = Cluster(
            tmp_path,
            streams=["--streams-port", str(port)],
            extra={"publisher": ["--batch-size", "100"]},
        )
        c.extra["orchestrator"] = ["--mint", f"{c.principal('subscriber')}=1000"]
        c.start()
        try:
            pub = c.client("publisher")
            items = [({"Map": [("i", {"Nat": i})]}, None) for i in range(N)]
            ids = wait_until(
                lambda: pub.call("loglake_publish", (c.namespace, items)),
                what="the publisher up",
                retry_on=(CallRejected,),
            )
            assert ids == list(range(N)), c.logs()
            sub = c.client("orchestrator", "subscriber")
            [r] = sub.call("icrc72_register_subscription", [Registration(c.namespace, [])])
            assert isinstance(r, Ok), r
            wait_until(lambda: c.known_head() == N, what="the head at the orchestrator")
            inbox = c.inbox()
            fetch = lambda: inbox.read(100_000)  # noqa: E731

            # replay: a closed range and an open-ended one, each event once with the headers
            [r1] = sub.call("icrc77_register_replay", [ReplayRegistration(c.namespace, 100, 600)])
            st = wait_until(
                lambda: _final(sub, r1.value), 30, what="replay 1 final", interval=STATUS_POLL_S
            )
            assert st.status == ReplayState("completed", 500)
            notes = gather(fetch, lambda g: len(g) >= 500, 20)
            assert [n.event_id for n in notes] == list(range(100, 600))
            assert all(map_get(n.headers, H_REPLAY_ID) == {"Nat": r1.value} for n in notes)
            assert notes[0].data == {"Map": [("i", {"Nat": 100})]}
            [r2] = sub.call("icrc77_register_replay", [ReplayRegistration(c.namespace, 1400)])
            st = wait_until(
                lambda: _final(sub, r2.value), 30, what="replay 2 final", interval=STATUS_POLL_S
            )
            assert st.status == ReplayState("completed", N - 1400)
            notes = gather(fetch, lambda g: len(g) >= N - 1400, 20)
            assert [n.event_id for n in notes] == list(range(1400, N))
            assert {map_get(n.headers, H_REPLAY_END_ID)["Nat"] for n in notes} == {N - 1}

            # live: the subscription's assignment went out before the replays' system messages
            assert pub.call("loglake_publish", (c.namespace, [({"Text": "live"}, None)])) == [N]
            live = gather(fetch, bool, 20)
            assert [(n.event_id, n.data) for n in live] == [(N, {"Text": "live"})]

            # everything lives on the node: the namespace, the journal, the ledger, the audit copy
            with StreamClient("127.0.0.1", port) as node:
                store = StreamsStore(node)
                assert store.bounds(c.namespace) == (0, N + 1)
                ops = [r["op"] for r in c.orchestrator_journal()]
                assert ops.count("replay") == 2 and "pub" in ops and "sub" in ops
                assert store.exists(ledger_stream())
                assert any(s.startswith("icrc72:publisher:sys:") for s in node.list_streams())
                assert stream_name() in node.list_streams()

            # an orchestrator restarted against the node answers for its replays, and its
            # ledger is rebuilt from the node (minted once, at the first start)
            c.stop("orchestrator")
            c.extra["orchestrator"] = []
            c.start_one("orchestrator")
            assert _final(sub, r1.value).status == ReplayState("completed", 500)
            assert sub.call("icrc1_balance_of", (c.ids["subscriber"].principal, None)) == 1000
        except BaseException:
            print(c.logs())
            raise
        finally:
            c.stop()
