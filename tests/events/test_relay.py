"""The ICRC-77 relay tier: ``icrc77:broadcaster:replay_relay:add|remove`` and
``icrc77:broadcaster:replay_relayer:add|remove`` (specs/icrc-77-event-replay.txt, "Control Plane
via ICRC-72 System Namespaces", lines ~137-144), driven with the sans-I/O cores on a fake clock.

The payload vectors below are written from the spec's type lines, field by field:
``replay_relay:add`` = ``#Array[#Array[#Nat, #Text, #Blob, #Blob, filter, skip]]`` (ReplayID,
Namespace, Target Broadcaster, Publisher, Filter, Skip); ``replay_relayer:add`` =
``#Array[#Nat, #Text, #Blob]`` (ReplayID, Namespace, relay); both removes = ``#Array[#Nat]``.
"""

from __future__ import annotations

import pytest

from loglake.events import sysmsg
from loglake.events.filters import Skip
from loglake.events.messages import H_REPLAY_ID, Err, Event, Ok, ReplayState
from loglake.wire import icrc16
from loglake.wire.icrc16 import map_get
from tests.events.world import NS, World, blob, seeded

P1, P2 = seeded(11).principal, seeded(12).principal


def test_relay_add_payload_is_the_spec_shape_and_round_trips():
    item = sysmsg.RelayAdd(7, NS, P1, P2, 'kind == "a"', Skip(3, 1))
    v = sysmsg.broadcaster_relay_add([item])
    assert v == {
        "Map": [
            (
                "icrc77:broadcaster:replay_relay:add",
                {
                    "Array": [
                        {
                            "Array": [
                                {"Nat": 7},
                                {"Text": NS},
                                {"Blob": P1.bytes},
                                {"Blob": P2.bytes},
                                {"Text": 'kind == "a"'},
                                {"Array": [{"Nat": 3}, {"Nat": 1}]},
                            ]
                        }
                    ]
                },
            )
        ]
    }
    [(_, payload)] = sysmsg.entries(icrc16.decode(icrc16.encode(v)))
    assert sysmsg.read_relay_add(payload) == [item]
    bare = sysmsg.RelayAdd(8, NS, P1, P2, None, None)
    [(_, payload)] = sysmsg.entries(sysmsg.broadcaster_relay_add([bare]))
    assert payload["Array"][0]["Array"][4:] == [{"Option": None}, {"Option": None}]
    assert sysmsg.read_relay_add(payload) == [bare]


def test_relayer_add_is_one_flat_triple_and_removes_are_nat_arrays():
    v = sysmsg.broadcaster_relayer_add(sysmsg.RelayerAdd(7, NS, P1))
    assert v == {
        "Map": [
            (
                "icrc77:broadcaster:replay_relayer:add",
                {"Array": [{"Nat": 7}, {"Text": NS}, {"Blob": P1.bytes}]},
            )
        ]
    }
    [(_, payload)] = sysmsg.entries(v)
    assert sysmsg.read_relayer_add(payload) == sysmsg.RelayerAdd(7, NS, P1)
    for make, key in (
        (sysmsg.broadcaster_relay_remove, "icrc77:broadcaster:replay_relay:remove"),
        (sysmsg.broadcaster_relayer_remove, "icrc77:broadcaster:replay_relayer:remove"),
    ):
        assert make([7, 9]) == {"Map": [(key, {"Array": [{"Nat": 7}, {"Nat": 9}]})]}


@pytest.mark.parametrize(
    "payload",
    [
        {"Nat": 1},
        {"Array": [{"Array": [{"Nat": 1}, {"Text": NS}, {"Blob": P1.bytes}]}]},  # 3 of 6
        {
            "Array": [
                {
                    "Array": [
                        {"Nat": 1},
                        {"Text": NS},
                        {"Blob": b"x" * 30},
                        {"Blob": b""},
                        {"Option": None},
                        {"Option": None},
                    ]
                }
            ]
        },
        {
            "Array": [
                {
                    "Array": [
                        {"Text": "1"},
                        {"Text": NS},
                        {"Blob": P1.bytes},
                        {"Blob": P2.bytes},
                        {"Option": None},
                        {"Option": None},
                    ]
                }
            ]
        },
        {
            "Array": [
                {
                    "Array": [
                        {"Nat": 1},
                        {"Text": NS},
                        {"Blob": P1.bytes},
                        {"Blob": P2.bytes},
                        {"Option": None},
                        {"Array": [{"Nat": 0}]},
                    ]
                }
            ]
        },
    ],
)
def test_malformed_relay_add_is_a_typed_error(payload):
    with pytest.raises(sysmsg.SysMessageError):
        sysmsg.read_relay_add(payload)


