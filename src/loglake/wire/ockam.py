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

Encoding CBOR is ``cbor2`` (a kept library), but for the byte-string head of RFC 8949 §3.1,
written here to frame a payload without copying it (tested against ``cbor2``). Decoding is
written here, for the one fixed shape only (``_decode_body``): a general decoder builds whatever
the peer declares before the shape can be checked (see "decoding" below); reading the shape head
by head refuses a wrong count before building anything. Differential tests hold it to ``cbor2``.
"""

from __future__ import annotations

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
_CACHED_VALUE_MAX = 256
"""The longest address value (and route encoding, ``encode_route``) kept in a cache. Found from
outside: both caches kept any size, 8,192 entries each; 300 requests each with a distinct 1 MiB
return address left the server at 708 MB after the client had gone. Longer values are decoded
or encoded each time (real ones are a few dozen bytes), so a cache holds at most
8,192 × ~0.5 KB."""


def encode_route(r: Route) -> bytes:
    """CBOR array of ``[type, value]`` address arrays (``{:list, AddressSchema}``); memoised,
    since a connection repeats a few routes."""
    b = _ROUTE_CACHE.get(r)
    if b is None:
        b = cbor2.dumps([[a.type, a.value] for a in r])
        if len(b) > _CACHED_VALUE_MAX:  # see _CACHED_VALUE_MAX: only small routes are kept
            return b
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
# Found from outside (review 5): ``cbor2`` built the whole term before its shape was checked, and
# a frame of one 0x84, then an onward route declared as 33.5 M items each the empty array 0x80,
# made ~70 bytes of Python objects per input byte: 2.4 GB and 11.7 s on the event loop for one
# 32 MiB frame, every other client waiting. So the fixed shape is read here by hand, head by head
# (RFC 8949 §3), and a count or a length is checked against the shape and the limits below before
# anything is built: no input makes more objects than the shape has (at most
# ``MAX_ROUTE_ADDRESSES`` addresses a route) nor copies more than the frame. What it takes is what
# ``cbor2`` takes for that shape, item for item (non-minimal heads, indefinite-length arrays and
# strings), and decodes to the same message (differential tests against ``cbor2`` and the
# reference-shaped peer, tests/wire/test_ockam_decode.py), but for ``OckamWireLimit``: CBOR tags
# and what is over the limits.

MAX_ROUTE_ADDRESSES = 32
"""Addresses in one route. The reference has no limit (``ockam_core`` ``Route`` is a
``VecDeque<Address>``; Elixir ``{:list, AddressSchema}``), only its 16 MB message size
(``ockam_transport_tcp/src/lib.rs`` ``MAX_MESSAGE_SIZE``), so the bound is loglake's judgement:
real routes are a few hops (a TCP connection, a secure channel, a relay, a worker; a return route
grows by one address a hop), and 32 leaves room for chains of relays. Found from outside: a
return route is copied into the head of every reply frame (a CREATE of 4,096 partitions on a
256 KiB route queued 1.07 GB of replies)."""
MAX_ADDRESS_BYTES = 512
"""Bytes in one address value. The reference has no limit (Rust ``Address {tt, inner}``, Elixir
``:binary``). The longest real values are TCP addresses, the text ``"host:port"``
(``transport/tcp/address.ex``): a DNS name of up to 253 characters (RFC 1035 §2.3.4) and the port
make 259, so 255 would refuse real hosts; worker addresses are names or short random hex
strings."""
MAX_ROUTE_BYTES = 4096
"""Bytes of address values in one route, all addresses together: what a reply frame's head can
carry of a peer's route (15 TCP addresses of the longest host names fit)."""
MAX_STRING_CHUNKS = 64
"""Chunks of one indefinite-length string (RFC 8949 §3.2.3). No reference encoder writes them
(minicbor and Elixir's CBOR write definite lengths); ``cbor2`` reads them, so they are read, but
33 M one-byte chunks in a 32 MiB frame would be a 33 M-step loop."""


