"""loglake.wire — byte formats shared by the parts: BARE, Ockam routing/TCP, ICRC-16, protobuf.

The parts import the module of the format they use (``loglake.wire.bare``, ``…varint``, …). The
pipeline reaches the other parts only through their faces, so what it uses of this one is named
here: ``value_offsets`` (Arrow's columnar layout is a byte format too), imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loglake.faces import lazy_face

if TYPE_CHECKING:
    from loglake.wire.arrow_offsets import value_offsets

_FACE = {"value_offsets": "loglake.wire.arrow_offsets"}

__getattr__, __dir__ = lazy_face(__name__, _FACE)

__all__ = ["value_offsets"]
