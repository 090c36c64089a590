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
- A message to an unknown stream worker gets an ``error`` reply naming the stream (the
  reference router would drop it silently). A ``GetIndex`` for an unknown stream or partition
  gets the reference's answer, an ``Index`` with no index (``none``); only loglake's own
  ``loglake_index_reset`` answers ``unknown stream``/``unknown partition`` errors.
- CREATE of an existing stream with ``n`` partitions answers INIT for partitions ``0..n-1``, as
  the reference does; when the stream has fewer, it is grown first (``Log.grow_stream``), as
  the reference's ``ensure_streams`` starts the missing partitions' workers.
- ``SaveIndex`` gets no reply, as in the reference (``stream/index/shard.ex`` casts it; a failed
  save is logged). A client learns the stored, monotonic value with a ``GetIndex`` after it.
- ``loglake_stream_info`` (an extension) lists streams and partitions.

The core owns no socket, thread, clock — and no I/O: it never calls the log. ``batch(msgs)``
returns a ``Batch`` that asks for actions (``Append``, ``Read``, ``LogCall``); an adapter performs
them (``perform(log, action)``) wherever it likes and feeds the outcomes back, and the batch ends
with the replies. Consecutive pushes to one partition become one ``Append`` — one group commit —
and the confirms keep request order. A pull's ``Read`` may be left to the adapter to run on its
own (``defer_reads``), so a cold read of old history never holds up the appends behind it.
Each request is handled by a generator that yields one action at a time and
is sent its value (or thrown its error), so the protocol rules read top to bottom as before.
``handle``/``handle_batch`` are the blocking driver (tests, embedding): they perform every
action at once on the service's ``log``.
"""

from __future__ import annotations

import functools
import logging
import random
import sys
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from loglake.errors import DecodeError, LoglakeError
from loglake.log.api import (
    STREAM_NAME_RE,
    CorruptSegment,
    IndexOp,
    Log,
    NotOwner,
    StreamConfig,
    UnknownPartition,
    UnknownStream,
    ascii_digits,
)
from loglake.log.fs import DISK_FULL_ERRNOS
from loglake.streams import codec
from loglake.streams.limits import ServerLimits
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
from loglake.streams.permissions import ANONYMOUS, AccessPolicy, Peer, Permission, denied
from loglake.streams.reply_codes import (
    DAMAGED_HISTORY,
    DISK_FULL,
    INTERNAL_ERROR,
    READ_FAILED,
    UNKNOWN_PARTITION,
    UNKNOWN_STREAM,
    with_code,
)
from loglake.structured_logging import log_event
from loglake.wire.ockam import ADDRESS_TYPE_LOCAL, Address, MessageRun, Route, RoutingMessage

logger = logging.getLogger(__name__)

STREAM_SERVICE_ADDRESS = "stream_service"
"""Spec "Addresses": 'Stream service is registered with a service address, assume it's
"stream_service"'."""
INDEX_SERVICE_ADDRESS = "stream_index_service"
"""Spec "Addition ... Addresses": 'e.g. "stream_index_service"'."""
INVALID_REQUEST = "Invalid request"
"""The one reason the reference's stream service sends: for a payload a worker cannot decode
(``workers/stream.ex`` ``handle_decode_error``), and for every CREATE the service refuses —
an undecodable one, and one with an empty name, whose own reason ("Empty stream name") it only
logs (``workers/service.ex`` ``return_error``)."""
MAX_PARTITIONS = 4096
"""loglake's cap on partitions per stream (a CREATE asking more gets an error)."""
MAX_PULL_MESSAGES = 100_000
DEFAULT_MAX_PULL_BYTES = 8 * 1024 * 1024
"""A PullResponse holds at most this much message data (the spec allows 0..limit messages)."""
DEFAULT_MAX_CLIENT_ID = ServerLimits().max_client_id
"""The default of ``streams/limits.py`` (the consumer store itself takes up to 65,535 bytes)."""
MAX_REASON = 300
"""An ``error`` reply's reason is cut to this many characters (it may quote a client's value)."""


def is_disk_full(e: BaseException | None) -> bool:
    """Whether ``e`` — or what caused it (a ``StorageFailed`` from a failed fsync) — is the
    disk running out of space (ENOSPC, or EDQUOT: a quota is a full disk to this user)."""
    seen = 0
    while e is not None and seen < 16:
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def disk_full_reason(stream: str, partition: int, e: BaseException) -> str:
    """The ``error`` reply's reason for a full disk: names the stream and the partition."""
    return with_code(DISK_FULL, f"stream {stream!r} partition {partition}: {e}")


def read_failed_reason(target: _Target, e: OSError) -> str:
    """The ``error`` reply's reason for a pull whose read failed (a disk error, EIO)."""
    return with_code(READ_FAILED, f"stream {target.stream!r} partition {target.partition}: {e}")


def _is_stream_name(name: str) -> bool:
    """Whether ``name`` may name a stream (the log's rule), checked before the log is asked:
    a log call's error about a 70 KB name, caught in a cycle of frames, held those 70 KB until
    the collector's next run (300 MiB of such garbage in a server whose collector runs rarely,
    ``streams/server.GC_YOUNG_THRESHOLD``)."""
    return STREAM_NAME_RE.fullmatch(name) is not None


def _bad_name(name: str) -> str:
    shown = name if len(name) <= 40 else name[:40] + "…"
    return (
        f"invalid stream name {shown!r} ({len(name)} characters): "
        "use 1-200 characters from A-Z a-z 0-9 _ . : -, not starting with _ or ."
    )


def worker_address(stream: str, partition: int, prefix: str = STREAM_SERVICE_ADDRESS) -> str:
    return f"{prefix}/{stream}/{partition}"


