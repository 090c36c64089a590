"""Ockam routing messages and the Ockam TCP transport framing, sans-I/O.

Follows build-trust/ockam at commit fb8fb64 (Elixir implementation, checked against the Rust one):
- ``implementations/elixir/ockam/ockam/lib/ockam/transport/tcp/handler.ex``: right after the TCP
  connection opens each side sends one protocol version byte ``1`` and expects ``1`` back within
  5 s (``transport.recv(socket, 1, 5000)``; "Header, protocol version "1" must be the first thing
  exchanged"); afterwards the socket runs in ``{:packet, 4}`` mode: every frame is a 4-byte
  big-endian length then that many bytes. An empty frame is ignored; a frame that does not decode
  stops the handler (closes the connection).
- ``.../transport/tcp/transport_message.ex``: the frame body is the CBOR ``TCPMessage``, a
  TypedCBOR struct ``encode_as: :list``: an array of exactly four items ``[onward_route,
  return_route, payload, tracing_context]``. Each address is ``AddressSchema``, a
  ``:struct_values`` struct, so also an array: ``[type (integer), value (byte string)]``;
  ``payload`` is a byte string; ``tracing_context`` is a text string or null (an absent optional
  field of a ``:struct_values`` struct is encoded as null, never left out). The decoder is
  ``decode_strict``: a different item count ("expected 4 fields, got 3"), a wrong type or bytes
  after the array are refused.
- Rust, the same commit: ``ockam_transport_tcp/src/transport_message.rs`` (``TcpTransportMessage``
  with fields ``n(0)``..``n(3)``), ``ockam_core/src/routing/address.rs`` (``Address {tt:
  TransportType(u8), inner: bytes}``, minicbor's array encoding) and ``route.rs`` (a transparent
  array of addresses) agree with the Elixir schema.
- ``Ockam.Address``: type ``0`` is a local (worker) address; ``Ockam.Transport.TCPAddress``
  (``transport/tcp/address.ex``): type ``1``, value the text ``"host:port"``.

Encoding has one path. A frame is ``length, 0x84, onward route, return route, payload's
byte-string head, payload, tracing context``; ``frame_head``/``frame_tail`` build the parts around
the payload, and every encoder here (``encode_transport_message``, ``frame_parts``,
``FrameTemplate``) is those two functions with the route encoding memoised — so the bytes of a
burst of confirms and of a single reply cannot differ. Decoding is ``decode_transport_message``;
``TcpConnection`` only skips re-decoding a frame whose bytes are exactly ``frame_head(routes seen
before, n) + payload + frame_tail(None)``, checked with those same functions.

The frame size limit is loglake's (the reference has none): a peer announcing a larger frame is a
protocol error and the connection should be closed.

CBOR is ``cbor2`` (a kept library), not hand-written; only the byte-string head of RFC 8949
§3.1 is written here, to frame a payload without copying it (tested against ``cbor2``).
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

REFERENCE_COMMIT = "fb8fb64"
"""The build-trust/ockam commit this wire follows."""

PROTOCOL_VERSION = 1
"""handler.ex: ``transport.send(socket, <<1>>)``, then ``{:ok, <<1>>} = transport.recv(...)``."""
VERSION_BYTE = bytes((PROTOCOL_VERSION,))

VERSION_TIMEOUT = 5.0
"""Seconds a peer has to send its version byte after the connection opens (handler.ex:
``transport.recv(socket, 1, 5000)``); a server drops a peer silent for longer."""

ADDRESS_TYPE_LOCAL = 0
"""Ockam.Address: local worker address type."""
ADDRESS_TYPE_TCP = 1
"""Ockam.Transport.TCPAddress type."""

DEFAULT_MAX_FRAME = 32 * 1024 * 1024
"""loglake's server limit on one frame (the reference has none)."""
MAX_WIRE_FRAME = 2**32 - 1
"""The largest frame the 4-byte length can state: the reference transport's only limit
(handler.ex ``{:packet, 4}``)."""

