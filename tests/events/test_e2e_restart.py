"""End to end: the orchestrator process is stopped in the middle of a replay and started
again on its data directory; status still answers (from the journal, ``journal.py``) and the
replay completes with every event delivered once."""

from __future__ import annotations

import pytest

from loglake.events.client import CallRejected
from loglake.events.messages import GetReplays, Ok, Registration, ReplayRegistration
from tests.events.cluster import Cluster
from tests.events.wait import STATUS_POLL_S, gather, wait_until

pytestmark = pytest.mark.slow
N = 3_000


def _status(sub, rid):
    [st] = [s for s in sub.call("icrc77_get_replays", GetReplays()) if s.replay_id == rid]
    return st


def _final(sub, rid):
    st = _status(sub, rid)
    return st if st.status.final else None


def test_orchestrator_restart_mid_replay(tmp_path):
    c = Cluster(
        tmp_path,
        extra={
            "orchestrator": ["--data-dir", str(tmp_path / "orch-data")],
            "publisher": ["--batch-size", "50", "--throttle-ms", "100"],
            "broadcaster": ["--max-unconfirmed", "500"],
        },
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
        # Held mid-way, not raced: the replay is registered and seen running (paced at 500
        # events/s, so 3,000 take 6 s), then the subscriber is stopped: it confirms nothing, so
        # past the broadcaster's window every event is answered Busy and the replay cannot end
        # while the orchestrator restarts. (Stopped before registering, a call to it could hold
        # the replay pending instead.)
        [r] = sub.call("icrc77_register_replay", [ReplayRegistration(c.namespace, 0, N, [], b"")])
        assert isinstance(r, Ok), r
        rid = r.value
        wait_until(
            lambda: _status(sub, rid).status.tag == "running",
            what="replay running",
            interval=STATUS_POLL_S,
        )
        with c.paused("subscriber"):
            c.stop("orchestrator")
            c.start_one("orchestrator")
            st = _status(sub, rid)  # answered by the restarted process
            assert (st.namespace, st.start, st.end) == (c.namespace, 0, N)
            assert st.status.tag == "running", st
        inbox = c.inbox()
        fetch = lambda: inbox.read(100_000)  # noqa: E731
        st = wait_until(
            lambda: _final(sub, rid), 60, fail=False, interval=STATUS_POLL_S
        ) or _status(sub, rid)
        assert (st.status.tag, st.status.value) == ("completed", N), c.logs()
        got = gather(fetch, lambda g: len(g) >= N, 10)
        assert [n.event_id for n in got] == list(range(N))
    finally:
        c.stop()
