"""End to end through the ICRC-77 relay tier: five processes (orchestrator, two broadcasters,
publisher, subscriber) on loopback; the orchestrator runs with ``--relay-replays``, so a replay
flows Publisher → relay (the publication's broadcaster) → target broadcaster → Subscriber
(specs/icrc-77-event-replay.txt, "Control Plane": ``replay_relay`` / ``replay_relayer``)."""

from __future__ import annotations

import pytest

from loglake.events.client import CallRejected
from loglake.events.messages import H_REPLAY_ID, GetReplays, Ok, Registration, ReplayRegistration
from loglake.wire.icrc16 import map_get
from tests.events.cluster import Cluster
from tests.events.wait import STATUS_POLL_S, gather, wait_until

pytestmark = pytest.mark.slow
N = 2_000


def test_replay_through_a_relay_broadcaster(tmp_path):
    c = Cluster(
        tmp_path,
        roles=("orchestrator", "broadcaster", "broadcaster2", "subscriber", "publisher"),
        extra={"orchestrator": ["--relay-replays"], "publisher": ["--batch-size", "200"]},
    )
    c.start()
    try:
        pub = c.client("publisher")
        items = [({"Nat": i}, None) for i in range(N)]
        ids = wait_until(
            lambda: pub.call("loglake_publish", (c.namespace, items)),
            what="the publisher up",
            retry_on=(CallRejected,),
        )
        assert ids == list(range(N)), c.logs()
        sub = c.client("orchestrator", "subscriber")
        stopped = [("icrc72:subscription:stopped", {"Bool": True})]
        [r] = sub.call("icrc72_register_subscription", [Registration(c.namespace, stopped)])
        assert isinstance(r, Ok), r
        wait_until(lambda: c.known_head() == N, what="the publisher's head update")
        [r] = sub.call("icrc77_register_replay", [ReplayRegistration(c.namespace, 0, N, [], b"")])
        assert isinstance(r, Ok), r
        inbox = c.inbox()
        got = gather(lambda: inbox.read(100_000), lambda g: len(g) >= N, 30)
        assert [n.event_id for n in got] == list(range(N)), c.logs()
        assert all(map_get(n.headers, H_REPLAY_ID) == {"Nat": r.value} for n in got)
        [st] = [s for s in sub.call("icrc77_get_replays", GetReplays()) if s.replay_id == r.value]
        stats = dict(st.stats)
        assert stats["icrc77:replay:relay"]["Principal"].to_str() == c.principal("broadcaster")
        assert stats["icrc77:replay:broadcaster"]["Principal"].to_str() == c.principal(
            "broadcaster2"
        )
        st = wait_until(
            lambda: next(
                s
                for s in sub.call("icrc77_get_replays", GetReplays())
                if s.replay_id == r.value and s.status.final
            ),
            10,
            what="the replay final",
            retry_on=(StopIteration,),
            interval=STATUS_POLL_S,
        )
        assert (st.status.tag, st.status.value) == ("completed", N)
    finally:
        c.stop()
