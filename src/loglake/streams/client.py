"""Python clients of the Ockam stream service over the Ockam TCP transport.

``StreamClient`` (blocking socket) and ``AsyncStreamClient`` (asyncio) both implement the
``Streams`` protocol of ``loglake.streams.api`` — create_stream, push, push_many, pull,
get_index, save_index — so a part written against ``Streams`` runs on ``LocalStreams`` in a test
and against ``loglake serve`` unchanged. Both drive the same sans-I/O ``ClientCore``.

Matching replies to requests: each request carries its own return address ``r<n>`` (a local
address in the return route, which the service copies into the reply's onward route). That
matches every reply, including ``error`` replies that carry no request id, so many requests can
be in flight (``push_many`` pipelines up to ``window`` pushes; pushes use one return address per
partition and are matched by ``request_id``, see ``ClientCore``).

Stream addresses: the spec says "The client MUST use stream address from the return route"; the
client learns each partition's worker route from the INIT replies of a CREATE — the whole return
route, every hop, as the reference clients keep it (Elixir ``stream/client/publisher.ex``
``add_stream(…, Message.return_route(message))``, Rust ``ockam/src/stream/producer.rs``
``w.route = return_route``), so a worker behind a relay or another node is reached through it —
and for a stream it did not create asks ``loglake_stream_info`` (loglake extension) for the
partition count, then sends the CREATE that returns the INITs.

TLS (docs/security.md): given an ``ssl.SSLContext`` (``streams/tls.client_context``), both clients
connect over TLS and wait for the service's first byte, so a refused client certificate (which
TLS 1.3 reports only after the client's half of the handshake) is a ``TlsError`` at connect
time, not a surprise at the first call. A refused request is ``PermissionDenied``; a push that
met a full disk is ``DiskFull`` (naming the stream and partition).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
from collections.abc import Iterator, Sequence
from typing import NoReturn

from loglake.errors import LocalProtocolError, LoglakeError, RemoteProtocolError, Unavailable
from loglake.log.api import UnknownPartition, UnknownStream, check_stream_name
from loglake.streams import codec
from loglake.streams.api import StreamMessage
from loglake.streams.messages import (
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
    PullRequest,
    PushConfirm,
    SaveIndex,
    SavePartitionIndex,
    StreamInfoRequest,
    StreamInfoResponse,
    StreamSummary,
)
from loglake.streams.reply_codes import (
    DAMAGED_HISTORY,
    DISK_FULL,
    PERMISSION_DENIED,
    UNKNOWN_PARTITION,
    UNKNOWN_STREAM,
    code_of,
)
from loglake.streams.service import INDEX_SERVICE_ADDRESS, STREAM_SERVICE_ADDRESS
from loglake.wire.ockam import (
    DEFAULT_MAX_FRAME,
    MAX_WIRE_FRAME,
    Address,
    FrameTemplate,
    Route,
    RoutingMessage,
    TcpConnection,
    encode_frame,
    route,
)

DEFAULT_PORT = 4000
DEFAULT_WINDOW = 4000
"""Pushes in flight in ``push_many``."""
_CHUNKS_IN_FLIGHT = 4
_LANE, _REPLY, _OTHER = 0, 1, 2
"""What a reply's first onward address is (``ClientCore._route_kind``)."""


NO_REMOTE_TRUNCATE = (
    "the Ockam stream protocol has no deletion API; trim a remote stream with the node's "
    "retention (loglake serve --retention-*)"
)


CAST_RETURN = "cast"
"""The return address of a request that gets no reply (``ClientCore.cast``): not ``p<n>`` or
``r<n>``, so ``ClientCore.receive_data`` sorts nothing to it."""


class StreamServiceError(RemoteProtocolError):
    """The service answered ``error`` (its reason is the message)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PushFailed(StreamServiceError):
    """A ``PushConfirm`` with status ``ERROR``."""


class DiskFull(PushFailed):
    """The service's disk is full (the reason names the stream and partition); nothing of the
    refused request was stored, and pushes succeed again once space frees."""

    retriable = True


class PermissionDenied(StreamServiceError):
    """The service refused the request: this client's identity lacks the permission (the
    reason names the action, the stream and the permission needed)."""


class IndexNotSaved(StreamServiceError):
    """A consumer index save did not land: the service holds a lower index after it. Under
    authentication the usual reason is that the consumer (client id) belongs to another
    identity and this one has no ``consume`` grant for it; else the store failed. A save gets
    no reply (a cast, as in the Ockam reference), so the service's log says which."""


class PushTooLarge(LocalProtocolError):
    """A push whose frame would be larger than the server takes (``server_max_frame``): refused
    before anything is sent, so the connection stays usable. A server closes the connection on
    a frame over its ``max_frame`` (``FrameTooLarge`` there), and that limit is not announced
    on the wire; the client knows it only from its configuration. ``size`` is the frame body's
    length (what its 4-byte length would state), ``limit`` the limit, ``position`` the push's
    place in what was asked to be pushed."""

    def __init__(self, size: int, limit: int, position: int = 0) -> None:
        super().__init__(
            f"push {position}: a frame of {size} bytes exceeds the server's limit of {limit} "
            "bytes (server_max_frame; the server's --limits-max-frame)"
        )
        self.size, self.limit, self.position = size, limit, position


