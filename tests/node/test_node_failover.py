"""Several nodes, one history: two ``loglake node --backend … --replicas 3`` processes on a real
3-node JetStream cluster (loopback). Node A holds the once-only work (leases); B serves the same
streams and refuses the work A holds. A is SIGKILLed mid-replay: B takes the leases within the
lease TTL (+ 2 s), finishes the ICRC replay from the journal A wrote, serves every acknowledged
record and consumer index, and a Cardinal consumer resumes on B from its checkpoint with each
block once. A SIGSTOPped holder, resumed after B took over, writes nothing to the journal.

The two nodes are the same ICRC principals and the same archives community without copying
anything: the keys are in the cluster's key bucket (``node.keys``), and a replay's principals
are in the journal, so the node taking it over must be those principals to finish it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from loglake.cardinal.blocks import ChainUpdate
from loglake.cardinal.cli import consume_topic, produce_chain
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint
from loglake.cardinal.synthetic import topics_for
from loglake.cardinal.transport import StreamConsumer, StreamTransport
from loglake.events.journal import stream_name as journal_stream
from loglake.streams import StreamClient
from loglake.streams.fence import is_claim
from loglake.streams.jetstream import JetStreamLog
from tests.nats_cluster import NatsCluster
from tests.node.conftest import EVENTS_NS as NS
from tests.node.conftest import NodeProcess, started_pair
from tests.procs import process
from tests.streams.jetstream_fixtures import read_to_head
from tests.waiting import wait_until

TTL = 2


def publish_many(node: NodeProcess, n: int) -> list[int]:
    """Publish ``n`` events (in calls of 600): more than one replay batch (500 in the node),
    so a paced replay of them runs for a while."""
    ids: list[int] = []
    for k in range(0, n, 600):
        r = node.publish([f"event {i}" for i in range(k, min(n, k + 600))])
        r.raise_for_status()
        ids += r.json()["ids"]
    return ids


def start_replay(node: NodeProcess, n: int, why: str) -> int:
    """Publish ``n`` events the subscriber misses, subscribe, register a replay of them on
    ``node`` and wait until it runs there; the replay's id. The node's pace (its ``rate``)
    decides how long it keeps running: ``why`` says why the test needs it running."""
    missed = publish_many(node, n)
    node.api.post("/api/events/subscriptions", json={"namespace": NS}).raise_for_status()
    rid = node.api.post(
        "/api/events/replays",
        json={"namespace": NS, "start": missed[0], "end": missed[-1] + 1},
    ).json()["id"]
    wait_until(
        lambda: node.api.get(f"/api/events/replays/{rid}").json()["status"] == "running",
        10,
        f"the replay running on {node.data.name} ({why})",
    )
    return int(rid)


def apply(chain: list[bytes], ev: object) -> list[bytes]:
    """Apply a Cardinal chain update to ``chain`` (hashes); the blocks it added."""
    if not isinstance(ev, ChainUpdate):
        return []
    for blk in reversed(ev.removed):
        assert chain and chain[-1] == blk.hash, "a reorg removed a block that is not the head"
        chain.pop()
    chain.extend(blk.hash for blk in ev.added)
    return [blk.hash for blk in ev.added]


def journal(url: str, prefix: str) -> list[bytes]:
    """The journal as the cluster holds it, through a fresh connection: up to the leader's head
    (``read_to_head``: another process's direct get may briefly miss the nodes' last writes)."""
    log = JetStreamLog(url, prefix=prefix)
    try:
        return [r.data for r in read_to_head(log, journal_stream())]
    finally:
        log.close()


@pytest.mark.slow
def test_node_a_sigkilled_mid_replay_node_b_takes_over_and_loses_nothing(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    prefix = "fo" + uuid.uuid4().hex[:8]
    a = NodeProcess(tmp_path, "a", nats3.url, prefix, rate=400)
    b = NodeProcess(tmp_path, "b", nats3.url, prefix, rate=400)
    with started_pair(a, b) as proc_a:
        # B refuses what A holds, with a 503 that says why
        r = b.publish(["too early"])
        assert r.status_code == 503 and r.json()["error"] == "EventsElsewhere", r.text

        # the stream service: records and a consumer index, acknowledged by A
        with StreamClient(port=a.stream_port, timeout=30) as ca:
            ca.create_stream("orders", 3)
            for p in range(3):
                ca.push_many("orders", [b"o%d-%d" % (p, i) for i in range(10)], p)
            ca.get_index("billing", "orders", 1)
            ca.save_index("billing", "orders", 4, 1)
            # Cardinal: a 12-block chain; a consumer takes part of it and commits
            _, canonical = produce_chain(ca, "demo.chain", 12, partitions=2)
            consumer = StreamConsumer(
                StreamTransport(ca),
                topics_for("demo.chain"),
                "chain-app",
                start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
            )
            chain: list[bytes] = []  # the application's view: updates applied in order
            got_a: list[bytes] = []
            for _ in range(40):
                for ev in consumer.poll(limit=4):
                    got_a += apply(chain, ev)
                if len(got_a) >= 4:
                    break
            consumer.commit()
        assert 4 <= len(got_a) < 12, len(got_a)

        # ICRC: events missed by the subscriber, then a replay of them, paced (400
        # events/s, batches of 500) to be running when A dies
        rid = start_replay(a, 1200, "400 events/s: still running when A dies")

        proc_a.send_signal(signal.SIGKILL)
        proc_a.wait(10)
        killed = time.monotonic()
        wait_until(b.holds_events, TTL + 2 + 1, "B takes the journal lease")
        took = time.monotonic() - killed
        assert took <= TTL + 2, took

        # B finishes the replay A was running, from the journal A wrote
        rep = wait_until(
            lambda: (
                (r := b.api.get(f"/api/events/replays/{rid}").json())["status"] == "completed" and r
            ),
            30,
            "B completes the replay",
        )
        assert rep["sent"] == rep["expected"] == 1200, rep
        assert b.publish(["after failover"]).status_code == 200

        # every acknowledged record and the consumer index, through B
        with StreamClient(port=b.stream_port, timeout=30) as cb:
            for p in range(3):
                assert [m.data for m in cb.pull("orders", 0, 100, p)] == [
                    b"o%d-%d" % (p, i) for i in range(10)
                ]
            assert cb.get_index("billing", "orders", 1) == 4
            # the Cardinal consumer resumes on B from its checkpoint: each block once
            got_b: list[bytes] = []
            consume_topic(
                cb,
                "demo.chain",
                "chain-app",
                idle_seconds=0.5,
                on_event=lambda ev: got_b.extend(apply(chain, ev)),
            )
        # no block delivered twice across the failover, and the chain is whole
        assert len(set(got_a + got_b)) == len(got_a + got_b), "a block delivered twice"
        assert chain == [blk.hash for blk in canonical]
        print(f"B took the leases {took:.2f}s after A was SIGKILLed")


@pytest.mark.slow
def test_a_sigstopped_holder_resumed_after_losing_its_lease_writes_nothing(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    prefix = "st" + uuid.uuid4().hex[:8]
    a = NodeProcess(tmp_path, "a", nats3.url, prefix, rate=50)
    b = NodeProcess(tmp_path, "b", nats3.url, prefix, rate=100_000)
    with started_pair(a, b) as proc_a:
        rid = start_replay(a, 1200, "50 events/s: A has work left when it stops")
        os.kill(proc_a.pid, signal.SIGSTOP)
        try:
            wait_until(b.holds_events, TTL + 2 + 1, "B takes the journal lease")
            wait_until(
                lambda: b.api.get(f"/api/events/replays/{rid}").json()["status"] == "completed",
                30,
                "B completes the replay",
            )
            time.sleep(1.0)  # B idle: its journal is settled
            before = journal(nats3.url, prefix)
        finally:
            os.kill(proc_a.pid, signal.SIGCONT)
        time.sleep(TTL + 1)  # A runs again: its pump, its lease task, its publisher
        after = journal(nats3.url, prefix)
        assert after == before, f"{len(after) - len(before)} journal records after resume"
        claims = [d for d in before if is_claim(d)]
        assert len(claims) == 2  # A's at its start, B's at the takeover
        assert proc_a.poll() is None  # A lives on, as a node that holds nothing
        assert a.publish(["from A"]).status_code == 503
        assert journal(nats3.url, prefix) == before


@pytest.mark.slow
def test_the_five_protocol_walkthrough_on_a_then_a_killed_and_b_carries_every_part(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """The make-run walkthrough's five steps against node A (its own functions, over A's API
    and stream service); A SIGKILLed; on B: the streams and consumer index are whole, the SDS
    channel repairs a lost message for B's own participants, and B — the archives control
    node now, with the same community key — builds the next archive, which B's member
    fetches."""
    from rich.console import Console

    from loglake.node import walkthrough as w

    prefix = "wk" + uuid.uuid4().hex[:8]
    parts = ["--sds-enabled", "--archives-enabled", "--archives-wait", "0"]
    parts += ["--archives-check-every", "1"]
    a = NodeProcess(tmp_path, "a", nats3.url, prefix, rate=0)
    b = NodeProcess(tmp_path, "b", nats3.url, prefix, rate=0)
    for n in (a, b):
        n.cmd = [x for x in n.cmd if x not in ("--no-archives-enabled", "--no-sds-enabled")]
        n.cmd += parts
    b.cmd += ["--sds-participants", "carol,dave"]  # a participant is one identity, one place
    console = Console(quiet=True)

    with started_pair(a, b) as proc_a:
        token_a = (a.data / "node.token").read_text().strip()
        api_a = w.Api(f"http://127.0.0.1:{a.http}", token_a)
        with StreamClient(port=a.stream_port, timeout=30) as ca:
            s = {
                "streams": w._streams(console, api_a, ca),
                "icrc": w._icrc(console, api_a),
                "cardinal": w._cardinal(console, ca),
                "sds": w._sds(console, api_a),
                "archives": w._archives(console, api_a, ca),
            }
        assert s["streams"]["records"] == 30 and s["streams"]["consumer_lag"] == 6
        assert s["icrc"]["replay_status"] == "completed" and s["icrc"]["replayed"] == 10
        assert s["cardinal"]["reorgs"] >= 1 and s["sds"]["repaired"] >= 1
        assert s["archives"]["archives"] == 1 and s["archives"]["fetched"] == 1

        proc_a.send_signal(signal.SIGKILL)
        proc_a.wait(10)
        killed = time.monotonic()
        token_b = (b.data / "node.token").read_text().strip()
        api_b = w.Api(f"http://127.0.0.1:{b.http}", token_b)
        wait_until(b.holds_events, TTL + 2 + 1, "B takes the journal lease")
        took = time.monotonic() - killed
        orders = api_b("GET", "/api/streams/demo.orders")
        assert orders["records"] == 30
        lag = api_b("GET", "/api/streams/demo.orders/consumers")
        assert [(c["client_id"], c["index"], c["lag"]) for c in lag] == [("billing", 4, 6)]
        replays = api_b("GET", "/api/events/replays")
        assert [(r["status"], r["sent"]) for r in replays] == [("completed", 10)]

        # SDS on B (its own participants, carol and dave, on the same channel): a message
        # lost for dave is repaired from the channel's store after the failover
        ch = api_b("GET", "/api/sds/channels")[0]["channel"]
        path = f"/api/sds/channels/{ch}"
        # (texts of their own: an SDS message id is the hash of its content)
        texts = ["hi dave, on B", "lost on B", "did you get that, on B?"]
        for text, lose in zip(texts, ([], ["dave"], []), strict=True):
            api_b(
                "POST",
                f"{path}/messages",
                json={"sender": "carol", "text": text, "lose_for": lose},
            )

        def dave() -> dict:
            states = api_b("GET", path)["participant_states"]
            return next(p for p in states if p["id"] == "dave")

        d = wait_until(
            lambda: (d := dave())["repaired"] >= 1 and not d["missing"] and d,
            60,
            f"dave repairs the lost message on B ({api_b('GET', path)})",
        )
        assert set(texts) <= {m["text"] for m in d["recent"]}

        # archives on B: the control lease is B's now; messages of the current week,
        # built early (partial), make a second archive that B's member fetches
        info = api_b("GET", "/api/archives")
        from loglake.archives import get_layout

        layout = get_layout("spec")
        now = time.time_ns()
        with StreamClient(port=b.stream_port, timeout=30) as cb:
            cb.push_many(
                info["stream"],
                [
                    layout.make_record(
                        payload=f"after failover {i}".encode(),
                        topic="/status/1/community-chat/proto",
                        timestamp_ns=now - 3600 * 10**9 + i,
                    )
                    for i in range(20)
                ],
            )
        built = wait_until(
            lambda: (
                (r := b.api.post("/api/archives/build", json={"partial": True})).status_code == 200
                and r.json()
            ),
            TTL + 2 + 5,
            "B builds as the archives control node",
        )
        assert built["new_archives"] >= 1, built
        got = wait_until(
            lambda: (
                (m := api_b("GET", "/api/archives")["member"]) and len(m["archives"]) >= 2 and m
            ),
            90,
            "B's member fetches the archive B built",
        )
        assert got["messages"] >= 120, got
        assert not [*a.data.rglob("*.key"), *b.data.rglob("*.key")]  # keys: in the cluster
        print(f"B took the journal lease {took:.2f}s after A was SIGKILLed")


@pytest.mark.parametrize("held", [True, False])
def test_retention_runs_only_while_its_lease_is_held(memory_log, held: bool) -> None:
    """The node's retention pass asks its lease before each round: a node that does not hold
    ``retention`` trims nothing (another node on the cluster does)."""
    import asyncio

    from loglake.log import StreamConfig
    from loglake.node.cli import _retention_loop

    memory_log.create_stream("s", StreamConfig(retention_records=5))
    memory_log.append_payloads("s", [b"x%d" % i for i in range(20)], partition=0)

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(_retention_loop(memory_log, 0.05, stop, lambda: held))
        await asyncio.sleep(0.4)
        stop.set()
        await task

    asyncio.run(run())
    first = memory_log.stream_info("s").partitions[0].first_index
    assert first == (15 if held else 0)


CHAIN = "member.chain"


class Member:
    """A ``loglake cardinal consume --backend`` process (one consumer-group member) and the
    lines it printed: blocks (``+``/``-``), ``committed`` after each commit, lease states."""

    def __init__(self, url: str, prefix: str, client: str, stderr: Path) -> None:
        cmd = [
            sys.executable, "-u", "-m", "loglake.cli", "cardinal", "consume",
            "--topic", CHAIN, "--client-id", client, "--backend", url, "--nats-prefix", prefix,
            "--lease-ttl", str(TTL), "--replicas", "3", "--idle-seconds", "600",
            "--commit-seconds", "0",
        ]  # fmt: skip
        env = {**os.environ, "COLUMNS": "200"}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True, env=env
        )
        self.lines: list[str] = []
        self.last_line_at = time.monotonic()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.last_line_at = time.monotonic()

    def saw(self, prefix: str, since: int = 0) -> bool:
        return any(x.startswith(prefix) for x in self.lines[since:])

    def quiet_after_commit(self) -> bool:
        """Printed blocks, committed them, and nothing since for a second."""
        blocks = [x for x in self.lines if x.startswith(("+ ", "- "))]
        return (
            bool(blocks)
            and self.lines[-1].startswith("committed")
            and time.monotonic() - self.last_line_at > 1.0
        )

    def committed_updates(self) -> list[tuple[str, str]]:
        """(+/-, hash prefix) of every block line up to the last commit."""
        last = max((i for i, x in enumerate(self.lines) if x.startswith("committed")), default=-1)
        return [(x[0], x.split()[2]) for x in self.lines[: last + 1] if x.startswith(("+ ", "- "))]

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.slow
def test_cardinal_members_under_a_lease_one_consumes_a_standby_takes_over_each_block_once(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """Three ``loglake cardinal consume --backend`` processes for one client id on the 3-node
    cluster, while a producer sends a chain in three parts. A consumes the first part, B stands
    by; A is SIGKILLed: B takes the lease within TTL + 2 s and consumes the second part from
    A's checkpoint. C stands by; B is SIGSTOPped: C takes over and consumes the rest. B,
    resumed, learns it lost the lease and writes no checkpoint. The blocks committed across
    the three, applied in order, are the canonical chain, each once."""
    from loglake.cardinal.synthetic import synthetic_chain
    from loglake.streams.jetstream import JetStreamStreams

    prefix = "cm" + uuid.uuid4().hex[:8]
    log = JetStreamLog(nats3.url, prefix=prefix, replicas=3)
    streams = JetStreamStreams(log)
    blocks = 24
    steps = len(synthetic_chain(blocks).steps)
    gates = {steps // 3: threading.Event(), 2 * steps // 3: threading.Event()}
    sent = [0]
    canonical: list[bytes] = []

    def gated(step: object) -> None:
        sent[0] += 1
        if sent[0] in gates:
            assert gates[sent[0]].wait(120)

    def produce() -> None:
        canonical.extend(b.hash for b in produce_chain(streams, CHAIN, blocks, 2, on_step=gated)[1])

    producer = threading.Thread(target=produce, daemon=True)
    members: list[Member] = []
    try:
        producer.start()
        a = Member(nats3.url, prefix, "app", tmp_path / "a.stderr")
        members.append(a)
        wait_until(lambda: a.saw("holding"), 30, "A holds the member's lease")
        b = Member(nats3.url, prefix, "app", tmp_path / "b.stderr")
        members.append(b)
        wait_until(lambda: b.saw("standby"), 30, "B stands by")
        wait_until(a.quiet_after_commit, 30, "A consumed and committed the first part")
        assert not b.saw("+ ")
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
        killed = time.monotonic()
        wait_until(lambda: b.saw("holding"), TTL + 3, "B takes the lease over")
        took_b = time.monotonic() - killed
        gates[steps // 3].set()
        wait_until(lambda: b.saw("+ ") and b.quiet_after_commit(), 30, "B consumed the second part")

        c = Member(nats3.url, prefix, "app", tmp_path / "c.stderr")
        members.append(c)
        wait_until(lambda: c.saw("standby"), 30, "C stands by")
        os.kill(b.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_until(lambda: c.saw("holding"), TTL + 3, "C takes the lease over")
        took_c = time.monotonic() - stopped
        gates[2 * steps // 3].set()
        producer.join(60)
        assert canonical, "the producer finished"
        want = [h.hex()[:16] for h in canonical]

        def whole() -> list[str] | None:
            """The chain the committed updates of A, B and C build, if it is the canonical one
            (an update's removed blocks are printed oldest first: taken off from the head)."""
            chain: list[str] = []
            removed: list[str] = []
            updates = [u for who in (a, b, c) for u in who.committed_updates()]
            for op, h in [*updates, ("+", "")]:
                if op == "-":
                    removed.append(h)
                    continue
                for r in reversed(removed):
                    assert chain and chain[-1] == r, "a removed block that is not the head"
                    chain.pop()
                removed = []
                chain.append(h)
            chain.pop()
            return chain if chain == want else None

        wait_until(lambda: whole() and c.quiet_after_commit(), 30, "C consumed the rest")
        ckpt = log.next_index("cardinal.ckpt.app", partition=0)
        since = len(b.lines)
        os.kill(b.proc.pid, signal.SIGCONT)
        wait_until(lambda: b.saw("lost", since) or b.saw("standby", since), TTL + 3, "B lost")
        time.sleep(TTL)
        assert not b.saw("committed", since), b.lines[since:]
        print("B after SIGCONT:", b.lines[since:])
        assert log.next_index("cardinal.ckpt.app", partition=0) == ckpt, "B wrote a checkpoint"
        added = [h for who in (a, b, c) for op, h in who.committed_updates() if op == "+"]
        assert len(added) == len(set(added)), "a block delivered twice"
        print(f"B took over {took_b:.2f}s after A's SIGKILL, C {took_c:.2f}s after B's SIGSTOP")
    finally:
        for gate in gates.values():
            gate.set()
        for m in members:
            m.close()
        log.close()


@pytest.mark.slow
def test_an_sds_participant_runs_on_one_node_at_a_time_and_moves_when_its_node_dies(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """Nodes A (alice, bob) and B (alice, carol) on one channel: alice runs on A only (A holds
    her lease); B refuses to send as alice with a 503 that says where she runs, and does not
    run a second alice (which would drop A's alice's messages as its own and never repair
    bob's reply that names one): the channel is healthy on both. A is SIGKILLed: B takes alice
    over within the lease TTL + 2 s, from the channel's stream (her own hello back in her log:
    bob's reply that names it is delivered, nothing missing), and sends as her; carol delivers
    it."""
    prefix = "sd" + uuid.uuid4().hex[:8]
    a = NodeProcess(tmp_path, "a", nats3.url, prefix, rate=0)
    b = NodeProcess(tmp_path, "b", nats3.url, prefix, rate=0)
    for n, who in ((a, "alice,bob"), (b, "alice,carol")):
        n.cmd = [x for x in n.cmd if x not in ("--no-sds-enabled", "--events-enabled")]
        n.cmd += ["--no-events-enabled", "--sds-enabled", "--sds-participants", who]
    with process(a.cmd, a.http, stderr=a.log()) as proc_a:
        api_a = a.connect()
        ch = api_a.get("/api/sds/channels").json()[0]["channel"]
        path = f"/api/sds/channels/{ch}"

        def state(api: httpx.Client, pid: str) -> dict:
            return next(p for p in api.get(path).json()["participant_states"] if p["id"] == pid)

        wait_until(lambda: state(api_a, "alice")["here"], 15, "A runs alice")
        with process(b.cmd, b.http, stderr=b.log()):
            api_b = b.connect()
            assert not state(api_b, "alice")["here"] and state(api_b, "carol")["here"]
            r = api_b.post(f"{path}/messages", json={"sender": "alice", "text": "from B"})
            assert r.status_code == 503 and r.json()["error"] == "SdsElsewhere", r.text
            assert "runs on another node" in r.json()["message"]

            def send(api: httpx.Client, sender: str, text: str) -> None:
                r = api.post(f"{path}/messages", json={"sender": sender, "text": text})
                assert r.status_code == 201, r.text

            send(api_a, "alice", "hello from alice")
            wait_until(
                lambda: state(api_a, "bob")["delivered"] >= 1, 15, "bob delivers alice's hello"
            )
            send(api_a, "bob", "hi alice")  # names alice's hello in its causal history

            def texts(api: httpx.Client, pid: str) -> set[str]:
                return {m["text"] for m in state(api, pid)["recent"]}

            wait_until(
                lambda: {"hello from alice", "hi alice"} <= texts(api_b, "carol"),
                15,
                "carol, on B, delivers both",
            )
            wait_until(lambda: "hi alice" in texts(api_a, "alice"), 15, "alice delivers bob's")
            time.sleep(1.0)  # rounds on B: a second alice there would now miss her own hello
            for api in (api_a, api_b):
                assert api.get(path).json()["healthy"], api.get(path).json()
            assert state(api_b, "alice")["delivered"] == 0  # never run on B

            proc_a.send_signal(signal.SIGKILL)
            proc_a.wait(10)
            killed = time.monotonic()
            wait_until(lambda: state(api_b, "alice")["here"], TTL + 3, "B takes alice over")
            took = time.monotonic() - killed
            assert took <= TTL + 2, took
            # alice on B starts from the channel's stream and takes her own hello back into
            # her log: bob's reply, which names it, is delivered, nothing is missing
            wait_until(lambda: "hi alice" in texts(api_b, "alice"), 15, "alice on B has bob's")
            assert not state(api_b, "alice")["missing"] and api_b.get(path).json()["healthy"]
            send(api_b, "alice", "alice, now on B")
            wait_until(lambda: "alice, now on B" in texts(api_b, "carol"), 15, "carol delivers it")
            print(f"B took alice over {took:.2f}s after A was SIGKILLed")
