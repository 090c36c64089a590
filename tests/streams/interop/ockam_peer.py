"""A reference-shaped Ockam peer: a small client and a small stream service, written from the
reference's schemas (build-trust/ockam at commit fb8fb64, Elixir) with ``cbor2`` and a few lines of
BARE — sharing no code with loglake, so a misreading in loglake's codec cannot hide here.

What it follows:
- ``transport/tcp/handler.ex``: each side sends the version byte ``1`` first and waits at most
  5 s for the other's; then frames are ``{:packet, 4}`` (4-byte big-endian length, body).
- ``transport/tcp/transport_message.ex``: the body is the TypedCBOR ``TCPMessage`` (``encode_as:
  :list``), ``[onward_route, return_route, payload, tracing_context]``; an address is ``[type,
  value bytes]``. Decoding is ``decode_strict``: exactly 4 fields, nothing after them.
- ``protocol/protocol.ex`` ``base_encode``: payload = BARE ``{protocol: string, data: data}``;
  ``protocol/stream.ex`` and ``stream_partitioned.ex``: each protocol's request/response schema; a
  request with several shapes (``get | save``) is a BARE union tagged in declared order.
- ``stream/index/shard.ex``: a save is a cast — the service sends nothing back.
"""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import threading
from dataclasses import dataclass, field

import cbor2

VERSION = b"\x01"
VERSION_WAIT = 5.0
"""handler.ex: ``transport.recv(socket, 1, 5000)``."""

Addr = tuple[int, bytes]


def local(name: str) -> Addr:
    return (0, name.encode())


# -- BARE (the handful of types the stream protocols use) ------------------------------------
def uint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def string(s: str) -> bytes:
    b = s.encode()
    return uint(len(b)) + b


def data(b: bytes) -> bytes:
    return uint(len(b)) + b


def optional(v, enc) -> bytes:
    return b"\x00" if v is None else b"\x01" + enc(v)


class Reader:
    def __init__(self, b: bytes) -> None:
        self.b, self.pos = b, 0

    def uint(self) -> int:
        n = shift = 0
        while True:
            c = self.b[self.pos]
            self.pos += 1
            n |= (c & 0x7F) << shift
            shift += 7
            if not c & 0x80:
                return n

    def data(self) -> bytes:
        n = self.uint()
        out = self.b[self.pos : self.pos + n]
        assert len(out) == n, "data past the end"
        self.pos += n
        return out

    def string(self) -> str:
        return self.data().decode()

    def optional(self, read):
        flag = self.b[self.pos]
        self.pos += 1
        assert flag in (0, 1), f"optional flag {flag}"
        return read() if flag else None

    def end(self) -> None:
        assert self.pos == len(self.b), f"{len(self.b) - self.pos} trailing bytes"


def base(protocol: str, body: bytes) -> bytes:
    """``Ockam.Protocol.base_encode``."""
    return string(protocol) + data(body)


def unbase(payload: bytes) -> tuple[str, Reader]:
    r = Reader(payload)
    name, body = r.string(), r.data()
    r.end()
    return name, Reader(body)


# -- protocol/stream.ex, stream_partitioned.ex: requests ---------------------------------------
def create(name: str | None) -> bytes:
    return base("stream_create", optional(name, string))


def create_partitioned(name: str | None, partitions: int) -> bytes:
    return base("stream_create_partitioned", optional(name, string) + uint(partitions))


def push(request_id: int, payload: bytes) -> bytes:
    return base("stream_push", uint(request_id) + data(payload))


def pull(request_id: int, index: int, limit: int) -> bytes:
    return base("stream_pull", uint(request_id) + uint(index) + uint(limit))


def index_get(client: str, stream: str) -> bytes:
    return base("stream_index", uint(0) + string(client) + string(stream))


def index_save(client: str, stream: str, index: int) -> bytes:
    return base("stream_index", uint(1) + string(client) + string(stream) + uint(index))


def index_get_partitioned(client: str, stream: str, partition: int) -> bytes:
    body = uint(0) + string(client) + string(stream) + uint(partition)
    return base("stream_index_partitioned", body)


def index_save_partitioned(client: str, stream: str, partition: int, index: int) -> bytes:
    body = uint(1) + string(client) + string(stream) + uint(partition) + uint(index)
    return base("stream_index_partitioned", body)


# -- responses ----------------------------------------------------------------------------------
def init(name: str) -> bytes:
    return base("stream_create", string(name))


def init_partitioned(name: str, partition: int) -> bytes:
    return base("stream_create_partitioned", string(name) + uint(partition))


def push_confirm(request_id: int, ok: bool, index: int) -> bytes:
    return base("stream_push", uint(request_id) + uint(0 if ok else 1) + uint(index))


def pull_response(request_id: int, messages: list[tuple[int, bytes]]) -> bytes:
    body = uint(request_id) + uint(len(messages))
    body += b"".join(uint(i) + data(d) for i, d in messages)
    return base("stream_pull", body)


