"""The four role cores driven together in one process on a fake clock (loglake.events.network).

Each test is one rule of specs/icrc-77-event-replay.txt or the ICRC-72 candidate; every message
passes through the Candid codec on the way, as it would over HTTP.
"""

from __future__ import annotations

import threading

import pytest

from loglake.events.broadcaster import Broadcaster
from loglake.events.messages import (
    C_SUBS_DISALLOWED,
    H_REPLAY_END_ID,
    H_REPLAY_ID,
    Err,
    Ok,
    ReplayState,
    ReplayStatusUpdate,
)
from loglake.events.network import Faults
from loglake.events.orchestrator import Quotas
from loglake.events.publisher import Publisher
from loglake.events.subscriber import Subscriber
from loglake.log.api import StreamConfig
from loglake.wire.icrc16 import map_get
from tests.events.world import NS, World


def ids(sub):
    return [n.event_id for n in sub.take()]


def test_live_events_reach_subscribers_and_are_confirmed():
    w = World()
    w.register_publication()
    w.subscribe("alice")
    w.publish(250)
    assert ids(w.alice) == list(range(250))
    assert w.bc.pending == {}  # every notification confirmed (ICRC-72 confirmation flow)


def test_late_subscriber_replays_closed_range_exactly_once_with_headers():
    w = World()
    w.register_publication()
    w.publish(1000)
    w.subscribe("bob")
    r = w.replay("bob", 100, 350)
    assert isinstance(r, Ok)
    assert w.status("bob", r.value).status == ReplayState("pending")
    w.net.run()
    notes = w.bob.take()
    assert [n.event_id for n in notes] == list(range(100, 350))
    assert all(map_get(n.headers, H_REPLAY_ID) == {"Nat": r.value} for n in notes)
    assert all(map_get(n.headers, H_REPLAY_END_ID) is None for n in notes)  # request had an end
    assert notes[0].data == {"Map": [("i", {"Nat": 100}), ("kind", {"Text": "a"})]}
    assert w.status("bob", r.value).status == ReplayState("completed", 250)


def test_status_goes_pending_running_completed():
    w = World(batch_size=10)
    w.register_publication()
    w.publish(100)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 100).value
    seen = []
    while w.net.step():
        s = w.status("bob", rid).status
        if not seen or seen[-1] != s:
            seen.append(s)
    assert [s.tag for s in seen] == ["pending", "running", "completed"]
    assert seen[-1].value == 100


def test_open_ended_replay_carries_end_id_on_every_event():
    w = World()
    w.register_publication()
    w.publish(500)
    w.subscribe("bob")
    rid = w.replay("bob", 250, None).value  # three publisher batches of 100
    w.net.run()
    notes = w.bob.take()
    assert [n.event_id for n in notes] == list(range(250, 500))
    assert {map_get(n.headers, H_REPLAY_END_ID)["Nat"] for n in notes} == {499}
    assert w.bob.replays[rid].reached_end


def test_filter_and_skip_apply_to_replays():
    w = World()
    w.register_publication()
    w.publish(300)
    w.subscribe("bob")
    cfg = [("filter", {"Text": 'kind == "a"'}), ("skip", {"Array": [{"Nat": 3}, {"Nat": 1}]})]
    rid = w.replay("bob", 0, 300, cfg).value
    w.net.run()
    want = [i for i in range(300) if i % 2 == 0 and (i + 1) % 3 == 0]
    assert ids(w.bob) == want
    assert w.status("bob", rid).status == ReplayState("completed", 300)


def test_subscription_filter_skip_and_stopped_apply_to_live_events():
    w = World()
    w.register_publication()
    w.subscribe(
        "alice",
        [
            ("icrc72:subscription:filter", {"Text": "i >= 10"}),
            ("icrc72:subscription:skip", {"Array": [{"Nat": 5}]}),
        ],
    )
    w.subscribe("bob", [("icrc72:subscription:stopped", {"Bool": True})])
    w.publish(30)
    assert ids(w.alice) == [10, 15, 20, 25]
    assert ids(w.bob) == []


def test_cancel_stops_enqueuing_and_sent_notifications_stay_sent():
    w = World(batch_size=10)
    w.register_publication()
    w.publish(1000)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 1000).value
    for _ in range(40):
        w.net.step()
    [c] = w.call("bob", "icrc77_cancel_replay", [rid])
    assert c == Ok(rid)
    w.net.run()
    got = ids(w.bob)
    st = w.status("bob", rid).status
    assert st.tag == "canceled" and 0 < st.value < 1000
    assert got == list(range(len(got))) and len(got) <= st.value
    w.publish(0)
    assert w.net.run() == 0 and ids(w.bob) == []  # nothing more arrives


