"""The archives working store (``loglake.archives.store``) on a failing, power-losing disk
(issue 15 §3): SQLite's file I/O goes through ``loglake.log.fs`` (``tests/faults/sqlite_vfs.py``),
under the seeded ``FaultyFs`` (ENOSPC and EIO on write and fsync, short writes) and ``SimDisk``
(only what was fsynced survives a power loss; a failed fsync drops its pages).

A run is one seed: a workload of the store's writes (``add`` with the stream position,
``record_archives`` flagging the exported rows, ``flag_archived``, ``hydrate``/``hydrate_many``,
``prune``, ``set_meta``) with faults injected, power losses after committed operations, and
now and then a power loss *during* an operation (``SimDisk.crash_after``). The model is what
committed: an in-memory store (no disk, no faults) that receives exactly the operations the
faulty store acknowledged. Invariants, checked after every operation and every power loss:

- an operation either returns (committed: its result equals the model's) or raises
  ``OSError`` ENOSPC/EIO naming the store's file, and then changed nothing;
- once the fault clears, the same operation completes, once;
- after a power loss, the store holds exactly what the model holds: every committed row (with
  its rowid, stream index and archived flag), archive and meta value, and nothing uncommitted;
  an operation the power cut in the middle is there wholly or not at all.

SQLite's automatic checkpoint runs every ``CHECKPOINT_PAGES`` pages here instead of 1,000, so
the database file (not only the WAL) is written and fsynced under faults.
"""

from __future__ import annotations

import errno
import random
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loglake.archives import store as store_module
from loglake.archives.messages import ArchiveMetadata, DecodedMessage, IndexEntry
from loglake.archives.store import MessageStore
from tests.archives.helpers import DAY, START, WEEK
from tests.faults.faultfs import KINDS, FaultyFs
from tests.faults.sqlite_vfs import FsVfs, close_dead, fs_vfs
from tests.log.simdisk import SimDisk

CHECKPOINT_PAGES = 8
TOPICS = ("/a", "/b")
WEEKS = 6
SEEDS = range(1, 41)

Op = Callable[[MessageStore], Any]