def index_response(client: str, stream: str, index: int | None) -> bytes:
    return base("stream_index", string(client) + string(stream) + optional(index, uint))


def index_response_partitioned(client: str, stream: str, partition: int, index: int | None):
    body = string(client) + string(stream) + uint(partition) + optional(index, uint)
    return base("stream_index_partitioned", body)


def error(reason: str) -> bytes:
    return base("error", string(reason))


def decode_response(payload: bytes):
    """``(protocol, fields)`` of a response the service sends (the reference's schemas)."""
    name, r = unbase(payload)
    if name == "error":
        out: tuple = (r.string(),)
    elif name == "stream_create":
        out = (r.string(),)
    elif name in ("stream_create_partitioned", "stream_create_partitions"):
        out = (r.string(), r.uint())
    elif name == "stream_push":
        out = (r.uint(), ["ok", "error"][r.uint()], r.uint())
    elif name == "stream_pull":
        rid, n = r.uint(), r.uint()
        out = (rid, [(r.uint(), r.data()) for _ in range(n)])
    elif name == "stream_index":
        out = (r.string(), r.string(), r.optional(r.uint))
    elif name == "stream_index_partitioned":
        out = (r.string(), r.string(), r.uint(), r.optional(r.uint))
    else:
        raise AssertionError(f"unknown response protocol {name!r}")
    r.end()
    return name, out


# -- transport_message.ex -----------------------------------------------------------------------
@dataclass
class Message:
    onward: list[Addr]
    ret: list[Addr]
    payload: bytes
    tracing: str | None = None


def encode_message(m: Message) -> bytes:
    """``TransportMessage.encode``: the 4-item list, addresses ``[type, value]``."""
    return cbor2.dumps(
        [[[t, v] for t, v in m.onward], [[t, v] for t, v in m.ret], m.payload, m.tracing]
    )


def frame(m: Message) -> bytes:
    body = encode_message(m)
    return struct.pack(">I", len(body)) + body


class BadFrame(Exception):
    pass


def decode_message(body: bytes) -> Message:
    """``TCPMessage.decode_strict``."""
    s = io.BytesIO(body)
    try:
        term = cbor2.CBORDecoder(s).decode()
    except Exception as e:  # cbor2: CBORDecodeError, and others on odd tags
        raise BadFrame(str(e)) from None
    if s.tell() != len(body):
        raise BadFrame("extra_data")
    if not isinstance(term, list) or len(term) != 4:
        raise BadFrame(f"expected 4 fields, got {term!r:.60}")

    def addrs(x) -> list[Addr]:
        if not isinstance(x, list):
            raise BadFrame("route is not a list")
        out = []
        for a in x:
            # the type is Ockam.Address's 0..255 (Rust: TransportType(u8)), the value :binary
            ok = isinstance(a, list) and len(a) == 2 and type(a[0]) is int and type(a[1]) is bytes
            ok = ok and 0 <= a[0] <= 255
            if not ok:
                raise BadFrame(f"bad address {a!r:.40}")
            out.append((a[0], a[1]))
        return out

    onward, ret, payload, tracing = term
    if type(payload) is not bytes or not (tracing is None or type(tracing) is str):
        raise BadFrame("payload/tracing_context")
    return Message(addrs(onward), addrs(ret), payload, tracing)


def read_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError("closed")
        out += got
    return out


def read_message(sock: socket.socket) -> Message:
    while True:
        (size,) = struct.unpack(">I", read_exact(sock, 4))
        if size:  # handler.ex: an empty frame is ignored
            return decode_message(read_exact(sock, size))


