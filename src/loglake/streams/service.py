"""The Ockam stream service as a sans-I/O core: routing messages in, routing messages out.

Spec: ``specs/ockam-stream-service.txt``. Reference behaviour where the spec is silent:
build-trust/ockam, ``implementations/elixir/ockam/ockam/lib/ockam/stream/workers/service.ex``
(create, random names ``generated_<8 hex>``, "Empty stream name", ``error`` reply "Invalid
request" on an undecodable payload), ``stream/workers/stream.ex`` (push → ``PushConfirm`` with
status ``ERROR`` and index 0 when storage fails; pull → ``PullResponse``; INIT sent by each
partition's worker with that worker's address as the return route) and
``stream/index/service.ex`` (plain requests are partition 0; undecodable requests are logged and
dropped — the index service has no ``error`` response in the spec).

Addresses (spec "Addresses"): the stream service is ``stream_service``, the index service
``stream_index_service``; a stream partition's worker is ``stream_service/<name>/<partition>``
("created based on the stream_name", with "the stream service address prefix"). Because the
address is derived from the name, workers need no registry and survive a restart.

Decisions where spec and reference leave room (each also in docs/streams.md):
- A message to an unknown stream worker, and an index request for an unknown stream, get an
  ``error`` reply naming the stream (the reference router would drop them silently).
- CREATE of an existing stream with ``n`` partitions answers INIT for partitions ``0..n-1`` when
  the stream has at least ``n`` (as the reference does); asking for more → ``error``.
- ``SaveIndex`` is answered with the stored ``Index`` (the spec lists ``Index`` as the protocol's
  response; the reference sends nothing) so a client learns the stored, monotonic value.
- ``loglake_stream_info`` (an extension) lists streams and partitions.

The core owns no socket, thread or clock. ``handle_batch`` lets the server hand over everything
one read (or several connections) produced: consecutive pushes to one partition become one
``Log.append_many`` — one group commit — and the confirms keep request order.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from loglake.errors import DecodeError, LoglakeError
from loglake.log.api import (
    IndexRegression,
    Log,
    StreamConfig,
    UnknownPartition,
    UnknownStream,
    check_stream_name,
)
from loglake.logs import log_event
from loglake.streams import codec
from loglake.streams.messages import (
    CreatePartitionedStreamRequest,
    CreatePartitionedStreamResponse,
    CreateStreamRequest,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    Init,
    PartitionIndex,
    PartitionSummary,
    PullRequest,
    PushConfirm,
    PushRequest,
    SaveIndex,
    SavePartitionIndex,
    StreamInfoRequest,
    StreamInfoResponse,
    StreamSummary,
)
from loglake.wire.ockam import ADDRESS_TYPE_LOCAL, Address, RoutingMessage

logger = logging.getLogger(__name__)

STREAM_SERVICE_ADDRESS = "stream_service"
"""Spec "Addresses": 'Stream service is registered with a service address, assume it's
"stream_service"'."""
INDEX_SERVICE_ADDRESS = "stream_index_service"
"""Spec "Addition ... Addresses": 'e.g. "stream_index_service"'."""
INVALID_REQUEST = "Invalid request"
"""The reason the reference sends for an undecodable payload (workers/stream.ex)."""
MAX_PARTITIONS = 4096
"""loglake's cap on partitions per stream (a CREATE asking more gets an error)."""
MAX_PULL_MESSAGES = 100_000
DEFAULT_MAX_PULL_BYTES = 8 * 1024 * 1024
"""A PullResponse holds at most this much message data (the spec allows 0..limit messages)."""


def worker_address(stream: str, partition: int, prefix: str = STREAM_SERVICE_ADDRESS) -> str:
    return f"{prefix}/{stream}/{partition}"


_Pending = tuple[int, tuple[int, bytes], RoutingMessage]


@dataclass(frozen=True, slots=True)
class _Target:
    stream: str
    partition: int
    address: Address


