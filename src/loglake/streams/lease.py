"""Leases in JetStream's key-value store, with fencing: work that must run once on a cluster
(the sealer, retention, an ICRC role's journal writer, the archives control node) is held by one
node at a time and handed over when that node dies.

DESIGN.md principle 4 — an existing distributed engine, never a home-made consensus: the lease
is one KV key written with compare-and-set on its revision and a per-message TTL, and the
server, not this module, decides who wins.

- **acquire**: read ``lease.<name>``; if it is absent, a marker, or a value with no expiry
  (another client's: ``lease_holder_message``), write it with a message TTL
  and ``Nats-Expected-Last-Subject-Sequence`` = that marker's revision (0 if absent), which fails
  while anyone else's lease message exists. A holder that dies stops renewing, its message
  expires after the TTL, and the next contender's write succeeds (the bucket is made with
  ``limit_marker_ttl``, which turns on per-message TTLs and leaves a marker behind an expired
  lease). Between the read and the write, ``before_acquire`` lets a fence claim its streams.
- **renew**: a publish on the lease key with ``Nats-Expected-Last-Subject-Sequence`` = the
  revision this holder last wrote, every ``ttl / 3``. Any other revision there means the lease
  was lost (expired and taken) — the holder learns it from the refused renewal.
- **hand over**: ``release()`` deletes the key with the same compare-and-set, so the next
  contender need not wait for the TTL.
- **fencing**: the lease's token is the KV revision of the lease key (JetStream sequences only
  grow, so a later holder always has a larger token). A write guarded by the lease is a publish
  into the same bucket (``fenced.<name>.<key>``) carrying
  ``Nats-Expected-Last-Subject-Sequence-Subject: $KV.<bucket>.lease.<name>`` and
  ``Nats-Expected-Last-Subject-Sequence: <the holder's revision>``: the server stores it only if
  the lease key's newest message is still that holder's. A holder paused (SIGSTOP, a long GC) past
  its TTL therefore cannot write when it wakes, whatever its own clock says: the write is
  refused with ``FencedOut``. (nats-server ≥ 2.11 checks the subject-scoped header; loglake's
  clusters run 2.15.) Streams outside the bucket are fenced by claims (``LeaseFence``).

The module is in two parts, as the protocol cores are: ``LeaseCore`` is a sans-I/O state machine
(a clock and the KV's answers in, actions and events out) that the tests drive with a fake clock;
``JetStreamLease`` performs its actions on a nats-py JetStream context.

Safety of the local view: the holder counts its lease as valid until ``ttl × (1 − margin)``
after it *sent* its last successful write; the server's TTL starts when it stores that write,
which is later, so the holder stops believing first. Fencing covers what the local view cannot
(a pause between the check and the write).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js import api as jsapi
from nats.js.kv import KeyValue

from loglake.errors import Unavailable
from loglake.log.api import LogError

logger = logging.getLogger(__name__)

LEASE_PREFIX = "lease."
FENCED_PREFIX = "fenced."
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
WRONG_LAST_SEQUENCE = 10071
"""JetStream's code for a failed expected-last-sequence check (JSStreamWrongLastSequenceErrF)."""
MIN_TTL = 1
_NAME = re.compile(r"[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*")
"""A KV key's characters (nats-py's ``_is_key_valid``), no empty token."""
_BUCKET = re.compile(r"[A-Za-z0-9_-]+")
"""A bucket name as nats-py checks it (``VALID_BUCKET_RE``)."""
"""JetStream message TTLs are whole seconds (the ``Nats-TTL`` header), at least one."""


class LeaseError(LogError):
    """A lease operation failed for a reason retrying does not fix."""


