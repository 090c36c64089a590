"""Typed errors and drop reasons of the SDS part.

Following the h11 split (STYLE.md): ``SdsLocalError`` is the caller's fault (empty content, a
call the protocol forbids), ``SdsDecodeError`` is the peer's (bytes that are not an SDS message
of this channel). A ``Participant`` never raises on remote input: it turns an ``SdsDecodeError``
into a ``MessageDropped`` event carrying a ``DropReason`` and leaves its state unchanged.
"""

from __future__ import annotations

from enum import StrEnum

from loglake.errors import DecodeError, LocalProtocolError, LoglakeError


class DropReason(StrEnum):
    """Why a received message was not processed (surfaced in ``MessageDropped``)."""

    MALFORMED = "malformed"  # not a protobuf SdsMessage
    UNKNOWN_KIND = "unknown-kind"  # neither content, sync nor ephemeral (no lamport, no content)
    MISSING_FIELD = "missing-field"  # empty message_id / sender_id / history message_id
    OVERSIZED = "oversized"  # a field or a list over the configured limits
    BAD_BLOOM_FILTER = "bad-bloom-filter"  # bloom filter of the wrong length
    WRONG_CHANNEL = "wrong-channel"  # channel_id is not ours
    OWN_MESSAGE = "own-message"  # sender_id is ours (spec: SHOULD ignore)
    DUPLICATE = "duplicate"  # a content message already received
    BAD_MESSAGE_ID = "bad-message-id"  # content message whose id is not its content's SHA-256


class SdsError(LoglakeError):
    """Base of the SDS errors."""


class SdsLocalError(SdsError, LocalProtocolError):
    """The caller asked the participant for something SDS forbids."""


class DuplicateContent(SdsLocalError):
    """``Participant.send`` of content whose message id (its SHA-256) is already in the local
    log, from anyone: every peer that has the message would drop the new one as a duplicate
    (the spec: a message id MUST be globally unique). Make each payload unique (the chat puts a
    random nonce in its envelope, ``loglake.sds.chat``)."""

    def __init__(self, message_id: str, sender_id: str) -> None:
        super().__init__(
            f"content with message id {message_id} is already in the local log "
            f"(sent by {sender_id!r}); peers would drop it as a duplicate"
        )
        self.message_id = message_id
        self.sender_id = sender_id


class SdsDecodeError(SdsError, DecodeError):
    """Bytes from a peer are not a valid SDS message; ``reason`` says why."""

    def __init__(self, reason: DropReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
