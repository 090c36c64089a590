"""``loglake node walkthrough`` (what ``make run`` calls): a node, and all five protocols on it.

The node runs on the embedded default (``config.embedded_default``: every part on, free ports,
a temp data dir); ``--backend nats://…`` keeps its streams in a JetStream cluster instead, and
``--backend`` alone starts a local 3-node cluster for it (``node/localcluster.py``) and ends
with what ``GET /api/cluster`` says (leases, meta leader, replicas, sealer lag). Everything
after that goes through the node's public faces, as a user's code would: the Ockam stream
service over TCP (``StreamClient``) and the HTTP API with the token.

1. streams: a 3-partition stream, pushes, pulls, a consumer's saved index and its lag;
2. ICRC-72/77: events published before and after a subscription; the missed ones replayed;
3. Cardinal: a synthetic chain with a deep reorg produced to topics and consumed as blocks;
4. SDS: alice and bob on a channel; bob loses one broadcast and repairs it from the store;
5. archives: a week of community messages, built into an archive, seeded, fetched by the
   member through BitTorrent.

It ends with a one-screen summary and the console URL, then stops the node (``--keep`` keeps it
running until Ctrl-C). Each wait is bounded; a step that does not happen in time is a
``WalkthroughFailed`` naming the step.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from rich.console import Console
from rich.table import Table

from loglake.errors import LoglakeError
from loglake.node.config import embedded_default
from loglake.node.runner import BackgroundNode

T = TypeVar("T")
NS = 1_000_000_000
DAY_NS = 86400 * NS
STEP_TIMEOUT_S = 60.0
NAMESPACE = "demo.events"
LOCAL_BACKEND = "local"
"""``--backend`` with no URL: a 3-node cluster started on this machine for the walkthrough."""


class WalkthroughFailed(LoglakeError):
    """A step of the walkthrough did not happen in time (the message says which)."""


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = STEP_TIMEOUT_S) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise WalkthroughFailed(f"{what}: not done after {timeout:g} s")
        time.sleep(0.1)


class Api:
    """The node's HTTP API with the token; a non-2xx answer is a ``WalkthroughFailed``."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        )

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        r = self.http.request(method, path, **kw)
        if r.status_code >= 300:
            raise WalkthroughFailed(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r

    def close(self) -> None:
        self.http.close()


def run_walkthrough(
    *,
    keep: bool = False,
    data_dir: Path | None = None,
    http_port: int = 0,
    backend: str | None = None,
    replicas: int = 1,
) -> dict[str, Any]:
    """Run the walkthrough; ``backend`` (``nats://h1,h2,h3``) keeps the node's streams in
    that JetStream cluster with ``replicas`` replicas instead of the embedded log;
    ``backend="local"`` starts a 3-node cluster on this machine for it (R3) and stops it at
    the end."""
    console = Console()
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="loglake-")))
        streams: dict[str, Any] | None = None
        if backend == LOCAL_BACKEND:
            from loglake.node.localcluster import LocalNatsCluster

            console.print("[bold]0.[/] starting a local 3-node NATS JetStream cluster …")
            nats = stack.enter_context(LocalNatsCluster(3))
            backend, replicas = nats.url, 3
            streams = {"nats_monitor": nats.monitor_urls}
            console.print(
                f"   {nats.version()}: servers n1-n3 on 127.0.0.1 ports "
                f"{', '.join(map(str, nats.ports))} (monitoring "
                f"{', '.join(map(str, nats.http_ports))}), stores in {nats.root}; "
                "stopped and removed at the end"
            )
        if backend:
            streams = {**(streams or {}), "backend": backend, "replicas": replicas}
        config = embedded_default(data_dir, http_port=http_port, streams=streams)
        console.print("[bold]0.[/] starting a node (every part on) …")
        node = stack.enter_context(BackgroundNode(config, say=lambda s: None))
        api = Api(node.url, node.token)
        stack.callback(api.close)
        addr = node.context.stream_address
        assert addr is not None
        console.print(
            f"   HTTP API {node.url}/api, stream service {addr[0]}:{addr[1]}, data dir {data_dir}"
        )
        if backend:
            console.print(f"   streams in NATS JetStream {backend} (R{replicas})")
        summary: dict[str, Any] = {}
        from loglake.streams import StreamClient

        client = stack.enter_context(StreamClient(addr[0], addr[1]))
        summary["streams"] = _streams(console, api, client)
        summary["icrc"] = _icrc(console, api)
        summary["cardinal"] = _cardinal(console, client)
        summary["sds"] = _sds(console, api)
        summary["archives"] = _archives(console, api, client)
        summary["metrics"] = _metrics(api)
        if backend:
            summary["cluster"] = _cluster(console, api)
        console_url = node.console_link()
        _summary(console, summary, console_url)
        if keep:
            console.print("[bold]--keep[/]: the node keeps running; Ctrl-C stops it")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        console.print(
            "stopping the node; to keep it (and the console URL above) running: "
            "`loglake node walkthrough --keep` (or `make run RUN_ARGS=--keep`)"
        )
        return summary


