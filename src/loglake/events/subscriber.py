"""The ICRC-72 Subscriber, replay-aware (sans-I/O).

- Accepts notifications on a namespace only from the Broadcaster the orchestrator assigned to
  it (``icrc72:subscriber:broadcaster:add`` on ``icrc72:subscriber:sys:<principal>``) — the
  candidate's "valid broadcasters" rule.
- Deduplicates by ``(namespace, eventId)``: ICRC-77 "Security Considerations" — replay creates
  new notification ids, so the event id is the identity. A duplicate is confirmed but not
  delivered again. The ids delivered are kept as runs of stream indexes (``DeliveredIds``),
  bounded however long the namespace lives.
- Confirms every notification it accepted with ``icrc72_confirm_notifications`` (ICRC-77
  "Compatibility": replayed notifications require normal confirmation). A confirmation whose
  call failed is sent again with back-off (``resend.Resender``): lost, it left the
  notifications in the Broadcaster's window for good, and a subscriber whose window fills is
  first a brake on its namespace's live events, then left out of them (``broadcaster``). A
  repeated confirmation is harmless: ids already confirmed are answered ``NotFound``.
- Follows replays through the headers: ``icrc77:replay:id`` and the end header, read under both
  names the ICRC-77 text uses (``icrc77:replay:end_id`` and ``icrc77:replay:end``).

Delivered events are kept in ``inbox`` (bounded by ``keep``) for the application to take.
Each is numbered as it is delivered (:attr:`Subscriber.inbox_seq`), so a reader across a
connection can read without removing (:meth:`Subscriber.peek`) and remove only what it says it
has (:meth:`Subscriber.acknowledge`): a reply lost on its way loses nothing.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice, repeat
from typing import Any

from icp_principal import Principal

from loglake.errors import LoglakeError
from loglake.events import sysmsg
from loglake.events.fastcodec import NotificationBatch
from loglake.events.messages import H_REPLAY_END, H_REPLAY_END_ID, H_REPLAY_ID, EventNotification
from loglake.events.resend import Resender
from loglake.events.role import Call, Role, check_positive
from loglake.wire.icrc16 import map_get

INBOX_KEEP = 2_000_000
"""Delivered notifications a subscriber keeps by default (``keep``): past it the oldest goes, so
no reader takes more at once (``events received --take``)."""


SEEN_RECENT = 65_536
"""Event ids a namespace's :class:`DeliveredIds` keeps one by one before folding them into runs."""
SEEN_RUNS = 65_536
"""Runs of delivered ids a namespace keeps at most; past it the lowest are forgotten."""


class DeliveredIds:
    """The event ids delivered in one namespace, in bounded memory: the latest ids one by one
    (``recent``, a set, as the hot path wants), folded every :data:`SEEN_RECENT` into sorted
    runs ``[start, end)`` of consecutive ids. Event ids are stream indexes, so what a subscriber
    receives live or by replay is a few runs, however many events: it was a set of every id
    ever delivered (+227 MiB after 3 million events with the inbox empty).

    Exact while at most :data:`SEEN_RUNS` runs are held (that many gaps in what was delivered);
    past it the lowest runs are forgotten, and an event among them that comes again (a replay
    of that old history) is delivered again rather than suppressed: never an event lost."""

    __slots__ = ("ends", "recent", "starts")

    def __init__(self) -> None:
        self.recent: set[int] = set()
        self.starts: list[int] = []
        self.ends: list[int] = []

    def _in_runs(self, eid: int) -> bool:
        i = bisect_right(self.starts, eid) - 1
        return i >= 0 and eid < self.ends[i]

    def __contains__(self, eid: object) -> bool:
        if eid in self.recent:
            return True
        ends = self.ends  # (above every run: a live event, the usual case)
        return bool(ends) and type(eid) is int and eid < ends[-1] and self._in_runs(eid)

    def __len__(self) -> int:
        """Ids held (the runs' ids counted)."""
        runs = sum(e - s for s, e in zip(self.starts, self.ends, strict=True))
        return runs + sum(1 for x in self.recent if not self._in_runs(x))

    def __iter__(self) -> Iterator[int]:
        for s, e in zip(self.starts, self.ends, strict=True):
            yield from range(s, e)
        yield from sorted(x for x in self.recent if not self._in_runs(x))

    def unseen(self, ids: set[int]) -> set[int]:
        """The ids of ``ids`` not delivered (a new set), by set and range operations."""
        out = ids - self.recent
        starts, ends = self.starts, self.ends
        if not out or not starts:
            return out
        lo, hi = min(out), max(out)
        i = max(bisect_right(starts, lo) - 1, 0)
        while i < len(starts) and starts[i] <= hi:
            s, e = max(starts[i], lo), min(ends[i], hi + 1)
            if e - s > len(out):  # a long run: test the ids against it
                out = {x for x in out if not s <= x < e}
            elif s < e:
                out.difference_update(range(s, e))
            i += 1
        return out

    def isdisjoint(self, ids: set[int]) -> bool:
        if not self.recent.isdisjoint(ids):
            return False
        if not ids or not self.starts:
            return True
        i = bisect_right(self.starts, max(ids)) - 1  # the last run starting at or before it
        if i < 0 or self.ends[i] <= min(ids):  # (runs before it end before it starts)
            return True
        return len(self.unseen(ids)) == len(ids)

    def add(self, eid: int) -> None:
        self.recent.add(eid)
        if len(self.recent) > SEEN_RECENT:
            self._fold()

    def __ior__(self, ids: Iterable[int]) -> DeliveredIds:
        self.recent.update(ids)
        if len(self.recent) > SEEN_RECENT:
            self._fold()
        return self

    def _fold(self) -> None:
        """``recent`` merged into the runs; the lowest runs past :data:`SEEN_RUNS` forgotten."""
        new_s: list[int] = []
        new_e: list[int] = []
        for x in sorted(self.recent):  # the new ids as runs
            if new_e and x == new_e[-1]:
                new_e[-1] = x + 1
            else:
                new_s.append(x)
                new_e.append(x + 1)
        old_s, old_e = self.starts, self.ends
        starts: list[int] = []
        ends: list[int] = []
        i = j = 0
        while i < len(old_s) or j < len(new_s):  # both merged, in order, touching runs joined
            if j == len(new_s) or (i < len(old_s) and old_s[i] <= new_s[j]):
                s, e = old_s[i], old_e[i]
                i += 1
            else:
                s, e = new_s[j], new_e[j]
                j += 1
            if ends and s <= ends[-1]:
                if e > ends[-1]:
                    ends[-1] = e
            else:
                starts.append(s)
                ends.append(e)
        if len(starts) > SEEN_RUNS:
            del starts[: len(starts) - SEEN_RUNS], ends[: len(ends) - SEEN_RUNS]
        self.starts, self.ends = starts, ends
        self.recent = set()


