"""The messages of the Ockam stream service protocol, one dataclass each.

Source: ``specs/ockam-stream-service.txt`` ("Payload BARE specs" → "Protocols"), field names and
order exactly as written there; cross-checked with the reference schemas in build-trust/ockam
``implementations/elixir/ockam/ockam/lib/ockam/protocol/stream.ex`` and ``stream_partitioned.ex``.

Where the spec disagrees with itself: the "Addition: index management" section lists
``GetIndex {stream_name, client_id}`` while the "Protocols → Index" section (and the reference,
``index_get_schema``) has ``client_id`` first; the latter is used.

``StreamInfoRequest``/``StreamInfoResponse`` are a loglake extension (protocol name
``loglake_stream_info`` on the stream service): the spec has no list/describe call, and a client
needs the partition count of a stream it did not create. Ockam peers never see it unless asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loglake.streams.api import StreamMessage

Status = Literal["OK", "ERROR"]
"""``enum Status { OK ERROR }`` (spec, "Push")."""


@dataclass(frozen=True, slots=True)
class BasePayload:
    """``type BasePayload {protocol: string, data: data}`` — every payload's envelope."""

    protocol: str
    data: bytes


# -- stream_create ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CreateStreamRequest:
    stream_name: str | None = None


@dataclass(frozen=True, slots=True)
class Init:
    stream_name: str


# -- stream_create_partitions ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CreatePartitionedStreamRequest:
    stream_name: str | None
    partitions: int


@dataclass(frozen=True, slots=True)
class CreatePartitionedStreamResponse:
    """The partitioned ``Init {stream_name, partition}``: one per partition."""

    stream_name: str
    partition: int


# -- stream_push -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PushRequest:
    request_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class PushConfirm:
    request_id: int
    status: Status
    index: int


# -- stream_pull -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PullRequest:
    request_id: int
    index: int
    limit: int


@dataclass(frozen=True, slots=True)
class PullResponse:
    request_id: int
    messages: tuple[StreamMessage, ...]


# -- stream_index (plain) --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GetIndex:
    client_id: str
    stream_name: str


@dataclass(frozen=True, slots=True)
class SaveIndex:
    client_id: str
    stream_name: str
    index: int


@dataclass(frozen=True, slots=True)
class Index:
    client_id: str
    stream_name: str
    index: int | None


# -- stream_index (partitioned) --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GetPartitionIndex:
    client_id: str
    stream_name: str
    partition: int


@dataclass(frozen=True, slots=True)
class SavePartitionIndex:
    client_id: str
    stream_name: str
    partition: int
    index: int


@dataclass(frozen=True, slots=True)
class PartitionIndex:
    client_id: str
    stream_name: str
    partition: int
    index: int | None


# -- error -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Error:
    reason: str


# -- loglake extension: loglake_stream_info --------------------------------------------------
@dataclass(frozen=True, slots=True)
class StreamInfoRequest:
    """``stream_name`` None → every stream."""

    stream_name: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    partition: int
    first_index: int
    next_index: int
    bytes: int


@dataclass(frozen=True, slots=True)
class StreamSummary:
    stream_name: str
    partitions: tuple[PartitionSummary, ...]


@dataclass(frozen=True, slots=True)
class StreamInfoResponse:
    streams: tuple[StreamSummary, ...]


# -- loglake extension: loglake_index_reset ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class IndexResetRequest:
    """An operator's reset (``index``: set it, lower or not) or delete (``index`` None) of a
    consumer's index, sent to the index service. The Ockam spec has no way to move an index
    back; an index stuck too high (a bug, a hostile save) otherwise stays forever. The reply is
    a ``PartitionIndex`` (under this protocol name) with the index now stored, None if
    deleted."""

    client_id: str
    stream_name: str
    partition: int
    index: int | None


Request = (
    CreateStreamRequest
    | CreatePartitionedStreamRequest
    | PushRequest
    | PullRequest
    | GetIndex
    | SaveIndex
    | GetPartitionIndex
    | SavePartitionIndex
    | StreamInfoRequest
    | IndexResetRequest
)
Response = (
    Init
    | CreatePartitionedStreamResponse
    | PushConfirm
    | PullResponse
    | Index
    | PartitionIndex
    | Error
    | StreamInfoResponse
)