def test_malformed_relayer_add_is_a_typed_error():
    for bad in ({"Array": [{"Nat": 1}, {"Text": NS}]}, {"Array": [{"Array": [{"Nat": 1}]}]}):
        with pytest.raises(sysmsg.SysMessageError):
            sysmsg.read_relayer_add(bad)


def _relayed(**kw) -> World:
    w = World(homes={"bob": "bc2"}, **kw)
    w.register_publication()
    w.publish(1000)
    w.subscribe("alice")
    w.subscribe("bob")
    w.alice.take()
    return w


def test_orchestrator_alerts_target_then_relay_before_the_publisher():
    w = _relayed()
    w.net.queue.clear()
    rid = w.replay("bob", 10, 20).value
    sent = [
        (c.target, c.arg[0].namespace, sysmsg.entries(c.arg[0].data)[0][0]) for _, c in w.net.queue
    ]
    p = w.p
    assert sent == [
        (p["bob"], sysmsg.subscriber_sys(p["bob"]), sysmsg.SUBSCRIBER_BROADCASTER_ADD),
        (p["bc2"], sysmsg.broadcaster_sys(p["bc2"]), sysmsg.BROADCASTER_REPLAY_ADD),
        (p["bc2"], sysmsg.broadcaster_sys(p["bc2"]), sysmsg.BROADCASTER_RELAYER_ADD),
        (p["bc"], sysmsg.broadcaster_sys(p["bc"]), sysmsg.BROADCASTER_RELAY_ADD),
        (p["pub"], sysmsg.publisher_sys(p["pub"]), sysmsg.PUBLISHER_REPLAY_ADD),
    ]
    # the target's replay:add names the relay; the publisher publishes to the relay
    [a] = sysmsg.read_broadcaster_replay_add(sysmsg.entries(w.net.queue[1][1].arg[0].data)[0][1])
    assert (a.replay_id, a.relay, a.subscriber, a.publisher) == (rid, p["bc"], p["bob"], p["pub"])
    [pa] = sysmsg.read_publisher_replay_add(sysmsg.entries(w.net.queue[4][1].arg[0].data)[0][1])
    assert pa.broadcaster == p["bc"]
    st = w.status("bob", rid)
    stats = dict(st.stats)
    assert stats["icrc77:replay:broadcaster"] == {"Principal": p["bc2"]}
    assert stats["icrc77:replay:relay"] == {"Principal": p["bc"]}
    # every system message is in the stream of its system namespace (auditable)
    assert w.orch_log.next_index(sysmsg.broadcaster_sys(p["bc2"])) >= 2


def test_replay_flows_publisher_relay_target_subscriber():
    w = _relayed()
    rid = w.replay("bob", 100, 350).value
    w.net.run()
    notes = w.bob.take()
    assert [n.event_id for n in notes] == list(range(100, 350))
    assert all(map_get(n.headers, H_REPLAY_ID) == {"Nat": rid} for n in notes)
    assert w.bob.replays[rid].broadcaster == w.p["bc2"]  # delivered by the target
    assert w.bc.relays[rid].forwarded == 250 and w.bc.stats.relayed == 250
    assert w.bc2.stats.notified == 250 and w.bc2.pending == {}  # all confirmed at the target
    assert w.bc.stats.notified == 0  # the relay notified nobody itself
    assert w.status("bob", rid).status == ReplayState("completed", 250)
    assert w.alice.take() == []  # a replay goes to its subscriber only
    w.publish(5, start=1000)  # live events keep flowing on the publication's broadcaster
    assert [n.event_id for n in w.bob.take()] == list(range(1000, 1005))


def test_filter_and_skip_apply_at_the_relay():
    w = _relayed()
    cfg = [("filter", {"Text": 'kind == "a"'}), ("skip", {"Array": [{"Nat": 4}]})]
    rid = w.replay("bob", 0, 100, cfg).value
    w.net.run()
    assert [n.event_id for n in w.bob.take()] == list(range(0, 100, 4))
    assert w.bc.relays[rid].forwarded == 25  # dropped events did not cross the second hop


