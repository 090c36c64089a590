"""Read faults (issue 15 §3): ``pread`` fails with EIO (``faultfs.READ_EIO``) under the log, the
consumer store, a pull over TCP and recovery at open.

What a read error must and must not do: the read (or the open) that hit it fails with a typed
error — ``OSError(EIO)`` in process, an ``error`` reply over TCP with the connection kept —
nothing acknowledged is lost, the partition is *not* failed for writes (a read error says
nothing about what was written: appends go on during the fault), and reads work again once the
fault clears. A read fault during ``open_log`` fails the open cleanly (no LOCK kept, no
descriptor leaked, no recovery decision taken on bytes it could not read), and a later open
succeeds with everything acknowledged. The archives' SQLite store gets its read faults through
``sqlite_vfs.FsVfs`` (``xRead``): ``tests/archives/test_store_faults.py`` and the archive
parts of ``test_faults.py``.
"""

from __future__ import annotations

import errno
import os
import random
from collections import Counter

import pytest

from loglake.log import LogLocked, StreamConfig, open_log
from tests.faults.faultfs import KINDS, READ_EIO, FaultyFs
from tests.faults.inject import run
from tests.faults.parts import PARTS
from tests.log.simdisk import SimDisk

SMALL = StreamConfig(partitions=2, segment_bytes=3000, seal_to_lake=False)
"""Several sealed segments and an active one per partition; no lake (one thread on the disk,
so a seed replays)."""


