"""``create_app(node)``: the node's HTTP API (FastAPI), its OpenAPI document and the console.

Why one factory: the runner, the tests and the benchmark all serve the same app around a
``NodeContext``; what differs is only which parts the context carries. Every route under
``/api`` needs the bearer token (``node/auth.py``); ``/openapi.json`` describes the API without
data and stays open, and ``/docs`` lists it as a plain page rendered here (FastAPI's Swagger UI
loads its assets from a CDN, which a node on a closed network cannot reach); ``/`` leads to the
console (or to ``/docs`` without one); ``/metrics``
(``node/metrics.py``) needs the token unless the node is started with ``metrics_public``.
Errors are always JSON, ``{"error": <type>, "message": <text>, "status": <code>}``: a caller's
mistake is 4xx, never a 500 (docs/node.md lists them).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

from loglake import __version__
from loglake.errors import DecodeError, LocalProtocolError, LoglakeError, Unavailable
from loglake.log import (
    InvalidStreamName,
    LogClosed,
    ReadOnlyLog,
    StorageFailed,
    StreamExists,
    UnknownPartition,
    UnknownStream,
)
from loglake.node.api.context import NodeContext, PartDisabled
from loglake.node.api.streams import DAMAGED
from loglake.node.auth import LoginCodes, require_token
from loglake.node.gate import Gate, SecurityHeaders, csp_hash
from loglake.structured_logging import log_event

_logger = logging.getLogger(__name__)

NOT_FOUND: tuple[type[BaseException], ...] = (UnknownStream, UnknownPartition, PartDisabled)
CONFLICT: tuple[type[BaseException], ...] = (StreamExists, ReadOnlyLog)
BAD_REQUEST: tuple[type[BaseException], ...] = (
    InvalidStreamName,
    LocalProtocolError,
    DecodeError,
    ValueError,
)
UNAVAILABLE: tuple[type[BaseException], ...] = (StorageFailed, LogClosed, Unavailable)
"""503: retry later (or elsewhere): a failed disk, a cluster without quorum, work another
node holds the lease of."""


def error_body(kind: str, message: str, status: int, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": kind, "message": message, "status": status, **extra}, status)


def status_of(e: BaseException) -> int:
    """The HTTP status a typed loglake error maps to (whose fault it is)."""
    if isinstance(e, KeyError):  # the parts' "no such thing" errors (UnknownStream, ...)
        return 404
    for classes, status in (
        # damage on disk (``api.streams.DAMAGED``), named: not the caller's fault
        # (``CorruptStore`` is a ``DecodeError``, which was a 400), not cured by a retry
        (DAMAGED, 500),
        (NOT_FOUND, 404),
        (CONFLICT, 409),
        (UNAVAILABLE, 503),
        (BAD_REQUEST, 400),
    ):
        if isinstance(e, classes):
            return status
    return 500


class NodeApp(FastAPI):
    """``FastAPI`` with ``gate.SecurityHeaders`` around its whole middleware stack: a
    middleware added the usual way (``add_middleware``) runs inside Starlette's error
    middleware, whose 500 answers would go out without the headers."""

    _openapi_bytes: tuple[dict[str, Any], bytes] | None = None

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())

    def setup(self) -> None:
        """FastAPI's routes, with ``/openapi.json`` answered from ``openapi_json``."""
        url, self.openapi_url = self.openapi_url, None
        try:
            super().setup()
        finally:
            self.openapi_url = url
        if url:
            self.add_route(url, self._openapi_route, include_in_schema=False)

    def openapi_json(self) -> bytes:
        """The OpenAPI document as FastAPI's ``/openapi.json`` answers it (``JSONResponse``'s
        bytes), serialized once for each document FastAPI builds (it builds one again when
        the routes change). Why: it is open (no token), 44 KB, and ``json.dumps`` took ~2 ms
        of the event loop the stream service shares at every request; found from outside,
        pipelined requests for it from 512 connections kept the node's CPU at 40-100%."""
        schema = self.openapi()
        if self._openapi_bytes is None or self._openapi_bytes[0] is not schema:
            self._openapi_bytes = (schema, JSONResponse(schema).body)
        return self._openapi_bytes[1]

    async def _openapi_route(self, request: Request) -> Response:
        if request.scope.get("root_path", "").rstrip("/") and self.root_path_in_servers:
            return await _fastapi_openapi(self, request)  # (a document naming its root path)
        return Response(self.openapi_json(), media_type="application/json")


