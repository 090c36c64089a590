"""Ockam routing messages and the Ockam TCP transport framing, sans-I/O.

Followed (build-trust/ockam, Elixir implementation):
- ``implementations/elixir/ockam/ockam/lib/ockam/transport/tcp/handler.ex``: right after the TCP
  connection opens each side sends one protocol version byte ``1`` and expects ``1`` back
  ("Header, protocol version "1" must be the first thing exchanged"); afterwards the socket runs
  in ``{:packet, 4}`` mode: every frame is a 4-byte big-endian length then that many bytes. An
  empty frame is ignored; a frame that does not decode stops the handler (closes the connection).
- ``.../transport/tcp/transport_message.ex``: the frame body is the CBOR ``TCPMessage``, encoded
  as an array ``[onward_route, return_route, payload, tracing_context?]`` (``encode_as: :list``);
  each address is the CBOR map ``{0: type (integer), 1: value (byte string)}``; ``payload`` is a
  byte string and ``tracing_context`` an optional text string (omitted when absent, as minicbor
  omits trailing ``None`` fields of an array).
- ``Ockam.Address``: type ``0`` is a local (worker) address, type ``1`` a TCP address.

The frame size limit is loglake's (the reference has none): a peer announcing a larger frame is a
protocol error and the connection should be closed.

CBOR is ``cbor2`` (a kept library), not hand-written.
"""

from __future__ import annotations

import io
import ipaddress
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import cbor2

from loglake.errors import DecodeError, RemoteProtocolError
from loglake.wire import bare

PROTOCOL_VERSION = 1
"""handler.ex: ``transport.send(socket, <<1>>)``, then ``{:ok, <<1>>} = transport.recv(...)``."""
VERSION_BYTE = bytes((PROTOCOL_VERSION,))

ADDRESS_TYPE_LOCAL = 0
"""Ockam.Address: local worker address type."""
ADDRESS_TYPE_TCP = 1
"""Ockam.Transport.TCPAddress type."""

DEFAULT_MAX_FRAME = 32 * 1024 * 1024
"""loglake's limit on one frame (the reference has no limit)."""

_LEN = struct.Struct(">I")


class OckamWireError(DecodeError):
    """A TCP frame whose body is not a valid Ockam ``TCPMessage``."""


