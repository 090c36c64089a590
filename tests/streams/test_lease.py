"""Leases on a real 3-node JetStream cluster (loopback): contenders are separate processes
(``lease_holder.py``) so a holder can be SIGKILLed or SIGSTOPped as a node would be."""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from tests.streams.jetstream_fixtures import new_prefix
from tests.streams.lease_holder import Holder

TTL = 3
"""Seconds; the handover bound the issue sets is ttl + 2 s."""


@pytest.fixture
def contenders(nats_r3):
    made: list[Holder] = []
    bucket = new_prefix() + "_leases"
    name = "sealer-" + uuid.uuid4().hex[:6]

    def make(holder: str) -> Holder:
        h = Holder(nats_r3.url, bucket, name, holder, TTL)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def first_holder(a: Holder, b: Holder, timeout: float = 15) -> tuple[Holder, Holder]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if a.holds_now():
            return a, b
        if b.holds_now():
            return b, a
        time.sleep(0.05)
    raise AssertionError(f"nobody acquired the lease in {timeout}s: {a.seen} {b.seen}")


def test_of_two_contenders_exactly_one_holds(contenders):
    a, b = contenders("a"), contenders("b")
    holder, other = first_holder(a, b)
    for _ in range(20):  # ~2 s, several renewals
        assert holder.holds_now() and not other.holds_now()
        time.sleep(0.1)
    assert holder.send("put state x").startswith("ok")
    assert other.send("put state y").startswith("error LeaseLost")


def test_a_killed_holder_is_replaced_within_ttl_plus_two_seconds(contenders):
    a, b = contenders("a"), contenders("b")
    holder, other = first_holder(a, b)
    killed = time.monotonic()
    holder.proc.kill()
    line = other.expect("acquired", TTL + 2)
    took = time.monotonic() - killed
    assert took <= TTL + 2, took
    assert other.send("put state after").startswith("ok")
    print(f"handover after SIGKILL: {took:.2f}s ({line})")


def test_a_released_lease_is_taken_at_once(contenders):
    a, b = contenders("a"), contenders("b")
    holder, other = first_holder(a, b)
    released = time.monotonic()
    holder.send("release", "released")
    other.expect("acquired", TTL)
    assert time.monotonic() - released < TTL - 1  # not by expiry: the key was deleted


def test_a_paused_holder_resumed_after_losing_the_lease_writes_nothing(contenders):
    a, b = contenders("a"), contenders("b")
    holder, other = first_holder(a, b)
    old = int(holder.send("fence", "fence").split()[1])
    assert holder.send("put state before").startswith("ok")
    holder.proc.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    new = int(other.expect("acquired", TTL + 2).split()[1])
    assert time.monotonic() - paused <= TTL + 2
    assert new > old  # tokens only grow
    assert other.send("put state new").startswith("ok")
    holder.proc.send_signal(signal.SIGCONT)
    # the write it took its token for before the pause: the cluster refuses it
    answer = holder.send(f"putfenced {old} state stale")
    assert answer.startswith("error FencedOut"), answer
    # and by its own clock it knows it lost the lease
    assert holder.send("put state stale").startswith("error LeaseLost")
    assert any(line.startswith("lost") for line in holder.seen), holder.seen
    check = contenders("reader")
    assert check.send(f"putfenced {old} probe x").startswith("error FencedOut")
    assert other.send("put state newest").startswith("ok")
    # the lease bucket's reads are direct gets, which any replica serves: another process's
    # get right after the put may briefly see the value before it (docs/jetstream.md)
    deadline = time.monotonic() + 5
    while (got := check.send("get state", "value")) != "value newest":
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    assert got == "value newest"


def test_an_expired_lease_fences_its_last_token_even_with_no_new_holder(contenders):
    a = contenders("a")
    a.expect("acquired", 10)
    token = int(a.send("fence", "fence").split()[1])
    a.send("release", "released")
    answer = contenders("b").send(f"putfenced {token} state late")
    # b may have acquired meanwhile; either way the released holder's token is dead
    assert answer.startswith("error FencedOut"), answer


@pytest.mark.parametrize(("ttl", "taken"), [(None, True), ("never", True), ("30s", False)])
def test_a_value_left_on_the_lease_key_by_hand_blocks_it_only_while_it_can_expire(
    nats_single, ttl: str | None, taken: bool
) -> None:
    """``nats kv put <bucket> lease.sealer …`` by a careless operator: no TTL (or one that never
    expires). Before: the key looked held for good, so no node ever took the lease again — no
    sealing, no retention, no journal — and nothing was logged. A value with a real TTL is left
    alone until it expires, as a holder's is."""
    import asyncio

    import nats

    from loglake.node.cluster import read_lease
    from loglake.streams.lease import JetStreamLease, lease_bucket

    async def main() -> None:
        nc = await nats.connect(nats_single.url)
        try:
            js = nc.jetstream()
            bucket = new_prefix() + "_leases"
            kv = await lease_bucket(js, bucket)
            headers = {"Nats-TTL": ttl} if ttl else None
            for name in ("sealer", "idle"):
                await js.publish(f"$KV.{bucket}.lease.{name}", b"by hand", headers=headers)
            lease = await JetStreamLease(js, bucket, "sealer", "node-a", ttl=1, retry=0.2).start()
            deadline = time.monotonic() + 3
            while not lease.holds() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert lease.holds() is taken
            holder, _, _ = await read_lease(js, bucket, "idle")  # nobody contends for it
            assert holder == (None if taken else "by hand")  # the Cluster page's holder
            if taken:
                assert (await kv.get("lease.sealer")).value == b"node-a"
                assert await lease.put("state", b"x") > 0  # fenced writes pass
                assert (await read_lease(js, bucket, "sealer"))[0] == "node-a"
            await lease.release()
        finally:
            await nc.close()

    asyncio.run(main())


def test_a_recreated_lease_bucket_never_gives_back_a_former_holders_token(nats_single) -> None:
    """An operator deletes the lease bucket ("reset the leases") while a holder is paused; a
    node recreates it and takes the lease. Before: the new bucket's revisions started at 1
    again, so once the new holder's revision reached the paused holder's token, that holder's
    fenced write was accepted — while the new one held the lease (seen: token 6, accepted at
    revision 7 after ~2 s). The tokens of a new bucket start above any earlier bucket's."""
    import asyncio

    import nats

    from loglake.streams.lease import FencedOut, JetStreamLease

    async def main() -> None:
        nc = await nats.connect(nats_single.url)
        try:
            js = nc.jetstream()
            bucket = new_prefix() + "_leases"
            a = await JetStreamLease(js, bucket, "sealer", "node-a", ttl=1, retry=0.1).start()
            while not a.holds():
                await asyncio.sleep(0.02)
            for _ in range(3):
                await a.put("state", b"a")
            token = a.fence()
            await a.close()  # paused: no more renewals, its token kept
            await js.delete_stream(f"KV_{bucket}")
            b = await JetStreamLease(js, bucket, "sealer", "node-b", ttl=1, retry=0.1).start()
            while not b.holds():
                await asyncio.sleep(0.02)
            deadline = time.monotonic() + 4  # several of b's renewals (every ttl / 3)
            while time.monotonic() < deadline:
                with pytest.raises(FencedOut):
                    await a.put_fenced("state", b"from the paused holder", token)
                await asyncio.sleep(0.05)
            assert await b.get("state") is None  # nothing of a's in the new bucket
            assert b.token is not None and b.token > token
            await b.close()
        finally:
            await nc.close()

    asyncio.run(main())