class PeerClient:
    """A reference-shaped client connection: version byte first, then frames."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.sendall(VERSION)
        self.sock.settimeout(VERSION_WAIT)
        got = read_exact(self.sock, 1)
        assert got == VERSION, f"version byte {got!r}"
        self.sock.settimeout(timeout)

    def send(self, onward: list[Addr], payload: bytes, ret: str = "app", tracing=None) -> None:
        self.sock.sendall(frame(Message(onward, [local(ret)], payload, tracing)))

    def call(self, onward: list[Addr], payload: bytes, ret: str = "app") -> Message:
        self.send(onward, payload, ret)
        return self.recv()

    def recv(self) -> Message:
        return read_message(self.sock)

    def nothing_within(self, seconds: float) -> bool:
        """True if no frame arrives in ``seconds``."""
        self.sock.settimeout(seconds)
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(10.0)
        return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> PeerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- a reference-shaped stream service ---------------------------------------------------------
@dataclass
class PeerService:
    """The reference's stream and index services, in memory: workers answer INIT from their own
    address, push → PushConfirm, pull → PullResponse, index get → Index, index save → nothing,
    any other request to ``stream_service`` → ``error "Invalid request"``.
    ``seen``: ``(protocol, request shape)`` of every request, in order, for the tests."""

    streams: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)
    indexes: dict[tuple[str, str, int], int] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)
    sent: list[Message] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    drop_saves: bool = False
    """Lose every save (as a reference shard whose storage fails: it only logs)."""
    undefined_index: bool = False
    """Answer a get for a consumer that never saved with index ``none``, as every reference
    storage backend does (storage/internal.ex ``Map.get(state, id, :undefined)``, KafkaOffset's
    offset -1); by default the spec's record of 0."""
    hop: str | None = None
    """The stream workers sit behind this address (a relay, another node): an INIT's return
    route is ``[hop, worker]``. The hop does what an Ockam router hop does: a message to
    ``[hop, worker, …]`` goes on to ``[worker, …]`` with ``hop`` put before its return route,
    and the worker's reply leaves through it (``[hop, worker]`` as its return route). A message
    whose route ends at the hop goes nowhere: it is dropped, as an Ockam router drops it."""
    dropped: list[Message] = field(default_factory=list)

    def handle(self, m: Message) -> list[Message]:
        with self.lock:
            hop = local(self.hop) if self.hop is not None else None
            if hop is None or m.onward[:1] != [hop]:
                return self._handle(m)
            if len(m.onward) < 2:
                self.dropped.append(m)
                return []
            inner = Message(m.onward[1:], [hop, *m.ret], m.payload, m.tracing)
            # the reply comes back out through the hop (``_reply`` put it in its return route)
            return [Message(r.onward[1:], r.ret, r.payload) for r in self._handle(inner)]

    def _reply(self, m: Message, src: str, payload: bytes) -> list[Message]:
        via = [local(self.hop)] if self.hop is not None and not src.startswith("stream_") else []
        out = [Message(m.ret, [*via, local(src)], payload)]
        self.sent += out
        return out

    def _handle(self, m: Message) -> list[Message]:
        dest = m.onward[0][1].decode()
        name, r = unbase(m.payload)
        if dest == "stream_service":
            if name == "stream_create":
                stream = r.optional(r.string)
                r.end()
                self.seen.append((name, "create"))
                self.streams.setdefault((stream, 0), [])
                return self._reply(m, f"w_{stream}_0", init(stream))
            if name == "stream_create_partitioned":
                stream, n = r.optional(r.string), r.uint()
                r.end()
                self.seen.append((name, "create"))
                out = []
                for p in range(n):
                    self.streams.setdefault((stream, p), [])
                    out += self._reply(m, f"w_{stream}_{p}", init_partitioned(stream, p))
                return out
            self.seen.append((name, "unknown"))
            return self._reply(m, "stream_service", error("Invalid request"))
        if dest == "stream_index_service":
            tag = r.uint()
            client, stream = r.string(), r.string()
            partition = r.uint() if name == "stream_index_partitioned" else 0
            if tag == 1:  # save: a cast (shard.ex), monotonic
                index = r.uint()
                r.end()
                self.seen.append((name, "save"))
                key = (client, stream, partition)
                if not self.drop_saves:
                    self.indexes[key] = max(self.indexes.get(key, 0), index)
                return []
            r.end()
            self.seen.append((name, "get"))
            key = (client, stream, partition)
            index = (
                self.indexes.get(key) if self.undefined_index else self.indexes.setdefault(key, 0)
            )
            if name == "stream_index_partitioned":
                return self._reply(
                    m, dest, index_response_partitioned(client, stream, partition, index)
                )
            return self._reply(m, dest, index_response(client, stream, index))
        _, stream, p = dest.rsplit("_", 2)
        log = self.streams[(stream, int(p))]
        if name == "stream_push":
            rid, payload = r.uint(), r.data()
            r.end()
            self.seen.append((name, "push"))
            log.append(payload)
            return self._reply(m, dest, push_confirm(rid, True, len(log) - 1))
        if name == "stream_pull":
            rid, index, limit = r.uint(), r.uint(), r.uint()
            r.end()
            self.seen.append((name, "pull"))
            msgs = list(enumerate(log))[index : index + limit]
            return self._reply(m, dest, pull_response(rid, msgs))
        raise AssertionError(f"unexpected {name} to {dest}")


class PeerServer:
    """A reference-shaped TCP server for ``PeerService`` on loopback, one thread per
    connection: sends its version byte, drops a peer whose version byte has not come within
    ``VERSION_WAIT``, closes a connection on a frame that does not decode (handler.ex)."""

    def __init__(self) -> None:
        self.service = PeerService()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.errors: list[str] = []
        self.versions: list[bytes] = []
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            t = threading.Thread(target=self._connection, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            conn.sendall(VERSION)
            conn.settimeout(VERSION_WAIT)
            try:
                v = read_exact(conn, 1)
            except (TimeoutError, ConnectionError):
                self.errors.append("no version byte")
                return
            self.versions.append(v)
            if v != VERSION:
                self.errors.append(f"version {v!r}")
                return
            conn.settimeout(None)
            while True:
                try:
                    m = read_message(conn)
                except ConnectionError:
                    return
                except BadFrame as e:
                    self.errors.append(f"bad frame: {e}")
                    return
                for reply in self.service.handle(m):
                    conn.sendall(frame(reply))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