class FrameTooLarge(RemoteProtocolError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size, self.limit = size, limit


class BadProtocolVersion(RemoteProtocolError):
    def __init__(self, got: int) -> None:
        super().__init__(f"peer sent protocol version {got}, expected {PROTOCOL_VERSION}")
        self.got = got


@dataclass(frozen=True, slots=True)
class Address:
    """An Ockam address ``{type, value}``."""

    type: int
    value: bytes

    @classmethod
    def local(cls, name: str) -> Address:
        return cls(ADDRESS_TYPE_LOCAL, name.encode())

    @property
    def name(self) -> str:
        """The value as text (local addresses are UTF-8 names); invalid bytes are escaped."""
        return self.value.decode("utf-8", "backslashreplace")

    def __str__(self) -> str:
        return f"{self.type}#{self.name}"


Route = tuple[Address, ...]


@dataclass(slots=True)
class RoutingMessage:
    """An Ockam message: where it goes, where replies go, and opaque payload bytes.

    Treat as immutable. Not ``frozen``: a frozen dataclass costs ~1 µs more per instance, and
    the server builds two per pushed message."""

    onward_route: Route
    return_route: Route
    payload: bytes
    tracing_context: str | None = field(default=None)


def route(*names: str | Address) -> Route:
    return tuple(n if isinstance(n, Address) else Address.local(n) for n in names)


# -- TCPMessage <-> CBOR ---------------------------------------------------------------------


_ROUTE_CACHE: dict[Route, bytes] = {}
_ROUTE_CACHE_MAX = 8192


def encode_route(r: Route) -> bytes:
    """CBOR array of address maps; memoised, since a connection repeats a few routes."""
    b = _ROUTE_CACHE.get(r)
    if b is None:
        b = cbor2.dumps([{0: a.type, 1: a.value} for a in r])
        if len(_ROUTE_CACHE) >= _ROUTE_CACHE_MAX:
            _ROUTE_CACHE.clear()
        _ROUTE_CACHE[r] = b
    return b


def encode_transport_message(msg: RoutingMessage) -> bytes:
    """CBOR ``TCPMessage`` (transport_message.ex): an array header then its items, each item
    encoded by cbor2 (concatenating encoded items under an array header is CBOR's own framing,
    RFC 8949 §3.2)."""
    if msg.tracing_context is None:
        return (
            b"\x83"
            + encode_route(msg.onward_route)
            + encode_route(msg.return_route)
            + cbor2.dumps(msg.payload)
        )
    return (
        b"\x84"
        + encode_route(msg.onward_route)
        + encode_route(msg.return_route)
        + cbor2.dumps(msg.payload)
        + cbor2.dumps(msg.tracing_context)
    )


def _bytes_head_len(n: int) -> int:
    return 1 if n < 24 else 2 if n < 256 else 3 if n < 65536 else 5 if n < 1 << 32 else 9


_ADDRESS_CACHE: dict[tuple[int, bytes], Address] = {}


def _address(term: object) -> Address:
    if type(term) is dict and len(term) == 2:
        t, v = term.get(0), term.get(1)
        if type(t) is int and 0 <= t <= 255 and type(v) is bytes:
            key = (t, v)
            a = _ADDRESS_CACHE.get(key)
            if a is None:
                if len(_ADDRESS_CACHE) >= _ROUTE_CACHE_MAX:
                    _ADDRESS_CACHE.clear()
                a = _ADDRESS_CACHE[key] = Address(t, v)
            return a
    if not isinstance(term, dict) or set(term) != {0, 1}:
        raise OckamWireError(f"address must be a map {{0: type, 1: value}}, got {term!r:.80}")
    t, v = term[0], term[1]
    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= 255:
        raise OckamWireError(f"address type must be an integer 0..255, got {t!r:.40}")
    raise OckamWireError(f"address value must be a byte string, got {type(v).__name__}")


def _route(term: object, what: str) -> Route:
    if not isinstance(term, list):
        raise OckamWireError(f"{what} must be an array, got {type(term).__name__}")
    return tuple(_address(a) for a in term)


def decode_transport_message(body: bytes) -> RoutingMessage:
    """Strict decode of one frame body; anything else → ``OckamWireError``."""
    try:
        term = cbor2.loads(body)
    except Exception as e:  # cbor2 raises CBORDecodeError and others on garbage
        raise OckamWireError(f"frame is not valid CBOR: {e}") from None
    if not isinstance(term, list) or len(term) not in (3, 4):
        raise OckamWireError("TCPMessage must be an array of 3 or 4 items")
    onward = _route(term[0], "onward_route")
    ret = _route(term[1], "return_route")
    payload = term[2]
    if not isinstance(payload, bytes):
        raise OckamWireError(f"payload must be a byte string, got {type(payload).__name__}")
    tracing = term[3] if len(term) == 4 else None
    if tracing is not None and not isinstance(tracing, str):
        raise OckamWireError("tracing_context must be a text string")
    # cbor2.loads ignores bytes after the first item. If the body is exactly the canonical
    # encoding's length there are none; otherwise re-read with a decoder that reports them.
    size = (
        1
        + len(encode_route(onward))
        + len(encode_route(ret))
        + _bytes_head_len(len(payload))
        + len(payload)
        + (len(cbor2.dumps(term[3])) if len(term) == 4 else 0)
    )
    if size != len(body):
        stream = io.BytesIO(body)
        cbor2.CBORDecoder(stream).decode()
        if stream.tell() != len(body):
            raise OckamWireError(f"{len(body) - stream.tell()} trailing bytes after the TCPMessage")
    return RoutingMessage(onward, ret, payload, tracing)


def _payload_at(body: bytes, pos: int) -> bytes | None:
    """The CBOR byte string that exactly fills ``body[pos:]`` (definite length), else None."""
    n = len(body) - pos
    if n < 1:
        return None
    head = body[pos]
    if head >> 5 != 2:
        return None
    info = head & 0x1F
    if info < 24:
        size, hl = info, 1
    elif info == 24 and n >= 2:
        size, hl = body[pos + 1], 2
    elif info == 25 and n >= 3:
        size, hl = int.from_bytes(body[pos + 1 : pos + 3], "big"), 3
    elif info == 26 and n >= 5:
        size, hl = int.from_bytes(body[pos + 1 : pos + 5], "big"), 5
    else:
        return None
    if hl + size != n:
        return None
    return body[pos + hl :]


def encode_frame(msg: RoutingMessage) -> bytes:
    """``{:packet, 4}`` framing: 4-byte big-endian length + the CBOR body."""
    body = encode_transport_message(msg)
    return _LEN.pack(len(body)) + body


class FrameTemplate:
    """Frames for many payloads on the same routes (no tracing context): the array header and
    both routes are encoded once; each frame is then length + prefix + the payload item.
    Same bytes as ``encode_frame`` (tested)."""

    def __init__(self, onward_route: Route, return_route: Route) -> None:
        self.prefix = b"\x83" + encode_route(onward_route) + encode_route(return_route)

    def frame(self, payload: bytes) -> bytes:
        body = self.prefix + cbor2.dumps(payload)
        return _LEN.pack(len(body)) + body


def encode_frames(msgs: Sequence[RoutingMessage]) -> bytes:
    parts = []
    pack = _LEN.pack
    for m in msgs:
        body = encode_transport_message(m)
        parts.append(pack(len(body)))
        parts.append(body)
    return b"".join(parts)


class TcpConnection:
    """Sans-I/O Ockam TCP connection (one side): version exchange, then framed messages.

    ``initial_bytes()`` gives what to send first (the version byte); feed every received chunk to
    ``receive_data`` and it returns the messages completed so far. A protocol violation (bad
    version, frame too large, a body that is not a ``TCPMessage``) sets ``error`` to a typed
    exception; the messages completed before it are still returned (nothing valid is lost), later
    bytes are ignored, and the caller should close the socket — as the reference handler stops on
    a decode error.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._version_ok = False
        self.error: RemoteProtocolError | DecodeError | None = None
        self._last: tuple[bytes, Route, Route] | None = None

    @staticmethod
    def initial_bytes() -> bytes:
        return VERSION_BYTE

    def _decode(self, body: bytes) -> RoutingMessage:
        """``decode_transport_message`` with a shortcut for the common case of a connection
        repeating the same routes: if the body starts with the canonical CBOR of the last
        routes seen (array header, onward route, return route), CBOR being self-delimiting,
        those are its first items and only the payload is left to decode."""
        last = self._last
        if last is not None and body.startswith(last[0]):
            cut = len(last[0])
            payload = _payload_at(body, cut)
            if payload is not None:
                return RoutingMessage(last[1], last[2], payload)
        msg = decode_transport_message(body)
        if msg.tracing_context is None:
            prefix = b"\x83" + encode_route(msg.onward_route) + encode_route(msg.return_route)
            if body.startswith(prefix):
                self._last = (prefix, msg.onward_route, msg.return_route)
        return msg

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def receive_data(self, data: bytes) -> list[RoutingMessage]:
        out: list[RoutingMessage] = []
        if self.error is not None:
            return out
        self._buf += data
        buf = self._buf
        pos = 0
        try:
            if not self._version_ok:
                if not buf:
                    return out
                if buf[0] != PROTOCOL_VERSION:
                    raise BadProtocolVersion(buf[0])
                pos = 1
                self._version_ok = True
            n = len(buf)
            while n - pos >= 4:
                (size,) = _LEN.unpack_from(buf, pos)
                if size > self.max_frame:
                    raise FrameTooLarge(size, self.max_frame)
                if n - pos - 4 < size:
                    break
                start = pos + 4
                pos = start + size
                if size == 0:  # handler.ex: "Empty TCP payload - ignore"
                    continue
                out.append(self._decode(bytes(buf[start:pos])))
        except (RemoteProtocolError, DecodeError) as e:
            self.error = e
            buf.clear()
            return out
        del buf[:pos]
        return out


# -- the older BARE message encoding (Ockam.Wire.Binary.V2) ---------------------------------
# Before the CBOR TransportMessage, the Elixir implementation encoded a routing message with
# BARE (``lib/ockam/wire/binary/v2.ex``): ``{version: uint, onward_route: []Address,
# return_route: []Address, payload: data}`` with ``Address {type: uint, value: data}``, version 1.
# Kept for peers and stored data of that era; the TCP transport above uses the CBOR form.
WIRE_BINARY_VERSION = 1
"""v2.ex: ``@version 1``."""


@dataclass(frozen=True, slots=True)
class _WireBinary:
    version: int
    onward_route: tuple[Address, ...]
    return_route: tuple[Address, ...]
    payload: bytes


def _wire_binary_schema() -> bare.Struct:
    address = bare.Struct(Address, ("type", bare.UINT), ("value", bare.DATA))
    return bare.Struct(
        _WireBinary,
        ("version", bare.UINT),
        ("onward_route", bare.Array(address)),
        ("return_route", bare.Array(address)),
        ("payload", bare.DATA),
    )


_WIRE_BINARY = _wire_binary_schema()


def encode_wire_binary(msg: RoutingMessage) -> bytes:
    """``Ockam.Wire.Binary.V2.encode`` (BARE)."""
    return bare.encode(
        _WIRE_BINARY,
        _WireBinary(WIRE_BINARY_VERSION, msg.onward_route, msg.return_route, msg.payload),
    )


def decode_wire_binary(data: bytes) -> RoutingMessage:
    """``Ockam.Wire.Binary.V2.decode``: strict, whole input; other versions → ``DecodeError``."""
    m = bare.decode(_WIRE_BINARY, data)
    if m.version != WIRE_BINARY_VERSION:
        raise OckamWireError(f"Ockam wire version {m.version}, expected {WIRE_BINARY_VERSION}")
    return RoutingMessage(m.onward_route, m.return_route, m.payload)


def tcp_address(host: str, port: int) -> Address:
    """An IPv4 ``TCPAddress`` as Ockam serializes it (v2_test.exs: type 1, value = 0x00, the 4
    address octets, the port as u16 little-endian)."""
    return Address(
        ADDRESS_TYPE_TCP, b"\x00" + ipaddress.IPv4Address(host).packed + port.to_bytes(2, "little")
    )
