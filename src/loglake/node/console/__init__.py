"""loglake.node.console — the web console the node serves at ``/console/``.

The console is static files (HTML, CSS, ES modules, vendored front-end libraries under
``static/vendor/``) that ship inside the package, so a node needs no CDN and no network at run
time; the page talks to the node's own JSON API with the bearer token the node printed. The one
piece of server code the console adds is the record decoder (``decode.py``), mounted here as
``/api/console/decode``, because decoding a WakuMessage, SDS, Cardinal or ICRC record needs the
parts' Python codecs.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from loglake.node.console import routes

STATIC_DIR = Path(__file__).parent / "static"
CONSOLE_PATH = "/console"


def mount(app: FastAPI) -> None:
    """Serve the console's static files at ``/console/`` on ``app`` (``/console`` redirects
    there, keeping the ``#token=...`` fragment, which the browser never sends)."""
    # ES modules must be served as JavaScript; not every system's mime table knows ``.mjs``.
    mimetypes.add_type("text/javascript", ".mjs")
    mimetypes.add_type("text/javascript", ".js")
    routes.include(app)

    @app.get(CONSOLE_PATH, include_in_schema=False)
    def _console_root() -> RedirectResponse:
        return RedirectResponse(CONSOLE_PATH + "/")

    app.mount(CONSOLE_PATH + "/", StaticFiles(directory=STATIC_DIR, html=True), name="console")
