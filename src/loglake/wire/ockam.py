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
import itertools
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


@dataclass(slots=True)
class MessageRun:
    """Several messages on the same routes, one after the other: a worker's replies to one
    return route (a burst's push confirms). Framed as those ``RoutingMessage``s would be,
    byte for byte (``frame_parts``), and equal to them by ``messages()``.

    Why: the stream service answers every pushed message with its own frame; building a
    ``RoutingMessage`` per confirm and looking up its routes per frame cost the server about
    0.4 µs a push (issue 16). A run carries the payloads alone."""

    onward_route: Route
    return_route: Route
    payloads: list[bytes]

    def messages(self) -> list[RoutingMessage]:
        return [RoutingMessage(self.onward_route, self.return_route, p) for p in self.payloads]


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


def encode_frame(msg: RoutingMessage) -> bytes:
    """``{:packet, 4}`` framing: 4-byte big-endian length + the CBOR body."""
    body = encode_transport_message(msg)
    return _LEN.pack(len(body)) + body


_SMALL_BYTES_HEADS = [bytes((0x40 | n,)) for n in range(24)]


def cbor_bytes_head(n: int) -> bytes:
    """The head of a definite-length CBOR byte string of ``n`` bytes (RFC 8949 §3.1, major
    type 2, shortest argument: the same bytes ``cbor2.dumps`` writes before the content)."""
    if n < 24:
        return _SMALL_BYTES_HEADS[n]
    if n < 0x100:
        return bytes((0x58, n))
    if n < 0x10000:
        return b"\x59" + n.to_bytes(2, "big")
    if n < 0x100000000:
        return b"\x5a" + n.to_bytes(4, "big")
    return b"\x5b" + n.to_bytes(8, "big")


_HEADS_MAX = 4096


class FrameTemplate:
    """Frames for many payloads on the same routes (no tracing context): the array header and
    both routes are encoded once; a frame is then ``head(len(payload)) + payload``, where the
    head (length, array header, routes, the payload's byte-string head) is cached per payload
    size. Same bytes as ``encode_frame`` (tested). Why: the push path frames every message,
    and the routes and sizes of a burst repeat."""

    __slots__ = ("_heads", "prefix")

    def __init__(self, onward_route: Route, return_route: Route) -> None:
        self.prefix = b"\x83" + encode_route(onward_route) + encode_route(return_route)
        self._heads: dict[int, bytes] = {}

    def head(self, payload_len: int) -> bytes:
        """Everything of a frame before a payload of ``payload_len`` bytes."""
        h = self._heads.get(payload_len)
        if h is None:
            ph = cbor_bytes_head(payload_len)
            h = _LEN.pack(len(self.prefix) + len(ph) + payload_len) + self.prefix + ph
            if len(self._heads) >= _HEADS_MAX:
                self._heads.clear()
            self._heads[payload_len] = h
        return h

    def frame(self, payload: bytes) -> bytes:
        return self.head(len(payload)) + payload


_HEADS_PER_ROUTES_MAX = 64
_last_routes: tuple[Route | None, Route | None, bytes, dict[int, bytes]] = (None, None, b"", {})
"""The routes ``frame_parts`` framed last (the very objects), their encoding and frame heads
by payload size: a server answering one push at a time frames every reply on the same route
objects (the client's return route as its decoder hands it out, the worker's route), so the
encoding is reused without hashing the routes. Replaced whole (one assignment), so a thread
never sees one route's encoding with another's objects."""


def frame_parts(msgs: Sequence[RoutingMessage | MessageRun]) -> list[bytes]:
    """The frames of ``msgs`` as a list of byte strings whose concatenation is
    ``encode_frames(msgs)``: a head per frame, then its payload as given (not copied), for
    ``writelines``/``sendmsg`` or one ``join``. Consecutive messages on the same route objects
    (a burst of replies to one return route) share one encoding of their routes, and one head
    per payload size; a ``MessageRun`` is framed as its messages, with no object per frame."""
    global _last_routes
    parts: list[bytes] = []
    add = parts.append
    last_on: Route | None = None
    last_ret: Route | None = None
    prefix = b""
    heads: dict[int, bytes] = {}
    payloads: Sequence[bytes]
    for m in msgs:
        if isinstance(m, MessageRun):
            payloads = m.payloads
        elif m.tracing_context is not None:
            body = encode_transport_message(m)
            add(_LEN.pack(len(body)))
            add(body)
            continue
        else:
            payloads = (m.payload,)
        on, ret = m.onward_route, m.return_route
        if on is not last_on or ret is not last_ret:
            last_on, last_ret, prefix, heads = _last_routes
            if on is not last_on or ret is not last_ret:
                prefix = b"\x83" + encode_route(on) + encode_route(ret)
                _last_routes = last_on, last_ret, prefix, heads = on, ret, prefix, {}
            elif len(heads) > _HEADS_PER_ROUTES_MAX:
                heads.clear()
        for payload in payloads:
            n = len(payload)
            h = heads.get(n)
            if h is None:
                ph = cbor_bytes_head(n)
                h = heads[n] = _LEN.pack(len(prefix) + len(ph) + n) + prefix + ph
            add(h)
            add(payload)
    return parts