class InboxCursorError(LoglakeError):
    """An acknowledgement of notifications the inbox never numbered (a cursor from another
    subscriber, or made up): nothing is removed."""


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
    def __init__(self, principal: Principal, orchestrator: Principal, keep: int = INBOX_KEEP):
        super().__init__(principal)
        check_positive(keep=keep)
        self.orchestrator = orchestrator
        self.valid: dict[str, set[bytes]] = {}
        self.seen: dict[str, DeliveredIds] = {}
        """Event ids delivered, by namespace (:class:`DeliveredIds`: bounded, plain ints, not a
        ``(namespace, id)`` tuple per event — a replay of 200,000 events made as many tuples
        for the cyclic garbage collector to count and scan)."""
        self.inbox: deque[Any] = deque(maxlen=keep)
        """Delivered notifications, oldest first: an ``EventNotification``, or ``(batch, k)`` —
        the ``k``-th of a :class:`NotificationBatch` not built yet (:meth:`peek` builds it)."""
        self.inbox_seq = 0
        """Notifications ever put in :attr:`inbox`: the number the next one gets. The oldest
        held is :attr:`inbox_first`; those ``keep`` pushed out are counted all the same."""
        self.replays: dict[int, ReplayProgress] = {}
        self.duplicates = 0
        self.rejected = 0
        self.resender = Resender()
        """Confirmations whose call failed, sent again (module docstring)."""
        self.methods = {"icrc72_handle_notification": self.handle_notification}

    def on_reply(self, call: Call, reply: Any, now: int) -> None:
        if call.method != "icrc72_confirm_notifications":
            return
        if isinstance(reply, BaseException):
            self.resender.failed(call, now, reply)
        else:
            self.resender.succeeded(call)

    def pump(self, now: int) -> bool:
        again = self.resender.due(now)
        self.outbox.extend(again)
        return bool(again)

    def handle_notification(
        self, caller: Principal, notes: list[EventNotification], now: int
    ) -> int:
        my_sys = sysmsg.subscriber_sys(self.principal)
        if type(notes) is NotificationBatch and notes.namespace != my_sys:
            return self._handle_batch(caller, notes)
        accepted, delivered, confirm = 0, 0, []
        key = caller.bytes
        valid = self.valid
        inbox = self.inbox
        sys_ok: bool | None = None  # whether the caller may send on my_sys (found once a call)
        replay: dict[int, ReplayProgress | None] = {}  # by id() of a headers list: its replay
        keep = []  # header lists stay alive while their id() is a key of `replay`
        for n in notes:
            ns = n.namespace
            if ns == my_sys:
                if sys_ok is None:
                    # the orchestrator, or a broadcaster of any of our namespaces. Once a call:
                    # looked for in every namespace each notification, a stranger's 60,000 on
                    # our system namespace held the event loop 9 s over 1,000 namespaces. (Only
                    # the orchestrator changes ``valid``, and it passes without looking.)
                    sys_ok = caller == self.orchestrator or any(key in v for v in valid.values())
                if sys_ok:
                    for k, payload in sysmsg.entries(n.data):
                        self._apply(caller, k, payload)
                    accepted += 1
                else:
                    self.rejected += 1
                continue
            if key not in valid.get(ns, ()):
                self.rejected += 1
                continue
            accepted += 1
            confirm.append(n.notification_id)
            # a batch's notifications share their headers list: its replay is looked up once
            hid = id(n.headers)
            if hid in replay:
                p = replay[hid]
            else:
                keep.append(n.headers)
                p = replay[hid] = self._replay_of(n.headers, caller)
            if p is not None:
                p.received += 1
                p.last_event_id = n.event_id
            ids = self._delivered(ns)
            if n.event_id in ids:
                self.duplicates += 1
                continue
            ids.add(n.event_id)
            inbox.append(n)
            delivered += 1
        self.inbox_seq += delivered
        if confirm:
            self.outbox.append(Call(caller, "icrc72_confirm_notifications", confirm))
        return accepted

    def _handle_batch(self, caller: Principal, notes: NotificationBatch) -> int:
        """A batch sharing headers and namespace (a Broadcaster's): checked, followed and
        confirmed once, deduplicated by event id; no notification is built until it is taken
        from the inbox. Same outcome as one by one."""
        ns, n = notes.namespace, len(notes)
        if caller.bytes not in self.valid.get(ns, ()):
            self.rejected += n
            return 0
        p = self._replay_of(notes.headers, caller)
        if p is not None:
            p.received += n
            p.last_event_id = notes.event_ids[-1]
        inbox, eids = self.inbox, notes.event_ids
        ids = self._delivered(ns)
        fresh = set(eids)
        if len(fresh) == n and ids.isdisjoint(fresh):  # the usual case: all new, no repeat
            ids |= fresh
            inbox.extend(zip(repeat(notes), range(n), strict=False))
            self.inbox_seq += n
        else:
            unseen = ids.unseen(fresh)
            for k, eid in enumerate(eids):
                if eid not in unseen:
                    self.duplicates += 1
                    continue
                unseen.discard(eid)  # (a repeat in the batch is a duplicate)
                ids.add(eid)
                inbox.append((notes, k))
                self.inbox_seq += 1
        self.outbox.append(
            Call(caller, "icrc72_confirm_notifications", list(notes.notification_ids))
        )
        return n

    def _delivered(self, ns: str) -> DeliveredIds:
        """The ids delivered in ``ns`` (:attr:`seen`'s, made on first use)."""
        ids = self.seen.get(ns)
        if ids is None:
            ids = self.seen[ns] = DeliveredIds()
        return ids

    def _replay_of(self, headers: Any, caller: Principal) -> ReplayProgress | None:
        """The replay a notification with these headers belongs to (None: not a replay's);
        its end id taken from the headers when they carry one."""
        rid = map_get(headers, H_REPLAY_ID)
        if rid is None or "Nat" not in rid:
            return None
        p = self.replays.get(rid["Nat"])
        if p is None:
            p = self.replays[rid["Nat"]] = ReplayProgress(rid["Nat"], broadcaster=caller)
        end = map_get(headers, H_REPLAY_END_ID) or map_get(headers, H_REPLAY_END)
        if end is not None and "Nat" in end:
            p.end_id = end["Nat"]
        return p

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

    @property
    def inbox_first(self) -> int:
        """The number of the oldest notification in :attr:`inbox` (:attr:`inbox_seq` when it
        is empty)."""
        return self.inbox_seq - len(self.inbox)

    def peek(
        self,
        n: int | None = None,
        max_bytes: int | None = None,
        size: Callable[[EventNotification], int] | None = None,
    ) -> list[EventNotification]:
        """The oldest ``n`` notifications (all: None), left in the inbox. With ``max_bytes``,
        only as many as fit in it by ``size`` — at least one, so a notification larger than
        the budget still goes, alone; the first that does not fit stays for the next read.
        Why a budget: a reader's reply has a size cap, and notifications taken beyond it
        would be refused with the reply."""
        if (max_bytes is None) != (size is None):
            raise ValueError("max_bytes and size go together")
        out: list[EventNotification] = []
        total = 0
        for x in islice(self.inbox, n):
            note = x[0][x[1]] if type(x) is tuple else x
            if size is not None and max_bytes is not None:
                total += size(note)
                if out and total > max_bytes:
                    break
            out.append(note)
        return out

    def acknowledge(self, upto: int) -> int:
        """Remove the notifications numbered below ``upto`` (a reader has them); those already
        gone are not counted again. How many were removed. ``upto`` past :attr:`inbox_seq` is
        an :class:`InboxCursorError` and removes nothing."""
        if upto > self.inbox_seq:
            raise InboxCursorError(
                f"inbox cursor {upto} is past the {self.inbox_seq} notifications delivered"
            )
        k = max(0, upto - self.inbox_first)
        for _ in range(k):
            self.inbox.popleft()
        return k

    def take(
        self,
        n: int | None = None,
        max_bytes: int | None = None,
        size: Callable[[EventNotification], int] | None = None,
    ) -> list[EventNotification]:
        """:meth:`peek`, then remove what it returned (an in-process reader, which cannot lose
        a reply)."""
        out = self.peek(n, max_bytes, size)
        self.acknowledge(self.inbox_first + len(out))
        return out
