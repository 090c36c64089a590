"""``GET /api/node``: what this node is and runs (version, parts, addresses, uptime)."""

from __future__ import annotations

import time

from fastapi import APIRouter
from pydantic import BaseModel

from loglake import __version__
from loglake.node.api.context import Node

router = APIRouter(tags=["node"])


class NodeInfo(BaseModel):
    version: str
    data_dir: str
    started_ns: int
    uptime_s: float
    now_ns: int
    """The node's clock, so a client computes rates from two readings without its own."""
    stream_service: str | None
    """``host:port`` of the Ockam stream service (TCP), if it runs."""
    parts: dict[str, bool]
    metrics: bool


@router.get("/node", response_model=NodeInfo, summary="This node: version, parts, uptime")
def node_info(node: Node) -> NodeInfo:
    now = time.time_ns()
    addr = node.stream_address
    return NodeInfo(
        version=__version__,
        data_dir=str(node.data_dir),
        started_ns=node.started_ns,
        uptime_s=(now - node.started_ns) / 1e9,
        now_ns=now,
        stream_service=f"{addr[0]}:{addr[1]}" if addr else None,
        parts=node.parts,
        metrics=node.metrics is not None,
    )
