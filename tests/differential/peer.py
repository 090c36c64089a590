"""The one Python client of loglake's one Node peer (``interop/node/diff_peer.mjs``), which
holds the reference implementations: @waku/sds (codec, bloom filter, channels), @bare-ts/lib
(stream service payloads) and @dfinity/candid (ICRC-72/77 Candid). The differential fuzzers,
the SDS and BARE interop tests and the benchmarks all drive Node through it.

Why one long-lived process: starting Node costs ~50 ms; a JSON line costs a few. Codec commands
take a batch (``call``: a list of items, a list of results in the same order), so a fuzzer's
thousand cases are one round trip; SDS channel commands are one request each (``request``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

NODE_DIR = Path(__file__).resolve().parents[2] / "interop" / "node"
SCRIPT = NODE_DIR / "diff_peer.mjs"
PACKAGES = ("@waku/sds", "@bare-ts/lib", "protons-runtime", "@dfinity/candid")


def available() -> bool:
    """Node and the reference packages are installed (``make node-deps``)."""
    return shutil.which("node") is not None and all(
        (NODE_DIR / "node_modules" / p / "package.json").exists() for p in PACKAGES
    )


class PeerError(RuntimeError):
    """The Node peer exited or answered a command with an error (not a per-item result)."""


class NodePeer:
    """``node diff_peer.mjs``; ``call(cmd, items)`` returns one result per item, ``request(cmd,
    **fields)`` the answer's fields; ``close()`` (or ``with``) stops it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["node", str(SCRIPT)],
            cwd=NODE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )

    def call(self, cmd: str, items: list[Any]) -> list[Any]:
        """A batch command: one result per item, in order."""
        return self.request(cmd, items=items)["out"]

    def request(self, cmd: str, **fields: Any) -> dict[str, Any]:
        """One command with its fields; the answer without its ``ok``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise PeerError(f"node peer exited (code {self.proc.poll()})")
        out = json.loads(line)
        if not out.pop("ok"):
            raise PeerError(out.get("error", "unknown error"))
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

    def __enter__(self) -> NodePeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


DiffPeer = NodePeer
"""The name the differential fuzzers use."""
