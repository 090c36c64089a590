"""End to end: the orchestrator process is stopped in the middle of a replay and started
again on its data directory; status still answers (from the journal, ``journal.py``) and the
replay completes with every event delivered once."""

from __future__ import annotations

import time

import pytest

from loglake.events.client import CallRejected
from loglake.events.messages import GetReplays, Ok, Registration, ReplayRegistration
from tests.events.cluster import Cluster

pytestmark = pytest.mark.slow
N = 3_000


def _status(sub, rid):
    [st] = [s for s in sub.call("icrc77_get_replays", GetReplays()) if s.replay_id == rid]
    return st


def test_orchestrator_restart_mid_replay(tmp_path):
    c = Cluster(
        tmp_path,
        extra={
            "orchestrator": ["--data-dir", str(tmp_path / "orch-data")],
            "publisher": ["--batch-size", "50", "--throttle-ms", "20"],
        },
    )
    c.start()
    try:
        pub = c.client("publisher")
        deadline = time.monotonic() + 20
        while True:
            try:
                items = [({"Nat": i}, None) for i in range(N)]
                assert pub.call("loglake_publish", (c.namespace, items)) == list(range(N))
                break
            except CallRejected:
                assert time.monotonic() < deadline, c.logs()
                time.sleep(0.1)
        sub = c.client("orchestrator", "subscriber")
        stopped = [("icrc72:subscription:stopped", {"Bool": True})]
        [r] = sub.call("icrc72_register_subscription", [Registration(c.namespace, stopped)])
        assert isinstance(r, Ok), r
        time.sleep(0.3)
        [r] = sub.call("icrc77_register_replay", [ReplayRegistration(c.namespace, 0, N, [], b"")])
        assert isinstance(r, Ok), r
        rid = r.value
        inbox, got = c.client("subscriber"), []
        deadline = time.monotonic() + 20
        while len(got) < 200 and time.monotonic() < deadline:  # the replay is under way
            got += inbox.call("loglake_inbox", 100_000)
            time.sleep(0.02)
        assert 0 < len(got) < N, "replay finished before the restart; slow the publisher"
        c.stop("orchestrator")
        c.start_one("orchestrator")
        st = _status(sub, rid)  # answered by the restarted process
        assert (st.namespace, st.start, st.end) == (c.namespace, 0, N)
        deadline = time.monotonic() + 60
        while not st.status.final and time.monotonic() < deadline:
            time.sleep(0.1)
            st = _status(sub, rid)
        assert (st.status.tag, st.status.value) == ("completed", N), c.logs()
        deadline = time.monotonic() + 10
        while len(got) < N and time.monotonic() < deadline:
            got += inbox.call("loglake_inbox", 100_000)
            time.sleep(0.05)
        assert [n.event_id for n in got] == list(range(N))
    finally:
        c.stop()
