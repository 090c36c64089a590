"""``LeaseFence``: appends by a lease's holder to the streams it guards, on a real 3-node
JetStream cluster (loopback). Two "nodes" (two connections, two leases of one name): the
holder appends; the other is refused locally; the holder is paused (its lease task stops, its
clock still says it holds — what a SIGSTOPped process sees when it wakes between its check and
its publish), the other takes the lease within the TTL + 2 s and claims the stream, and the
paused holder's append is refused by the cluster (``FencedOut``): the stream holds nothing of
it after the claim."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import replace

import pytest

from loglake.streams.fence import UNFENCED, claim_record, is_claim
from loglake.streams.jetstream import HeadMoved, JetStreamLog
from loglake.streams.lease import FencedOut, JetStreamLease, LeaseFence, LeaseLost, LeaseState
from tests.nats_cluster import NatsCluster
from tests.streams.jetstream_fixtures import new_prefix

TTL = 2


def wait_until(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := probe():
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout}s")


def fence_on(log: JetStreamLog, bucket: str, holder: str, streams=(), wrap=None) -> LeaseFence:
    """A fence on a started lease; ``wrap(lease)`` (optional) may patch the lease first."""

    async def start() -> LeaseFence:
        lease = JetStreamLease(log.js, bucket, "journal", holder, ttl=TTL, replicas=3)
        fence = LeaseFence(log, lease, streams)
        lease.on_change = fence.on_event
        if wrap is not None:
            wrap(lease)
        await lease.start()
        return fence

    return log.call(start())


def pause(fence: LeaseFence) -> None:
    """What a SIGSTOPped holder looks like when it wakes: its lease task stopped (no renewal),
    its own view still "held"."""
    fence.log.call(fence.lease.close())
    fence.lease.core.state, fence.lease.core.valid_until = LeaseState.HELD, math.inf


def datas(log: JetStreamLog, stream: str) -> list[bytes]:
    return [r.data for r in log.read(stream, 0, limit=1000, partition=0)]


def test_a_paused_former_holder_is_fenced_out_and_writes_nothing(nats_r3: NatsCluster) -> None:
    prefix = new_prefix()
    a = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    b = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    fa = fb = None
    try:
        a.create_stream("j")
        fa = fence_on(a, f"{prefix}_leases", "node-a", ("j",))
        wait_until(fa.holds, 5, "a holds")
        fb = fence_on(b, f"{prefix}_leases", "node-b", ("j",))
        assert fa.append(None, "j", [b"a1", b"a2"]) == [1, 2]  # index 0 is a's claim
        assert fa.append(None, "j", [b"a3"]) == [3]
        time.sleep(TTL)  # several renewals: b never gets it while a renews
        assert not fb.holds()
        with pytest.raises(LeaseLost):
            fb.append(None, "j", [b"b-too-early"])

        # a pauses: its lease stops renewing, but its view still says "held"
        pause(fa)
        paused = time.monotonic()
        wait_until(fb.holds, TTL + 2, "b takes the lease")
        took = time.monotonic() - paused
        wait_until(lambda: fb.claims == 1, 5, "b claims the journal at once")
        assert fa.holds()  # a still believes it holds...
        with pytest.raises(FencedOut, match="newer holder"):
            fa.append(None, "j", [b"a-stale"])  # ...and the cluster refuses it
        assert fb.append(None, "j", [b"b1"]) == [5]
        with pytest.raises(FencedOut):
            fa.append(None, "j", [b"a-stale-again"])
        got = datas(b, "j")  # through b: another process's pull may briefly miss b's push
        assert [d for d in got if not is_claim(d)] == [b"a1", b"a2", b"a3", b"b1"]
        assert [is_claim(d) for d in got] == [True, False, False, False, True, False]
        assert fa.refused == 2
        print(f"lease taken over {took:.2f}s after the holder paused")
    finally:
        for log, f in ((a, fa), (b, fb)):
            if f is not None:
                log.call(f.lease.close())
        a.close()
        b.close()


def test_a_former_holders_append_right_after_the_new_holder_took_the_lease_is_refused(
    nats_r3: NatsCluster,
) -> None:
    """The claim window, forced: B's compare-and-set on the lease key is stored and B is held
    right there (nothing after it has run); A, paused past its lease, wakes and appends at the
    head it knows. The cluster refuses it: B's claim on the stream was written before B's
    compare-and-set, not after it. Then B appends; the stream holds A's records, B's claim and
    B's records, in that order, and nothing A sent after losing the lease."""
    prefix = new_prefix()
    a = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    b = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    taken, go = threading.Event(), threading.Event()

    def hold_after_the_compare_and_set(lease: JetStreamLease) -> None:
        create = lease._create

        async def create_then_wait(action):
            revision = await create(action)
            taken.set()
            while not go.is_set():  # B's loop is held here: no claim, no event after the set
                await asyncio.sleep(0.01)
            return revision

        lease._create = create_then_wait

    fa = fb = None
    try:
        a.create_stream("j")
        fa = fence_on(a, f"{prefix}_leases", "node-a", ("j",))
        wait_until(fa.holds, 5, "a holds")
        assert fa.append(None, "j", [b"a1"]) == [1]
        fb = fence_on(b, f"{prefix}_leases", "node-b", ("j",), hold_after_the_compare_and_set)
        pause(fa)
        assert taken.wait(TTL + 3), "b's compare-and-set within the ttl"
        try:
            with pytest.raises(FencedOut):
                fa.append(None, "j", [b"a-after-b-took-it"])
        finally:
            go.set()
        wait_until(fb.holds, 5, "b holds")
        assert fb.append(None, "j", [b"b1"])[-1] == 3
        got = datas(b, "j")  # through b: another process's pull may briefly miss b's push
        assert [d for d in got if not is_claim(d)] == [b"a1", b"b1"]
        assert [is_claim(d) for d in got] == [True, False, True, False]
    finally:
        go.set()
        for log, f in ((a, fa), (b, fb)):
            if f is not None:
                log.call(f.lease.close())
        a.close()
        b.close()