class LeaseLost(LeaseError):
    """This node does not hold the lease (never acquired it, it expired, or it was handed over):
    a guarded write was not attempted."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        super().__init__(f"lease {name!r} is not held by this node: {why}")


class FencedOut(LeaseLost):
    """JetStream refused a guarded write: the lease key has a newer revision than the writer's
    token (another node holds the lease now, or it expired). Nothing was written."""

    def __init__(self, name: str, token: int, detail: str = "") -> None:
        self.token = token
        super().__init__(
            name, f"the cluster refused a write fenced by revision {token}{detail} (a newer holder)"
        )


class LeaseUnavailable(LeaseError, Unavailable):
    """The cluster did not answer a lease operation in time; retrying later may succeed."""


# --- the sans-I/O core ----------------------------------------------------------------------


class LeaseState(enum.Enum):
    IDLE = "idle"
    """Not holding; will try to create the key at ``next_try``."""
    ACQUIRING = "acquiring"
    HELD = "held"
    RENEWING = "renewing"
    RELEASING = "releasing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Create:
    """Action: create the lease key (fails if it exists) with a message TTL of ``ttl`` s."""

    key: str
    value: bytes
    ttl: int


@dataclass(frozen=True, slots=True)
class Renew:
    """Action: write the lease key again, only if its newest revision is still ``last``."""

    key: str
    value: bytes
    ttl: int
    last: int


@dataclass(frozen=True, slots=True)
class Delete:
    """Action: delete the lease key, only if its newest revision is still ``last``."""

    key: str
    last: int


@dataclass(frozen=True, slots=True)
class Acquired:
    """Event: this node holds the lease; ``token`` is the revision that made it the holder."""

    token: int


@dataclass(frozen=True, slots=True)
class Lost:
    """Event: this node no longer holds the lease acquired with ``token``."""

    token: int
    reason: str


Action = Create | Renew | Delete
Event = Acquired | Lost


@dataclass
class LeaseCore:
    """One node's view of one lease. Feed it the clock (``poll``) and the KV's answers
    (``succeeded``/``conflict``/``failed``); it returns what to send and what happened. At
    most one action is outstanding at a time.

    ``ttl`` is the server-side TTL of the lease message (whole seconds); renewals go out every
    ``ttl / 3``; a contender that finds the key taken tries again every ``retry`` seconds."""

    name: str
    holder: str
    ttl: int = 5
    retry: float = 0.5
    margin: float = 0.2
    state: LeaseState = LeaseState.IDLE
    token: int | None = None
    """The revision that made this node the holder (None while not holding)."""
    revision: int | None = None
    """The newest revision this node wrote on the lease key (what fenced writes expect)."""
    valid_until: float = -math.inf
    next_try: float = -math.inf
    _sent_at: float = 0.0
    _next_renew: float = math.inf
    _events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.ttl, int) or self.ttl < MIN_TTL:
            raise ValueError(f"lease ttl must be a whole number of seconds ≥ {MIN_TTL}")
        if not 0 <= self.margin < 1:
            raise ValueError("lease margin must be in [0, 1)")
        if not _NAME.fullmatch(self.name):
            raise ValueError(
                f"lease name {self.name!r}: use letters, digits and - _ = / . "
                "(it becomes a JetStream KV key)"
            )

    @property
    def key(self) -> str:
        return LEASE_PREFIX + self.name

    @property
    def renew_every(self) -> float:
        return self.ttl / 3

    def holds(self, now: float) -> bool:
        """Whether this node may act as the holder at ``now`` (a local view; fencing is what
        the cluster enforces)."""
        return self.state in (LeaseState.HELD, LeaseState.RENEWING) and now < self.valid_until

    def poll(self, now: float) -> tuple[list[Action], list[Event]]:
        """Advance to ``now``: what to send and what happened since the last call."""
        actions: list[Action] = []
        if self.state in (LeaseState.HELD, LeaseState.RENEWING) and now >= self.valid_until:
            self._lose("not renewed within its ttl", now)
        if self.state is LeaseState.IDLE and now >= self.next_try:
            self.state, self._sent_at = LeaseState.ACQUIRING, now
            actions.append(Create(self.key, self.holder.encode(), self.ttl))
        elif self.state is LeaseState.HELD and now >= self._next_renew:
            assert self.revision is not None
            self.state, self._sent_at = LeaseState.RENEWING, now
            actions.append(Renew(self.key, self.holder.encode(), self.ttl, self.revision))
        return actions, self._take_events()

    def succeeded(self, revision: int, now: float) -> list[Event]:
        """The outstanding action was stored at ``revision``."""
        if self.state is LeaseState.ACQUIRING:
            self.token = revision
            self._events.append(Acquired(revision))
        if self.state in (LeaseState.ACQUIRING, LeaseState.RENEWING):
            self.state, self.revision = LeaseState.HELD, revision
            self.valid_until = self._sent_at + self.ttl * (1 - self.margin)
            self._next_renew = self._sent_at + self.renew_every
            if now >= self.valid_until:  # the answer came too late to be believed
                self._lose("the write was acknowledged after its ttl", now)
        elif self.state is LeaseState.RELEASING:
            self.state, self.next_try = LeaseState.CLOSED, math.inf
        return self._take_events()

    def conflict(self, now: float) -> list[Event]:
        """The outstanding action's compare-and-set failed: someone else holds the key."""
        if self.state is LeaseState.ACQUIRING:
            self.state, self.next_try = LeaseState.IDLE, now + self.retry
        elif self.state is LeaseState.RENEWING:
            self._lose("another node holds it (renewal refused)", now)
        elif self.state is LeaseState.RELEASING:
            self.state = LeaseState.CLOSED
        return self._take_events()

    def failed(self, now: float) -> list[Event]:
        """The outstanding action got no answer (cluster unavailable): try again later; a
        holder keeps its lease until ``valid_until``."""
        if self.state is LeaseState.ACQUIRING:
            self.state, self.next_try = LeaseState.IDLE, now + self.retry
        elif self.state is LeaseState.RENEWING:
            self.state = LeaseState.HELD
            self._next_renew = min(now + self.retry, self.valid_until)
        elif self.state is LeaseState.RELEASING:
            self.state = LeaseState.CLOSED
        if self.state in (LeaseState.HELD,) and now >= self.valid_until:
            self._lose("not renewed within its ttl", now)
        return self._take_events()

    def release(self, now: float) -> tuple[list[Action], list[Event]]:
        """Hand the lease over (or stop contending): delete the key if this node holds it."""
        actions: list[Action] = []
        if self.state in (LeaseState.HELD, LeaseState.RENEWING) and self.revision is not None:
            token = self.token
            self.state = LeaseState.RELEASING
            actions.append(Delete(self.key, self.revision))
            self._events.append(Lost(token or 0, "released"))
            self.token, self.valid_until = None, -math.inf
        else:
            self.state = LeaseState.CLOSED
        return actions, self._take_events()

    def _lose(self, reason: str, now: float) -> None:
        if self.token is not None:
            self._events.append(Lost(self.token, reason))
        self.state, self.token, self.revision = LeaseState.IDLE, None, None
        self.valid_until, self._next_renew = -math.inf, math.inf
        self.next_try = now + self.retry

    def _take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events


