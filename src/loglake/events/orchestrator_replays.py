"""The Orchestrator's replay scheduling (ICRC-77 steps 4 and 7-8): system messages, jobs,
status, cancel and the replay queries.

What a replay's life needs after its registration was accepted: the add messages (broadcaster
first, then the publisher), a Spark job where the replay is large, the publisher's status reports,
a cancel's remove messages, resending after a restart or a failed call, and
``icrc77_get_replays`` with its cursors. Kept apart from registration (validation, quotas,
payment) because the events simulation's "every replay ends, nothing twice" rests here.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from icp_principal import Principal

from loglake.errors import LocalProtocolError
from loglake.events import sysmsg
from loglake.events.actions import (
    Call,
    CancelReplayJob,
    ReplayJobSpec,
    StartReplayJob,
)
from loglake.events.messages import (
    Err,
    GetReplays,
    Ok,
    OrchestrationFilter,
    ReplayState,
    ReplayStatus,
    ReplayStatusUpdate,
)
from loglake.events.orchestrator_state import (
    E_BATCH,
    E_NOT_ASSIGNED,
    E_NOT_FOUND,
    E_RATE,
    E_TRANSITION,
    OrchestratorState,
    Replay,
    _generic,
)
from loglake.wire.icrc16 import Value

DEFAULT_TAKE = 100
MAX_TAKE = 1000
"""``icrc77_get_replays`` answers at most this many a call; ``prev`` pages through the rest."""
MAX_FILTER_SLICES = 16
"""``icrc77_get_replays``: the most slices a filter may hold (:class:`FilterTooLarge` beyond).
A listed replay is in every slice: it has one subscriber, publisher and namespace and at most
two broadcasters, so a filter of more distinct slices lists nothing anyway."""
MAX_FILTER_STATISTICS = 64
"""``icrc77_get_replays``: the most statistics names a filter may ask for (a status carries
fewer than ten)."""
_CURSOR_TAG = b"loglake:replay:"
_OPAQUE = b"\x01"  # the IC's opaque-id principal class (its last byte)


class FilterTooLarge(LocalProtocolError):
    """An ``icrc77_get_replays`` filter with more slices than :data:`MAX_FILTER_SLICES` or
    statistics names than :data:`MAX_FILTER_STATISTICS` (the method's result has no error
    variant: an HTTP adapter answers it 400)."""


def _check_filter(flt: OrchestrationFilter | None) -> None:
    """:class:`FilterTooLarge` for a filter over the limits. ICRC-77 types ``filter : opt
    OrchestrationFilter`` and says nothing of its size; a filter of 20,000 slices, each
    checked against each listed replay (through a dict of four new lambdas a check), and as
    many statistics names, made a set of for each replay, held the event loop 8 s."""
    if flt is None:
        return
    n, k = len(flt.slices), len(flt.statistics_list)
    if n > MAX_FILTER_SLICES or k > MAX_FILTER_STATISTICS:
        raise FilterTooLarge(
            f"a replay filter holds at most {MAX_FILTER_SLICES} slices and "
            f"{MAX_FILTER_STATISTICS} statistics names; this one has {n} and {k}"
        )


def _slice_predicates(flt: OrchestrationFilter | None) -> list[Callable[[Replay], bool]]:
    """One test per distinct slice of ``flt`` (a replay is listed when it passes all), made
    once per call."""
    out: list[Callable[[Replay], bool]] = []
    for kind, v in () if flt is None else dict.fromkeys(flt.slices):
        out.append(_slice_test(kind, v))
    return out


def _slice_test(kind: str, v: Any) -> Callable[[Replay], bool]:
    if kind == "BySubscriber":
        return lambda rep: bool(rep.subscriber == v)
    if kind == "ByPublisher":
        return lambda rep: bool(rep.publisher == v)
    if kind == "ByBroadcaster":
        return lambda rep: v in (rep.broadcaster, rep.relay)
    if kind == "ByNamespace":
        return lambda rep: bool(rep.namespace == v)
    return lambda rep: False


class ReplayScheduling(OrchestratorState):
    """The life of an accepted replay (a part of
    :class:`~loglake.events.orchestrator.Orchestrator`)."""

    if TYPE_CHECKING:  # defined by the Orchestrator, with registration

        def _emit(self, target: Principal, namespace: str, data: Value, now: int) -> None: ...
        def _rate_ok(self, caller: Principal, now: int) -> bool: ...
        def _query_rate(self, caller: Principal, now: int) -> None: ...

    def _emit_replay_add(self, rep: Replay, now: int) -> None:
        caller, target = rep.subscriber, rep.broadcaster
        bc = rep.relay if rep.relay is not None else rep.broadcaster
        flt, skip = rep.filter, rep.skip
        ftext = flt.text if flt else None
        if target != bc:
            self._emit(
                caller,
                sysmsg.subscriber_sys(caller),
                sysmsg.subscriber_broadcaster_add([(rep.namespace, target)]),
                now,
            )
        add = sysmsg.BroadcasterReplayAdd(
            rep.id, rep.namespace, bc, caller, ftext, skip, rep.publisher
        )
        tsys = sysmsg.broadcaster_sys(target)
        self._emit(target, tsys, sysmsg.broadcaster_replay_add([add]), now)
        if target != bc:
            self._emit(
                target,
                tsys,
                sysmsg.broadcaster_relayer_add(sysmsg.RelayerAdd(rep.id, rep.namespace, bc)),
                now,
            )
            radd = sysmsg.RelayAdd(rep.id, rep.namespace, target, rep.publisher, ftext, skip)
            self._emit(bc, sysmsg.broadcaster_sys(bc), sysmsg.broadcaster_relay_add([radd]), now)
        if rep.job:
            self._start_job(rep, now)
            return
        # an open-ended request ends where it was priced and capped (start + expected), not
        # at whatever head the Publisher has when it opens the replay
        padd = sysmsg.PublisherReplayAdd(
            rep.id, rep.namespace, rep.start, rep.end, bc, rep.start + rep.expected
        )
        self._emit(
            rep.publisher,
            sysmsg.publisher_sys(rep.publisher),
            sysmsg.publisher_replay_add([padd]),
            now,
        )

    # -- procurement by a Spark job (large ranges, when the adapter has a job runner) --------
    def _start_job(self, rep: Replay, now: int) -> None:
        """The broadcaster knows the replay (its add went first): start the job, or, after a
        restart, hand the finished job's output to the broadcaster again."""
        if rep.job_output is not None:
            self._emit_job_add(rep, now)
            return
        pub = self.publications[rep.namespace]
        end = pub.head if rep.end is None else min(rep.end, pub.head)
        spec = ReplayJobSpec(
            rep.id,
            rep.namespace,
            rep.start,
            max(end, rep.start),
            rep.publisher.bytes,
            rep.filter.text if rep.filter else None,
            (rep.skip.mod, rep.skip.offset) if rep.skip else None,
            rep.end is None,
        )
        self.outbox.append(StartReplayJob(spec))
        if rep.status.tag == "pending":
            self._set_status(rep, ReplayState("running"), now)

    def _emit_job_add(self, rep: Replay, now: int) -> None:
        assert rep.job_output is not None
        self._emit(
            rep.broadcaster,
            sysmsg.broadcaster_sys(rep.broadcaster),
            sysmsg.broadcaster_replay_job_add([(rep.id, rep.job_output, rep.job_selected)]),
            now,
        )

    def _set_status(self, rep: Replay, state: ReplayState, now: int) -> None:
        if state != rep.status:
            self.journal.append(
                {"op": "status", "id": rep.id, "tag": state.tag, "value": state.value}, now
            )
        rep.status = state

    def job_finished(self, replay_id: int, result: Any, now: int) -> None:
        """The adapter reports a replay job's end: an object with ``output`` and ``selected``
        (the job's notifications are ready), or the exception it ended with."""
        rep = self.replays.get(replay_id)
        if rep is None or rep.status.final or rep.job_output is not None:
            return
        if rep.cancel_requested:
            self._set_status(rep, ReplayState("canceled", 0), now)
        elif isinstance(result, BaseException):
            self._set_status(rep, ReplayState("errored", f"replay job failed: {result}"), now)
        else:
            rep.job_output, rep.job_selected = str(result.output), int(result.selected)
            self.journal.append(
                {"op": "job", "id": rep.id, "output": rep.job_output, "selected": rep.job_selected},
                now,
            )
            self._emit_job_add(rep, now)

    def on_reply(self, call: Call, reply: Any, now: int) -> None:
        if call.method == "icrc72_handle_notification":
            if isinstance(reply, BaseException):
                self.resender.failed(call, now, reply)
            else:
                self.resender.succeeded(call)

    def pump(self, now: int) -> bool:
        """Send failed system notifications again when due; after a restart, send the open
        replays' system messages again (idempotent)."""
        again = self.resender.due(now)
        self.outbox.extend(again)
        if not self._resend:
            return bool(again)
        for rid in self._resend:
            rep = self.replays[rid]
            if rep.job and rep.cancel_requested and rep.job_output is None:
                # its job died with the old process before handing anything over
                self._set_status(rep, ReplayState("canceled", 0), now)
                continue
            if rep.cancel_requested:
                if not rep.job and rep.status.tag == "pending":
                    # its add may have died with the old process: without it the publisher
                    # could not report the cancel (it ends the replay canceled(0))
                    self._emit_replay_add(rep, now)
                self._emit_replay_remove(rep, now)
            else:
                self._emit_replay_add(rep, now)
        self._resend = []
        return True

    def _target(self, subscriber: Principal, publication_bc: Principal) -> Principal:
        home = self.homes.get(subscriber.bytes)
        if home is not None:
            return home
        if self.relay_replays and len(self.broadcasters) > 1:
            i = self.broadcasters.index(publication_bc)
            return self.broadcasters[(i + 1) % len(self.broadcasters)]
        return publication_bc

    def cancel_replay(self, caller: Principal, ids: list[int], now: int) -> list[Ok | Err | None]:
        if len(ids) > self.quotas.max_batch:
            return [Err("GenericBatchError", "batch too large")] * len(ids)
        return [self._cancel(caller, i, now) for i in ids]

    def _cancel(self, caller: Principal, rid: int, now: int) -> Ok | Err:
        if not self._rate_ok(caller, now):
            return _generic(E_RATE, "request rate exceeded")
        rep = self.replays.get(rid)
        if rep is None:
            return Err("NotFound")
        if rep.subscriber != caller:
            return Err("Unauthorized")
        if rep.status.final:
            return Err("CannotCancel", f"replay is already {rep.status}")
        if rep.cancel_requested:
            return Err("CannotCancel", "cancel already requested")
        # The status becomes canceled(n) when the publisher reports how many it sent.
        self.journal.append({"op": "cancel", "id": rid}, now)
        rep.cancel_requested = True
        self._emit_replay_remove(rep, now)
        return Ok(rid)

    def _emit_job_remove(self, rep: Replay, now: int) -> None:
        """A job replay: stop the job, and the broadcaster's delivery (which then reports
        ``canceled(n)``; a job stopped before its output was handed over: ``canceled(0)``)."""
        self.outbox.append(CancelReplayJob(rep.id))
        tsys = sysmsg.broadcaster_sys(rep.broadcaster)
        self._emit(rep.broadcaster, tsys, sysmsg.broadcaster_replay_remove([rep.id]), now)

    def _emit_replay_remove(self, rep: Replay, now: int) -> None:
        rid = rep.id
        if rep.job:
            self._emit_job_remove(rep, now)
            return
        # Publisher first: it stops enqueuing (ICRC-77 step 8); then the broadcaster drops
        # whatever is still in flight for this replay. (The broadcaster's call does not wait
        # for the publisher's answer, ``Call.waits``: what the publisher sends meanwhile is
        # dropped there too.)
        self._emit(
            rep.publisher,
            sysmsg.publisher_sys(rep.publisher),
            sysmsg.publisher_replay_remove([rid]),
            now,
        )
        tsys = sysmsg.broadcaster_sys(rep.broadcaster)
        if rep.relay is not None:
            self._emit(
                rep.relay,
                sysmsg.broadcaster_sys(rep.relay),
                sysmsg.broadcaster_relay_remove([rid]),
                now,
            )
        self._emit(rep.broadcaster, tsys, sysmsg.broadcaster_replay_remove([rid]), now)
        if rep.relay is not None:
            self._emit(rep.broadcaster, tsys, sysmsg.broadcaster_relayer_remove([rid]), now)

    def replay_status(
        self, caller: Principal, updates: list[ReplayStatusUpdate], now: int
    ) -> list[Ok | Err]:
        if len(updates) > self.quotas.max_batch:  # bounded as every other batch method
            return [_generic(E_BATCH, "batch too large")] * len(updates)
        return [self._status(caller, u, now) for u in updates]

    def _status(self, caller: Principal, u: ReplayStatusUpdate, now: int) -> Ok | Err:
        rep = self.replays.get(u.replay_id)
        if rep is None:
            return _generic(E_NOT_FOUND, f"no replay {u.replay_id}")
        if rep.publisher != caller and not (rep.job and rep.broadcaster == caller):
            return _generic(E_NOT_ASSIGNED, "only the assigned publisher reports status")
        cur, new = rep.status.tag, u.status.tag
        allowed = {
            "pending": {"running", "completed", "errored", "canceled"},
            "running": {"running", "completed", "errored", "canceled"},
        }
        if new not in allowed.get(cur, set()):
            return _generic(E_TRANSITION, f"replay {rep.id} is {rep.status}; cannot become {new}")
        if u.status != rep.status:
            self.journal.append(
                {"op": "status", "id": rep.id, "tag": new, "value": u.status.value}, now
            )
        rep.status = u.status
        return Ok(None)

    def get_replays(self, caller: Principal, args: GetReplays, now: int) -> list[Any]:
        """The caller's replays in id order, a page of at most ``take`` (≤ ``MAX_TAKE``) after
        ``prev``, with the stats ``filter.statistics`` asks for.

        ICRC-77 types ``prev`` as a principal without saying what it names. A replay is named
        by its id, so loglake's page cursor is ``replay_cursor(last id)``, an opaque principal
        holding that id (``next_replays_cursor`` builds it from a page); any other principal
        is a caller's mistake, answered with no replays rather than with the first page again.

        A call looks only at the replays of the shortest id list a listed replay must be in
        (the caller's own, or a slice's), from ``prev`` on, so its cost is its page however
        many replays the orchestrator holds; it counts toward the caller's
        ``max_queries_per_window`` (:class:`~loglake.events.role.RateLimited` beyond)."""
        self._query_rate(caller, now)
        _check_filter(args.filter)
        tests = _slice_predicates(args.filter)
        keep = _statistics_kept(args.filter)
        take = min(DEFAULT_TAKE if args.take is None else args.take, MAX_TAKE)
        if take == 0:  # asked for none (it gave the default page)
            return []
        after = -1
        if args.prev is not None:
            cursor = cursor_replay_id(args.prev)
            if cursor is None:
                return []
            after = cursor
        ids = self._listed_among(caller, args.filter)
        out: list[Any] = []
        for k in range(bisect_right(ids, after), len(ids)):
            rep = self.replays[ids[k]]
            if caller not in (rep.subscriber, rep.publisher, rep.broadcaster, rep.relay):
                continue
            if not all(t(rep) for t in tests):
                continue
            st = rep.to_status()
            out.append(st if keep is None else _with_statistics(st, keep))
            if len(out) >= take:
                break
        return out

    def _listed_among(self, caller: Principal, flt: OrchestrationFilter | None) -> list[int]:
        """The shortest of the id lists every replay the call lists is in: the caller's own,
        and each slice's (a principal's replays, a namespace's); no list for an unknown
        slice, which lists nothing."""
        table = self.replays
        lists = [table.by_party.get(caller.bytes, [])]
        for kind, v in () if flt is None else flt.slices:
            if kind == "ByNamespace":
                lists.append(table.by_namespace.get(v, []))
            elif kind in ("BySubscriber", "ByPublisher", "ByBroadcaster"):
                lists.append(table.by_party.get(v.bytes, []))
            else:
                return []
        return min(lists, key=len)


