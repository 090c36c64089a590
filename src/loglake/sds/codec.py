"""SDS bytes ↔ ``SdsMessage``, with the official protobuf runtime and a cached-field fast path.

Schema: src/loglake/wire/proto/sds.proto, copied from @waku/proto's ``sds_message.proto`` (the
field numbers of spec "Wire protocol / Message"; @waku/proto's generated
``src/generated/sds_message.ts`` shows the same numbers and encoding order). ``decode`` parses with
``protobuf`` (upb) and validates; every failure is an ``SdsDecodeError`` with a ``DropReason``.

Why a hand-assembled encoder beside protobuf: a message carries up to 200 causal-history entries
(@waku/sds's default) and an 18,752-byte bloom filter. Building 200 protobuf sub-messages per
send costs ~200 µs in Python; a participant instead keeps each history entry's encoded bytes
(``encode_history_entry``) from the moment the message enters its log and concatenates them.
The layout is protobuf's canonical one — fields in number order, proto3 scalars omitted when
empty, ``optional`` fields written when present — which is also what protons (the runtime of
@waku/proto) writes. ``tests/sds/test_codec.py`` checks ``encode_fast == encode`` (protobuf's
``SerializeToString``) on generated messages and against bytes produced by @waku/sds.

Why ``parse`` returns the ``SdsMessageRawView``: the same bytes read with each history entry
left encoded (``repeated bytes``). Turning 200 entries into Python objects costs ~40-100 µs per
message; a participant only needs the entries it has not seen before, and recognises the others
by their bytes with one C-level set difference. ``parse_entry`` decodes (and checks) one entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError as PbDecodeError

from loglake.sds.errors import DropReason, SdsDecodeError
from loglake.sds.messages import HistoryEntry, SdsMessage
from loglake.wire.pb import sds_pb2
from loglake.wire.varint import encode_uleb

# Field tags (field_number << 3 | wire_type), sds.proto.
TAG_SENDER_ID = b"\x0a"  # 1, length-delimited
TAG_MESSAGE_ID = b"\x12"  # 2
TAG_CHANNEL_ID = b"\x1a"  # 3
TAG_LAMPORT = b"\x50"  # 10, varint
TAG_CAUSAL_HISTORY = b"\x5a"  # 11
TAG_BLOOM_FILTER = b"\x62"  # 12
TAG_REPAIR_REQUEST = b"\x6a"  # 13
TAG_CONTENT = b"\xa2\x01"  # 20
# HistoryEntry
TAG_ENTRY_MESSAGE_ID = b"\x0a"
TAG_ENTRY_HINT = b"\x12"
TAG_ENTRY_SENDER = b"\x1a"

UINT64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what a participant accepts from a peer (oversized → ``DropReason.OVERSIZED``).

    The spec sets none; these defaults are generous for chat-sized traffic and the @waku/sds
    defaults (200 history entries, 3 repair requests)."""

    max_message_bytes: int = 4 * 1024 * 1024
    max_content_bytes: int = 1024 * 1024
    max_id_chars: int = 256  # message_id, sender_id, channel_id, history ids
    max_hint_bytes: int = 1024
    max_causal_history: int = 1000
    max_repair_request: int = 100


DEFAULT_LIMITS = Limits()


def _ld(tag: bytes, payload: bytes) -> bytes:
    return tag + encode_uleb(len(payload)) + payload


def encode_history_entry(entry: HistoryEntry, tag: bytes = TAG_CAUSAL_HISTORY) -> bytes:
    """One ``HistoryEntry`` as it appears inside an ``SdsMessage`` (tag + length + body)."""
    body = b""
    if entry.message_id:
        body += _ld(TAG_ENTRY_MESSAGE_ID, entry.message_id.encode())
    if entry.retrieval_hint is not None:
        body += _ld(TAG_ENTRY_HINT, entry.retrieval_hint)
    if entry.sender_id is not None:
        body += _ld(TAG_ENTRY_SENDER, entry.sender_id.encode())
    return _ld(tag, body)


def _check_lamport(value: int) -> None:
    if not 0 <= value <= UINT64_MAX:
        raise ValueError(f"lamport_timestamp {value} is not a uint64")


def encode_fast(
    sender_id: str,
    message_id: str,
    channel_id: str,
    lamport_timestamp: int | None,
    causal_history: bytes | bytearray,
    bloom_filter: bytes | bytearray | None,
    repair_request: bytes,
    content: bytes | None,
) -> bytes:
    """Assemble an ``SdsMessage`` from pre-encoded history/repair entries (see module doc).

    Large fields are joined without intermediate copies: one allocation per message."""
    parts: list[bytes | bytearray] = []
    if sender_id:
        parts.append(_ld(TAG_SENDER_ID, sender_id.encode()))
    if message_id:
        parts.append(_ld(TAG_MESSAGE_ID, message_id.encode()))
    if channel_id:
        parts.append(_ld(TAG_CHANNEL_ID, channel_id.encode()))
    if lamport_timestamp is not None:
        _check_lamport(lamport_timestamp)
        parts.append(TAG_LAMPORT + encode_uleb(lamport_timestamp))
    parts.append(causal_history)
    if bloom_filter is not None:
        parts.append(TAG_BLOOM_FILTER + encode_uleb(len(bloom_filter)))
        parts.append(bloom_filter)
    parts.append(repair_request)
    if content is not None:
        parts.append(TAG_CONTENT + encode_uleb(len(content)))
        parts.append(content)
    return b"".join(parts)


