"""The ICRC-72 Publisher with ICRC-77 procurement and republishing (sans-I/O).

A namespace is a loglake stream and an event id is its index (DESIGN.md "events"); the
Publisher owns that history — ICRC-77 "assigns archival responsibility to Publishers". Live
events are appended to the stream, then sent with ``icrc72_publish`` to the Broadcaster the
orchestrator assigned (``icrc72:publisher:broadcaster:add``, candidate "Publisher Life Cycle").

ICRC-77 step 5: on ``icrc77:publisher:replay:add`` the Publisher procures ``[start, end)`` from
the namespace's stream — it queues ``ReadBounds`` and ``ReadRange`` actions; its adapter pulls
through ``Streams`` (segments and lake alike on the embedded log, or a ``loglake serve`` node) —
and republishes each event through ``icrc72_publish`` with the replay headers appended
(never overwriting the stored ones):

- ``icrc77:replay:id = #Nat(replayId)`` on every replayed event;
- ``icrc77:replay:end_id = #Nat(last id)`` on every replayed event of a request that had no end.
  The ICRC-77 text names this header twice: ``icrc77:replay:end`` in a comment on
  ``ReplayRegistration`` and ``icrc77:replay:end_id`` in the normative "Published Event Headers"
  list. We emit ``end_id`` (the list is the normative part, and the name says what the value is)
  and our subscriber accepts both. We put it on every event of the replay rather than only the
  first, so a subscriber whose filter drops the first event still learns the end.

An open-ended request's end is the head the orchestrator priced and capped it at (the add's
sixth element), or the stream's head when procurement starts if lower. Step 7: status goes
to the orchestrator with ``icrc77_replay_status`` (``running`` when procurement starts,
``completed(n)`` / ``canceled(n)`` / ``errored(text)`` at the end, ``n`` = events republished
and accepted by the Broadcaster). Back-pressure: at most ``max_inflight`` publish calls per
replay are outstanding; events the Broadcaster answers ``Busy`` are sent again later. Pacing:
with ``replay_rate`` a replay procures at most that many events a second (by the clock the core
is given: a batch is not procured before its slot), so one long replay cannot take a node's
whole CPU or flood a slow subscriber; ICRC-77 leaves the rate to the Publisher.

Stored form: a stream message is only ``(index, data)`` (the Ockam wire carries nothing else),
so ``data`` holds the whole event: ``0x00 · timestamp (u64 BE, ns) · icrc16.encode(value)``, or
with headers ``0x01 · timestamp · len (u32 BE) · Candid ICRC16Map of the headers ·
icrc16.encode(value)``. Replay republishes the stored value bytes without decoding them
(``icrc16.RawValue``).

The core performs no I/O: ``publish`` queues ``AppendEvents`` and sends the events once the
adapter reports their indexes (``on_result``).
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from icp_principal import Principal

from loglake.errors import DecodeError
from loglake.events import live, sysmsg
from loglake.events.actions import AppendEvents, Call, ReadBounds, ReadRange, StorageAction
from loglake.events.fastcodec import EventBatch, PublishResults, event_batch
from loglake.events.live import MAX_EVENTS as MAX_LIVE_BACKLOG
from loglake.events.live import LiveBacklog
from loglake.events.messages import (
    C_PRICING,
    C_REPLAY,
    EVENT_OVERHEAD,
    H_REPLAY_END_ID,
    H_REPLAY_ID,
    MAX_MESSAGE_BYTES,
    RUNNING,
    Err,
    Event,
    EventNotification,
    ICRC16Map,
    Ok,
    Registration,
    ReplayState,
    ReplayStatusUpdate,
    by_size,
)
from loglake.events.orchestrator import HEAD_KEY, PROGRESS_KEY
from loglake.events.orchestrator_state import E_RATE
from loglake.events.resend import Resender
from loglake.events.role import Role, check_positive
from loglake.streams.api import StreamMessage
from loglake.wire import icrc16
from loglake.wire.icrc16 import Property, RawValue, Value

STORED_PLAIN, STORED_WITH_HEADERS = 0, 1
"""First byte of a stored event: value only, or headers then value."""
_TS = struct.Struct(">Q")
_HLEN = struct.Struct(">I")
_PREFIX = icrc16.MESSAGE_PREFIX
_PLEN = len(_PREFIX)
_PREFIX_ROW = np.frombuffer(_PREFIX, np.uint8)
log = logging.getLogger("loglake.events")
LIVE_ATTEMPTS = 12
"""Resend calls of a namespace's live backlog that may fail in a row (not answered: the
broadcaster down, a 5xx) before the events of the failing one are given up (``live_refused``,
a warning): they stay in the stream; the events behind them waited for them."""


class StoredEventError(DecodeError):
    """A namespace message that is not a stored event."""


def stored_event(data: Value, headers: ICRC16Map | None, timestamp: int) -> bytes:
    """The stream message ``data`` of one event (see the module docstring)."""
    value = icrc16.encode(data)
    if not headers:
        return bytes([STORED_PLAIN]) + _TS.pack(timestamp) + value
    hdrs = icrc16.encode_map(headers)
    return bytes([STORED_WITH_HEADERS]) + _TS.pack(timestamp) + _HLEN.pack(len(hdrs)) + hdrs + value


def stored_parts(data: bytes) -> tuple[int, bytes | None, bytes]:
    """``(timestamp, icrc16.encode_map(headers) bytes or None, icrc16.encode(value) bytes)``
    of a stored event, nothing decoded (a caller that bounds the decode: the console)."""
    try:
        kind = data[0]
        (ts,) = _TS.unpack_from(data, 1)
        if kind == STORED_PLAIN:
            return ts, None, data[9:]
        if kind == STORED_WITH_HEADERS:
            (hlen,) = _HLEN.unpack_from(data, 9)
            return ts, data[13 : 13 + hlen], data[13 + hlen :]
    except (IndexError, struct.error) as e:
        raise StoredEventError(f"truncated stored event ({len(data)} bytes)") from e
    raise StoredEventError(f"unknown stored event kind {kind}")


def _split(data: bytes) -> tuple[int, ICRC16Map | None, bytes]:
    """``(timestamp, headers, icrc16.encode(value) bytes)`` of a stored event."""
    ts, headers, value = stored_parts(data)
    return ts, None if headers is None else icrc16.decode_map(headers), value


def event_of(
    index: int,
    data: bytes,
    namespace: str,
    source: Principal,
    extra: ICRC16Map | None = None,
    raw: bool = True,
) -> Event:
    """A stored event as an ICRC-72 Event; ``extra`` headers are appended."""
    ts, headers, value = _split(data)
    decoded: Any = RawValue.from_message(value) if raw else None
    if decoded is None:
        decoded = icrc16.decode(value)
    if extra:
        headers = [*(headers or []), *extra]
    return Event(index, index - 1 if index else None, ts, namespace, decoded, source, headers)


def procure(
    messages: Iterable[StreamMessage],
    namespace: str,
    replay_id: int,
    source: Principal,
    open_ended: bool,
    last_id: int,
) -> list[Event]:
    """ICRC-77 step 5: the stored events ``messages`` of ``namespace`` as Events with the replay
    headers (``end_id`` = ``last_id``, the replay's last event id, when it was open-ended)."""
    extra: ICRC16Map = [(H_REPLAY_ID, {"Nat": replay_id})]
    if open_ended:
        extra.append((H_REPLAY_END_ID, {"Nat": last_id}))
    out: list[Event] = []
    unpack = _TS.unpack_from
    for m in messages:
        i, d = m.index, m.data
        if d[:1] != b"\x00" or not d.startswith(_PREFIX, 9):
            out.append(event_of(i, d, namespace, source, extra))
            continue
        # the common case inlined: no stored headers; `extra` is shared by the events of a
        # batch and never mutated
        out.append(
            Event(
                i,
                i - 1 if i else None,
                unpack(d, 1)[0],
                namespace,
                RawValue(d[9 + _PLEN :]),
                source,
                extra,
            )
        )
    return out


def procure_batch(
    messages: Sequence[StreamMessage],
    namespace: str,
    replay_id: int,
    source: Principal,
    open_ended: bool,
    last_id: int,
) -> EventBatch | list[Event]:
    """:func:`procure`, written at once as the ``icrc72_publish`` message
    (``fastcodec.event_batch``: no ``Event`` per stored event) when every message is a stored
    event without headers (the usual case); otherwise the list :func:`procure` makes."""
    off = 9 + _PLEN
    datas = [m.data for m in messages]
    # every message's kind, timestamp and value prefix, read at once (numpy)
    heads = b"".join([d[:off] for d in datas])
    if not messages or len(heads) != off * len(datas):
        return procure(messages, namespace, replay_id, source, open_ended, last_id)
    rows = np.frombuffer(heads, np.uint8).reshape(len(datas), off)
    if bool(rows[:, 0].any()) or not bool((rows[:, 9:] == _PREFIX_ROW).all()):
        return procure(messages, namespace, replay_id, source, open_ended, last_id)
    extra: ICRC16Map = [(H_REPLAY_ID, {"Nat": replay_id})]
    if open_ended:
        extra.append((H_REPLAY_END_ID, {"Nat": last_id}))
    return event_batch(
        [m.index for m in messages],
        np.ascontiguousarray(rows[:, 1:9]).view(">u8").ravel().astype(np.uint64),
        [d[off:] for d in datas],
        namespace,
        source,
        extra,
    )


BATCH_SIZE = 2000
"""Events procured (one ``ReadRange``) and published per replay batch, by default. Each call
costs a request, a signature and its check, whatever its size: 2,000 events of 200 bytes
(about 0.7 MB a call) cost about half the CPU per event that 500 did (benchmarks/replay.py)."""


def _unread(start: int, stop: int, read: list[StreamMessage]) -> str:
    """Why a replay batch's ``read`` from ``start`` is not the whole of ``[start, stop)`` (a
    stream's reads are contiguous from the first index kept): its head is no longer kept, or
    the read ended early."""
    if not read:
        return f"events {start}..{stop - 1} are no longer kept"
    if read[0].index != start:
        return f"events before {read[0].index} are no longer kept"
    last = max((m.index for m in read if m.index < stop), default=start - 1)
    return f"events {last + 1}..{stop - 1} could not be read"


@dataclass
class ActiveReplay:
    id: int
    namespace: str
    start: int
    end: int
    open_ended: bool
    broadcaster: Principal
    cursor: int
    sent: int = 0
    reported: int = 0
    inflight: int = 0
    started: bool = False
    canceled: bool = False
    done: bool = False
    final: ReplayState | None = None
    retry: deque[Event] = field(default_factory=deque)
    next_at: int = 0
    """With a ``replay_rate``: the clock time (ns) before which no batch is procured."""
    retry_at: int = 0
    """After ``Busy``: the clock time (ns) before which nothing is sent (``live`` back-off)."""
    retry_delay: int = live.FIRST_NS


def publication_config(price_per_event: int = 0, currency: str = "icrc1:loglake") -> ICRC16Map:
    """A replay-capable publication's ``icrc72_register_publication`` config: ``icrc77:replay``
    and, when replays are paid, ``icrc77:pricing`` (per event, in ``currency``)."""
    cfg: ICRC16Map = [(C_REPLAY, {"Bool": True})]
    if price_per_event:
        pricing = [
            Property("perEvent", {"Nat": price_per_event}),
            Property("currency", {"Text": currency}),
        ]
        cfg.append((C_PRICING, {"Class": pricing}))
    return cfg


HEAD_POLL_NS = 1_000_000_000
"""How often a Publisher reads each namespace's head for the orchestrator (``_poll_heads``):
events stored other than through it are replayable within this."""
REGISTER_RETRY_FIRST_NS = 500_000_000
REGISTER_RETRY_MAX_NS = 30_000_000_000
"""A registration the orchestrator did not answer is sent again after 0.5 s, doubling to 30 s."""


def _rate_refusal(result: Any) -> bool:
    """The orchestrator's answer to a caller over its request rate (``GenericError`` 2): not a
    refusal of the registration, which may be sent again once the window has moved on."""
    return (
        isinstance(result, Err)
        and result.tag == "GenericError"
        and isinstance(result.payload, dict)
        and result.payload.get("error_code") == E_RATE
    )


@dataclass
class RegistrationState:
    """One namespace's registration: ``pending`` (a call in flight), ``retrying`` (the last
    call failed; sent again at ``retry_at``), ``registered`` or ``refused`` (final)."""

    config: ICRC16Map
    state: str = "pending"
    attempts: int = 0
    last_error: str | None = None
    retry_at: int | None = None


class Publisher(Role):
    def __init__(
        self,
        principal: Principal,
        orchestrator: Principal,
        batch_size: int = BATCH_SIZE,
        max_inflight: int = 4,
        progress_every: int = 5000,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        replay_rate: float | None = None,
        max_live_backlog: int = MAX_LIVE_BACKLOG,
    ) -> None:
        super().__init__(principal)
        check_positive(
            batch_size=batch_size,
            max_inflight=max_inflight,
            progress_every=progress_every,
            max_message_bytes=max_message_bytes,
            max_live_backlog=max_live_backlog,
        )
        if replay_rate is not None and not replay_rate > 0:
            raise ValueError(f"replay_rate must be > 0 events/s, not {replay_rate!r}")
        self.replay_rate = replay_rate
        """Events a second per replay at most (None: as fast as back-pressure allows)."""
        self.max_message_bytes = max_message_bytes
        self.progress_every = progress_every
        self.orchestrator = orchestrator
        self.batch_size = batch_size
        self.max_inflight = max_inflight
        self.broadcasters: dict[int, Principal] = {}
        self.publication_ids: dict[str, int] = {}
        self.replays: dict[int, ActiveReplay] = {}
        self._opening: set[int] = set()
        """Replay ids whose stream bounds are being read (``ReadBounds`` queued)."""
        self._removed_early: set[int] = set()
        self.resender = Resender(max_attempts=None)
        """Replay status reports and head reports whose call failed, sent again until they
        pass (one orchestrator, one entry a replay or namespace: a lost final status would
        leave the replay running there)."""
        self._head_reported: dict[str, int] = {}
        """namespace → the highest head reported to the orchestrator."""
        self._head_polled: dict[str, int] = {}
        """namespace → when its head was last read (``_poll_heads``)."""
        self._head_reading: set[str] = set()
        self.registration_results: dict[str, Any] = {}
        self.registrations: dict[str, RegistrationState] = {}
        """namespace → where its ``icrc72_register_publication`` stands."""
        self.max_live_backlog = max_live_backlog
        self.live: dict[str, LiveBacklog] = {}
        """namespace → its live events the broadcaster did not take, to send again
        (``loglake.events.live``)."""
        self.live_refused = 0
        """Live events the broadcaster refused for good (an ``Err`` other than ``Busy``)."""
        self.methods = {"icrc72_handle_notification": self.handle_notification}

    # -- ICRC-72 publishing ------------------------------------------------------------------
    def register(self, namespace: str, config: ICRC16Map, now: int = 0) -> None:
        """Queue ``icrc72_register_publication``; the reply gives the publication id. A call
        that fails (the orchestrator not up yet, a network error) is sent again with
        exponential back-off until the orchestrator answers (``registrations`` says where it
        stands); a refusal (``Err``) is final."""
        self.registrations[namespace] = RegistrationState(config)
        self._send_registration(namespace, now)

    def _send_registration(self, namespace: str, now: int) -> None:
        st = self.registrations[namespace]
        st.state, st.retry_at = "pending", None
        st.attempts += 1
        self.outbox.append(
            Call(
                self.orchestrator,
                "icrc72_register_publication",
                [Registration(namespace, st.config)],
                token=("register", namespace),
            )
        )

    def _registered(self, namespace: str, reply: Any, now: int) -> None:
        st = self.registrations.get(namespace)
        result = reply[0] if isinstance(reply, list) and reply else None
        if isinstance(reply, BaseException) or _rate_refusal(result):
            # not answered, or told to slow down (the request rate): try again later
            if st is not None:
                delay = min(REGISTER_RETRY_MAX_NS, REGISTER_RETRY_FIRST_NS << (st.attempts - 1))
                why = reply if isinstance(reply, BaseException) else result
                st.state, st.retry_at, st.last_error = "retrying", now + delay, str(why)
            return
        if isinstance(result, Ok):
            self.publication_ids[namespace] = result.value
            self._head_polled.pop(namespace, None)  # read the head at the next pump
        self.registration_results[namespace] = result
        if st is not None:
            st.state = "registered" if isinstance(result, Ok) else "refused"
            st.last_error = None if isinstance(result, Ok) else str(result)

    def broadcaster_for(self, namespace: str) -> Principal | None:
        pid = self.publication_ids.get(namespace)
        return None if pid is None else self.broadcasters.get(pid)

    def publish(
        self, namespace: str, items: list[tuple[Value, ICRC16Map | None]], now: int
    ) -> AppendEvents:
        """Queue the append of events to the namespace's stream; once the adapter reports their
        ids (:meth:`on_result`), they go to the namespace's broadcaster and the new head to the
        orchestrator. The adapter's result for the returned action is the list of ids."""
        payloads = [stored_event(d, h, now) for d, h in items]
        action = AppendEvents(namespace, payloads, token=("publish", now, [h for _, h in items]))
        self.outbox.append(action)
        return action

    def _published(self, a: AppendEvents, ids: list[int]) -> None:
        if not ids:
            return
        _, now, headers = a.token
        ns = a.stream
        bc = self.broadcaster_for(ns)
        if bc is not None:
            events = [
                Event(
                    i,
                    i - 1 if i else None,
                    now,
                    ns,
                    RawValue(_split(p)[2][_PLEN:]),
                    self.principal,
                    h,
                )
                for i, p, h in zip(ids, a.payloads, headers, strict=True)
            ]
            backlog = self.live.get(ns)
            if backlog is not None and backlog.holding():
                backlog.queue(events)  # behind the events waiting to be sent again
            else:
                # cut at the budget, as replay batches are: one call of a whole
                # loglake_publish (each event ~100 bytes longer here) went over the
                # broadcaster's body limit
                for chunk in by_size(events, self.max_message_bytes):
                    self.outbox.append(Call(bc, "icrc72_publish", chunk, token=("live", ns)))
        self._report_head(ns, ids[-1] + 1)

    def _pump_live(self, now: int) -> bool:
        """The next call of each namespace's live backlog, when its back-off has passed."""
        queued = False
        for ns, backlog in self.live.items():
            bc = self.broadcaster_for(ns)
            if bc is None or not backlog.ready(now):
                continue
            for _ in range(backlog.calls(self.max_inflight)):
                events = backlog.take(self.batch_size, self.max_message_bytes)
                if not events:
                    break
                backlog.inflight += 1
                self.outbox.append(Call(bc, "icrc72_publish", events, token=("live", ns, 1)))
                queued = True
        return queued

    def _live_replied(self, call: Call, reply: Any, now: int) -> None:
        """A live publish call answered: its events answered ``Busy`` (or all of them, when
        the call failed) are held to be sent again; other refusals are final."""
        ns = call.token[1]
        resend = len(call.token) > 2
        backlog = self.live.get(ns)
        if backlog is None:
            backlog = self.live[ns] = LiveBacklog(ns, self.max_live_backlog)
        if resend:
            backlog.inflight -= 1
        events: list[Event] = call.arg  # a list (by_size's chunks, LiveBacklog.take)
        missed: list[Event] = []
        if isinstance(reply, BaseException):
            if resend:
                backlog.failed_calls += 1
            # not answered: may have arrived (subscribers deduplicate); not for ever, though:
            # the events behind it wait for it
            if getattr(reply, "retriable", True) and backlog.failed_calls < LIVE_ATTEMPTS:
                missed = events
            else:
                self.live_refused += len(events)
                log.warning("live events %d.. of %r not sent: %s", events[0].event_id, ns, reply)
        elif isinstance(reply, PublishResults):  # Ok… then Busy… (a short one: the rest too)
            missed = events[min(reply.delivered, len(events)) :]
        else:
            refused: list[Any] = []
            for e, res in zip(events, reply, strict=False):
                if isinstance(res, Err) and res.tag == "Busy":
                    missed.append(e)
                elif isinstance(res, Err):
                    refused.append(res)
            missed += events[len(reply) :]  # not answered (a reply shorter than the call)
            if refused:
                self.live_refused += len(refused)
                log.warning(
                    "%d live event(s) of %r refused by the broadcaster: %s",
                    len(refused), ns, refused[0],
                )  # fmt: skip
        if missed:
            backlog.hold(missed, now, front=resend)
        elif resend and not isinstance(reply, BaseException):
            backlog.taken()

    def _poll_heads(self, now: int) -> bool:
        """Read each registered namespace's head every ``HEAD_POLL_NS`` (and at once after
        registering): events stored other than through :meth:`publish` (before the
        registration, by an earlier run, imported over the stream service) are replayable
        once the orchestrator knows of them, since it prices and bounds replays by the head
        it was told."""
        queued = False
        for ns in self.publication_ids:
            last = self._head_polled.get(ns)
            # (a read whose result never came, its action failed: asked again after 10 polls)
            wait = 10 * HEAD_POLL_NS if ns in self._head_reading else HEAD_POLL_NS
            if last is not None and now - last < wait:
                continue
            self._head_polled[ns] = now
            self._head_reading.add(ns)
            self.outbox.append(ReadBounds(ns, token=("head", ns)))
            queued = True
        return queued

    def _report_head(self, namespace: str, head: int) -> None:
        """Tell the orchestrator the namespace's head, when it is past what it was told
        (sent again until it answers: a lost report would leave the events past it out of
        every replay)."""
        if namespace not in self.publication_ids or head <= self._head_reported.get(namespace, 0):
            return  # (not registered yet: the poll after registering reports it)
        self._head_reported[namespace] = head
        self.outbox.append(
            Call(
                self.orchestrator,
                "icrc72_update_publication",
                [(namespace, HEAD_KEY, {"Nat": head})],
                token=("head", namespace),
            )
        )

    def on_result(self, action: StorageAction, result: Any, now: int) -> None:
        if isinstance(action, AppendEvents):
            self._published(action, result)
        elif isinstance(action, ReadBounds):
            if isinstance(action.token, tuple):  # ("head", namespace): _poll_heads
                self._head_reading.discard(action.token[1])
                self._report_head(action.token[1], result[1])
            else:
                self._opened(action.token, *result)
        elif isinstance(action, ReadRange):
            self._procured(action, result)

    # -- control plane ---------------------------------------------------------------------
    def handle_notification(
        self, caller: Principal, notes: list[EventNotification], now: int
    ) -> int:
        accepted = 0
        for n in notes:
            if caller != self.orchestrator or n.namespace != sysmsg.publisher_sys(self.principal):
                continue
            for key, payload in sysmsg.entries(n.data):
                self._apply(key, payload, now)
            accepted += 1
        return accepted

    def _apply(self, key: str, payload: Any, now: int) -> None:
        if key == sysmsg.PUBLISHER_BROADCASTER_ADD:
            for pid, bc in sysmsg.read_pairs(payload, key, "Nat"):
                self.broadcasters[pid] = bc
        elif key == sysmsg.PUBLISHER_REPLAY_ADD:
            for a in sysmsg.read_publisher_replay_add(payload):
                self._add_replay(a, now)
        elif key == sysmsg.PUBLISHER_REPLAY_REMOVE:
            for rid in sysmsg.read_ids(payload, key):
                if rid not in self.replays:
                    # its bounds are being read, or its add is still to come (the add was lost
                    # and the orchestrator sends it again): it ends canceled(0) when it opens
                    self._removed_early.add(rid)
                r = self.replays.get(rid)
                if r is not None and not r.done:
                    # stop enqueuing; report canceled(n) once the calls in flight are answered
                    r.canceled = True
                    r.retry.clear()
                    if r.inflight == 0:
                        self._finish(r, ReplayState("canceled", r.sent))
        else:
            raise sysmsg.SysMessageError(f"unknown publisher system key {key!r}")

    def _add_replay(self, a: sysmsg.PublisherReplayAdd, now: int) -> None:
        old = self.replays.get(a.replay_id)
        if old is not None:
            # The same add delivered twice (an orchestrator resends open replays' adds after a
            # restart): report the final state again if it is known — the first report may
            # have been lost with the orchestrator.
            if old.final is not None:
                self.outbox.append(
                    Call(
                        self.orchestrator,
                        "icrc77_replay_status",
                        [ReplayStatusUpdate(old.id, old.final)],
                    )
                )
            return
        if a.replay_id not in self._opening:
            self._opening.add(a.replay_id)
            self.outbox.append(ReadBounds(a.namespace, token=a))

    def _opened(self, a: sysmsg.PublisherReplayAdd, first: int, head: int) -> None:
        """The namespace's bounds are known: the replay can start."""
        self._opening.discard(a.replay_id)
        if a.replay_id in self.replays:
            return
        end = head if a.end is None else min(a.end, head)
        if a.end is None and a.priced_end is not None:
            end = min(end, a.priced_end)  # what the subscriber paid for and the cap allowed
        first = first if head else 0
        r = ActiveReplay(
            a.replay_id,
            a.namespace,
            a.start,
            max(end, a.start),
            a.end is None,
            a.broadcaster,
            max(a.start, first),
        )
        self.replays[r.id] = r
        if r.id in self._removed_early:
            self._removed_early.discard(r.id)
            self._finish(r, ReplayState("canceled", 0))
        elif a.start < first:
            self._finish(r, ReplayState("errored", f"events before {first} are no longer kept"))
        elif (a.end is not None and a.end > head) or a.start > head:
            # ICRC-77 validates range bounds (ImproperConfig: "invalid range"). Only the
            # Publisher knows its stream's end (events may be imported past the head the
            # orchestrator was told), so a range past it ends here rather than completing with
            # fewer or no events. An open range starting at the end has nothing missed: it
            # completes with 0.
            have = f"its events are {first}..{head - 1}" if head else "it has no events"
            shown = "null" if a.end is None else a.end
            self._finish(
                r,
                ReplayState(
                    "errored",
                    f"ImproperConfig: range [{a.start}, {shown}) is past the end of "
                    f"{a.namespace}: {have}",
                ),
            )

    def _finish(self, r: ActiveReplay, state: ReplayState) -> None:
        r.done = True
        r.final = state
        self.outbox.append(
            Call(self.orchestrator, "icrc77_replay_status", [ReplayStatusUpdate(r.id, state)])
        )

    # -- procurement -------------------------------------------------------------------------
    def pump(self, now: int) -> bool:
        """Queue the next publish calls of every active replay, within back-pressure limits,
        and registrations whose retry is due."""
        again = self.resender.due(now)
        self.outbox.extend(again)
        queued = self._poll_heads(now) or bool(again)
        queued = self._pump_live(now) or queued
        for ns, st in self.registrations.items():
            if st.state == "retrying" and st.retry_at is not None and st.retry_at <= now:
                self._send_registration(ns, now)
                queued = True
        for r in list(self.replays.values()):
            if r.done:
                continue
            if r.canceled:
                if r.inflight == 0:
                    self._finish(r, ReplayState("canceled", r.sent))
                    queued = True
                continue
            if not r.started:
                r.started = True
                self.outbox.append(
                    Call(
                        self.orchestrator,
                        "icrc77_replay_status",
                        [ReplayStatusUpdate(r.id, RUNNING)],
                    )
                )
                queued = True
            while r.inflight < self.max_inflight and (r.retry or r.cursor < r.end):
                if self.replay_rate is not None and now < r.next_at:
                    break  # paced: the adapter pumps again later
                if r.retry and now < r.retry_at:
                    # the broadcaster answered Busy: sent again after the back-off (at once,
                    # each Busy was another round trip, publisher and broadcaster spinning as
                    # long as the subscriber confirmed nothing)
                    break
                if r.retry:
                    n = min(len(r.retry), self.batch_size)
                    events = [r.retry.popleft() for _ in range(n)]
                    for chunk in by_size(events, self.max_message_bytes):
                        r.inflight += 1
                        self.outbox.append(
                            Call(r.broadcaster, "icrc72_publish", chunk, token=("replay", r.id))
                        )
                else:  # procure: read, then publish what was read (:meth:`_procured`)
                    stop = min(r.end, r.cursor + self.batch_size)
                    n = stop - r.cursor
                    r.inflight += 1
                    self.outbox.append(ReadRange(r.namespace, r.cursor, n, token=(r.id, stop)))
                    r.cursor = stop
                if self.replay_rate is not None:  # this batch's slot: the next one waits for it
                    r.next_at = max(r.next_at, now) + int(n * 1e9 / self.replay_rate)
                queued = True
            if r.inflight == 0 and not r.retry and r.cursor >= r.end:
                self._finish(r, ReplayState("completed", r.sent))
                queued = True
        return queued

    def _procured(self, a: ReadRange, messages: list[StreamMessage]) -> None:
        rid, stop = a.token
        r = self.replays.get(rid)
        if r is None:
            return
        if r.done or r.canceled:
            r.inflight -= 1  # read before the cancel: nothing more is enqueued
            return
        msgs = [m for m in messages if m.index < stop]
        if not msgs or msgs[0].index != a.start or len(msgs) != stop - a.start:
            # the cursor is past this batch already: what the read did not return would be
            # skipped without a word (retention removed the range's head while the replay ran)
            r.inflight -= 1
            self._finish(r, ReplayState("errored", _unread(a.start, stop, messages)))
            return
        try:
            events = procure_batch(msgs, r.namespace, r.id, self.principal, r.open_ended, r.end - 1)
        except DecodeError as e:  # not an event this publisher stored: the replay cannot go on
            r.inflight -= 1
            self._finish(r, ReplayState("errored", f"unreadable stored event: {e}"))
            return
        if not events:
            r.inflight -= 1
            return
        # the read's place in flight becomes the publish call's (one more per extra call)
        if isinstance(events, EventBatch):
            data = sum(len(m.data) for m in msgs) - len(msgs) * (9 + _PLEN)
            if data + EVENT_OVERHEAD * len(msgs) <= self.max_message_bytes:
                chunks: list[Any] = [events]
            else:
                chunks = by_size(list(events), self.max_message_bytes)
        else:
            chunks = by_size(events, self.max_message_bytes)
        r.inflight += len(chunks) - 1
        for chunk in chunks:
            self.outbox.append(Call(r.broadcaster, "icrc72_publish", chunk, token=("replay", r.id)))

    def _replied(self, r: ActiveReplay, call: Call, reply: Any) -> bool:
        """A publish call's results one by one; False: the replay errored. Events the reply
        has no result for (a reply shorter than the call) are sent again, as ``Busy`` ones and
        as the live path does. Found from outside: they were neither counted nor sent again,
        so the replay ended short."""
        for e, res in zip(call.arg, reply, strict=False):
            if isinstance(res, Ok):
                r.sent += 1
            elif isinstance(res, Err) and res.tag == "Busy":
                r.retry.append(e)
            else:
                self._finish(r, ReplayState("errored", f"broadcaster refused event: {res}"))
                return False
        r.retry.extend(call.arg[len(reply) :])
        return True

    def busy(self) -> bool:
        return any(not r.done for r in self.replays.values())

    def on_reply(self, call: Call, reply: Any, now: int) -> None:
        if call.method == "icrc77_replay_status" or (call.token and call.token[0] == "head"):
            # a lost report would leave the replay running (or pending) at the orchestrator,
            # or its head behind the stream's
            if isinstance(reply, BaseException):
                self.resender.failed(call, now, reply)
            else:
                self.resender.succeeded(call)
            return
        if call.token and call.token[0] == "register":
            self._registered(call.token[1], reply, now)
            return
        if call.token and call.token[0] == "live":
            self._live_replied(call, reply, now)
            return
        if call.method != "icrc72_publish" or not call.token or call.token[0] != "replay":
            return
        r = self.replays.get(call.token[1])
        if r is None:
            return
        r.inflight -= 1
        if r.done:
            return
        if isinstance(reply, BaseException):
            self._finish(r, ReplayState("errored", f"publish failed: {reply}"))
            return
        held, sent = len(r.retry), r.sent
        if isinstance(reply, PublishResults):  # Ok… then Busy…: no result object each
            ok = min(reply.delivered, len(call.arg))
            r.sent += ok
            # Busy, or no result (a reply shorter than the call): resend those (a lazy batch
            # builds its events now)
            r.retry.extend(call.arg[ok:])
        elif not self._replied(r, call, reply):
            return
        if len(r.retry) > held and r.sent == sent:
            # nothing taken, all Busy: back off (pump), doubling while it lasts
            r.retry_at = now + r.retry_delay
            r.retry_delay = min(r.retry_delay * 2, live.CAP_NS)
        elif r.sent > sent:  # some taken: the window moves, the rest go at once
            r.retry_at, r.retry_delay = now, live.FIRST_NS
        if r.sent - r.reported >= self.progress_every and not r.canceled:
            r.reported = r.sent
            self.outbox.append(
                Call(
                    self.orchestrator,
                    "icrc72_update_publication",
                    [(r.namespace, PROGRESS_KEY, {"Array": [{"Nat": r.id}, {"Nat": r.sent}]})],
                    ordered=False,  # a report: the next publish calls need not wait for it
                )
            )
