"""ICRC-77 replay procurement as a Spark job (issue 11 §2; loglake.pipeline.jobs.replay).

Four role cores in one process (``InProcessNetwork``) with a job runner on the session's
``local[2]`` Spark and a low threshold: a replay larger than it is procured by the job (range
pruned by index, skip and filter in executors, notifications encoded there) and delivered by
the Broadcaster from the job's output. The subscriber must receive exactly what the in-process
path delivers (same notifications, in order). Cancel stops the job; an orchestrator restarted
before or after the job finished still delivers every event once.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from loglake.events import (
    C_REPLAY,
    Broadcaster,
    Identity,
    InProcessNetwork,
    Publisher,
    Quotas,
    ReplayRegistration,
    ReplayState,
    StreamsStore,
    Subscriber,
    open_orchestrator,
)
from loglake.events.fastcodec import H_RECEIVED
from loglake.events.messages import Registration
from loglake.events.orchestrator import HEAD_KEY
from loglake.log import MemoryLog, open_log
from loglake.pipeline.jobs.replay import SparkReplayJobs, iter_parts
from loglake.streams import LocalStreams

pytestmark = [pytest.mark.spark, pytest.mark.slow]
NS = "jobs.replay"
N = 400
IDS = {k: Identity.generate() for k in ("orch", "bc", "pub", "sub")}
P = {k: v.principal for k, v in IDS.items()}


def value(i: int) -> dict:
    return {"Map": [("kind", {"Text": "ab"[i % 2]}), ("amount", {"Nat": i})]}


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    """N published events (some with headers), in a segment log small enough to seal part of
    it to the lake: the job reads lake files and the live tail."""
    d = tmp_path_factory.mktemp("pub") / "log"
    log = open_log(d)
    from loglake.log import StreamConfig

    log.create_stream(NS, StreamConfig(segment_bytes=8192))
    net, pub, _ = _roles(LocalStreams(log), None, None, MemoryLog())
    for lo in range(0, N, 50):
        items = [
            (value(i), [("h", {"Nat": i})] if i % 3 == 0 else None) for i in range(lo, lo + 50)
        ]
        pub.publish(NS, items, 1_000 + lo)
        net.run()
    log.close()
    return d


def _roles(pub_streams, jobs, threshold, orch_log, max_body_bytes=None, clock=None):
    ticks = itertools.count(10**18)
    net = InProcessNetwork(clock or (lambda: next(ticks)), jobs=jobs, max_body_bytes=max_body_bytes)
    orch_store = StreamsStore(LocalStreams(orch_log))
    orch = open_orchestrator(
        orch_store,
        P["orch"],
        [P["bc"]],
        Quotas(max_events_per_replay=10**9),
        job_threshold=threshold,
    )
    net.add(orch, orch_store)
    net.add(Broadcaster(P["bc"], P["orch"], relay_batch=50))
    pub = net.add(Publisher(P["pub"], P["orch"], batch_size=64), StreamsStore(pub_streams))
    sub = net.add(Subscriber(P["sub"], P["orch"]))
    pub.register(NS, [(C_REPLAY, {"Bool": True})])
    net._collect(pub)
    net.run()
    net.call(
        P["sub"],
        P["orch"],
        "icrc72_register_subscription",
        [Registration(NS, [("icrc72:subscription:stopped", {"Bool": True})])],
    )
    net.run()
    return net, pub, sub


class World:
    def __init__(self, history: Path, spark, tmp: Path, threshold: int | None) -> None:
        self.log = open_log(history)
        self.orch_log = MemoryLog()
        self.jobs = SparkReplayJobs(spark, tmp / "jobs", data_dir=history) if spark else None
        self.net, self.pub, self.sub = _roles(
            LocalStreams(self.log), self.jobs, threshold, self.orch_log
        )
        self.net.call(
            P["pub"], P["orch"], "icrc72_update_publication", [(NS, HEAD_KEY, {"Nat": N})]
        )
        self.net.run()

    @property
    def orch(self):
        return self.net.roles[P["orch"].bytes]

    def replay(self, start=0, end=None, config=()):
        [r] = self.net.call(
            P["sub"],
            P["orch"],
            "icrc77_register_replay",
            [ReplayRegistration(NS, start, end, list(config))],
        )
        return r.value

    def received(self):
        """The subscriber's notifications, without what only the broadcaster decides."""
        return [
            (
                n.event_id,
                n.prev_event_id,
                n.timestamp,
                n.data,
                [h for h in n.headers if h[0] != H_RECEIVED],
                n.filter,
            )
            for n in self.sub.take()
        ]

    def close(self):
        self.log.close()


