"""Bytes ↔ stream-service messages: ``BasePayload{protocol, data}`` around a BARE body.

Follows ``specs/ockam-stream-service.txt`` ("Payload BARE specs") and the reference
``Ockam.Protocol.base_encode/2`` (build-trust/ockam, ``lib/ockam/protocol/protocol.ex``:
``@base_schema {:struct, [protocol: :string, data: :data]}``), with each protocol's request and
response schema declared once below.

Protocol names: the spec's (``stream_create_partitions``; ``stream_index`` for both the plain
and the partitioned index). The Elixir reference names its partitioned protocols
``stream_create_partitioned`` and ``stream_index_partitioned`` (``stream_partitioned.ex``); those
are accepted as aliases on input and answered under the name the request used.

The plain and partitioned ``stream_index`` requests share a name; they are told apart by exact
decoding (a plain ``GetIndex`` is ``tag, string, string``, the partitioned one has one more
``uint``; a plain decode of partitioned bytes leaves trailing bytes and is rejected). Responses
are ambiguous (``Index{.., some(0)}`` has the same bytes as ``PartitionIndex{.., 1, none}``), so
``decode_response`` takes the type the caller expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar, cast

from loglake.errors import DecodeError
from loglake.streams.api import StreamMessage
from loglake.streams.messages import (
    BasePayload,
    CreatePartitionedStreamRequest,
    CreatePartitionedStreamResponse,
    CreateStreamRequest,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    IndexResetRequest,
    Init,
    PartitionIndex,
    PartitionSummary,
    PullRequest,
    PullResponse,
    PushConfirm,
    PushRequest,
    SaveIndex,
    SavePartitionIndex,
    StreamInfoRequest,
    StreamInfoResponse,
    StreamSummary,
)
from loglake.wire import bare
from loglake.wire.bare import DATA, STRING, UINT, Array, Enum, Optional, Struct, Union
from loglake.wire.varint import encode_uleb

R = TypeVar("R")

# -- protocol names (spec "Protocols") -------------------------------------------------------
STREAM_CREATE = "stream_create"
STREAM_CREATE_PARTITIONS = "stream_create_partitions"
STREAM_PUSH = "stream_push"
STREAM_PULL = "stream_pull"
STREAM_INDEX = "stream_index"
ERROR = "error"
LOGLAKE_STREAM_INFO = "loglake_stream_info"
LOGLAKE_INDEX_RESET = "loglake_index_reset"
"""loglake extension (see messages.py)."""
REF_STREAM_CREATE_PARTITIONED = "stream_create_partitioned"
"""Reference alias (stream_partitioned.ex) of ``stream_create_partitions``."""
REF_STREAM_INDEX_PARTITIONED = "stream_index_partitioned"
"""Reference alias (stream_partitioned.ex) of the partitioned ``stream_index``."""

# -- schemas ---------------------------------------------------------------------------------
BASE_PAYLOAD = Struct(BasePayload, ("protocol", STRING), ("data", DATA))
CREATE_REQUEST = Struct(CreateStreamRequest, ("stream_name", Optional(STRING)))
INIT = Struct(Init, ("stream_name", STRING))
CREATE_PARTITIONS_REQUEST = Struct(
    CreatePartitionedStreamRequest, ("stream_name", Optional(STRING)), ("partitions", UINT)
)
CREATE_PARTITIONS_RESPONSE = Struct(
    CreatePartitionedStreamResponse, ("stream_name", STRING), ("partition", UINT)
)
PUSH_REQUEST = Struct(PushRequest, ("request_id", UINT), ("data", DATA))
STATUS = Enum("Status", ["OK", "ERROR"])
PUSH_CONFIRM = Struct(PushConfirm, ("request_id", UINT), ("status", STATUS), ("index", UINT))
PULL_REQUEST = Struct(PullRequest, ("request_id", UINT), ("index", UINT), ("limit", UINT))
STREAM_MESSAGE = Struct(StreamMessage, ("index", UINT), ("data", DATA))
PULL_RESPONSE = Struct(PullResponse, ("request_id", UINT), ("messages", Array(STREAM_MESSAGE)))
GET_INDEX = Struct(GetIndex, ("client_id", STRING), ("stream_name", STRING))
SAVE_INDEX = Struct(SaveIndex, ("client_id", STRING), ("stream_name", STRING), ("index", UINT))
INDEX_REQUEST = Union("Request", [GET_INDEX, SAVE_INDEX])
INDEX = Struct(Index, ("client_id", STRING), ("stream_name", STRING), ("index", Optional(UINT)))
GET_PARTITION_INDEX = Struct(
    GetPartitionIndex, ("client_id", STRING), ("stream_name", STRING), ("partition", UINT)
)
SAVE_PARTITION_INDEX = Struct(
    SavePartitionIndex,
    ("client_id", STRING),
    ("stream_name", STRING),
    ("partition", UINT),
    ("index", UINT),
)
PARTITION_INDEX_REQUEST = Union("Request", [GET_PARTITION_INDEX, SAVE_PARTITION_INDEX])
PARTITION_INDEX = Struct(
    PartitionIndex,
    ("client_id", STRING),
    ("stream_name", STRING),
    ("partition", UINT),
    ("index", Optional(UINT)),
)
ERROR_SCHEMA = Struct(Error, ("reason", STRING))
STREAM_INFO_REQUEST = Struct(StreamInfoRequest, ("stream_name", Optional(STRING)))
PARTITION_SUMMARY = Struct(
    PartitionSummary,
    ("partition", UINT),
    ("first_index", UINT),
    ("next_index", UINT),
    ("bytes", UINT),
)
STREAM_SUMMARY = Struct(
    StreamSummary, ("stream_name", STRING), ("partitions", Array(PARTITION_SUMMARY))
)
STREAM_INFO_RESPONSE = Struct(StreamInfoResponse, ("streams", Array(STREAM_SUMMARY)))
INDEX_RESET_REQUEST = Struct(
    IndexResetRequest,
    ("client_id", STRING),
    ("stream_name", STRING),
    ("partition", UINT),
    ("index", Optional(UINT)),
)

# message class -> (protocol name, schema used to encode it)
_ENCODE: dict[type, tuple[str, bare.BareType]] = {
    CreateStreamRequest: (STREAM_CREATE, CREATE_REQUEST),
    Init: (STREAM_CREATE, INIT),
    CreatePartitionedStreamRequest: (STREAM_CREATE_PARTITIONS, CREATE_PARTITIONS_REQUEST),
    CreatePartitionedStreamResponse: (STREAM_CREATE_PARTITIONS, CREATE_PARTITIONS_RESPONSE),
    PushRequest: (STREAM_PUSH, PUSH_REQUEST),
    PushConfirm: (STREAM_PUSH, PUSH_CONFIRM),
    PullRequest: (STREAM_PULL, PULL_REQUEST),
    PullResponse: (STREAM_PULL, PULL_RESPONSE),
    GetIndex: (STREAM_INDEX, INDEX_REQUEST),
    SaveIndex: (STREAM_INDEX, INDEX_REQUEST),
    Index: (STREAM_INDEX, INDEX),
    GetPartitionIndex: (STREAM_INDEX, PARTITION_INDEX_REQUEST),
    SavePartitionIndex: (STREAM_INDEX, PARTITION_INDEX_REQUEST),
    PartitionIndex: (STREAM_INDEX, PARTITION_INDEX),
    Error: (ERROR, ERROR_SCHEMA),
    StreamInfoRequest: (LOGLAKE_STREAM_INFO, STREAM_INFO_REQUEST),
    StreamInfoResponse: (LOGLAKE_STREAM_INFO, STREAM_INFO_RESPONSE),
    IndexResetRequest: (LOGLAKE_INDEX_RESET, INDEX_RESET_REQUEST),
}

# protocol name -> request schemas to try, in order (server side)
_REQUESTS: dict[str, tuple[bare.BareType, ...]] = {
    STREAM_CREATE: (CREATE_REQUEST,),
    STREAM_CREATE_PARTITIONS: (CREATE_PARTITIONS_REQUEST,),
    REF_STREAM_CREATE_PARTITIONED: (CREATE_PARTITIONS_REQUEST,),
    STREAM_PUSH: (PUSH_REQUEST,),
    STREAM_PULL: (PULL_REQUEST,),
    STREAM_INDEX: (INDEX_REQUEST, PARTITION_INDEX_REQUEST),
    REF_STREAM_INDEX_PARTITIONED: (PARTITION_INDEX_REQUEST,),
    LOGLAKE_STREAM_INFO: (STREAM_INFO_REQUEST,),
    LOGLAKE_INDEX_RESET: (INDEX_RESET_REQUEST,),
}

# response class -> (accepted protocol names, schema) (client side)
_RESPONSES: dict[type, tuple[frozenset[str], bare.BareType]] = {
    Init: (frozenset({STREAM_CREATE}), INIT),
    CreatePartitionedStreamResponse: (
        frozenset({STREAM_CREATE_PARTITIONS, REF_STREAM_CREATE_PARTITIONED}),
        CREATE_PARTITIONS_RESPONSE,
    ),
    PushConfirm: (frozenset({STREAM_PUSH}), PUSH_CONFIRM),
    PullResponse: (frozenset({STREAM_PULL}), PULL_RESPONSE),
    Index: (frozenset({STREAM_INDEX}), INDEX),
    PartitionIndex: (
        frozenset({STREAM_INDEX, REF_STREAM_INDEX_PARTITIONED, LOGLAKE_INDEX_RESET}),
        PARTITION_INDEX,
    ),
    StreamInfoResponse: (frozenset({LOGLAKE_STREAM_INFO}), STREAM_INFO_RESPONSE),
}


class UnknownProtocol(DecodeError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown protocol {name!r}")
        self.name = name


def encode_base(protocol: str, data: bytes) -> bytes:
    return bare.encode(BASE_PAYLOAD, BasePayload(protocol, data))


def decode_base(payload: bytes) -> BasePayload:
    return bare.decode(BASE_PAYLOAD, payload)


def encode_payload(msg: object, protocol: str | None = None) -> bytes:
    """``BasePayload{protocol, BARE(msg)}``; ``protocol`` overrides the name (for aliases)."""
    name, schema = _ENCODE[type(msg)]
    return encode_base(protocol or name, bare.encode(schema, msg))


def decode_request(payload: bytes) -> tuple[str, object]:
    """Server side: return ``(protocol name as sent, request message)``."""
    base = decode_base(payload)
    schemas = _REQUESTS.get(base.protocol)
    if schemas is None:
        raise UnknownProtocol(base.protocol)
    err: DecodeError | None = None
    for schema in schemas:
        try:
            return base.protocol, bare.decode(schema, base.data)
        except DecodeError as e:
            err = err or e
    assert err is not None
    raise err


def decode_response(payload: bytes, expect: type[R]) -> R | Error:
    """Client side: the ``expect``-ed response, or an ``Error`` (protocol ``error``)."""
    base = decode_base(payload)
    if base.protocol == ERROR:
        return cast(Error, bare.decode(ERROR_SCHEMA, base.data))
    names, schema = _RESPONSES[expect]
    if base.protocol not in names:
        raise UnknownProtocol(base.protocol)
    return cast(R, bare.decode(schema, base.data))


# -- fast paths for the hot messages (same bytes as the generic schema; tested against it) ----
_PUSH_PREFIX = encode_base(STREAM_PUSH, b"")[:-1]  # string "stream_push" (then data length)


# The push/pull fast paths keep the one- and two-octet uint cases inline and call the shared
# LEB128 (loglake.wire.varint, through bare's range and minimality rules) only for longer ones:
# each message costs several uints, and a call saves nothing for the common case — measured
# (benchmarks/streams.py, and per call: inline 24 ns vs 28 ns through encode_uleb for one octet,
# 48 ns vs 72 ns through bare.decode_uint).
_SMALL_UINTS = [bytes((i,)) for i in range(0x80)]
_UINTS_2 = _SMALL_UINTS + [bytes(((v & 0x7F) | 0x80, v >> 7)) for v in range(0x80, 0x4000)]
"""Every one- and two-octet uint, encoded (16,384 small objects, ~0.8 MB): each confirm has
two uints (a request id and an index, soon three octets each), and a table look-up plus one
concatenation costs about half of building the bytes (``bytes((a, b, c))``)."""
_CONT = [bytes((i | 0x80,)) for i in range(0x80)]
"""A uint's low seven bits with the continuation bit: ``_CONT[v & 0x7F] + uint(v >> 7)``."""
_UINT_MAX = bare.UINT_MAX


