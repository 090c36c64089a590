"""Runs a part (``tests/faults/parts.py``) on a simulated disk with injected faults, then a
power loss, then holds it to its invariants (issue 15 §3).

One run: the part performs ``ops`` operations while ``FaultyFs`` fails writes and fsyncs at
``rate``. An operation that raises is what a user sees: it must be a *typed* error — a
``LoglakeError`` that is not damage (``StorageFailed`` …) or an ``OSError`` carrying ENOSPC or
EIO — never another exception, and never a report of corruption. After a failed operation the
part is closed and opened again, as its program would be restarted (an orchestrator role stops
serving after a storage failure; the log itself reopens a failed partition or consumer store
without a restart, which ``test_faults.py::test_the_log_recovers_from_faults_without_a_restart``
holds it to). Then
the fault clears, power is lost (``SimDisk.restart``: only what was fsynced survives), the part
is checked against every acknowledgement, works again for a few operations (full recovery),
and is checked once more.
"""

from __future__ import annotations

import errno
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.faultfs import KINDS, FaultyFs
from tests.faults.parts import PARTS, close_quietly
from tests.log.simdisk import SimDisk

DAMAGE = ("CorruptSegment", "CorruptStore", "JournalError", "CheckpointError", "CorruptArchive")


@dataclass
class Run:
    part: str
    seed: int
    ops: int = 0
    acks: int = 0
    injected: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    """What the caller saw, by type (and errno)."""
    untyped: list[str] = field(default_factory=list)
    checked: int = 0
    leaked_locks: int = 0
    """Times a failed ``open_log`` kept the data dir's LOCK (a defect of
    ``SegmentLog.__init__``'s cleanup, reported in docs/reliability.md): the run then does what
    a restarted process would, and lets the lock go."""


def describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno is not None:
        return f"{type(e).__name__}({errno.errorcode.get(e.errno, e.errno)})"
    return type(e).__name__


def typed(e: BaseException) -> bool:
    from loglake.errors import LoglakeError

    if type(e).__name__ in DAMAGE:
        return False
    if isinstance(e, LoglakeError):
        return True
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EIO)


def release_leaked_locks(root: Path) -> int:
    """Close this process's descriptors of ``LOCK`` files under ``root`` — what the exit of a
    process does — when nothing in it holds the log open any more."""
    import os

    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if where.startswith(str(root) + os.sep) and where.endswith(os.sep + "LOCK"):
            os.close(int(fd))
            n += 1
    return n


def run(
    name: str,
    base: Path,
    seed: int,
    ops: int = 40,
    rate: float = 0.05,
    kinds: tuple[str, ...] = KINDS,
    fsync: bool = True,
    read_rate: float | None = None,
) -> Run:
    """One fault run of part ``name`` under ``base``; ``AssertionError`` if an invariant
    breaks (the message names the part and the seed). ``fsync=False``: fsync does nothing
    (the checks must then find losses: proof that they can fail). ``read_rate``: the chance
    a ``pread`` fails when ``kinds`` has ``READ_EIO`` (None: ``rate``)."""
    rng = random.Random(seed)
    part = PARTS[name]()
    out = Run(name, seed)
    acks: list[str] = []
    with SimDisk(base, fsync=fsync) as disk:
        part.setup(disk.root)
        with FaultyFs(disk, rng, rate, kinds, read_rate=read_rate) as faults:
            opened = False
            life = 0
            for _ in range(ops):
                try:
                    if not opened:
                        life += 1
                        part.open(disk.root, life)
                        opened = True
                    out.ops += 1
                    a = part.step(rng)
                    if a is not None:
                        acks.append(a)
                except Exception as e:  # what a user of the part sees
                    out.errors[describe(e)] += 1
                    if not typed(e):
                        out.untyped.append(f"{describe(e)}: {e}")
                    close_quietly(part)  # also what a failed open had opened
                    opened = False
                    if type(e).__name__ == "LogLocked":
                        out.leaked_locks += release_leaked_locks(disk.root)
            faults.active = False
            if opened:
                close_quietly(part)
            out.injected = faults.injected
        disk.restart(rng)  # power loss once the fault has cleared
        where = f"{name} seed {seed}"
        try:
            part.check(disk.root, acks)
            part.open(disk.root, life + 1)  # full recovery: it works again
            for _ in range(5):
                a = part.step(rng)
                if a is not None:
                    acks.append(a)
            part.close()
            out.checked = part.check(disk.root, acks)
        except AssertionError as e:
            raise AssertionError(f"{where}: {e} (faults {dict(out.injected)})") from e
        finally:
            close_quietly(part)
    out.acks = len(acks)
    assert not out.untyped, f"{where}: untyped errors reached the caller: {out.untyped[:3]}"
    return out
