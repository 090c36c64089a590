"""SDS-R (spec "SDS Repair (SDS-R)") with @waku/sds's hash choices (repair/utils.ts, repair.ts).

The (T_req, T_resp, group) vectors are from @waku/sds: ``RepairManager`` of 0.0.8 run through
interop/node/diff_peer.mjs (command ``sds_repair_times``), recorded here.
"""

from __future__ import annotations

import pytest

from loglake.sds.codec import decode, encode
from loglake.sds.errors import DropReason
from loglake.sds.events import (
    MessageDelivered,
    MessageDropped,
    RepairRequestQueued,
    RepairRequestReceived,
    RepairRequestSent,
    RepairResponseQueued,
    RepairResponseSent,
)
from loglake.sds.messages import HistoryEntry, SdsMessage, message_id_of
from loglake.sds.repair import (
    RepairConfig,
    RepairManager,
    in_response_group,
    num_response_groups_for,
    t_req,
    t_resp,
)


@pytest.mark.parametrize(
    ("mid", "now", "sender", "req", "resp", "group"),
    [  # from @waku/sds, participant "alice", numResponseGroups 3, default T_min/T_max
        ("abc", 1000, "bob", 89296, 27418, False),
        ("def", 5, "alice", 30207, 5, True),
        ("0123", 0, "carol", 119039, 36861, True),
    ],
)
def test_backoff_and_group_match_waku_sds(mid, now, sender, req, resp, group) -> None:
    cfg = RepairConfig(num_response_groups=3)
    assert t_req("alice", mid, now, cfg) == req
    assert t_resp("alice", sender, mid, now, cfg) == resp
    assert in_response_group("alice", sender, mid, 3) is group


def test_t_req_is_within_t_min_t_max_and_original_sender_responds_at_once() -> None:
    cfg = RepairConfig()
    for i in range(50):
        d = t_req(f"p{i}", f"m{i}", 0, cfg)
        assert cfg.t_min_ms <= d < cfg.t_max_ms
        assert t_resp(f"p{i}", f"p{i}", f"m{i}", 7, cfg) == 7  # distance 0


def test_sender_is_always_in_its_own_response_group() -> None:
    for n in (1, 2, 5, 9):
        assert all(in_response_group(f"s{i}", f"s{i}", f"m{i}", n) for i in range(20))
    assert not in_response_group("a", None, "m", 1)  # no sender_id, no response


def test_num_response_groups_per_spec() -> None:
    assert [num_response_groups_for(n) for n in (1, 127, 128, 1000)] == [1, 1, 2, 8]


def test_full_buffer_evicts_the_furthest_entry() -> None:
    from loglake.sds.messages import HistoryEntry

    rm = RepairManager("a", RepairConfig(buffer_size=2))
    rm.outgoing.add(HistoryEntry("x"), 10)
    rm.outgoing.add(HistoryEntry("y"), 30)
    rm.outgoing.add(HistoryEntry("z"), 20)
    assert set(rm.outgoing.items) == {"x", "z"}


def test_request_response_and_suppression(make, clock) -> None:
    a, b, c = make("a"), make("b"), make("c")
    d1 = a.send(b"1").to_send[0].data
    b.receive(d1)
    d2 = a.send(b"2").to_send[0].data
    b.receive(d2)
    out = c.receive(d2)  # c lost d1
    (queued,) = out.of(RepairRequestQueued)
    assert queued.message_id == message_id_of(b"1")
    assert 30_000 <= queued.t_req - clock.t < 120_000
    clock.t = queued.t_req - 1
    assert decode(c.send(b"early").to_send[0].data).repair_request == ()
    clock.t = queued.t_req
    o = c.send(b"3")
    req = decode(o.to_send[0].data).repair_request
    assert [e.message_id for e in req] == [queued.message_id] and req[0].sender_id == "a"
    assert o.of(RepairRequestSent)
    carrier = o.to_send[0].data
    # the request is carried once (@waku/sds marks it requested)
    assert decode(c.send(b"4").to_send[0].data).repair_request == ()

    out_b = b.receive(carrier)
    assert out_b.of(RepairRequestReceived)
    (rb,) = out_b.of(RepairResponseQueued)
    out_a = a.receive(carrier)
    (ra,) = out_a.of(RepairResponseQueued)
    assert ra.t_resp == clock.t  # the original sender answers first
    rep = a.tick()
    assert rep.of(RepairResponseSent)
    assert rep.to_send[0].data == d1 and rep.to_send[0].reason == "repair"
    # b sees the repair before its own T_resp: it stands down
    assert b.receive(d1).of(MessageDropped)[0].reason is DropReason.DUPLICATE
    clock.t = max(clock.t, rb.t_resp)
    assert b.tick().to_send == []
    delivered = c.receive(d1).of(MessageDelivered)
    assert [e.content for e in delivered] == [b"1", b"2"]


