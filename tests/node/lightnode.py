"""A ``loglake node`` process with the stream service and the HTTP API on free loopback ports
and nothing else configured: what the console's browser tests feed over the stream service,
as anyone can feed it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.procs import free_port, process


@dataclass
class LightNode:
    url: str
    token: str
    streams_port: int


@contextmanager
def light_node(base: Path) -> Iterator[LightNode]:
    """The node, its data dir and config under ``base``, stopped at the end."""
    http, streams = free_port(), free_port()
    cfg = base / "loglake.toml"
    cfg.write_text(
        f'data_dir = "{base / "data"}"\n[http]\nport = {http}\n[streams]\nport = {streams}\n'
    )
    cmd = [sys.executable, "-m", "loglake.cli", "node", "--config", str(cfg)]
    with process(cmd, http, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        token = (base / "data" / "node.token").read_text().strip()
        yield LightNode(f"http://127.0.0.1:{http}", token, streams)
