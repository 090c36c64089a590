"""The archives working store (SQLite, ``loglake.archives.store``) under injected disk faults and
power losses (issue 15 §3): many seeds of ``tests/archives/test_store_faults.py``'s run.

Each seed: a workload of the store's writes (``--ops``) with ENOSPC/EIO on write and fsync and
short writes at ``--rate`` (``tests/faults/faultfs.py``) on the simulated disk
(``tests/log/simdisk.py``) that SQLite reaches through ``tests/faults/sqlite_vfs.py``; power
losses after committed operations and in the middle of operations; every failed operation
redone once the fault clears; after every power loss the store is compared with a model of
what committed. A broken invariant prints the seed (``--first S --seeds 1`` replays it) and
exits 1.

    .venv/bin/python benchmarks/sqlite_faults.py                 # 500 seeds
    .venv/bin/python benchmarks/sqlite_faults.py --seeds 50 --rate 0.1
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.archives.test_store_faults import Figures, run_store_faults


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=500, help="seeds to run (default 500)")
    ap.add_argument("--first", type=int, default=1, help="first seed (default 1)")
    ap.add_argument("--ops", type=int, default=50, help="operations per seed (default 50)")
    ap.add_argument("--rate", type=float, default=0.05, help="fault rate per write/fsync call")
    ap.add_argument("--budget", type=float, default=600.0, help="stop after this many seconds")
    args = ap.parse_args()
    seeds = range(args.first, args.first + args.seeds)
    print(
        f"sqlite faults: seeds {seeds.start}..{seeds.stop - 1}, {args.ops} operations each, "
        f"rate {args.rate}",
        flush=True,
    )
    total = Figures()
    root = Path(tempfile.mkdtemp(prefix="loglake-sqlite-faults-"))
    t0 = time.monotonic()
    rc = 0
    try:
        for seed in seeds:
            if time.monotonic() - t0 > args.budget:
                print(f"  budget of {args.budget:.0f} s reached after {total.seeds} seeds")
                break
            fig = Figures()
            try:
                run_store_faults(root / str(seed), seed, ops=args.ops, rate=args.rate, fig=fig)
            except Exception as e:
                print(f"  FAILED: {type(e).__name__}: {e}", flush=True)
                rc = 1
            finally:
                total.add(fig)
                shutil.rmtree(root / str(seed), ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    secs = time.monotonic() - t0
    inj = ", ".join(f"{k} {v}" for k, v in sorted(total.injected.items()))
    errs = ", ".join(f"{k} {v}" for k, v in sorted(total.errors.items()))
    for label, value in (
        ("seeds", f"{total.seeds}"),
        ("faults injected", f"{sum(total.injected.values())} ({inj})"),
        ("errors seen", f"{sum(total.errors.values())} ({errs})"),
        (
            "operations",
            f"{total.ops}: {total.committed} committed, {total.failed} failed and redone once "
            f"the fault cleared; {total.failed_opens} failed opens",
        ),
        (
            "power losses",
            f"{total.power_losses} ({total.cut_ops} during an operation: {total.cut_ops_kept} "
            "kept it whole, the rest left no trace)",
        ),
        ("committed rows checked", f"{total.rows_checked}"),
        ("lost", f"{total.lost}"),
        ("seconds", f"{secs:.1f}"),
    ):
        print(f"  {label:<23}{value}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
