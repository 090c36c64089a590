"""What the API routers see of the running node: the log and the parts' handles.

The runner (``node/runner.py``) builds one ``NodeContext`` and hands it to ``create_app``;
tests build one around a temp log. A part the config leaves off is None, and its routes answer
404 with ``{"error": "PartDisabled"}`` instead of pretending it is empty.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request

from loglake.errors import LoglakeError
from loglake.log import Log

if TYPE_CHECKING:
    from loglake.node.metrics import NodeMetrics


class PartDisabled(LoglakeError):
    """The node runs without the part a route belongs to (its config section is off)."""

    def __init__(self, part: str) -> None:
        super().__init__(f"this node does not run {part} (enable it in the node's config)")
        self.part = part


@dataclass
class NodeContext:
    log: Log
    """The node's log (an instrumented view when metrics are on)."""
    data_dir: Path
    metrics: NodeMetrics | None = None
    stream_address: tuple[str, int] | None = None
    """Where the Ockam stream service listens, if it runs."""
    events: Any = None
    """``node.api.events.EventsHandle`` when ICRC roles run."""
    archives: Any = None
    """``node.api.archives.ArchivesHandle`` when the archives loops run."""
    sds: Any = None
    """``node.api.sds.SdsHandle`` when SDS channels run."""
    jobs: Any = None
    """``node.api.jobs.JobManager`` when Spark jobs are enabled."""
    cluster: Any = None
    """``node.cluster.ClusterView``: leases, the JetStream cluster's health, the sealer's lag."""
    leases: Any = None
    """``node.backend.NodeLeases``: the once-only work this node holds on a shared cluster
    (each part gets its ``fence(name)``; ``view()`` for operators)."""
    keys: Any = None
    """``node.keys.NodeKeys``: where the identities' keys are (the cluster's key bucket on a
    shared cluster); None: files in the data dir."""
    started_ns: int = field(default_factory=time.time_ns)
    parts: dict[str, bool] = field(default_factory=dict)
    """Which parts this node runs (for ``GET /api/node``)."""


def node_of(request: Request) -> NodeContext:
    """FastAPI dependency: the running node."""
    ctx: NodeContext = request.app.state.node
    return ctx


def fence_of(ctx: NodeContext, name: str) -> Any:
    """The part's ``streams.fence.Fence`` for the once-only work ``name`` (``UNFENCED`` when
    the node has no leases: the embedded log, a test's context)."""
    if ctx.leases is None:
        from loglake.streams.fence import UNFENCED

        return UNFENCED
    return ctx.leases.fence(name)


def part(value: Any, name: str) -> Any:
    """``value``, or ``PartDisabled(name)`` (→ 404) when the node does not run it."""
    if value is None:
        raise PartDisabled(name)
    return value


Node = Annotated[NodeContext, Depends(node_of)]
"""A route parameter ``node: Node`` is the running node."""