class StreamService:
    """Stream service, stream workers and index service on one ``Log``.

    ``handle(msg)`` → the messages to send; ``handle_batch(msgs)`` → one list per input.
    Not thread-safe: call it from one thread at a time.
    """

    def __init__(
        self,
        log: Log,
        default_config: StreamConfig | None = None,
        *,
        service_address: str = STREAM_SERVICE_ADDRESS,
        index_address: str = INDEX_SERVICE_ADDRESS,
        rng: random.Random | None = None,
        max_pull_bytes: int = DEFAULT_MAX_PULL_BYTES,
    ) -> None:
        self.log = log
        self.default_config = default_config or StreamConfig()
        self.service_address = service_address
        self.index_address = index_address
        self._service_addr = Address.local(service_address)
        self._index_addr = Address.local(index_address)
        self._worker_prefix = (service_address + "/").encode()
        self._rng = rng or random.SystemRandom()
        self.max_pull_bytes = max_pull_bytes
        self._targets: dict[bytes, _Target] = {}  # worker address value -> target
        self.map_targets: Callable[..., Iterable[list[bytes]]] = map
        """How appends to several partitions of one batch run; an adapter may set a thread
        pool's ``map`` (the core itself starts no threads)."""

    # -- entry points ------------------------------------------------------------------------
    def handle(self, msg: RoutingMessage) -> list[RoutingMessage]:
        return self.handle_batch([msg])[0]

    def handle_batch(self, msgs: Sequence[RoutingMessage]) -> list[list[RoutingMessage]]:
        out: list[list[RoutingMessage]] = [[] for _ in msgs]
        # pending pushes per target (keyed by the worker address bytes: their hash is cached):
        # (target, [(input position, (request_id, data), message)])
        pending: dict[bytes, tuple[_Target, list[_Pending]]] = {}
        for i, msg in enumerate(msgs):
            push = self._as_push(msg)
            if push is not None:
                target, req = push
                slot = pending.get(target.address.value)
                if slot is None:
                    slot = pending[target.address.value] = (target, [])
                slot[1].append((i, req, msg))
                continue
            if pending:
                self._flush(pending, out)
                pending = {}
            try:
                out[i] = self._dispatch(msg)
            except Exception as e:  # a bug must not kill the server; report it to the peer
                logger.exception("stream service failed on a message")
                out[i] = self._error(msg, None, f"internal error: {type(e).__name__}")
        if pending:
            self._flush(pending, out)
        return out

    # -- push fast path --------------------------------------------------------------------
    def _as_push(self, msg: RoutingMessage) -> tuple[_Target, tuple[int, bytes]] | None:
        """A well-formed push ``(request_id, data)`` to a known stream worker, else None (the
        generic path then answers it)."""
        if not msg.onward_route:
            return None
        dest = msg.onward_route[0]
        if dest.type != ADDRESS_TYPE_LOCAL or not dest.value.startswith(self._worker_prefix):
            return None
        push = codec.decode_push_request(msg.payload)
        if push is None:
            return None
        target = self._targets.get(dest.value) or self._target(dest)
        if target is None:
            return None
        return target, push

    def _flush(self, pending, out) -> None:
        """Append each target's pending pushes with one ``append_payloads``; fill in confirms.

        Targets are independent partitions, so their appends go through ``map_targets``:
        ``map`` by default, or a thread pool's ``map`` given by the server, which lets the
        partitions' fsyncs overlap. Within a target, order is kept (one call per target)."""
        groups = list(pending.values())
        if len(groups) == 1:
            results = [self._append_group(groups[0])]
        else:
            results = list(self.map_targets(self._append_group, groups))
        for (target, items), confirms in zip(groups, results, strict=True):
            src = (target.address,)
            for (i, _, msg), payload in zip(items, confirms, strict=True):
                if msg.return_route:
                    out[i] = [RoutingMessage(msg.return_route, src, payload)]

    def _append_group(self, group: tuple[_Target, list[_Pending]]) -> list[bytes]:
        target, items = group
        datas = [data for _, (_, data), _ in items]
        try:
            indexes = self.log.append_payloads(target.stream, target.partition, datas)
            return [
                codec.encode_push_confirm(rid, idx)
                for (_, (rid, _), _), idx in zip(items, indexes, strict=True)
            ]
        except Exception as e:  # any storage failure is a PushConfirm ERROR, never a crash
            if not isinstance(e, LoglakeError):
                logger.exception("log.append_payloads raised an unexpected error")
            log_event(
                logger,
                logging.ERROR,
                "push failed",
                stream=target.stream,
                partition=target.partition,
                count=len(items),
                error=str(e),
            )
            return [codec.encode_payload(PushConfirm(rid, "ERROR", 0)) for _, (rid, _), _ in items]

    # -- dispatch --------------------------------------------------------------------------
    def _dispatch(self, msg: RoutingMessage) -> list[RoutingMessage]:
        if not msg.onward_route:
            log_event(logger, logging.WARNING, "dropped a message with an empty onward route")
            return []
        dest = msg.onward_route[0]
        if dest.type == ADDRESS_TYPE_LOCAL:
            if dest == self._service_addr:
                return self._on_service(msg)
            if dest == self._index_addr:
                return self._on_index(msg)
            if dest.value.startswith(self._worker_prefix):
                target = self._targets.get(dest.value) or self._target(dest)
                if target is not None:
                    return self._on_worker(msg, target)
                return self._error(msg, dest, f"unknown stream worker {dest.name!r}")
        return self._error(msg, None, f"no worker at address {dest}")

    def _target(self, dest: Address) -> _Target | None:
        rest = dest.value[len(self._worker_prefix) :].decode("utf-8", "replace")
        name, sep, part = rest.rpartition("/")
        if not sep or not part.isdigit() or (part != "0" and part.startswith("0")):
            return None
        partition = int(part)
        try:
            info = self.log.stream_info(name)
        except LoglakeError:
            return None
        if partition >= len(info.partitions):
            return None
        target = _Target(name, partition, dest)
        if len(self._targets) < 100_000:  # streams are never deleted (spec: no deletion API yet)
            self._targets[dest.value] = target
        return target

    def _reply(self, msg: RoutingMessage, src: Address, response: object, protocol=None):
        if not msg.return_route:
            log_event(logger, logging.WARNING, "no return route; reply dropped", to=str(src))
            return []
        return [RoutingMessage(msg.return_route, (src,), codec.encode_payload(response, protocol))]

    def _error(self, msg: RoutingMessage, src: Address | None, reason: str):
        log_event(logger, logging.INFO, "error reply", reason=reason)
        return self._reply(msg, src or msg.onward_route[0], Error(reason))

    # -- stream service ----------------------------------------------------------------------
    def _on_service(self, msg: RoutingMessage) -> list[RoutingMessage]:
        try:
            protocol, req = codec.decode_request(msg.payload)
        except DecodeError as e:
            log_event(logger, logging.WARNING, "undecodable stream service request", error=str(e))
            return self._error(msg, self._service_addr, INVALID_REQUEST)
        if isinstance(req, CreateStreamRequest):
            return self._create(msg, req.stream_name, 1, partitioned=None)
        if isinstance(req, CreatePartitionedStreamRequest):
            return self._create(msg, req.stream_name, req.partitions, partitioned=protocol)
        if isinstance(req, StreamInfoRequest):
            return self._info(msg, req)
        return self._error(msg, self._service_addr, INVALID_REQUEST)

    def _new_name(self) -> str:
        while True:
            name = f"generated_{self._rng.getrandbits(32):08x}"
            if not self.log.has_stream(name):
                return name

    def _create(self, msg, name: str | None, n: int, partitioned: str | None):
        src = self._service_addr
        if name is None:
            name = self._new_name()
        elif name == "":
            return self._error(msg, src, "Empty stream name")
        if not 1 <= n <= MAX_PARTITIONS:
            return self._error(msg, src, f"partitions must be 1..{MAX_PARTITIONS}, not {n}")
        try:
            check_stream_name(name)
            if self.log.has_stream(name):
                have = len(self.log.stream_info(name).partitions)
                if n > have:
                    return self._error(
                        msg, src, f"stream {name!r} exists with {have} partitions, not {n}"
                    )
            else:
                self.log.create_stream(name, replace(self.default_config, partitions=n))
                log_event(logger, logging.INFO, "stream created", stream=name, partitions=n)
        except LoglakeError as e:
            return self._error(msg, src, str(e))
        out = []
        for p in range(n):
            worker = Address.local(worker_address(name, p, self.service_address))
            response = (
                Init(name) if partitioned is None else CreatePartitionedStreamResponse(name, p)
            )
            out += self._reply(msg, worker, response, partitioned)
        return out

    def _info(self, msg, req: StreamInfoRequest):
        names = self.log.streams() if req.stream_name is None else [req.stream_name]
        summaries = []
        for name in names:
            try:
                info = self.log.stream_info(name)
            except UnknownStream:
                return self._error(msg, self._service_addr, f"unknown stream {name!r}")
            summaries.append(
                StreamSummary(
                    name,
                    tuple(
                        PartitionSummary(p.partition, p.first_index, p.next_index, p.bytes)
                        for p in info.partitions
                    ),
                )
            )
        return self._reply(msg, self._service_addr, StreamInfoResponse(tuple(summaries)))

    # -- stream worker ---------------------------------------------------------------------
    def _on_worker(self, msg: RoutingMessage, target: _Target) -> list[RoutingMessage]:
        try:
            _, req = codec.decode_request(msg.payload)
        except DecodeError as e:
            log_event(logger, logging.WARNING, "undecodable stream request", error=str(e))
            return self._error(msg, target.address, INVALID_REQUEST)
        if isinstance(req, PushRequest):  # normally taken by the batch path
            out: list[list[RoutingMessage]] = [[]]
            self._flush({b"": (target, [(0, (req.request_id, req.data), msg)])}, out)
            return out[0]
        if isinstance(req, PullRequest):
            return self._pull(msg, target, req)
        return self._error(msg, target.address, INVALID_REQUEST)

    def _pull(self, msg, target: _Target, req: PullRequest):
        limit = min(req.limit, MAX_PULL_MESSAGES)
        messages: list[tuple[int, bytes]] = []
        if limit > 0:
            try:
                rows = self.log.read_payloads(target.stream, target.partition, req.index, limit)
            except LoglakeError as e:
                log_event(logger, logging.ERROR, "pull failed", error=str(e))
                rows = []  # the reference answers an empty PullResponse on storage errors
            size = 0
            for row in rows:
                size += len(row[1])
                if size > self.max_pull_bytes and messages:
                    break
                messages.append(row)
        if not msg.return_route:
            return []
        payload = codec.encode_pull_response(req.request_id, messages)
        return [RoutingMessage(msg.return_route, (target.address,), payload)]

    # -- index service -----------------------------------------------------------------------
    def _on_index(self, msg: RoutingMessage) -> list[RoutingMessage]:
        try:
            protocol, req = codec.decode_request(msg.payload)
        except DecodeError as e:
            # spec: the index service only answers stream_index:response -> drop and log
            log_event(logger, logging.WARNING, "dropped undecodable index request", error=str(e))
            return []
        src = self._index_addr
        if isinstance(req, GetIndex | GetPartitionIndex):
            partition = getattr(req, "partition", 0)
            try:
                stored = self.log.get_consumer_index(req.client_id, req.stream_name, partition)
                if stored is None:  # spec: "a new record MUST be created with an index 0"
                    stored = self.log.save_consumer_index(
                        req.client_id, req.stream_name, partition, 0
                    )
            except (UnknownStream, UnknownPartition) as e:
                return self._error(msg, src, str(e))
        elif isinstance(req, SaveIndex | SavePartitionIndex):
            partition = getattr(req, "partition", 0)
            try:
                try:
                    stored = self.log.save_consumer_index(
                        req.client_id, req.stream_name, partition, req.index
                    )
                except IndexRegression as e:  # spec: "it MUST NOT be changed"
                    stored = e.stored
            except (UnknownStream, UnknownPartition) as e:
                return self._error(msg, src, str(e))
        else:
            log_event(logger, logging.WARNING, "dropped a non-index request to the index service")
            return []
        if isinstance(req, GetIndex | SaveIndex):
            return self._reply(msg, src, Index(req.client_id, req.stream_name, stored), protocol)
        return self._reply(
            msg, src, PartitionIndex(req.client_id, req.stream_name, partition, stored), protocol
        )