def test_a_paced_replay_sends_no_faster_than_its_rate_by_the_clock():
    w = World(batch_size=100, replay_rate=1000)  # a batch of 100 each 100 ms
    w.register_publication()
    w.publish(1000)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 1000).value
    w.net.run()  # idle: the first batch went, the second waits for its slot
    assert ids(w.bob) == list(range(100))
    assert w.status("bob", rid).status.tag == "running"
    w.clock.now += 50_000_000  # half a slot: still nothing
    w.net.run()
    assert ids(w.bob) == []
    got = []
    for _ in range(9):
        w.clock.now += 100_000_000
        w.net.run()
        batch = ids(w.bob)
        assert len(batch) == 100, len(batch)  # one batch a slot, even after a late pump
        got += batch
    assert got == list(range(100, 1000))
    assert w.status("bob", rid).status == ReplayState("completed", 1000)


def test_a_paced_replay_can_be_cancelled_between_its_batches():
    w = World(batch_size=100, replay_rate=1000)
    w.register_publication()
    w.publish(1000)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 1000).value
    w.net.run()
    assert w.call("bob", "icrc77_cancel_replay", [rid]) == [Ok(rid)]
    w.clock.now += 10**9
    w.net.run()
    assert w.status("bob", rid).status == ReplayState("canceled", 100)
    assert ids(w.bob) == list(range(100))


@pytest.mark.parametrize("rate", [0, -5.0])
def test_a_replay_rate_must_be_positive(rate):
    from loglake.events.publisher import Publisher
    from tests.events.world import seeded

    with pytest.raises(ValueError, match="replay_rate"):
        Publisher(seeded(1).principal, seeded(2).principal, replay_rate=rate)


def test_replay_of_trimmed_history_errors_with_a_reason():
    w = World()
    w.register_publication()
    w.pub_log.create_stream(NS, StreamConfig(retention_records=100))
    w.publish(300)
    w.pub_log.enforce_retention()
    w.subscribe("bob")
    rid = w.replay("bob", 0, 300).value
    w.net.run()
    st = w.status("bob", rid).status
    assert st.tag == "errored" and "200" in st.value


def test_subscriber_deduplicates_by_namespace_and_event_id():
    w = World()
    w.register_publication()
    w.subscribe("alice")
    w.publish(50)
    assert len(w.alice.take()) == 50
    w.replay("alice", 0, 50)
    w.net.run()
    assert w.alice.take() == [] and w.alice.duplicates == 50
    assert w.bc.pending == {}  # duplicates are still confirmed


def test_paid_replay_moves_tokens_and_the_ledger_survives_reopening():
    from loglake.events.ledger import account
    from loglake.events.store import StreamsStore, open_ledger
    from loglake.streams.api import LocalStreams

    w = World()
    w.priced(per_event=2)
    w.publish(100)
    w.subscribe("bob")
    w.ledger.mint(account(w.p["bob"]), 1_000, w.clock())
    assert w.call("bob", "icrc2_approve", (w.p["orch"], 500)) == Ok(1)
    r = w.replay("bob", 0, 100)
    assert isinstance(r, Ok)
    assert w.call("bob", "icrc1_balance_of", (w.p["bob"], None)) == 1_000 - 1 - 201
    assert w.call("bob", "icrc1_balance_of", (w.p["pub"], None)) == 200
    again = open_ledger(StreamsStore(LocalStreams(w.orch_log)), fee=1)
    assert again.balances == w.ledger.balances and again.allowances == w.ledger.allowances


def test_a_paid_replay_canceled_or_failed_keeps_its_charge():
    """ICRC-77 says nothing of refunds (Payment: MAY require it, SHOULD advertise the price,
    MUST answer ``PaymentRequired``; a cancel "stops enqueuing further events; sent
    notifications are not recalled"), so loglake invents none: the price of the whole range is
    taken at registration and stays with the publisher whatever the replay's end
    (docs/events.md, "Payment for a replay that does not complete")."""
    from loglake.events.ledger import account

    w = World(batch_size=100, replay_rate=1000)  # a batch of 100 each 100 ms: cancelled mid-way
    w.priced(per_event=2)
    w.publish(1000)
    w.subscribe("bob")
    w.ledger.mint(account(w.p["bob"]), 10_000, w.clock())
    assert w.call("bob", "icrc2_approve", (w.p["orch"], 10_000)) == Ok(1)

    def balances() -> tuple[int, int]:
        return tuple(w.call("bob", "icrc1_balance_of", (w.p[k], None)) for k in ("bob", "pub"))

    canceled = w.replay("bob", 0, 1000).value
    w.net.run()
    assert w.call("bob", "icrc77_cancel_replay", [canceled]) == [Ok(canceled)]
    w.clock.now += 10**9
    w.net.run()
    assert w.status("bob", canceled).status == ReplayState("canceled", 100)
    assert balances() == (10_000 - 1 - 2_001, 2_000)  # 900 events never sent: no refund
    failed = w.replay("bob", 0, 500).value
    update = ReplayStatusUpdate(failed, ReplayState("errored", "archive unreachable"))
    assert w.call("pub", "icrc77_replay_status", [update]) == [Ok(None)]
    assert w.status("bob", failed).status.tag == "errored"
    assert balances() == (10_000 - 1 - 2_001 - 1_001, 3_000)


# --- every ReplayRegisterError variant through a real request ---------------------------------
def _ready(**kw) -> World:
    w = World(**kw)
    w.register_publication()
    w.publish(100)
    w.subscribe("bob")
    return w