CONFIGS = [
    (0, None, []),
    (10, 350, [("filter", {"Text": "amount >= 100"})]),
    (5, None, [("filter", {"Text": 'kind == "a"'}), ("skip", {"Array": [{"Nat": 3}, {"Nat": 1}]})]),
    (0, N, [("filter", {"Text": "amount > 100000"})]),  # selects nothing
]


@pytest.mark.parametrize("start,end,config", CONFIGS)
def test_job_path_delivers_what_the_in_process_path_delivers(
    spark, history, tmp_path, start, end, config
):
    local = World(history, None, tmp_path / "l", None)
    rid = local.replay(start, end, config)
    local.net.run()
    want = local.received()
    assert local.orch.replays[rid].status.tag == "completed"
    assert not local.orch.replays[rid].job
    local.close()

    w = World(history, spark, tmp_path / "j", 50)
    rid = w.replay(start, end, config)
    assert w.orch.replays[rid].job and w.jobs.started == [rid]
    w.net.run()
    got = w.received()
    rep = w.orch.replays[rid]
    assert got == want
    assert rep.status == ReplayState("completed", len(want)), rep.status
    assert w.sub.duplicates == 0
    w.close()


def test_a_job_replay_of_large_events_reaches_the_subscriber_within_the_body_limit(spark, tmp_path):
    """The Broadcaster delivered a job's output in notification calls of ``relay_batch`` rows
    whatever their size: 50 notifications of 200 kB were one 10 MB call, over the subscriber's
    8 MiB body limit (413). The failed call was not resent and the replay ended
    ``completed(60)`` with 10 delivered. It cuts those calls at the Publisher's 1 MB budget."""
    from loglake.events.server import MAX_BODY_BYTES
    from tests.events.world import blob

    n, size = 60, 200_000
    assert 50 * size > MAX_BODY_BYTES  # one relay_batch of these: over the limit
    d = tmp_path / "pub"
    log = open_log(d)
    jobs = SparkReplayJobs(spark, tmp_path / "jobs", data_dir=d)
    net, pub, sub = _roles(LocalStreams(log), jobs, 10, MemoryLog(), MAX_BODY_BYTES)
    for lo in range(0, n, 4):
        items = [({"Blob": blob(i, size)}, None) for i in range(lo, lo + 4)]
        pub.publish(NS, items, 1_000 + lo)
        net._collect(pub)
        net.run()
    [r] = net.call(
        P["sub"], P["orch"], "icrc77_register_replay", [ReplayRegistration(NS, 0, None, [])]
    )
    orch = net.roles[P["orch"].bytes]
    assert orch.replays[r.value].job
    net.run()
    notes = sub.take()
    log.close()
    assert [x.event_id for x in notes] == list(range(n))
    assert all(x.data == {"Blob": blob(x.event_id, size)} for x in notes)
    assert orch.replays[r.value].status == ReplayState("completed", n)


def test_a_job_replays_final_status_that_failed_is_sent_again(spark, history, tmp_path):
    """The Broadcaster reports the end of a job replay it delivered with one
    ``icrc77_replay_status``; one that failed (a timeout, the orchestrator restarting) was not
    sent again, and the replay stayed ``running`` at the orchestrator for good, held against
    the subscriber's concurrent replays. It is sent again with back-off, as the Publisher's
    reports are (``Resender``)."""
    now = [10**18]

    def clock() -> int:
        now[0] += 1
        return now[0]

    log = open_log(history)
    jobs = SparkReplayJobs(spark, tmp_path / "jobs", data_dir=history)
    net, _, sub = _roles(LocalStreams(log), jobs, 50, MemoryLog(), clock=clock)
    net.call(P["pub"], P["orch"], "icrc72_update_publication", [(NS, HEAD_KEY, {"Nat": N})])
    net.run()
    [r] = net.call(
        P["sub"], P["orch"], "icrc77_register_replay", [ReplayRegistration(NS, 0, None, [])]
    )
    bc, orch = net.roles[P["bc"].bytes], net.roles[P["orch"].bytes]

    def final_report() -> int | None:
        for k, (src, c) in enumerate(net.queue):
            if src is bc and c.method == "icrc77_replay_status":
                return k
        return None

    while final_report() is None:
        assert net.step()
    k = final_report()
    _, call = net.queue[k]
    del net.queue[k]  # lost on the way, as InProcessNetwork answers a dropped call
    bc.on_reply(call, ConnectionError("icrc77_replay_status: lost on the way"), clock())
    net._collect(bc)
    net.run()
    assert len(sub.take()) == N
    now[0] += 10**9  # past the first resend's back-off
    net.run()
    log.close()
    assert orch.replays[r.value].status == ReplayState("completed", N)


