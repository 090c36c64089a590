"""Fuzz the ICRC-77 orchestrator's journal (``events.journal.decode_records`` and
``Orchestrator.restore``): the CBOR records an orchestrator replays on restart to rebuild its
publications, subscriptions, heads and replays.

The input is the journal's records joined by a separator. Typed error: ``JournalError`` (a
``DecodeError``): a bad record refuses the start, naming the record. Beyond "no crash": a
journal that restores yields an orchestrator whose replays all answer a status query.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cbor2
from icp_principal import Principal

from loglake.events.journal import JournalError
from loglake.events.orchestrator import Orchestrator
from loglake.wire import icrc16
from tests.events.samples import CONFIG, P1, P2
from tests.fuzz import _harness

EXPECTED = (JournalError,)
INSTRUMENT = (
    "loglake.events.journal",
    "loglake.events.orchestrator",
    "loglake.events.orchestrator_state",
    "loglake.events.filters",
)
SEP = b"\xff\xfeREC"
SELF = Principal(bytes(range(1, 11)))


def one(data: bytes) -> None:
    records = list(enumerate(data.split(SEP)))
    orch = Orchestrator(SELF, [P2])
    orch.restore(records)
    for r in orch.replays.values():
        r.to_status()


def seeds() -> list[bytes]:
    cfg = icrc16.encode_map(CONFIG)
    ops = [
        {
            "op": "pub",
            "id": 0,
            "ns": "com.example.ns",
            "publisher": P1.bytes,
            "bc": P2.bytes,
            "cfg": cfg,
        },
        {
            "op": "sub",
            "id": 0,
            "ns": "com.example.ns",
            "sub": P2.bytes,
            "cfg": icrc16.encode_map([]),
        },
        {"op": "head", "ns": "com.example.ns", "head": 42},
        {
            "op": "replay",
            "id": 0,
            "sub": P2.bytes,
            "ns": "com.example.ns",
            "start": 0,
            "end": 40,
            "cfg": cfg,
            "pub": P1.bytes,
            "bc": P2.bytes,
            "relay": None,
            "expected": 40,
            "cost": 400,
            "created": 1_700_000_000,
            "job": False,
        },
        {"op": "status", "id": 0, "tag": "running", "value": None},
        {"op": "sent", "id": 0, "sent": 12},
        {"op": "job", "id": 0, "output": "/tmp/out", "selected": 3},
        {"op": "cancel", "id": 0},
        {"op": "status", "id": 0, "tag": "canceled", "value": 12},
    ]
    recs = [cbor2.dumps(op) for op in ops]
    return [SEP.join(recs[:n]) for n in (1, 4, 6, len(recs))]


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
