"""Fuzz the embedded ICRC-1/2 ledger's restore (``events.ledger.Ledger.restore``): the CBOR
blocks (mint, approve, transfer) an orchestrator replays from ``loglake.ledger.<name>`` on
restart. The input is the ledger's records joined by a separator.

Typed error: ``DecodeError`` (``LedgerBlockError``, naming the block). Until commit 961e4ec the
ledger had none: a bad block escaped as ``cbor2``'s error, ``KeyError`` or ``TypeError`` (22
distinct raising lines in 1,000,000 inputs; three of them kept in
``tests/fuzz/crashes/icrc_ledger``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cbor2

from loglake.errors import DecodeError
from loglake.events.ledger import Ledger
from tests.events.samples import P1, P2
from tests.fuzz import _harness

EXPECTED = (DecodeError,)
INSTRUMENT = ("loglake.events.ledger",)
SEP = b"\xff\xfeBLK"


def one(data: bytes) -> None:
    Ledger().restore(data.split(SEP))


def seeds() -> list[bytes]:
    a, b = [P1.bytes, bytes(32)], [P2.bytes, bytes(32)]
    ops = [
        {"op": "mint", "to": a, "amt": 1000, "ts": 1},
        {"op": "approve", "from": a, "spender": b, "amt": 500, "fee": 10, "ts": 2},
        {"op": "xfer", "from": a, "to": b, "amt": 100, "fee": 10, "ts": 3},
        {"op": "xfer", "from": a, "to": b, "amt": 100, "fee": 10, "spender": b, "ts": 4},
    ]
    return [SEP.join(cbor2.dumps(op) for op in ops[:n]) for n in (1, 2, len(ops))]


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
