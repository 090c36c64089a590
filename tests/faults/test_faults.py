"""Injected disk faults under every durable part (issue 15 §3): ENOSPC and EIO on write and on
fsync, short writes, then a power loss (``tests/faults/inject.py``, ``faultfs.py``). The
invariants: no acknowledged operation lost, nothing acknowledged that a failed fsync left
undurable (the power loss would show it), only typed errors reach the caller, and the part
works again once the fault clears. ``benchmarks/crash_parts.py --faults`` runs many more seeds.

SQLite (the archives' working store) runs over an apsw VFS whose file data goes through
``loglake.log.fs`` (``sqlite_vfs.py``), so these faults and power losses reach it too; a real
full disk is also made with a small tmpfs (root only; skipped with the reason otherwise).
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections import Counter

import pytest

from loglake.streams.api import LocalStreams
from tests.faults.faultfs import DIR_FSYNC, KINDS
from tests.faults.inject import run
from tests.faults.parts import PARTS
from tests.tmpfs import small_tmpfs

SEEDS = (1, 2, 3)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARTS))
def test_faults_lose_nothing_acknowledged_and_surface_typed_errors(tmp_path, name):
    injected: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    acks = 0
    for seed in SEEDS:
        r = run(name, tmp_path / f"s{seed}", seed)  # raises on any broken invariant
        injected += r.injected
        errors += r.errors
        acks += r.acks
        shutil.rmtree(tmp_path / f"s{seed}", ignore_errors=True)
    assert sum(injected.values()) > 0, "no fault was injected: the layer is not in the path"
    assert errors, "faults were injected but no operation ever failed"
    assert acks > 0, "nothing was acknowledged"


@pytest.mark.slow
def test_failed_fsyncs_only_never_count_as_durable(tmp_path):
    """fsync EIO alone, often: SimDisk drops the pages each failed fsync should have written
    (as Linux does); a part that retried the fsync and acknowledged would lose them at the
    power loss that follows."""
    for name in ("consumer-index", "icrc-ledger"):
        r = run(name, tmp_path / name, 7, ops=30, rate=0.2, kinds=("fsync-eio",))
        assert r.injected["fsync-eio"] > 0 and r.errors


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARTS))
def test_failed_folder_fsyncs_lose_nothing_acknowledged(tmp_path, name):
    """Folder fsyncs fail too (EIO, none of the folder's pending entries made durable): a part
    must not count a file it created, renamed into place or removed as done when the fsync
    of its folder failed — the power loss after the run would show it."""
    injected: Counter[str] = Counter()
    for seed in SEEDS:
        r = run(name, tmp_path / f"s{seed}", seed, rate=0.1, kinds=(*KINDS, DIR_FSYNC))
        injected += r.injected
        assert not r.untyped, r.untyped
        shutil.rmtree(tmp_path / f"s{seed}", ignore_errors=True)
    assert injected[DIR_FSYNC] > 0, "no folder fsync failed: the kind is not in the path"


@pytest.mark.parametrize(
    ("name", "seed"),
    [
        # the log trusted folders a failed fsync left undurable (a stream's config, the
        # consumer file renamed into place): a power loss took acknowledged records
        ("consumer-index", 120),
        ("icrc-journal", 120),
        ("icrc-ledger", 119),
        # the archives node re-flagged its store from an index whose rename was not durable:
        # after a power loss the store was ahead of the files and a week was skipped
        ("archive-prune", 1),
    ],
)
def test_folder_fsync_findings_stay_fixed(tmp_path, name, seed):
    run(name, tmp_path, seed, rate=0.1, kinds=(*KINDS, DIR_FSYNC))  # raises on a loss


@pytest.mark.parametrize("name", ["consumer-index", "icrc-ledger", "sds-channel"])
def test_the_checks_see_a_loss_when_fsync_does_nothing(tmp_path, name):
    """The same runs without faults on a disk whose fsync does nothing: the power loss takes
    acknowledged operations, and the part's checks say so (they are not vacuous) — or the part
    itself refuses to open (the consumer store's watermark sees fsynced bytes missing)."""
    from loglake.errors import LoglakeError

    caught = []
    for seed in range(1, 9):
        try:
            run(name, tmp_path / f"s{seed}", seed, ops=20, rate=0.0, fsync=False)
        except (AssertionError, LoglakeError) as e:
            caught.append(f"{type(e).__name__}: {e}")
    assert caught, f"{name}: 8 power losses with fsync disabled, and no check failed"


# -- the log recovers from failed fsyncs without a restart ------------------------------------


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_the_log_recovers_from_faults_without_a_restart(tmp_path, seed):
    """Appends and consumer-index saves on two partitions while 5% of the writes and fsyncs
    fail (ENOSPC, EIO, short writes), and the program never restarts: each failure is a typed
    error naming what failed, nothing it covered is acknowledged, and failed partitions (and the
    consumer store) reopen from disk by themselves as the test's clock passes their back-off.
    Once the fault clears, the next append and save after the back-off succeed; every
    acknowledged record and save is there, then and after the power loss that follows."""
    import random

    from loglake.log import Entry, StorageFailed, StreamConfig, open_log
    from loglake.log.reopen import REOPEN_MAX_S
    from tests.faults.faultfs import FaultyFs
    from tests.faults.inject import describe, typed
    from tests.log.clock import ManualClock
    from tests.log.simdisk import SimDisk

    rng = random.Random(seed)
    clock = ManualClock()
    acked: dict[tuple[int, int], bytes] = {}
    saved: dict[str, int] = {}
    errors: Counter[str] = Counter()
    with SimDisk(tmp_path) as disk:
        log = open_log(disk.root / "data", clock=clock)
        # no lake: one thread touches the disk, so the seed replays (FaultyFs is not shared)
        log.create_stream("s", StreamConfig(partitions=2, segment_bytes=3000, seal_to_lake=False))
        with FaultyFs(disk, rng, rate=0.05) as faults:
            for n in range(300):
                p = rng.randrange(2)
                try:
                    if rng.random() < 0.8:
                        datas = [
                            b"%d:%d:%d|" % (seed, n, i) + b"x" * rng.randint(0, 300)
                            for i in range(rng.randint(1, 4))
                        ]
                        indexes = log.append_many("s", [Entry(d) for d in datas], partition=p)
                        acked.update({(p, i): d for i, d in zip(indexes, datas, strict=True)})
                    else:
                        c = f"c{p}"
                        saved[c] = log.save_index(
                            c, "s", saved.get(c, 0) + rng.randint(1, 3), partition=p
                        )
                except Exception as e:
                    errors[describe(e)] += 1
                    assert typed(e), f"seed {seed}: untyped {describe(e)}: {e}"
                    if isinstance(e, StorageFailed):
                        assert f"s/{p}" in str(e) or "consumers.log" in str(e), str(e)
                clock.advance(rng.choice((0.01, 0.05, 0.2, 1.0)))
            reopens = sum(h.reopens for h in log.health())
            faults.active = False  # the fault clears: no restart, just the back-off
        clock.advance(REOPEN_MAX_S)
        for p in range(2):
            i = log.append("s", b"after the fault", partition=p)
            acked[(p, i)] = b"after the fault"
            saved[f"c{p}"] = log.save_index(f"c{p}", "s", saved.get(f"c{p}", 0) + 1, partition=p)
        assert all(h.ok for h in log.health()), log.health()
        for p in range(2):
            got = {r.index: r.data for r in log.read("s", 0, partition=p)}
            assert all(got.get(i) == d for (q, i), d in acked.items() if q == p)
        assert sum(faults.injected.values()) > 0 and errors["StorageFailed"] > 0
        assert reopens > 0, f"seed {seed}: no partition was reopened ({dict(errors)})"
        print(f"seed {seed}: {len(acked)} acked, errors {dict(errors)}, {reopens} reopens")
        disk.restart(rng)  # a power loss once the fault has cleared
        with open_log(disk.root / "data") as log:
            for p in range(2):
                got = {r.index: r.data for r in log.read("s", 0, partition=p)}
                lost = [i for (q, i), d in acked.items() if q == p and got.get(i) != d]
                assert not lost, f"seed {seed}: acknowledged records lost: {lost[:5]}"
                assert (log.get_index(f"c{p}", "s", partition=p) or 0) >= saved[f"c{p}"]


# -- SQLite on a real full disk ---------------------------------------------------------------


def test_archive_store_on_a_full_disk_refuses_then_resumes_exactly_once(tmp_path):
    """The control node's SQLite store on a 512 KiB tmpfs: ingest fails with
    ``OSError(ENOSPC)`` (SQLite's "database or disk is full", translated), the store keeps
    exactly what earlier transactions committed (rows and the stream position together), and
    once the disk grows the same ingest completes with every record once and builds."""
    from coincurve import PrivateKey

    from loglake.archives.control import ControlNode
    from loglake.archives.layout import get_layout
    from loglake.archives.store import MessageStore
    from loglake.log import open_log
    from tests.archives.helpers import START, WEEK, fill_weeks

    layout = get_layout("spec")
    small = tmp_path / "small"
    with small_tmpfs(small, "512k"), open_log(tmp_path / "data") as log:
        fill_weeks(log, "community", layout, range(4), 500, size=400)
        store = MessageStore(small / "store.sqlite")
        node = ControlNode(
            tmp_path / "archives", PrivateKey(bytes.fromhex("33" * 32)), layout, store
        )
        with pytest.raises(OSError) as e:
            node.ingest_streams(LocalStreams(log), "community", batch=200)
        assert e.value.errno == errno.ENOSPC and "full" in str(e.value)
        kept, pos = store.count(), int(store.get_meta("ingest_next_index") or 0)
        assert kept == pos < 2000  # committed rows and the stream position agree
        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        assert node.ingest_streams(LocalStreams(log), "community", batch=200) == 2000 - pos
        assert store.count() == 2000
        out = node.build(START + 4 * WEEK)
        assert len(out.new) == 4
        store.close()
