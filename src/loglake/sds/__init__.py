"""SDS (Scalable Data Sync) and SDS-R for loglake, byte-compatible with @waku/sds 0.0.8.

Spec: specs/sds-scalable-data-sync.txt. Layout (STYLE.md): ``messages`` (dataclasses), ``codec``
(bytes ↔ messages), ``bloom`` (the filter), ``history`` (the local log), ``repair`` (SDS-R),
``events``, ``participant`` (the sans-I/O state machine), ``channel`` (binding to loglake
streams), ``chat`` / ``cli`` (the demo), ``sim`` (the simulator), ``reference`` (a driver for
@waku/sds used by tests and benchmarks).
"""

from loglake.sds.events import Outgoing, Output
from loglake.sds.messages import HistoryEntry, MessageKind, SdsMessage, message_id_of
from loglake.sds.participant import Participant, ParticipantOptions
from loglake.sds.repair import RepairConfig

__all__ = [
    "HistoryEntry",
    "MessageKind",
    "Outgoing",
    "Output",
    "Participant",
    "ParticipantOptions",
    "RepairConfig",
    "SdsMessage",
    "message_id_of",
]