def test_unauthorized_anonymous_caller():
    from loglake.events.identity import ANONYMOUS

    w = _ready()
    assert w.replay(ANONYMOUS, 0, 10) == Err("Unauthorized")


def test_unauthorized_subscriber_when_the_publication_denies_the_caller():
    w = World()
    w.register_publication(
        [
            ("icrc77:replay", {"Bool": True}),
            (C_SUBS_DISALLOWED, {"Array": [{"Blob": w.p["alice"].bytes}]}),
        ]
    )
    assert w.replay("alice", 0, 1) == Err("UnauthorizedSubscriber", {"namespace": NS})


@pytest.mark.parametrize(
    "start,end,config,memo,needle",
    [
        (5, 2, [], b"", "start 5 > end 2"),
        (0, 10, [("skip", {"Array": [{"Nat": 0}]})], b"", "mod"),
        (0, 10, [("skip", {"Array": [{"Text": "x"}]})], b"", "#Nat"),
        (0, 10, [("filter", {"Text": "a == "})], b"", "literal"),
        (0, 10, [("filter", {"Nat": 1})], b"", "#Text"),
        (0, 10, [("colour", {"Text": "red"})], b"", "unsupported"),
        (0, 10, [], b"x" * 33, "memo"),
    ],
)
def test_improper_config(start, end, config, memo, needle):
    w = _ready()
    r = w.replay("bob", start, end, config, memo)
    assert r.tag == "ImproperConfig" and needle in r.payload
    assert w.orch.replays == {}  # no state changed


def test_payment_required_without_allowance():
    w = World()
    w.priced(per_event=1)
    w.publish(10)
    w.subscribe("bob")
    r = w.replay("bob", 0, 10)
    assert r.tag == "PaymentRequired" and "10 icrc1:loglake" in r.payload
    assert w.orch.replays == {}


def test_range_too_large():
    w = _ready(quotas=Quotas(max_events_per_replay=50))
    r = w.replay("bob", 0, None)
    assert r.tag == "RangeTooLarge" and "100 events" in r.payload
    assert isinstance(w.replay("bob", 0, 50), Ok)


def test_generic_error_for_concurrency_rate_and_capability():
    # four requests a window: bob's subscription (a request too) and three replays
    w = _ready(quotas=Quotas(max_concurrent_per_subscriber=1, max_requests_per_window=4))
    assert isinstance(w.replay("bob", 0, 10), Ok)
    r = w.replay("bob", 0, 10)
    assert r.tag == "GenericError" and r.payload["error_code"] == 1
    w.net.run()  # the first completes: a slot frees
    assert isinstance(w.replay("bob", 0, 10), Ok)
    r = w.replay("bob", 0, 10)
    assert r.tag == "GenericError" and r.payload["error_code"] == 2
    w2 = World()
    w2.register_publication([])  # no icrc77:replay
    w2.subscribe("bob")
    r = w2.replay("bob", 0, 1)
    assert r.tag == "GenericError" and r.payload["error_code"] == 3


def test_generic_batch_error_for_oversized_batches():
    from loglake.events.messages import ReplayRegistration

    w = _ready(quotas=Quotas(max_batch=2))
    regs = [ReplayRegistration(NS, 0, 1)] * 3
    out = w.call("bob", "icrc77_register_replay", regs)
    assert [r.tag for r in out] == ["GenericBatchError"] * 3
    assert w.orch.replays == {}
    # the publisher's batch methods too (they had no bound: each item was journalled)
    updates = [(NS, "loglake:publication:head", {"Nat": 5})] * 3
    out = w.call("pub", "icrc72_update_publication", updates)
    assert [r.tag for r in out] == ["GenericBatchError"] * 3
    statuses = [ReplayStatusUpdate(1, ReplayState("running", None))] * 3
    out = w.call("pub", "icrc77_replay_status", statuses)
    assert [(r.tag, r.payload["error_code"]) for r in out] == [("GenericError", 413)] * 3


def test_publication_and_subscription_not_found():
    w = _ready()
    from loglake.events.messages import ReplayRegistration

    [r] = w.call("bob", "icrc77_register_replay", [ReplayRegistration("no.such.ns", 0, 1)])
    assert r == Err("PublicationNotFound")
    assert w.replay("alice", 0, 1) == Err("SubscriptionNotFound")


def test_batch_results_are_one_per_item_in_order():
    from loglake.events.messages import ReplayRegistration

    w = _ready()
    out = w.call(
        "bob",
        "icrc77_register_replay",
        [
            ReplayRegistration(NS, 0, 5),
            ReplayRegistration(NS, 9, 2),
            ReplayRegistration("x.y", 0, 1),
        ],
    )
    assert isinstance(out[0], Ok)
    assert [o.tag for o in out[1:]] == ["ImproperConfig", "PublicationNotFound"]