# --- the JetStream adapter -----------------------------------------------------------------


def lease_bucket_config(bucket: str, replicas: int = 1) -> jsapi.KeyValueConfig:
    """The bucket leases and fenced values live in: history 1, per-message TTLs on (via
    ``limit_marker_ttl``, which also leaves a marker when a lease expires)."""
    return jsapi.KeyValueConfig(
        bucket=bucket, history=1, replicas=replicas, limit_marker_ttl=MIN_TTL, direct=True
    )


async def create_lease_bucket(js: JetStreamContext, config: jsapi.KeyValueConfig) -> KeyValue:
    """nats-py's ``create_key_value(config)`` (the same KV stream, ADR-8), with one difference:
    the stream's first sequence is the wall clock in microseconds, not 1. Fencing tokens are
    the bucket's sequences, so a bucket deleted and made again (an operator "resetting the
    leases") would otherwise hand out a former holder's token once more: that holder, paused
    meanwhile, had its fenced writes accepted while the new holder held the lease. A bucket
    writes far fewer than a million messages a second, so a later bucket's tokens start above
    every earlier one's unless the creating node's clock is behind by more than the time
    between the two buckets. (Microseconds stay below 2^53 until the year 2255: exact in JSON
    readers that use doubles.)"""
    stream = jsapi.StreamConfig(
        name=f"KV_{config.bucket}",
        subjects=[f"$KV.{config.bucket}.>"],
        allow_direct=config.direct,
        allow_rollup_hdrs=True,
        allow_msg_ttl=True,
        deny_delete=True,
        discard=jsapi.DiscardPolicy.NEW,
        duplicate_window=120.0,
        max_consumers=-1,
        max_msgs=-1,
        max_msgs_per_subject=config.history,
        num_replicas=config.replicas,
        storage=config.storage,
        subject_delete_marker_ttl=config.limit_marker_ttl,
        first_seq=time.time_ns() // 1000,
    )
    await js.add_stream(stream)
    return await js.key_value(config.bucket)


