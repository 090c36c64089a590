"""``Gate``: what the node's HTTP server checks of a request before anything reads its body.

Why an ASGI middleware and not only the routes' ``require_token`` dependency: FastAPI reads a
request's body (and parses it, when it is JSON) before it runs the route's dependencies, so a
caller without the token could make the node read and parse a body of any size before the
401 (64 MiB read in full, measured; a 100 MiB JSON body took about 512 MiB at its peak). A
``text/plain`` POST is a "simple" cross-origin request: any web page the operator has open
could send one. Here the bearer token is checked from the headers alone, and a body past
``max_body`` bytes (``OPEN_MAX_BODY`` on a path that needs no token) is refused (413) from its
``Content-Length``, or as it arrives. The dependency stays on the routes: it is what the
OpenAPI document shows, and it guards an app served without this gate.

The bytes are counted as they arrive whatever the headers say, and a request with both
``Content-Length`` and ``Transfer-Encoding`` is refused (400, as RFC 9112 §6.3 allows: such a
message "ought to be handled as an error"; it is the shape of request smuggling). Found from
outside: with both, the gate checked only the ``Content-Length`` (5) and stopped counting while
h11 framed the body by its chunks, so 256 MiB were read whole by ``/console/login`` (open, no
token), the node grew to ~1 GiB, and its 422 echoed the whole input back.

``allowed_hosts``: on a loopback address the node answers only requests addressed to it by a
loopback name (the ``Host`` header), so a web page that rebinds its own DNS name to 127.0.0.1
cannot read what needs no token (``/metrics`` when public, the console's files).

``SecurityHeaders``: the one place that puts ``X-Content-Type-Options: nosniff`` on every answer
of the node's HTTP server, and ``Content-Security-Policy: API_CSP`` on every answer that brings
no policy of its own. Only the pages do (the console's files, ``/docs``): each allows what it
needs by its own content (``csp_hash``). Why on the JSON too: a browser that is sent a JSON
answer (an error that echoes a caller's text, a record's data) as a page must neither sniff it
into HTML nor run or load anything for it, nor let another site frame it.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from loglake.node.auth import UNAUTHORIZED, token_matches

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY = 32 * 1024 * 1024
"""The largest request body the API takes: its largest request is a publish of 1,000 texts of
4,096 characters (at most ~25 MB of JSON); a record browser's decode sends one page of a range
read (4 MiB of records, base64)."""

OPEN_MAX_BODY = 64 * 1024
"""The largest body of a request on a path that needs no token: only ``POST /console/login``
takes one (a code of at most 200 characters). Why: without the token, a caller could make the
node read and parse 32 MiB of JSON (found from outside: ``{"code": [0, 0, ...]}`` took ~2 s
of ``json.loads`` on the event loop the stream service shares, before the 422)."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")

API_CSP = "default-src 'none'; frame-ancestors 'none'"
"""The policy of every answer that is not a page (JSON, ``/metrics``, redirects, errors):
nothing may load or run, no site may frame it."""


def csp_hash(inline: str) -> str:
    """The CSP source that allows one inline ``<script>`` or ``<style>`` by its content
    (CSP Level 3, "hash-source": base64 of the SHA-256 of the element's text, UTF-8)."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode() + "'"


class SecurityHeaders:
    """``nosniff`` on every HTTP answer of ``app``, ``API_CSP`` where it set no policy.

    Wrapped around the whole app (``app.NodeApp``), outside Starlette's error middleware, so
    the 500 it answers for an unexpected exception has them too, as do the ``Gate``'s
    refusals."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["X-Content-Type-Options"] = "nosniff"
                headers.setdefault("Content-Security-Policy", API_CSP)
            await send(message)

        await self.app(scope, receive, send_secured)


def _json(status: int, kind: str, message: str, **headers: str) -> JSONResponse:
    """The node's error body (``app.error_body``'s shape)."""
    return JSONResponse({"error": kind, "message": message, "status": status}, status, headers)


class Gate:
    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        guarded: Callable[[str], bool],
        max_body: int = MAX_BODY,
        open_max_body: int = OPEN_MAX_BODY,
        allowed_hosts: Iterable[str] | None = None,
    ) -> None:
        self.app = app
        self.token = token
        self.guarded = guarded
        """Whether a path needs the token (``/api/…``, and ``/metrics`` unless public)."""
        self.max_body = max_body
        self.open_max_body = open_max_body
        self.allowed_hosts = None if allowed_hosts is None else frozenset(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        limit = self.max_body if self.guarded(scope["path"]) else self.open_max_body
        refusal = self._refusal(scope["path"], headers, limit)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, self._counted(receive, limit), send)

    def _refusal(self, path: str, headers: dict[bytes, bytes], limit: int) -> JSONResponse | None:
        if self.allowed_hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1").lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host and name not in self.allowed_hosts:  # (no Host: not a browser's request)
                return _json(421, "MisdirectedRequest", f"this node does not serve host {host!r}")
        if self.token is not None and self.guarded(path):
            scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not token_matches(given.strip(), self.token):
                return _json(401, "HTTPError", UNAUTHORIZED, **{"WWW-Authenticate": "Bearer"})
        length = headers.get(b"content-length")
        if length is not None and b"transfer-encoding" in headers:
            return _json(
                400, "HTTPError", "a request with both Content-Length and Transfer-Encoding"
            )
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return _json(400, "HTTPError", "Content-Length is not a number")
            if n > limit:
                return _json(413, "HTTPError", f"request body of {n} bytes: at most {limit}")
        return None

    def _counted(self, receive: Receive, limit: int) -> Receive:
        """``receive`` that refuses a body once the bytes that arrived pass ``limit``: the
        route reading it gets a 413. Counted whatever the headers declared: what h11 frames
        the body by is what counts."""
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"request body past {limit} bytes")
            return message

        return counted
