"""Structured Streaming over an R3 JetStream-backed stream while pushes go on and one NATS node
(the stream leader of partition 0) is SIGKILLed: every record once, in order per partition, in
the micro-batches of one query and across its restart from the checkpoint.

Its own 3-node cluster (``tests/nats_cluster.py``), not the session's: a node is killed here.
Bounded: 2 partitions, a few hundred records, one kill, loopback only."""

from __future__ import annotations

import threading
import time

import pytest

from loglake.log import StreamConfig
from loglake.streams.jetstream import ClusterUnavailable, JetStreamLog
from tests.conftest import require_peer
from tests.nats_cluster import NATS_HINT, NatsCluster, have_nats_server
from tests.streams.jetstream_fixtures import new_prefix

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BATCH = 10
STEP = 150
"""Records per partition the pusher may push past the test's last mark before it waits: bounded,
and the query keeps up."""


class Pusher(threading.Thread):
    """Pushes ``BATCH`` records at a time to each partition in turn, each batch with fixed
    message ids and pushed again on ``ClusterUnavailable`` (JetStream stores it once)."""

    def __init__(self, log: JetStreamLog) -> None:
        super().__init__(daemon=True)
        self.log = log
        self.sent = {0: 0, 1: 0}
        self.cap = STEP
        self.stop = threading.Event()
        self.retries = 0
        self.error: BaseException | None = None

    def push(self, p: int) -> None:
        k = self.sent[p]
        datas = [b"p%d-%d" % (p, k + i) for i in range(BATCH)]
        ids = [f"p{p}-{k + i}" for i in range(BATCH)]
        while True:
            try:
                self.log.push_many("ev", p, datas, msg_ids=ids)
                break
            except ClusterUnavailable:
                self.retries += 1
        self.sent[p] += BATCH

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.sent[0] >= self.cap:
                    time.sleep(0.05)
                    continue
                for p in (0, 1):
                    self.push(p)
                time.sleep(0.1)
        except BaseException as e:
            self.error = e


def start_query(spark, cluster: NatsCluster, prefix: str, cp, batches: dict):
    def sink(df, batch_id: int) -> None:
        # keyed by batch id: a batch Spark runs again after a restart replaces itself
        batches[batch_id] = [(r[0], r[1], bytes(r[2])) for r in df.collect()]

    r = spark.readStream.format("loglake").options(
        stream="ev", backend=cluster.url, natsPrefix=prefix, maxRecordsPerTrigger="120"
    )
    return (
        r.load()
        .select("partition", "index", "data")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(cp))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def wait_for(cond, timeout: float, what: str, q=None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if q is not None and q.exception() is not None:
            raise AssertionError(f"the query failed waiting for {what}: {q.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def seen(batches: dict) -> dict[int, int]:
    out = {0: 0, 1: 0}
    for rows in list(batches.values()):
        for p, _i, _d in rows:
            out[p] += 1
    return out


def test_streaming_over_r3_survives_a_killed_leader_and_a_restart(spark, tmp_path) -> None:
    require_peer("nats-server", have_nats_server(), NATS_HINT)
    cluster = NatsCluster(3).start()
    prefix = new_prefix()
    log = JetStreamLog(cluster.url, prefix=prefix, replicas=3)
    pusher = Pusher(log)
    q = None
    try:
        log.create_stream("ev", StreamConfig(partitions=2))
        batches: dict[int, list] = {}
        cp = tmp_path / "cp"
        q = start_query(spark, cluster, prefix, cp, batches)
        wait_for(lambda: q.lastProgress is not None, 120, "the query's first trigger", q)
        pusher.start()
        wait_for(lambda: seen(batches)[0] >= 50, 120, "the first records", q)
        leader = log.call(log.js.stream_info(log.js_name("ev", 0))).cluster.leader
        cluster.kill(cluster.index_of(leader))
        killed_at = dict(pusher.sent)
        pusher.cap = killed_at[0] + STEP
        wait_for(lambda: pusher.sent[0] >= killed_at[0] + 100, 120, "pushes after the kill", q)
        q.stop()  # stop mid-stream; restart from the checkpoint while pushes go on
        q = start_query(spark, cluster, prefix, cp, batches)
        pusher.cap = pusher.sent[0] + STEP
        wait_for(lambda: pusher.sent[0] >= pusher.cap, 120, "pushes after the restart", q)
        pusher.stop.set()
        pusher.join(60)
        assert pusher.error is None, pusher.error
        sent = dict(pusher.sent)
        wait_for(lambda: seen(batches) == sent, 120, f"{sent} records in the sink", q)
        q.stop()
        q = None
    finally:
        pusher.stop.set()
        if q is not None:
            q.stop()
        log.close()
        cluster.close()
    # in order per partition: batch after batch, each index once, with the data pushed for it
    for p in (0, 1):
        got = [(i, d) for b in sorted(batches) for (pp, i, d) in batches[b] if pp == p]
        assert got == [(i, b"p%d-%d" % (p, i)) for i in range(sent[p])]
