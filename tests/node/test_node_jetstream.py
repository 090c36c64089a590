"""``loglake node --backend nats://…``: every part of the node on a real 3-node JetStream cluster
(loopback), R3 — the five-protocol walkthrough against it, then the node restarted and its state
read back from JetStream; and the configuration's checks of the backend."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from loglake.node.backend import ONCE_ONLY
from loglake.node.config import ConfigError, embedded_default, load_config
from loglake.node.runner import BackgroundNode
from loglake.node.walkthrough import run_walkthrough
from loglake.streams.jetstream import JetStreamLog, _parse_key
from tests.nats_cluster import NatsCluster
from tests.node.conftest import background_node
from tests.waiting import wait_until

LOCAL_ONLY = {"node.token", "node.lock", "archives", "lake"}
"""What a node on JetStream keeps in its data dir: the token, its lock, the parts' caches, the
sealed lake — no log, no identity keys (they are in the cluster's key bucket)."""


def api(node: BackgroundNode) -> httpx.Client:
    return httpx.Client(
        base_url=node.url, headers={"Authorization": f"Bearer {node.token}"}, timeout=30
    )


@pytest.mark.slow
def test_the_five_protocols_run_on_jetstream_and_a_restarted_node_finds_its_state(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    data = tmp_path / "node"
    s = run_walkthrough(data_dir=data, backend=nats3.url, replicas=3)
    assert s["streams"]["records"] == 30 and s["streams"]["partitions"] == 3
    assert s["streams"]["consumer_lag"] == 6  # the consumer index is in JetStream's KV
    assert s["icrc"]["replay_status"] == "completed" and s["icrc"]["replayed"] == 10
    assert s["icrc"]["notifications"] == 20
    assert s["cardinal"]["reorgs"] >= 1 and s["cardinal"]["reorg_messages"] >= 1
    assert s["sds"]["repaired"] >= 1 and s["sds"]["healthy"]
    assert s["archives"]["archives"] == 1 and s["archives"]["fetched"] == 1
    assert s["archives"]["hydrated"] == s["archives"]["messages"]
    # the node kept no log of its own, and no keys
    assert {p.name for p in data.iterdir()} <= LOCAL_ONLY, sorted(p.name for p in data.iterdir())
    assert not list(data.rglob("*.key"))

    # every stream the parts wrote is a replicated JetStream stream
    log = JetStreamLog(nats3.url)
    try:
        streams = set(log.streams())
        assert "demo.orders" in streams and len(streams) >= 5, streams
        assert sum(p.next_index for p in log.stream_info("demo.orders").partitions) == 30
    finally:
        log.close()

    # the same node restarted: its state comes back from the cluster
    cfg = embedded_default(data, streams={"backend": nats3.url, "replicas": 3})
    with BackgroundNode(cfg, say=lambda _: None) as node, api(node) as http:
        orders = http.get("/api/streams/demo.orders").json()
        assert orders["records"] == 30 and orders["partitions"] == 3
        lag = http.get("/api/streams/demo.orders/consumers").json()
        assert [(c["client_id"], c["partition"], c["index"], c["lag"]) for c in lag] == [
            ("billing", 1, 4, 6)
        ]
        replays = http.get("/api/events/replays").json()  # the orchestrator's journal
        assert [(r["status"], r["sent"]) for r in replays] == [("completed", 10)]
        member = http.get("/api/archives").json()["member"]  # its store is a stream
        assert len(member["archives"]) == 1 and member["messages"] == 100
        roles = http.get("/api/events").json()["roles"]
        community = http.get("/api/archives").json()["community"]

    # and a node with a fresh data dir on the same cluster sees the same history
    fresh = load_config(
        data={
            "data_dir": str(tmp_path / "fresh"),
            "http": {"port": 0},
            "streams": {"port": 0, "backend": nats3.url, "replicas": 3},
            "events": {"enabled": True, "namespaces": ["demo.events"]},
            "archives": {"enabled": True, "wait": 0.0, "check_every": 1.0},
        },
        env={},
    )
    with BackgroundNode(fresh, say=lambda _: None) as node, api(node) as http:
        names = {x["name"] for x in http.get("/api/streams").json()}
        assert names == streams
        assert http.get("/api/streams/demo.orders").json()["records"] == 30
        assert len(http.get("/api/streams/demo.orders/consumers").json()) == 1
        # the same identities: the ICRC principals and the community, from the key bucket
        assert http.get("/api/events").json()["roles"] == roles
        assert http.get("/api/archives").json()["community"] == community
    assert not list((tmp_path / "fresh").rglob("*.key"))


def test_node_keys_live_in_the_cluster_one_per_name_a_legacy_file_kept_bad_values_named(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """``NodeKeys`` on a cluster: the bucket is made with the configured replicas; two nodes
    asking for one key get the one the first stored; a key file a node had before the cluster
    had that key is uploaded (the node keeps its identity), and ignored once the cluster has
    one; a damaged stored key is a ``NodeKeyError`` naming it, not a crash."""
    from loglake.node.api.events import _identity
    from loglake.node.keys import NodeKeyError, NodeKeys

    prefix = "k" + uuid.uuid4().hex[:8]
    a = JetStreamLog(nats3.url, prefix=prefix, replicas=3)
    b = JetStreamLog(nats3.url, prefix=prefix, replicas=3)
    try:
        ka, kb = NodeKeys(a, prefix, 3), NodeKeys(b, prefix, 3)
        made = iter(["first", "second"])
        assert ka.text("x", tmp_path / "none", lambda: next(made)) == "first"
        assert kb.text("x", tmp_path / "none", lambda: next(made)) == "first"

        async def replicas() -> int:
            return (await a.js.stream_info(f"KV_{prefix}_keys")).config.num_replicas

        assert a.call(replicas()) == 3
        legacy = tmp_path / "old.key"
        legacy.write_text("from-the-data-dir\n")
        legacy.chmod(0o600)  # a key file others may read is refused (node/keys.py)
        assert kb.text("y", legacy, lambda: "new") == "from-the-data-dir"
        (tmp_path / "other.key").write_text("another\n")
        assert ka.text("y", tmp_path / "other.key", lambda: "new") == "from-the-data-dir"
        ka.text("events.orchestrator", tmp_path / "none", lambda: "not hex")
        with pytest.raises(NodeKeyError, match="orchestrator key in JetStream KV bucket"):
            _identity(tmp_path, "orchestrator", kb)
        assert not list(tmp_path.glob("none*"))  # nothing written to the data dir
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("streams", "error"),
    [
        ({"backend": "http://x:1"}, r"\[streams\] backend: expected nats://"),
        ({"backend": ""}, r"\[streams\] backend: expected a non-empty string"),
        ({"backend": " , "}, r"\[streams\] backend: no NATS server"),
        ({"backend": "notaurl"}, r"\[streams\] backend: expected nats://"),  # not dialled
        ({"backend": "h1:4222,h2"}, r"\[streams\] backend: 'h2' in 'h1:4222,h2': expected"),
        ({"replicas": 3}, r"\[streams\] replicas: replicas are JetStream's"),
        ({"backend": "nats://a:1", "replicas": 0}, r"\[streams\] replicas: expected an integer"),
        ({"backend": "nats://a:1", "seal_interval": 0}, r"\[streams\] seal_interval"),
    ],
)
def test_a_bad_backend_setting_names_the_key(tmp_path: Path, streams: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_config(data={"data_dir": str(tmp_path), "streams": streams}, env={})


def test_the_backend_flags_and_environment_reach_the_config(tmp_path: Path) -> None:
    cfg = load_config(
        data={"data_dir": str(tmp_path)},
        env={"LOGLAKE_STREAMS_BACKEND": "h1:4222,h2:4222", "LOGLAKE_STREAMS_REPLICAS": "3"},
    )
    assert cfg.streams.backend == "h1:4222,h2:4222" and cfg.streams.replicas == 3


def test_an_unreachable_backend_is_a_typed_start_error(tmp_path: Path) -> None:
    from tests.procs import free_port

    cfg = load_config(
        data={
            "data_dir": str(tmp_path),
            "http": {"port": 0},
            "streams": {"port": 0, "backend": f"nats://127.0.0.1:{free_port()}"},
        },
        env={},
    )
    from loglake.errors import LoglakeError

    with pytest.raises(LoglakeError, match="NATS JetStream unavailable"):
        BackgroundNode(cfg, say=lambda _: None).start()


@pytest.mark.parametrize(
    "key",
    [
        "",
        "c.s.0",
        "cYQ.sYg",
        "cYQ.sYg.x",
        "xYQ.sYg.0",
        "c!!.sYg.0",
        "cYQ.sYg.0.1",
        "c/w.sYg.0",
        "cYQ==.sYg.0",
        "c_w.sYg.0",
    ],
)
def test_index_keys_written_by_something_else_are_skipped(key: str) -> None:
    assert _parse_key(key) is None


def test_index_keys_decode_back() -> None:
    assert _parse_key("cYmlsbGluZw.sZGVtby5vcmRlcnM.1") == ("billing", "demo.orders", 1)


def sealed(data_dir: Path, stream: str) -> int:
    """Records in the lake files the node's sealer wrote for ``stream``."""
    from loglake.log.lake import list_lake_files, visible_lake_files
    from loglake.log.lake_schema import lake_partition_dir

    files = visible_lake_files(list_lake_files(lake_partition_dir(data_dir, stream, 0)))
    return sum(f.last - f.first + 1 for f in files)


def test_two_nodes_on_one_cluster_seal_once_and_hand_the_sealer_over(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    prefix = "two" + uuid.uuid4().hex[:8]
    a = background_node(nats3.url, tmp_path / "a", prefix, seal_interval=0.2)
    b = background_node(nats3.url, tmp_path / "b", prefix, seal_interval=0.2)
    try:
        holder, other = wait_until(
            lambda: (
                (a, b)
                if a.node.leases.holds("sealer")
                else (b, a)
                if b.node.leases.holds("sealer")
                else None
            ),
            10,
            "a sealer holder",
        )
        for _ in range(10):  # one holder, across renewals
            assert holder.node.leases.held()["sealer"] is True
            assert other.node.leases.held()["sealer"] is False
            time.sleep(0.2)
        # every once-only work has exactly one holder, and operators can see which
        wait_until(
            lambda: all(a.node.leases.holds(n) != b.node.leases.holds(n) for n in ONCE_ONLY),
            10,
            "one holder of each lease",
        )
        for name in ONCE_ONLY:
            views = [n.node.leases.view()[name] for n in (a, b)]
            [held] = [v for v in views if v["held"]]
            assert held["holder"] and held["token"] > 0 and held["ttl"] == 2, held
        log = JetStreamLog(nats3.url, prefix=prefix)
        try:
            log.create_stream("orders")
            log.append_payloads("orders", [b"x%d" % i for i in range(20)])
            wait_until(lambda: sealed(holder.node.config.data_dir, "orders") == 20, 10, "sealed")
            time.sleep(1.0)  # several of the other node's rounds
            assert sealed(other.node.config.data_dir, "orders") == 0  # it did not seal too
            stopped = time.monotonic()
            holder.stop()  # a clean stop hands the lease over at once
            wait_until(lambda: other.node.leases.holds("sealer"), 2 + 2, "the handover")
            took = time.monotonic() - stopped
            log.append_payloads("orders", [b"y%d" % i for i in range(5)])
            wait_until(lambda: sealed(other.node.config.data_dir, "orders") == 25, 10, "resealed")
            print(f"sealer handed over {took:.2f}s after the holder stopped")
        finally:
            log.close()
    finally:
        for n in (a, b):
            n.stop()


@pytest.mark.slow
def test_a_killed_node_process_hands_the_sealer_to_the_other(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """Two ``loglake node --backend … --replicas 3`` processes on one cluster: only one seals;
    SIGKILL it, and the other seals what follows within the lease TTL + 2 s (+ a seal round)."""
    import sys

    from tests.procs import free_port, process

    prefix, ttl = "proc" + uuid.uuid4().hex[:8], 2

    def cmd(name: str, http_port: int) -> list[str]:
        return [
            sys.executable, "-m", "loglake.cli", "node", "--no-console",
            "--data-dir", str(tmp_path / name), "--http-port", str(http_port),
            "--no-streams-enabled", "--backend", nats3.url, "--replicas", "3",
            "--streams-nats-prefix", prefix, "--streams-lease-ttl", str(ttl),
            "--streams-seal-interval", "0.2",
        ]  # fmt: skip

    ports = {"a": free_port(), "b": free_port()}
    log = JetStreamLog(nats3.url, prefix=prefix)
    try:
        with (
            process(cmd("a", ports["a"]), ports["a"]) as a,
            process(cmd("b", ports["b"]), ports["b"]) as b,
        ):
            log.create_stream("orders")
            log.append_payloads("orders", [b"x%d" % i for i in range(20)])
            first = wait_until(
                lambda: next((n for n in "ab" if sealed(tmp_path / n, "orders") == 20), None),
                15,
                "the first seal",
            )
            second = "b" if first == "a" else "a"
            time.sleep(1.0)
            assert sealed(tmp_path / second, "orders") == 0  # one sealer, not two
            ({"a": a, "b": b})[first].kill()
            killed = time.monotonic()
            log.append_payloads("orders", [b"y%d" % i for i in range(5)])
            wait_until(
                lambda: sealed(tmp_path / second, "orders") == 25, ttl + 2 + 3, "the takeover"
            )
            print(f"sealed by the other node {time.monotonic() - killed:.2f}s after SIGKILL")
    finally:
        log.close()


def test_a_second_node_on_the_same_data_dir_is_refused_on_a_cluster_too(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """On JetStream the log locks nothing in the data dir: a second node given the first one's
    data dir ran beside it, both writing its token, archives state and caches. The node's own
    lock (node.lock) refuses it, as the embedded log's lock does, and frees it at stop."""
    from loglake.node.runner import NodeStartError

    prefix = f"lk{uuid.uuid4().hex[:8]}"
    first = background_node(nats3.url, tmp_path, prefix)
    try:
        token = (tmp_path / "node.token").read_text()
        with pytest.raises(NodeStartError, match=f"data_dir {tmp_path} is in use by another"):
            background_node(nats3.url, tmp_path, prefix)
        assert (tmp_path / "node.token").read_text() == token
    finally:
        first.stop()
    again = background_node(nats3.url, tmp_path, prefix)  # the lock went with the first node
    again.stop()
