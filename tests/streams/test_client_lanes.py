"""An error reply on a push lane answers exactly one push (issue 16, "stale error").

An ``error`` carries no request id. The clients used to treat one as "fail whatever is in flight
on the lane", so the leftover errors of a failed ``push_many`` could fail a later push on the
same partition — a push whose record *was* stored. Now each error answers the oldest push in
flight on its lane (the server answers one return route in order), and answers of pushes a
caller gave up on are dropped.

The server here is real; its log refuses (ENOSPC, an ``error`` reply) every append while
``full`` is set, and every append holding a record that starts with ``bad``. One partition's
pushes that reach the server together are one append (group commit), so a good record sharing
an append with a bad one is refused too — really not stored, and told so. The invariant checked
after interleaved failing and succeeding pushes: a push that returned an index has its record
at that index, and no refused bad record is stored.
"""

from __future__ import annotations

import asyncio
import errno
import random

import pytest

from loglake.log import MemoryLog
from loglake.streams import codec
from loglake.streams.client import AsyncStreamClient, ClientCore, DiskFull, StreamClient
from loglake.streams.messages import Error
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import Address, RoutingMessage, TcpConnection, encode_frame

WORKER = Address.local(worker_address("s", 0))


def reply(payload: bytes) -> bytes:
    """A frame the service sends on push lane p0."""
    return encode_frame(RoutingMessage((Address.local("p0"),), (WORKER,), payload))


def test_core_an_error_answers_the_oldest_push_in_flight_on_its_lane():
    core = ClientCore()
    core.receive_data(TcpConnection.initial_bytes())
    first, _ = core.push_frames(WORKER, [b"a", b"b", b"c"])
    core.forget(0, first[1:])  # the caller gave up after the first error
    later, _ = core.push_frames(WORKER, [b"d"])
    err = codec.encode_payload(Error("disk full: stream 's' partition 0"))
    core.receive_data(reply(err))
    assert core.push_errors == {first[0]: Error("disk full: stream 's' partition 0")}
    core.receive_data(reply(err) + reply(err))  # the leftovers: dropped, not pinned on "d"
    assert list(core.push_errors) == [first[0]] and core.confirms == {}
    core.receive_data(reply(codec.encode_push_confirm(later[0], 7)))
    assert core.confirms == {later[0]: (True, 7)}
    assert list(core.in_flight[0]) == []
    core.receive_data(reply(err))  # an error with nothing in flight fails nothing
    assert list(core.push_errors) == [first[0]]


class RefusingLog(MemoryLog):
    """A memory log whose appends fail like a full disk while ``full``, or when a record
    starts with ``bad``."""

    full = False

    def append_payloads(self, stream, datas, *, partition=0):
        if self.full or any(d.startswith(b"bad") for d in datas):
            raise OSError(errno.ENOSPC, "No space left on device (refused by the test log)")
        return super().append_payloads(stream, datas, partition=partition)


@pytest.fixture
def log():
    return RefusingLog()


@pytest.fixture
def server(log):
    with BackgroundServer(StreamService(log)) as srv:
        yield srv


def stored(log: MemoryLog, stream: str) -> dict[int, bytes]:
    return {i: d for i, d in log.read_payloads(stream, 0, 1_000_000)}


def test_sync_client_leftover_errors_never_fail_the_next_push(server, log):
    with StreamClient(port=server.port, timeout=10, window=64) as c:
        c.create_stream("s")
        for round_ in range(20):
            log.full = True
            with pytest.raises(DiskFull, match="stream 's' partition 0"):
                c.push_many("s", [b"x"] * 200)  # 200 errors; the client stops at the first
            log.full = False  # space frees; the other 199 errors are still on their way
            idx = c.push("s", f"good {round_}".encode())  # was: failed by a leftover error
            assert stored(log, "s")[idx] == f"good {round_}".encode()
        # pushes of a failed push_many the server reached after space freed may be stored:
        # nobody waits for their confirms (push_many is not atomic; the spec lets a client
        # resend what it got no OK for)
        goods = [d for d in stored(log, "s").values() if d.startswith(b"good")]
        assert goods == [f"good {r}".encode() for r in range(20)]