async def _fastapi_openapi(app: FastAPI, request: Request) -> Response:
    """FastAPI's own ``/openapi.json`` answer (a server mounted under a root path)."""
    root_path = request.scope.get("root_path", "").rstrip("/")
    schema = app.openapi()
    server_urls = {s.get("url") for s in schema.get("servers", [])}
    if root_path not in server_urls:
        schema = dict(schema)
        schema["servers"] = [{"url": root_path}, *schema.get("servers", [])]
    return JSONResponse(schema)


def create_app(
    node: NodeContext,
    *,
    token: str | None,
    console: bool = True,
    metrics_public: bool = False,
    allowed_hosts: Iterable[str] | None = None,
    logins: LoginCodes | None = None,
) -> FastAPI:
    """The node's ASGI app. ``token`` None turns authentication off (embedding, benchmarks);
    ``console`` False leaves the web console out (``loglake.node.console``, built apart);
    ``allowed_hosts``: the ``Host`` names it answers (None: any; ``node/gate.py``);
    ``logins``: the one-time codes of the console links the node prints."""
    from loglake.node.api import archives, cluster, events, jobs, sds, streams, system

    app = NodeApp(
        title="loglake node",
        version=__version__,
        description="The HTTP API of a loglake node: streams, consumers, ICRC-72/77 replays, "
        "Status archives, SDS channels and Spark jobs. Every /api route needs "
        "`Authorization: Bearer <token>` (the token is in <data dir>/node.token).",
        openapi_url="/openapi.json",
        docs_url=None,  # FastAPI's Swagger UI page loads its assets from a CDN: off
        redoc_url=None,
    )
    app.state.node = node
    app.state.token = token
    app.state.logins = logins
    auth = [Depends(require_token)]
    for module in (system, cluster, streams, events, archives, sds, jobs):
        app.include_router(module.router, prefix="/api", dependencies=auth)
    if node.metrics is not None:
        from loglake.node.metrics import metrics_route

        app.add_api_route(
            "/metrics",
            metrics_route(node.metrics),
            methods=["GET"],
            include_in_schema=False,
            dependencies=[] if metrics_public else auth,
        )
    app.add_middleware(
        Gate,
        token=token,
        guarded=lambda path: (
            path == "/api"
            or path.startswith("/api/")
            or (path == "/metrics" and not metrics_public)
        ),
        allowed_hosts=allowed_hosts,
    )
    _install_error_handlers(app)
    if console:
        _mount_console(app)
    _add_front_pages(app, console=console)
    return app


def _add_front_pages(app: FastAPI, *, console: bool) -> None:
    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/console/" if console else "/docs")

    page: list[Any] = [None, b""]  # the document it was rendered from, the page

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        spec = app.openapi()
        if page[0] is not spec:  # rendered once for each document (as ``openapi_json``)
            page[:] = [spec, api_docs_html(spec)]
        return HTMLResponse(page[1], headers={"Content-Security-Policy": DOCS_CSP})


DOCS_STYLE = (
    "body{font-family:sans-serif;margin:2em}td{padding:2px 8px;border-bottom:1px solid #ddd}"
)
"""The ``/docs`` page's one inline style sheet (allowed by its hash in ``DOCS_CSP``)."""
DOCS_CSP = (
    f"default-src 'none'; style-src {csp_hash(DOCS_STYLE)}; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""``/docs`` is one page with no script and no asset (not Swagger UI: it loads its own from a
CDN): its style sheet, and nothing else."""


def api_docs_html(spec: dict[str, Any]) -> str:
    """The OpenAPI document as one self-contained page: every route, its summary and its
    parameters, with a link to the JSON for tools. Served with ``DOCS_CSP``."""
    rows = []
    for path, methods in sorted(spec.get("paths", {}).items()):
        for method, op in methods.items():
            params = ", ".join(p["name"] for p in op.get("parameters", ()))
            rows.append(
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>"
                .format(*(html.escape(x) for x in (method.upper(), path, params,
                                                   op.get("summary", ""))))
            )  # fmt: skip
    info = spec.get("info", {})
    return (
        "<!doctype html><meta charset=utf-8><title>{t} API</title>"
        "<style>{style}</style><h1>{t} {v}</h1><p>{d}</p>"
        '<p>Machine-readable: <a href="/openapi.json">/openapi.json</a>.</p>'
        "<table><tr><th>method</th><th>path</th><th>parameters</th><th>summary</th></tr>"
        "{rows}</table>"
    ).format(
        t=html.escape(info.get("title", "")),
        v=html.escape(info.get("version", "")),
        d=html.escape(info.get("description", "")),
        rows="".join(rows),
        style=DOCS_STYLE,
    )


def _mount_console(app: FastAPI) -> None:
    try:
        from loglake.node.console import mount as mount_console
    except ImportError as e:  # a missing or broken console is a plain message, not a traceback
        raise LoglakeError(
            f"the web console (loglake.node.console) is not available: {e}; start the node "
            "with console = false to run without it"
        ) from e
    mount_console(app)


MAX_DETAILS = 20
"""Validation errors listed in a 422's ``detail`` (the message says how many there were)."""
MAX_DETAIL_CHARS = 100
"""The most characters of a caller's value a 422 quotes back (``input``, ``ctx``)."""


