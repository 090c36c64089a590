"""Crash and fault runs for every durable part besides the log (issue 15 §3).

SIGKILL (default): ``--kills`` lives per part (100), each a forked writer killed at a seeded
random moment (one in four while it opens); after each kill the part is reopened and held to
every acknowledgement so far (``tests/faults/parts.py`` states the invariants). The suite runs
10 per part (``tests/faults/test_crash_parts.py``). The log's own crash runs are
``benchmarks/crash.py``.

Faults (``--faults N``): N seeds per part of ``tests/faults/inject.py``: ENOSPC/EIO on write and
fsync and short writes at ``--rate``, then a power loss on the simulated disk, then the checks
and a fault-free recovery. A failure prints the part and seed; ``--seed S --faults 1`` replays.
``--read-faults`` adds EIO on ``pread`` at ``--read-rate`` (reads happen mostly while a part
opens, and a part reopens after each failed operation: so read faults hit recovery too).

    .venv/bin/python benchmarks/crash_parts.py                       # 100 kills of each part
    .venv/bin/python benchmarks/crash_parts.py --part icrc-ledger --kills 20 --seed 5
    .venv/bin/python benchmarks/crash_parts.py --faults 200          # fault seeds per part
    .venv/bin/python benchmarks/crash_parts.py --faults 50 --read-faults
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.crash import run_part
from tests.faults.faultfs import KINDS, READ_EIO
from tests.faults.inject import run as run_faults
from tests.faults.parts import PARTS


def sigkill(names: list[str], kills: int, seed: int) -> int:
    print(f"SIGKILL: seed={seed} kills per part={kills}", flush=True)
    rc = 0
    for name in names:
        root = Path(tempfile.mkdtemp(prefix=f"loglake-crash-{name}-"))
        try:
            fig = run_part(name, root / "root", kills, seed)
        except AssertionError as e:
            print(f"  {name:20s} FAILED: {e}", flush=True)
            rc = 1
            continue
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(
            f"  {name:20s} {fig.lives} kills survived ({fig.killed_opening} while opening), "
            f"{fig.acks} acknowledged operations, 0 lost, {fig.seconds:.1f} s",
            flush=True,
        )
    return rc


def faults(
    names: list[str], seeds: int, first: int, rate: float, read_rate: float | None = None
) -> int:
    """``read_rate`` not None: EIO on ``pread`` too, at that rate."""
    kinds = KINDS if read_rate is None else (*KINDS, READ_EIO)
    reads = "" if read_rate is None else f", read faults at {read_rate}"
    print(f"faults: seeds {first}..{first + seeds - 1} per part, rate {rate}{reads}", flush=True)
    rc = 0
    for name in names:
        t0 = time.perf_counter()
        injected: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        acks = ops = locks = checked = 0
        failed = []
        root = Path(tempfile.mkdtemp(prefix=f"loglake-faults-{name}-"))
        try:
            for seed in range(first, first + seeds):
                try:
                    r = run_faults(
                        name, root / str(seed), seed, rate=rate, kinds=kinds, read_rate=read_rate
                    )
                except AssertionError as e:
                    failed.append(str(e))
                    continue
                finally:
                    shutil.rmtree(root / str(seed), ignore_errors=True)
                injected += r.injected
                errors += r.errors
                acks += r.acks
                ops += r.ops
                locks += r.leaked_locks
                checked += r.checked
        finally:
            shutil.rmtree(root, ignore_errors=True)
        dt = time.perf_counter() - t0
        status = f"{len(failed)} FAILED" if failed else "ok"
        print(
            f"  {name:20s} {status}: {seeds} seeds, {ops} operations, {acks} acknowledged, "
            f"{checked} checked, 0 lost; faults injected {sum(injected.values())} "
            f"{dict(sorted(injected.items()))}; "
            f"errors seen {dict(sorted(errors.items()))}; leaked LOCKs {locks}; {dt:.1f} s",
            flush=True,
        )
        for f in failed[:5]:
            print(f"    {f}", flush=True)
        rc |= bool(failed)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--part", choices=sorted(PARTS), action="append", help="repeatable; default all"
    )
    ap.add_argument("--kills", type=int, default=100, help="SIGKILL lives per part")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument(
        "--faults", type=int, default=0, metavar="N", help="run N fault seeds per part instead"
    )
    ap.add_argument("--rate", type=float, default=0.05, help="faults: chance a write/fsync fails")
    ap.add_argument("--read-faults", action="store_true", help="faults: EIO on pread too")
    ap.add_argument(
        "--read-rate",
        type=float,
        default=0.005,
        help="faults: chance a pread fails (opening a part reads hundreds of times)",
    )
    args = ap.parse_args()
    names = args.part or sorted(PARTS)
    logging.getLogger("loglake").setLevel(logging.CRITICAL)  # recovery warnings are expected
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    if args.faults:
        read_rate = args.read_rate if args.read_faults else None
        return faults(names, args.faults, seed, args.rate, read_rate)
    return sigkill(names, args.kills, seed)


if __name__ == "__main__":
    sys.exit(main())
