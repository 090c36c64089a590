"""A driver for the reference implementation, @waku/sds, through interop/node/sds_peer.mjs.

The Node script keeps @waku/sds ``MessageChannel`` objects and answers one JSON line per request
(stdin/stdout). Tests use it to run JS ↔ Python exchanges, and ``benchmarks/sds.py`` to time
@waku/sds beside loglake in the same run. Needs Node 18+ and ``npm install`` in interop/node
(``make node-deps``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from loglake.sds.errors import SdsError

NODE_DIR = Path(__file__).resolve().parents[2] / "interop" / "node"
SCRIPT = NODE_DIR / "sds_peer.mjs"


class ReferenceUnavailable(SdsError):
    """Node or the installed @waku/sds package is missing."""


class ReferenceError_(SdsError):
    """The Node peer answered a request with an error."""


def available() -> bool:
    return (
        shutil.which("node") is not None
        and SCRIPT.exists()
        and (NODE_DIR / "node_modules" / "@waku" / "sds" / "package.json").exists()
    )


class JsSdsPeer:
    """One ``node sds_peer.mjs`` process; ``close()`` (or ``with``) stops it."""

    def __init__(self) -> None:
        if not available():
            raise ReferenceUnavailable("node or interop/node/node_modules/@waku/sds is missing")
        self.proc = subprocess.Popen(
            ["node", str(SCRIPT)],
            cwd=NODE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )

    def call(self, cmd: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise ReferenceError_(f"node peer exited (code {self.proc.poll()})")
        out = json.loads(line)
        if not out.pop("ok"):
            raise ReferenceError_(out.get("error", "unknown error"))
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> JsSdsPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
