"""The node's sds routes (filled in as the node runs the part)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["sds"])