async def lease_bucket(
    js: JetStreamContext, bucket: str, replicas: int = 1, timeout: float = 10.0
) -> KeyValue:
    """Open the lease bucket, creating it (idempotently, ``create_lease_bucket``) if it does
    not exist; what a settling cluster answers transiently is retried for ``timeout`` seconds
    (``open_bucket``)."""
    from loglake.streams.jetstream import open_bucket

    config = lease_bucket_config(bucket, replicas)
    kv: KeyValue = await open_bucket(js, config, timeout, create_lease_bucket)
    return kv


def _wrong_last_sequence(e: BaseException) -> bool:
    # nats-py's KV raises KeyWrongLastSequenceError without the code; a raw publish keeps it
    return isinstance(e, nats.js.errors.KeyWrongLastSequenceError) or (
        isinstance(e, nats.js.errors.APIError) and e.err_code == WRONG_LAST_SEQUENCE
    )


MARKER_REASON = "Nats-Marker-Reason"
"""Set on the marker the server leaves where a message expired (``limit_marker_ttl``)."""
KV_OPERATION = "KV-Operation"
"""``DEL``/``PURGE`` on a KV delete marker (what ``release`` leaves)."""
NATS_TTL = "Nats-TTL"
"""A message's TTL, as the server keeps it: every lease message loglake writes has one
(``Create``/``Renew`` carry ``msg_ttl``)."""
NEVER_EXPIRES = ("never", "-1")
"""``Nats-TTL`` values that turn expiry off (ADR-43)."""


def lease_holder_message(headers: dict[str, str] | None) -> bool:
    """Whether the newest message on a lease key is a holder's: one with a TTL, so it expires
    unless renewed. An expiry marker or a delete is no holder (the lease is free); so is a value
    another client put on the key without a TTL, or with one that never expires — a ``nats kv
    put`` by hand once blocked the lease, and all the once-only work under it, for good and
    without a word. Such a value is taken over like a marker, by compare-and-set on its
    revision; former holders are fenced all the same (it is not their revision). Any other TTL
    is a holder's (it expires by itself): never steal a live lease over its TTL's spelling."""
    h = headers or {}
    if MARKER_REASON in h or h.get(KV_OPERATION) in ("DEL", "PURGE"):
        return False
    ttl = h.get(NATS_TTL)
    return ttl is not None and ttl.strip().lower() not in NEVER_EXPIRES