class DamagedHistory(StreamServiceError):
    """The records asked for failed their checksum on the service (a corrupt segment or lake
    page, named in the reason): the history there is damaged, not at its end. ``loglake log
    verify`` on the service's data dir says what is damaged."""


class TlsError(StreamServiceError):
    """The TLS handshake failed or was refused (wrong CA, no or unknown client certificate)."""


_ERROR_PREFIX = codec.encode_base(codec.ERROR, b"")[:-1]  # the BARE string "error"
_BY_CODE: dict[str | None, type[StreamServiceError]] = {
    PERMISSION_DENIED: PermissionDenied,
    DISK_FULL: DiskFull,
    DAMAGED_HISTORY: DamagedHistory,
}
"""The typed error of each reply code (``streams.reply_codes``) that has one of its own."""


def _is_error(msg: RoutingMessage) -> bool:
    return msg.payload.startswith(_ERROR_PREFIX)


def _raise_error(reply: Error, stream: str | None = None, partition: int = 0) -> NoReturn:
    """Turn an ``error`` reply into the exception ``LocalStreams`` would raise, by its code."""
    reason = reply.reason
    code = code_of(reason)
    if stream is not None and code == UNKNOWN_STREAM:
        raise UnknownStream(stream)
    if stream is not None and code == UNKNOWN_PARTITION:
        raise UnknownPartition(stream, partition)
    raise _BY_CODE.get(code, StreamServiceError)(reason)


def _bounds(summaries: list[StreamSummary], stream: str, partition: int) -> tuple[int, int]:
    parts = summaries[0].partitions if summaries else ()
    if not 0 <= partition < len(parts):
        raise UnknownPartition(stream, partition, len(parts))
    return parts[partition].first_index, parts[partition].next_index


class _PushError(LoglakeError):
    """Carries an ``error`` reply to a waiting push (internal)."""

    def __init__(self, error: Error) -> None:
        super().__init__(error.reason)
        self.error = error


def _confirmed(confirm: tuple[bool, int], request_id: int) -> int:
    ok, index = confirm
    if not ok:
        raise PushFailed(f"the stream service could not store request {request_id}")
    return index


class _PushChunk:
    """The pushes of one ``push_many`` chunk, awaited as one future (not one per push): it
    gets the chunk's ``(ok, index)`` list once every push is confirmed, or the first
    ``_PushError``."""

    __slots__ = ("fut", "left", "values")

    def __init__(self, fut: asyncio.Future, n: int) -> None:
        self.fut = fut
        self.values: list[tuple[bool, int]] = [(False, 0)] * n
        self.left = n


def _retrieve(futs: list[asyncio.Future]) -> None:
    """Cancel pending futures and mark failed ones as seen (no "never retrieved" warnings)."""
    for f in futs:
        if not f.done():
            f.cancel()
        elif not f.cancelled():
            f.exception()


SERVER_MAX_FRAME = DEFAULT_MAX_FRAME
"""The largest push frame a client sends by default: loglake's server default (``ServerLimits
.max_frame``, ``--limits-max-frame``), since a server does not announce its own. A server given
a larger limit takes larger pushes from a client given the same ``server_max_frame``; a
reference node has no limit but the 4-byte length (``MAX_WIRE_FRAME``)."""
_PUSH_OVERHEAD_MAX = 64
"""More than a push frame's body holds besides its routes and data: the payload's CBOR head
(at most 9), the tail (1), ``stream_push`` as a BARE string (12) and three uints (at most 10
each)."""
CLIENT_MAX_FRAME = MAX_WIRE_FRAME
"""The largest reply frame a client takes by default: any the wire can carry, as the reference
transport does (handler.ex ``{:packet, 4}``). Why not the server's ``DEFAULT_MAX_FRAME`` (plus
headroom, as before): a server's ``max_frame`` is its operator's (``--limits-max-frame``), and
a pull's reply carries a stored record whole — held to 32 MiB, a client could not pull back a
record a server with a larger limit had confirmed. The limit guards a server against its many
clients; a client reads only replies to what it asked of the server it chose, and a frame is
buffered as its bytes arrive (its announced length reserves nothing). ``max_frame=`` bounds it."""