def validation_details(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """A 422's ``detail``: each error's ``type``, ``loc`` and ``msg``, with the value it refused
    (``input``) only when it is a scalar, a string cut at ``MAX_DETAIL_CHARS``.

    Why not FastAPI's list: each of its errors holds the caller's whole value, and
    ``jsonable_encoder`` walked it on the event loop the stream service shares. Found from
    outside: one unauthenticated 32 MiB JSON body (``{"code": [0, 0, ...]}`` to
    ``/console/login``) froze the node's loop ~26 s, and a 2 MB body got a 2 MB answer."""
    out = []
    for e in errors[:MAX_DETAILS]:
        d: dict[str, Any] = {
            "type": str(e.get("type", "")),
            "loc": [x if isinstance(x, int | str) else str(x) for x in e.get("loc", ())],
            "msg": _cut(str(e.get("msg", ""))),
        }
        if _is_scalar(value := e.get("input")):
            d["input"] = _brief(value)
        if isinstance(ctx := e.get("ctx"), dict):  # the rule's bounds (max_length, pattern…)
            d["ctx"] = {str(k): _brief(v) for k, v in list(ctx.items())[:5]}
        out.append(d)
    return out


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool | float) or _small_int(value)


def _small_int(value: Any) -> bool:
    return isinstance(value, int) and abs(value) < 2**64


def _brief(value: Any) -> Any:
    """A scalar as it is (a string cut at ``MAX_DETAIL_CHARS``); anything else as a cut
    ``str`` (an exception in ``ctx``)."""
    if isinstance(value, str):
        return _cut(value)
    if _is_scalar(value):
        return value
    return _cut(str(value) if isinstance(value, BaseException) else type(value).__name__)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS] + "…"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        response = error_body("HTTPError", str(e.detail), e.status_code)
        for k, v in (e.headers or {}).items():
            response.headers[k] = v
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        raw = e.errors()
        errors = validation_details(raw)
        first = errors[0] if errors else {}
        where = ".".join(str(x) for x in first.get("loc", ()))
        message = f"{where}: {first.get('msg', 'invalid request')}" if first else "invalid"
        if len(raw) > 1:
            message += f" (and {len(raw) - 1} more)"
        return error_body("ValidationError", message, 422, detail=errors)

    @app.exception_handler(LoglakeError)
    async def typed(request: Request, e: LoglakeError) -> JSONResponse:
        status = status_of(e)
        if status == 500:
            log_event(_logger, logging.ERROR, "API error", path=request.url.path, error=repr(e))
        return error_body(type(e).__name__, str(e), status)

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, e: ValueError) -> JSONResponse:
        return error_body(type(e).__name__, str(e), 400)

    @app.exception_handler(OSError)
    async def os_error(request: Request, e: OSError) -> JSONResponse:
        # the node's resources (files, disk space, descriptors), not the request: try later
        log_event(_logger, logging.ERROR, "API OS error", path=request.url.path, error=repr(e))
        return error_body("StorageUnavailable", f"{type(e).__name__}: {e}", 503)

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> JSONResponse:
        _logger.exception("API internal error on %s", request.url.path)
        return error_body("InternalError", f"{type(e).__name__}: {e}", 500)