_LEN = struct.Struct(">I")
_TCP_MESSAGE_HEAD = b"\x84"
"""CBOR array of 4 items (RFC 8949 §3.1, major type 4): the ``TCPMessage``."""
_NULL = b"\xf6"
"""CBOR null: no tracing context."""


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
    """An Ockam address ``[type, value]``."""

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
    0.4 µs a push. A run carries the payloads alone."""

    onward_route: Route
    return_route: Route
    payloads: list[bytes]

    def messages(self) -> list[RoutingMessage]:
        return [RoutingMessage(self.onward_route, self.return_route, p) for p in self.payloads]


def route(*names: str | Address) -> Route:
    return tuple(n if isinstance(n, Address) else Address.local(n) for n in names)


def route_text(r: Route) -> str:
    """A route for people: its addresses' names joined by `` => `` (the spec's notation,
    ``onward_route: ... => stream_service``); a one-hop route is its address's name."""
    return " => ".join(a.name for a in r)


def tcp_address(host: str, port: int) -> Address:
    """A ``TCPAddress`` (``transport/tcp/address.ex`` ``format_host_port``): type 1, value the
    text ``"host:port"``. An IPv6 host is written bare, as the reference does (it has a TODO to
    bracket it)."""
    return Address(ADDRESS_TYPE_TCP, f"{host}:{port}".encode())


# -- TCPMessage <-> CBOR: the one encoder ----------------------------------------------------


_ROUTE_CACHE: dict[Route, bytes] = {}
_ROUTE_CACHE_MAX = 8192


def encode_route(r: Route) -> bytes:
    """CBOR array of ``[type, value]`` address arrays (``{:list, AddressSchema}``); memoised,
    since a connection repeats a few routes."""
    b = _ROUTE_CACHE.get(r)
    if b is None:
        b = cbor2.dumps([[a.type, a.value] for a in r])
        if len(_ROUTE_CACHE) >= _ROUTE_CACHE_MAX:
            _ROUTE_CACHE.clear()
        _ROUTE_CACHE[r] = b
    return b


def routes_prefix(onward_route: Route, return_route: Route) -> bytes:
    """A ``TCPMessage``'s bytes before its payload: the 4-array head and both routes."""
    return _TCP_MESSAGE_HEAD + encode_route(onward_route) + encode_route(return_route)


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


def frame_tail(tracing_context: str | None) -> bytes:
    """A ``TCPMessage``'s bytes after its payload: the tracing context, or null."""
    return _NULL if tracing_context is None else cbor2.dumps(tracing_context)


def frame_head(prefix: bytes, payload_len: int, tail_len: int = 1) -> bytes:
    """A frame's bytes before a payload of ``payload_len`` bytes: the ``{:packet, 4}`` length,
    ``prefix`` (``routes_prefix``) and the payload's byte-string head. ``tail_len``: the length
    of the ``frame_tail`` that follows the payload (1: no tracing context)."""
    ph = cbor_bytes_head(payload_len)
    return _LEN.pack(len(prefix) + len(ph) + payload_len + tail_len) + prefix + ph


def encode_transport_message(msg: RoutingMessage) -> bytes:
    """CBOR ``TCPMessage`` (transport_message.ex) of ``msg``: a frame without its length."""
    return encode_frame(msg)[4:]


def encode_frame(msg: RoutingMessage) -> bytes:
    """``{:packet, 4}`` framing: 4-byte big-endian length + the CBOR body."""
    return b"".join(frame_parts((msg,)))


_HEADS_MAX = 4096


class FrameTemplate:
    """Frames for many payloads on the same routes (no tracing context): ``frame_head`` cached
    per payload size. Why: the client frames every push, and the routes and sizes of a burst
    repeat. A frame is ``head(len(payload)) + payload + TAIL``."""

    __slots__ = ("_heads", "prefix")

    TAIL = _NULL
    """What follows the payload (no tracing context)."""

    def __init__(self, onward_route: Route, return_route: Route) -> None:
        self.prefix = routes_prefix(onward_route, return_route)
        self._heads: dict[int, bytes] = {}

    def head(self, payload_len: int) -> bytes:
        """Everything of a frame before a payload of ``payload_len`` bytes."""
        h = self._heads.get(payload_len)
        if h is None:
            if len(self._heads) >= _HEADS_MAX:
                self._heads.clear()
            h = self._heads[payload_len] = frame_head(self.prefix, payload_len)
        return h

    def frame(self, payload: bytes) -> bytes:
        return self.head(len(payload)) + payload + _NULL


