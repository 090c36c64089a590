"""Fuzz the Cardinal consumer's checkpoint decoder (``cardinal.ordering.Checkpoint.from_bytes``,
read back by ``cardinal.transport`` from the checkpoint stream on restart).

Typed error: ``CheckpointError`` (a ``DecodeError``). Beyond "no crash": a checkpoint that
decodes writes back to bytes that decode to the same checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.cardinal.blocks import BlockRef
from loglake.cardinal.errors import CheckpointError
from loglake.cardinal.ordering import Checkpoint
from tests.fuzz import _harness

EXPECTED = (CheckpointError,)
INSTRUMENT = ("loglake.cardinal.ordering",)


def one(data: bytes) -> None:
    ckpt = Checkpoint.from_bytes(data)
    assert Checkpoint.from_bytes(ckpt.to_bytes()) == ckpt


def seeds() -> list[bytes]:
    h = [bytes([i]) * 32 for i in range(4)]
    chain = (BlockRef(7, h[1], h[0], 2**255), BlockRef(8, h[2], h[1], 2**255 + 1))
    return [
        Checkpoint().to_bytes(),
        Checkpoint.starting_at(-1, bytes(32), 0).to_bytes(),
        Checkpoint(chain, {"blocks:0": 5, "blocks:1": -1}, ((6, h[0], True),), (h[3],)).to_bytes(),
    ]


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
