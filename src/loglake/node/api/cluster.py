"""``GET /api/cluster``: which node holds which lease, the JetStream cluster's health (meta
leader, each stream's leader and replicas) and the sealer's lag — ``node/cluster.py`` reads it.

A node on the embedded log answers too (``backend: "embedded"``, no leases: every once-only
work runs on it), so a console or a script need not know the backend first. A cluster that does
not answer in time is a 200 with ``reachable: false`` and the reason: the route reports the
cluster's health, and "unreachable" is a health, not an error of the request.
"""

from __future__ import annotations

from fastapi import APIRouter

from loglake.node.api.context import Node
from loglake.node.cluster import ClusterStatus, ClusterView

router = APIRouter(tags=["node"])


@router.get(
    "/cluster",
    response_model=ClusterStatus,
    summary="Leases (who holds each), JetStream cluster health, sealer lag",
)
def cluster_status(node: Node) -> ClusterStatus:
    view = node.cluster
    if view is None:  # a context built without a runner (tests, embedding): its own log only
        view = node.cluster = ClusterView(node.log, None, _NoBackend(), node.data_dir)
    status: ClusterStatus = view.status()
    return status


class _NoBackend:
    """``[streams]`` of a node on the embedded log, for a context built without a config."""

    backend = None
    replicas = 1
    nats_prefix = "loglake"
    nats_monitor = ()
    seal_interval = 60.0
