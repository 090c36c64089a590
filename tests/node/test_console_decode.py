"""The record browser's decoders: each protocol's stored record comes back as its fields, and a
record of another format is a per-record error naming the codec's reason, never a crash."""

from __future__ import annotations

import base64
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from loglake.archives.layout import LAYOUTS
from loglake.cardinal.codec import encode as cardinal_encode
from loglake.cardinal.messages import Batch, BatchMsg, BatchRecord, Message, Reorg
from loglake.cardinal.transport import envelope
from loglake.events.publisher import stored_event
from loglake.log import open_log
from loglake.node.api.context import NodeContext
from loglake.node.app import create_app
from loglake.node.console.decode import (
    FORMATS,
    MAX_HEX_BYTES,
    ConsoleDecodeError,
    bytes_json,
    decode_many,
    decode_record,
)
from loglake.sds import codec as sds_codec
from loglake.sds.channel import encode_hint
from loglake.sds.messages import HistoryEntry, SdsMessage
from loglake.wire import icrc16

H = bytes(range(32))


def waku_record() -> bytes:
    return LAYOUTS["spec"].make_record(
        payload=b"hello community", topic="/toy/1/chat/proto", timestamp_ns=1_700_000_000 * 10**9
    )


def sds_record() -> bytes:
    return sds_codec.encode(
        SdsMessage(
            sender_id="alice",
            message_id="m2",
            channel_id="room",
            lamport_timestamp=7,
            causal_history=(
                HistoryEntry("m1", b"room:0:1", "bob"),
                HistoryEntry("m0", encode_hint("sds.room", 0, 3), "carol"),
            ),
            bloom_filter=bytes(1024),
            content=b"hi bob",
        )
    )


def cardinal_record(msg: Message) -> bytes:
    return envelope(*cardinal_encode(msg))


def icrc_record() -> bytes:
    data = icrc16.validate({"Map": [("amount", icrc16.nat(42)), ("memo", icrc16.text("rent"))]})
    return stored_event(data, [("icrc72:source", icrc16.text("shop"))], 123_456)


def test_waku_message_fields() -> None:
    out = decode_record("waku", waku_record())
    assert out["type"] == "WakuMessage"
    f = out["fields"]
    assert f["content_topic"] == "/toy/1/chat/proto"
    assert f["payload"]["text"] == "hello community"
    assert f["timestamp"] == 1_700_000_000 * 10**9


def test_status_go_waku_message_fields() -> None:
    rec = LAYOUTS["status-go"].make_record(
        payload=b"p", topic=b"\x01\x02\x03\x04", timestamp_ns=5 * 10**9
    )
    f = decode_record("waku-status-go", rec)["fields"]
    assert f["topic"]["hex"] == "01020304" and f["timestamp"] == 5


def test_sds_message_fields_and_kind() -> None:
    out = decode_record("sds", sds_record())
    assert out["type"] == "SdsMessage (content)"
    f = out["fields"]
    assert (f["sender_id"], f["message_id"], f["lamport_timestamp"]) == ("alice", "m2", 7)
    other, ours = f["causal_history"]
    assert other == {
        "message_id": "m1",
        "retrieval_hint": bytes_json(b"room:0:1"),
        "sender_id": "bob",
    }
    # a loglake retrieval hint also says which stream position it names
    assert ours["hint_points_to"] == {"stream": "sds.room", "partition": 0, "index": 3}
    assert f["content"]["text"] == "hi bob"
    assert f["bloom_filter"]["len"] == 1024 and f["bloom_filter"]["truncated"] is True
    assert len(f["bloom_filter"]["hex"]) == 2 * MAX_HEX_BYTES


def test_cardinal_messages() -> None:
    out = decode_record("cardinal", cardinal_record(BatchMsg(H, "acct/1", b"\x01\x02")))
    assert out["type"] == "BatchMsg"
    assert out["fields"]["key"] == "acct/1" and out["fields"]["hash"]["hex"] == H.hex()
    batch = Batch(H, 12, 2**70, bytes(32), {"acct/": BatchRecord(count=2)})
    f = decode_record("cardinal", cardinal_record(batch))["fields"]
    assert f["number"] == 12 and f["weight"] == 2**70
    assert f["updates"]["acct/"]["count"] == 2
    assert decode_record("cardinal", cardinal_record(Reorg(H, 11)))["type"] == "Reorg"


