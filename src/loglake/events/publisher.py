"""The ICRC-72 Publisher with ICRC-77 procurement and republishing (sans-I/O).

A namespace is a loglake stream and an event id is its index (DESIGN.md "events"); the
Publisher owns that history — ICRC-77 "assigns archival responsibility to Publishers". Live
events are appended to the stream, then sent with ``icrc72_publish`` to the Broadcaster the
orchestrator assigned (``icrc72:publisher:broadcaster:add``, candidate "Publisher Life Cycle").

ICRC-77 step 5: on ``icrc77:publisher:replay:add`` the Publisher procures ``[start, end)`` from
the log with ``Log.iter_records`` (segments and lake alike once the storage engine seals
history) and republishes each event through ``icrc72_publish`` with the replay headers appended
(never overwriting the stored ones):

- ``icrc77:replay:id = #Nat(replayId)`` on every replayed event;
- ``icrc77:replay:end_id = #Nat(last id)`` on every replayed event of a request that had no end.
  The ICRC-77 text names this header twice: ``icrc77:replay:end`` in a comment on
  ``ReplayRegistration`` and ``icrc77:replay:end_id`` in the normative "Published Event Headers"
  list. We emit ``end_id`` (the list is the normative part, and the name says what the value is)
  and our subscriber accepts both. We put it on every event of the replay rather than only the
  first, so a subscriber whose filter drops the first event still learns the end.

An open-ended request's end is the stream's head when procurement starts. Step 7: status goes
to the orchestrator with ``icrc77_replay_status`` (``running`` when procurement starts,
``completed(n)`` / ``canceled(n)`` / ``errored(text)`` at the end, ``n`` = events republished
and accepted by the Broadcaster). Back-pressure: at most ``max_inflight`` publish calls per
replay are outstanding; events the Broadcaster answers ``Busy`` are sent again later.

Stored form: record ``data`` = the Candid encoding of the ICRC-16 ``data`` value
(``icrc16.encode``), record header ``icrc72:headers`` = the Candid ``ICRC16Map`` of the event's
headers, record timestamp = event timestamp. Replay republishes the stored value bytes without
decoding them (``icrc16.RawValue``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from icp_principal import Principal

from loglake.events import sysmsg
from loglake.events.messages import (
    H_REPLAY_END_ID,
    H_REPLAY_ID,
    RUNNING,
    Err,
    Event,
    EventNotification,
    ICRC16Map,
    Ok,
    Registration,
    ReplayState,
    ReplayStatusUpdate,
)
from loglake.events.orchestrator import HEAD_KEY, PROGRESS_KEY
from loglake.events.role import Call, Role
from loglake.log.api import Entry, Log, Record
from loglake.wire import icrc16
from loglake.wire.icrc16 import RawValue, Value

HEADERS_KEY = "icrc72:headers"


def stored_entry(data: Value, headers: ICRC16Map | None, timestamp: int) -> Entry:
    hdrs = ((HEADERS_KEY, icrc16.encode_map(headers)),) if headers else ()
    return Entry(icrc16.encode(data), headers=hdrs, timestamp_ns=timestamp)


def event_of(
    rec: Record, source: Principal, extra: ICRC16Map | None = None, raw: bool = True
) -> Event:
    """A stored record as an ICRC-72 Event; ``extra`` headers are appended."""
    data: Any = RawValue.from_message(rec.data) if raw else None
    if data is None:
        data = icrc16.decode(rec.data)
    headers: ICRC16Map | None = None
    for k, v in rec.headers:
        if k == HEADERS_KEY:
            headers = icrc16.decode_map(v)
    if extra:
        headers = [*(headers or []), *extra]
    return Event(
        rec.index,
        rec.index - 1 if rec.index else None,
        rec.timestamp_ns,
        rec.stream,
        data,
        source,
        headers,
    )


def procure(
    log: Log,
    namespace: str,
    start: int,
    end: int,
    replay_id: int,
    source: Principal,
    open_ended: bool,
    batch: int = 1000,
    last_id: int | None = None,
) -> Iterator[Event]:
    """ICRC-77 step 5: the events ``[start, end)`` of ``namespace`` with the replay headers.

    ``last_id`` is the replay's last event id (for ``end_id``) when ``end`` only bounds one
    batch of it; it defaults to ``end - 1``."""
    extra: ICRC16Map = [(H_REPLAY_ID, {"Nat": replay_id})]
    if open_ended:
        extra.append((H_REPLAY_END_ID, {"Nat": end - 1 if last_id is None else last_id}))
    prefix, plen = icrc16.MESSAGE_PREFIX, len(icrc16.MESSAGE_PREFIX)
    for rec in log.iter_records(namespace, 0, start, end, batch=batch):
        if rec.headers or not rec.data.startswith(prefix):
            yield event_of(rec, source, extra)
            continue
        # the common case inlined: stored by icrc16.encode, no stored headers; `extra` is
        # shared by the events of a batch and never mutated
        i = rec.index
        yield Event(
            i,
            i - 1 if i else None,
            rec.timestamp_ns,
            namespace,
            RawValue(rec.data[plen:]),
            source,
            extra,
        )


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


class Publisher(Role):
    def __init__(
        self,
        principal: Principal,
        orchestrator: Principal,
        log: Log,
        batch_size: int = 500,
        max_inflight: int = 4,
        progress_every: int = 5000,
    ) -> None:
        super().__init__(principal)
        self.progress_every = progress_every
        self.orchestrator = orchestrator
        self.log = log
        self.batch_size = batch_size
        self.max_inflight = max_inflight
        self.broadcasters: dict[int, Principal] = {}
        self.publication_ids: dict[str, int] = {}
        self.replays: dict[int, ActiveReplay] = {}
        self.registration_results: dict[str, Any] = {}
        self.methods = {"icrc72_handle_notification": self.handle_notification}

    # -- ICRC-72 publishing ------------------------------------------------------------------
    def register(self, namespace: str, config: ICRC16Map) -> None:
        """Queue ``icrc72_register_publication``; the reply gives the publication id."""
        self.outbox.append(
            Call(
                self.orchestrator,
                "icrc72_register_publication",
                [Registration(namespace, config)],
                token=("register", namespace),
            )
        )

    def broadcaster_for(self, namespace: str) -> Principal | None:
        pid = self.publication_ids.get(namespace)
        return None if pid is None else self.broadcasters.get(pid)

    def publish(
        self, namespace: str, items: list[tuple[Value, ICRC16Map | None]], now: int
    ) -> list[int]:
        """Append events to the namespace's stream and send them to its broadcaster."""
        self.log.create_stream(namespace)
        entries = [stored_entry(d, h, now) for d, h in items]
        ids = self.log.append_many(namespace, 0, entries)
        bc = self.broadcaster_for(namespace)
        if bc is not None:
            events = [
                Event(
                    i,
                    i - 1 if i else None,
                    now,
                    namespace,
                    RawValue(e.data[len(icrc16.MESSAGE_PREFIX) :]),
                    self.principal,
                    h,
                )
                for i, e, (_, h) in zip(ids, entries, items, strict=True)
            ]
            self.outbox.append(Call(bc, "icrc72_publish", events, token=("live", namespace)))
        head = ids[-1] + 1 if ids else self.log.next_index(namespace)
        self.outbox.append(
            Call(
                self.orchestrator,
                "icrc72_update_publication",
                [(namespace, HEAD_KEY, {"Nat": head})],
            )
        )
        return ids

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
        head = self.log.next_index(a.namespace) if self.log.has_stream(a.namespace) else 0
        end = head if a.end is None else min(a.end, head)
        first = self.log.stream_info(a.namespace).partitions[0].first_index if head else 0
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
        if a.start < first:
            self._finish(r, ReplayState("errored", f"events before {first} are no longer kept"))

    def _finish(self, r: ActiveReplay, state: ReplayState) -> None:
        r.done = True
        r.final = state
        self.outbox.append(
            Call(self.orchestrator, "icrc77_replay_status", [ReplayStatusUpdate(r.id, state)])
        )

    # -- procurement -------------------------------------------------------------------------
    def pump(self, now: int) -> bool:
        """Queue the next publish calls of every active replay, within back-pressure limits."""
        queued = False
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
                if r.retry:
                    n = min(len(r.retry), self.batch_size)
                    events = [r.retry.popleft() for _ in range(n)]
                else:
                    stop = min(r.end, r.cursor + self.batch_size)
                    events = list(
                        procure(
                            self.log,
                            r.namespace,
                            r.cursor,
                            stop,
                            r.id,
                            self.principal,
                            r.open_ended,
                            self.batch_size,
                            r.end - 1,
                        )
                    )
                    r.cursor = stop
                if events:
                    r.inflight += 1
                    self.outbox.append(
                        Call(r.broadcaster, "icrc72_publish", events, token=("replay", r.id))
                    )
                    queued = True
            if r.inflight == 0 and not r.retry and r.cursor >= r.end:
                self._finish(r, ReplayState("completed", r.sent))
                queued = True
        return queued

    def busy(self) -> bool:
        return any(not r.done for r in self.replays.values())

    def on_reply(self, call: Call, reply: Any, now: int) -> None:
        if call.token and call.token[0] == "register" and isinstance(reply, list):
            if reply and isinstance(reply[0], Ok):
                self.publication_ids[call.token[1]] = reply[0].value
            self.registration_results[call.token[1]] = reply[0] if reply else None
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
        for e, res in zip(call.arg, reply, strict=False):
            if isinstance(res, Ok):
                r.sent += 1
            elif isinstance(res, Err) and res.tag == "Busy":
                r.retry.append(e)
            else:
                self._finish(r, ReplayState("errored", f"broadcaster refused event: {res}"))
                return
        if r.sent - r.reported >= self.progress_every and not r.canceled:
            r.reported = r.sent
            self.outbox.append(
                Call(
                    self.orchestrator,
                    "icrc72_update_publication",
                    [(r.namespace, PROGRESS_KEY, {"Array": [{"Nat": r.id}, {"Nat": r.sent}]})],
                )
            )