def _is_eio(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno == errno.EIO


def _fill(log, rng: random.Random, n: int) -> dict[tuple[int, int], bytes]:
    acked: dict[tuple[int, int], bytes] = {}
    for k in range(n):
        p = k % 2
        data = b"%d|" % k + b"r" * rng.randint(0, 200)
        acked[(p, log.append("s", data, partition=p))] = data
    return acked


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_read_fault_fails_the_read_and_not_the_partition(tmp_path):
    rng = random.Random(5)
    with SimDisk(tmp_path) as disk, open_log(disk.root / "data") as log:
        log.create_stream("s", SMALL)
        acked = _fill(log, rng, 120)
        with FaultyFs(disk, rng, rate=1.0, kinds=(READ_EIO,)) as faults:
            for p in range(2):
                with pytest.raises(OSError) as e:
                    log.read("s", 0, partition=p)
                assert e.value.errno == errno.EIO
            # not failed for writes: appends (and index saves) go on during the read fault
            assert all(h.ok for h in log.health()), log.health()
            for p in range(2):
                acked[(p, log.append("s", b"during the fault", partition=p))] = b"during the fault"
            assert log.save_index("c", "s", 7) == 7 and log.get_index("c", "s") == 7
            assert faults.injected[READ_EIO] >= 2
            faults.active = False  # the fault clears: the same log reads everything
            for p in range(2):
                got = {r.index: r.data for r in log.read("s", 0, partition=p)}
                assert got == {i: d for (q, i), d in acked.items() if q == p}
        assert all(h.ok and h.reopens == 0 for h in log.health())


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_reads_and_appends_under_random_read_faults_lose_nothing(tmp_path, seed):
    """A third of the preads fail while reads (any start, any limit) and appends interleave:
    every read returns exactly the acknowledged records it asked for or raises
    ``OSError(EIO)``; no append fails; nothing is reopened; after the fault clears and a power
    loss, every acknowledged record is there."""
    rng = random.Random(seed)
    seen: Counter[str] = Counter()
    with SimDisk(tmp_path) as disk:
        with open_log(disk.root / "data") as log:
            log.create_stream("s", SMALL)
            acked = _fill(log, rng, 60)
            with FaultyFs(disk, rng, rate=0.3, kinds=(READ_EIO,)) as faults:
                for n in range(300):
                    p = rng.randrange(2)
                    if rng.random() < 0.3:
                        data = b"%d:%d|" % (seed, n) + b"a" * rng.randint(0, 300)
                        acked[(p, log.append("s", data, partition=p))] = data
                        continue
                    mine = sorted(i for q, i in acked if q == p)
                    start = rng.choice(mine)
                    limit = rng.choice((None, 1, 5, 40))
                    try:
                        got = log.read("s", start, limit, partition=p)
                    except OSError as e:
                        assert _is_eio(e), f"seed {seed}: {e!r}"
                        seen["EIO"] += 1
                        continue
                    want = [i for i in mine if i >= start][:limit]
                    assert [r.index for r in got] == want, f"seed {seed} read {p}@{start}"
                    assert all(r.data == acked[(p, r.index)] for r in got)
                    seen["read"] += 1
                injected = faults.injected[READ_EIO]
            assert all(h.ok and h.reopens == 0 for h in log.health()), log.health()
        assert injected > 0 and seen["EIO"] > 0 and seen["read"] > 0, (injected, seen)
        disk.restart(rng)  # a power loss after the fault cleared
        with open_log(disk.root / "data") as log:
            for p in range(2):
                got = {r.index: r.data for r in log.read("s", 0, partition=p)}
                lost = [i for (q, i), d in acked.items() if q == p and got.get(i) != d]
                assert not lost, f"seed {seed}: acknowledged records lost: {lost[:5]}"


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_a_read_fault_while_opening_fails_the_open_cleanly(tmp_path, seed):
    """Opening reads every stream's config, the watermarks, each partition's segment tails
    and indexes (recovery) and the consumer store. With preads failing, ``open_log`` either
    opens or raises ``OSError(EIO)`` — and then keeps no LOCK (the next open is not
    ``LogLocked``) and no descriptor; recovery decides nothing on bytes it could not read
    (nothing acknowledged is cut). Once the fault clears, the open succeeds and every record
    and consumer index is there."""
    rng = random.Random(seed)
    with SimDisk(tmp_path) as disk:
        with open_log(disk.root / "data") as log:
            log.create_stream("s", SMALL)
            acked = _fill(log, rng, 80)
            log.save_index("c", "s", 40, partition=1)
        base_fds = _open_fds()
        failed = opened = 0
        with FaultyFs(disk, rng, rate=0.1, kinds=(READ_EIO,)) as faults:
            for _ in range(12):
                try:
                    log = open_log(disk.root / "data")
                except LogLocked as e:
                    pytest.fail(f"seed {seed}: a failed open kept the LOCK: {e}")
                except OSError as e:
                    assert _is_eio(e), f"seed {seed}: {e!r}"
                    failed += 1
                    assert _open_fds() == base_fds, "a failed open leaked descriptors"
                    continue
                opened += 1
                log.close()
            injected = faults.injected[READ_EIO]
        assert injected > 0 and failed > 0, (injected, failed, opened)
        with open_log(disk.root / "data") as log:
            assert log.get_index("c", "s", partition=1) == 40
            for p in range(2):
                got = {r.index: r.data for r in log.read("s", 0, partition=p)}
                assert got == {i: d for (q, i), d in acked.items() if q == p}
            i = log.append("s", b"after")
            assert log.read("s", i)[0].data == b"after"
        assert _open_fds() == base_fds


def test_the_consumer_store_under_read_faults(tmp_path):
    """The consumer store reads its file only when it opens (and a read-only log on every
    ``get``): with every pread failing, saves and gets of the open log work, a read-only open
    fails with ``OSError(EIO)``, and after the fault every save is there."""
    rng = random.Random(3)
    with SimDisk(tmp_path) as disk:
        with open_log(disk.root / "data") as log:
            log.create_stream("s", SMALL)
            for p in (0, 1):  # partitions open on first use, reading their files: before the fault
                log.next_index("s", partition=p)
            with FaultyFs(disk, rng, rate=1.0, kinds=(READ_EIO,)) as faults:
                for k in range(1, 30):
                    assert log.save_index(f"c{k % 3}", "s", k, partition=k % 2) == k
                    assert log.get_index(f"c{k % 3}", "s", partition=k % 2) == k
                with pytest.raises(OSError) as e:
                    open_log(disk.root / "data", readonly=True)
                assert _is_eio(e.value)
                assert faults.injected[READ_EIO] > 0
            assert all(h.ok for h in log.health())
        disk.restart(rng)
        with open_log(disk.root / "data") as log:
            assert {log.get_index(f"c{k % 3}", "s", partition=k % 2) for k in (27, 28, 29)} == {
                27,
                28,
                29,
            }


def test_a_pull_over_tcp_that_hits_a_read_fault_gets_an_error_reply(tmp_path):
    """A pull whose read fails gets an ``error`` reply (the client raises
    ``StreamServiceError``); the connection stays open: the same client pushes during the
    fault, and once it clears pulls every message, those pushed during the fault included."""
    from loglake.streams.client import StreamClient, StreamServiceError
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    rng = random.Random(9)
    with SimDisk(tmp_path) as disk, open_log(disk.root / "data") as log:
        service = StreamService(log, StreamConfig(segment_bytes=3000, seal_to_lake=False))
        with BackgroundServer(service) as srv, StreamClient("127.0.0.1", srv.port) as c:
            c.create_stream("t")
            c.push_many("t", [b"m%d" % k for k in range(50)])
            with FaultyFs(disk, rng, rate=1.0, kinds=(READ_EIO,)) as faults:
                with pytest.raises(StreamServiceError):
                    c.pull("t", 0, 100)
                c.push_many("t", [b"d%d" % k for k in range(5)])  # writes go on
                assert faults.injected[READ_EIO] > 0
            got = c.pull("t", 0, 100)
            assert [m.data for m in got] == [b"m%d" % k for k in range(50)] + [
                b"d%d" % k for k in range(5)
            ]
        assert all(h.ok for h in log.health())


# -- every part under read faults too (tests/faults/inject.py) ---------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    sorted(PARTS),
)
def test_every_part_under_read_faults_loses_nothing(tmp_path, name):
    """The fault runs of ``test_faults.py`` with EIO on ``pread`` besides the write and fsync
    faults: reads happen mostly while a part opens, and a part reopens after every failed
    operation, so read faults hit recovery again and again. Only typed errors, nothing
    acknowledged lost after the power loss, full recovery once the fault clears."""
    injected: Counter[str] = Counter()
    # the archive parts read far more per open (the store, data and index files): a lower
    # rate lets their lives get past opening; archive-build seed 4 meets a failed read outside
    # a transaction (apsw's IOError before MessageStore._reading typed it)
    archive = name.startswith("archive")
    for seed in (1, 4) if name == "archive-build" else (1, 2):
        r = run(
            name,
            tmp_path / f"s{seed}",
            seed,
            kinds=(*KINDS, READ_EIO),
            read_rate=0.005 if archive else 0.02,
        )
        injected += r.injected
        assert r.leaked_locks == 0, f"{name} seed {seed}: a failed open kept the LOCK"
    assert injected[READ_EIO] > 0, f"{name}: no read fault was injected: {dict(injected)}"