@dataclass
class Figures:
    seeds: int = 0
    ops: int = 0
    committed: int = 0
    failed: int = 0
    """Operations that raised, then completed once the fault cleared."""
    injected: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    power_losses: int = 0
    cut_ops: int = 0
    """Power losses in the middle of an operation."""
    cut_ops_kept: int = 0
    """... of which the operation survived whole (the rest left no trace)."""
    failed_opens: int = 0
    rows_checked: int = 0
    """Committed message rows compared with the model after power losses."""
    lost: int = 0

    def add(self, other: Figures) -> None:
        for name in ("seeds", "ops", "committed", "failed", "power_losses", "cut_ops"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cut_ops_kept += other.cut_ops_kept
        self.failed_opens += other.failed_opens
        self.rows_checked += other.rows_checked
        self.lost += other.lost
        self.injected += other.injected
        self.errors += other.errors


def state(s: MessageStore) -> tuple:
    """Everything the store holds, rowids included."""
    q = s.db.execute
    return (
        tuple(q("SELECT rowid, ts_ns, topic, raw, cap, idx FROM messages ORDER BY rowid")),
        tuple(r[0] for r in q("SELECT rowid FROM archived ORDER BY rowid")),
        tuple(q("SELECT * FROM archives ORDER BY archive_id")),
        tuple(q("SELECT * FROM meta ORDER BY key")),
    )


def _entry(week: int, tag: int) -> IndexEntry:
    lo = START + week * WEEK
    md = ArchiveMetadata(lo, lo + WEEK, TOPICS)
    return IndexEntry(f"0x{week:02x}{tag:062x}", md, week * 4096, 4096, 0, b"")


class Workload:
    """Seeded operations on the store; each is drawn from the current model state."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.serial = 0

    def _messages(self, n: int, week: int | None = None) -> list[DecodedMessage]:
        out = []
        for _ in range(n):
            self.serial += 1
            w = self.rng.randrange(WEEKS) if week is None else week
            ts = START + w * WEEK + self.rng.randrange(WEEK)
            body = self.rng.randbytes(self.rng.choice((40, 600, 5000)))  # 5000: overflow pages
            raw = self.serial.to_bytes(4, "big") + body
            out.append(DecodedMessage(ts, self.rng.choice(TOPICS), raw, len(raw)))
        return out

    def next(self, model: MessageStore) -> tuple[str, Op]:
        rng = self.rng
        kind = rng.choices(
            ("add", "record", "flag", "hydrate", "hydrate_many", "prune", "meta"),
            (40, 12, 8, 8, 4, 8, 4),
        )[0]
        if kind == "add":
            at = int(model.get_meta("ingest_next_index") or 0)
            msgs = self._messages(rng.randint(1, 12))
            idxs = list(range(at, at + len(msgs)))
            return kind, lambda s: s.add(msgs, next_index=at + len(msgs), indexes=idxs)
        if kind == "record":
            week = rng.randrange(WEEKS)
            e = _entry(week, rng.randrange(3))
            md = e.metadata
            topics = None if rng.random() < 0.5 else [rng.choice(TOPICS)]
            cap = None if rng.random() < 0.5 else 1000
            return kind, lambda s: s.record_archives(
                [e], md.to_ns, exported=(md.from_ns, md.to_ns), topics=topics, max_cap=cap
            )
        if kind == "flag":
            rows = model.rows_before(START + rng.randrange(WEEKS + 1) * WEEK)
            ids = [r for r, _ in rows if rng.random() < 0.5]
            return kind, lambda s: s.flag_archived(ids)
        if kind == "hydrate":
            week = rng.randrange(WEEKS)
            e, msgs = _entry(week, 9), self._messages(rng.randint(0, 8), week)
            return kind, lambda s: s.hydrate(e, msgs)
        if kind == "hydrate_many":
            weeks = rng.sample(range(WEEKS), 2)
            items = [(_entry(w, 8), self._messages(rng.randint(0, 5), w)) for w in weeks]
            return kind, lambda s: s.hydrate_many(items)
        if kind == "prune":
            before = START + rng.randrange(WEEKS * 7) * DAY
            only = rng.random() < 0.5
            return kind, lambda s: s.prune(before, archived_only=only)
        key, value = rng.choice(("a", "b")), rng.randrange(10**6)
        return kind, lambda s: s.set_meta(key, value)


def _typed(e: BaseException, path: str) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EIO) and path in str(e)


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno is not None:
        return f"OSError({errno.errorcode.get(e.errno, e.errno)})"
    return type(e).__name__


class _Run:
    def __init__(self, disk: SimDisk, faults: FaultyFs, vfs: FsVfs, fig: Figures) -> None:
        self.disk, self.faults, self.vfs, self.fig = disk, faults, vfs, fig
        self.model = MessageStore()
        self.store = self.open()

    @property
    def path(self) -> str:
        return str(self.disk.root / "store.sqlite")

    def open(self) -> MessageStore:
        """Open under the faults; a failed open is a typed error, and works once they clear."""
        try:
            return MessageStore(self.path, vfs=self.vfs.name)
        except Exception as e:
            assert _typed(e, self.path), f"opening: {_describe(e)}: {e}"
            self.fig.failed_opens += 1
            self.fig.errors[_describe(e)] += 1
        self.faults.active = False
        try:
            return MessageStore(self.path, vfs=self.vfs.name)
        finally:
            self.faults.active = True

    def step(self, kind: str, op: Op) -> None:
        self.fig.ops += 1
        try:
            got = op(self.store)
        except Exception as e:
            assert _typed(e, self.path), f"{kind}: untyped {_describe(e)}: {e}"
            self.fig.errors[_describe(e)] += 1
            self.fig.failed += 1
            self.faults.active = False
            assert state(self.store) == state(self.model), f"{kind} failed ({e}) but changed data"
            got = op(self.store)  # the fault cleared: the same operation, once
            self.faults.active = True
        self.fig.committed += 1
        want = op(self.model)
        assert got == want, f"{kind} returned {got}, the model {want}"

    def power_loss(self, rng: random.Random) -> None:
        self.faults.active = False
        self.disk.power_off()
        close_dead(self.store.db)
        self.disk.restart(rng)
        self.fig.power_losses += 1
        self.faults.active = True
        self.store = self.open()
        self.compare()

    def compare(self) -> None:
        got, want = state(self.store), state(self.model)
        self.fig.rows_checked += len(want[0])
        if got != want:
            self.fig.lost += len(set(want[0]) - set(got[0]))
            raise AssertionError(
                f"after a power loss: {len(got[0])} rows, the model {len(want[0])} "
                f"({len(set(want[0]) - set(got[0]))} committed rows missing, "
                f"{len(set(got[0]) - set(want[0]))} never committed); "
                f"flags equal {got[1] == want[1]}, archives equal {got[2] == want[2]}, "
                f"meta {got[3]} vs {want[3]}"
            )

    def cut(self, rng: random.Random, kind: str, op: Op) -> None:
        """A power loss at a random moment of ``op``: it is then there wholly or not at all."""
        self.fig.ops += 1
        self.fig.cut_ops += 1
        self.faults.active = False
        self.disk.crash_after(rng.randint(1, 60))
        try:
            got: Any = op(self.store)
            ok = True
        except Exception as e:
            assert _typed(e, self.path), f"{kind} cut: untyped {_describe(e)}: {e}"
            ok = False
        if not self.disk.dead:  # the operation ended before the crash point
            self.disk.crash_after(None)
            self.faults.active = True
            if not ok:
                raise AssertionError(f"{kind} failed without a fault")
            self.fig.committed += 1
            assert got == op(self.model)
            return
        close_dead(self.store.db)
        self.disk.restart(rng)
        self.fig.power_losses += 1
        self.faults.active = True
        self.store = self.open()
        if ok or state(self.store) != state(self.model):
            # returned: committed, so it must have survived; else it survived whole or not at all
            op(self.model)
            self.fig.committed += 1
            self.fig.cut_ops_kept += 1
        self.compare()


def run_store_faults(
    base: Path,
    seed: int,
    ops: int = 50,
    rate: float = 0.05,
    kinds: tuple[str, ...] = KINDS,
    fsync: bool = True,
    p_loss: float = 0.08,
    p_cut: float = 0.05,
    fig: Figures | None = None,
) -> Figures:
    """One seeded run (see the module docstring); ``AssertionError`` naming the seed if an
    invariant breaks. ``fsync=False``: fsync does nothing (the checks must then see losses).
    ``fig``: where to count (filled in even when the run fails)."""
    rng = random.Random(seed)
    fig = Figures() if fig is None else fig
    fig.seeds += 1
    work = Workload(rng)
    saved = store_module._AUTOCHECKPOINT_PAGES
    store_module._AUTOCHECKPOINT_PAGES = CHECKPOINT_PAGES
    run = None
    try:
        with (
            SimDisk(base, fsync=fsync) as disk,
            fs_vfs() as vfs,
            FaultyFs(disk, rng, rate, kinds) as faults,
        ):
            try:
                run = _Run(disk, faults, vfs, fig)
                for _ in range(ops):
                    kind, op = work.next(run.model)
                    r = rng.random()
                    if r < p_cut:
                        run.cut(rng, kind, op)
                        continue
                    run.step(kind, op)
                    if r < p_cut + p_loss:
                        run.power_loss(rng)
                run.power_loss(rng)  # and always at the end
            except AssertionError as e:
                raise AssertionError(f"seed {seed}: {e} (faults {dict(faults.injected)})") from e
            finally:
                fig.injected += faults.injected
                if run is not None:
                    close_dead(run.store.db)
                    run.model.close()
    finally:
        store_module._AUTOCHECKPOINT_PAGES = saved
    return fig


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_store_under_faults_and_power_losses_loses_nothing_committed(tmp_path):
    total = Figures()
    for seed in SEEDS:
        total.add(run_store_faults(tmp_path / f"s{seed}", seed))
        shutil.rmtree(tmp_path / f"s{seed}", ignore_errors=True)
    assert set(total.injected) == set(KINDS), f"not every kind was injected: {total.injected}"
    assert total.errors["OSError(ENOSPC)"] and total.errors["OSError(EIO)"], total.errors
    assert total.power_losses > len(SEEDS) and total.cut_ops and total.rows_checked
    assert total.lost == 0


def _store(disk: SimDisk, vfs: FsVfs) -> MessageStore:
    return MessageStore(disk.root / "store.sqlite", vfs=vfs.name)


def _msgs(first: int, n: int, size: int = 3000) -> list[DecodedMessage]:
    return [
        DecodedMessage(START + i, "/a", i.to_bytes(4, "big") + bytes(size), size + 4)
        for i in range(first, first + n)
    ]


def _power_loss(disk: SimDisk, s: MessageStore, vfs: FsVfs, mode: str) -> MessageStore:
    disk.power_off()
    close_dead(s.db)
    disk.restart(random.Random(0), file_mode=mode)
    return _store(disk, vfs)


@pytest.mark.parametrize("mode", ["none", "all", "prefix", "reorder"])
def test_a_failed_wal_fsync_fails_the_commit_and_a_later_commit_does_not_lean_on_it(tmp_path, mode):
    """SQLite after a failed xSync of the WAL at COMMIT: the commit fails (``OSError(EIO)``
    naming the file), the transaction is rolled back, and the next transaction writes its
    frames over the failed ones (the WAL index never counted them). The disk dropped the failed
    fsync's pages (fsyncgate); a power loss right after the next commit keeps exactly the
    committed batches, whichever of the unsynced writes the power loss keeps."""
    with SimDisk(tmp_path) as disk, fs_vfs() as vfs:
        s = _store(disk, vfs)
        s.add(_msgs(0, 5), next_index=5)
        with FaultyFs(disk, random.Random(1), rate=1.0, kinds=("fsync-eio",)) as faults:
            with pytest.raises(OSError) as e:
                s.add(_msgs(5, 8), next_index=13)  # larger than the next: a tail is left
            assert e.value.errno == errno.EIO and str(disk.root / "store.sqlite") in str(e.value)
            assert faults.injected["fsync-eio"] == 1 and vfs.failed_syncs == 1
        assert s.count() == 5 and s.get_meta("ingest_next_index") == "5"
        s.add(_msgs(100, 2), next_index=7)
        s = _power_loss(disk, s, vfs, mode)
        ids = [int.from_bytes(r[2][:4], "big") for r in s.messages()]
        assert ids == [0, 1, 2, 3, 4, 100, 101] and s.get_meta("ingest_next_index") == "7"
        s.close()


@pytest.mark.parametrize("mode", ["none", "reorder"])
def test_a_failed_checkpoint_fsync_is_redone_not_trusted(tmp_path, monkeypatch, mode):
    """A checkpoint copies WAL pages into the database file and fsyncs it; when that fsync
    fails, the disk dropped the copied pages. SQLite does not advance the checkpoint (the
    committed transaction stands: the WAL still has it) and the next checkpoint copies them
    again; the WAL is not reused until one succeeded. A power loss after a later commit keeps
    everything."""

    class DbFileOnly(FaultyFs):
        def _target(self, fd: int) -> str | None:
            p = super()._target(fd)
            return p if p is not None and p.endswith(".sqlite") else None

    monkeypatch.setattr(store_module, "_AUTOCHECKPOINT_PAGES", 1)
    with SimDisk(tmp_path) as disk, fs_vfs() as vfs:
        s = _store(disk, vfs)
        s.add(_msgs(0, 5), next_index=5)
        with DbFileOnly(disk, random.Random(1), rate=1.0, kinds=("fsync-eio",)) as faults:
            s.add(_msgs(5, 5), next_index=10)  # committed; its checkpoint's fsync failed
            assert faults.injected["fsync-eio"] >= 1
        s.add(_msgs(10, 1), next_index=11)
        s.add(_msgs(11, 1), next_index=12)
        s = _power_loss(disk, s, vfs, mode)
        assert [int.from_bytes(r[2][:4], "big") for r in s.messages()] == list(range(12))
        s.close()


def test_a_commit_whose_checkpoint_fails_is_reported_committed(tmp_path, monkeypatch):
    """The automatic checkpoint runs after the commit; SQLite ignores its failure. Through a
    Python VFS apsw would raise it from the COMMIT that succeeded (the caller would then redo
    the transaction): the store's WAL hook ignores it, as SQLite does."""

    class DbFileOnly(FaultyFs):
        def _target(self, fd: int) -> str | None:
            p = super()._target(fd)
            return p if p is not None and p.endswith(".sqlite") else None

    monkeypatch.setattr(store_module, "_AUTOCHECKPOINT_PAGES", 1)
    with SimDisk(tmp_path) as disk, fs_vfs() as vfs:
        s = _store(disk, vfs)
        with DbFileOnly(disk, random.Random(1), rate=1.0, kinds=("write-eio",)) as faults:
            assert s.add(_msgs(0, 3), next_index=3) == 3
            assert faults.injected["write-eio"] >= 1
        assert s.count() == 3
        s.close()  # its checkpoint succeeds now
        s = _store(disk, vfs)
        assert s.count() == 3
        s.close()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_checks_see_a_loss_when_fsync_does_nothing(tmp_path, seed):
    """The same runs without faults on a disk whose fsync does nothing: the first power loss
    takes committed rows, and the comparison with the model says so."""
    with pytest.raises(AssertionError, match="committed rows missing"):
        run_store_faults(tmp_path, seed, ops=15, rate=0.0, fsync=False, p_cut=0.0)