class ClientCore:
    """Sans-I/O client: builds request frames, sorts reply frames by request.

    Pushes use one return address per target partition (``p<lane>``) and a connection-unique
    ``request_id``, so the routes of a push burst repeat (cheap to encode) and each confirm is
    found by its id. An ``error`` reply carries no id: it answers the oldest push in flight on
    its lane, since the service answers one return route in request order (``server.py``) —
    so an error (a refused push, a full disk) fails exactly the push it answers, never a later
    one on the same lane (a stale error once failed the next push). Pushes a caller
    gave up on are ``forget``-ed: their replies, when they come, are dropped.
    Other requests get their own return address ``r<n>``.
    """

    def __init__(
        self, max_frame: int = CLIENT_MAX_FRAME, server_max_frame: int = SERVER_MAX_FRAME
    ) -> None:
        self.conn = TcpConnection(max_frame)
        self.server_max_frame = server_max_frame
        """The largest frame body a push may have (``PushTooLarge`` beyond it)."""
        self._n = 0
        self.replies: dict[int, list[RoutingMessage]] = collections.defaultdict(list)
        self.confirms: dict[int, tuple[bool, int]] = {}
        """``request_id → (ok, index)`` of answered pushes, until the caller takes them."""
        self.push_errors: dict[int, Error] = {}
        """``request_id → error`` of pushes answered by an ``error`` reply."""
        self._lanes: dict[Route, int] = {}
        self._lane_routes: list[Route] = []
        self._templates: list[FrameTemplate] = []
        self._push_heads: list[dict[tuple[int, int], tuple[bytes, bytes]]] = []
        """Per lane: ``(id length, data size) → (head before the id, after it)``."""
        self.in_flight: list[collections.deque[int]] = []
        """Per lane: ids of the pushes sent and not answered yet, in send order."""
        self._forgotten: set[int] = set()

    @staticmethod
    def initial_bytes() -> bytes:
        return TcpConnection.initial_bytes()

    def request(self, dest: Route, payload: bytes) -> tuple[int, bytes]:
        self._n += 1
        tok = self._n
        msg = RoutingMessage(dest, (Address.local(f"r{tok}"),), payload)
        return tok, encode_frame(msg)

    @staticmethod
    def cast(dest: Route, payload: bytes) -> bytes:
        """The frame of a request that gets no reply (an index save): its return route is
        ``CAST_RETURN``, an address no reply is sorted to, so a reply from a server that sends
        one anyway is dropped, not kept."""
        return encode_frame(RoutingMessage(dest, (Address.local(CAST_RETURN),), payload))

    def lane(self, worker: Address | Route) -> int:
        """The push lane to ``worker``: its route (an INIT's whole return route), or one
        address for a single hop."""
        dest = (worker,) if isinstance(worker, Address) else worker
        lane = self._lanes.get(dest)
        if lane is None:
            lane = self._lanes[dest] = len(self._lane_routes)
            self._lane_routes.append((Address.local(f"p{lane}"),))
            self._templates.append(FrameTemplate(dest, self._lane_routes[lane]))
            self._push_heads.append({})
            self.in_flight.append(collections.deque())
        return lane

    def forget(self, lane: int, rids: Sequence[int]) -> None:
        """The caller no longer waits for these pushes: drop their answers, now or when they
        come (they still count in order on the lane)."""
        waiting = set(self.in_flight[lane])
        for rid in rids:
            self.confirms.pop(rid, None)
            self.push_errors.pop(rid, None)
            if rid in waiting:
                self._forgotten.add(rid)

    def push_frames(
        self, worker: Address | Route, datas: Sequence[bytes]
    ) -> tuple[list[int], bytes]:
        """Frames pushing ``datas`` to ``worker``; returns their request ids and the bytes."""
        rids, parts = self.push_parts(worker, datas)
        return rids, b"".join(parts)

    def push_parts(
        self, worker: Address | Route, datas: Sequence[bytes]
    ) -> tuple[list[int], list[bytes]]:
        """``push_frames`` as a list of parts whose concatenation is the frames: per push the
        constant head (length, routes, payload head, protocol name, body length; built once
        per lane, data size and id length), the request id, the data length, the caller's
        data object itself (not copied) and the frame's tail (no tracing context) — for
        ``writelines``, ``sendmsg`` or one ``join``. ``PushTooLarge`` (nothing framed, no
        request id taken) if a push's frame would pass ``server_max_frame``."""
        lane = self.lane(worker)
        self.check_pushes(lane, datas)
        head, heads = self._templates[lane].head, self._push_heads[lane]
        first = self._n + 1
        self._n += len(datas)
        rids = list(range(first, self._n + 1))
        self.in_flight[lane].extend(rids)
        parts: list[bytes] = []
        add = parts.extend
        uint, push_parts = codec.encode_uint, codec.push_request_parts
        size = id_len = -1
        before = after = b""
        tail = FrameTemplate.TAIL
        for rid, data in zip(rids, datas, strict=True):
            r = uint(rid)
            if len(data) != size or len(r) != id_len:
                size, id_len = len(data), len(r)
                cached = heads.get((id_len, size))
                if cached is None:
                    before, after = push_parts(id_len, size)
                    cached = (head(len(before) + id_len + len(after) + size) + before, after)
                    if len(heads) >= 1024:
                        heads.clear()
                    heads[(id_len, size)] = cached
                before, after = cached
            add((before, r, after, data, tail))
        return rids, parts

    def push_frame_size(self, lane: int, request_id: int, size: int) -> int:
        """The body length of the frame pushing ``size`` bytes on ``lane`` with
        ``request_id`` (what the frame's 4-byte length states, and a server holds to its
        ``max_frame``)."""
        id_len = len(codec.encode_uint(request_id))
        before, after = codec.push_request_parts(id_len, size)
        payload = len(before) + id_len + len(after) + size
        head = self._templates[lane].head(payload)
        return len(head) - 4 + payload + len(FrameTemplate.TAIL)

    def check_pushes(self, lane: int, datas: Sequence[bytes]) -> None:
        """``PushTooLarge`` if a push of ``datas`` on ``lane`` would be framed larger than
        ``server_max_frame``, with the request id the last of them would get (ids only grow,
        and so does a frame with its id). One pass over the sizes; the exact size is
        computed only for a largest data within ``_PUSH_OVERHEAD_MAX`` of the limit."""
        if not datas:
            return
        limit, last_id = self.server_max_frame, self._n + len(datas)
        largest = max(map(len, datas))
        if largest + len(self._templates[lane].prefix) + _PUSH_OVERHEAD_MAX <= limit:
            return
        if self.push_frame_size(lane, last_id, largest) <= limit:
            return
        for i, data in enumerate(datas):
            size = self.push_frame_size(lane, last_id, len(data))
            if size > limit:
                raise PushTooLarge(size, limit, i)

    def _route_kind(self, onward: Route) -> tuple[int, int]:
        """``(LANE, lane)`` for a push lane ``p<lane>`` of ours, ``(REPLY, token)`` for a
        request's own address ``r<token>``, ``(OTHER, 0)`` for anything else."""
        if onward:
            v = onward[0].value
            if v[1:].isdigit():
                if v[:1] == b"p":
                    lane = int(v[1:])
                    if lane < len(self.in_flight):
                        return _LANE, lane
                elif v[:1] == b"r":
                    return _REPLY, int(v[1:])
        return _OTHER, 0

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Sort what ``data`` completes: push confirms and errors by lane, other replies by
        request. Consecutive frames on one route (a burst of confirms) resolve it once."""
        last: Route | None = None
        kind, num = _OTHER, 0
        sent: collections.deque[int] = collections.deque()
        confirms, forgotten = self.confirms, self._forgotten
        decode = codec.decode_push_confirm
        for onward, ret, payload, tracing in self.conn.receive_frames(data):
            if onward is not last:
                last = onward
                kind, num = self._route_kind(onward)
                if kind == _LANE:
                    sent = self.in_flight[num]
            if kind == _LANE:
                c = decode(payload)
                if c is not None:
                    rid = c[0]
                    if sent and sent[0] == rid:
                        sent.popleft()
                    else:  # out of order (not from loglake's server) or not ours
                        try:
                            sent.remove(rid)
                        except ValueError:
                            continue
                    if forgotten and rid in forgotten:
                        forgotten.discard(rid)
                    else:
                        confirms[rid] = (c[1], c[2])
                    continue
                if not sent:
                    continue  # an error for no push in flight: nothing to fail
                rid = sent.popleft()  # the oldest push on the lane: this error's request
                if rid in forgotten:
                    forgotten.discard(rid)
                    continue
                try:
                    r = codec.decode_response(payload, PushConfirm)
                except LoglakeError as e:
                    r = Error(f"undecodable push reply: {e}")
                self.push_errors[rid] = r if isinstance(r, Error) else Error(repr(r))
            elif kind == _REPLY:
                self.replies[num].append(RoutingMessage(onward, ret, payload, tracing))
        if self.conn.error is not None:
            raise self.conn.error


# -- request builders shared by both clients -------------------------------------------------
# The partitioned requests go under the reference's protocol names (stream_partitioned.ex:
# ``stream_create_partitioned``, ``stream_index_partitioned``), which an Ockam node understands;
# loglake's service accepts those and the spec's spellings alike.
def _create_payload(name: str | None, partitions: int) -> tuple[bytes, type]:
    """The CREATE for ``name``, checked here first: the service answers a refused CREATE with
    the reference's bare ``Invalid request`` (``service.INVALID_REQUEST``), so the reason —
    the ``InvalidStreamName`` or ``LocalProtocolError`` ``LocalStreams`` raises — is given
    before sending."""
    if name is not None:
        check_stream_name(name)
    if partitions < 1:
        raise LocalProtocolError(f"partitions must be >= 1, got {partitions}")
    if partitions == 1:
        return codec.encode_payload(CreateStreamRequest(name)), Init
    return (
        codec.encode_payload(
            CreatePartitionedStreamRequest(name, partitions), codec.REF_STREAM_CREATE_PARTITIONED
        ),
        CreatePartitionedStreamResponse,
    )


def _index_get(client_id: str, stream: str, partition: int) -> tuple[bytes, type]:
    if partition == 0:
        return codec.encode_payload(GetIndex(client_id, stream)), Index
    return (
        codec.encode_payload(
            GetPartitionIndex(client_id, stream, partition), codec.REF_STREAM_INDEX_PARTITIONED
        ),
        PartitionIndex,
    )


def _index_save(client_id: str, stream: str, index: int, partition: int) -> bytes:
    """A save is a cast (the reference's ``stream/index/shard.ex``): the service sends no
    reply. The clients follow it with a get on the same connection, whose answer is the
    stored index (``_saved``)."""
    if partition == 0:
        return codec.encode_payload(SaveIndex(client_id, stream, index))
    return codec.encode_payload(
        SavePartitionIndex(client_id, stream, partition, index), codec.REF_STREAM_INDEX_PARTITIONED
    )


def _saved(stored: int, index: int, client_id: str, stream: str, partition: int) -> int:
    """The stored index after a save of ``index``: at least ``index`` (it is monotonic), or the
    save did not land — which the service, sending no reply to a save, only logs."""
    if stored < index:
        raise IndexNotSaved(
            f"the index service did not store index {index} of consumer {client_id!r} on "
            f"stream {stream!r} partition {partition} (it holds {stored}): the consumer may "
            "belong to another identity (saving it needs a consume grant), or the store "
            "failed; the service's log says which"
        )
    return stored


class _Addresses:
    """(stream, partition) → worker route: the INIT's whole return route (module docstring)."""

    def __init__(self) -> None:
        self.map: dict[tuple[str, int], Route] = {}

    def learn(self, replies: list[RoutingMessage], expect: type) -> str:
        name = None
        for m in replies:
            r = codec.decode_response(m.payload, expect)
            if isinstance(r, Error):
                _raise_error(r)
            part = getattr(r, "partition", 0)
            name = r.stream_name
            if not m.return_route:  # nothing to send the stream's pushes and pulls to
                raise RemoteProtocolError(
                    f"INIT of stream {name!r} partition {part} has an empty return route"
                )
            self.map[(name, part)] = m.return_route
        assert name is not None
        return name


@contextlib.contextmanager
def _socket_errors(doing: str) -> Iterator[None]:
    """A socket call's failures as the client's typed errors (``doing``: "waiting for", "sending
    to" the stream service)."""
    try:
        yield
    except TimeoutError:
        raise Unavailable(f"timed out {doing} the stream service") from None
    except ssl.SSLError as e:
        raise TlsError(f"TLS failed: {e}") from None
    except OSError as e:
        raise Unavailable(f"connection failed: {e}") from None


class StreamClient:
    """Blocking client. ``with StreamClient(host, port) as c: c.push("s", b"x")``.

    ``tls``: connect over TLS with this context (``streams.tls.client_context``); the server's
    certificate must name ``server_hostname`` (default: ``host``). ``max_frame``: the largest
    reply frame taken (``CLIENT_MAX_FRAME``); a larger one is ``FrameTooLarge``.
    ``server_max_frame``: the largest frame the server takes (``SERVER_MAX_FRAME``, its
    default; set it to the server's ``--limits-max-frame``): a push whose frame would be larger
    raises ``PushTooLarge`` before it is sent, and the connection stays open."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        timeout: float = 30.0,
        window: int = DEFAULT_WINDOW,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        max_frame: int = CLIENT_MAX_FRAME,
        server_max_frame: int = SERVER_MAX_FRAME,
    ) -> None:
        self.host, self.port, self.window = host, port, window
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise Unavailable(f"cannot connect to {host}:{port}: {e}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=server_hostname or host)
            except OSError as e:  # ssl.SSLError, SSLCertVerificationError, a reset
                sock.close()
                raise TlsError(f"TLS handshake with {host}:{port} failed: {e}") from None
        self.sock = sock
        self._rbuf = memoryview(bytearray(1 << 20))
        self.core = ClientCore(max_frame, server_max_frame)
        self.addresses = _Addresses()
        try:
            self.sock.sendall(self.core.initial_bytes())
            if tls is not None:  # the service's version byte, or its refusal of our certificate
                self._read()
        except (OSError, StreamServiceError) as e:
            self.sock.close()
            if tls is None:
                raise Unavailable(f"cannot talk to {host}:{port}: {e}") from None
            raise TlsError(f"TLS handshake with {host}:{port} refused: {e}") from None

    # -- plumbing ----------------------------------------------------------------------------
    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        with _socket_errors("waiting for"):
            # into one kept buffer: a fresh 1 MiB ``bytes`` per recv costs an mmap and a
            # munmap (~40 µs here); ``receive_data`` copies what it keeps
            n = self.sock.recv_into(self._rbuf)
        if not n:
            raise Unavailable("the stream service closed the connection")
        self.core.receive_data(self._rbuf[:n])

    def _send(self, data: bytes) -> None:
        """``sendall``, its failures typed as a read's: a connection the server closed raised
        a bare ``BrokenPipeError`` at the next push."""
        with _socket_errors("sending to"):
            self.sock.sendall(data)

    def _call(
        self, dest: Route, payload: bytes, count: int = 1, before: bytes = b""
    ) -> list[RoutingMessage]:
        """Send one request (after the frames ``before``, in the same write); wait for
        ``count`` replies (or the first, if it is an error)."""
        tok, frame = self.core.request(dest, payload)
        self._send(before + frame)
        replies = self.core.replies
        while True:
            got = replies.get(tok)
            if got and (len(got) >= count or _is_error(got[0])):
                return replies.pop(tok)
            self._read()

    def _address(self, stream: str, partition: int) -> Route:
        addr = self.addresses.map.get((stream, partition))
        if addr is None:
            n = len(self.info(stream)[0].partitions)
            if partition >= n:
                raise UnknownPartition(stream, partition, n)
            self.create_stream(stream, n)
            addr = self.addresses.map[(stream, partition)]
        return addr

    # -- Streams API -------------------------------------------------------------------------
    def create_stream(self, name: str | None = None, partitions: int = 1) -> str:
        payload, expect = _create_payload(name, partitions)
        replies = self._call(route(STREAM_SERVICE_ADDRESS), payload, partitions)
        return self.addresses.learn(replies, expect)

    def push(self, stream: str, data: bytes, partition: int = 0) -> int:
        """One push, waited for: one send and one wait, without ``push_many``'s chunking
        (the one-by-one case, where the client's own steps are part of every push's
        latency)."""
        worker = self._address(stream, partition)
        core = self.core
        rids, parts = core.push_parts(worker, (data,))
        try:
            self._send(b"".join(parts))
            return self._confirm(rids[0], stream, partition)
        except BaseException:  # its answer, when it comes, belongs to no one
            core.forget(core.lane(worker), rids)
            raise

    def _confirm(self, rid: int, stream: str, partition: int) -> int:
        """Read until push ``rid`` is answered; its index, or its error raised."""
        confirms, errors = self.core.confirms, self.core.push_errors
        c = confirms.pop(rid, None)
        while c is None:
            if rid in errors:
                _raise_error(errors.pop(rid), stream, partition)
            self._read()
            c = confirms.pop(rid, None)
        return _confirmed(c, rid)

    def push_many(self, stream: str, datas: Sequence[bytes], partition: int = 0) -> list[int]:
        """Push in order with up to ``window`` pushes in flight; return their indexes.

        Sends in quarter-window chunks and keeps up to four in flight, collecting the oldest
        chunk's confirms before sending another: the service always has work queued (the next
        group commit fills up while the current fsync runs) while this side decodes confirms."""
        worker = self._address(stream, partition)
        core = self.core
        lane = core.lane(worker)
        core.check_pushes(lane, datas)  # all of them, before the first chunk is sent
        out: list[int] = []
        chunk = max(1, self.window // _CHUNKS_IN_FLIGHT)
        inflight: collections.deque[list[int]] = collections.deque()

        def collect(rids: list[int]) -> None:
            confirm = self._confirm
            out.extend([confirm(rid, stream, partition) for rid in rids])

        rids: list[int] = []
        try:
            for lo in range(0, len(datas), chunk):
                rids, parts = core.push_parts(worker, datas[lo : lo + chunk])
                self._send(b"".join(parts))  # one copy of the chunk, no per-frame ones
                inflight.append(rids)
                if len(inflight) >= _CHUNKS_IN_FLIGHT:
                    rids = inflight.popleft()
                    collect(rids)
            while inflight:
                rids = inflight.popleft()
                collect(rids)
        except BaseException:  # their answers, when they come, belong to no one
            core.forget(lane, [r for rs in (rids, *inflight) for r in rs])
            raise
        return out

    def pull(self, stream: str, index: int, limit: int, partition: int = 0) -> list[StreamMessage]:
        dest = self._address(stream, partition)
        reply = self._call(dest, codec.encode_payload(PullRequest(0, index, limit)))[0]
        r = codec.decode_pull_reply(reply.payload)
        if isinstance(r, Error):
            _raise_error(r, stream, partition)
        return list(r.messages)

    def get_index(self, client_id: str, stream: str, partition: int = 0) -> int:
        payload, expect = _index_get(client_id, stream, partition)
        return self._index(payload, expect, stream, partition)

    def save_index(self, client_id: str, stream: str, index: int, partition: int = 0) -> int:
        """Save (a cast), then get: the stored index, which is at least ``index``."""
        save = self.core.cast(
            route(INDEX_SERVICE_ADDRESS), _index_save(client_id, stream, index, partition)
        )
        payload, expect = _index_get(client_id, stream, partition)
        stored = self._index(payload, expect, stream, partition, save)
        return _saved(stored, index, client_id, stream, partition)

    def _index(
        self, payload: bytes, expect: type, stream: str, partition: int, before: bytes = b""
    ) -> int:
        """The stored index a get is answered with. An ``Index`` with no index (``none``)
        means nothing is stored: a reference node sends it for a consumer that never saved
        (its storage backends' ``:undefined``), a loglake service only for a stream or
        partition it does not have (for one it has it creates the spec's record of 0). A
        reference consumer starts at 0 on it (client/consumer.ex), and so 0 is returned — after
        asking ``loglake_stream_info``, so that a stream or partition the service lacks raises
        ``UnknownStream``/``UnknownPartition`` as ``LocalStreams`` does. A reference node
        answers that request with ``error "Invalid request"``, which leaves the 0."""
        reply = self._call(route(INDEX_SERVICE_ADDRESS), payload, 1, before)[0]
        r = codec.decode_response(reply.payload, expect)
        if isinstance(r, Error):
            _raise_error(r, stream, partition)
        if r.index is not None:
            return r.index
        with contextlib.suppress(StreamServiceError):  # a reference node: "Invalid request"
            self.bounds(stream, partition)
        return 0

    # -- loglake extension -------------------------------------------------------------------
    def reset_index(
        self, client_id: str, stream: str, index: int | None, partition: int = 0
    ) -> int | None:
        """An operator's reset of a consumer's index to ``index`` (lower or not), or with None
        its delete (``loglake_index_reset``; needs ``admin`` on the stream under an access
        file). Returns the index now stored (None: deleted)."""
        payload = codec.encode_payload(IndexResetRequest(client_id, stream, partition, index))
        reply = self._call(route(INDEX_SERVICE_ADDRESS), payload)[0]
        r = codec.decode_response(reply.payload, PartitionIndex)
        if isinstance(r, Error):
            _raise_error(r, stream, partition)
        return r.index

    def info(self, stream: str | None = None) -> list[StreamSummary]:
        payload = codec.encode_payload(StreamInfoRequest(stream))
        reply = self._call(route(STREAM_SERVICE_ADDRESS), payload)[0]
        r = codec.decode_response(reply.payload, StreamInfoResponse)
        if isinstance(r, Error):
            _raise_error(r, stream)
        return list(r.streams)

    def list_streams(self) -> list[str]:
        return [s.stream_name for s in self.info()]

    def partitions(self, stream: str) -> int:
        """The partition count, from ``loglake_stream_info`` (``UnknownStream`` if none)."""
        return len(self.info(stream)[0].partitions)

    def bounds(self, stream: str, partition: int = 0) -> tuple[int, int]:
        """``Streams.bounds``, from ``loglake_stream_info`` in one round trip."""
        return _bounds(self.info(stream), stream, partition)

    def truncate_before(self, stream: str, index: int, partition: int = 0) -> int:
        raise NotImplementedError(NO_REMOTE_TRUNCATE)


class AsyncStreamClient:
    """asyncio client: ``c = await AsyncStreamClient.connect(host, port)``; many calls may run
    concurrently on one connection."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        window: int,
        received: bytes = b"",
        max_frame: int = CLIENT_MAX_FRAME,
        server_max_frame: int = SERVER_MAX_FRAME,
    ):
        self._reader, self._writer, self.window = reader, writer, window
        self.core = ClientCore(max_frame, server_max_frame)
        self.addresses = _Addresses()
        self._waiters: dict[int, tuple[int, asyncio.Future]] = {}
        self._push_waiters: dict[int, tuple[_PushChunk, int]] = {}
        """``request_id → (its chunk, its position there)`` of the pushes awaited."""
        self._failure: LoglakeError | None = None
        if received:  # what ``connect`` read while checking the TLS handshake
            self.core.receive_data(received)
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        window: int = DEFAULT_WINDOW,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = 30.0,
        max_frame: int = CLIENT_MAX_FRAME,
        server_max_frame: int = SERVER_MAX_FRAME,
    ) -> AsyncStreamClient:
        """Connect (over TLS with ``tls``, and ``max_frame`` and ``server_max_frame``, as
        ``StreamClient``)."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    host,
                    port,
                    ssl=tls,
                    server_hostname=(server_hostname or host) if tls is not None else None,
                ),
                timeout,
            )
        except ssl.SSLError as e:
            raise TlsError(f"TLS handshake with {host}:{port} failed: {e}") from None
        except (OSError, TimeoutError) as e:
            raise Unavailable(f"cannot connect to {host}:{port}: {e}") from None
        sock = writer.transport.get_extra_info("socket")
        if sock is not None:  # None: already closed (a refused certificate), found below
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(ClientCore.initial_bytes())
        received = b""
        if tls is not None:  # the service's version byte, or its refusal of our certificate
            try:
                received = await asyncio.wait_for(reader.read(1 << 20), timeout)
                if not received:
                    raise ConnectionResetError("the service closed the connection")
            except (OSError, TimeoutError) as e:
                writer.close()
                raise TlsError(f"TLS handshake with {host}:{port} refused: {e}") from None
        return cls(reader, writer, window, received, max_frame, server_max_frame)

    async def close(self) -> None:
        self._task.cancel()
        self._writer.close()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> AsyncStreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(1 << 20)
                if not data:
                    raise Unavailable("the stream service closed the connection")
                self.core.receive_data(data)
                self._deliver()
        except LoglakeError as e:
            self._fail(e)
        except OSError as e:
            self._fail(Unavailable(f"connection failed: {e}"))

    def _fail(self, e: LoglakeError) -> None:
        self._failure = e
        futs = [fut for _, fut in self._waiters.values()]
        futs += [chunk.fut for chunk, _ in self._push_waiters.values()]
        for fut in futs:
            if not fut.done():
                fut.set_exception(e)
        self._waiters.clear()
        self._push_waiters.clear()

    def _deliver(self) -> None:
        confirms, waiters = self.core.confirms, self._push_waiters
        if confirms:
            for rid, confirm in confirms.items():
                w = waiters.pop(rid, None)
                if w is not None:
                    chunk, k = w
                    chunk.values[k] = confirm
                    chunk.left -= 1
                    if not chunk.left and not chunk.fut.done():
                        chunk.fut.set_result(chunk.values)
            confirms.clear()
        errors = self.core.push_errors
        if errors:
            for rid, err in errors.items():  # each error answers one push (``ClientCore``)
                w = waiters.pop(rid, None)
                if w is not None and not w[0].fut.done():
                    w[0].fut.set_exception(_PushError(err))
            errors.clear()
        replies = self.core.replies
        for tok in [t for t in replies if t in self._waiters]:
            count, fut = self._waiters[tok]
            got = replies[tok]
            if len(got) >= count or (got and _is_error(got[0])):
                del self._waiters[tok]
                if not fut.done():
                    fut.set_result(replies.pop(tok))

    async def _call(
        self, dest: Route, payload: bytes, count: int = 1, before: bytes = b""
    ) -> list[RoutingMessage]:
        if self._failure is not None:
            raise self._failure
        tok, frame = self.core.request(dest, payload)
        fut = asyncio.get_running_loop().create_future()
        self._waiters[tok] = (count, fut)
        self._writer.write(before + frame)
        return await fut

    async def _address(self, stream: str, partition: int) -> Route:
        addr = self.addresses.map.get((stream, partition))
        if addr is None:
            n = len((await self.info(stream))[0].partitions)
            if partition >= n:
                raise UnknownPartition(stream, partition, n)
            await self.create_stream(stream, n)
            addr = self.addresses.map[(stream, partition)]
        return addr

    async def create_stream(self, name: str | None = None, partitions: int = 1) -> str:
        payload, expect = _create_payload(name, partitions)
        replies = await self._call(route(STREAM_SERVICE_ADDRESS), payload, partitions)
        return self.addresses.learn(replies, expect)

    async def push(self, stream: str, data: bytes, partition: int = 0) -> int:
        """One push, awaited: one frame written and one future, without ``push_many``'s
        chunking (as ``StreamClient.push``; the same failure handling: a push that fails is
        forgotten on its lane, so its late answer belongs to no one)."""
        worker = await self._address(stream, partition)
        if self._failure is not None:
            raise self._failure
        rids, parts = self.core.push_parts(worker, (data,))
        fut = self._expect(rids)
        try:
            self._writer.writelines(parts)
            await self._writer.drain()
            try:
                (confirm,) = await fut
            except _PushError as e:
                _raise_error(e.error, stream, partition)
        except BaseException:
            self._abandon(self.core.lane(worker), rids, fut)
            raise
        return _confirmed(confirm, rids[0])

    def _expect(self, rids: list[int]) -> asyncio.Future:
        """One future for the answers of pushes ``rids`` (their ``(ok, index)`` list, or the
        first error), resolved by ``_deliver``."""
        pc = _PushChunk(asyncio.get_running_loop().create_future(), len(rids))
        waiters = self._push_waiters
        for k, rid in enumerate(rids):
            waiters[rid] = (pc, k)
        return pc.fut

    def _abandon(self, lane: int, rids: list[int], fut: asyncio.Future) -> None:
        """No one waits for pushes ``rids`` any more: their answers, when they come, are
        dropped (``ClientCore.forget``), and their future is settled quietly."""
        for rid in rids:
            self._push_waiters.pop(rid, None)
        self.core.forget(lane, rids)
        _retrieve([fut])

    async def push_many(self, stream: str, datas: Sequence[bytes], partition: int = 0) -> list[int]:
        """Push in order, ``window`` in flight (quarter-window chunks, as ``StreamClient``)."""
        worker = await self._address(stream, partition)
        lane = self.core.lane(worker)
        self.core.check_pushes(lane, datas)  # all of them, before the first chunk is sent
        out: list[int] = []
        chunk = max(1, self.window // _CHUNKS_IN_FLIGHT)
        inflight: collections.deque[tuple[list[int], asyncio.Future]] = collections.deque()

        async def collect(rids: list[int], fut: asyncio.Future) -> None:
            inflight.appendleft((rids, fut))  # forgotten by ``finally`` if this fails
            try:
                confirms = await fut
            except _PushError as e:
                _raise_error(e.error, stream, partition)
            for rid, confirm in zip(rids, confirms, strict=True):
                out.append(_confirmed(confirm, rid))
            inflight.popleft()

        try:
            for lo in range(0, len(datas), chunk):
                if self._failure is not None:
                    raise self._failure
                rids, parts = self.core.push_parts(worker, datas[lo : lo + chunk])
                fut = self._expect(rids)
                self._writer.writelines(parts)
                inflight.append((rids, fut))
                await self._writer.drain()
                if len(inflight) >= _CHUNKS_IN_FLIGHT:
                    await collect(*inflight.popleft())
            while inflight:
                await collect(*inflight.popleft())
        finally:  # on failure: the pushes no one waits for any more
            for rids, fut in inflight:
                self._abandon(lane, rids, fut)
        return out

    async def pull(
        self, stream: str, index: int, limit: int, partition: int = 0
    ) -> list[StreamMessage]:
        dest = await self._address(stream, partition)
        reply = (await self._call(dest, codec.encode_payload(PullRequest(0, index, limit))))[0]
        r = codec.decode_pull_reply(reply.payload)
        if isinstance(r, Error):
            _raise_error(r, stream, partition)
        return list(r.messages)

    async def get_index(self, client_id: str, stream: str, partition: int = 0) -> int:
        payload, expect = _index_get(client_id, stream, partition)
        return await self._index(payload, expect, stream, partition)

    async def save_index(self, client_id: str, stream: str, index: int, partition: int = 0) -> int:
        """Save (a cast), then get: the stored index, which is at least ``index``."""
        save = self.core.cast(
            route(INDEX_SERVICE_ADDRESS), _index_save(client_id, stream, index, partition)
        )
        payload, expect = _index_get(client_id, stream, partition)
        stored = await self._index(payload, expect, stream, partition, save)
        return _saved(stored, index, client_id, stream, partition)

    async def _index(
        self, payload: bytes, expect: type, stream: str, partition: int, before: bytes = b""
    ) -> int:
        reply = (await self._call(route(INDEX_SERVICE_ADDRESS), payload, 1, before))[0]
        r = codec.decode_response(reply.payload, expect)
        if isinstance(r, Error):
            _raise_error(r, stream, partition)
        if r.index is not None:
            return r.index
        with contextlib.suppress(StreamServiceError):  # as StreamClient._index
            await self.bounds(stream, partition)
        return 0

    async def info(self, stream: str | None = None) -> list[StreamSummary]:
        payload = codec.encode_payload(StreamInfoRequest(stream))
        reply = (await self._call(route(STREAM_SERVICE_ADDRESS), payload))[0]
        r = codec.decode_response(reply.payload, StreamInfoResponse)
        if isinstance(r, Error):
            _raise_error(r, stream)
        return list(r.streams)

    async def list_streams(self) -> list[str]:
        return [s.stream_name for s in await self.info()]

    async def partitions(self, stream: str) -> int:
        """The partition count, from ``loglake_stream_info`` (``UnknownStream`` if none)."""
        return len((await self.info(stream))[0].partitions)

    async def bounds(self, stream: str, partition: int = 0) -> tuple[int, int]:
        """``Streams.bounds``, from ``loglake_stream_info`` in one round trip."""
        return _bounds(await self.info(stream), stream, partition)

    async def truncate_before(self, stream: str, index: int, partition: int = 0) -> int:
        raise NotImplementedError(NO_REMOTE_TRUNCATE)