def test_small_replays_stay_in_process(spark, history, tmp_path):
    w = World(history, spark, tmp_path, 50)
    rid = w.replay(0, 40)
    w.net.run()
    assert not w.orch.replays[rid].job and w.jobs.started == []
    assert len(w.received()) == 40
    w.close()


def test_cancel_stops_the_job(spark, history, tmp_path):
    w = World(history, spark, tmp_path, 50)
    rid = w.replay(0, None)
    assert w.orch.replays[rid].status.tag == "running"
    [c] = w.net.call(P["sub"], P["orch"], "icrc77_cancel_replay", [rid])
    assert c.value == rid
    w.net.run()
    w.jobs.wait(60)
    assert not w.jobs.running()
    rep = w.orch.replays[rid]
    assert rep.status == ReplayState("canceled", 0), rep.status
    assert rep.job_output is None and w.received() == []
    w.close()


def test_cancel_while_delivering_reports_what_was_sent(spark, history, tmp_path):
    w = World(history, spark, tmp_path, 50)
    bc = w.net.roles[P["bc"].bytes]
    rid = w.replay(0, None)
    while w.orch.replays[rid].job_output is None:  # the job ends; nothing delivered yet
        assert w.net.step()
    while bc.replays[rid].delivered < 100:
        assert w.net.step()
    w.net.call(P["sub"], P["orch"], "icrc77_cancel_replay", [rid])
    w.net.run()
    rep = w.orch.replays[rid]
    n = len(w.received())
    assert rep.status == ReplayState("canceled", n) and 100 <= n < N, (rep.status, n)
    w.close()


@pytest.mark.parametrize("when", ["job running", "delivering"])
def test_orchestrator_restart_delivers_every_event_once(spark, history, tmp_path, when):
    w = World(history, spark, tmp_path, 50)
    bc = w.net.roles[P["bc"].bytes]
    rid = w.replay(0, None, [("filter", {"Text": "amount >= 7"})])
    if when == "delivering":
        while bc.replays.get(rid) is None or bc.replays[rid].delivered < 100:
            assert w.net.step()
    # crash: a new orchestrator core from the same journal; the old one's job result is lost
    orch_store = StreamsStore(LocalStreams(w.orch_log))
    orch2 = open_orchestrator(
        orch_store, P["orch"], [P["bc"]], Quotas(max_events_per_replay=10**9), job_threshold=50
    )
    if when == "job running":
        w.jobs.wait(120)
        w.jobs.finished()  # the dead orchestrator's job end: nobody hears it
        w.net._job_owner.clear()
    w.net.add(orch2, orch_store)
    w.net.run()
    rep = orch2.replays[rid]
    got = w.received()
    assert rep.status == ReplayState("completed", N - 7), rep.status
    assert [g[0] for g in got] == list(range(7, N))  # every event once, in order
    if when == "job running":
        assert w.jobs.started == [rid, rid]  # the job ran again
    w.close()


def test_job_output_is_ordered_parts(spark, history, tmp_path):
    w = World(history, spark, tmp_path, 50)
    rid = w.replay(0, None)
    w.net.run()
    out = w.orch.replays[rid].job_output
    ids = [p[0] for p in iter_parts(out)]
    assert ids == list(range(N))
    assert [p[0] for p in iter_parts(out, 123)] == list(range(123, N))
    w.close()


