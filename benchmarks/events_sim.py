"""Events (ICRC-72/77) under seeded faults, longer than the test sweep (tests/events/sim.py).

Each seed runs a whole system — orchestrator with journal and ledger, broadcaster, publisher,
two subscribers — on a fake clock over a network that drops calls and replies, duplicates and
delays them, while the orchestrator crashes and restarts from its journal; the checker runs
after every step. Prints one line per seed and the seed of any failure; ``--seed N`` replays
exactly that run. Bounded: ``--seeds`` runs of ``--steps`` steps each.

    .venv/bin/python benchmarks/events_sim.py [--seeds 50] [--steps 1000] [--first 1000]
    .venv/bin/python benchmarks/events_sim.py --seed 8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.events.sim import SimConfig, SimFailure, simulate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, help="replay this one seed")
    ap.add_argument("--seeds", type=int, default=50, help="how many seeds to sweep")
    ap.add_argument("--first", type=int, default=1000, help="the first seed of the sweep")
    ap.add_argument("--steps", type=int, default=1000, help="steps per run")
    ap.add_argument("--crash", type=float, default=0.01, help="orchestrator crashes per step")
    ap.add_argument("--price", type=int, default=0, help="per event: replays are paid")
    args = ap.parse_args()
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    failed: list[int] = []
    t0 = time.perf_counter()
    total = {"steps": 0, "replays": 0, "crashes": 0, "delivered": 0}
    for seed in seeds:
        t = time.perf_counter()
        try:
            r = simulate(SimConfig(seed, steps=args.steps, crash=args.crash, price=args.price))
        except SimFailure as e:
            print(f"seed {seed}: FAIL {e}", flush=True)
            failed.append(seed)
            continue
        for k in total:
            total[k] += getattr(r, k)
        print(
            f"seed {seed}: ok  {r.steps} steps, {r.replays} replays "
            f"({r.completed} completed, {r.canceled} canceled, {r.errored} errored), "
            f"{r.crashes} crashes, faults {r.faults}, {time.perf_counter() - t:.1f} s",
            flush=True,
        )
    dt = time.perf_counter() - t0
    print(
        f"{len(seeds)} seeds, {total['steps']} steps, {total['replays']} replays, "
        f"{total['crashes']} crashes, {total['delivered']} events delivered in {dt:.1f} s "
        f"({total['steps'] / dt:.0f} checked steps/s)"
    )
    if failed:
        print("failing seeds (replay one with --seed N): " + " ".join(map(str, failed)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