# -- actions: what the core asks of the log, performed by an adapter ----------------------------
@dataclass(frozen=True, slots=True)
class Append:
    """Append ``datas`` to one partition (``Log.append_payloads``); the value is the indexes."""

    stream: str
    partition: int
    datas: list[bytes]


@dataclass(frozen=True, slots=True)
class Read:
    """Read at most ``limit`` messages from ``start`` (``Log.read_payloads``); the value is
    ``[(index, data)]``. Only its own reply depends on it, so an adapter may run it off the
    append path (see ``Batch``)."""

    stream: str
    partition: int
    start: int
    limit: int
    max_bytes: int | None = None
    """Stop reading once the messages' data would pass this (the first is always read): the
    reply's cap, ``max_pull_bytes``, so a pull reads no more than it sends."""


@dataclass(frozen=True, slots=True)
class LogCall:
    """Any other ``Log`` call, by method name: stream metadata (``has_stream``, ``stream_info``,
    ``partition_count``, ``streams``), ``create_stream``, ``grow_stream`` and an operator's
    ``reset_index`` (gets and saves of consumer indexes are ``IndexOp``/``IndexOps``)."""

    method: str
    args: tuple
    partition: int | None = None
    """Passed by keyword (``Log`` takes ``partition`` keyword-only); None: the call has none."""


@dataclass(frozen=True, slots=True)
class IndexOps:
    """Consecutive consumer-index requests of a batch, performed as one group
    (``Log.index_ops``: one write and one fsync for all their saves); the value is one result
    per op, a value or the exception it raised. A request's handler yields its own
    ``IndexOp`` (``perform`` runs one alone); the batch gathers them into this."""

    ops: tuple[IndexOp, ...]


Action = Append | Read | LogCall | IndexOp | IndexOps


@dataclass(frozen=True, slots=True)
class Outcome:
    """What performing an action gave: its value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None


def perform(log: Log, action: Action) -> Outcome:
    """The adapter's half of an action: run it on ``log`` (blocking; it may fsync). Never
    raises: an exception is the outcome's ``error``, handed back to the core."""
    try:
        if isinstance(action, Append):
            return Outcome(
                log.append_payloads(action.stream, action.datas, partition=action.partition)
            )
        if isinstance(action, Read):
            return Outcome(
                log.read_payloads(
                    action.stream,
                    action.start,
                    action.limit,
                    partition=action.partition,
                    max_bytes=action.max_bytes,
                )
            )
        if isinstance(action, IndexOps):
            return Outcome(log.index_ops(action.ops))
        if isinstance(action, IndexOp):
            (value,) = log.index_ops([action])
            if isinstance(value, Exception):
                raise value
            return Outcome(value)
        call = getattr(log, action.method)
        if action.partition is None:
            return Outcome(call(*action.args))
        return Outcome(call(*action.args, partition=action.partition))
    except Exception as e:
        return Outcome(error=e)


def _throw(handler: Generator[Any, Any, Any], error: BaseException) -> Any:
    """``handler.throw(error)``, then ``error``'s traceback dropped unless it is what leaves.

    Why: once thrown into a handler, the traceback's frames lead through their callers back
    to frames that still hold the outcome with ``error`` in it — a reference cycle that kept
    the request (a push's payload, a 70 KB name) alive until the collector's next run, which
    in a server is rare (``streams/server.GC_YOUNG_THRESHOLD``): pushes of 1 MB to an unknown
    stream grew ``loglake serve`` by 1.4 GB in 1,500 requests."""
    try:
        return handler.throw(error)
    finally:
        if sys.exc_info()[1] is not error:  # handled (or a StopIteration with the replies)
            error.__traceback__ = None


_Pending = tuple[int, tuple[int, bytes], RoutingMessage]
_T = TypeVar("_T")
_Handler = Generator[Action, Any, list[RoutingMessage]]
_Steps = Generator[list[Action], list[Outcome] | None, None]
"""A batch's steps: lists of actions out, their outcomes in."""
_Replies = list[Sequence[RoutingMessage | MessageRun] | None]
"""One entry per input message: its replies, or None for a deferred read."""
"""A request's handler: yields one action at a time, is sent its value (or thrown its error),
returns the replies."""


@dataclass(frozen=True, slots=True)
class _Target:
    stream: str
    partition: int
    address: Address
    route: Route
    """``(address,)``, the return route of the worker's replies: one object per worker, so
    a connection's replies from it are framed with one route encoding (``frame_parts``)."""


@dataclass(slots=True)
class LonePush:
    """One push on the fast path (``StreamService.lone_push``): the ``Append`` to perform,
    and what its reply needs."""

    action: Append
    target: _Target
    request_id: int
    msg: RoutingMessage


class PendingRead:
    """A pull whose ``Read`` the adapter performs when it likes (``Batch`` with
    ``defer_reads``): ``finish(outcome)`` gives the replies for input message ``position``.
    ``finish`` only encodes (no log, no shared state), so any thread may call it."""

    __slots__ = ("_handler", "_service", "action", "msg", "position")

    def __init__(
        self,
        service: StreamService,
        position: int,
        action: Read,
        msg: RoutingMessage,
        handler: _Handler,
    ) -> None:
        self.position, self.action = position, action
        self._service, self.msg, self._handler = service, msg, handler

    def finish(self, outcome: Outcome) -> list[RoutingMessage]:
        h = self._handler
        try:
            if outcome.error is None:
                h.send(outcome.value)
            else:
                _throw(h, outcome.error)
        except StopIteration as stop:
            return stop.value
        except Exception as e:
            return self._service._internal_error(self.msg, e)
        raise RuntimeError("a pull handler asked for a second action")  # a bug in the core


class _Deferred:
    """``_drive``'s result for a handler stopped at a ``Read`` it may finish later."""

    __slots__ = ("action",)

    def __init__(self, action: Read) -> None:
        self.action = action