def test_job_over_a_nodes_url_writes_the_parts_the_data_dir_gives(spark, history, tmp_path):
    """Given the Publisher's data dir the job reads where the records lie (plain tasks); given
    a ``loglake serve`` node's url, through the ``loglake`` source over the stream protocol.
    Both write the same notification parts, in order."""
    from loglake.events import ReplayJobSpec

    spec = ReplayJobSpec(7, NS, 5, N - 3, P["pub"].bytes, "amount >= 20", (3, 1), False)
    local, remote = _over_dir_and_url(spark, spec, tmp_path, history)
    want = list(iter_parts(local.output))
    assert [p[0] for p in want] == [i for i in range(20, N - 3) if (i + 1) % 3 == 0]
    assert list(iter_parts(remote.output)) == want and remote.selected == local.selected


def _over_dir_and_url(spark, spec, tmp_path: Path, data_dir: Path):
    """The replay job run on ``data_dir`` itself, then over a node's URL serving it."""
    from loglake.pipeline.jobs.replay import run_replay_job
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    local = run_replay_job(spark, spec, tmp_path / "dir", str(data_dir))
    log = open_log(data_dir)
    try:
        with BackgroundServer(StreamService(log)) as srv:
            url = f"loglake://127.0.0.1:{srv.port}"
            remote = run_replay_job(spark, spec, tmp_path / "url", url=url)
    finally:
        log.close()
    return local, remote


def test_a_malformed_stored_event_fails_the_job_and_leaves_no_output(spark, tmp_path):
    """A stored record that is not an event (its data not ICRC-16 Candid) fails the job with
    the decoder's typed error, as the in-process path raises it — no hang, no partial output
    folder, no staging left beside it."""
    from loglake.events import ReplayJobSpec
    from loglake.events.publisher import STORED_PLAIN, event_of
    from loglake.pipeline.jobs.replay import run_replay_job
    from loglake.wire import icrc16

    good = bytes([STORED_PLAIN]) + (1).to_bytes(8, "big") + icrc16.encode({"Nat": 1})
    bad = bytes([STORED_PLAIN]) + (1).to_bytes(8, "big") + b"\xffnot candid"
    with pytest.raises(Exception) as direct:
        event_of(3, bad, NS, P["pub"])
    log = open_log(tmp_path / "data")
    log.create_stream(NS)
    log.append_payloads(NS, [good] * 3 + [bad] + [good] * 3)
    log.close()
    spec = ReplayJobSpec(9, NS, 0, 7, P["pub"].bytes, None, None, False)
    out = tmp_path / "out"
    with pytest.raises(Exception) as e:
        run_replay_job(spark, spec, out, str(tmp_path / "data"))
    # the task's typed error itself, not Spark's wrapper around its traceback
    assert (type(e.value), str(e.value)) == (type(direct.value), str(direct.value))
    left = [p.name for p in tmp_path.iterdir() if p.name != ".out.lock"]  # the lock's file
    assert not out.exists() and left == ["data"]


def test_a_replay_from_below_the_first_kept_event_starts_there_over_url_too(
    spark, history, tmp_path
):
    """A replay whose start is below the first event the Publisher still keeps (retention
    removed the head; ICRC-77 is silent) is procured from the first kept event on both paths.
    The url path goes through ``read()``, whose ``startIndex`` below the first kept index is
    data loss (``failOnDataLoss``): the job starts it at the first kept index itself."""
    import shutil

    from loglake.events import ReplayJobSpec
    from loglake.pipeline.lake import visible_lake_files

    d = tmp_path / "pub"
    shutil.copytree(history, d)
    with open_log(d) as log:  # the sealed segments below 100 leave the live log...
        log.truncate_before(NS, 100)
    for f in visible_lake_files(str(d), NS, 0):  # ...and the lake's copies below it go too
        if f.last < 100:
            Path(f.path).unlink()
    with open_log(d) as log:
        first = log.stream_info(NS).partitions[0].first_index
    assert first == 100
    spec = ReplayJobSpec(8, NS, 0, N, P["pub"].bytes, None, None, False)
    local, remote = _over_dir_and_url(spark, spec, tmp_path, d)
    want = list(iter_parts(local.output))
    assert [p[0] for p in want] == list(range(first, N))
    assert list(iter_parts(remote.output)) == want