def _uint(v: int) -> bytes:
    """``bare.encode_uint`` with the 1- to 4-octet cases from the tables (a log's indexes pass
    2,097,152 early, and ``encode_uleb``'s loop cost a confirm 0.5 µs more there)."""
    if 0 <= v < 0x4000:
        return _UINTS_2[v]
    if 0x4000 <= v < 0x200000:
        return _CONT[v & 0x7F] + _UINTS_2[v >> 7]
    if 0x200000 <= v < 0x10000000:
        return _CONT[v & 0x7F] + _CONT[(v >> 7) & 0x7F] + _UINTS_2[v >> 14]
    if 0 <= v <= _UINT_MAX:
        return encode_uleb(v)
    return bare.encode_uint(v)  # raises the typed error


encode_uint = _uint
"""A BARE ``uint`` (the fast path's encoder, for a client framing pushes itself)."""


def encode_push_request(request_id: int, data: bytes) -> bytes:
    return push_request_head(request_id, len(data)) + data


def push_request_head(request_id: int, size: int) -> bytes:
    """``encode_push_request(request_id, data)`` up to the data (``size = len(data)``): a
    client can send this head and the caller's data as they are, with no copy of the data."""
    head = _uint(request_id) + _uint(size)
    return _PUSH_PREFIX + _uint(len(head) + size) + head