def encode_message_fast(msg: SdsMessage) -> bytes:
    return encode_fast(
        msg.sender_id,
        msg.message_id,
        msg.channel_id,
        msg.lamport_timestamp,
        b"".join(encode_history_entry(e) for e in msg.causal_history),
        msg.bloom_filter,
        b"".join(encode_history_entry(e, TAG_REPAIR_REQUEST) for e in msg.repair_request),
        msg.content,
    )


def _fill_entry(pb: sds_pb2.HistoryEntry, e: HistoryEntry) -> None:
    pb.message_id = e.message_id
    if e.retrieval_hint is not None:
        pb.retrieval_hint = e.retrieval_hint
    if e.sender_id is not None:
        pb.sender_id = e.sender_id


def to_pb(msg: SdsMessage) -> sds_pb2.SdsMessage:
    pb = sds_pb2.SdsMessage(
        sender_id=msg.sender_id, message_id=msg.message_id, channel_id=msg.channel_id
    )
    if msg.lamport_timestamp is not None:
        pb.lamport_timestamp = msg.lamport_timestamp
    for e in msg.causal_history:
        _fill_entry(pb.causal_history.add(), e)
    if msg.bloom_filter is not None:
        pb.bloom_filter = msg.bloom_filter
    for e in msg.repair_request:
        _fill_entry(pb.repair_request.add(), e)
    if msg.content is not None:
        pb.content = msg.content
    return pb


def encode(msg: SdsMessage) -> bytes:
    """Reference encoder: the protobuf runtime's canonical serialisation."""
    if msg.lamport_timestamp is not None:
        _check_lamport(msg.lamport_timestamp)
    return to_pb(msg).SerializeToString(deterministic=True)


def entry_from_pb(pb: sds_pb2.HistoryEntry) -> HistoryEntry:
    return HistoryEntry(
        pb.message_id,
        pb.retrieval_hint if pb.HasField("retrieval_hint") else None,
        pb.sender_id if pb.HasField("sender_id") else None,
    )


def parse(data: bytes, limits: Limits = DEFAULT_LIMITS) -> sds_pb2.SdsMessageRawView:
    """Parse and check the message-level fields. History entries stay encoded
    (``SdsMessageRawView``): whoever reads one checks it with ``parse_entry``."""
    if len(data) > limits.max_message_bytes:
        raise SdsDecodeError(DropReason.OVERSIZED, f"message of {len(data)} bytes")
    try:
        pb = sds_pb2.SdsMessageRawView.FromString(data)
    except (PbDecodeError, RuntimeError, ValueError) as e:
        raise SdsDecodeError(DropReason.MALFORMED, f"not an SdsMessage protobuf ({e})") from None
    if not pb.message_id:
        raise SdsDecodeError(DropReason.MISSING_FIELD, "empty message_id")
    if not pb.sender_id:
        raise SdsDecodeError(DropReason.MISSING_FIELD, "empty sender_id")
    mx = limits.max_id_chars
    if len(pb.message_id) > mx or len(pb.sender_id) > mx or len(pb.channel_id) > mx:
        raise SdsDecodeError(DropReason.OVERSIZED, f"an id over {mx} characters")
    if len(pb.content) > limits.max_content_bytes:
        raise SdsDecodeError(DropReason.OVERSIZED, f"content of {len(pb.content)} bytes")
    if len(pb.causal_history) > limits.max_causal_history:
        raise SdsDecodeError(
            DropReason.OVERSIZED, f"{len(pb.causal_history)} causal history entries"
        )
    if len(pb.repair_request) > limits.max_repair_request:
        raise SdsDecodeError(DropReason.OVERSIZED, f"{len(pb.repair_request)} repair requests")
    if not pb.HasField("lamport_timestamp") and not pb.content:
        raise SdsDecodeError(DropReason.UNKNOWN_KIND, "neither lamport_timestamp nor content")
    return pb


def check_entry(e: HistoryEntry, limits: Limits = DEFAULT_LIMITS) -> HistoryEntry:
    if not e.message_id:
        raise SdsDecodeError(DropReason.MISSING_FIELD, "history entry with empty message_id")
    if len(e.message_id) > limits.max_id_chars or (
        e.sender_id is not None and len(e.sender_id) > limits.max_id_chars
    ):
        raise SdsDecodeError(DropReason.OVERSIZED, "history entry id too long")
    if e.retrieval_hint is not None and len(e.retrieval_hint) > limits.max_hint_bytes:
        raise SdsDecodeError(DropReason.OVERSIZED, f"retrieval hint of {len(e.retrieval_hint)}")
    return e


def parse_entry(body: bytes, limits: Limits = DEFAULT_LIMITS) -> HistoryEntry:
    """One encoded ``HistoryEntry`` body → checked ``HistoryEntry``."""
    try:
        pb = sds_pb2.HistoryEntry.FromString(body)
    except (PbDecodeError, RuntimeError, ValueError) as e:
        raise SdsDecodeError(DropReason.MALFORMED, f"bad HistoryEntry ({e})") from None
    return check_entry(entry_from_pb(pb), limits)


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS) -> SdsMessage:
    """Bytes → ``SdsMessage``, every field checked; raises ``SdsDecodeError``."""
    pb = parse(data, limits)
    return SdsMessage(
        sender_id=pb.sender_id,
        message_id=pb.message_id,
        channel_id=pb.channel_id,
        lamport_timestamp=pb.lamport_timestamp if pb.HasField("lamport_timestamp") else None,
        causal_history=tuple(parse_entry(b, limits) for b in pb.causal_history),
        bloom_filter=pb.bloom_filter if pb.HasField("bloom_filter") else None,
        repair_request=tuple(parse_entry(b, limits) for b in pb.repair_request),
        content=pb.content if pb.HasField("content") else None,
    )
