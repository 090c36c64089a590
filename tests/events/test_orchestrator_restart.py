"""Orchestrator durability (loglake.events.journal): publications, subscriptions and open
replays survive an orchestrator restart on the same log; the replay in progress completes.

A restart is modelled as a crash: the old core is dropped together with the calls it had queued
but not yet sent, and a new core is constructed on the same log (MemoryLog, or the segment log
closed and reopened from its directory).
"""

from __future__ import annotations

from collections import deque

import cbor2
import pytest

from loglake.events.journal import JournalError, stream_name
from loglake.events.messages import Ok, Registration, ReplayState
from loglake.events.orchestrator import Orchestrator
from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
from loglake.log import MemoryLog, open_log
from loglake.streams.api import LocalStreams
from tests.events.world import NS, World


def restart(w: World, **kw) -> Orchestrator:
    """Crash the orchestrator (its unsent calls are lost) and start a new one on its log."""
    old = w.orch
    w.net.queue = deque((src, c) for src, c in w.net.queue if src is not old)
    bcs = list(old.broadcasters)
    store = StreamsStore(LocalStreams(w.orch_log))
    w.orch = w.net.add(
        open_orchestrator(store, w.p["orch"], bcs, w.quotas, open_ledger(store, fee=1), **kw),
        store,
    )
    return w.orch


def ids(sub):
    return [n.event_id for n in sub.take()]


def test_restart_mid_replay_status_answers_and_the_replay_completes():
    w = World(batch_size=10)
    w.register_publication()
    w.publish(1000)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 1000).value
    for _ in range(60):
        w.net.step()
    before = w.status("bob", rid)
    assert before.status == ReplayState("running")
    old = w.orch
    new = restart(w)
    assert new is not old
    after = w.status("bob", rid)  # answered by the new core, from the journal
    assert (after.namespace, after.start, after.end, after.status) == (NS, 0, 1000, before.status)
    assert dict(after.stats)["icrc77:replay:subscriber"] == {"Principal": w.p["bob"]}
    w.net.run()
    assert ids(w.bob) == list(range(1000))  # each once, in order
    assert w.status("bob", rid).status == ReplayState("completed", 1000)
    # publications and subscriptions survived: live events still flow, ids continue
    w.publish(3, start=1000)
    assert ids(w.bob) == [1000, 1001, 1002]
    [r] = w.call("alice", "icrc72_register_subscription", [Registration(NS, [])])
    assert r == Ok(2)
    assert w.replay("bob", 0, 5).value == rid + 1


def test_replay_journalled_but_never_announced_is_announced_after_restart():
    w = World()
    w.register_publication()
    w.publish(100)
    w.subscribe("bob")
    w.net.queue.clear()
    rid = w.replay("bob", 10, 60).value
    restart(w)  # the crash loses every system message of the registration
    assert w.net.queue == deque()
    w.net.run()  # the first pump of the new core resends them
    assert ids(w.bob) == list(range(10, 60))
    assert w.status("bob", rid).status == ReplayState("completed", 50)


def test_a_lost_final_status_is_reported_again():
    w = World()
    w.register_publication()
    w.publish(100)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 20).value
    w.net.run()
    assert w.status("bob", rid).status == ReplayState("completed", 20)
    # a journal without the last status record = a crash before it was written
    log = MemoryLog()
    for name in w.orch_log.streams():
        log.create_stream(name)
        recs = list(w.orch_log.iter_records(name))
        if name == stream_name():
            while cbor2.loads(recs[-1].data)["op"] != "status":
                recs.pop()
            recs.pop()
        for rec in recs:
            log.append(name, rec.data, timestamp_ns=rec.timestamp_ns)
    w.orch_log = log
    restart(w)
    assert w.status("bob", rid).status == ReplayState("running")
    w.net.run()  # resent add → the publisher repeats its final report
    assert w.status("bob", rid).status == ReplayState("completed", 20)
    assert ids(w.bob) == list(range(20))  # nothing delivered twice


def test_cancel_requested_before_restart_ends_canceled():
    w = World(batch_size=10)
    w.register_publication()
    w.publish(1000)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 1000).value
    for _ in range(40):
        w.net.step()
    w.net.queue.clear()  # the crash also loses the removes
    assert w.call("bob", "icrc77_cancel_replay", [rid]) == [Ok(rid)]
    w.net.queue.clear()
    restart(w)
    w.net.run()
    st = w.status("bob", rid).status
    assert st.tag == "canceled" and st.value < 1000
    got = ids(w.bob)
    assert got == list(range(len(got)))


def test_relayed_replay_survives_restart():
    w = World(homes={"bob": "bc2"}, batch_size=10)
    w.register_publication()
    w.publish(300)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 300).value
    for _ in range(30):
        w.net.step()
    restart(w, homes={w.p["bob"].bytes: w.p["bc2"]})
    assert dict(w.status("bob", rid).stats)["icrc77:replay:relay"] == {"Principal": w.p["bc"]}
    w.net.run()
    assert ids(w.bob) == list(range(300))
    assert w.status("bob", rid).status == ReplayState("completed", 300)


def test_state_survives_reopening_the_segment_log(tmp_path):
    w = World()
    w.orch_log = open_log(tmp_path / "orch")
    restart(w)
    w.register_publication()
    w.publish(50)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 50).value
    w.orch_log.close()
    w.orch_log = open_log(tmp_path / "orch")
    restart(w)
    assert NS in w.orch.publications and w.orch.publications[NS].head == 50
    w.net.run()
    assert ids(w.bob) == list(range(50))
    assert w.status("bob", rid).status == ReplayState("completed", 50)
    w.orch_log.close()


@pytest.mark.parametrize(
    "data",
    [b"\xff\x00", cbor2.dumps([1, 2]), cbor2.dumps({"op": "nope"}), cbor2.dumps({"op": "status"})],
)
def test_a_malformed_journal_refuses_to_start(data):
    log = MemoryLog()
    log.create_stream(stream_name())
    log.append(stream_name(), data)
    w = World()
    with pytest.raises(JournalError):
        open_orchestrator(StreamsStore(LocalStreams(log)), w.p["orch"], [w.p["bc"]])


def test_cancel_after_a_crash_that_lost_the_add_ends_canceled():
    """The crash loses the replay's add before it left; then a cancel. The restart must not
    send only the remove (the publisher never heard of the replay and would ignore it)."""
    w = World()
    w.register_publication()
    w.publish(100)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 50).value
    w.net.queue.clear()  # the crash loses every system message of the registration
    assert w.call("bob", "icrc77_cancel_replay", [rid]) == [Ok(rid)]
    w.net.queue.clear()  # ... and those of the cancel
    restart(w)
    w.net.run()
    assert w.status("bob", rid).status == ReplayState("canceled", 0)
    assert ids(w.bob) == []