def test_relay_replays_option_puts_every_replay_through_a_relay():
    w = World(relay_replays=True)
    w.register_publication()
    w.publish(50)
    w.subscribe("bob")
    rid = w.replay("bob", 0, None).value
    w.net.run()
    assert [n.event_id for n in w.bob.take()] == list(range(50))
    assert w.bc.stats.relayed == 50 and w.bc2.stats.notified == 50
    assert w.status("bob", rid).status == ReplayState("completed", 50)


def test_cancel_removes_relay_and_relayer_and_stops_the_flow():
    w = _relayed(batch_size=10)
    rid = w.replay("bob", 0, 1000).value
    for _ in range(40):
        w.net.step()
    assert w.call("bob", "icrc77_cancel_replay", [rid]) == [Ok(rid)]
    w.net.run()
    got = [n.event_id for n in w.bob.take()]
    st = w.status("bob", rid).status
    assert st.tag == "canceled" and 0 < len(got) <= st.value < 1000
    assert got == list(range(len(got)))
    assert rid not in w.bc.relays and rid not in w.bc2.replays


def test_target_busy_is_retried_by_the_relay():
    w = _relayed()
    w.bc2.max_unconfirmed = 0
    rid = w.replay("bob", 0, 30).value
    w.net.run(max_steps=200)
    assert w.bob.take() == [] and w.bc2.stats.busy > 0
    r = w.bc.relays[rid]
    assert r.forwarded == 0 and r.inflight + len(r.retry) == 30  # held by the relay, not lost
    assert w.bc2.stats.busy <= 30 * 3  # backed off, not resent at every step (it spun)
    w.bc2.max_unconfirmed = 1_000
    w.settle()  # past the relay's back-off
    assert [n.event_id for n in w.bob.take()] == list(range(30))


def test_events_the_target_answered_busy_are_resent_within_the_body_limit():
    """The relay resent the events its target answered ``Busy`` in calls of ``relay_batch``
    (500) events whatever their size: held back from several of the Publisher's 1 MB calls,
    500 events of 20 kB were one 10 MB call, over the target's 8 MiB body limit (413). The
    relay counted them in ``relay_failed`` and resent nothing, and the replay ended
    ``completed(500)`` with none delivered. The relay cuts its calls at the Publisher's 1 MB
    budget too."""
    from loglake.events.server import MAX_BODY_BYTES

    n, size = 500, 20_000
    assert n * size > MAX_BODY_BYTES
    w = World(homes={"bob": "bc2"}, max_body_bytes=MAX_BODY_BYTES, batch_size=n)
    w.register_publication()
    w.publish_blobs(n, size, 50)
    w.subscribe("bob")
    w.bc2.max_unconfirmed = 0
    rid = w.replay("bob", 0, n).value
    for _ in range(1_000):  # until the relay holds every event the target answered Busy
        w.net.step()
        r = w.bc.relays.get(rid)
        if r is not None and len(r.retry) + w.bc.stats.relay_failed >= n:
            break
    w.bc2.max_unconfirmed = 1_000
    w.settle()  # past the relay's back-off
    notes = w.bob.take()
    assert [x.event_id for x in notes] == list(range(n))
    assert all(x.data == {"Blob": blob(x.event_id, size)} for x in notes)
    assert w.bc.stats.relay_failed == 0
    assert w.status("bob", rid).status == ReplayState("completed", n)


def test_relay_window_pushes_back_on_the_publisher():
    w = _relayed(relay_window=5, batch_size=10)
    w.bc2.max_unconfirmed = 0
    rid = w.replay("bob", 0, 40).value
    w.net.run(max_steps=300)
    assert w.bc.stats.busy > 0  # the relay answered Busy to the publisher
    assert len(w.bc.relays[rid].retry) + w.bc.relays[rid].inflight <= 5
    w.bc2.max_unconfirmed = 1_000
    w.settle(rounds=20, seconds=1)  # the publisher backs off a fully Busy reply (0.1 s...)
    assert [n.event_id for n in w.bob.take()] == list(range(40))
    assert w.status("bob", rid).status == ReplayState("completed", 40)


