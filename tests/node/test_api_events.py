"""ICRC-72/77 through the node's API with the default in-process transport, against a real node
(``BackgroundNode``: the HTTP API, the stream service and the roles' pump thread).

What issue 14's console needs from it: a replay registered through the API runs apart from the
call (the POST answers while it is pending), reads answer while it runs and show it moving,
and a cancel stops it part way. And a replay's ``expected`` counts the events in its range on
the namespace's stream, also those that reached the stream without the node's publisher (an
import pushed over the stream service), not only those the publisher published.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loglake.events.publisher import stored_event
from loglake.node.config import load_config
from loglake.node.runner import BackgroundNode
from loglake.streams.client import StreamClient
from loglake.wire import icrc16
from tests.waiting import wait_until

BULK = "shop.bulk"
SMALL = "shop.small"
BULK_EVENTS = 40_000
REPLAY_RATE = 2_000
"""The node's ``[events] replay_rate``: the replay of BULK_EVENTS is held under way for 20 s by
the publisher's pacing, however fast this machine replays (tens of thousands a second unpaced),
so it is seen pending, then running, then cancelled, never completed first."""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackgroundNode, httpx.Client]]:
    data: Path = tmp_path_factory.mktemp("node")
    cfg = load_config(
        data={
            "data_dir": str(data),
            "console": False,
            "http": {"port": 0},
            "streams": {"enabled": True, "port": 0},
            # transport: inprocess
            "events": {"enabled": True, "namespaces": [BULK, SMALL], "replay_rate": REPLAY_RATE},
        },
        env={},
    )
    with (
        BackgroundNode(cfg, say=lambda _: None) as n,
        httpx.Client(
            base_url=f"{n.url}/api", headers={"Authorization": f"Bearer {n.token}"}, timeout=60
        ) as api,
    ):
        yield n, api


def _replay(api: httpx.Client, rid: int) -> dict[str, Any]:
    r = api.get(f"/events/replays/{rid}")
    assert r.status_code == 200, r.text
    row: dict[str, Any] = r.json()
    return row


@pytest.mark.slow
def test_a_replay_runs_in_the_background_is_watched_and_cancelled(
    node: tuple[BackgroundNode, httpx.Client],
) -> None:
    n, api = node
    assert api.post("/events/subscriptions", json={"namespace": BULK}).status_code == 201
    # a history imported over the stream service, stored the way the Publisher stores events
    # (the publisher never published these: it reads its stream's head every second and
    # reports it, and the orchestrator prices and bounds replays by it)
    address = n.context.stream_address
    assert address is not None
    event = stored_event(icrc16.text("bulk payment"), None, time.time_ns())
    with StreamClient(address[0], address[1]) as client:
        client.create_stream(BULK)  # the Publisher makes it on its first event; none yet
        for _ in range(0, BULK_EVENTS, 5000):
            client.push_many(BULK, [event] * 5000)
    wait_until(
        lambda: (
            {r["namespace"]: r["head"] for r in api.get("/events/namespaces").json()}.get(BULK)
            == BULK_EVENTS
        ),
        what="the imported events' head told to the orchestrator",
    )

    posted = api.post("/events/replays", json={"namespace": BULK, "start": 0, "end": BULK_EVENTS})
    assert posted.status_code == 201, posted.text
    rid = posted.json()["id"]
    # the POST answered before the replay ran through
    first = _replay(api, rid)
    assert first["status"] in ("pending", "running"), first
    assert first["expected"] == BULK_EVENTS, first
    assert first["sent"] < first["expected"], first

    # reads answer while it runs, and show it moving
    running = wait_until(
        lambda: (r := _replay(api, rid))["status"] == "running" and r["sent"] > 0 and r,
        what="the replay running with events sent",
    )
    later = wait_until(
        lambda: (r := _replay(api, rid))["sent"] > running["sent"] and r,
        what="the replay's sent count growing",
    )
    assert later["status"] == "running" and later["sent"] < BULK_EVENTS, later
    assert 0 < later["progress"] < 1, later
    listed = api.get("/events/replays", params={"status": "running"}).json()
    assert [r["id"] for r in listed] == [rid]

    # cancel mid-way: accepted, then the publisher stops and the replay turns canceled
    cancel = api.post(f"/events/replays/{rid}/cancel")
    assert cancel.status_code == 200, cancel.text
    final = wait_until(
        lambda: (r := _replay(api, rid))["status"] == "canceled" and r, what="replay canceled"
    )
    assert final["cancel_requested"] is True
    assert later["sent"] <= final["sent"] < BULK_EVENTS, final
    assert final["status_value"] == str(final["sent"])
    # canceled is final: a second cancel is refused with the ICRC error
    again = api.post(f"/events/replays/{rid}/cancel")
    assert again.status_code == 400 and again.json()["error"] == "EventsCallFailed", again.text
    # the subscriber got what was sent (delivery ends before the publisher reports canceled)
    received = wait_until(
        lambda: (g := api.get("/events").json()["received"].get(BULK, 0)) >= final["sent"] and g,
        what="the sent events delivered",
    )
    assert received == final["sent"]
    # once completed, a replay of imported events still says how many it sent of how many
    posted = api.post("/events/replays", json={"namespace": BULK, "start": 0, "end": 10})
    small = posted.json()["id"]
    done = wait_until(
        lambda: (r := _replay(api, small))["status"] == "completed" and r, what="replay completed"
    )
    assert done["expected"] == done["sent"] == 10 and done["progress"] == 1.0, done


def test_publish_then_replay_counts_what_the_range_holds(
    node: tuple[BackgroundNode, httpx.Client],
) -> None:
    _, api = node
    publish = f"/events/namespaces/{SMALL}/events"
    missed = api.post(publish, json={"texts": [f"e{i}" for i in range(10)]}).json()["ids"]
    assert missed == list(range(10))
    assert api.post("/events/subscriptions", json={"namespace": SMALL}).status_code == 201
    ids = api.post(publish, json={"texts": [f"e{i}" for i in range(10, 15)]}).json()["ids"]
    assert ids == list(range(10, 15))
    # the publish answered once the orchestrator knew the new head
    heads = {r["namespace"]: r["head"] for r in api.get("/events/namespaces").json()}
    assert heads[SMALL] == 15

    # [3, 8): five events; an open end: [12, head) at registration, three
    bounded = api.post("/events/replays", json={"namespace": SMALL, "start": 3, "end": 8})
    open_ended = api.post("/events/replays", json={"namespace": SMALL, "start": 12})
    past_head = api.post("/events/replays", json={"namespace": SMALL, "start": 14, "end": 100})
    for resp, want in ((bounded, 5), (open_ended, 3)):
        assert resp.status_code == 201, resp.text
        rid: int = resp.json()["id"]

        def completed(rid: int = rid) -> dict[str, Any] | None:
            r = _replay(api, rid)
            return r if r["status"] == "completed" else None

        row = wait_until(completed, what=f"replay {rid} completed")
        assert row is not None
        assert row["expected"] == row["sent"] == want, row
        assert row["progress"] == 1.0
    # a range past the end is invalid (ICRC-77: the orchestrator validates range bounds)
    assert past_head.status_code == 400, past_head.text
    assert "ImproperConfig: range [14, 100) is past the end" in past_head.json()["message"]
    # 5 live (10..14) and 3..7 replayed; 12..14 again are duplicates the subscriber drops
    wait_until(
        lambda: api.get("/events").json()["received"].get(SMALL, 0) == 10,
        what="live and replayed events delivered",
    )


def test_unknown_replay_and_unregistered_namespace_are_typed_errors(
    node: tuple[BackgroundNode, httpx.Client],
) -> None:
    _, api = node
    assert api.get("/events/replays/999999").status_code == 404
    assert api.post("/events/replays/999999/cancel").json()["error"] == "UnknownReplay"
    r = api.post("/events/namespaces/nobody.here/events", json={"texts": ["x"]})
    assert r.status_code == 400 and r.json()["error"] == "LocalProtocolError", r.text