class JetStreamLease:
    """One lease on a nats-py JetStream context: ``await lease.start()`` contends in the
    background; ``lease.holds()`` says whether this node holds it; ``await lease.put(key, v)``
    is a write fenced by the lease; ``await lease.release()`` hands it over.

    ``on_change`` (optional) is called with every ``Acquired``/``Lost`` event, on the event
    loop, so the work the lease guards can start and stop."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        name: str,
        holder: str,
        *,
        ttl: int = 5,
        retry: float = 0.5,
        timeout: float = 2.0,
        replicas: int = 1,
        on_change: Callable[[Event], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not _BUCKET.fullmatch(bucket):
            raise ValueError(f"lease bucket {bucket!r}: use letters, digits, - and _")
        self.js, self.bucket, self.timeout = js, bucket, timeout
        self.replicas = replicas
        """Replicas of the bucket if this lease creates it (3 on a 3-node cluster)."""
        self.core = LeaseCore(name, holder, ttl=ttl, retry=retry)
        self.on_change = on_change
        self.clock = clock or asyncio.get_running_loop().time
        self._lock = asyncio.Lock()
        """Renewals and fenced writes do not interleave: a write must carry the newest
        revision this node wrote, or its own renewal would fence it out."""
        self._task: asyncio.Task | None = None
        self._kv: KeyValue | None = None
        self.before_acquire: Callable[[int], Awaitable[None]] | None = None
        """Run on the loop once the lease key is seen free (absent, released or expired), just
        before the compare-and-set that takes it, with the revision the set expects (0: never
        written). ``LeaseFence`` claims its streams here, so a claim precedes the acquisition
        and no former holder's append can land after it; an exception here is a failed
        attempt (tried again after ``retry``)."""

    @property
    def name(self) -> str:
        return self.core.name

    def subject(self, key: str) -> str:
        return f"$KV.{self.bucket}.{key}"

    def holds(self) -> bool:
        return self.core.holds(self.clock())

    def attempted(self) -> bool:
        """Whether the first attempt to take the lease has been answered (held, or found
        taken or unreachable and to be tried again)."""
        held = self.core.state in (LeaseState.HELD, LeaseState.RENEWING)
        return held or self.core.next_try > -math.inf

    @property
    def token(self) -> int | None:
        return self.core.token

    async def start(self) -> JetStreamLease:
        try:
            self._kv = await lease_bucket(self.js, self.bucket, self.replicas)
        except (nats.errors.Error, TimeoutError, LogError) as e:  # nats-py's, ClusterUnavailable
            raise LeaseUnavailable(f"lease bucket {self.bucket!r}: {e}") from e
        self._task = asyncio.create_task(self._run(), name=f"lease {self.name}")
        return self

    async def _run(self) -> None:
        step = min(self.core.retry, self.core.renew_every) / 2
        while self.core.state is not LeaseState.CLOSED:
            async with self._lock:
                try:
                    await self.step()
                except Exception as e:  # an on_change that raised: the lease keeps running
                    logger.error("lease %s: %r", self.name, e)
            await asyncio.sleep(step)

    async def step(self) -> None:
        """Poll the core once and perform what it asks (the background task's body; tests
        may call it directly)."""
        actions, events = self.core.poll(self.clock())
        self._emit(events)
        for action in actions:
            await self._perform(action)

    async def _perform(self, action: Action) -> None:
        try:
            if isinstance(action, Create):
                # a pre-acquisition hook (claims on the guarded streams) gets its own timeout
                limit = self.timeout * (2 if self.before_acquire is not None else 1)
                revision = await asyncio.wait_for(self._create(action), limit)
            elif isinstance(action, Renew):
                ack = await self.js.publish(
                    self.subject(action.key),
                    action.value,
                    timeout=self.timeout,
                    headers={EXPECTED_LAST_SUBJECT_SEQUENCE: str(action.last)},
                    msg_ttl=action.ttl,
                )
                revision = ack.seq
            else:
                assert self._kv is not None  # opened by start()
                await asyncio.wait_for(self._kv.delete(action.key, last=action.last), self.timeout)
                revision = 0
        except Exception as e:  # every failure is one of the core's two inputs
            if _wrong_last_sequence(e):
                self._emit(self.core.conflict(self.clock()))
            else:
                logger.debug("lease %s: %s failed: %r", self.name, type(action).__name__, e)
                self._emit(self.core.failed(self.clock()))
            return
        self._emit(self.core.succeeded(revision, self.clock()))

    async def _create(self, action: Create) -> int:
        """Write the lease key if it is absent, deleted (a released lease) or expired: read its
        newest message and, if there is none, it is either marker, or it is another client's
        value that never expires (``lease_holder_message``), overwrite it by
        compare-and-set on that sequence (a contender that wins meanwhile makes the set fail;
        nats-py's ``kv.create`` takes only delete markers for absence, which would delay every
        handover by the expired lease's marker). ``before_acquire`` runs between the read and
        the set: once the key shows a marker, the former holder can never renew or pass a
        fenced write again (both expect its own revision), so what the hook writes comes after
        the former holder's last authorised write and before this node's tenure."""
        subject = self.subject(action.key)
        try:
            msg = await self.js.get_last_msg(f"KV_{self.bucket}", subject, direct=True)
        except nats.js.errors.NotFoundError:
            last = 0
        else:
            if lease_holder_message(msg.headers):
                raise nats.js.errors.KeyWrongLastSequenceError()  # a live holder
            headers = msg.headers or {}
            if MARKER_REASON not in headers and headers.get(KV_OPERATION) not in ("DEL", "PURGE"):
                logger.warning(
                    "lease %s: taking over a value another client left on its key with no "
                    "expiry (Nats-TTL %s, value %r)",
                    self.name,
                    headers.get(NATS_TTL, "absent"),
                    bytes(msg.data or b"")[:80],
                )
            last = msg.seq or 0
        if self.before_acquire is not None:
            await self.before_acquire(last)
        ack = await self.js.publish(
            subject,
            action.value,
            timeout=self.timeout,
            headers={EXPECTED_LAST_SUBJECT_SEQUENCE: str(last)},
            msg_ttl=action.ttl,
        )
        return ack.seq

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            logger.info("lease %s (%s): %s", self.name, self.core.holder, event)
            if self.on_change is not None:
                self.on_change(event)

    def fence(self) -> int:
        """The token a fenced write carries now (the newest revision this node wrote on the
        lease key); ``LeaseLost`` if this node does not hold the lease."""
        if not self.holds() or self.core.revision is None:
            raise LeaseLost(self.name, f"state {self.core.state.value}")
        return self.core.revision

    async def put(self, key: str, value: bytes) -> int:
        """Write ``value`` under ``key`` only while this node holds the lease: refused
        locally (``LeaseLost``) when the lease is not held, and by the cluster (``FencedOut``)
        when another node has taken it since. Returns the value's revision."""
        async with self._lock:
            return await self.put_fenced(key, value, self.fence())

    async def put_fenced(self, key: str, value: bytes, token: int) -> int:
        """Write ``value`` under ``key`` if the lease key's newest revision is still
        ``token`` — the cluster's check alone (what a writer that took its token before a
        pause relies on)."""
        headers = {
            EXPECTED_LAST_SUBJECT_SEQUENCE: str(token),
            EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: self.subject(self.core.key),
        }
        try:
            ack = await self.js.publish(
                self.subject(self.fenced_key(key)), value, timeout=self.timeout, headers=headers
            )
        except nats.js.errors.APIError as e:
            if _wrong_last_sequence(e):
                raise FencedOut(self.name, token, f" ({e.description})") from None
            raise LeaseError(f"lease {self.name!r}: fenced write refused: {e}") from e
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError) as e:
            raise LeaseUnavailable(
                f"lease {self.name!r}: no answer to a fenced write within {self.timeout}s; "
                "its outcome is unknown"
            ) from e
        return ack.seq

    def fenced_key(self, key: str) -> str:
        return f"{FENCED_PREFIX}{self.name}.{key}"

    async def get(self, key: str) -> bytes | None:
        """The value last written under ``key`` by a holder of this lease, or None."""
        try:
            assert self._kv is not None, "start() the lease first"
            entry = await self._kv.get(self.fenced_key(key))
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.value

    async def release(self) -> None:
        """Stop contending; if this node holds the lease, delete it so another node takes
        it at once instead of after the ttl."""
        async with self._lock:
            actions, events = self.core.release(self.clock())
            self._emit(events)
            for action in actions:
                await self._perform(action)
        await self.close()

    async def close(self) -> None:
        """Stop the background task without releasing (as a crash would: the lease expires)."""
        self.core.state = LeaseState.CLOSED
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