def test_target_accepts_replayed_events_only_from_the_named_relay():
    w = _relayed()
    rid = w.replay("bob", 0, 1).value
    # before anything runs, bc2 has not been told the replay: the relay is refused
    e = Event(0, None, 0, NS, {"Nat": 1}, w.p["pub"], [(H_REPLAY_ID, {"Nat": rid})])
    assert w.call("bc", "icrc72_publish", [e], target="bc2") == [Err("Unauthorized")]
    w.net.run()
    assert w.call("alice", "icrc72_publish", [e], target="bc2") == [Err("Unauthorized")]
    # with a relay, not even the publisher may skip the relay
    assert w.call("pub", "icrc72_publish", [e], target="bc2") == [Err("Unauthorized")]
    assert w.bc2.replays[rid].relayers == {w.p["bc"].bytes}


def test_relayer_add_for_a_replay_not_assigned_here_is_refused():
    w = _relayed()
    data = sysmsg.broadcaster_relayer_add(sysmsg.RelayerAdd(99, NS, w.p["bc"]))
    with pytest.raises(sysmsg.SysMessageError):
        w.bc2._apply(sysmsg.BROADCASTER_RELAYER_ADD, sysmsg.entries(data)[0][1], 0)
    assert w.bc2.replays == {}


def test_home_broadcasters_must_be_known_and_the_cli_form_is_checked():
    from loglake.events.cli import CliError, _homes
    from loglake.events.orchestrator import Orchestrator

    w = World()
    with pytest.raises(ValueError, match="not one of the broadcasters"):
        Orchestrator(w.p["orch"], [w.p["bc"]], homes={w.p["bob"].bytes: w.p["bc2"]})
    assert _homes((f"{w.p['bob'].to_str()}={w.p['bc2'].to_str()}",)) == {
        w.p["bob"].bytes: w.p["bc2"]
    }
    with pytest.raises(CliError):
        _homes(("no-equals-sign",))


def _failing(role):
    """``role``'s icrc72_publish fails (a connection error, as over HTTP) until undone."""
    real = role.methods["icrc72_publish"]

    def down(caller, arg, now):
        raise ConnectionError("target restarting")

    role.methods["icrc72_publish"] = down
    return lambda: role.methods.__setitem__("icrc72_publish", real)


def test_forwards_the_target_failed_to_answer_are_sent_again():
    """A forward that failed (the target restarting) was counted in ``relay_failed`` and never
    sent again, while the Publisher had its ``Ok``: the replay ended ``completed(30)`` with none
    of the 30 delivered."""
    w = _relayed()
    up = _failing(w.bc2)
    rid = w.replay("bob", 0, 30).value
    w.net.run()
    assert w.bob.take() == [] and len(w.bc.relays[rid].retry) == 30  # held, with back-off
    up()
    w.clock.now += 1_000_000_000
    w.net.run()
    assert [n.event_id for n in w.bob.take()] == list(range(30))
    assert w.bc.stats.relay_failed == 0
    assert w.status("bob", rid).status == ReplayState("completed", 30)


def test_forwards_to_a_target_down_for_good_are_given_up(caplog):
    w = _relayed()
    _failing(w.bc2)
    rid = w.replay("bob", 0, 30).value
    with caplog.at_level("WARNING", "loglake.events"):
        for _ in range(20):
            w.net.run()
            w.clock.now += 10_000_000_000
    r = w.bc.relays[rid]
    assert not r.retry and r.inflight == 0 and w.bc.stats.relay_failed == 30
    assert any("given up after 12 failed forwards" in x.message for x in caplog.records)


def test_forwards_failing_together_count_as_one_failed_round():
    """The calls in flight when the target went down fail together: counted a failure each,
    20 calls of an outage gave up calls 12 to 20 on their first attempt (450 of 1,000 events
    lost, the replay completed(1000))."""
    w = _relayed(batch_size=50)
    w.bc.relay_batch = 50
    up = _failing(w.bc2)
    rid = w.replay("bob", 0, 1000).value
    w.net.run()
    up()
    for _ in range(5):
        w.clock.now += 1_000_000_000
        w.net.run()
    assert [n.event_id for n in w.bob.take()] == list(range(1000))
    assert w.bc.stats.relay_failed == 0
    assert w.status("bob", rid).status == ReplayState("completed", 1000)