def push_request_parts(request_id_len: int, size: int) -> tuple[bytes, bytes]:
    """The two constant parts of a push request for data of ``size`` bytes and a request id
    whose uint takes ``request_id_len`` octets: ``before + uint(request_id) + after + data`` is
    ``encode_push_request``. Why: a burst of pushes differs only in the id and the data, so a
    client builds these once and per push encodes just the id."""
    if not 1 <= request_id_len <= 10:
        raise ValueError(f"a uint takes 1 to 10 octets, not {request_id_len}")
    after = _uint(size)
    return _PUSH_PREFIX + _uint(request_id_len + len(after) + size), after


def encode_push_confirm(request_id: int, index: int, ok: bool = True) -> bytes:
    body = _uint(request_id) + (b"\x00" if ok else b"\x01") + _uint(index)
    return _PUSH_PREFIX + _SMALL_UINTS[len(body)] + body  # a body is at most 21 octets


def encode_push_confirms(request_ids: Sequence[int], indexes: Sequence[int]) -> list[bytes]:
    """``encode_push_confirm(rid, index)`` (status OK) for each pair, in one loop (one-octet
    uints from the table, the others through ``_uint``)."""
    uint, small, prefix = _uint, _SMALL_UINTS, _PUSH_PREFIX
    out: list[bytes] = []
    add = out.append
    for rid, index in zip(request_ids, indexes, strict=True):
        r = small[rid] if 0 <= rid < 0x80 else uint(rid)
        i = small[index] if 0 <= index < 0x80 else uint(index)
        add(prefix + small[len(r) + len(i) + 1] + r + b"\x00" + i)
    return out