# -- the archives' SQLite store: xRead through sqlite_vfs --------------------------------------


def _store_msgs(first: int, n: int) -> list:
    from loglake.archives.messages import DecodedMessage
    from tests.archives.helpers import START

    return [
        DecodedMessage(START + i, "/a", i.to_bytes(4, "big") + bytes(3000), 3004)
        for i in range(first, first + n)
    ]


def test_the_archives_store_under_read_faults_loses_nothing(tmp_path):
    """SQLite reads the database and its WAL through ``FsVfs.xRead`` → ``fs.pread``: with a
    third of the reads failing, each call on a freshly opened store either works or fails
    with an I/O error (a failed write transaction is rolled back and redone once the fault
    clears); afterwards, and after a power loss, the store holds exactly the committed rows."""

    from loglake.archives.store import MessageStore
    from tests.faults.sqlite_vfs import close_dead, fs_vfs

    rng = random.Random(4)
    committed = 0
    errors: Counter[str] = Counter()
    with SimDisk(tmp_path) as disk, fs_vfs() as vfs:
        path = disk.root / "store.sqlite"
        s = MessageStore(path, vfs=vfs.name)
        s.add(_store_msgs(0, 20), next_index=20)
        committed = 20
        s.close()
        with FaultyFs(disk, rng, rate=0.3, kinds=(READ_EIO,)) as faults:
            for k in range(30):
                try:  # a new connection each time: nothing in SQLite's page cache yet
                    s = MessageStore(path, vfs=vfs.name)
                except OSError as e:
                    assert e.errno == errno.EIO, e
                    errors["open: OSError(EIO)"] += 1
                    continue
                try:
                    if k % 2:
                        s.add(_store_msgs(committed, 2), next_index=committed + 2)
                        committed += 2
                    else:
                        assert s.count() == committed
                except OSError as e:
                    assert e.errno == errno.EIO, e
                    errors["OSError(EIO)"] += 1
                finally:
                    close_dead(s.db)
            injected = faults.injected[READ_EIO]
        assert injected > 0 and errors, (injected, errors)
        s = MessageStore(path, vfs=vfs.name)
        assert s.count() == committed and s.get_meta("ingest_next_index") == str(committed)
        s.add(_store_msgs(committed, 1), next_index=committed + 1)
        disk.power_off()
        close_dead(s.db)
        disk.restart(rng)
        s = MessageStore(disk.root / "store.sqlite", vfs=vfs.name)
        assert s.count() == committed + 1
        s.close()


def test_a_failed_store_read_is_an_oserror_naming_the_file(tmp_path):
    from loglake.archives.store import MessageStore
    from tests.faults.sqlite_vfs import close_dead, fs_vfs

    with SimDisk(tmp_path) as disk, fs_vfs() as vfs:
        path = disk.root / "store.sqlite"
        s = MessageStore(path, vfs=vfs.name)
        s.add(_store_msgs(0, 20), next_index=20)
        s.close()
        s = MessageStore(path, vfs=vfs.name)
        try:
            with FaultyFs(disk, random.Random(1), rate=1.0, kinds=(READ_EIO,)):
                try:
                    s.count()
                except OSError as e:
                    assert e.errno == errno.EIO and "store.sqlite" in str(e)
                except Exception as e:
                    raise AssertionError(f"untyped: {type(e).__name__}: {e}") from e
                else:
                    raise AssertionError("the read did not fail")
            assert s.count() == 20  # the same connection reads again once the disk does
        finally:
            close_dead(s.db)


def test_a_pull_read_error_reply_names_the_stream_and_partition(tmp_path):
    from loglake.streams.client import StreamClient, StreamServiceError
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with SimDisk(tmp_path) as disk, open_log(disk.root / "data") as log:
        service = StreamService(log, StreamConfig(seal_to_lake=False))
        with BackgroundServer(service) as srv, StreamClient("127.0.0.1", srv.port) as c:
            c.create_stream("t")
            c.push("t", b"x")
            with (
                FaultyFs(disk, random.Random(1), rate=1.0, kinds=(READ_EIO,)),
                pytest.raises(StreamServiceError) as e,
            ):
                c.pull("t", 0, 10)
            assert "read failed: stream 't' partition 0" in str(e.value), str(e.value)