def encode_frames(msgs: Sequence[RoutingMessage | MessageRun]) -> bytes:
    """The frames of ``msgs``, back to back (``frame_parts`` joined)."""
    return b"".join(frame_parts(msgs))


Frame = tuple[Route, Route, bytes, str | None]
"""One decoded frame: ``(onward_route, return_route, payload, tracing_context)``, the fields
of a ``RoutingMessage`` without building one (``TcpConnection.receive_frames``)."""


class TcpConnection:
    """Sans-I/O Ockam TCP connection (one side): version exchange, then framed messages.

    ``initial_bytes()`` gives what to send first (the version byte); feed every received chunk to
    ``receive_data`` and it returns the messages completed so far (``receive_frames``: the same
    as tuples, for a hot path that needs no ``RoutingMessage``). A protocol violation (bad
    version, frame too large, a body that is not a ``TCPMessage``) sets ``error`` to a typed
    exception; the messages completed before it are still returned (nothing valid is lost), later
    bytes are ignored, and the caller should close the socket — as the reference handler stops on
    a decode error.

    All complete frames of a chunk are decoded in one pass over it, by offset (no copy of a
    frame's body when its routes repeat: only its payload is sliced out); only an incomplete
    frame at the end is kept, and it is joined with what comes next once it can be complete.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        """The start of a frame not complete yet (nothing else is kept between calls)."""
        self._need = 0
        """How many bytes ``_buf`` must hold before another pass can complete a frame."""
        self._version_ok = False
        self.error: RemoteProtocolError | DecodeError | None = None
        self._last: tuple[bytes, Route, Route] | None = None

    @staticmethod
    def initial_bytes() -> bytes:
        return VERSION_BYTE

    def _decode(self, body: bytes) -> RoutingMessage:
        """``decode_transport_message``; remembers the routes of a plain message (no tracing
        context), so the next frames on the same routes take the shortcut in
        ``receive_frames``: if a body starts with the canonical CBOR of the last routes seen
        (array header, onward route, return route), CBOR being self-delimiting, those are its
        first items and only the payload is left to decode."""
        msg = decode_transport_message(body)
        if msg.tracing_context is None:
            prefix = b"\x83" + encode_route(msg.onward_route) + encode_route(msg.return_route)
            if body.startswith(prefix):
                self._last = (prefix, msg.onward_route, msg.return_route)
        return msg

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[RoutingMessage]:
        return list(itertools.starmap(RoutingMessage, self.receive_frames(data)))

    def receive_frames(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """The frames ``data`` completes, as ``(onward, return, payload, tracing)`` tuples.
        Nothing refers to ``data`` afterwards (a caller may reuse its buffer)."""
        out: list[Frame] = []
        if self.error is not None:
            return out
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return out
            buf = bytes(self._buf)
            self._buf = bytearray()
        else:
            buf = data if type(data) is bytes else bytes(data)
        n = len(buf)
        pos = 0
        size = 0
        add = out.append
        try:
            if not self._version_ok:
                if not n:
                    return out
                if buf[0] != PROTOCOL_VERSION:
                    raise BadProtocolVersion(buf[0])
                pos = 1
                self._version_ok = True
            last = self._last
            unpack, limit = _LEN.unpack_from, self.max_frame
            while n - pos >= 4:
                (size,) = unpack(buf, pos)
                if size > limit:
                    raise FrameTooLarge(size, limit)
                start = pos + 4
                end = start + size
                if end > n:
                    break
                pos = end
                if size == 0:  # handler.ex: "Empty TCP payload - ignore"
                    continue
                if last is not None and buf.startswith(last[0], start, end):
                    # a definite-length byte string must fill the rest exactly, else: full decode
                    p = start + len(last[0])
                    if p < end:
                        head = buf[p]
                        if 0x40 <= head < 0x58:
                            ps, length = p + 1, head - 0x40
                        elif head == 0x59 and p + 3 <= end:
                            ps, length = p + 3, (buf[p + 1] << 8) | buf[p + 2]
                        elif head == 0x58 and p + 2 <= end:
                            ps, length = p + 2, buf[p + 1]
                        elif head == 0x5A and p + 5 <= end:
                            ps, length = p + 5, int.from_bytes(buf[p + 1 : p + 5], "big")
                        else:
                            ps, length = end, -1
                        if ps + length == end:
                            add((last[1], last[2], buf[ps:end], None))
                            continue
                msg = self._decode(buf[start:end])
                last = self._last
                add((msg.onward_route, msg.return_route, msg.payload, msg.tracing_context))
        except (RemoteProtocolError, DecodeError) as e:
            self.error = e
            return out
        if pos < n:
            self._buf = bytearray(memoryview(buf)[pos:])
            self._need = 4 + size if n - pos >= 4 else 4
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
