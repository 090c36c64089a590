"""What the node checks before a request's body is read (``node/gate.py``): the token, the
body's size and, on a loopback address, the ``Host`` it was sent to."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from loglake.log import open_log
from loglake.node.api.context import NodeContext
from loglake.node.app import create_app
from loglake.node.config import load_config
from loglake.node.gate import MAX_BODY
from loglake.node.runner import BackgroundNode
from tests.streams.test_hostile_clients import closed_by_server

MiB = 1 << 20
QUIET = {"http": {"port": 0}, "streams": {"enabled": False}}
"""A node on a free HTTP port, without the stream service (its default port 4000 would be
taken by any other test node running beside)."""


@pytest.fixture
def app(tmp_path: Path) -> Any:
    log = open_log(tmp_path)
    yield create_app(NodeContext(log=log, data_dir=tmp_path), token="secret", console=True)
    log.close()


def asgi_post(app: Any, path: str, headers: list[tuple[bytes, bytes]], chunks: int) -> tuple:
    """POST ``chunks`` MiB to ``app`` through ASGI; returns (status, bytes the app took)."""
    taken, sent = 0, []

    async def run() -> None:
        left = chunks

        async def receive() -> dict:
            nonlocal taken, left
            if left == 0:
                return {"type": "http.disconnect"}
            left -= 1
            taken += MiB
            return {"type": "http.request", "body": b" " * MiB, "more_body": left > 0}

        async def send(message: dict) -> None:
            sent.append(message)

        await app(
            {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": path,
                "raw_path": path.encode(),
                "root_path": "",
                "query_string": b"",
                "headers": [(b"host", b"127.0.0.1:8080"), *headers],
                "client": ("127.0.0.1", 5555),
                "server": ("127.0.0.1", 8080),
                "state": {},
            },
            receive,
            send,
        )

    asyncio.run(run())
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), taken


def test_a_request_without_the_token_is_refused_before_its_body_is_read(app: Any) -> None:
    # The routes' token check is a FastAPI dependency, which runs after the body was read
    # (and parsed, for JSON): 64 MiB were read of a caller with no token, and a malformed
    # JSON body got a 422, not a 401. A text/plain POST needs no CORS preflight: any web page
    # the operator has open could send one.
    plain = [(b"content-type", b"text/plain"), (b"content-length", str(64 * MiB).encode())]
    assert asgi_post(app, "/api/console/decode", plain, 64) == (401, 0)
    chunked = [(b"content-type", b"text/plain"), (b"transfer-encoding", b"chunked")]
    assert asgi_post(app, "/api/streams", chunked, 64) == (401, 0)
    with TestClient(app) as anon:
        r = anon.post(
            "/api/console/decode", content=b"{", headers={"content-type": "application/json"}
        )
        assert (r.status_code, r.json()["error"]) == (401, "HTTPError")
        assert r.headers["www-authenticate"] == "Bearer"
        assert anon.get("/metrics").status_code == 401
        assert anon.get("/openapi.json").status_code == 200  # open, as before
        assert anon.get("/console/").status_code == 200


def test_a_body_past_the_limit_is_refused_with_or_without_its_length(app: Any) -> None:
    auth = (b"authorization", b"Bearer secret")
    big = str(MAX_BODY + 1).encode()
    status, taken = asgi_post(
        app, "/api/console/decode", [auth, (b"content-length", big)], MAX_BODY // MiB + 1
    )
    assert (status, taken) == (413, 0)
    status, taken = asgi_post(
        app, "/api/console/decode", [auth, (b"content-type", b"application/json")], 40
    )
    assert status == 413 and taken <= MAX_BODY + MiB
    with TestClient(app, headers={"Authorization": "Bearer secret"}) as c:
        ok = c.post("/api/console/decode", json={"format": "sds", "records": []})
        assert ok.status_code == 200, ok.text


def test_a_loopback_node_answers_only_its_own_host_names(tmp_path: Path) -> None:
    # DNS rebinding: a page whose name the attacker re-points at 127.0.0.1 is same-origin with
    # the node for the browser; only its Host header gives it away. It read /metrics (public
    # here) and the console's files; now the node answers 421.
    cfg = load_config(
        data={
            "data_dir": str(tmp_path),
            "http": {"port": 0, "metrics_public": True},
            "streams": {"port": 0},
        },
        env={},
    )
    with BackgroundNode(cfg, say=lambda _: None) as node, httpx.Client(timeout=30) as c:
        port = node.url.rsplit(":", 1)[1]
        url = f"{node.url}/metrics"
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
            assert c.get(url, headers={"Host": host}).status_code == 200, host
        for host in (f"rebind.attacker.example:{port}", "rebind.attacker.example"):
            r = c.get(url, headers={"Host": host})
            assert (r.status_code, r.json()["error"]) == (421, "MisdirectedRequest"), host
        assert c.get(f"{node.url}/console/", headers={"Host": "evil:1"}).status_code == 421


def test_a_request_head_that_does_not_come_is_dropped(tmp_path: Path, monkeypatch) -> None:
    # uvicorn times nothing but the wait between requests (and stops at the next byte): a
    # client that connected and sent nothing, or half a request's headers, was held for good,
    # with no token needed (20 such sockets all still open 8 s on).
    from loglake.node import http_protocol

    monkeypatch.setattr(http_protocol, "HEAD_TIMEOUT", 0.5)
    cfg = load_config(data={"data_dir": str(tmp_path), **QUIET}, env={})
    with BackgroundNode(cfg, say=lambda _: None) as node:
        port = int(node.url.rsplit(":", 1)[1])
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        for s in slow[:5]:
            s.sendall(b"GET /api/node HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
        t = time.monotonic()
        assert all(closed_by_server(s, 5) for s in slow)
        assert time.monotonic() - t < 3
        with httpx.Client(timeout=30) as c:  # a request that comes whole is served
            r = c.get(
                f"{node.url}/api/node", headers={"Authorization": f"Bearer {node.node.token.value}"}
            )
            assert r.status_code == 200, r.text


def test_connections_past_the_cap_are_dropped_as_they_come(tmp_path: Path, monkeypatch) -> None:
    from loglake.node import http_protocol

    monkeypatch.setattr(http_protocol, "MAX_CONNECTIONS", 4)
    cfg = load_config(data={"data_dir": str(tmp_path), **QUIET}, env={})
    with BackgroundNode(cfg, say=lambda _: None) as node:
        port = int(node.url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        extra = socket.create_connection(("127.0.0.1", port))
        assert closed_by_server(extra, 5)
        assert not any(closed_by_server(s, 0.2) for s in held)
        for s in (*held, extra):
            s.close()


def directives(csp: str) -> dict[str, list[str]]:
    """A Content-Security-Policy header as ``{directive: [sources]}``."""
    parts = (d.split() for d in csp.split(";") if d.strip())
    return {d[0]: d[1:] for d in parts}


def test_every_answer_says_nosniff_and_a_policy_for_its_kind(tmp_path: Path) -> None:
    # /docs and the JSON answers had neither header (only the console's files did): a JSON
    # answer opened as a page could be sniffed into HTML, and any site could frame /docs
    cfg = load_config(data={"data_dir": str(tmp_path), **QUIET}, env={})
    with BackgroundNode(cfg, say=lambda _: None) as node, httpx.Client(timeout=30) as c:
        url, auth = node.url, {"Authorization": f"Bearer {node.token}"}
        answers = {
            "json": c.get(f"{url}/api/node", headers=auth),
            "token refused by the gate": c.get(f"{url}/api/streams"),
            "unknown stream": c.get(f"{url}/api/streams/nope", headers=auth),
            "invalid body": c.post(f"{url}/api/streams", json={"partitions": "x"}, headers=auth),
            "other host": c.get(f"{url}/api/node", headers={**auth, "Host": "evil.example"}),
            "no such path": c.get(f"{url}/nope"),
            "openapi": c.get(f"{url}/openapi.json"),
            "metrics": c.get(f"{url}/metrics", headers=auth),
            "redirect": c.get(f"{url}/"),
        }
        statuses = {name: r.status_code for name, r in answers.items()}
        assert statuses == {
            "json": 200,
            "token refused by the gate": 401,
            "unknown stream": 404,
            "invalid body": 422,
            "other host": 421,
            "no such path": 404,
            "openapi": 200,
            "metrics": 200,
            "redirect": 307,
        }
        for name, r in answers.items():
            assert r.headers.get("x-content-type-options") == "nosniff", name
            assert directives(r.headers.get("content-security-policy", "")) == {
                "default-src": ["'none'"],
                "frame-ancestors": ["'none'"],
            }, name

        docs = c.get(f"{url}/docs")
        assert docs.status_code == 200 and docs.headers["x-content-type-options"] == "nosniff"
        policy = directives(docs.headers["content-security-policy"])
        # the page's one inline <style>, by its hash (CSP3 hash-source), and nothing else
        (style,) = re.findall(r"<style>(.*?)</style>", docs.text, re.S)
        digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
        assert policy == {
            "default-src": ["'none'"],
            "style-src": [f"'sha256-{digest}'"],
            "base-uri": ["'none'"],
            "form-action": ["'none'"],
            "frame-ancestors": ["'none'"],
        }
        assert "<script" not in docs.text and "://" not in docs.text  # nothing from elsewhere

        console = c.get(f"{url}/console/")  # the console keeps its own policy
        assert console.headers["x-content-type-options"] == "nosniff"
        assert "script-src 'self' 'sha256-" in console.headers["content-security-policy"]


def test_an_unexpected_error_is_answered_with_the_headers_too(app: Any) -> None:
    # Starlette answers a 500 from outside the middleware added with add_middleware
    async def boom() -> None:
        raise RuntimeError("unexpected")

    app.add_api_route("/boom", boom)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/boom")
    assert (r.status_code, r.json()["error"]) == (500, "InternalError")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-security-policy"] == "default-src 'none'; frame-ancestors 'none'"


def raw_answer(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as bytes and read the answer until the server closes: (status,
    headers with lower-case names, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = (line.split(":", 1) for line in lines)
    return int(status_line.split()[1]), {k.strip().lower(): v.strip() for k, v in fields}, body


@pytest.mark.parametrize(
    "request_",
    [
        b"NOT A REQUEST LINE\r\n\r\n",  # bad request line
        b"GET /api/node HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n",  # bad header
        b"GET /api/node HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n",
        b"GET /api/node HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
    ],
)
def test_the_servers_own_400_says_nosniff_and_the_api_policy(tmp_path: Path, request_) -> None:
    # A request h11 cannot parse is answered by uvicorn itself (h11_impl.send_400_response),
    # outside the app and its SecurityHeaders: that 400 carried neither header.
    cfg = load_config(data={"data_dir": str(tmp_path), **QUIET}, env={})
    with BackgroundNode(cfg, say=lambda _: None) as node:
        status, headers, body = raw_answer(int(node.url.rsplit(":", 1)[1]), request_)
    assert status == 400 and body == b"Invalid HTTP request received.", (status, body)
    assert headers.get("x-content-type-options") == "nosniff", headers
    assert directives(headers.get("content-security-policy", "")) == {
        "default-src": ["'none'"],
        "frame-ancestors": ["'none'"],
    }, headers
