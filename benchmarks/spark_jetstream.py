"""Spark Structured Streaming latency on a JetStream-backed stream vs the embedded log.

Same SparkSession, same run, same query shape: ``readStream.format("loglake")`` with a
``foreachBatch`` sink on the driver and ``processingTime="0 seconds"``; one record pushed every
``--interval`` seconds with its ``timestamp_ns`` set at the push, and the micro-batch that sees
it records ``now - timestamp_ns``. Sources:

1. the embedded log: ``open_log(data_dir)`` in this process, the source reading the data dir;
2. JetStream R3: a 3-node nats-server cluster on loopback (``tests/nats_cluster.py``), pushes
   through ``JetStreamLog`` (replicas=3), the source reading with ``backend=nats://…``.

Target (the cluster issue's benchmark): JetStream p50 ≤ 2× the embedded log's p50. The figure
belongs beside ``benchmarks/node.py``'s; ``latency_figures()`` returns it for that script.

    .venv/bin/python benchmarks/spark_jetstream.py [--pushes 40] [--interval 0.25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.nats_cluster

from loglake.log import Entry, StreamConfig, open_log

STREAM = "bench"


def measure(
    spark, options: dict[str, str], push: Callable[[int], None], pushes: int, interval: float
) -> list[float]:
    """Milliseconds from each push to the micro-batch that saw it."""
    latencies: list[float] = []
    lock = threading.Lock()

    def on_batch(df, _batch_id: int) -> None:
        now = time.time_ns()
        for row in df.select("timestamp_ns").collect():
            with lock:
                latencies.append((now - row[0]) / 1e6)

    with tempfile.TemporaryDirectory(prefix="loglake-bench-cp-") as cp:
        q = (
            spark.readStream.format("loglake")
            .options(stream=STREAM, startingOffsets="latest", **options)
            .load()
            .writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", cp)
            .trigger(processingTime="0 seconds")
            .start()
        )
        try:
            deadline = time.monotonic() + 120
            while q.lastProgress is None and time.monotonic() < deadline:
                time.sleep(0.1)  # the first (empty) batch: Python workers started
            time.sleep(1.0)
            for i in range(pushes):
                push(i)
                time.sleep(interval)
            deadline = time.monotonic() + 30
            while len(latencies) < pushes and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            q.stop()
    return latencies


def latency_figures(
    spark, pushes: int = 40, interval: float = 0.25, jetstream_first: bool = False
) -> dict[str, list[float]]:
    """``{"embedded": [...ms], "jetstream": [...ms]}`` from one session, after a discarded
    warm-up run (without it the first measured paid ~3× for starting the session's Python
    workers, whichever it was); ``jetstream_first`` swaps the order to check what is left."""
    from loglake.streams.jetstream import JetStreamLog
    from tests.nats_cluster import NatsCluster

    out: dict[str, list[float]] = {}

    def embedded() -> None:
        with tempfile.TemporaryDirectory(prefix="loglake-bench-") as d:
            log = open_log(d)
            try:
                log.create_stream(STREAM, StreamConfig(partitions=2))

                def push_local(i: int) -> None:
                    log.append_many(
                        STREAM, [Entry(b"x" * 200, timestamp_ns=time.time_ns())], partition=i % 2
                    )
                    log.flush()

                out["embedded"] = measure(spark, {"data_dir": d}, push_local, pushes, interval)
            finally:
                log.close()

    def jetstream() -> None:
        with NatsCluster(3) as cluster:  # started on entry
            js = JetStreamLog(cluster.url, prefix="bench", replicas=3)
            try:
                js.create_stream(STREAM, StreamConfig(partitions=2))

                def push_js(i: int) -> None:
                    js.append_many(
                        STREAM, [Entry(b"x" * 200, timestamp_ns=time.time_ns())], partition=i % 2
                    )

                opts = {"backend": cluster.url, "natsPrefix": "bench"}
                out["jetstream"] = measure(spark, opts, push_js, pushes, interval)
            finally:
                js.close()

    order = (jetstream, embedded) if jetstream_first else (embedded, jetstream)
    order[0]()  # warm-up, discarded: the session's first queries start its Python workers
    for run in order:
        run()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pushes", type=int, default=40)
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between pushes")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument(
        "--jetstream-first", action="store_true", help="measure JetStream first (order bias check)"
    )
    a = ap.parse_args()
    from loglake.pipeline.session import build_session

    spark = build_session(master=a.spark_master, app_name="loglake-bench-spark-jetstream")
    try:
        figs = latency_figures(spark, a.pushes, a.interval, a.jetstream_first)
    finally:
        spark.stop()
    p50 = {}
    for name, ms in figs.items():
        if not ms:
            print(f"{name:10s} no micro-batch saw a push")
            continue
        ms.sort()
        p50[name] = statistics.median(ms)
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        print(
            f"{name:10s} push → micro-batch p50 {p50[name]:7.1f} ms  p99 {p99:7.1f} ms  n={len(ms)}"
        )
    if len(p50) == 2:
        ratio = p50["jetstream"] / p50["embedded"]
        verdict = "ok" if ratio <= 2 else "over target"
        print(f"jetstream / embedded p50 = {ratio:.2f}× (target ≤ 2×: {verdict})")


if __name__ == "__main__":
    main()