# --- every CancelReplayError variant -------------------------------------------------------
def test_cancel_errors():
    w = _ready(quotas=Quotas(max_batch=3, max_requests_per_window=5))
    w.subscribe("alice")
    rid = w.replay("bob", 0, 100).value
    before = w.status("bob", rid)
    assert w.call("alice", "icrc77_cancel_replay", [rid]) == [Err("Unauthorized")]
    assert w.status("bob", rid) == before  # another's replay is untouched
    assert w.call("bob", "icrc77_cancel_replay", [999]) == [Err("NotFound")]
    assert [r.tag for r in w.call("bob", "icrc77_cancel_replay", [1, 2, 3, 4])] == [
        "GenericBatchError"
    ] * 4
    w.net.run()
    [r] = w.call("bob", "icrc77_cancel_replay", [rid])
    assert r.tag == "CannotCancel" and "completed" in r.payload
    out = w.call("bob", "icrc77_cancel_replay", [rid] * 3)
    assert out[-1].tag == "GenericError" and out[-1].payload["error_code"] == 2


def test_status_updates_only_from_the_assigned_publisher():
    w = _ready()
    rid = w.replay("bob", 0, 10).value
    [r] = w.call(
        "bob", "icrc77_replay_status", [ReplayStatusUpdate(rid, ReplayState("completed", 0))]
    )
    assert r.tag == "GenericError" and r.payload["error_code"] == 401
    assert w.status("bob", rid).status == ReplayState("pending")
    [r] = w.call("pub", "icrc77_replay_status", [ReplayStatusUpdate(77, ReplayState("running"))])
    assert r.payload["error_code"] == 404


def test_broadcaster_answers_busy_and_the_publisher_resends():
    w = _ready(max_unconfirmed=0)
    rid = w.replay("bob", 0, 20).value
    for _ in range(10):
        w.net.step()
    assert w.bc.stats.busy > 0 and ids(w.bob) == []
    w.bc.max_unconfirmed = 1_000
    w.settle()  # past the publisher's back-off
    assert ids(w.bob) == list(range(20))
    assert w.status("bob", rid).status == ReplayState("completed", 20)


def test_notifications_from_an_unassigned_broadcaster_are_refused():
    from loglake.events.messages import EventNotification

    w = _ready()
    n = EventNotification(1, 0, None, 0, NS, {"Nat": 1}, None, w.p["pub"], None)
    assert w.call("alice", "icrc72_handle_notification", [n], target="bob") == 0
    assert w.bob.rejected == 1 and w.bob.take() == []


def test_subscriber_reads_both_end_header_names():
    # ICRC-77 names the end header icrc77:replay:end (comment) and :end_id (header list).
    from loglake.events.messages import H_REPLAY_END, EventNotification

    w = _ready()
    w.net.run()
    for rid, key in ((51, H_REPLAY_END), (52, H_REPLAY_END_ID)):
        hdrs = [(H_REPLAY_ID, {"Nat": rid}), (key, {"Nat": 7})]
        n = EventNotification(rid, 7, 6, 0, NS, {"Nat": 1}, hdrs, w.p["pub"], None)
        assert w.call("bc", "icrc72_handle_notification", [n], target="bob") == 1
        assert w.bob.replays[rid].end_id == 7 and w.bob.replays[rid].reached_end


def test_ledger_rules():
    from loglake.events.ledger import Ledger, LedgerError, account

    led = Ledger(fee=2)
    a, b, s = account(b"\x01"), account(b"\x02"), account(b"\x03")
    led.mint(a, 100, 0)
    with pytest.raises(LedgerError) as e:
        led.transfer_from(s, a, b, 10, 0)
    assert e.value.kind == "InsufficientAllowance"
    led.approve(a, s, 50, 0)  # costs the fee
    assert led.balance_of(a) == 98 and led.allowance(a, s) == 50
    led.transfer_from(s, a, b, 40, 0)  # spends 40 + fee of the allowance
    assert (led.balance_of(a), led.balance_of(b), led.allowance(a, s)) == (56, 40, 8)
    with pytest.raises(LedgerError) as e:
        led.transfer(b, a, 39, 0)
    assert e.value.kind == "InsufficientFunds"


def test_ledger_restore_skips_the_claim_of_a_node_taking_it_over():
    """On a shared cluster the ledger stream also holds claim records (``streams.fence``) of
    the nodes that took the journal's lease: no block, no balance change; anything else that is
    not an operation is still a damaged block."""
    import cbor2

    from loglake.events.ledger import Ledger, LedgerBlockError, account
    from loglake.streams.fence import claim_record

    a = account(b"\x01")
    first = Ledger(fee=2)
    first.mint(a, 100, 0)
    records = [claim_record("events.journal", "node-a", 7), first.writes[0].record]
    records.append(claim_record("events.journal", "node-b", 9))
    led = Ledger(fee=2)
    led.restore(records)
    assert led.balance_of(a) == 100 and led.blocks == 1
    assert led.transfer(a, account(b"\x02"), 10, 0) == 1  # the next block's index
    with pytest.raises(LedgerBlockError, match="block 0"):
        Ledger().restore([cbor2.dumps({"op": "lease-ish", "token": 1})])


