"""Crash benchmark (issue 3 §5): 100 writer lives, each SIGKILLed at a random moment while
appending with ``batch`` durability from 3 threads; after each kill the data dir is reopened
(recovery runs) and every acknowledged record must be present and byte-identical, with no
partial record visible and every lake file matching the log. The suite runs 20 lives
(tests/log/test_crash.py); this runs 100 and prints what it saw.

    .venv/bin/python benchmarks/crash.py [--runs 100] [--seed N] [--threads 3]
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.log.crash_writer import check, run_once


class _Count(logging.Handler):
    """Counts recoveries that cut a torn tail (the structured warning of segment.py)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.torn = 0
        self.bytes = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "torn tail" in record.getMessage():
            self.torn += 1
            self.bytes += getattr(record, "fields", {}).get("bytes_dropped", 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--threads", type=int, default=3)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"seed={seed} runs={args.runs} threads={args.threads}", flush=True)
    rnd = random.Random(seed)
    counter = _Count()
    logging.getLogger("loglake.log").addHandler(counter)
    logging.getLogger("loglake.log").setLevel(logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="loglake-crash-"))
    all_acks = []
    seen: set[str] = set()
    t0 = time.perf_counter()
    try:
        for run in range(args.runs):
            _, acks = run_once(root, run, rnd, args.threads)
            all_acks += acks
            try:
                stored = check(root, all_acks, seen)
            except AssertionError as e:
                print(f"FAILED after run {run} (seed {seed}): {e}")
                return 1
            if (run + 1) % 10 == 0:
                acked = sum(a.n for a in all_acks)
                print(f"  {run + 1:3d} lives: {acked} records acknowledged, {stored} stored, ok")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    acked = sum(a.n for a in all_acks)
    dt = time.perf_counter() - t0
    print(
        f"OK: {args.runs} SIGKILLs, {acked} acknowledged records all present and "
        f"byte-identical, no partial record visible ({dt:.1f} s, seed {seed}); "
        f"recovery cut {counter.torn} torn tails ({counter.bytes} bytes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