def test_receiving_a_repair_request_cancels_own_request(make, clock) -> None:
    a, b, c = make("a"), make("b"), make("c")
    a.send(b"1")
    d2 = a.send(b"2").to_send[0].data
    b.receive(d2)
    c_out = c.receive(d2)
    (qc,) = c_out.of(RepairRequestQueued)
    clock.t = qc.t_req
    carrier = c.send(b"c").to_send[0].data
    assert len(b.repair.outgoing) == 1
    b.receive(carrier)
    assert len(b.repair.outgoing) == 0  # someone else asked


def test_a_request_naming_a_made_up_sender_waits_the_real_senders_backoff(make, clock) -> None:
    # T_resp is distance(this participant, the message's sender) * hash(id) % T_max. A peer
    # naming *b* as the sender of a's message made b answer at once (distance 0), every
    # time it asked. The message's real sender counts (a), whatever the request says.
    a, b = make("a"), make("b")
    d1 = a.send(b"1").to_send[0].data
    b.receive(d1)
    mid = message_id_of(b"1")
    forged = SdsMessage(
        "mallory", "r1", "chan", clock.t, (), None, (HistoryEntry(mid, None, "b"),), None
    )
    (queued,) = b.receive(encode(forged)).of(RepairResponseQueued)
    assert queued.t_resp == t_resp("b", "a", mid, clock.t, b.repair.config) != clock.t


def test_a_message_rebroadcast_is_not_sent_again_before_t_min(make, clock) -> None:
    # A peer asking for the same message again and again had it rebroadcast each time (38 KB
    # of requests, 11 MB sent). Within T_min of a repair (no honest peer asks sooner: its own
    # T_req backoff is at least T_min) a request for it is not answered.
    a = make("a")
    a.send(b"1")
    mid = message_id_of(b"1")

    def ask(n: int) -> list:
        req = (HistoryEntry(mid, None, "a"),)
        msg = SdsMessage("m", f"ask{n}", "chan", clock.t, (), None, req, None)
        return a.receive(encode(msg)).of(RepairResponseQueued)

    assert ask(1) and a.tick().of(RepairResponseSent)  # the sender: due at once
    clock.t += a.repair.config.t_min_ms - 1
    assert not ask(2) and not a.tick().of(RepairResponseSent)
    clock.t += 1
    assert ask(3) and a.tick().of(RepairResponseSent)


def test_a_requesters_budget_renews_after_t_min_and_few_are_remembered() -> None:
    rm = RepairManager("a", RepairConfig(buffer_size=4, max_responses_per_requester=2))
    asks = [HistoryEntry(f"m{i}", None, "a") for i in range(3)]

    def answered(requester: str, now: int) -> list[str]:
        return [m for m, _ in rm.on_repair_requests(asks, requester, lambda m: "a", now)]

    assert answered("mallory", 0) == ["m0", "m1"]
    rm.incoming.items.clear()
    assert answered("mallory", 29_999) == []
    assert answered("carol", 29_999) == ["m0", "m1"]
    rm.incoming.items.clear()
    assert answered("mallory", 30_000) == ["m0", "m1"]
    for i in range(10):  # requesters that change their id each time are not all remembered
        answered(f"sybil{i}", 30_001)
    assert len(rm._requesters) <= 4


def test_response_bytes_are_bounded_per_requester_and_per_window() -> None:
    # Counts bounded answers, not bytes: a padded message is as long as Limits allows (4 MiB).
    # A requester's answers are at most max_response_bytes_per_requester a T_min window
    # (queued or not when asked); what goes out is at most max_response_bytes a window, the
    # rest put back to the next window, and one longer than a whole window never.
    cfg = RepairConfig(max_response_bytes_per_requester=250, max_response_bytes=300)
    rm = RepairManager("a", cfg)
    sizes = {"m0": 100, "m1": 200, "m2": 100, "m3": 260, "m4": 301}.get

    def answered(ids: str, requester: str, now: int) -> list[str]:
        asks = [HistoryEntry(m, None, "a") for m in ids.split()]
        return [
            m for m, _ in rm.on_repair_requests(asks, requester, lambda m: "a", now, None, sizes)
        ]

    assert answered("m0 m1 m2", "r1", 0) == ["m0", "m2"]  # m1 would be 400 bytes for r1
    assert answered("m1 m3", "r2", 0) == ["m1"]  # m3 is over any one requester's budget
    assert answered("m1", "r1", cfg.t_min_ms) == []  # queued already
    # the sender answers at once (distance 0): all due now, earliest first
    assert [e.message_id for e in rm.responses_due(1_000, sizes)] == ["m0", "m2"]
    assert rm.responses_due(1_000 + cfg.t_min_ms - 1, sizes) == []
    assert [e.message_id for e in rm.responses_due(1_000 + cfg.t_min_ms, sizes)] == ["m1"]
    # longer than a window's budget: dropped, not put back
    big = RepairManager("a", RepairConfig(max_response_bytes=300))
    big.on_repair_requests([HistoryEntry("m4", None, "a")], "r", lambda m: "a", 0, None, sizes)
    assert big.responses_due(0, sizes) == [] and "m4" not in big.incoming