@pytest.mark.slow
def test_replay_reads_rolled_segments_and_sealed_history_of_the_embedded_log(tmp_path):
    # The namespace lives in the on-disk engine (open_log) with tiny segments, so the replayed
    # range spans many rolled segments that are sealed to the Parquet lake in the background.
    from loglake.log import open_log

    w = World()
    w.use_pub_log(open_log(tmp_path / "pub"))
    w.pub_log.create_stream(NS, StreamConfig(segment_bytes=16 * 1024))
    w.register_publication()
    w.publish(2000)
    w.pub_log.wait_for_seals()
    w.subscribe("bob")
    rid = w.replay("bob", 10, 1990).value
    w.net.run()
    assert ids(w.bob) == list(range(10, 1990))
    assert w.status("bob", rid).status == ReplayState("completed", 1980)
    # rolled segments were sealed to the lake; iter_records serves the range from either
    assert list((tmp_path / "pub").rglob("*.parquet"))
    w.pub_log.close()


def test_publisher_reports_progress_while_running():
    w = World(batch_size=10)
    w.pub.progress_every = 50
    w.register_publication()
    w.publish(300)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 300).value
    sent_seen = set()
    while w.net.step():
        st = w.status("bob", rid)
        sent_seen.add(dict(st.stats)["icrc77:replay:sent"]["Nat"])
    assert {50, 100, 150} <= sent_seen and max(sent_seen) <= 300


def test_a_message_that_is_not_a_stored_event_errors_the_replay():
    w = World()
    w.register_publication()
    w.publish(20)
    w.pub_log.append(NS, b"DIDL not a stored event")  # written behind the publisher's back
    w.subscribe("bob")
    w.clock.now += 10**9  # the publisher's next head poll reports it to the orchestrator
    w.net.run()
    assert w.orch.publications[NS].head == 21
    rid = w.replay("bob", 0, None).value
    w.net.run()
    st = w.status("bob", rid).status
    assert st.tag == "errored" and "unreadable stored event" in st.value


@pytest.mark.parametrize(("start", "end"), [(20, 30), (25, None), (10, 21), (0, 10**30)])
def test_a_range_past_the_namespaces_end_errors_with_improper_config(start, end):
    """ICRC-77: the orchestrator validates range bounds. A range past the last event was
    "completed" with fewer or no events; it is refused at registration, naming the range (the
    orchestrator knows the head: its Publisher reports it)."""
    w = World()
    w.register_publication()
    w.publish(20)
    w.subscribe("bob")
    err = w.replay("bob", start, end)
    assert err.tag == "ImproperConfig" and err.payload.startswith("range"), err
    assert "past the end" in err.payload and "0..19" in err.payload
    w.net.run()
    assert w.bob.take() == []  # nothing was delivered
    ok = w.replay("bob", 20, None).value  # nothing missed: completes with 0
    w.net.run()
    assert w.status("bob", ok).status == ReplayState("completed", 0)


def test_get_replays_pages_past_a_thousand_and_honours_the_statistics_filter():
    """icrc77_get_replays capped at 1,000 and ignored ``prev`` and ``statistics``: replays past
    the first thousand could never be listed."""
    from loglake.events.messages import GetReplays, OrchestrationFilter
    from loglake.events.orchestrator import MAX_TAKE, next_replays_cursor

    many = 10**6
    w = World(
        quotas=Quotas(
            max_concurrent_per_subscriber=many,
            max_concurrent_per_namespace=many,
            max_requests_per_window=many,
        )
    )
    w.register_publication()
    w.publish(3)
    w.subscribe("bob")
    rids = [w.replay("bob", 0, 3).value for _ in range(2 * MAX_TAKE + 5)]
    w.net.run()
    seen: list[int] = []
    prev = None
    while True:
        page = w.call("bob", "icrc77_get_replays", GetReplays(prev, 5000))
        assert len(page) <= MAX_TAKE
        seen += [s.replay_id for s in page]
        prev = next_replays_cursor(page)
        if prev is None:
            break
    assert seen == rids  # every replay once, in id order
    # statistics: None → none, List → only those named, All (or no filter) → every one
    flt = {
        k: OrchestrationFilter(k, ("icrc77:replay:sent",) if k == "List" else ())
        for k in ("None", "List", "All")
    }
    stats = {
        k: dict(w.call("bob", "icrc77_get_replays", GetReplays(None, 1, f))[0].stats)
        for k, f in flt.items()
    }
    assert stats["None"] == {} and list(stats["List"]) == ["icrc77:replay:sent"]
    assert stats["All"] == dict(w.call("bob", "icrc77_get_replays", GetReplays(None, 1))[0].stats)
    assert len(stats["All"]) > 5
    # a principal that is not a cursor lists nothing (not the first page again)
    assert w.call("bob", "icrc77_get_replays", GetReplays(w.p["alice"], 10)) == []
    # take 0 asks for no replay (it gave 100); no take, the default page
    assert w.call("bob", "icrc77_get_replays", GetReplays(None, 0)) == []
    assert len(w.call("bob", "icrc77_get_replays", GetReplays(None, None))) == 100