def test_icrc_event_fields() -> None:
    out = decode_record("icrc", icrc_record())
    assert out["type"] == "ICRC-72 event"
    f = out["fields"]
    assert f["timestamp"] == 123_456
    assert f["data"] == {"Map": [["amount", {"Nat": 42}], ["memo", {"Text": "rent"}]]}
    assert f["headers"] == [["icrc72:source", {"Text": "shop"}]]


@pytest.mark.parametrize("fmt", ["waku", "sds", "cardinal", "icrc"])
def test_a_record_of_another_format_is_a_per_record_error(fmt: str) -> None:
    other = {
        "waku": b"\xff\xff\xff",
        "sds": icrc_record(),
        "cardinal": sds_record(),
        "icrc": b"\x07garbage",
    }[fmt]
    good = {
        "waku": waku_record(),
        "sds": sds_record(),
        "icrc": icrc_record(),
        "cardinal": cardinal_record(Reorg(H, 1)),
    }[fmt]
    ok, bad = decode_many(fmt, [good, other])
    assert ok["ok"] is True
    assert bad["ok"] is False and bad["error"]
    with pytest.raises(ConsoleDecodeError):
        decode_record(fmt, other)


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_bytes_never_crash(fmt: str) -> None:
    rng = random.Random(14)
    seeds = [b"", b"\x00", b"\x01" * 9, icrc_record()[:20], sds_record()[:30]]
    seeds += [rng.randbytes(rng.randrange(64)) for _ in range(300)]
    for data in seeds:
        (out,) = decode_many(fmt, [data])
        assert out["ok"] in (True, False)


def test_bytes_json_shows_text_only_when_printable() -> None:
    assert bytes_json(b"abc") == {"len": 3, "hex": "616263", "text": "abc"}
    assert "text" not in bytes_json(b"\x00\x01")
    assert "text" not in bytes_json(b"\xff")


# -- bounds: one record, one request ---------------------------------------------------------
# the numbers of docs/console.md (decode.RECORD_VALUES, REQUEST_VALUES, MAX_TEXT)
RECORD_VALUES, REQUEST_VALUES, MAX_TEXT = 10_000, 100_000, 4096


def _values(v: object) -> int:
    """JSON values in ``v`` (containers included)."""
    if isinstance(v, list):
        return 1 + sum(_values(x) for x in v)
    if isinstance(v, dict):
        return 1 + sum(_values(x) for x in v.values())
    return 1


def test_a_large_icrc_value_is_cut_where_the_budget_ends() -> None:
    """An array of 20,000 values (40 KB): shown up to the record's budget, then a marker of how
    many are left out (before: all 20,000, about 40,000 JSON values)."""
    (out,) = decode_many("icrc", [stored_event({"Array": [icrc16.nat(0)] * 20_000}, None, 0)])
    assert out["ok"], out
    items = out["fields"]["data"]["Array"]
    assert items[0] == {"Nat": 0} and set(items[-1]) == {"truncated"}
    assert len(items) - 1 + items[-1]["truncated"] == 20_000
    assert _values(out) <= RECORD_VALUES + 100


def test_an_icrc_value_of_too_many_elements_is_refused_before_it_is_built() -> None:
    """200,000 values (400 KB, what anyone may push over the stream service): before, the decode
    built every one (~70 MB for this size; 815 MiB for the reviewer's 4.4 MB record) and the
    reply held them all; now it stops at ``MAX_ELEMENTS``, the reply says why."""
    import tracemalloc

    rec = stored_event({"Array": [{"Array": [icrc16.nat(0)] * 1000}] * 200}, None, 0)
    tracemalloc.start()
    try:
        (out,) = decode_many("icrc", [rec])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not out["ok"] and "too large to show decoded" in out["error"], str(out)[:200]
    assert "view it as hex" in out["error"]
    assert peak < 30 * 2**20, peak


def test_a_request_shows_at_most_its_budget_and_skips_the_rest() -> None:
    rec = stored_event({"Array": [icrc16.nat(0)] * 20_000}, None, 0)
    out = decode_many("icrc", [rec] * 40)
    shown = [r for r in out if r["ok"]]
    skipped = [r for r in out if r.get("skipped")]
    assert len(shown) + len(skipped) == 40 and skipped, [r.get("error") for r in out][:3]
    assert "budget" in skipped[0]["error"]
    assert _values(out) <= REQUEST_VALUES + 40 * 100


def test_long_text_is_cut() -> None:
    long = b"a" * 100_000
    got = bytes_json(long)
    assert got["len"] == 100_000 and got["text"] == "a" * MAX_TEXT and got["text_truncated"]
    assert len(got["hex"]) == 2 * MAX_HEX_BYTES and got["truncated"]
    (out,) = decode_many("icrc", [stored_event(icrc16.text("b" * 100_000), None, 0)])
    assert out["fields"]["data"]["Text"] == "b" * MAX_TEXT + "…"
    # what an honest record shows is unchanged
    assert bytes_json(b"abc") == {"len": 3, "hex": "616263", "text": "abc"}


