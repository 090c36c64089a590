"""What a ``Participant`` reports, one frozen dataclass per kind of happening.

The set mirrors @waku/sds 0.0.8's ``MessageChannelEvent`` (``src/message_channel/events.ts``)
plus ``MessageDropped`` (a typed reason for every message not processed) and
``EphemeralReceived`` (@waku/sds only logs received ephemeral messages). Bytes to broadcast are
not events: they come back in ``Output.to_send``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loglake.sds.errors import DropReason
from loglake.sds.messages import HistoryEntry, MessageKind


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Bytes the caller must broadcast on the channel."""

    data: bytes
    message_id: str
    kind: MessageKind
    reason: str = "send"  # send | resend | sync | repair | ephemeral


@dataclass(frozen=True, slots=True)
class MessageSent:  # OutMessageSent
    message_id: str
    lamport_timestamp: int


@dataclass(frozen=True, slots=True)
class SyncSent:  # OutSyncSent
    message_id: str
    lamport_timestamp: int


@dataclass(frozen=True, slots=True)
class MessageDelivered:  # InMessageDelivered
    message_id: str
    sender_id: str
    lamport_timestamp: int
    content: bytes
    retrieval_hint: bytes | None


@dataclass(frozen=True, slots=True)
class EphemeralReceived:
    message_id: str
    sender_id: str
    content: bytes


@dataclass(frozen=True, slots=True)
class SyncReceived:  # InSyncReceived
    message_id: str
    sender_id: str


@dataclass(frozen=True, slots=True)
class MessageAcknowledged:  # OutMessageAcknowledged
    message_id: str
    by_bloom_filter: bool = False


@dataclass(frozen=True, slots=True)
class MessagePossiblyAcknowledged:  # OutMessagePossiblyAcknowledged
    message_id: str
    count: int


@dataclass(frozen=True, slots=True)
class MessagesMissing:  # InMessageMissing
    entries: tuple[HistoryEntry, ...]


@dataclass(frozen=True, slots=True)
class MessagesLost:  # InMessageLost ("irretrievably lost")
    entries: tuple[HistoryEntry, ...]


@dataclass(frozen=True, slots=True)
class RepairRequestQueued:
    message_id: str
    t_req: int


@dataclass(frozen=True, slots=True)
class RepairRequestSent:
    message_ids: tuple[str, ...]
    carrier_message_id: str


@dataclass(frozen=True, slots=True)
class RepairRequestReceived:
    message_ids: tuple[str, ...]
    from_sender_id: str


@dataclass(frozen=True, slots=True)
class RepairResponseQueued:
    message_id: str
    t_resp: int


@dataclass(frozen=True, slots=True)
class RepairResponseSent:
    message_id: str


@dataclass(frozen=True, slots=True)
class MessageDropped:
    """A received message was not processed; the participant's state is unchanged."""

    reason: DropReason
    detail: str
    message_id: str | None = None


Event = (
    MessageSent
    | SyncSent
    | MessageDelivered
    | EphemeralReceived
    | SyncReceived
    | MessageAcknowledged
    | MessagePossiblyAcknowledged
    | MessagesMissing
    | MessagesLost
    | RepairRequestQueued
    | RepairRequestSent
    | RepairRequestReceived
    | RepairResponseQueued
    | RepairResponseSent
    | MessageDropped
)


@dataclass(slots=True)
class Output:
    """What one call to the participant produced."""

    to_send: list[Outgoing] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    def extend(self, other: Output) -> Output:
        self.to_send.extend(other.to_send)
        self.events.extend(other.events)
        return self