def replay_cursor(replay_id: int) -> Principal:
    """The ``prev`` that continues a listing after ``replay_id`` (see ``get_replays``)."""
    return Principal(_CURSOR_TAG + replay_id.to_bytes(8, "big") + _OPAQUE)


def cursor_replay_id(p: Principal) -> int | None:
    raw = p.bytes
    n = len(_CURSOR_TAG)
    if len(raw) != n + 9 or not raw.startswith(_CURSOR_TAG) or raw[-1:] != _OPAQUE:
        return None
    return int.from_bytes(raw[n : n + 8], "big")


def next_replays_cursor(page: list[Any]) -> Principal | None:
    """The ``prev`` for the page after ``page`` (None when it was empty)."""
    ids = [s.replay_id for s in page if s is not None]
    return replay_cursor(max(ids)) if ids else None


def _statistics_kept(flt: OrchestrationFilter | None) -> set[str] | None:
    """ICRC-72's ``OrchestrationFilter.statistics``: ``None`` no stats, ``All`` every one,
    ``List`` only those named; the names a status keeps (None: every stat, as without a
    filter), made once per call."""
    if flt is None or flt.statistics == "All":
        return None
    return set(flt.statistics_list) if flt.statistics == "List" else set()


def _with_statistics(st: ReplayStatus, keep: set[str]) -> ReplayStatus:
    return dataclasses.replace(st, stats=[(k, v) for k, v in st.stats if k in keep])
