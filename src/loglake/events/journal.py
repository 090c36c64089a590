"""The Orchestrator's state journal: publications, subscriptions and replays survive a restart.

Why: ICRC-77 replays run for a long time (a million events is minutes over HTTP) and the
Publisher reports through ``icrc77_replay_status`` until the end; an orchestrator that forgot its
replays on restart would answer 404 to the Publisher and to the Subscriber's status queries. The
ICRC-77 text says nothing about durability; loglake keeps the state the way it keeps its ledger
(``ledger.py``): every state change is one CBOR record appended to the stream
``loglake.events.orchestrator.<name>`` *before* it takes effect, and
:func:`load` rebuilds the state by reading the stream from the start (the log is the source of
truth; the in-memory tables are derived). ICRC-16 configs are stored as their Candid bytes
(``icrc16.encode_map``), so a restored config is byte-for-byte the registered one.

Records (``op`` → fields): ``pub`` (id, ns, publisher, bc, cfg), ``sub`` (id, ns, sub, cfg),
``head`` (ns, head), ``replay`` (id, sub, ns, start, end, cfg, pub, bc, relay, expected, cost,
created), ``status`` (id, tag, value), ``cancel`` (id), ``sent`` (id, sent). Not kept: the
request-rate windows (a restart forgives them) and system-message numbering (rebuilt from the
system namespaces' own streams).

A malformed record raises :class:`JournalError` (a :class:`~loglake.errors.DecodeError`): the
orchestrator refuses to start rather than serve a partial state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cbor2
from icp_principal import Principal

from loglake.errors import DecodeError
from loglake.events.messages import ReplayState
from loglake.log.api import Log
from loglake.wire import icrc16

if TYPE_CHECKING:
    from loglake.events.orchestrator import Orchestrator


class JournalError(DecodeError):
    """A journal record that cannot be applied."""


def stream_name(name: str = "main") -> str:
    return f"loglake.events.orchestrator.{name}"


class Journal:
    def __init__(self, log: Log, name: str = "main") -> None:
        self.log = log
        self.stream = stream_name(name)
        log.create_stream(self.stream)

    def records(self) -> list[dict[str, Any]]:
        out = []
        for rec in self.log.iter_records(self.stream, 0):
            try:
                op = cbor2.loads(rec.data)
            except Exception as e:  # cbor2 raises several types; all mean a bad record
                raise JournalError(f"{self.stream}[{rec.index}]: not CBOR ({e})") from e
            if not isinstance(op, dict) or "op" not in op:
                raise JournalError(f"{self.stream}[{rec.index}]: not a journal record")
            out.append(op)
        return out

    def append(self, op: dict[str, Any], now: int) -> None:
        self.log.append(self.stream, 0, cbor2.dumps(op), timestamp_ns=now)

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
            },
            now,
        )


def load(orch: Orchestrator, journal: Journal) -> None:
    """Apply every journal record to a freshly constructed orchestrator."""
    from loglake.events.filters import parse_replay_config
    from loglake.events.orchestrator import Publication, Replay, Subscription

    for i, op in enumerate(journal.records()):
        try:
            kind = op["op"]
            if kind == "pub":
                pub = Publication(
                    op["id"],
                    op["ns"],
                    Principal(op["publisher"]),
                    Principal(op["bc"]),
                    icrc16.decode_map(op["cfg"]),
                )
                old = orch.publications.get(pub.namespace)
                if old is not None:
                    pub.head = old.head
                orch.configure_publication(pub)
                orch.publications[pub.namespace] = pub
                orch._next_pub = max(orch._next_pub, pub.id + 1)
            elif kind == "sub":
                s = Subscription(
                    op["id"], op["ns"], Principal(op["sub"]), icrc16.decode_map(op["cfg"])
                )
                orch.subscriptions[(s.namespace, s.subscriber.bytes)] = s
                orch._next_sub = max(orch._next_sub, s.id + 1)
            elif kind == "head":
                orch.publications[op["ns"]].head = op["head"]
            elif kind == "replay":
                cfg = icrc16.decode_map(op["cfg"])
                flt, skip = parse_replay_config(cfg)
                rep = Replay(
                    op["id"],
                    Principal(op["sub"]),
                    op["ns"],
                    op["start"],
                    op["end"],
                    cfg,
                    Principal(op["pub"]),
                    Principal(op["bc"]),
                    op["expected"],
                    op["cost"],
                    op["created"],
                    filter=flt,
                    skip=skip,
                    relay=None if op["relay"] is None else Principal(op["relay"]),
                )
                orch.replays[rep.id] = rep
                orch._next_replay = max(orch._next_replay, rep.id + 1)
            elif kind == "status":
                orch.replays[op["id"]].status = ReplayState(op["tag"], op["value"])
            elif kind == "cancel":
                orch.replays[op["id"]].cancel_requested = True
            elif kind == "sent":
                rep = orch.replays[op["id"]]
                rep.sent = max(rep.sent, op["sent"])
            else:
                raise JournalError(f"{journal.stream}[{i}]: unknown op {kind!r}")
        except JournalError:
            raise
        except Exception as e:  # a record of the wrong shape: refuse, name the record
            raise JournalError(f"{journal.stream}[{i}]: cannot apply {op!r:.120}: {e}") from e