def test_a_registration_the_orchestrator_does_not_answer_is_retried_with_back_off():
    """A failed ``icrc72_register_publication`` (the orchestrator not up) was never sent
    again; now it is, after 0.5 s, then 1 s, ... up to 30 s, until an answer is final."""
    from loglake.events.publisher import REGISTER_RETRY_MAX_NS, Publisher

    w = World()
    pub = Publisher(w.p["pub"], w.p["orch"])
    pub.register("ns.x", [], now=0)

    def calls() -> list:
        out = [c for c in pub.outbox if getattr(c, "method", "") == "icrc72_register_publication"]
        pub.outbox.clear()
        return out

    [call] = calls()
    t, delays = 0, []
    for _ in range(9):
        pub.on_reply(call, ConnectionRefusedError("Connect call failed"), t)
        st = pub.registrations["ns.x"]
        assert st.state == "retrying" and "Connect call failed" in st.last_error
        delays.append(st.retry_at - t)
        pub.pump(st.retry_at - 1)
        assert calls() == []  # not before its time
        t = st.retry_at
        pub.pump(t)
        [call] = calls()
    assert delays[:3] == [500_000_000, 1_000_000_000, 2_000_000_000]
    assert max(delays) == REGISTER_RETRY_MAX_NS and pub.registrations["ns.x"].attempts == 10
    pub.on_reply(call, [Ok(7)], t)
    assert pub.registrations["ns.x"].state == "registered" and pub.publication_ids["ns.x"] == 7
    pub.pump(t + 10**12)
    assert calls() == []  # final: no more calls


def test_history_stored_before_the_publication_registered_is_priced_and_capped():
    """The orchestrator prices a replay and applies ``max_events_per_replay`` by the head its
    Publisher reports. Events stored before the publication registered were never reported:
    a replay of them was delivered free (100 events, no tokens) and past the cap. The Publisher
    now reports its stream's head when it registers."""
    w = World(quotas=Quotas(max_events_per_replay=50))
    w.publish(100)  # before the registration: no head report finds a publication
    w.priced(per_event=2)
    w.subscribe("bob")
    assert w.orch.publications[NS].head == 100
    assert w.replay("bob", 0, 100).tag == "RangeTooLarge"
    assert w.replay("bob", 0, None).tag == "RangeTooLarge"
    r = w.replay("bob", 60, 100)  # within the cap: bob has no tokens and approved nothing
    assert r.tag == "PaymentRequired", r
    w.net.run()
    assert w.bob.take() == []


def test_an_open_ended_replay_ends_at_the_head_it_was_priced_and_capped_at():
    """``[from, null)`` is priced and capped by the head the orchestrator knows; the Publisher
    ended it at its own head when it opened the replay, so events stored in between went out
    unpaid and past ``max_events_per_replay`` (10 paid for, cap 20: 1,010 sent). The
    orchestrator's add now carries the priced end (a sixth element) and the Publisher stops
    there."""
    from loglake.events.ledger import account
    from loglake.events.messages import C_SUB_STOPPED

    w = World(quotas=Quotas(max_events_per_replay=20))
    w.priced(per_event=1)
    w.publish(10)
    w.subscribe("bob", [(C_SUB_STOPPED, {"Bool": True})])  # replays only, no live events
    w.ledger.mint(account(w.p["bob"]), 100, 0)
    assert isinstance(w.call("bob", "icrc2_approve", (w.p["orch"], 50, None, None, None)), Ok)
    r = w.replay("bob", 0, None)
    assert isinstance(r, Ok) and w.orch.replays[r.value].cost == 10
    w.pub.publish(NS, [({"Nat": i}, None) for i in range(1000)], w.clock.now)  # before it opens
    w.net._collect(w.pub)
    w.net.run()
    notes = w.bob.take()
    assert [n.event_id for n in notes] == list(range(10))  # was 0..1009
    assert {str(map_get(n.headers, H_REPLAY_END_ID)) for n in notes} == {"{'Nat': 9}"}
    assert w.status("bob", r.value).status == ReplayState("completed", 10)
    assert w.orch.publications[NS].head == 1010  # the rest is a later replay's


def test_a_lost_head_report_is_sent_again():
    """A head report the network lost left the orchestrator's head behind the stream's for
    good (it was sent once, after each publish): the events past it could not be replayed
    (and, before the orchestrator checked ranges, went out unpriced)."""
    w = World()
    w.register_publication()
    w.net.faults = Faults(seed=1, drop=1.0)  # every call lost, the head report too
    w.publish(10)
    assert w.orch.publications[NS].head == 0
    w.net.faults = None
    w.clock.now += 10**9  # past the first resend delay
    w.net.run()
    assert w.orch.publications[NS].head == 10


