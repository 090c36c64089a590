"""SDS (Scalable Data Sync) and SDS-R for loglake, byte-compatible with @waku/sds 0.0.8.

Spec: specs/sds-scalable-data-sync.txt. Layout (STYLE.md): ``messages`` (dataclasses), ``codec``
(bytes ↔ messages), ``bloom`` (the filter), ``history`` (the local log), ``repair`` (SDS-R),
``events``, ``participant`` (the sans-I/O state machine), ``channel`` (binding to loglake
streams), ``chat`` / ``cli`` (the demo), ``sim`` (the simulator), ``reference`` (a driver for
@waku/sds used by tests and benchmarks).

What a user needs is exported here: ``SdsChannel`` (one participant on a loglake stream: the
I/O), the sans-I/O ``Participant`` it drives, and the events both return.
"""

from loglake.sds.channel import SdsChannel, decode_hint, encode_hint
from loglake.sds.errors import DropReason, SdsDecodeError, SdsError, SdsLocalError
from loglake.sds.events import (
    EphemeralReceived,
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageDropped,
    MessagePossiblyAcknowledged,
    MessageSent,
    MessagesLost,
    MessagesMissing,
    Outgoing,
    Output,
    RepairRequestQueued,
    RepairRequestReceived,
    RepairRequestSent,
    RepairResponseQueued,
    RepairResponseSent,
    SyncReceived,
    SyncSent,
)
from loglake.sds.messages import HistoryEntry, MessageKind, SdsMessage, message_id_of
from loglake.sds.participant import Participant, ParticipantOptions
from loglake.sds.repair import RepairConfig

__all__ = [
    "DropReason",
    "EphemeralReceived",
    "Event",
    "HistoryEntry",
    "MessageAcknowledged",
    "MessageDelivered",
    "MessageDropped",
    "MessageKind",
    "MessagePossiblyAcknowledged",
    "MessageSent",
    "MessagesLost",
    "MessagesMissing",
    "Outgoing",
    "Output",
    "Participant",
    "ParticipantOptions",
    "RepairConfig",
    "RepairRequestQueued",
    "RepairRequestReceived",
    "RepairRequestSent",
    "RepairResponseQueued",
    "RepairResponseSent",
    "SdsChannel",
    "SdsDecodeError",
    "SdsError",
    "SdsLocalError",
    "SdsMessage",
    "SyncReceived",
    "SyncSent",
    "decode_hint",
    "encode_hint",
    "message_id_of",
]