def test_async_client_leftover_errors_never_fail_the_next_push(server, log):
    async def main():
        # the old client failed the good push in ~1 round of 10 (measured); 50 rounds
        c = await AsyncStreamClient.connect(port=server.port, window=8)
        try:
            await c.create_stream("s")
            for round_ in range(50):
                log.full = True
                with pytest.raises(DiskFull):
                    await c.push_many("s", [b"x"] * 400)
                log.full = False
                idx = await c.push("s", f"good {round_}".encode())  # was: a stale error
                assert stored(log, "s")[idx] == f"good {round_}".encode()
        finally:
            await c.close()

    asyncio.run(main())


def test_async_concurrent_pushes_on_one_lane_each_get_their_own_answer(server, log):
    """Many tasks push to one partition at once, a seeded mix of failing and succeeding
    batches: every push that returned an index is stored there, every one that raised is not.
    One batch in ten is bad: under load the server appends all 8 tasks' batches at once (group
    commit), and one bad batch refuses the whole append, so with 4 in 10 (as before) no push
    succeeded in some runs (3 of 14, on a loaded machine) and ``check`` saw one outcome only;
    at 1 in 10, no success in 15 rounds of 8 is ~2e-4 even if every round is one append."""
    rng = random.Random(16)
    print("seed 16")

    async def pusher(c: AsyncStreamClient, k: int, results: list):
        for j in range(15):
            bad = rng.random() < 0.1
            datas = [f"{'bad' if bad else 'ok'} {k}.{j}.{n}".encode() for n in range(1, 9)]
            try:
                results.append((datas, await c.push_many("s", datas)))
            except DiskFull:
                results.append((datas, None))

    results = pushing_tasks(server.port, pusher, 8, window=16)
    check(stored(log, "s"), results)


def test_async_single_pushes_from_many_tasks_each_get_their_own_answer(server, log):
    """``AsyncStreamClient.push`` (one frame, one future): tasks pushing one record at a time
    on one lane, a seeded mix of failing and succeeding ones, never get another's answer."""
    rng = random.Random(17)
    print("seed 17")

    async def pusher(c: AsyncStreamClient, k: int, results: list):
        for j in range(25):
            data = f"{'bad' if rng.random() < 0.4 else 'ok'} {k}.{j}".encode()
            try:
                results.append(([data], [await c.push("s", data)]))
            except DiskFull:
                results.append(([data], None))

    results = pushing_tasks(server.port, pusher, 6)
    check(stored(log, "s"), results)


def pushing_tasks(port: int, pusher, tasks: int, **connect) -> list:
    """``tasks`` concurrent ``pusher(client, k, results)`` on one async client's connection
    to stream ``s``; the ``(datas, indexes or None)`` they recorded."""

    async def main() -> list:
        c = await AsyncStreamClient.connect(port=port, **connect)
        try:
            await c.create_stream("s")
            results: list = []
            await asyncio.gather(*(pusher(c, k, results) for k in range(tasks)))
            return results
        finally:
            await c.close()

    return asyncio.run(main())


def check(log_now: dict[int, bytes], results: list) -> None:
    """Acknowledged ⇒ stored at that index; no bad record stored; both outcomes happened."""
    assert not any(d.startswith(b"bad") for d in log_now.values())
    for datas, indexes in results:
        if indexes is not None:
            assert [log_now[i] for i in indexes] == datas
    assert {i is None for _, i in results} == {True, False}


def test_sync_client_interleaved_failing_and_succeeding_pushes(server, log):
    rng = random.Random(7)
    results: list = []
    with StreamClient(port=server.port, timeout=10, window=8) as c:
        c.create_stream("s")
        for j in range(200):
            batch = [f"{'bad' if rng.random() < 0.3 else 'ok'} {j}.{n}".encode() for n in range(5)]
            try:
                results.append((batch, c.push_many("s", batch)))
            except DiskFull:
                results.append((batch, None))
    check(stored(log, "s"), results)