def _streams(console: Console, api: Api, client: Any) -> dict[str, Any]:
    name = client.create_stream("demo.orders", partitions=3)
    for i in range(30):
        client.push(name, f"order {i}".encode(), partition=i % 3)
    pulled = sum(len(client.pull(name, 0, 100, partition=p)) for p in range(3))
    client.get_index("billing", name, partition=1)
    client.save_index("billing", name, 4, partition=1)
    info = api("GET", f"/api/streams/{name}")
    lag = api("GET", f"/api/streams/{name}/consumers")
    console.print(
        f"[bold]1. streams[/]  {name}: {info['records']} records over {info['partitions']} "
        f"partitions (pushed over TCP), {pulled} pulled; consumer billing on partition 1 at "
        f"index {lag[0]['index']}, lag {lag[0]['lag']}"
    )
    return {
        "stream": name,
        "partitions": info["partitions"],
        "records": info["records"],
        "pulled": pulled,
        "consumer_lag": lag[0]["lag"],
    }


def _icrc(console: Console, api: Api) -> dict[str, Any]:
    publish = f"/api/events/namespaces/{NAMESPACE}/events"
    missed = api("POST", publish, json={"texts": [f"event {i}" for i in range(10)]})["ids"]
    api("POST", "/api/events/subscriptions", json={"namespace": NAMESPACE})
    ids = api("POST", publish, json={"texts": [f"event {i}" for i in range(10, 20)]})["ids"]

    def received() -> int:
        n: int = api("GET", "/api/events")["received"].get(NAMESPACE, 0)
        return n

    live = wait_for("ICRC live delivery", lambda: received() >= len(ids) and received())
    rid = api(
        "POST",
        "/api/events/replays",
        json={"namespace": NAMESPACE, "start": missed[0], "end": missed[-1] + 1},
    )["id"]
    rep = wait_for(
        "ICRC replay",
        lambda: (r := api("GET", f"/api/events/replays/{rid}"))["status"] == "completed" and r,
    )
    total = wait_for("ICRC replayed events delivered", lambda: received() >= 20 and received())
    console.print(
        f"[bold]2. ICRC-72/77[/]  {len(missed)} events published to {NAMESPACE} before the "
        f"subscriber subscribed, {len(ids)} after (delivered live: {live}); replay {rid} of "
        f"[{missed[0]}, {missed[-1] + 1}): {rep['status']}, {rep['sent']}/{rep['expected']} "
        f"sent; the subscriber now holds {total} events"
    )
    return {
        "published": len(missed) + len(ids),
        "live": live,
        "replay": rid,
        "replay_status": rep["status"],
        "replayed": rep["sent"],
        "notifications": total,
    }