# --- the fence a part's once-only writer uses (``streams.fence.Fence``) ---------------------


STREAMS_KEY = "streams"
"""The fenced key (``fenced.<lease>.streams``) listing, as JSON, every stream a holder of the
lease has appended to: the next contender claims them all before it takes the lease, including
streams it has not guarded itself yet."""
MAX_CLAIM_TRIES = 8


class LeaseFence:
    """``streams.fence.Fence`` on a ``JetStreamLease``: appends to the streams a lease guards
    (the ICRC journal and ledger, a Cardinal checkpoint stream, the archives control node's
    channel) go only while this node holds the lease, and are refused by the cluster once a
    newer holder has claimed the stream.

    Why a claim: JetStream checks an expected sequence only within one stream, and the lease
    key lives in the KV bucket, so a guarded stream cannot be fenced by the lease key itself.
    Instead each contender, once it has read the lease key free and *before* its compare-and-set
    takes it (``JetStreamLease.before_acquire``), appends a claim record
    (``fence.claim_record``) to every guarded stream with ``Nats-Expected-Last-Sequence`` = the
    head it read; every append of a holder expects the head its own previous append (or claim)
    left. A former holder's append expects a head from before the claim, so JetStream refuses it
    — whatever its own clock says — and since the claim precedes the new tenure, no former
    holder's append can land after the new holder took the lease (a claim made after the
    compare-and-set would leave that window open).

    A holder whose append finds the head moved reads what moved it: claims only (a contender
    that then lost the compare-and-set) and a fenced write on the lease bucket that the cluster
    accepts (this node's revision is still the lease key's newest) let it append at the new
    head; anything else is ``FencedOut``. The streams guarded are listed in the lease bucket
    (``STREAMS_KEY``, a fenced write made before a holder's first append to a stream), so a
    contender claims every stream any former holder wrote, not only those it knows. A stream
    first guarded after this tenure began is claimed then, after that fenced write (a former
    holder cannot have written it: it is in no list the contender read).

    Called from the parts' threads (blocking); the publishes run on the log's loop. Attach the
    fence before the lease starts (``JetStreamLease.start``) so its first acquisition claims."""

    def __init__(self, log: Any, lease: JetStreamLease, streams: tuple[str, ...] = ()) -> None:
        self.log, self.lease = log, lease
        self.name = lease.name
        self._lock = threading.Lock()
        """One guarded append at a time from the parts' threads (held across I/O; never taken
        on the log's loop)."""
        self._state = threading.Lock()
        """The fields below (never held across I/O: the loop takes it too)."""
        self._tenure: int | None = None
        """The lease token the heads below belong to."""
        self._heads: dict[str, int] = {}
        """Guarded stream → the next index this holder's appends expect."""
        self._listed: set[str] = set()
        """Streams in the cluster's list (``STREAMS_KEY``) as this tenure knows it."""
        self._pending: tuple[dict[str, int], set[str]] | None = None
        """Heads claimed and streams listed by the last pre-acquisition pass."""
        self.streams: set[str] = set(streams)
        """The streams this fence guards (claimed before each acquisition)."""
        self.claims = 0
        self.refused = 0
        lease.before_acquire = self._before_acquire
        if lease.on_change is None:
            lease.on_change = self.on_event

    def holds(self) -> bool:
        return self.lease.holds()

    def tenure(self) -> int | None:
        return self.lease.token if self.lease.holds() else None

    def guard(self, *streams: str) -> None:
        with self._state:
            self.streams.update(streams)

    def claim(self) -> None:
        from loglake.log.api import UnknownStream

        with self._state:
            streams = sorted(self.streams)
        with self._lock:
            for stream in streams:
                try:
                    self._ensure_claimed(stream)
                except UnknownStream:
                    continue  # nobody wrote it yet: the first append creates and claims it

    def on_event(self, event: Event) -> None:
        """The lease's ``on_change``: on ``Acquired``, the heads the pre-acquisition pass
        claimed become this tenure's (runs on the loop; no I/O)."""
        if isinstance(event, Acquired):
            with self._state:
                heads, listed = self._pending or ({}, set())
                self._tenure, self._heads, self._listed = event.token, dict(heads), set(listed)
                self._pending = None

    # -- on the loop, before the compare-and-set ----------------------------------------------
    async def _before_acquire(self, free_revision: int) -> None:
        from loglake.log.api import UnknownStream

        listed = await self._listed_streams()
        with self._state:
            wanted = sorted(self.streams | listed)
            self._pending = None
        heads: dict[str, int] = {}
        for stream in wanted:
            try:
                heads[stream] = await self._claim_async(stream, free_revision)
            except UnknownStream:
                continue  # nobody wrote it: whoever appends first claims it
            except Exception as e:
                logger.warning("lease %s: claim of %s before taking it: %r", self.name, stream, e)
                raise
        with self._state:
            self._pending = (heads, listed)

    async def _listed_streams(self) -> set[str]:
        """The streams former holders listed (read from the stream leader, not a replica that
        may lag behind the list's last write)."""
        import json

        subject = self.lease.subject(self.lease.fenced_key(STREAMS_KEY))
        try:
            msg = await self.lease.js.get_last_msg(f"KV_{self.lease.bucket}", subject)
        except nats.js.errors.NotFoundError:
            return set()
        try:
            names = json.loads(msg.data or b"[]")
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            logger.warning("lease %s: ignoring a malformed stream list %r", self.name, msg.data)
            return set()
        return set(names)

    async def _claim_async(self, stream: str, token: int) -> int:
        from loglake.streams.fence import claim_record
        from loglake.streams.jetstream import HeadMoved

        record = claim_record(self.name, self.lease.core.holder, token)
        for _ in range(MAX_CLAIM_TRIES):  # each retry follows a write between read and claim
            head = await self.log.next_index_async(stream, partition=0)
            try:
                (index,) = await self.log.push_expecting_async(stream, 0, [record], head)
            except HeadMoved:
                continue
            self.claims += 1
            logger.info("lease %s: claimed %s at %d before taking it", self.name, stream, index)
            return index + 1
        raise LeaseUnavailable(f"lease {self.name!r}: could not claim {stream!r}: it kept moving")

    # -- on the parts' threads ----------------------------------------------------------------
    def _list(self, stream: str) -> None:
        """A fenced write of the stream list with ``stream`` in it: the cluster's word that this
        node still holds the lease (``FencedOut`` otherwise), and the next contender's way to
        know the stream."""
        import json

        with self._state:
            names = sorted(self._listed | self.streams | {stream})
        try:
            self.log.call(self.lease.put(STREAMS_KEY, json.dumps(names).encode()))
        except FencedOut:
            self.refused += 1
            raise
        with self._state:
            self._listed.update(names)

    def _ensure_claimed(self, stream: str) -> tuple[int, int]:
        """(tenure token, the head this holder's next append to ``stream`` expects); lists and
        claims ``stream`` first if this tenure has not (holds ``_lock``)."""
        from loglake.streams.fence import claim_record
        from loglake.streams.jetstream import HeadMoved

        tenure = self.lease.token
        if tenure is None or not self.lease.holds():
            raise LeaseLost(self.name, f"state {self.lease.core.state.value}")
        with self._state:
            if self._tenure != tenure:  # acquired without the pre-acquisition pass
                self._tenure, self._heads, self._listed = tenure, {}, set()
            head = self._heads.get(stream)
            listed = stream in self._listed
        if head is not None:
            if not listed:
                self._list(stream)
            return tenure, head
        record = claim_record(self.name, self.lease.core.holder, tenure)
        for _ in range(MAX_CLAIM_TRIES):
            head = self.log.next_index(stream, partition=0)
            self._list(stream)  # still the holder: a former one cannot claim a stream back
            try:
                (index,) = self.log.push_expecting(stream, 0, [record], head)
            except HeadMoved:
                continue
            with self._state:
                if self._tenure == tenure:
                    self._heads[stream] = index + 1
                self.streams.add(stream)
            self.claims += 1
            logger.info("lease %s: claimed %s at %d (token %d)", self.name, stream, index, tenure)
            return tenure, index + 1
        raise FencedOut(self.name, tenure, f" (could not claim {stream!r}: it kept moving)")

    def _past_claims(self, stream: str, head: int, tenure: int) -> int:
        """The head moved from ``head``: the new head if only claims moved it and the cluster
        says this node still holds the lease; ``FencedOut`` otherwise."""
        from loglake.streams.fence import is_claim

        now = self.log.next_index(stream, partition=0)
        moved = self.log.read_payloads(stream, head, now - head, partition=0)
        if len(moved) != now - head or not all(is_claim(d) for _, d in moved):
            with self._state:
                self._heads.pop(stream, None)
            self.refused += 1
            raise FencedOut(self.name, tenure, f" ({stream!r} has records past {head})")
        self._list(stream)
        with self._state:
            if self._tenure == tenure:
                self._heads[stream] = now
        return now

    def append(self, streams: Any, stream: str, datas: Sequence[bytes]) -> list[int]:
        """``Fence.append``: ``LeaseLost`` when not held here, ``FencedOut`` when a newer
        holder claimed ``stream`` (nothing more written either way). ``streams`` is the part's
        ``Streams`` (unused: the append goes straight to the log, which the claim fences)."""
        from loglake.streams.jetstream import HeadMoved

        if not datas:
            return []
        with self._lock:
            tenure, head = self._ensure_claimed(stream)
            ids: list[int] = []
            rest = list(datas)
            for _ in range(MAX_CLAIM_TRIES):
                try:
                    ids += self.log.push_expecting(stream, 0, rest, head)
                except HeadMoved as e:
                    stored = e.expected - head  # those before the refused one were stored
                    ids += range(head, e.expected)
                    rest = rest[stored:]
                    head = self._past_claims(stream, e.expected, tenure)
                    continue
                with self._state:
                    if self._tenure == tenure:
                        self._heads[stream] = ids[-1] + 1
                return ids
            raise FencedOut(self.name, tenure, f" ({stream!r} kept moving)")
