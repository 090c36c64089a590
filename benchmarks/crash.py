"""Crash benchmark, two modes.

SIGKILL (issue 3 §5): 100 writer lives, each SIGKILLed at a random moment while appending with
``batch`` durability from 3 threads; after each kill the data dir is reopened (recovery runs) and
every acknowledged record must be present and byte-identical, with no partial record visible and
every lake file matching the log. The suite runs 20 lives (tests/log/test_crash.py). A SIGKILL
leaves the page cache intact, so this mode cannot see a missing fsync.

Simulated disk (issue 17): thousands of seeds of ``tests/log/test_power_loss.py``'s workload on
``tests/log/simdisk.py``: power loss at a random ``fs`` call, unsynced writes lost, torn at
sector boundaries or reordered, folder entries not fsynced forgotten; after each recovery the
checker holds the log to every acknowledgement. Bounded by ``--time-limit``. ``--no-fsync``
shows the checker catching a log whose fsyncs do nothing; ``--bitrot GLOB`` flips a byte of a
file after each clean shutdown; ``--eio`` makes an fsync fail now and then (and drop what it should
have written, as Linux does); the workload then mostly goes on and the log reopens the failed
partition by itself (sometimes while the fault persists). A failure prints the seed and the line
that replays it.

    .venv/bin/python benchmarks/crash.py                     # both modes
    .venv/bin/python benchmarks/crash.py --mode sigkill [--runs 100] [--seed N] [--threads 3]
    .venv/bin/python benchmarks/crash.py --sim [--seeds 5000] [--seed N] [--time-limit 120]
    .venv/bin/python benchmarks/crash.py --sim --seed 1234 --seeds 1        # replay one seed
    .venv/bin/python benchmarks/crash.py --mode parts [--runs 100]  # SIGKILL every other durable
        # part (consumer indexes, ICRC journal and ledger, Cardinal checkpoints, SDS channels,
        # archive build and prune): benchmarks/crash_parts.py, which also injects faults
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


def sigkill_mode(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"SIGKILL: seed={seed} runs={args.runs} threads={args.threads}", flush=True)
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
        logging.getLogger("loglake.log").removeHandler(counter)
    acked = sum(a.n for a in all_acks)
    dt = time.perf_counter() - t0
    print(
        f"OK: {args.runs} SIGKILLs, {acked} acknowledged records all present and "
        f"byte-identical, no partial record visible ({dt:.1f} s, seed {seed}); "
        f"recovery cut {counter.torn} torn tails ({counter.bytes} bytes)"
    )
    return 0


def sim_mode(args: argparse.Namespace) -> int:
    from tests.log.test_power_loss import Figures, run_seeds

    first = args.seed if args.seed is not None else random.randrange(1 << 31)
    count = args.seeds
    fsync = not args.no_fsync
    what = "simulated disk" + ("" if fsync else ", fsync disabled")
    what += f", bit-rot in {args.bitrot}" if args.bitrot else ""
    what += ", fsync failures (EIO)" if args.eio else ""
    what += ", read-only readers" if args.readers else ""
    what += f", {args.sim_threads} appending threads" if args.sim_threads else ""
    print(
        f"{what}: seeds {first}..{first + count - 1} (time limit {args.time_limit:.0f} s)",
        flush=True,
    )
    logging.getLogger("loglake").setLevel(logging.CRITICAL)  # recovery warnings are expected
    total = Figures()
    t0 = time.perf_counter()
    done = 0
    root = Path(tempfile.mkdtemp(prefix="loglake-simdisk-"))
    try:
        chunk = 50
        while done < count and time.perf_counter() - t0 < args.time_limit:
            seeds = range(first + done, first + min(count, done + chunk))
            fig = run_seeds(
                seeds,
                root,
                fsync=fsync,
                bitrot=args.bitrot,
                eio=args.eio,
                readers=args.readers,
                threads=args.sim_threads,
            )
            shutil.rmtree(root, ignore_errors=True)
            total.add(fig)
            done += len(seeds)
            for f in fig.failures:
                print(f"FAILED {f}", flush=True)
            print(
                f"  {done:5d} seeds: {total.crash_points} crash points, {total.recoveries} "
                f"recoveries, {total.records_checked} records checked, {total.losses} losses, "
                f"{len(total.failures)} failing seeds",
                flush=True,
            )
            if total.failures and args.stop_on_failure:
                break
    finally:
        shutil.rmtree(root, ignore_errors=True)
    dt = time.perf_counter() - t0
    line = (
        f"seeds {done} ({first}..{first + done - 1}), crash points {total.crash_points}, "
        f"recoveries {total.recoveries}, records checked {total.records_checked} "
        f"({total.acked} acknowledged), consumer index checks {total.consumer_checks}, "
        f"losses {total.losses}"
    )
    if args.bitrot:
        line += f", bytes flipped {total.flips} (reported {total.detected})"
    if args.eio:
        line += (
            f", fsync failures surfaced as a raw OSError {total.raw_eio}, operations refused "
            f"with StorageFailed {total.storage_failed}, partitions reopened automatically "
            f"{total.reopens}"
        )
    print(f"{'FAILED' if total.failures else 'OK'}: {line} ({dt:.1f} s)")
    return 1 if total.failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("both", "sigkill", "sim", "parts"), default="both")
    ap.add_argument("--sim", action="store_true", help="same as --mode sim")
    ap.add_argument("--seed", type=int, default=None, help="SIGKILL seed / first sim seed")
    ap.add_argument("--runs", type=int, default=100, help="SIGKILL: writer lives")
    ap.add_argument("--threads", type=int, default=3, help="SIGKILL: writer threads")
    ap.add_argument("--seeds", type=int, default=5000, help="sim: how many seeds")
    ap.add_argument("--time-limit", type=float, default=300.0, help="sim: stop after (s)")
    ap.add_argument("--no-fsync", action="store_true", help="sim: fsync does nothing")
    ap.add_argument("--bitrot", default=None, metavar="GLOB", help="sim: flip bytes there")
    ap.add_argument("--eio", action="store_true", help="sim: some fsyncs fail with EIO")
    ap.add_argument("--readers", action="store_true", help="sim: 3 threads, one a read-only reader")
    ap.add_argument(
        "--sim-threads",
        type=int,
        default=None,
        help="sim: force the appending threads per seed (default: 3 in one seed of five, else 1)",
    )
    ap.add_argument(
        "--stop-on-failure", action="store_true", help="sim: stop at the first failing chunk"
    )
    args = ap.parse_args()
    mode = "sim" if args.sim else args.mode
    if mode == "parts":  # every other durable part: benchmarks/crash_parts.py (issue 15 §3)
        import crash_parts

        logging.getLogger("loglake").setLevel(logging.CRITICAL)  # recoveries warn, as expected
        seed = args.seed if args.seed is not None else random.randrange(1 << 31)
        return crash_parts.sigkill(sorted(crash_parts.PARTS), args.runs, seed)
    rc = 0
    if mode in ("both", "sigkill"):
        rc |= sigkill_mode(args)
    if mode in ("both", "sim"):
        rc |= sim_mode(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