def _cardinal(console: Console, client: Any) -> dict[str, Any]:
    from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
    from loglake.cardinal.cli import consume_topic, produce_chain

    # a reorg threshold of 2 makes the depth-3 reorg travel as Reorg/ReorgComplete messages
    sent, canonical = produce_chain(
        client, "demo.chain", 12, partitions=2, deep_reorg=3, reorg_threshold=2
    )
    updates = reorgs = reverted = reorg_messages = 0

    def seen(ev: ChainUpdate | ReorgEvent) -> None:
        nonlocal updates, reorgs, reverted, reorg_messages
        if isinstance(ev, ReorgEvent):
            reorg_messages += 1
        else:
            updates += 1
            if ev.removed:
                reorgs += 1
                reverted += len(ev.removed)

    consume_topic(
        client, "demo.chain", "walkthrough", reorg_threshold=2, on_event=seen, idle_seconds=0.5
    )
    head = canonical[-1]
    console.print(
        f"[bold]3. Cardinal[/]  produced a {len(canonical)}-block chain with a depth-3 reorg "
        f"({sent} messages over 2 partitions); the consumer saw {updates} chain updates, "
        f"{reorgs} of them reorgs ({reverted} blocks reverted), {reorg_messages} Reorg "
        f"messages; head #{head.number}"
    )
    return {
        "messages": sent,
        "blocks": len(canonical),
        "updates": updates,
        "reorgs": reorgs,
        "reverted": reverted,
        "reorg_messages": reorg_messages,
    }


def _sds(console: Console, api: Api) -> dict[str, Any]:
    ch = api("GET", "/api/sds/channels")[0]["channel"]
    path = f"/api/sds/channels/{ch}"
    api("POST", f"{path}/messages", json={"sender": "alice", "text": "hi bob"})
    lost = api(
        "POST", f"{path}/messages", json={"sender": "alice", "text": "lost", "lose_for": ["bob"]}
    )
    api("POST", f"{path}/messages", json={"sender": "alice", "text": "did you get that?"})

    def bob_repaired() -> dict[str, Any] | None:
        d = api("GET", path)
        bob = next(p for p in d["participant_states"] if p["id"] == "bob")
        return d if bob["repaired"] >= 1 and not bob["missing"] and bob["delivered"] >= 3 else None

    d = wait_for("SDS repair", bob_repaired)
    acked = wait_for(
        "SDS acknowledgements",
        lambda: (
            (a := next(p for p in api("GET", path)["participant_states"] if p["id"] == "alice"))[
                "acknowledged"
            ]
            >= 1
            and a
        ),
    )
    bob = next(p for p in d["participant_states"] if p["id"] == "bob")
    console.print(
        f"[bold]4. SDS[/]  alice sent 3 messages on {ch}; bob lost {lost['message_id']} "
        f"(stream index {lost['index']}), found it missing from the next message's causal "
        f"history and fetched it from the store: repaired {bob['repaired']}, delivered "
        f"{bob['delivered']}; alice sees {acked['acknowledged']} acknowledged"
    )
    return {
        "channel": ch,
        "repaired": bob["repaired"],
        "delivered": bob["delivered"],
        "acknowledged": acked["acknowledged"],
        "healthy": d["healthy"],
    }


