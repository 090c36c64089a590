"""SDS messages as dataclasses: one ``SdsMessage`` (the spec's ``Message``) and ``HistoryEntry``.

Spec: specs/sds-scalable-data-sync.txt, "Wire protocol / Message". The three kinds are told apart
by field presence exactly as @waku/sds 0.0.8 does (``src/message_channel/message.ts``,
``testContentMessage`` / ``testSyncMessage`` / ``testEphemeralMessage``):

- content: ``lamport_timestamp`` set and non-empty ``content``;
- sync: ``lamport_timestamp`` set and ``content`` unset or empty;
- ephemeral: no ``lamport_timestamp`` and non-empty ``content``.

A message with neither lamport nor content is of no kind (@waku/sds drops it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum


class MessageKind(StrEnum):
    CONTENT = "content"
    SYNC = "sync"
    EPHEMERAL = "ephemeral"


def message_id_of(content: bytes | memoryview) -> str:
    """``MessageChannel.getMessageId`` (message_channel.ts): lowercase hex SHA-256 of content."""
    return hashlib.sha256(content).hexdigest()


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """``HistoryEntry``: a message id, with the hint and sender SDS-R uses (spec "SDS-R fields")."""

    message_id: str
    retrieval_hint: bytes | None = None
    sender_id: str | None = None


@dataclass(frozen=True, slots=True)
class SdsMessage:
    """One SDS message (``SdsMessage`` in @waku/proto, ``Message`` in the spec)."""

    sender_id: str
    message_id: str
    channel_id: str
    lamport_timestamp: int | None = None
    causal_history: tuple[HistoryEntry, ...] = field(default=())
    bloom_filter: bytes | None = None
    repair_request: tuple[HistoryEntry, ...] = field(default=())
    content: bytes | None = None

    @property
    def kind(self) -> MessageKind | None:
        if self.lamport_timestamp is not None:
            return MessageKind.CONTENT if self.content else MessageKind.SYNC
        if self.content:
            return MessageKind.EPHEMERAL
        return None
