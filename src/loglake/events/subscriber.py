"""The ICRC-72 Subscriber, replay-aware (sans-I/O).

- Accepts notifications on a namespace only from the Broadcaster the orchestrator assigned to
  it (``icrc72:subscriber:broadcaster:add`` on ``icrc72:subscriber:sys:<principal>``) — the
  candidate's "valid broadcasters" rule.
- Deduplicates by ``(namespace, eventId)``: ICRC-77 "Security Considerations" — replay creates
  new notification ids, so the event id is the identity. A duplicate is confirmed but not
  delivered again.
- Confirms every notification it accepted with ``icrc72_confirm_notifications`` (ICRC-77
  "Compatibility": replayed notifications require normal confirmation).
- Follows replays through the headers: ``icrc77:replay:id`` and the end header, read under both
  names the ICRC-77 text uses (``icrc77:replay:end_id`` and ``icrc77:replay:end``).

Delivered events are kept in ``inbox`` (bounded by ``keep``) for the application to take.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from icp_principal import Principal

from loglake.events import sysmsg
from loglake.events.messages import H_REPLAY_END, H_REPLAY_END_ID, H_REPLAY_ID, EventNotification
from loglake.events.role import Call, Role
from loglake.wire.icrc16 import map_get


@dataclass
class ReplayProgress:
    replay_id: int
    received: int = 0
    last_event_id: int | None = None
    end_id: int | None = None
    broadcaster: Principal | None = None
    removed: bool = False

    @property
    def reached_end(self) -> bool:
        return self.end_id is not None and self.last_event_id == self.end_id


class Subscriber(Role):
    def __init__(self, principal: Principal, orchestrator: Principal, keep: int = 2_000_000):
        super().__init__(principal)
        self.orchestrator = orchestrator
        self.valid: dict[str, set[bytes]] = {}
        self.seen: set[tuple[str, int]] = set()
        self.inbox: deque[EventNotification] = deque(maxlen=keep)
        self.replays: dict[int, ReplayProgress] = {}
        self.duplicates = 0
        self.rejected = 0
        self.methods = {"icrc72_handle_notification": self.handle_notification}

    def handle_notification(
        self, caller: Principal, notes: list[EventNotification], now: int
    ) -> int:
        accepted, confirm = 0, []
        my_sys = sysmsg.subscriber_sys(self.principal)
        for n in notes:
            if n.namespace == my_sys:
                if caller == self.orchestrator or any(
                    caller.bytes in v for v in self.valid.values()
                ):
                    for key, payload in sysmsg.entries(n.data):
                        self._apply(caller, key, payload)
                    accepted += 1
                else:
                    self.rejected += 1
                continue
            if caller.bytes not in self.valid.get(n.namespace, ()):
                self.rejected += 1
                continue
            accepted += 1
            confirm.append(n.notification_id)
            self._track_replay(n, caller)
            ident = (n.namespace, n.event_id)
            if ident in self.seen:
                self.duplicates += 1
                continue
            self.seen.add(ident)
            self.inbox.append(n)
        if confirm:
            self.outbox.append(Call(caller, "icrc72_confirm_notifications", confirm))
        return accepted

    def _track_replay(self, n: EventNotification, caller: Principal) -> None:
        rid = map_get(n.headers, H_REPLAY_ID)
        if rid is None or "Nat" not in rid:
            return
        p = self.replays.setdefault(rid["Nat"], ReplayProgress(rid["Nat"], broadcaster=caller))
        p.received += 1
        p.last_event_id = n.event_id
        end = map_get(n.headers, H_REPLAY_END_ID) or map_get(n.headers, H_REPLAY_END)
        if end is not None and "Nat" in end:
            p.end_id = end["Nat"]

    def _apply(self, caller: Principal, key: str, payload: Any) -> None:
        if key == sysmsg.SUBSCRIBER_BROADCASTER_ADD and caller == self.orchestrator:
            for ns, bc in sysmsg.read_pairs(payload, key, "Text"):
                self.valid.setdefault(ns, set()).add(bc.bytes)
        elif key == sysmsg.SUBSCRIBER_REPLAY_ADD:
            for rid, bc in sysmsg.read_pairs(payload, key, "Nat"):
                self.replays.setdefault(rid, ReplayProgress(rid, broadcaster=bc))
        elif key == sysmsg.SUBSCRIBER_REPLAY_REMOVE:
            for rid in sysmsg.read_nested_ids(payload, key):
                self.replays.setdefault(rid, ReplayProgress(rid)).removed = True

    def take(self, n: int | None = None) -> list[EventNotification]:
        out: list[EventNotification] = []
        while self.inbox and (n is None or len(out) < n):
            out.append(self.inbox.popleft())
        return out