def _archives(console: Console, api: Api, client: Any) -> dict[str, Any]:
    from loglake.archives import get_layout

    info = api("GET", "/api/archives")
    layout = get_layout("spec")
    start = time.time_ns() - 9 * DAY_NS  # one whole 7-day window that has closed
    records = [
        layout.make_record(
            payload=f"community message {i}".encode() * 8,
            topic="/status/1/community-chat/proto",
            timestamp_ns=start + i * (DAY_NS // 20),
        )
        for i in range(100)
    ]
    client.create_stream(info["stream"])
    client.push_many(info["stream"], records)
    built = api("POST", "/api/archives/build", json={})
    got = wait_for(
        "archive fetched by the member",
        lambda: (
            (a := api("GET", "/api/archives"))["member"]
            and a["member"]["archives"]
            and a["member"]["fetches"]
            and a
        ),
        timeout=90,
    )
    arch = got["archives"]
    fetch = got["member"]["fetches"][-1]
    console.print(
        f"[bold]5. archives[/]  {len(records)} community messages; control node built "
        f"{len(arch)} weekly archive(s) ({sum(a['size'] for a in arch):,} bytes), seeds "
        f"torrent {got['torrent']['info_hash'][:12]}…, magnet at channel index "
        f"{built['magnet_index']}; the member fetched {len(fetch['missing'])} archive(s) "
        f"({fetch['bytes_downloaded']:,} bytes) and hydrated {fetch['hydrated_messages']} "
        "messages"
    )
    return {
        "messages": len(records),
        "archives": len(arch),
        "fetched": len(fetch["missing"]),
        "hydrated": fetch["hydrated_messages"],
        "bytes_downloaded": fetch["bytes_downloaded"],
    }


def _cluster(console: Console, api: Api) -> dict[str, Any]:
    c = api("GET", "/api/cluster")
    leases = ", ".join(
        f"{x['name']} held by {'this node' if x['this_node'] else x['holder'] or 'nobody'}"
        for x in c["leases"]
    )
    meta = c["meta"] or {}
    partitions = [g for g in c["groups"] if g["stream"] is not None]
    replicas = sum(len(g["replicas"]) for g in partitions)
    lag = sum(x["lag_records"] for x in (c["sealer"] or {}).get("lag", []))
    console.print(
        f"[bold]6. cluster[/]  NATS JetStream R{c['replicas']}, "
        f"{'reachable' if c['reachable'] else 'unreachable: ' + str(c['error'])}; meta leader "
        f"{meta.get('leader') or 'unknown'}; {len(partitions)} partition streams with "
        f"{replicas} replicas; leases: {leases or 'none'}; sealer lag {lag} records "
        "(GET /api/cluster, the console's Cluster page)"
    )
    return {
        "reachable": c["reachable"],
        "meta_leader": meta.get("leader"),
        "partition_streams": len(partitions),
        "replicas": replicas,
        "leases": {x["name"]: x["this_node"] for x in c["leases"]},
        "sealer_lag_records": lag,
    }


def _metrics(api: Api) -> dict[str, float]:
    text = api("GET", "/metrics").text
    want = {
        "loglake_push_records_total": 0.0,
        "loglake_pull_records_total": 0.0,
        "loglake_archive_bytes_total": 0.0,
        "loglake_replay_events_sent_total": 0.0,
        "loglake_sds_ack_latency_seconds_count": 0.0,
        "loglake_consumer_lag": 0.0,
    }
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in want:
            want[name] += float(line.rsplit(" ", 1)[1])
    return want


def _summary(console: Console, s: dict[str, Any], console_url: str) -> None:
    t = Table("protocol", "what happened", title="loglake node walkthrough")
    st = s["streams"]
    t.add_row(
        "streams",
        f"{st['stream']}: {st['records']} records in {st['partitions']} partitions, "
        f"consumer lag {st['consumer_lag']}",
    )
    ic = s["icrc"]
    t.add_row(
        "ICRC-72/77",
        f"{ic['published']} published, replay {ic['replay']} {ic['replay_status']} "
        f"({ic['replayed']} replayed)",
    )
    ca = s["cardinal"]
    t.add_row(
        "Cardinal",
        f"{ca['blocks']} blocks, {ca['updates']} updates, {ca['reorgs']} reorg(s) "
        f"({ca['reverted']} blocks reverted, {ca['reorg_messages']} Reorg messages)",
    )
    sd = s["sds"]
    t.add_row(
        "SDS",
        f"lost message repaired ({sd['repaired']}), {sd['acknowledged']} acknowledged, "
        f"channel {'healthy' if sd['healthy'] else 'repairing'}",
    )
    ar = s["archives"]
    t.add_row(
        "archives",
        f"{ar['archives']} weekly archive built, fetched by the member "
        f"({ar['bytes_downloaded']:,} B), {ar['hydrated']} messages hydrated",
    )
    cl = s.get("cluster")
    if cl is not None:
        held = [name for name, here in cl["leases"].items() if here]
        t.add_row(
            "cluster",
            f"JetStream, meta leader {cl['meta_leader'] or 'unknown'}, "
            f"{cl['partition_streams']} partition streams, {cl['replicas']} replicas; "
            f"leases held here: {', '.join(held) or 'none'}",
        )
    m = s["metrics"]
    t.add_row(
        "/metrics",
        f"{m['loglake_push_records_total']:,.0f} records pushed, "
        f"{m['loglake_pull_records_total']:,.0f} pulled, "
        f"{m['loglake_archive_bytes_total']:,.0f} archive bytes",
    )
    console.print(t)
    console.print(f"console: [bold]{console_url}[/]", soft_wrap=True)  # a URL must stay whole
