"""ICRC roles split across two nodes (``[events] transport = "http"``): node A runs the
orchestrator and broadcaster, node B the publisher and subscriber; they find each other through
one directory file, as ``loglake events serve`` processes do."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from loglake.events import Identity
from loglake.events.publisher import stored_event
from loglake.node.config import ConfigError, load_config
from loglake.node.runner import BackgroundNode
from loglake.streams.client import StreamClient
from loglake.wire import icrc16
from tests.procs import free_consecutive_ports
from tests.waiting import wait_until


def _keys(data_dir: Path, roles: list[str]) -> dict[str, Identity]:
    """Keys made before the nodes start, so the directory can name every principal."""
    (data_dir / "events").mkdir(parents=True)
    out = {}
    for r in roles:
        ident = Identity.generate()
        (data_dir / "events" / f"{r}.key").write_text(ident.seed.hex())
        (data_dir / "events" / f"{r}.key").chmod(0o600)
        out[r] = ident
    return out


def _client(node: BackgroundNode) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {node.token}"})


def _events(data_dir: Path, **events: object) -> dict:
    return {
        "data_dir": str(data_dir),
        "console": False,
        "http": {"port": 0},
        "streams": {"enabled": False},
        "events": {"enabled": True, "transport": "http", **events},
    }


@pytest.mark.slow
def test_roles_split_over_two_nodes_publish_deliver_and_replay(tmp_path: Path) -> None:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    keys = {
        **_keys(a_dir, ["orchestrator", "broadcaster"]),
        **_keys(b_dir, ["publisher", "subscriber"]),
    }
    a_port, b_port = free_consecutive_ports(2), free_consecutive_ports(2)
    while b_port in range(a_port - 1, a_port + 2):
        b_port = free_consecutive_ports(2)
    urls = {
        "orchestrator": f"http://127.0.0.1:{a_port}",
        "broadcaster": f"http://127.0.0.1:{a_port + 1}",
        "publisher": f"http://127.0.0.1:{b_port}",
        "subscriber": f"http://127.0.0.1:{b_port + 1}",
    }
    directory = tmp_path / "directory.json"
    directory.write_text(json.dumps({keys[r].principal.to_str(): u for r, u in urls.items()}))
    orch = keys["orchestrator"].principal.to_str()
    cfg_a = load_config(
        data=_events(
            a_dir, roles=["orchestrator", "broadcaster"], http_port=a_port, directory=str(directory)
        ),
        env={},
    )
    cfg_b = load_config(
        data=_events(
            b_dir,
            roles=["publisher", "subscriber"],
            http_port=b_port,
            directory=str(directory),
            orchestrator=orch,
            namespaces=["split.ns"],
        ),
        env={},
    )
    with BackgroundNode(cfg_a) as a, BackgroundNode(cfg_b) as b, _client(a) as ca, _client(b) as cb:
        assert cb.get("/api/events").json()["urls"] == {
            "publisher": urls["publisher"],
            "subscriber": urls["subscriber"],
        }
        wait_until(
            lambda: (
                [n["namespace"] for n in ca.get("/api/events/namespaces").json()] == ["split.ns"]
            )
        )
        early = cb.post("/api/events/namespaces/split.ns/events", json={"texts": ["0", "1", "2"]})
        assert early.json()["ids"] == [0, 1, 2]
        assert (
            cb.post("/api/events/subscriptions", json={"namespace": "split.ns"}).status_code == 201
        )
        assert cb.post("/api/events/namespaces/split.ns/events", json={"texts": ["3", "4"]}).json()[
            "ids"
        ] == [3, 4]
        wait_until(lambda: cb.get("/api/events").json()["received"].get("split.ns") == 2)
        rid = cb.post(
            "/api/events/replays", json={"namespace": "split.ns", "start": 0, "end": 3}
        ).json()["id"]
        wait_until(lambda: ca.get(f"/api/events/replays/{rid}").json()["status"] == "completed")
        wait_until(lambda: cb.get("/api/events").json()["received"].get("split.ns") == 5)
        # B runs no orchestrator: its tables are not here
        r = cb.get("/api/events/replays")
        assert r.status_code == 404 and r.json()["error"] == "PartDisabled"
        r = cb.post(f"/api/events/replays/{rid}/cancel")
        assert r.status_code == 400 and "CannotCancel" in r.json()["message"]


@pytest.mark.slow
def test_replay_of_events_pushed_past_the_publisher_expects_the_range(tmp_path: Path) -> None:
    """Events pushed to the namespace's stream over the stream service (an import), stored as
    the Publisher stores them: the Publisher reads its stream's head every second and reports
    it, so the orchestrator prices and bounds a replay of them (before, its head stayed 0: a
    range past it was refused... or, earlier still, delivered unpriced)."""
    ns, pushed = "bulk.ns", 20_000
    data = _events(
        tmp_path,
        roles=["orchestrator", "broadcaster", "publisher", "subscriber"],
        namespaces=[ns],
    )
    data["streams"] = {"enabled": True, "port": 0}
    cfg = load_config(data=data, env={})
    with BackgroundNode(cfg, say=lambda _: None) as n, _client(n) as c:
        wait_until(lambda: [x["namespace"] for x in c.get("/api/events/namespaces").json()] == [ns])
        address = n.context.stream_address
        assert address is not None
        event = stored_event(icrc16.text("imported"), None, time.time_ns())
        with StreamClient(address[0], address[1]) as client:
            client.create_stream(ns)
            for _ in range(0, pushed, 5000):
                client.push_many(ns, [event] * 5000)
        assert c.post("/api/events/subscriptions", json={"namespace": ns}).status_code == 201
        wait_until(
            lambda: (
                {r["namespace"]: r["head"] for r in c.get("/api/events/namespaces").json()}
                == {ns: pushed}
            ),
            what="the orchestrator told the imported events' head",
        )
        posted = c.post("/api/events/replays", json={"namespace": ns, "start": 0, "end": pushed})
        assert posted.status_code == 201, posted.text
        rid = posted.json()["id"]
        first = c.get(f"/api/events/replays/{rid}").json()
        assert first["status"] in ("pending", "running"), first
        assert first["expected"] == pushed, first
        running = wait_until(
            lambda: (r := c.get(f"/api/events/replays/{rid}").json())["sent"] > 0 and r,
            what="the replay sending",
        )
        if running["status"] != "completed":
            assert running["expected"] == pushed and running["sent"] <= pushed, running
        c.post(f"/api/events/replays/{rid}/cancel")  # no need to run it through


def test_http_transport_config_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[events\] orchestrator: the principal"):
        load_config(data=_events(tmp_path, roles=["publisher"]), env={})
    with pytest.raises(ConfigError, match=r"\[events\] orchestrator: "):
        load_config(
            data=_events(tmp_path, roles=["publisher"], orchestrator="not-a-principal"), env={}
        )
    with pytest.raises(ConfigError, match=r"\[events\] broadcasters: the orchestrator needs"):
        load_config(data=_events(tmp_path, roles=["orchestrator"]), env={})


def test_a_system_message_to_an_unlisted_principal_is_dropped_and_counted(tmp_path: Path) -> None:
    """A key no directory lists registers a publication at the node's orchestrator: the
    orchestrator's message telling it its broadcaster has nowhere to go. It is dropped at the
    first failure and counted in ``/metrics`` (it was sent again every 10 s for good)."""
    from loglake.events import HttpEventsClient, Ok, Registration
    from tests.node.test_node_process import _metric

    data = _events(tmp_path, roles=["orchestrator", "broadcaster", "publisher", "subscriber"])
    cfg = load_config(data=data, env={})
    with BackgroundNode(cfg, say=lambda _: None) as n, _client(n) as c:
        url = c.get("/api/events").json()["urls"]["orchestrator"]
        stranger = HttpEventsClient(url, Identity.generate(), timeout=30)
        [got] = stranger.call("icrc72_register_publication", [Registration("stranger.ns")])
        assert isinstance(got, Ok), got
        wait_until(
            lambda: (
                _metric(c.get("/metrics").text, "loglake_events_system_messages_dropped_total") == 1
            ),
            what="the message to the stranger dropped",
        )
        time.sleep(1.5)  # its first resends were due after 0.1, 0.2, 0.4, 0.8 s
        assert _metric(c.get("/metrics").text, "loglake_events_system_messages_dropped_total") == 1
