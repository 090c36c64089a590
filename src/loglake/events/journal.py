"""The Orchestrator's state journal: publications, subscriptions and replays survive a restart.

Why: ICRC-77 replays run for a long time (a million events is minutes over HTTP) and the
Publisher reports through ``icrc77_replay_status`` until the end; an orchestrator that forgot its
replays on restart would answer 404 to the Publisher and to the Subscriber's status queries. The
ICRC-77 text says nothing about durability; loglake keeps the state the way it keeps its ledger
(``ledger.py``): every state change is one CBOR record appended to the stream
``loglake.events.orchestrator.<name>`` *before* it takes effect — the core queues a
:class:`~loglake.events.actions.JournalWrite` and its adapter performs it before anything queued
after it leaves the process — and ``Orchestrator.restore`` rebuilds the state from the stream's
records (read by ``store.open_orchestrator``; the log is the source of truth, the in-memory
tables are derived). This module knows record shapes only: it imports no core and no I/O.
ICRC-16 configs are stored as their Candid bytes (``icrc16.encode_map``), so a restored config
is byte-for-byte the registered one.

Records (``op`` → fields): ``pub`` (id, ns, publisher, bc, cfg), ``sub`` (id, ns, sub, cfg),
``head`` (ns, head), ``replay`` (id, sub, ns, start, end, cfg, pub, bc, relay, expected, cost,
created), ``status`` (id, tag, value), ``cancel`` (id), ``sent`` (id, sent), and ``lease``
(name, holder, token: a node on a shared cluster taking the journal's writing over,
``streams.fence.claim_record``; it carries no state and restores to nothing). Not kept: the
request-rate windows (a restart forgives them) and system-message numbering (rebuilt from the
system namespaces' own streams).

A malformed record raises :class:`JournalError` (a :class:`~loglake.errors.DecodeError`): the
orchestrator refuses to start rather than serve a partial state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import cbor2

from loglake.errors import DecodeError
from loglake.events.actions import Action, JournalWrite
from loglake.wire import icrc16

LEASE_OP = "lease"
"""The op of a lease claim (``streams.fence.CLAIM_OP``, spelled here so the core imports no
adapter): a record with no state in it."""


class JournalError(DecodeError):
    """A journal record that cannot be applied."""


def stream_name(name: str = "main") -> str:
    return f"loglake.events.orchestrator.{name}"


def decode_records(stream: str, records: Iterable[tuple[int, bytes]]) -> list[dict[str, Any]]:
    """The journal's records, in order; :class:`JournalError` names the first bad one."""
    out = []
    for index, data in records:
        try:
            op = cbor2.loads(data)
        except Exception as e:  # cbor2 raises several types; all mean a bad record
            raise JournalError(f"{stream}[{index}]: not CBOR ({e})") from e
        if not isinstance(op, dict) or "op" not in op:
            raise JournalError(f"{stream}[{index}]: not a journal record")
        out.append(op)
    return out


class Journal:
    """Turns state changes into :class:`JournalWrite` actions on ``outbox`` (no I/O here)."""

    def __init__(self, outbox: list[Action], name: str = "main") -> None:
        self.outbox = outbox
        self.stream = stream_name(name)

    def append(self, op: dict[str, Any], now: int) -> None:
        self.outbox.append(JournalWrite(self.stream, cbor2.dumps(op)))

    # -- record builders (field names are the stored format) ---------------------------------
    def publication(self, pub: Any, now: int) -> None:
        self.append(
            {
                "op": "pub",
                "id": pub.id,
                "ns": pub.namespace,
                "publisher": pub.publisher.bytes,
                "bc": pub.broadcaster.bytes,
                "cfg": icrc16.encode_map(pub.config),
            },
            now,
        )

    def subscription(self, sub: Any, now: int) -> None:
        self.append(
            {
                "op": "sub",
                "id": sub.id,
                "ns": sub.namespace,
                "sub": sub.subscriber.bytes,
                "cfg": icrc16.encode_map(sub.config),
            },
            now,
        )

    def replay(self, rep: Any, now: int) -> None:
        self.append(
            {
                "op": "replay",
                "id": rep.id,
                "sub": rep.subscriber.bytes,
                "ns": rep.namespace,
                "start": rep.start,
                "end": rep.end,
                "cfg": icrc16.encode_map(rep.config),
                "pub": rep.publisher.bytes,
                "bc": rep.broadcaster.bytes,
                "relay": None if rep.relay is None else rep.relay.bytes,
                "expected": rep.expected,
                "cost": rep.cost,
                "created": rep.created,
                "job": rep.job,
            },
            now,
        )