_HEADS_PER_ROUTES_MAX = 64
_last_routes: tuple[Route | None, Route | None, bytes, dict[int, bytes]] = (None, None, b"", {})
"""The routes ``frame_parts`` framed last (the very objects), their ``routes_prefix`` and frame
heads by payload size: a server answering one push at a time frames every reply on the same
route objects (the client's return route as its decoder hands it out, the worker's route), so
the encoding is reused without hashing the routes. Replaced whole (one assignment), so a thread
never sees one route's encoding with another's objects."""


def frame_parts(msgs: Sequence[RoutingMessage | MessageRun]) -> list[bytes]:
    """The frames of ``msgs`` as a list of byte strings whose concatenation is
    ``encode_frames(msgs)``: per frame a head, its payload as given (not copied) and a tail,
    for ``writelines``/``sendmsg`` or one ``join``. Consecutive messages on the same route
    objects (a burst of replies to one return route) share one encoding of their routes, and
    one head per payload size; a ``MessageRun`` is framed as its messages, with no object per
    frame."""
    global _last_routes
    parts: list[bytes] = []
    add = parts.append
    last_on: Route | None = None
    last_ret: Route | None = None
    prefix = b""
    heads: dict[int, bytes] = {}
    payloads: Sequence[bytes]
    for m in msgs:
        on, ret = m.onward_route, m.return_route
        if isinstance(m, MessageRun):
            payloads = m.payloads
        elif m.tracing_context is not None:
            tail = frame_tail(m.tracing_context)
            add(frame_head(routes_prefix(on, ret), len(m.payload), len(tail)))
            add(m.payload)
            add(tail)
            continue
        else:
            payloads = (m.payload,)
        if on is not last_on or ret is not last_ret:
            last_on, last_ret, prefix, heads = _last_routes
            if on is not last_on or ret is not last_ret:
                prefix = routes_prefix(on, ret)
                _last_routes = last_on, last_ret, prefix, heads = on, ret, prefix, {}
            elif len(heads) > _HEADS_PER_ROUTES_MAX:
                heads.clear()
        for payload in payloads:
            n = len(payload)
            h = heads.get(n)
            if h is None:
                h = heads[n] = frame_head(prefix, n)
            add(h)
            add(payload)
            add(_NULL)
    return parts


def encode_frames(msgs: Sequence[RoutingMessage | MessageRun]) -> bytes:
    """The frames of ``msgs``, back to back (``frame_parts`` joined)."""
    return b"".join(frame_parts(msgs))


# -- decoding ---------------------------------------------------------------------------------

_ADDRESS_CACHE: dict[tuple[int, bytes], Address] = {}


def _address(term: object) -> Address:
    """``AddressSchema.from_cbor_term``: ``[type, value]``, type an integer 0..255 (the
    ``Ockam.Address`` type guard; Rust's ``TransportType(u8)``), value a byte string."""
    if type(term) is not list or len(term) != 2:
        raise OckamWireError(f"address must be an array [type, value], got {term!r:.80}")
    t, v = term
    if type(t) is not int or not 0 <= t <= 255:
        raise OckamWireError(f"address type must be an integer 0..255, got {t!r:.40}")
    if type(v) is not bytes:
        raise OckamWireError(f"address value must be a byte string, got {type(v).__name__}")
    key = (t, v)
    a = _ADDRESS_CACHE.get(key)
    if a is None:
        if len(_ADDRESS_CACHE) >= _ROUTE_CACHE_MAX:
            _ADDRESS_CACHE.clear()
        a = _ADDRESS_CACHE[key] = Address(t, v)
    return a


def _route(term: object, what: str) -> Route:
    if type(term) is not list:
        raise OckamWireError(f"{what} must be an array, got {type(term).__name__}")
    return tuple(_address(a) for a in term)


def decode_transport_message(body: bytes) -> RoutingMessage:
    """``TransportMessage.decode`` (``TCPMessage.decode_strict``): one CBOR array of exactly
    four items and nothing after it; anything else → ``OckamWireError``."""
    stream = io.BytesIO(body)
    try:
        term = cbor2.CBORDecoder(stream).decode()
    except Exception as e:  # cbor2 raises CBORDecodeError, and others on odd tags
        raise OckamWireError(f"frame is not valid CBOR: {e}") from None
    if stream.tell() != len(body):
        raise OckamWireError(f"{len(body) - stream.tell()} trailing bytes after the TCPMessage")
    if type(term) is not list:
        raise OckamWireError(f"TCPMessage must be an array, got {type(term).__name__}")
    if len(term) != 4:
        raise OckamWireError(f"TCPMessage: expected 4 fields, got {len(term)}")
    onward = _route(term[0], "onward_route")
    ret = _route(term[1], "return_route")
    payload, tracing = term[2], term[3]
    if type(payload) is not bytes:
        raise OckamWireError(f"payload must be a byte string, got {type(payload).__name__}")
    if tracing is not None and type(tracing) is not str:
        raise OckamWireError(
            f"tracing_context must be a text string or null, got {type(tracing).__name__}"
        )
    return RoutingMessage(onward, ret, payload, tracing)