def test_approve_checks_expected_allowance_expiry_and_fee():
    """ICRC-2 ``icrc2_approve``'s ``expected_allowance``, ``expires_at`` and ``fee`` were
    dropped unread: a client's approval meant to fail on a changed allowance, a past expiry
    or a wrong fee got Ok. (Through the Candid codec, as any ICRC-2 client sends them.)"""
    from loglake.events.ledger import account

    w = World()
    w.ledger.mint(account(w.p["bob"]), 1_000, 0)
    now = w.clock.now
    orch = w.p["orch"]
    assert w.call("bob", "icrc2_approve", (orch, 500, 7, None, None)) == Err(
        "AllowanceChanged", {"current_allowance": 0}
    )
    got = w.call("bob", "icrc2_approve", (orch, 500, None, 1, None))
    assert got.tag == "Expired" and got.payload["ledger_time"] > now
    got = w.call("bob", "icrc2_approve", (orch, 500, None, now + 10**12, None))
    assert got.tag == "GenericError" and "expiry" in got.payload["message"]
    assert w.call("bob", "icrc2_approve", (orch, 500, None, None, 0)) == Err(
        "BadFee", {"expected_fee": w.ledger.fee}
    )
    assert w.call("bob", "icrc2_approve", (orch, 500, 0, None, w.ledger.fee)) == Ok(1)
    assert w.call("bob", "icrc2_approve", (orch, 300, 500, None, None)) == Ok(2)
    assert w.ledger.allowance(account(w.p["bob"]), account(orch)) == 300


def test_a_publish_call_of_many_events_reaches_live_subscribers_within_the_body_limit():
    """One ``loglake_publish`` under the 8 MiB body limit became one ``icrc72_publish`` to the
    broadcaster, each event ~100 bytes longer there (id, time, namespace, source): over the
    limit, refused (413), and no live subscriber got any of them. The publisher cuts the call
    at its 1 MB budget, as it cuts replay batches."""
    from loglake.events.codec import METHODS
    from loglake.events.server import MAX_BODY_BYTES

    w = World(max_body_bytes=MAX_BODY_BYTES)
    w.register_publication()
    w.subscribe("bob")
    items = [({"Blob": i.to_bytes(4, "big") * 10}, None) for i in range(100_000)]
    assert len(METHODS["loglake_publish"].encode_arg((NS, items))) < MAX_BODY_BYTES
    w.pub.publish(NS, items, w.clock())
    w.net._collect(w.pub)
    w.net.run()
    assert ids(w.bob) == list(range(100_000))


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda p: Publisher(p, p, batch_size=0), "batch_size"),
        (lambda p: Publisher(p, p, max_inflight=0), "max_inflight"),
        (lambda p: Publisher(p, p, progress_every=0), "progress_every"),
        (lambda p: Publisher(p, p, max_message_bytes=0), "max_message_bytes"),
        (lambda p: Broadcaster(p, p, relay_window=0), "relay_window"),
        (lambda p: Broadcaster(p, p, relay_batch=-1), "relay_batch"),
        (lambda p: Subscriber(p, p, keep=0), "keep"),
        (lambda p: Quotas(max_batch=0), "max_batch"),
        (lambda p: Quotas(window_ns=0), "window_ns"),
    ],
)
def test_a_core_refuses_the_sizes_its_command_line_refuses(make, name):
    """``Publisher(batch_size=0)`` left a replay running for ever, sending nothing (the CLI
    refused ``--batch-size 0`` since, the core took it): each size and window is at least 1."""
    from tests.events.world import seeded

    with pytest.raises(ValueError, match=f"^{name} must be >= 1"):
        make(seeded(9).principal)


@pytest.mark.parametrize(
    "config",
    [[], [("icrc72:subscription:skip", {"Array": [{"Nat": 1}]})]],
    ids=["batch", "event by event"],
)
def test_a_publish_call_under_the_body_limit_reaches_live_subscribers_within_it(config):
    """An ``icrc72_publish`` under the 8 MiB body limit from a publisher other than loglake's
    (which cuts its calls at 1 MB): the Broadcaster made one notification call a subscriber
    of all its events, each ~60% longer there (notification id, ``received`` header), over
    the subscriber's limit (413). Every event was answered ``Ok``, none delivered, and all
    stayed unconfirmed, filling the subscriber's window. The Broadcaster cuts its
    notification calls at the 1 MB budget, on the batch path (``EventBatch``) and event by
    event (a skip in the subscription) alike."""
    from loglake.events.codec import METHODS
    from loglake.events.messages import Event
    from loglake.events.server import MAX_BODY_BYTES

    w = World(max_body_bytes=MAX_BODY_BYTES)
    w.register_publication()
    w.subscribe("bob", config)
    n = 100_000
    evs = [Event(i, i - 1 if i else None, 1, NS, {"Nat": i}, w.p["pub"], None) for i in range(n)]
    assert len(METHODS["icrc72_publish"].encode_arg(evs)) < MAX_BODY_BYTES
    assert all(r == Ok([i + 1]) for i, r in enumerate(w.call("pub", "icrc72_publish", evs, "bc")))
    w.net.run()
    notes = w.bob.take()
    assert [x.event_id for x in notes] == list(range(n))
    assert all(x.data == {"Nat": x.event_id} for x in notes)
    assert w.bc.pending == {}


