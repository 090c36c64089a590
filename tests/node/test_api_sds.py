"""The node's SDS API (``loglake.node.api.sds``) on an in-process node."""

from __future__ import annotations

from loglake.node.api.sds import SdsHandle
from tests.node.conftest import ApiNode


def test_a_text_already_on_the_channel_is_a_400_not_a_silent_duplicate(api_node: ApiNode) -> None:
    # not started: no background thread; each round (poll, tick) is run here
    handle = api_node.node.sds = SdsHandle(api_node.node, "chat", ("alice", "bob"))
    path = "/api/sds/channels/chat/messages"
    first = api_node.client.post(path, json={"sender": "alice", "text": "ok"})
    assert first.status_code == 201, first.text
    handle.round()  # bob receives it
    for sender in ("bob", "alice"):  # someone else's text; alice's own, once bob acked it
        seen = api_node.client.post(path, json={"sender": "bob", "text": f"seen by {sender}"})
        assert seen.status_code == 201, seen.text
        handle.round()
        r = api_node.client.post(path, json={"sender": sender, "text": "ok"})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "DuplicateContent"
        assert first.json()["message_id"] in r.json()["message"]