class OckamWireLimit(OckamWireError):
    """A ``TCPMessage`` that loglake refuses on purpose where a plain CBOR decoder (``cbor2``, the
    reference-shaped peer) would take it: a route over ``MAX_ROUTE_ADDRESSES`` or
    ``MAX_ROUTE_BYTES``, an address over ``MAX_ADDRESS_BYTES``, a string in more than
    ``MAX_STRING_CHUNKS`` chunks, or a CBOR tag (no reference encoder writes one in a
    ``TCPMessage``, and ``cbor2``'s tags build arbitrary objects: bignums, shared references)."""


_KIND = ("an unsigned integer", "a negative integer", "a byte string", "a text string", "an array",
         "a map", "a tag", "a simple value or float")  # fmt: skip
"""RFC 8949 §3.1: the major types, for error messages."""
_ARG_SIZE = {24: 1, 25: 2, 26: 4, 27: 8}
"""Additional information 24..27: the argument follows in 1, 2, 4 or 8 bytes (RFC 8949 §3)."""
_INDEFINITE = -1
_NO_LIMIT = 2**64
"""A string with no limit of its own: the frame's length bounds it."""
_BREAK = 0xFF


def _truncated() -> OckamWireError:
    return OckamWireError("frame is not valid CBOR: truncated")