def test_a_replay_opened_while_an_import_is_fsynced_ends_at_what_it_could_read(
    tmp_path, monkeypatch
):
    """Events stored in a namespace by another writer (an import) while the Publisher read
    its head: the head counted the import's records written but not yet fsynced, which no
    pull returns yet. The orchestrator was told that head, took a replay up to it, and the
    Publisher's read of the range stopped at the durable end: ``completed(5)`` for
    ``[0, 10)``, events 5..9 never replayed. The head is what a reader can pull now; the
    rest is replayable once durable (the next poll)."""
    from loglake.events.publisher import HEAD_POLL_NS, stored_event
    from loglake.log import open_log
    from tests.log.test_durability import hold_fdatasync

    w = World()
    w.use_pub_log(open_log(tmp_path / "pub"))
    w.register_publication()
    w.publish(5)
    w.subscribe("bob")
    in_sync, release = hold_fdatasync(monkeypatch)
    imported = [stored_event({"Nat": i}, None, 1) for i in range(5, 10)]
    importer = threading.Thread(target=w.pub_log.append_payloads, args=(NS, imported))
    importer.start()
    try:
        assert in_sync.wait(10)
        w.clock.now += 2 * HEAD_POLL_NS  # the Publisher reads its head again
        w.net.run()
        r = w.replay("bob", 0, 10)
        w.net.run()
        got = ids(w.bob)
        status = w.status("bob", r.value).status if isinstance(r, Ok) else None
    finally:
        release.set()
        importer.join(10)
    monkeypatch.undo()
    # before the import is durable: [0, 10) is past the end, not completed with 5 of it
    assert (r.tag if isinstance(r, Err) else r, got, status) == ("ImproperConfig", [], None)
    w.clock.now += 2 * HEAD_POLL_NS
    w.net.run()
    r = w.replay("bob", 0, 10)
    w.net.run()
    assert ids(w.bob) == list(range(10))
    assert w.status("bob", r.value).status == ReplayState("completed", 10)
    w.pub_log.close()


def test_a_replay_whose_range_retention_removes_while_it_runs_ends_errored():
    """Retention removed the head of a replay's range while the replay ran: a batch's read
    began past its start, and the Publisher, its cursor already past the batch, published what
    it read and went on. The replay of ``[0, 100)`` ended ``completed(80)``, events 40..59
    skipped without a word. A read that does not begin at its batch's start ends the replay
    ``errored`` as a trimmed start does when the replay opens."""
    w = World(batch_size=10)
    w.register_publication()
    w.publish(100)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 100).value
    for _ in range(6):
        w.net.step()
    assert w.pub.replays[rid].cursor == 40  # batches up to 40 read, the rest not yet
    w.pub_log.truncate_before(NS, 60)
    w.net.run()
    got = ids(w.bob)
    assert got == list(range(len(got))) and len(got) <= 40  # nothing past the removed events
    st = w.status("bob", rid).status
    assert st == ReplayState("errored", "events before 60 are no longer kept"), st


def test_a_replay_answered_busy_backs_off_instead_of_spinning():
    """Each ``Busy`` was resent at once: publisher and broadcaster traded calls as fast as they
    could for as long as the subscriber confirmed nothing (over HTTP, a core each spinning)."""
    w = _ready(max_unconfirmed=0)
    w.replay("bob", 0, 20)
    steps = w.net.run(max_steps=10_000)
    assert steps < 100 and w.bc.stats.busy < 50  # it waits for the clock
    for _ in range(5):
        w.clock.now += 5_000_000_000
        w.net.run(max_steps=10_000)
    assert w.bc.stats.busy <= 20 * 8  # a try of its 20 events each back-off, not a spin


def test_a_replay_publish_answered_short_sends_the_unanswered_events_again():
    """Found from outside: a broadcaster's reply shorter than the publish call (results for the
    first events only) left the rest of the replay's events neither counted nor sent again
    (``zip`` stopped at the reply's end): the replay ended short, or never. The live path
    already sent them again; the replay path does now too."""
    from loglake.events.broadcaster import Broadcaster
    from loglake.events.fastcodec import PublishResults

    short: list[int] = []

    class ShortBroadcaster(Broadcaster):
        def dispatch(self, caller, method, arg, now):
            out = super().dispatch(caller, method, arg, now)
            if method == "icrc72_publish" and len(short) < 3 and len(arg) > 1:
                short.append(len(arg))
                if isinstance(out, PublishResults):
                    out = list(out)
                return out[: len(out) // 2]  # the other half unanswered
            return out

    class ShortWorld(World):
        def __post_init__(self) -> None:
            super().__post_init__()
            p = self.p
            self.bc = self.net.add(
                ShortBroadcaster(p["bc"], p["orch"], self.max_unconfirmed, self.relay_window)
            )

    w = ShortWorld(batch_size=10)
    w.register_publication()
    w.publish(100)
    w.subscribe("bob")
    rid = w.replay("bob", 0, 100).value
    w.settle()
    assert short, "no publish call was answered short"
    st = w.status("bob", rid).status
    assert (st.tag, st.value) == ("completed", 100), st
    assert sorted(n.event_id for n in w.bob.take()) == list(range(100))  # each once
