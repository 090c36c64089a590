"""ICRC roles split across two nodes (``[events] transport = "http"``): node A runs the
orchestrator and broadcaster, node B the publisher and subscriber; they find each other through
one directory file, as ``loglake events serve`` processes do."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from loglake.events import Identity
from loglake.node.config import ConfigError, load_config
from loglake.node.runner import BackgroundNode
from tests.procs import free_port
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
    a_port, b_port = free_port(), free_port()
    while b_port in range(a_port - 1, a_port + 2):
        b_port = free_port()
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


def test_http_transport_config_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[events\] orchestrator: the principal"):
        load_config(data=_events(tmp_path, roles=["publisher"]), env={})
    with pytest.raises(ConfigError, match=r"\[events\] orchestrator: "):
        load_config(
            data=_events(tmp_path, roles=["publisher"], orchestrator="not-a-principal"), env={}
        )
    with pytest.raises(ConfigError, match=r"\[events\] broadcasters: the orchestrator needs"):
        load_config(data=_events(tmp_path, roles=["orchestrator"]), env={})
