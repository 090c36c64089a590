"""The node's SDS API (``loglake.node.api.sds``) on an in-process node."""

from __future__ import annotations

from loglake.node.api.sds import SdsHandle
from tests.node.conftest import ApiNode


def test_a_text_said_again_is_a_message_of_its_own_and_shown_as_text(api_node: ApiNode) -> None:
    # not started: no background thread; each round (poll, tick) is run here
    handle = api_node.node.sds = SdsHandle(api_node.node, "chat", ("alice", "bob"))
    path = "/api/sds/channels/chat/messages"
    ids = []
    for sender in ("alice", "bob", "alice"):  # someone else's text again; one's own again
        r = api_node.client.post(path, json={"sender": sender, "text": "ok"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["message_id"])
        handle.round()
    assert len(set(ids)) == 3  # before the envelope: one id, and the repeats dropped by peers
    detail = api_node.client.get("/api/sds/channels/chat").json()
    for state in detail["participant_states"]:
        other = {"alice": "bob", "bob": "alice"}[state["id"]]
        seen = [(m["sender"], m["text"]) for m in state["recent"]]
        expected = [(s, "ok") for s in ("alice", "bob", "alice") if s == other]
        assert seen == expected, state