# -- the route and the static files, through the node's app ---------------------------------


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    log = open_log(tmp_path)
    app = create_app(NodeContext(log=log, data_dir=tmp_path), token="tok")
    try:
        with TestClient(app) as c:
            yield c
    finally:
        log.close()


AUTH = {"Authorization": "Bearer tok"}


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def test_decode_route_needs_the_token(client: TestClient) -> None:
    body = {"format": "sds", "records": [b64(sds_record())]}
    assert client.post("/api/console/decode", json=body).status_code == 401
    r = client.post("/api/console/decode", json=body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"] == "HTTPError"


def test_decode_route_decodes_each_record(client: TestClient) -> None:
    body = {"format": "icrc", "records": [b64(icrc_record()), b64(b"\x09")]}
    r = client.post("/api/console/decode", json=body, headers=AUTH)
    assert r.status_code == 200
    good, bad = r.json()["records"]
    assert good["ok"] and good["type"] == "ICRC-72 event"
    assert good["fields"]["data"]["Map"][0] == ["amount", {"Nat": 42}]
    assert not bad["ok"] and "stored event" in bad["error"]


def test_decode_route_rejects_bad_requests_with_4xx_json(client: TestClient) -> None:
    post = lambda body: client.post("/api/console/decode", json=body, headers=AUTH)  # noqa: E731
    r = post({"format": "protobuf", "records": []})
    assert r.status_code == 422 and r.json()["error"] == "ValidationError"
    r = post({"format": "sds", "records": ["not base64!"]})
    assert r.status_code == 400 and "records[0]" in r.json()["message"]
    r = post({"format": "sds", "records": ["AA=="] * 1001})
    assert r.status_code == 422


def test_decode_route_reply_is_bounded(client: TestClient) -> None:
    """50 records of 20,000 values each (2 MB of base64): before, a 12 MB reply of 2,000,000
    values; now at most the request's budget, the records past it skipped."""
    rec = b64(stored_event({"Array": [icrc16.nat(0)] * 20_000}, None, 0))
    r = client.post(
        "/api/console/decode", json={"format": "icrc", "records": [rec] * 50}, headers=AUTH
    )
    assert r.status_code == 200
    assert len(r.content) < 2 * 2**20, len(r.content)
    rows = r.json()["records"]
    assert len(rows) == 50 and rows[0]["ok"] and not rows[0]["skipped"]
    assert rows[-1]["skipped"] and not rows[-1]["ok"]


def test_console_files_are_served_from_the_package(client: TestClient) -> None:
    r = client.get("/console", follow_redirects=False)
    assert r.status_code in (307, 308) and r.headers["location"] == "/console/"
    page = client.get("/console/")
    assert page.status_code == 200 and '<script type="importmap">' in page.text
    for path in ("js/app.js", "vendor/preact.mjs", "vendor/hooks.mjs", "vendor/htm.mjs"):
        r = client.get(f"/console/{path}")
        assert r.status_code == 200, path
        assert r.headers["content-type"].startswith("text/javascript"), path
    # no asset comes from elsewhere: every import and link in the page is relative
    assert "http" not in page.text.replace("http-equiv", "")
    # and the browser is told so: scripts, styles and calls only from the node itself
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self' 'sha256-" in csp
    assert "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_decode_route_fuzzed_from_its_openapi_never_gives_a_500(tmp_path: Path, mode: str) -> None:
    """schemathesis against the node's own OpenAPI document, this route only: whatever the
    body, the answer is JSON and never a 500 (the node's schemathesis test runs without the
    console)."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    log = open_log(tmp_path)
    try:
        app = create_app(NodeContext(log=log, data_dir=tmp_path), token="tok")
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        [op] = [r.ok() for r in schema.get_all_operations() if r.ok().path == "/api/console/decode"]
        strategy = op.as_strategy(generation_mode=GenerationMode(mode))

        @settings(
            max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=strategy)
        def run(case: schemathesis.Case) -> None:
            case.headers = {**(case.headers or {}), **AUTH}
            response = case.call()
            assert response.status_code < 500, response.text
            assert response.headers["content-type"][0].startswith("application/json")
            if response.status_code >= 400:
                assert {"error", "message", "status"} <= set(response.json())

        run()
    finally:
        log.close()