def test_entries_past_the_answered_ones_still_cancel_own_requests(make, clock) -> None:
    # Only a message's first max_repair_requests_per_message entries are answered, but the
    # spec's MUST holds for every entry: one naming a message we are about to ask for
    # cancels our request (someone else asked).
    a, b = make("a"), make("b")
    a.send(b"1")
    (queued,) = b.receive(a.send(b"2").to_send[0].data).of(RepairRequestQueued)
    assert queued.message_id in b.repair.outgoing.items
    asked = [HistoryEntry(f"other-{i}", None, "a") for i in range(5)]
    asked.append(HistoryEntry(queued.message_id, None, "a"))
    assert len(asked) > b.options.max_repair_requests_per_message
    got = b.receive(encode(SdsMessage("c", "sync-c", "chan", clock.t, (), None, tuple(asked))))
    (received,) = got.of(RepairRequestReceived)
    assert received.message_ids[-1] == queued.message_id
    assert queued.message_id not in b.repair.outgoing.items


class _ModelBuffer:
    """The buffer as @waku/sds's buffers.ts states it: a full buffer drops the entry with the
    furthest timestamp (the latest put in of equals), the sweep takes the due ones earliest
    first; taken outgoing entries stay until received. Linear scans, for the heaps to match."""

    def __init__(self, size: int) -> None:
        self.size, self.items, self.taken, self.seq = size, {}, set(), 0

    def add(self, mid: str, due: int) -> bool:
        if mid in self.items:
            return False
        if len(self.items) >= self.size:
            del self.items[max(self.items, key=lambda k: self.items[k])]
        self.items[mid], self.seq = (due, self.seq), self.seq + 1
        self.taken.discard(mid)
        return True

    def remove(self, mid: str) -> None:
        self.items.pop(mid, None)

    def due(self, now: int, limit: int | None) -> list[str]:
        ready = sorted((v, k) for k, v in self.items.items() if v[0] <= now and k not in self.taken)
        return [k for _, k in ready[:limit]]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("kind", ["outgoing", "incoming"])
def test_buffers_match_the_reference_rules_under_churn(seed, kind) -> None:
    """Random adds (few distinct ids and due times: re-adds and ties), removes and sweeps on a
    buffer of 8, against ``_ModelBuffer``: the same entries kept, evicted and swept."""
    import random

    rng = random.Random(seed)
    rm = RepairManager("a", RepairConfig(buffer_size=8))
    buf = rm.outgoing if kind == "outgoing" else rm.incoming
    model = _ModelBuffer(8)
    now = 0
    for _ in range(600):
        op, mid = rng.random(), f"m{rng.randrange(30)}"
        if op < 0.6:
            due = now + rng.randrange(0, 40, 5)
            assert buf.add(HistoryEntry(mid), due) == model.add(mid, due)
        elif op < 0.75:
            buf.remove(mid)
            model.remove(mid)
        else:
            now += rng.randrange(0, 20)
            if kind == "outgoing":
                limit = rng.choice([None, 1, 3])
                want = model.due(now, limit)
                got = [e.message_id for e in buf.take_eligible(now, limit or 10**9)]
                model.taken.update(want)
            else:
                want = model.due(now, None)
                got = [e.message_id for e in buf.take_ready(now)]
                for k in want:
                    model.remove(k)
            assert got == want
        assert set(buf.items) == set(model.items)


def test_made_up_dependencies_cost_little_once_the_buffer_is_full(make, clock) -> None:
    """Found from outside: messages of a member each naming 1,000 made-up dependencies (the
    most a history may hold) cost 0.6-1.6 s of CPU apiece once the outgoing repair buffer was
    full (a full scan for the furthest entry at every insert), and its heap grew by 1,000 a
    message while the clock stood still. Now: 30 such messages in well under the old cost of
    one, the heaps within a constant of the buffer's size."""
    import time

    victim = make("victim")
    spam = []
    for i in range(30):
        content = b"spam%d" % i
        history = tuple(HistoryEntry(f"fake-{i}-{j}", None, "x") for j in range(1000))
        spam.append(
            encode(
                SdsMessage(
                    "attacker", message_id_of(content), "chan", clock.t, history, content=content
                )
            )
        )
    t0 = time.process_time()
    for data in spam:
        victim.receive(data)
    cpu = time.process_time() - t0
    out = victim.repair.outgoing
    assert len(out) == out.max_size == 1000
    assert len(out._heap) <= 4 * out.max_size + 64 and len(out._furthest) <= 4 * out.max_size + 64
    assert cpu < 3.0, f"30 messages of made-up dependencies took {cpu:.1f} CPU-s"