def test_claims_of_a_contender_that_lost_the_race_do_not_fence_out_the_holder(
    nats_r3: NatsCluster,
) -> None:
    """A contender claims the guarded streams before its compare-and-set; when that set loses
    (the lease was taken meanwhile), its claim is in the stream but it holds nothing. The
    holder's next append finds the head moved by a claim only, checks with the cluster that it
    still holds the lease, and appends after it."""
    from loglake.streams.fence import claim_record

    prefix = new_prefix()
    a = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    fa = None
    try:
        a.create_stream("j")
        fa = fence_on(a, f"{prefix}_leases", "node-a", ("j",))
        wait_until(fa.holds, 5, "a holds")
        assert fa.append(None, "j", [b"a1"]) == [1]
        a.push_many("j", 0, [claim_record("journal", "node-c", 0)])  # c's claim, c lost
        assert fa.append(None, "j", [b"a2", b"a3"]) == [3, 4]
        a.push_many("j", 0, [b"not a claim"])  # a write nobody fenced: a is refused after it
        with pytest.raises(FencedOut, match="records past"):
            fa.append(None, "j", [b"a4"])
        assert [d for d in datas(a, "j") if not is_claim(d)] == [
            b"a1",
            b"a2",
            b"a3",
            b"not a claim",
        ]
    finally:
        if fa is not None:
            a.call(fa.lease.close())
        a.close()


def test_the_icrc_ledger_is_fenced_like_the_journal(nats_r3: NatsCluster) -> None:
    """The orchestrator's ledger stream goes through the journal's fence (as the node wires
    it, ``orchestrator_streams``): A mints; A pauses; B takes the lease; A's late transfer is
    refused and moves no balance; B's ledger, rebuilt from the stream, has A's mint and not
    A's transfer, and B's own transfer is the next block."""
    from loglake.events.ledger import account
    from loglake.events.store import StreamsStore, open_ledger, orchestrator_streams
    from loglake.streams.jetstream import JetStreamStreams

    prefix = new_prefix()
    a = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    b = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    alice, bob = account(b"\x01"), account(b"\x02")
    fa = fb = None
    try:
        fa = fence_on(a, f"{prefix}_leases", "node-a")
        wait_until(fa.holds, 5, "a holds")
        store_a = StreamsStore(JetStreamStreams(a), fa, orchestrator_streams())
        led_a = open_ledger(store_a, fee=1)
        led_a.mint(alice, 100, 0)
        store_a.perform_many(led_a.writes)
        led_a.writes.clear()
        fb = fence_on(b, f"{prefix}_leases", "node-b")
        pause(fa)
        wait_until(fb.holds, TTL + 2, "b takes the lease")
        led_a.transfer(alice, bob, 30, 1)
        with pytest.raises(FencedOut):
            store_a.perform_many(led_a.writes)
        store_b = StreamsStore(JetStreamStreams(b), fb, orchestrator_streams())
        fb.claim()
        led_b = open_ledger(store_b, fee=1)
        assert (led_b.balance_of(alice), led_b.balance_of(bob), led_b.blocks) == (100, 0, 1)
        assert led_b.transfer(alice, bob, 5, 2) == 1
        store_b.perform_many(led_b.writes)
        again = open_ledger(StreamsStore(JetStreamStreams(b)), fee=1)
        assert (again.balance_of(alice), again.balance_of(bob)) == (94, 5)
        ledger = orchestrator_streams()[1]
        assert sum(is_claim(d) for d in datas(b, ledger)) == 2  # A's first write, B's takeover
    finally:
        for log, f in ((a, fa), (b, fb)):
            if f is not None:
                log.call(f.lease.close())
        a.close()
        b.close()


