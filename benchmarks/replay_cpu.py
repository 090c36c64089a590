"""Process CPU time of the in-process replay, end to end (``benchmarks/replay.py``'s row 4),
for comparing two source trees on a busy machine.

Why: a single 2-s wall-clock run swings ±25% when other processes share the cores; CPU seconds
of this process (``time.process_time``) around the same end-to-end replay swing far less. Run it
alternately with one tree and another on ``PYTHONPATH`` and compare the pairs.

    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/replay_cpu.py [--count 200000] [--runs 1]

Prints one line per run: events, process CPU seconds, wall seconds, events per CPU second, and
which ``loglake`` it imported. Bounded: one history of ``--count`` events in a temporary folder,
removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay import build, end_to_end

import loglake
from loglake.log import open_log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="replay-cpu-"))
    try:
        log = open_log(tmp / "log")
        build(log, a.count)
        for _ in range(a.runs):
            c0, t0 = time.process_time(), time.perf_counter()
            _, got = end_to_end(log, a.count)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            assert got == a.count, got
            print(
                f"e2e {a.count} events  cpu {cpu:.3f} s  wall {wall:.3f} s  "
                f"{a.count / cpu:,.0f} ev/cpu-s  {Path(loglake.__file__).parents[1]}",
                flush=True,
            )
        log.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