def _head(buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """The data item head at ``pos`` (RFC 8949 §3): ``(major type, argument, position after the
    head)``; the argument is ``_INDEFINITE`` for an indefinite length (§3.2.1, §3.2.3). Refuses
    what is not well-formed CBOR (§3: additional information 28..30; 31 on a type with no
    indefinite form; a break where an item must be) and tags (``OckamWireLimit``)."""
    if pos >= end:
        raise _truncated()
    b = buf[pos]
    major, ai = b >> 5, b & 0x1F
    if major == 6:
        raise OckamWireLimit("CBOR tags are not read in a TCPMessage")
    if ai < 24:
        return major, ai, pos + 1
    size = _ARG_SIZE.get(ai)
    if size is not None:
        pos += 1
        if pos + size > end:
            raise _truncated()
        return major, int.from_bytes(buf[pos : pos + size], "big"), pos + size
    if ai == 31 and 2 <= major <= 5:
        return major, _INDEFINITE, pos + 1
    what = "an unexpected break" if b == _BREAK else f"the malformed head 0x{b:02x}"
    raise OckamWireError(f"frame is not valid CBOR: {what}")


def _string(buf: bytes, pos: int, end: int, major: int, n: int, limit: int) -> tuple[bytes, int]:
    """The content of the byte or text string (``major``) whose head gave ``n``, and the position
    after it; at most ``limit`` bytes, else ``OckamWireLimit``. An indefinite-length string is the
    concatenation of definite-length chunks of the same major type (RFC 8949 §3.2.3)."""
    if n != _INDEFINITE:
        if n > limit:
            raise OckamWireLimit(f"a string of {n} bytes is over the limit of {limit}")
        stop = pos + n
        if stop > end:
            raise _truncated()
        return buf[pos:stop], stop
    chunks: list[bytes] = []
    total = 0
    while True:
        if pos < end and buf[pos] == _BREAK:
            return b"".join(chunks), pos + 1
        if len(chunks) >= MAX_STRING_CHUNKS:
            raise OckamWireLimit(f"a string in more than {MAX_STRING_CHUNKS} chunks")
        m, k, pos = _head(buf, pos, end)
        if m != major or k == _INDEFINITE:
            raise OckamWireError(f"frame is not valid CBOR: {_KIND[m]} inside {_KIND[major]}")
        total += k
        if total > limit:
            raise OckamWireLimit(f"a string of over {limit} bytes is over the limit")
        chunk, pos = _string(buf, pos, end, major, k, limit)
        chunks.append(chunk)


def _text(buf: bytes, pos: int, end: int, n: int) -> tuple[str, int]:
    """A text string's content as ``str``: each chunk must be valid UTF-8 by itself, as
    ``cbor2`` reads it (RFC 8949 §3.2.3: a chunk is a text string in its own right)."""
    try:
        if n != _INDEFINITE:
            raw, pos = _string(buf, pos, end, 3, n, _NO_LIMIT)
            return raw.decode(), pos
        parts: list[str] = []
        pos_ = pos
        while True:
            if pos_ < end and buf[pos_] == _BREAK:
                return "".join(parts), pos_ + 1
            if len(parts) >= MAX_STRING_CHUNKS:
                raise OckamWireLimit(f"a string in more than {MAX_STRING_CHUNKS} chunks")
            m, k, pos_ = _head(buf, pos_, end)
            if m != 3 or k == _INDEFINITE:
                raise OckamWireError(f"frame is not valid CBOR: {_KIND[m]} inside a text string")
            raw, pos_ = _string(buf, pos_, end, 3, k, _NO_LIMIT)
            parts.append(raw.decode())
    except UnicodeDecodeError as e:
        raise OckamWireError(f"frame is not valid CBOR: a text string is not UTF-8: {e}") from None


_ADDRESS_CACHE: dict[tuple[int, bytes], Address] = {}


def _address(buf: bytes, pos: int, end: int) -> tuple[Address, int]:
    """``AddressSchema.from_cbor_term``: ``[type, value]``, type an integer 0..255 (the
    ``Ockam.Address`` type guard; Rust's ``TransportType(u8)``), value a byte string."""
    h = buf[pos + 2] if pos + 4 <= end and buf[pos] == 0x82 and buf[pos + 1] < 24 else 0
    if 0x40 <= h <= 0x58:
        # the shortest heads of a type below 24 and a value below 256 bytes, as the reference
        # encoders write a real address: read without a call per head
        t = buf[pos + 1]
        if h < 0x58:
            pos += 3
            stop = pos + h - 0x40
        else:
            stop = pos + 4 + buf[pos + 3]
            pos += 4
        if stop > end:
            raise _truncated()
        v = buf[pos:stop]
        pos = stop
        n = 2
    else:
        t, v, n, pos = _address_any(buf, pos, end)
    if n == _INDEFINITE:
        if pos >= end:
            raise _truncated()
        if buf[pos] != _BREAK:
            raise OckamWireError("address must be an array [type, value], got more items")
        pos += 1
    if len(v) > _CACHED_VALUE_MAX:
        return Address(t, v), pos
    key = (t, v)
    a = _ADDRESS_CACHE.get(key)
    if a is None:
        if len(_ADDRESS_CACHE) >= _ROUTE_CACHE_MAX:
            _ADDRESS_CACHE.clear()
        a = _ADDRESS_CACHE[key] = Address(t, v)
    return a, pos


def _address_any(buf: bytes, pos: int, end: int) -> tuple[int, bytes, int, int]:
    """An address's head, type and value in any encoding ``cbor2`` reads: ``(type, value, the
    array's count, position)``; the caller reads the break of an indefinite-length array."""
    major, n, pos = _head(buf, pos, end)
    if major != 4 or not (n == 2 or n == _INDEFINITE):
        what = f"an array of {n}" if major == 4 else _KIND[major]
        raise OckamWireError(f"address must be an array [type, value], got {what}")
    major, t, pos = _head(buf, pos, end)
    if major != 0 or t > 255:
        got = t if major == 0 else _KIND[major]
        raise OckamWireError(f"address type must be an integer 0..255, got {got}")
    major, k, pos = _head(buf, pos, end)
    if major != 2:
        raise OckamWireError(f"address value must be a byte string, got {_KIND[major]}")
    if k > MAX_ADDRESS_BYTES:
        raise OckamWireLimit(f"an address of {k} bytes is over the limit of {MAX_ADDRESS_BYTES}")
    v, pos = _string(buf, pos, end, 2, k, MAX_ADDRESS_BYTES)
    return t, v, n, pos


def _route(buf: bytes, pos: int, end: int, what: str) -> tuple[Route, int]:
    """``{:list, AddressSchema}``: an array of addresses, at most ``MAX_ROUTE_ADDRESSES`` of
    them with at most ``MAX_ROUTE_BYTES`` of values, checked from the head (a definite count)
    or as they come (an indefinite one) — before any address is built past the limit."""
    major, n, pos = _head(buf, pos, end)
    if major != 4:
        raise OckamWireError(f"{what} must be an array, got {_KIND[major]}")
    if n > MAX_ROUTE_ADDRESSES:
        raise OckamWireLimit(f"{what} of {n} addresses is over the limit of {MAX_ROUTE_ADDRESSES}")
    out: list[Address] = []
    total = 0
    while True:
        if n == _INDEFINITE:
            if pos < end and buf[pos] == _BREAK:
                pos += 1
                break
            if len(out) >= MAX_ROUTE_ADDRESSES:
                raise OckamWireLimit(f"{what} over the limit of {MAX_ROUTE_ADDRESSES} addresses")
        elif len(out) == n:
            break
        a, pos = _address(buf, pos, end)
        total += len(a.value)
        if total > MAX_ROUTE_BYTES:
            raise OckamWireLimit(f"{what} over the limit of {MAX_ROUTE_BYTES} bytes of addresses")
        out.append(a)
    return tuple(out), pos


def _decode_body(buf: bytes, pos: int, end: int) -> RoutingMessage:
    """``decode_transport_message`` of ``buf[pos:end]``, without slicing it out first."""
    major, n, pos = _head(buf, pos, end)
    if major != 4:
        raise OckamWireError(f"TCPMessage must be an array, got {_KIND[major]}")
    if n != 4 and n != _INDEFINITE:
        raise OckamWireError(f"TCPMessage: expected 4 fields, got {n}")
    onward, pos = _route(buf, pos, end, "onward_route")
    ret, pos = _route(buf, pos, end, "return_route")
    major, k, pos = _head(buf, pos, end)
    if major != 2:
        raise OckamWireError(f"payload must be a byte string, got {_KIND[major]}")
    payload, pos = _string(buf, pos, end, 2, k, _NO_LIMIT)
    tracing: str | None = None
    if pos < end and buf[pos] == 0xF6:  # null
        pos += 1
    else:
        major, k, pos = _head(buf, pos, end)
        if major != 3:
            raise OckamWireError(
                f"tracing_context must be a text string or null, got {_KIND[major]}"
            )
        tracing, pos = _text(buf, pos, end, k)
    if n == _INDEFINITE:
        if pos >= end:
            raise _truncated()
        if buf[pos] != _BREAK:
            raise OckamWireError("TCPMessage: expected 4 fields, got more")
        pos += 1
    if pos != end:
        raise OckamWireError(f"{end - pos} trailing bytes after the TCPMessage")
    return RoutingMessage(onward, ret, payload, tracing)


def decode_transport_message(body: bytes) -> RoutingMessage:
    """``TransportMessage.decode`` (``TCPMessage.decode_strict``): one CBOR array of exactly
    four items and nothing after it; anything else → ``OckamWireError`` (``OckamWireLimit``
    past loglake's limits), in time and memory bounded by the frame's length. Any bytes-like
    ``body`` (a ``bytearray`` one raised ``TypeError`` from the address cache)."""
    if type(body) is not bytes:
        body = bytes(body)
    return _decode_body(body, 0, len(body))


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

    def _decode(self, buf: bytes, start: int, end: int) -> RoutingMessage:
        """``decode_transport_message(buf[start:end])``; remembers the routes of a message
        without tracing context whose body starts with their canonical encoding, for
        ``receive_frames``."""
        msg = _decode_body(buf, start, end)
        if msg.tracing_context is None:
            prefix = routes_prefix(msg.onward_route, msg.return_route)
            if buf.startswith(prefix, start, end):
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
                msg = self._decode(buf, start, end)
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