def test_a_conditional_push_at_a_stale_head_is_refused(nats_single: NatsCluster) -> None:
    log = JetStreamLog(nats_single.url, prefix=new_prefix())
    try:
        log.create_stream("s")
        assert log.push_expecting("s", 0, [b"x", b"y"], 0) == [0, 1]
        with pytest.raises(HeadMoved, match="no longer 1"):
            log.push_expecting("s", 0, [b"z"], 1)
        assert log.push_expecting("s", 0, [b"z"], 2) == [2]
        assert [r.data for r in log.read("s", 0, limit=10, partition=0)] == [b"x", b"y", b"z"]
    finally:
        log.close()


@pytest.mark.parametrize(
    ("data", "claim"),
    [
        (claim_record("journal", "node-a", 7), True),
        (b"", False),
        (b"lease", False),
        (b"\xa1bopelease", False),  # a CBOR map with another op
        (b"\xa2bopelease\xff", False),  # cut short
        (b'{"op": "lease"}', False),
    ],
)
def test_claim_records_are_recognised_and_nothing_else_is(data: bytes, claim: bool) -> None:
    assert is_claim(data) is claim


def test_unfenced_always_may(memory_log) -> None:
    from loglake.streams import LocalStreams

    memory_log.create_stream("s")
    assert UNFENCED.holds() and UNFENCED.append(LocalStreams(memory_log), "s", [b"a"]) == [0]


def test_a_cardinal_member_that_lost_its_lease_cannot_commit_and_the_chain_resumes_once(
    nats_r3: NatsCluster,
) -> None:
    """Two members of one Cardinal consumer (client id ``app``), each on its own connection,
    checkpointing through a ``LeaseFence``: A consumes part of the chain and commits; A pauses
    (its lease stops; its view still says held); B takes the lease, loads A's checkpoint and
    consumes the rest; A's late commit is refused and moves nothing; each block was applied
    once across the two."""
    from loglake.cardinal.blocks import ChainUpdate
    from loglake.cardinal.cli import produce_chain
    from loglake.cardinal.messages import ZERO_HASH
    from loglake.cardinal.ordering import Checkpoint
    from loglake.cardinal.synthetic import topics_for
    from loglake.cardinal.transport import StreamConsumer, StreamTransport
    from loglake.streams.jetstream import JetStreamStreams

    prefix = new_prefix()
    a = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    b = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    fa = fb = None
    start = Checkpoint.starting_at(-1, ZERO_HASH, 0)
    try:
        sa, sb = JetStreamStreams(a), JetStreamStreams(b)
        _, canonical = produce_chain(sa, "chain", 10, partitions=2)
        fa = fence_on(a, f"{prefix}_leases", "member-a")
        wait_until(fa.holds, 5, "a holds")
        fb = fence_on(b, f"{prefix}_leases", "member-b")
        added: list[bytes] = []

        def take(events) -> None:
            added.extend(
                blk.hash for ev in events if isinstance(ev, ChainUpdate) for blk in ev.added
            )

        ca = StreamConsumer(StreamTransport(sa, fence=fa), topics_for("chain"), "app", start=start)
        for _ in range(40):
            take(ca.poll(limit=3))
            if len(added) >= 3:
                break
        first = ca.commit()
        committed = len(added)
        assert 3 <= committed < 10
        for _ in range(40):  # A reads on past its commit: work B will redo, not commit
            take(ca.poll(limit=3))
        assert len(added) > committed

        pause(fa)  # A pauses
        wait_until(fb.holds, TTL + 2, "b takes the member's lease")
        cb = StreamConsumer(StreamTransport(sb, fence=fb), topics_for("chain"), "app", start=start)
        del added[committed:]  # what A applied after its commit is lost with A's process
        for _ in range(60):
            take(cb.poll(limit=5))
        cb.commit()
        with pytest.raises(FencedOut):
            ca.commit()  # A wakes and commits what B has done already
        # A's own clock now shows its lease ran out (as a resumed process's does): a round with
        # nothing new for the checkpoint stream (offsets moved only) saves no offset either
        fa.lease.core.valid_until = 0.0
        moved = replace(first, offsets={k: v + 1 for k, v in first.offsets.items()})
        with pytest.raises(LeaseLost):
            ca.transport.save_checkpoint("app", moved)
        offsets = {
            k: b.get_index("app", k[0], partition=k[1]) for k in (("chain", 0), ("chain", 1))
        }
        assert added == [blk.hash for blk in canonical]  # once each, in chain order
        # A's refused commit moved no offset: a third member starts where B left off
        cc = StreamConsumer(StreamTransport(sb, fence=fb), topics_for("chain"), "app", start=start)
        assert [ev for _ in range(5) for ev in cc.poll(limit=5)] == []
        assert {k: b.get_index("app", k[0], partition=k[1]) for k in offsets} == offsets
    finally:
        for log, f in ((a, fa), (b, fb)):
            if f is not None:
                log.call(f.lease.close())
        a.close()
        b.close()