class Batch:
    """Messages in, actions out, results in, replies out — the core as a sans-I/O exchange.

    ``actions`` is what to perform next: a list of independent actions (several ``Append`` to
    different partitions may run in parallel), empty once the batch is done. ``feed(outcomes)``
    hands back one ``Outcome`` per action, in order, and sets the next ``actions``. Then
    ``replies`` holds one list of routing messages per input message, in input order.

    With ``defer_reads``, a pull's ``Read`` is not put in ``actions``: it waits in ``deferred``
    as a ``PendingRead``, its ``replies`` entry is None, and the adapter performs it whenever it
    likes — after this batch's actions (so a pull sees the pushes that came before it), but
    without holding up the next batch's appends.

    With ``runs``, the confirms of consecutive pushes from one return route (the very route
    object: one connection's run of frames) to one partition come as one ``MessageRun`` in the
    first push's ``replies`` entry, and the others' entries are empty: the same frames, in the
    same order on that route, with no object per confirm. Replies to one return
    route keep request order within a worker; a run's confirms may leave before the replies of
    other workers to requests between them, as Ockam guarantees no order across workers."""

    __slots__ = ("_gen", "_n", "_taken", "actions", "deferred", "replies")

    def __init__(
        self,
        service: StreamService,
        msgs: Sequence[RoutingMessage],
        defer_reads: bool,
        peers: Sequence[Peer] | None = None,
        runs: bool = False,
    ):
        self.replies: _Replies = [[] for _ in msgs]
        self.deferred: list[PendingRead] = []
        self._n = len(msgs)
        self._taken = [0]  # input messages the core has taken up, as of its last step
        self._gen = service._run(
            msgs, self.replies, self.deferred, defer_reads, peers, runs, self._taken
        )
        self.actions: list[Action] = []
        self._step(None)

    @property
    def read_all(self) -> bool:
        """Every input message is taken up: the appends asked for now are the batch's last
        (after their outcomes come only the replies). Before that, a step's appends may be
        followed by more (pushes after a non-push message), and an adapter that lets a later
        batch write before this step's outcome is back would let that batch's pushes overtake
        them: a connection's pushes stored out of its order."""
        return self._taken[0] >= self._n

    def _step(self, outcomes: list[Outcome] | None) -> None:
        try:
            self.actions = self._gen.send(outcomes)
        except StopIteration:
            self.actions = []

    def feed(self, outcomes: list[Outcome]) -> None:
        if len(outcomes) != len(self.actions):
            raise ValueError(f"{len(self.actions)} actions, {len(outcomes)} outcomes")
        self._step(outcomes)


