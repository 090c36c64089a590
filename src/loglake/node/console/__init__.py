"""loglake.node.console — the web console the node serves at ``/console/``.

The console is static files (HTML, CSS, ES modules, vendored front-end libraries under
``static/vendor/``) that ship inside the package, so a node needs no CDN and no network at run
time; the page talks to the node's own JSON API with the bearer token the node printed. The one
piece of server code the console adds is the record decoder (``decode.py``), mounted here as
``/api/console/decode``, because decoding a WakuMessage, SDS, Cardinal or ICRC record needs the
parts' Python codecs.

The files are served with a Content-Security-Policy that lets the page load scripts, styles and
data only from the node itself (the one inline script, the import map, is allowed by its
hash), so even a mistake in the page cannot pull code from elsewhere or send the token away;
and ``frame-ancestors 'none'`` keeps other sites from framing it.
"""

from __future__ import annotations

import mimetypes
import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

from loglake.node.console import routes
from loglake.node.gate import csp_hash

STATIC_DIR = Path(__file__).parent / "static"
CONSOLE_PATH = "/console"
_INLINE_SCRIPT = re.compile(r"<script type=\"importmap\">(.*?)</script>", re.S)


def content_security_policy(index_html: str) -> str:
    """The console's CSP: everything from the node itself; the import map by its sha256."""
    hashes = " ".join(csp_hash(m) for m in _INLINE_SCRIPT.findall(index_html))
    return (
        "default-src 'none'; "
        f"script-src 'self' {hashes}; "
        "style-src 'self' 'unsafe-inline'; "  # style="" attributes (progress bars)
        "img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )


class ConsoleFiles(StaticFiles):
    """``StaticFiles`` with the console's security headers on every answer (``nosniff`` is
    the node's on every answer: ``gate.SecurityHeaders``)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory=directory, html=True)
        self.headers = {
            "Content-Security-Policy": content_security_policy(
                (directory / "index.html").read_text()
            ),
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",  # revalidate (ETag): a new node version, new files
        }

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(self.headers)
        return response


def mount(app: FastAPI) -> None:
    """Serve the console's static files at ``/console/`` on ``app`` (``/console`` redirects
    there, keeping the ``#login=...`` fragment, which the browser never sends)."""
    # ES modules must be served as JavaScript; not every system's mime table knows ``.mjs``.
    mimetypes.add_type("text/javascript", ".mjs")
    mimetypes.add_type("text/javascript", ".js")
    routes.include(app)

    @app.get(CONSOLE_PATH, include_in_schema=False)
    def _console_root() -> RedirectResponse:
        return RedirectResponse(CONSOLE_PATH + "/")

    app.mount(CONSOLE_PATH + "/", ConsoleFiles(STATIC_DIR), name="console")
