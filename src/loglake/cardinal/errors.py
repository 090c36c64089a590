"""Typed errors of the Cardinal part, split by whose fault it is (errors.py of loglake)."""

from __future__ import annotations

from loglake.errors import DecodeError, LocalProtocolError, RemoteProtocolError


class CardinalDecodeError(DecodeError, RemoteProtocolError):
    """A key or value does not decode as its message type requires.

    ``message_type`` names the type (``Batch``, ``SubBatchMsg`` …, or ``unknown``) and ``problem``
    says what is wrong, so a log line or a CLI message is enough to find the bad producer.
    """

    def __init__(self, message_type: str, problem: str) -> None:
        super().__init__(f"malformed {message_type}: {problem}")
        self.message_type = message_type
        self.problem = problem


class ProducerError(LocalProtocolError):
    """The caller asked the producer for something the protocol forbids (reference
    ``delivery/errors.go``: ErrPrefixOverlap, ErrUnknownBatch, ErrInvalidBatch,
    ErrPrefixConflict)."""


class UnknownAncestor(RemoteProtocolError):
    """A Reorg names a common ancestor the consumer cannot place on its chain."""

    def __init__(self, number: int, hash_: bytes, why: str) -> None:
        super().__init__(f"reorg to unknown ancestor #{number} 0x{hash_.hex()}: {why}")
        self.number, self.hash = number, hash_


class CheckpointError(DecodeError):
    """A stored checkpoint does not decode."""


class PartitionMismatch(LocalProtocolError):
    """A topic exists with another partition count than the one configured: keys would hash to
    other partitions than the other side's (and in-order delivery within a block's partition
    would not hold), so nothing is sent or read."""

    def __init__(self, topic: str, configured: int, actual: int) -> None:
        super().__init__(
            f"topic {topic!r} has {actual} partitions, not the {configured} configured "
            "(leave --partitions out to use the topic's own count)"
        )
        self.topic, self.configured, self.actual = topic, configured, actual


class UndeliveredUpdates(LocalProtocolError):
    """``commit`` while updates the consumer assembled were not handed to the application (a
    ``poll`` that raised partway, or updates given back): the checkpoint would lie past them,
    so a restart would never deliver them; or while a reorg channel is half read (``channel``:
    a round raised while following it), as the checkpoint would hold the Reorg as read and the
    rest of its channel as followed. ``poll`` again first."""

    def __init__(self, count: int, channel: str | None = None) -> None:
        half = f"; reorg channel {channel!r} is half read" if channel else ""
        super().__init__(
            f"{count} update(s) assembled but not handed over yet{half}: poll before committing"
        )
        self.count = count
        self.channel = channel


class UpdatesLost(LocalProtocolError):
    """An exception (a second Ctrl-C, any ``BaseException``) escaped while the consumer applied
    a message: updates the core assembled may never have reached the application, and nothing
    can hand them again in this process. ``commit`` and ``poll`` refuse from then on; a new
    consumer resumes from the last commit and hands them again (nothing skipped)."""

    def __init__(self) -> None:
        super().__init__(
            "a round was interrupted while a message was being applied: updates may not have "
            "been handed over; start a new consumer (it resumes from the last commit)"
        )