def _uint_at(buf: bytes, pos: int) -> tuple[int, int]:
    """``bare.decode_uint`` with the 1- to 3-octet cases inline (the common ones here); the
    minimality rule holds (a last octet of 0 after the first is refused by ``bare``)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    c = buf[pos + 1]
    if c < 0x80:
        if c:
            return (b & 0x7F) | (c << 7), pos + 2
    else:
        d = buf[pos + 2]
        if 0 < d < 0x80:
            return (b & 0x7F) | ((c & 0x7F) << 7) | (d << 14), pos + 3
    return bare.decode_uint(buf, pos)


_PUSH_PREFIX_LEN = len(_PUSH_PREFIX)


def decode_push_request(payload: bytes) -> tuple[int, bytes] | None:
    """``(request_id, data)`` if ``payload`` is exactly a ``stream_push`` request, else None
    (the caller then takes the generic path, which reports what is wrong). The one- and
    two-octet uints are read inline (this runs once per pushed message: one call, not four;
    a 1 KB push has a two-octet body length and data length)."""
    if not payload.startswith(_PUSH_PREFIX):
        return None
    end = len(payload)
    try:
        pos = _PUSH_PREFIX_LEN
        n = payload[pos]
        if n < 0x80:
            pos += 1
        elif 0 < payload[pos + 1] < 0x80:
            n = (n & 0x7F) | (payload[pos + 1] << 7)
            pos += 2
        else:
            n, pos = _uint_at(payload, pos)
        if pos + n != end:
            return None
        rid = payload[pos]
        if rid < 0x80:
            pos += 1
        else:
            rid, pos = _uint_at(payload, pos)
        size = payload[pos]
        if size < 0x80:
            pos += 1
        elif 0 < payload[pos + 1] < 0x80:
            size = (size & 0x7F) | (payload[pos + 1] << 7)
            pos += 2
        else:
            size, pos = _uint_at(payload, pos)
    except (DecodeError, IndexError):
        return None
    if pos + size != end:
        return None
    return rid, payload[pos:]


def decode_push_confirm(payload: bytes) -> tuple[int, bool, int] | None:
    """``(request_id, ok, index)`` if ``payload`` is exactly a ``PushConfirm``, else None.
    A confirm's body is at most 21 octets, so its length is one octet; the uints are read as
    in ``decode_push_request``."""
    if not payload.startswith(_PUSH_PREFIX):
        return None
    end = len(payload)
    try:
        pos = _PUSH_PREFIX_LEN
        if pos + 1 + payload[pos] != end:  # also refuses a length of 0x80 and up
            return None
        pos += 1
        rid = payload[pos]
        if rid < 0x80:
            pos += 1
        else:
            rid, pos = _uint_at(payload, pos)
        status = payload[pos]
        if status > 1:
            return None
        pos += 1
        index = payload[pos]
        if index < 0x80:
            pos += 1
        else:
            index, pos = _uint_at(payload, pos)
    except (DecodeError, IndexError):
        return None
    if pos != end:
        return None
    return rid, status == 0, index


_PULL_PREFIX = encode_base(STREAM_PULL, b"")[:-1]


def encode_pull_response(request_id: int, messages: list[tuple[int, bytes]]) -> bytes:
    """``PullResponse`` from ``(index, data)`` pairs without building dataclasses (same bytes
    as ``encode_payload(PullResponse(...))``; tested against it)."""
    eu = _uint
    parts = [eu(request_id), eu(len(messages))]
    for index, data in messages:
        parts.append(eu(index))
        parts.append(eu(len(data)))
        parts.append(data)
    body = b"".join(parts)
    return _PULL_PREFIX + eu(len(body)) + body


def decode_pull_reply(payload: bytes) -> PullResponse | Error:
    """Client side: a ``stream_pull`` response through the fast path, or an ``error``."""
    fast = decode_pull_response(payload)
    return fast if fast is not None else decode_response(payload, PullResponse)


def decode_pull_response(payload: bytes) -> PullResponse | None:
    """Fast exact decode of a ``stream_pull`` response, else None (use ``decode_response``)."""
    if not payload.startswith(_PULL_PREFIX):
        return None
    du = _uint_at
    try:
        n, pos = du(payload, len(_PULL_PREFIX))
        if pos + n != len(payload):
            return None
        rid, pos = du(payload, pos)
        count, pos = du(payload, pos)
        if count > len(payload) - pos:
            return None
        msgs = []
        end = len(payload)
        for _ in range(count):
            index, pos = du(payload, pos)
            size, pos = du(payload, pos)
            stop = pos + size
            if stop > end:
                return None
            msgs.append(StreamMessage(index, payload[pos:stop]))
            pos = stop
    except (DecodeError, IndexError):
        return None
    if pos != end:
        return None
    return PullResponse(rid, tuple(msgs))
