"""Injected disk faults under every durable part (issue 15 §3): ENOSPC and EIO on write and on
fsync, short writes, then a power loss (``tests/faults/inject.py``, ``faultfs.py``). The
invariants: no acknowledged operation lost, nothing acknowledged that a failed fsync left
undurable (the power loss would show it), only typed errors reach the caller, and the part
works again once the fault clears. ``benchmarks/crash_parts.py --faults`` runs many more seeds.

SQLite (the archives' working store) does its own I/O, outside ``loglake.log.fs``: a real full
disk is made with a small tmpfs (root only; skipped with the reason otherwise).
"""

from __future__ import annotations

import errno
import logging
import shutil
import subprocess
from collections import Counter

import pytest

from tests.faults.inject import run
from tests.faults.parts import PARTS
from tests.tmpfs import small_tmpfs

SEEDS = (1, 2, 3)


@pytest.fixture(autouse=True)
def _quiet():
    """Recovery and failure warnings are expected here by the hundred."""
    lg = logging.getLogger("loglake")
    old = lg.level
    lg.setLevel(logging.CRITICAL)
    yield
    lg.setLevel(old)


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
            node.ingest_log(log, "community", batch=200)
        assert e.value.errno == errno.ENOSPC and "full" in str(e.value)
        kept, pos = store.count(), int(store.get_meta("ingest_next_index") or 0)
        assert kept == pos < 2000  # committed rows and the stream position agree
        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        assert node.ingest_log(log, "community", batch=200) == 2000 - pos
        assert store.count() == 2000
        out = node.build(START + 4 * WEEK)
        assert len(out.new) == 4
        store.close()