Frame = tuple[Route, Route, bytes, str | None]
"""One decoded frame: ``(onward_route, return_route, payload, tracing_context)``, the fields
of a ``RoutingMessage`` without building one (``TcpConnection.receive_frames``)."""


def _payload_head(size: int) -> bytes:
    """The byte-string head ``cbor_bytes_head(n)`` for which ``len(head) + n == size``, or
    ``b""`` if there is none (no canonical byte string is ``size`` bytes long: 25, for one).
    A frame is 4 bytes of length, so ``n < 2**32`` and the head is at most 5 bytes."""
    hs = 1 if size <= 24 else 2 if size <= 257 else 3 if size <= 65538 else 5
    head = cbor_bytes_head(size - hs) if size >= hs else b""
    return head if len(head) == hs else b""


class TcpConnection:
    """Sans-I/O Ockam TCP connection (one side): version exchange, then framed messages.

    ``initial_bytes()`` gives what to send first (the version byte); feed every received chunk to
    ``receive_data`` and it returns the messages completed so far (``receive_frames``: the same
    as tuples, for a hot path that needs no ``RoutingMessage``). A protocol violation (bad
    version, frame too large, a body that is not a ``TCPMessage``) sets ``error`` to a typed
    exception; the messages completed before it are still returned (nothing valid is lost), later
    bytes are ignored, and the caller should close the socket — as the reference handler stops on
    a decode error. ``version_received`` says whether the peer's version byte has come (a server
    drops a peer that stays silent for ``VERSION_TIMEOUT``; the timer is the adapter's).

    All complete frames of a chunk are decoded in one pass over it, by offset; only an
    incomplete frame at the end is kept, and it is joined with what comes next once it can be
    complete. A frame on the same routes as the last one decoded (a burst of pushes or
    confirms), with no tracing context, is recognised by its bytes — ``frame_head(prefix, n) +
    payload + frame_tail(None)``, the encoder's own output, CBOR being self-delimiting — and
    only its payload is sliced out; any other frame goes through ``decode_transport_message``.
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
        self._heads: dict[int, bytes] = {}
        """``_payload_head`` by the size it was asked for (the sizes of a burst repeat)."""

    @staticmethod
    def initial_bytes() -> bytes:
        return VERSION_BYTE

    @property
    def version_received(self) -> bool:
        """Whether the peer's (valid) version byte has arrived."""
        return self._version_ok

    def _decode(self, body: bytes) -> RoutingMessage:
        """``decode_transport_message``; remembers the routes of a message without tracing
        context whose body starts with their canonical encoding, for ``receive_frames``."""
        msg = decode_transport_message(body)
        if msg.tracing_context is None:
            prefix = routes_prefix(msg.onward_route, msg.return_route)
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
            last, heads = self._last, self._heads
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
                if last is not None and buf[end - 1] == 0xF6 and buf.startswith(last[0], start):
                    p = start + len(last[0])
                    rest = end - 1 - p  # the payload's head and content
                    ph = heads.get(rest)
                    if ph is None:
                        ph = heads[rest] = _payload_head(rest)
                        if len(heads) > _HEADS_PER_ROUTES_MAX:
                            heads.clear()
                    if ph and buf.startswith(ph, p):
                        add((last[1], last[2], buf[p + len(ph) : end - 1], None))
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


def legacy_tcp_address(host: str, port: int) -> Address:
    """An IPv4 TCP address as the BARE era serialized it (v2_test.exs: type 1, value = 0x00,
    the 4 address octets, the port as u16 little-endian). Only for ``encode_wire_binary``'s
    vectors: the TCP transport's addresses are ``tcp_address`` (text ``"host:port"``)."""
    return Address(
        ADDRESS_TYPE_TCP, b"\x00" + ipaddress.IPv4Address(host).packed + port.to_bytes(2, "little")
    )
