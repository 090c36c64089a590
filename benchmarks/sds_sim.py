"""SDS at scale: 1,000 simulated participants on a seeded lossy network (loglake.sds.sim).

Runs three scenarios — a healthy network with 5% loss; one with a healing partition, late
joiners and participants going offline; and one without a store node, where only SDS-R repairs
losses — and prints delivery ratio, time to acknowledgement,
time to detect a missing message and time to consistency against the targets (S = the sync
interval), with the seed that replays each run. Bounded: the message count is small (every
broadcast is received by ~1,000 participants) and each scenario stops at its settle horizon.

    .venv/bin/python benchmarks/sds_sim.py [--participants 1000] [--messages 60] [--seed 42]
"""

from __future__ import annotations

import argparse
import sys
import time

from loglake.sds.sim import SimConfig, simulate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--participants", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=60)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--history", type=int, default=200, help="causal history size")
    args = ap.parse_args()
    n = args.participants
    scenarios = {
        "healthy, 5% loss": SimConfig(
            participants=n,
            messages=args.messages,
            seed=args.seed,
            causal_history_size=args.history,
        ),
        "10% loss, partition 20-40 s (30%), 2% late joiners, 2% offline": SimConfig(
            participants=n,
            messages=args.messages,
            seed=args.seed,
            causal_history_size=args.history,
            loss=0.10,
            partition=(20_000, 40_000, 0.3),
            late_joiners=max(1, n // 50),
            offline=max(1, n // 50),
        ),
        "SDS-R only (no store node), 5% loss, T_min 5 s, T_max 20 s": SimConfig(
            participants=n,
            messages=args.messages,
            seed=args.seed,
            causal_history_size=args.history,
            store=False,
            repair_t_min_ms=5_000,
            repair_t_max_ms=20_000,
        ),
    }
    failed = False
    for name, cfg in scenarios.items():
        t, c = time.perf_counter(), time.process_time()
        report = simulate(cfg)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        print(f"== {name}")
        print(report.summary())
        print(f"  run time {wall:.1f} s wall, {cpu:.1f} s CPU")
        failed |= not all(report.targets().values())
    if failed:
        print("some targets were missed (see FAIL lines); the figures above are the result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
