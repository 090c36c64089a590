"""Lease failover on a real 3-node JetStream cluster (loopback): how long after its holder is
SIGKILLed another contender holds the lease (``loglake.streams.lease``). The bound: the lease
TTL + 2 s (a handover waits on nothing but the TTL). Two contender processes; ``--rounds``
kills (each round's second contender is started fresh); prints each time and the p50/max.

    .venv/bin/python benchmarks/lease.py                  # 5 rounds, ttl 3 s
    .venv/bin/python benchmarks/lease.py --rounds 10 --ttl 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.nats_cluster import NatsCluster
from tests.streams.lease_holder import Holder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ttl", type=int, default=3)
    args = ap.parse_args()
    times: list[float] = []
    with NatsCluster(3) as cluster:
        bucket, name = "bench_leases", "sealer-" + uuid.uuid4().hex[:6]
        holder = Holder(cluster.url, bucket, name, "h0", args.ttl)
        holder.expect("acquired", 30)
        try:
            for i in range(args.rounds):
                other = Holder(cluster.url, bucket, name, f"h{i + 1}", args.ttl)
                time.sleep(args.ttl / 3 * 2)  # the holder renews meanwhile
                killed = time.monotonic()
                holder.proc.kill()
                other.expect("acquired", args.ttl + 10)
                took = time.monotonic() - killed
                times.append(took)
                print(f"round {i + 1}: held by the other {took:.2f}s after SIGKILL")
                holder.close()
                holder = other
        finally:
            holder.close()
    p50, bound = statistics.median(times), args.ttl + 2
    print(f"ttl {args.ttl}s: p50 {p50:.2f}s, max {max(times):.2f}s (bound ttl + 2 = {bound}s)")
    return 0 if max(times) <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
