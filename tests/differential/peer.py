"""One long-lived Node process holding the reference codecs (``interop/node/diff_peer.mjs``).

Why one process and batches: a differential fuzzer compares thousands of cases; starting Node
per case costs ~50 ms, a JSON line with a batch of a thousand costs a few. Each command takes a
list of items and answers a list of results in the same order.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

NODE_DIR = Path(__file__).resolve().parents[2] / "interop" / "node"
SCRIPT = NODE_DIR / "diff_peer.mjs"
PACKAGES = ("@waku/sds", "@bare-ts/lib", "protons-runtime")


def available() -> bool:
    """Node and the reference packages are installed (``make node-deps``)."""
    return shutil.which("node") is not None and all(
        (NODE_DIR / "node_modules" / p / "package.json").exists() for p in PACKAGES
    )


class PeerError(RuntimeError):
    """The Node peer exited or answered a command with an error (not a per-item result)."""


class DiffPeer:
    """``node diff_peer.mjs``; ``call(cmd, items)`` returns one result per item."""

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
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, "items": items}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise PeerError(f"node diff peer exited (code {self.proc.poll()})")
        out = json.loads(line)
        if not out.pop("ok"):
            raise PeerError(out.get("error", "unknown error"))
        return out["out"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> DiffPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