class StreamService:
    """Stream service, stream workers and index service, as a sans-I/O core.

    ``batch(msgs)`` → a ``Batch``: the core never calls the log itself, it asks for actions
    (``Append``, ``Read``, ``LogCall``) and an adapter performs them (``perform``) — the TCP
    server on worker threads, off its event loop. ``handle(msg)`` / ``handle_batch(msgs)`` are
    the blocking driver for tests and embedding: they perform every action at once on ``log``
    and return the replies (one list per input). Not thread-safe: one batch at a time.
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
        access: AccessPolicy | None = None,
        max_client_id: int = DEFAULT_MAX_CLIENT_ID,
    ) -> None:
        self.log = log
        self.max_client_id = max_client_id
        """Longest consumer id an index request may name, UTF-8 bytes (``ServerLimits``)."""
        self.access = access
        """Who may do what (``streams/permissions.py``); None: every peer may do everything.
        Each message is checked against the ``Peer`` its connection proved (``batch(peers=)``)."""
        """The log the adapter performs this core's actions on."""
        self.default_config = default_config or StreamConfig()
        self.service_address = service_address
        self.index_address = index_address
        self._service_addr = Address.local(service_address)
        self._index_addr = Address.local(index_address)
        self._worker_prefix = (service_address + "/").encode()
        self._rng = rng or random.SystemRandom()
        self.max_pull_bytes = max_pull_bytes
        self._targets: dict[bytes, _Target] = {}  # worker address value -> target
        self.map_targets: Callable[..., Iterable[Outcome]] = map
        """How ``handle_batch`` performs several actions of one step (appends to different
        partitions); a thread pool's ``map`` lets their fsyncs overlap."""

    # -- blocking driver ---------------------------------------------------------------------
    def handle(self, msg: RoutingMessage, peer: Peer = ANONYMOUS) -> list[RoutingMessage]:
        return self.handle_batch([msg], [peer])[0]

    def handle_batch(
        self, msgs: Sequence[RoutingMessage], peers: Sequence[Peer] | None = None
    ) -> list[list[RoutingMessage]]:
        batch = self.batch(msgs, peers=peers)
        log = self.log
        while batch.actions:
            actions = batch.actions
            if len(actions) == 1:
                batch.feed([perform(log, actions[0])])
            else:
                batch.feed(list(self.map_targets(functools.partial(perform, log), actions)))
        # nothing deferred (none is None), and no runs: routing messages only
        return cast(list[list[RoutingMessage]], [r for r in batch.replies if r is not None])

    # -- the core ----------------------------------------------------------------------------
    def batch(
        self,
        msgs: Sequence[RoutingMessage],
        *,
        defer_reads: bool = False,
        peers: Sequence[Peer] | None = None,
        runs: bool = False,
    ) -> Batch:
        """Start handling ``msgs`` (everything one read, or several connections, produced):
        consecutive pushes to one partition become one ``Append`` — one group commit — and
        the confirms keep request order. ``peers[i]`` is who sent ``msgs[i]`` (checked against
        ``access``; None: everyone is ``ANONYMOUS``). ``runs``: confirms as ``MessageRun``s
        (``Batch``), for an adapter that frames them (``wire.ockam.frame_parts``)."""
        return Batch(self, msgs, defer_reads, peers, runs)

    def lone_push(self, msg: RoutingMessage, peer: Peer = ANONYMOUS) -> LonePush | None:
        """The one-push fast path, first half: if ``msg`` is a well-formed push to a stream
        worker this core already knows, that the peer may push to, the ``Append`` it needs
        (``LonePush.action``); else None, and the caller takes ``batch([msg])``, which
        answers every other case (an unknown worker, a refusal, a bad payload) as before.

        Why a second path: a lone push on an idle server is the one-by-one latency of issue
        16, and a ``Batch`` (a generator per batch and per flush, the action and outcome
        lists, the runs) was ~20 µs of the ~70 µs of Python a push cost the server
        (measured in process). The rules are the batch's: the same target cache, the same
        access check, the same confirm or error payload (``_confirms``)."""
        route = msg.onward_route
        if not route or route[0].type != ADDRESS_TYPE_LOCAL:
            return None
        target = self._targets.get(route[0].value)  # only ever holds worker addresses
        if target is None:
            return None
        req = codec.decode_push_request(msg.payload)
        if req is None:
            return None
        access = self.access
        if access is not None and access.refusal(peer, "push to", target.stream) is not None:
            return None
        return LonePush(Append(target.stream, target.partition, [req[1]]), target, req[0], msg)

    def lone_push_replies(self, push: LonePush, outcome: Outcome) -> list[RoutingMessage]:
        """The one-push fast path, second half: the reply to ``push`` once its ``Append``
        was performed (``outcome``): the confirm, or the error the batch path would send."""
        msg = push.msg
        if outcome.error is None:
            payload = codec.encode_push_confirm(push.request_id, outcome.value[0])
        else:
            (payload,) = self._confirms(push.target, [(0, (push.request_id, b""), msg)], outcome)
        if not msg.return_route:
            return []
        return [RoutingMessage(msg.return_route, push.target.route, payload)]

    def error_reply(self, msg: RoutingMessage, reason: str) -> list[RoutingMessage]:
        """An ``error`` reply to ``msg`` (for an adapter that could not get ``msg`` handled)."""
        if not msg.onward_route:
            return []
        return self._error(msg, None, reason)

    def _internal_error(self, msg: RoutingMessage, e: BaseException) -> list[RoutingMessage]:
        logger.error("stream service failed on a message", exc_info=e)
        return self.error_reply(msg, with_code(INTERNAL_ERROR, type(e).__name__))

    def _run(
        self,
        msgs: Sequence[RoutingMessage],
        out: _Replies,
        deferred: list[PendingRead],
        defer_reads: bool,
        peers: Sequence[Peer] | None,
        runs: bool,
        taken: list[int],
    ) -> _Steps:
        """The batch as a generator: yields lists of actions, is sent lists of outcomes.
        ``taken[0]``: the position of the message being handled when a step is yielded in
        the loop, ``len(msgs)`` after it (``Batch.read_all``)."""
        access = self.access
        # pending pushes per target (keyed by the worker address bytes: their hash is cached):
        # (target, [(input position, (request_id, data), message)])
        pending: dict[bytes, tuple[_Target, list[_Pending]]] = {}
        prefix, targets = self._worker_prefix, self._targets
        decode_push = codec.decode_push_request
        # the onward route (the very object: a connection's decoder hands out one per run of
        # frames on the same routes) of the last push queued below, and its target's queue:
        # the next push on it needs no address check (not with an access policy: per peer)
        last_onward: object = None
        last_items: list[_Pending] = []
        index_addr = self._index_addr
        # consecutive consumer-index requests stopped at their ``IndexOp``: one group, one
        # write and one fsync for their saves (``_flush_index``)
        group: list[tuple[int, _Handler, IndexOp, RoutingMessage]] = []
        for i, msg in enumerate(msgs):
            if msg.onward_route is last_onward:
                req = decode_push(msg.payload)
                if req is not None:
                    last_items.append((i, req, msg))
                    continue
            # push fast path: a well-formed push to a known stream worker
            if msg.onward_route:
                dest = msg.onward_route[0]
                if dest.type == ADDRESS_TYPE_LOCAL and dest.value.startswith(prefix):
                    req = decode_push(msg.payload)
                    if req is not None:
                        target = targets.get(dest.value)
                        if target is None:
                            taken[0] = i
                            try:
                                found = yield from self._drive(self._target(dest))
                                target = found if isinstance(found, _Target) else None
                            except Exception as e:
                                out[i] = self._internal_error(msg, e)
                                continue
                        if target is not None:
                            if access is not None:
                                why = access.refusal(
                                    peers[i] if peers else ANONYMOUS, "push to", target.stream
                                )
                                if why is not None:
                                    out[i] = self._error(msg, target.address, why)
                                    continue
                            slot = pending.get(dest.value)
                            if slot is None:
                                slot = pending[dest.value] = (target, [])
                            slot[1].append((i, req, msg))
                            if access is None:
                                last_onward, last_items = msg.onward_route, slot[1]
                            continue
            first: Action | None = None
            if msg.onward_route and msg.onward_route[0] == index_addr:
                handler = self._on_index(msg, peers[i] if peers else ANONYMOUS)
                try:
                    first = next(handler)
                except StopIteration as stop:  # answered (or dropped) without the log
                    out[i] = stop.value
                    continue
                except Exception as e:
                    out[i] = self._internal_error(msg, e)
                    continue
                if isinstance(first, IndexOp):
                    group.append((i, handler, first, msg))
                    continue
            taken[0] = i
            if group:
                yield from self._flush_index(group, out)
                group = []
            if pending:
                yield from self._flush(pending, out, runs)
                pending = {}
                last_onward = None
            if first is None:
                handler = self._dispatch(msg, peers[i] if peers else ANONYMOUS)
            try:
                replies = yield from self._drive(handler, defer_reads, first)
            except Exception as e:  # a bug must not kill the server; report it to the peer
                out[i] = self._internal_error(msg, e)
                continue
            if isinstance(replies, _Deferred):
                out[i] = None
                deferred.append(PendingRead(self, i, replies.action, msg, handler))
            else:
                out[i] = replies
        taken[0] = len(msgs)
        # the index requests before the pushes: the pushes' append may be the batch's last
        # step, written while the loop goes on (server.py) and its outcome fed back after the
        # fsync; an index step after it would then run after the next batches' index steps,
        # and a connection's get sent after a save would not see it
        if group:
            yield from self._flush_index(group, out)
        if pending:
            yield from self._flush(pending, out, runs)

    def _flush_index(
        self, group: list[tuple[int, _Handler, IndexOp, RoutingMessage]], out: _Replies
    ) -> _Steps:
        """Perform a group of consumer-index requests as one ``IndexOps`` step (their saves in
        one write and one fsync) and finish each request's handler with its own result. The
        results are the ones the requests would get one by one, in the same order: a get
        after a save of the same consumer in the group sees it."""
        outcomes = yield [IndexOps(tuple(op for _, _, op, _ in group))]
        assert outcomes is not None  # only a batch's first step is sent None (Batch._step)
        (outcome,) = outcomes
        results = outcome.value if outcome.error is None else [outcome.error] * len(group)
        for (i, handler, _, msg), result in zip(group, results, strict=True):
            try:
                if isinstance(result, Exception):
                    action = _throw(handler, result)
                else:
                    action = handler.send(result)
            except StopIteration as stop:
                out[i] = stop.value
                continue
            except Exception as e:  # a bug must not kill the server; report it to the peer
                out[i] = self._internal_error(msg, e)
                continue
            try:  # a handler with more to do than its index request: on its own
                replies = yield from self._drive(handler, first=action)
            except Exception as e:
                out[i] = self._internal_error(msg, e)
                continue
            out[i] = cast(list[RoutingMessage], replies)

    def _drive(
        self,
        handler: Generator[Action, Any, _T],
        defer_reads: bool = False,
        first: Action | None = None,
    ) -> Generator[list[Action], list[Outcome], _T | _Deferred]:
        """Run one handler inside the batch: each action it yields is one step of the batch
        (``first``: the action it yielded already). With ``defer_reads``, a ``Read`` ends the
        drive (``_Deferred``)."""
        try:
            action = next(handler) if first is None else first
            while True:
                if defer_reads and type(action) is Read:
                    return _Deferred(action)
                (outcome,) = yield [action]
                if outcome.error is None:
                    action = handler.send(outcome.value)
                else:
                    action = _throw(handler, outcome.error)
        except StopIteration as stop:
            return stop.value

    # -- push ------------------------------------------------------------------------------
    def _flush(
        self,
        pending: dict[bytes, tuple[_Target, list[_Pending]]],
        out: _Replies,
        runs: bool = False,
    ) -> _Steps:
        """One ``Append`` per target (independent partitions: one step, so an adapter may run
        them side by side); fill in the confirms, in request order within a target (as runs
        with ``runs``: ``Batch``)."""
        groups = list(pending.values())
        outcomes = yield [
            Append(t.stream, t.partition, [item[1][1] for item in items]) for t, items in groups
        ]
        assert outcomes is not None  # only a batch's first step is sent None (Batch._step)
        for (target, items), outcome in zip(groups, outcomes, strict=True):
            src = target.route  # one route object for the burst: framed once
            payloads = self._confirms(target, items, outcome)
            if not runs:
                for (i, _, msg), payload in zip(items, payloads, strict=True):
                    if msg.return_route:
                        out[i] = [RoutingMessage(msg.return_route, src, payload)]
                continue
            ret: object = None
            run: list[bytes] = []
            for (i, _, msg), payload in zip(items, payloads, strict=True):
                if msg.return_route is not ret:
                    ret = msg.return_route
                    if not ret:
                        continue
                    run = [payload]
                    out[i] = [MessageRun(msg.return_route, src, run)]
                elif ret:
                    run.append(payload)

    def _confirms(self, target: _Target, items: list[_Pending], outcome: Outcome) -> list[bytes]:
        e = outcome.error
        if e is None:
            return codec.encode_push_confirms([item[1][0] for item in items], outcome.value)
        # a full disk is an error reply naming where, so the operator knows what to free; any
        # other storage failure
        # is a PushConfirm ERROR; never a crash
        full = is_disk_full(e)
        if not isinstance(e, LoglakeError) and not full:
            logger.error("log.append_payloads raised an unexpected error", exc_info=e)
        log_event(
            logger,
            logging.ERROR,
            "push failed",
            stream=target.stream,
            partition=target.partition,
            count=len(items),
            error=str(e),
            disk_full=full,
        )
        if full:
            reply = codec.encode_payload(
                Error(disk_full_reason(target.stream, target.partition, e))
            )
            return [reply for _ in items]
        return [codec.encode_payload(PushConfirm(rid, "ERROR", 0)) for _, (rid, _), _ in items]

    # -- dispatch --------------------------------------------------------------------------
    def _dispatch(self, msg: RoutingMessage, peer: Peer) -> _Handler:
        if not msg.onward_route:
            log_event(logger, logging.WARNING, "dropped a message with an empty onward route")
            return []
        dest = msg.onward_route[0]
        if dest.type == ADDRESS_TYPE_LOCAL:
            if dest == self._service_addr:
                return (yield from self._on_service(msg, peer))
            if dest == self._index_addr:
                return (yield from self._on_index(msg, peer))
            if dest.value.startswith(self._worker_prefix):
                target = self._targets.get(dest.value)
                if target is None:
                    named = self._worker_of(dest)
                    # a peer that may not see the stream does not learn whether it exists
                    if named and self.access and not self.access.may_see(peer, named[0]):
                        why = denied(peer, "use", named[0], "read or write")
                        return self._error(msg, dest, why)
                    target = yield from self._target(dest)
                if target is not None:
                    return (yield from self._on_worker(msg, target, peer))
                why = f"no stream worker {dest.name!r} (no such stream or partition)"
                return self._error(msg, dest, with_code(UNKNOWN_STREAM, why))
        return self._error(msg, None, f"no worker at address {dest}")

    def _worker_of(self, dest: Address) -> tuple[str, int] | None:
        """``(stream, partition)`` a worker address names, or None if it is not one."""
        rest = dest.value[len(self._worker_prefix) :].decode("utf-8", "replace")
        name, sep, part = rest.rpartition("/")
        # (a partition number never needs more than 10 digits)
        if not sep or not ascii_digits(part) or len(part) > 10:
            return None
        if (part != "0" and part.startswith("0")) or not _is_stream_name(name):
            return None
        return name, int(part)

    def _target(self, dest: Address) -> Generator[Action, Any, _Target | None]:
        named = self._worker_of(dest)
        if named is None:
            return None
        name, partition = named
        try:  # the count only: routing a request opens no partition
            count = yield LogCall("partition_count", (name,))
        except LoglakeError:
            return None
        if partition >= count:
            return None
        target = _Target(name, partition, dest, (dest,))
        if len(self._targets) < 100_000:  # streams are never deleted (spec: no deletion API yet)
            self._targets[dest.value] = target
        return target

    def _reply(
        self, msg: RoutingMessage, src: Address, response: object, protocol: str | None = None
    ) -> list[RoutingMessage]:
        if not msg.return_route:
            log_event(logger, logging.WARNING, "no return route; reply dropped", to=str(src))
            return []
        return [RoutingMessage(msg.return_route, (src,), codec.encode_payload(response, protocol))]

    def _error(self, msg: RoutingMessage, src: Address | None, reason: str) -> list[RoutingMessage]:
        if len(reason) > MAX_REASON:  # a reason quoting a client's 70 KB name stays short
            reason = reason[: MAX_REASON - 1] + "…"
        log_event(logger, logging.INFO, "error reply", reason=reason)
        return self._reply(msg, src or msg.onward_route[0], Error(reason))

    # -- stream service ----------------------------------------------------------------------
    def _on_service(self, msg: RoutingMessage, peer: Peer) -> _Handler:
        try:
            protocol, req = codec.decode_request(msg.payload)
        except DecodeError as e:
            log_event(logger, logging.WARNING, "undecodable stream service request", error=str(e))
            return self._error(msg, self._service_addr, INVALID_REQUEST)
        if isinstance(req, CreateStreamRequest):
            return (yield from self._create(msg, req.stream_name, 1, None, peer))
        if isinstance(req, CreatePartitionedStreamRequest):
            return (yield from self._create(msg, req.stream_name, req.partitions, protocol, peer))
        if isinstance(req, StreamInfoRequest):
            return (yield from self._info(msg, req, peer))
        return self._error(msg, self._service_addr, INVALID_REQUEST)

    def _new_name(self) -> Generator[Action, Any, str]:
        while True:
            name = f"generated_{self._rng.getrandbits(32):08x}"
            if not (yield LogCall("has_stream", (name,))):
                return name

    def _invalid_create(self, msg: RoutingMessage, why: str) -> list[RoutingMessage]:
        """A CREATE refused for what it asks (a name, a partition count): ``Invalid request``
        on the wire, as the reference answers every refused CREATE (``return_error`` in
        ``workers/service.ex`` logs its reason and sends that text), and the reason in the
        log. loglake's client checks what it can before sending (``client._create_payload``)."""
        log_event(logger, logging.INFO, "create refused", reason=why[:MAX_REASON])
        return self._error(msg, self._service_addr, INVALID_REQUEST)

    def _create(
        self, msg: RoutingMessage, name: str | None, n: int, partitioned: str | None, peer: Peer
    ) -> _Handler:
        src = self._service_addr
        if name is None:
            name = yield from self._new_name()
        elif name == "":
            return self._invalid_create(msg, "Empty stream name")
        if not 1 <= n <= MAX_PARTITIONS:
            # For 0 partitions the reference sends nothing: ``ensure_streams`` (workers/
            # service.ex) starts a worker per ``:lists.seq(0, n - 1)``, empty for 0, and only
            # workers send INIT (its Kafka and Kinesis storages fail to make a stream of 0 and
            # the service crashes: no reply either). A silence the code falls into, not a rule:
            # a client cannot tell it from a lost request and waits for its timeout (the
            # reference consumer 10 s, then stops). loglake answers at once with the error the
            # reference gives every CREATE it refuses, ``Invalid request`` from
            # ``stream_service``, which a reference client already reads (``Ockam.Protocol
            # .Error``, spec: stream service responses ``error:response``).
            return self._invalid_create(msg, f"partitions must be 1..{MAX_PARTITIONS}, not {n}")
        if not _is_stream_name(name):
            return self._invalid_create(msg, _bad_name(name))
        access = self.access
        try:
            # opening an existing stream (to learn its workers) needs any permission on it,
            # creating one needs admin; a peer with none does not learn whether it exists
            perms = access.permissions(peer, name) if access is not None else None
            if perms is not None and not perms:
                return self._error(msg, src, denied(peer, "create", name, "admin"))
            if (yield LogCall("has_stream", (name,))):
                have = yield LogCall("partition_count", (name,))
                if n > have:
                    # The reference grows the stream: ``ensure_streams`` (stream/workers/
                    # service.ex) starts a worker for each partition 0..n-1 not running yet and
                    # notifies the ones that are. Adding partitions changes the stream, so it
                    # needs admin, as creating one does.
                    if perms is not None and Permission.ADMIN not in perms:
                        return self._error(msg, src, denied(peer, "grow", name, "admin"))
                    yield LogCall("grow_stream", (name, n))
                    log_event(logger, logging.INFO, "stream grown", stream=name,
                              partitions=n, before=have)  # fmt: skip
            elif perms is not None and Permission.ADMIN not in perms:
                return self._error(msg, src, denied(peer, "create", name, "admin"))
            else:
                config = replace(self.default_config, partitions=n)
                yield LogCall("create_stream", (name, config))
                log_event(logger, logging.INFO, "stream created", stream=name, partitions=n)
        except LoglakeError as e:
            return self._error(msg, src, str(e))
        except OSError as e:  # the log removed what it had made: a retry starts clean
            if not is_disk_full(e):
                return self._error(msg, src, f"cannot create stream {name!r}: {e}")
            return self._error(msg, src, with_code(DISK_FULL, f"creating stream {name!r}: {e}"))
        out = []
        for p in range(n):
            worker = Address.local(worker_address(name, p, self.service_address))
            response = (
                Init(name) if partitioned is None else CreatePartitionedStreamResponse(name, p)
            )
            out += self._reply(msg, worker, response, partitioned)
        return out

    def _info(self, msg: RoutingMessage, req: StreamInfoRequest, peer: Peer) -> _Handler:
        access = self.access
        if req.stream_name is None:
            names = yield LogCall("streams", ())
            if access is not None:  # a listing shows only the streams the peer may see
                names = [n for n in names if access.may_see(peer, n)]
        else:
            names = [req.stream_name]
            if not _is_stream_name(req.stream_name):
                return self._error(msg, self._service_addr, _bad_name(req.stream_name))
            if access is not None and not access.may_see(peer, req.stream_name):
                why = denied(peer, "see", req.stream_name, "read, write or admin")
                return self._error(msg, self._service_addr, why)
        summaries = []
        for name in names:
            try:
                info = yield LogCall("stream_info", (name,))
            except UnknownStream:
                return self._error(msg, self._service_addr, with_code(UNKNOWN_STREAM, repr(name)))
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
    def _on_worker(self, msg: RoutingMessage, target: _Target, peer: Peer) -> _Handler:
        try:
            _, req = codec.decode_request(msg.payload)
        except DecodeError as e:
            log_event(logger, logging.WARNING, "undecodable stream request", error=str(e))
            return self._error(msg, target.address, INVALID_REQUEST)
        if self.access is not None and isinstance(req, PushRequest | PullRequest):
            action = "push to" if isinstance(req, PushRequest) else "pull from"
            why = self.access.refusal(peer, action, target.stream)
            if why is not None:
                return self._error(msg, target.address, why)
        if isinstance(req, PushRequest):  # normally taken by the batch path
            outcome = yield from self._append_one(target, req.data)
            payload = self._confirms(target, [(0, (req.request_id, req.data), msg)], outcome)[0]
            if not msg.return_route:
                return []
            return [RoutingMessage(msg.return_route, (target.address,), payload)]
        if isinstance(req, PullRequest):
            return (yield from self._pull(msg, target, req))
        return self._error(msg, target.address, INVALID_REQUEST)

    @staticmethod
    def _append_one(target: _Target, data: bytes) -> Generator[Action, Any, Outcome]:
        try:
            return Outcome((yield Append(target.stream, target.partition, [data])))
        except Exception as e:
            return Outcome(error=e)

    def _pull(self, msg: RoutingMessage, target: _Target, req: PullRequest) -> _Handler:
        limit = min(req.limit, MAX_PULL_MESSAGES)
        messages: list[tuple[int, bytes]] = []
        if limit > 0:
            try:
                # the byte cap goes down to the read (found from outside: read up to ``limit``
                # and cut after, 4 pulls of 100,000 over 2,400 records of 256 KiB took 4.2 s
                # each and 2.4 GB of the server to send 8 MiB each)
                rows = yield Read(
                    target.stream, target.partition, req.index, limit, self.max_pull_bytes
                )
            except LoglakeError as e:
                # The reference answers an empty PullResponse on storage errors; loglake answers
                # ``error``: an empty answer reads as the end of the stream, and a client could
                # neither tell damage from "no more messages" nor move past it knowingly.
                log_event(logger, logging.ERROR, "pull failed", stream=target.stream,
                          partition=target.partition, error=str(e))  # fmt: skip
                if isinstance(e, CorruptSegment):
                    where = f"stream {target.stream!r} partition {target.partition}"
                    why = f"{where} at index {req.index}: {e}"
                    return self._error(msg, target.address, with_code(DAMAGED_HISTORY, why))
                return self._error(msg, target.address, with_code(READ_FAILED, str(e)))
            except OSError as e:
                # the disk could not read it (EIO): an error the client can act on (retry,
                # alert), naming what failed — not an empty answer that looks like the end of
                # the stream, nor "internal error"; the connection stays open
                log_event(logger, logging.ERROR, "pull failed: read error", stream=target.stream,
                          partition=target.partition, error=str(e))  # fmt: skip
                return self._error(msg, target.address, read_failed_reason(target, e))
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

    def _index_error(
        self, msg: RoutingMessage, stream: str, partition: int, e: Exception
    ) -> list[RoutingMessage]:
        """The ``error`` reply of a consumer-index request the log refused."""
        if is_disk_full(e):
            return self._error(msg, self._index_addr, disk_full_reason(stream, partition, e))
        if isinstance(e, UnknownStream):
            return self._error(msg, self._index_addr, with_code(UNKNOWN_STREAM, repr(e.stream)))
        if isinstance(e, UnknownPartition):
            return self._error(msg, self._index_addr, with_code(UNKNOWN_PARTITION, str(e)))
        if isinstance(e, LoglakeError):  # a failed store
            return self._error(msg, self._index_addr, str(e))
        raise e

    # -- index service -----------------------------------------------------------------------
    def _on_index(self, msg: RoutingMessage, peer: Peer) -> _Handler:
        try:
            protocol, req = codec.decode_request(msg.payload)
        except DecodeError as e:
            # spec: the index service only answers stream_index:response -> drop and log
            log_event(logger, logging.WARNING, "dropped undecodable index request", error=str(e))
            return []
        src = self._index_addr
        saving = isinstance(req, SaveIndex | SavePartitionIndex)
        why = None
        client_id = getattr(req, "client_id", None)
        name = getattr(req, "stream_name", None)
        access = self.access
        consume = False
        """Whether a ``consume`` grant lets the peer save this client id whoever owns it."""
        if isinstance(client_id, str) and len(client_id.encode()) > self.max_client_id:
            size = len(client_id.encode())
            why = f"client id of {size} bytes is longer than {self.max_client_id} (max_client_id)"
        elif isinstance(name, str) and not _is_stream_name(name):
            why = _bad_name(name)
        elif access is not None and isinstance(req, IndexResetRequest):
            why = access.refusal(peer, "reset the consumer index of", req.stream_name)
        elif access is not None and isinstance(
            req, GetIndex | GetPartitionIndex | SaveIndex | SavePartitionIndex
        ):
            consume = access.may_consume(peer, req.stream_name, req.client_id)
            action = "save the consumer index of" if saving else "get the consumer index of"
            if not consume:
                why = access.refusal(peer, action, req.stream_name)
        if why is not None:
            if saving:  # a cast: no reply, not even a refusal (see below)
                log_event(logger, logging.WARNING, "index save refused", reason=why[:MAX_REASON])
                return []
            return self._error(msg, src, why)
        if isinstance(req, GetIndex | GetPartitionIndex):
            partition = getattr(req, "partition", 0)
            try:
                stored = yield IndexOp(req.client_id, req.stream_name, partition)
                if stored is None:
                    # Never saved: 0, and nothing is written. The spec says "a new record MUST
                    # be created with an index 0"; a record of 0 answers every later get and
                    # save exactly as no record does (a save stores max(saved, 0)), so the
                    # wire cannot tell them apart — and the reference writes none either (its
                    # storages answer a pair they hold nothing for with ``:undefined``,
                    # stream/index/storage/internal.ex). Writing one made every get with a new
                    # client id a permanent record and an fsync: 15,000 pipelined gets held the
                    # other clients ~28 s and left 15,000 records. (A get claims no consumer
                    # either: reading an index is not owning it.)
                    stored = 0
            except (UnknownStream, UnknownPartition):
                # No record can be made where there is no stream: answer the Index with no
                # index, as the reference does. Its index service knows no streams: every
                # storage backend answers a (client, stream) pair it holds nothing for with
                # ``:undefined`` (stream/index/storage/internal.ex ``Map.get(state, id,
                # :undefined)``; ockam_kafka's KafkaOffset, an offset of -1), which
                # ``index/service.ex`` sends as the ``none`` of ``index: optional<uint>``. A
                # reference consumer starts from 0 on it (client/consumer.ex); an ``error``
                # it only logged, and stopped at its request timeout. loglake's client asks
                # ``loglake_stream_info`` on a ``none`` to raise its typed error.
                stored = None
            except (LoglakeError, OSError) as e:  # the store cannot write
                return self._index_error(msg, req.stream_name, partition, e)
        elif isinstance(req, SaveIndex | SavePartitionIndex):
            # Saving is a cast in the reference (stream/index/shard.ex: GenServer.cast, a failure
            # only logged): a reference client never reads a reply to it, so none is sent — not
            # even an error. A client that wants to know what is stored asks with a get after
            # the save on the same connection (loglake's client does); requests of a connection
            # are handled in order, so the get sees the save.
            partition = getattr(req, "partition", 0)
            try:  # a lower index: "it MUST NOT be changed"
                if access is None:  # no authentication: no owners (the banner says so)
                    yield IndexOp(req.client_id, req.stream_name, partition, req.index)
                else:  # the first saver owns the consumer; others need a consume grant
                    yield IndexOp(
                        req.client_id, req.stream_name, partition, req.index, peer.label, consume
                    )
            except NotOwner as e:
                log_event(logger, logging.WARNING, "index save refused", stream=req.stream_name,
                          partition=partition, client=req.client_id[:MAX_REASON],
                          peer=peer.label, owner=e.owner)  # fmt: skip
            except (LoglakeError, OSError) as e:  # unknown stream, or the store cannot write
                log_event(logger, logging.WARNING, "index save failed", stream=req.stream_name,
                          partition=partition, client=req.client_id, error=str(e))  # fmt: skip
            return []
        elif isinstance(req, IndexResetRequest):
            # loglake's operator reset/delete: the only way an index moves back
            try:
                yield LogCall(
                    "reset_index", (req.client_id, req.stream_name, req.index), req.partition
                )
            except (LoglakeError, OSError) as e:
                return self._index_error(msg, req.stream_name, req.partition, e)
            log_event(logger, logging.WARNING, "consumer index reset" if req.index is not None
                      else "consumer index deleted", stream=req.stream_name,
                      partition=req.partition, client=req.client_id[:MAX_REASON],
                      index=req.index, by=peer.label)  # fmt: skip
            out = PartitionIndex(req.client_id, req.stream_name, req.partition, req.index)
            return self._reply(msg, src, out, protocol)
        else:
            log_event(logger, logging.WARNING, "dropped a non-index request to the index service")
            return []
        if isinstance(req, GetIndex):
            return self._reply(msg, src, Index(req.client_id, req.stream_name, stored), protocol)
        return self._reply(
            msg, src, PartitionIndex(req.client_id, req.stream_name, partition, stored), protocol
        )
