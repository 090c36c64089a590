"""Messages <-> Candid bytes, per method of each role.

Each method takes one Candid argument and returns one Candid value (the ICRC-72/77 batch
methods all have this shape). :data:`METHODS` names, for every method we serve, its argument and
result types and the converters between the dataclasses of ``messages.py`` and the Candid value
form (records as dicts, ``opt`` as ``[]``/``[v]``, variants as one-key dicts). Bytes go through
the one Candid codec (``loglake.wire.candid``), which checks values as it writes them;
decoding maps every failure to ``ICRC16DecodeError`` (a ``DecodeError``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from icp_candid import Types
from icp_principal import Principal

from loglake.events import candid_types as T
from loglake.events import fastcodec
from loglake.events.messages import (
    Err,
    Event,
    EventNotification,
    GetReplays,
    InboxPage,
    Ok,
    OrchestrationFilter,
    Registration,
    ReplayRegistration,
    ReplayState,
    ReplayStatus,
    ReplayStatusUpdate,
)
from loglake.wire import candid, icrc16
from loglake.wire.icrc16 import ICRC16DecodeError, RawValue, candid_decode
from loglake.wire.varint import encode_uleb

EventWire = T.EventWire  # icrc72_publish's argument (data may be a stored RawValue)
# icrc72_update_publication (ICRC-72 candidate): PublicationUpdate and its result.
PublicationUpdate = Types.Record(
    {
        "publication": Types.Variant({"namespace": Types.Text, "publicationId": Types.Nat}),
        "config": Types.Tuple(Types.Text, T.ICRC16),
        "memo": Types.Vec(Types.Nat8),
    }
)
PublicationUpdateResult = Types.Opt(
    Types.Variant({"Ok": Types.Bool, "Err": T.PublicationRegisterError})
)


def _opt(v: Any) -> list[Any]:
    return [] if v is None else [v]


def _unopt(v: list[Any]) -> Any:
    return v[0] if v else None


def _map_to(m: Any) -> list[Any]:
    return icrc16.map_to_candid(icrc16.validate_map(list(m)))


def _nat(x: Any, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise icrc16.ICRC16Error(f"{what} must be a nat, not {x!r}")
    return x


# --- records ---------------------------------------------------------------------------------
def event_to(e: Event) -> dict[str, Any]:
    return {
        "eventId": _nat(e.event_id, "eventId"),
        "prevEventId": _opt(e.prev_event_id),
        "timestamp": _nat(e.timestamp, "timestamp"),
        "namespace": e.namespace,
        "data": e.data
        if isinstance(e.data, RawValue)
        else icrc16.to_candid(icrc16.validate(e.data)),
        "source": e.source,
        "headers": _opt(None if e.headers is None else _map_to(e.headers)),
    }


def update_publication_to(u: tuple[str, str, Any]) -> dict[str, Any]:
    ns, key, value = u
    return {
        "publication": {"namespace": ns},
        "config": [key, icrc16.to_candid(icrc16.validate(value))],
        "memo": b"",
    }


def update_publication_from(v: dict[str, Any]) -> tuple[str, str, Any]:
    pub = v["publication"]
    if "namespace" not in pub:
        raise ICRC16DecodeError("loglake identifies publications by namespace")
    key, value = v["config"]
    return (pub["namespace"], key, icrc16.from_candid(value))


def account_to(a: Any) -> dict[str, Any]:
    owner, sub = a
    return {"owner": owner, "subaccount": _opt(sub)}


def account_from(v: dict[str, Any]) -> tuple[Principal, bytes | None]:
    return (v["owner"], _unopt(v["subaccount"]))


def approve_to(a: tuple[Any, ...]) -> dict[str, Any]:
    """``(spender, amount)``, optionally followed by ``expected_allowance``, ``expires_at``
    and ``fee`` (None: unset)."""
    spender, amount, *rest = a
    expected, expires_at, fee = (*rest, None, None, None)[:3]
    return {
        "from_subaccount": [],
        "spender": {"owner": spender, "subaccount": []},
        "amount": _nat(amount, "amount"),
        "expected_allowance": _opt(expected),
        "expires_at": _opt(expires_at),
        "fee": _opt(fee),
        "memo": [],
        "created_at_time": [],
    }


def approve_from(v: dict[str, Any]) -> tuple[Principal, int, int | None, int | None, int | None]:
    """``(spender, amount, expected_allowance, expires_at, fee)``: the fields the ledger
    checks (ICRC-2 ``icrc2_approve``; they were dropped unread, so an approval meant to fail
    on a changed allowance, an expiry past or a wrong fee went through)."""
    if v["from_subaccount"] or v["spender"]["subaccount"]:
        raise ICRC16DecodeError("the embedded ledger supports default subaccounts only")
    return (
        v["spender"]["owner"],
        v["amount"],
        _unopt(v["expected_allowance"]),
        _unopt(v["expires_at"]),
        _unopt(v["fee"]),
    )


def event_from(v: dict[str, Any]) -> Event:
    h = _unopt(v["headers"])
    return Event(
        v["eventId"],
        _unopt(v["prevEventId"]),
        v["timestamp"],
        v["namespace"],
        d if isinstance(d := v["data"], RawValue) else icrc16.from_candid(d),
        v["source"],
        None if h is None else icrc16.map_from_candid(h),
    )


def notification_to(n: EventNotification) -> dict[str, Any]:
    return {
        "notificationId": _nat(n.notification_id, "notificationId"),
        "eventId": _nat(n.event_id, "eventId"),
        "prevEventId": _opt(n.prev_event_id),
        "timestamp": n.timestamp,
        "namespace": n.namespace,
        "data": icrc16.to_candid(icrc16.validate(n.data)),
        "headers": _opt(None if n.headers is None else _map_to(n.headers)),
        "source": n.source,
        "filter": _opt(n.filter),
    }


def notification_from(v: dict[str, Any]) -> EventNotification:
    h = _unopt(v["headers"])
    return EventNotification(
        v["notificationId"],
        v["eventId"],
        _unopt(v["prevEventId"]),
        v["timestamp"],
        v["namespace"],
        icrc16.from_candid(v["data"]),
        None if h is None else icrc16.map_from_candid(h),
        v["source"],
        _unopt(v["filter"]),
    )


def registration_to(r: Registration) -> dict[str, Any]:
    return {"namespace": r.namespace, "config": _map_to(r.config), "memo": bytes(r.memo)}


def registration_from(v: dict[str, Any]) -> Registration:
    return Registration(v["namespace"], icrc16.map_from_candid(v["config"]), bytes(v["memo"]))


def replay_registration_to(r: ReplayRegistration) -> dict[str, Any]:
    return {
        "namespace": r.namespace,
        "range": [_nat(r.start, "range start"), _opt(r.end)],
        "config": _map_to(r.config),
        "memo": bytes(r.memo),
    }


def replay_registration_from(v: dict[str, Any]) -> ReplayRegistration:
    start, end = v["range"]
    return ReplayRegistration(
        v["namespace"], start, _unopt(end), icrc16.map_from_candid(v["config"]), bytes(v["memo"])
    )


def state_to(s: ReplayState) -> dict[str, Any]:
    return {s.tag: s.value}


def state_from(v: dict[str, Any]) -> ReplayState:
    ((tag, val),) = v.items()
    return ReplayState(tag, val)


def status_to(s: ReplayStatus) -> dict[str, Any]:
    return {
        "replayId": s.replay_id,
        "namespace": s.namespace,
        "config": _map_to(s.config),
        "stats": _map_to(s.stats),
        "range": [s.start, _opt(s.end)],
        "status": state_to(s.status),
    }


def status_from(v: dict[str, Any]) -> ReplayStatus:
    start, end = v["range"]
    return ReplayStatus(
        v["replayId"],
        v["namespace"],
        icrc16.map_from_candid(v["config"]),
        icrc16.map_from_candid(v["stats"]),
        start,
        _unopt(end),
        state_from(v["status"]),
    )


def update_to(u: ReplayStatusUpdate) -> dict[str, Any]:
    return {"replayId": u.replay_id, "status": state_to(u.status)}


def update_from(v: dict[str, Any]) -> ReplayStatusUpdate:
    return ReplayStatusUpdate(v["replayId"], state_from(v["status"]))


def filter_to(f: OrchestrationFilter) -> dict[str, Any]:
    stats = {f.statistics: list(f.statistics_list) if f.statistics == "List" else None}
    return {"statistics": stats, "slice": [{k: v} for k, v in f.slices]}


def filter_from(v: dict[str, Any]) -> OrchestrationFilter:
    ((stag, sval),) = v["statistics"].items()
    slices = tuple(next(iter(s.items())) for s in v["slice"])
    return OrchestrationFilter(stag, tuple(sval or ()) if stag == "List" else (), slices)


def get_replays_to(g: GetReplays) -> dict[str, Any]:
    return {
        "prev": _opt(g.prev),
        "take": _opt(g.take),
        "filter": _opt(None if g.filter is None else filter_to(g.filter)),
    }


def get_replays_from(v: dict[str, Any]) -> GetReplays:
    f = _unopt(v["filter"])
    return GetReplays(_unopt(v["prev"]), _unopt(v["take"]), None if f is None else filter_from(f))


# --- results ---------------------------------------------------------------------------------
def result_to(r: Ok | Err, ok: Callable[[Any], Any] = lambda x: x) -> Any:
    """A ``variant { Ok; Err }``; wrap in ``_opt`` for the ``opt variant`` batch results."""
    if isinstance(r, Ok):
        return {"Ok": ok(r.value)}
    return {"Err": {r.tag: r.payload}}


def result_from(v: dict[str, Any], ok: Callable[[Any], Any] = lambda x: x) -> Ok | Err:
    if "Ok" in v:
        return Ok(ok(v["Ok"]))
    ((tag, payload),) = v["Err"].items()
    return Err(tag, payload)


def status_result_to(r: Ok | Err) -> Any:
    """``ReplayStatusUpdateResult = variant { Ok : null; Err : GenericError }``: the error
    is the GenericError record itself (we carry it as ``Err("GenericError", record)``)."""
    return {"Ok": None} if isinstance(r, Ok) else {"Err": r.payload}


def status_result_from(v: dict[str, Any]) -> Ok | Err:
    return Ok(None) if "Ok" in v else Err("GenericError", v["Err"])


def opt_results_to(rs: list[Ok | Err | None]) -> list[Any]:
    return [[] if r is None else [result_to(r)] for r in rs]


def opt_results_from(vs: list[Any]) -> list[Ok | Err | None]:
    return [result_from(v[0]) if v else None for v in vs]


def uniform_results(write: Callable[[list[Any]], bytes], results: Any) -> bytes | None:
    """The reply of a batch refused whole — every item the one result object, as
    ``[err] * n`` makes it — written as its type table, the count and one item's bytes
    repeated (``write`` encodes a list of results the generic way). Why: the generic encoder
    takes microseconds and several objects an item, and a refused batch is as long as the
    caller made it. None for anything else (the codec writes it)."""
    if not isinstance(results, list) or len(results) < 2:
        return None
    first = results[0]
    if not all(r is first for r in results):
        return None
    empty = write([])
    one = write([first])
    head = empty[:-1]  # the count (LEB128 0) is the last octet of an empty vector's message
    if not one.startswith(head) or one[len(head)] != 1:
        return None
    return head + encode_uleb(len(results)) + one[len(head) + 1 :] * len(results)


def _confirm_fast(r: Any) -> bytes | None:
    return uniform_results(lambda rs: candid.encode([T.ConfirmationResult], [confirm_to(rs)]), r)


def confirm_to(r: Any) -> Any:
    if r is None:
        return {"allAccepted": None}
    return {"itemized": opt_results_to(r)}


def confirm_from(v: Any) -> Any:
    if "allAccepted" in v:
        return None
    return opt_results_from(v["itemized"])


# --- the method table ------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    name: str
    arg_type: Any
    ret_type: Any
    arg_to: Callable[[Any], Any]
    arg_from: Callable[[Any], Any]
    ret_to: Callable[[Any], Any]
    ret_from: Callable[[Any], Any]
    query: bool = False
    fast_arg: Callable[[Any], bytes | None] | None = None
    """Writes the argument's message from the dataclasses or with a batch kernel
    (``fastcodec``); None leaves a value to the codec's writer of the converted value."""
    fast_ret: Callable[[Any], bytes | None] | None = None
    """Writes the result's message directly; None leaves a value to the generic encoder."""
    fast_arg_decode: Callable[[bytes], Any] | None = None
    """Reads the argument straight into our form when the header is our encoder's (else None:
    the generic decoder); same result as the generic path (``fastcodec``, tested)."""
    fast_ret_decode: Callable[[bytes], Any] | None = None

    def encode_arg(self, arg: Any) -> bytes:
        return _encode(self.fast_arg, self.arg_type, self.arg_to, arg)

    def decode_arg(self, data: bytes) -> Any:
        return _decode(self.fast_arg_decode, self.arg_type, self.arg_from, data)

    def encode_ret(self, ret: Any) -> bytes:
        return _encode(self.fast_ret, self.ret_type, self.ret_to, ret)

    def decode_ret(self, data: bytes) -> Any:
        return _decode(self.fast_ret_decode, self.ret_type, self.ret_from, data)


def _encode(
    fast: Callable[[Any], bytes | None] | None, t: Any, to: Callable[[Any], Any], x: Any
) -> bytes:
    """The batch writer's message where there is one and it takes ``x``, else the codec's."""
    if fast is not None:
        out = fast(x)
        if out is not None:
            return out
    return candid.encode([t], [to(x)])


def _decode(
    fast: Callable[[bytes], Any] | None, t: Any, frm: Callable[[Any], Any], data: bytes
) -> Any:
    """The batch reader's result where there is one and the header is ours, else the codec's
    value converted."""
    if fast is not None and isinstance(data, bytes | bytearray):
        got = fast(data)
        if got is not None:
            return got
    return _convert(frm, candid_decode(data, [t])[0])


def _convert(f: Callable[[Any], Any], v: Any) -> Any:
    try:
        return f(v)
    except ICRC16DecodeError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ICRC16DecodeError(f"unexpected Candid value shape: {e}") from e


def _vec(f: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda xs: [f(x) for x in xs]


def _ident(x: Any) -> Any:
    return x


def _nats_to(xs: list[int]) -> list[int]:
    if not isinstance(xs, list | tuple):
        raise icrc16.ICRC16Error(f"a vec nat is a list of nats, not {xs!r:.80}")
    return [_nat(x, "id") for x in xs]


def _batch(
    name: str,
    item: Any,
    result: Any,
    arg_to: Callable[[Any], Any],
    arg_from: Callable[[Any], Any],
) -> Method:
    """An ICRC-72/77 batch method: ``vec item -> vec opt variant { Ok; Err }`` (the results'
    shape is ``result``)."""
    return Method(
        name,
        Types.Vec(item),
        Types.Vec(result),
        arg_to,
        arg_from,
        opt_results_to,
        opt_results_from,
    )


_M = [
    # Orchestrator (ICRC-72 candidate "Orchestrator Update Methods", ICRC-77 "Methods")
    _batch(
        "icrc72_register_publication",
        T.PublicationRegistration,
        T.PublicationRegisterResult,
        _vec(registration_to),
        _vec(registration_from),
    ),
    _batch(
        "icrc72_register_subscription",
        T.SubscriptionRegistration,
        T.SubscriptionRegisterResult,
        _vec(registration_to),
        _vec(registration_from),
    ),
    _batch(
        "icrc77_register_replay",
        T.ReplayRegistration,
        T.ReplayRegisterResult,
        _vec(replay_registration_to),
        _vec(replay_registration_from),
    ),
    _batch(
        "icrc77_cancel_replay",
        T.ReplayId,
        T.CancelReplayResult,
        _nats_to,
        _ident,
    ),
    Method(
        "icrc77_replay_status",
        Types.Vec(T.ReplayStatusUpdate),
        Types.Vec(T.ReplayStatusUpdateResult),
        _vec(update_to),
        _vec(update_from),
        _vec(status_result_to),
        _vec(status_result_from),
    ),
    Method(
        "icrc77_get_replays",
        T.GetReplaysArgs,
        Types.Vec(Types.Opt(T.ReplayStatus)),
        get_replays_to,
        get_replays_from,
        lambda rs: [_opt(None if r is None else status_to(r)) for r in rs],
        lambda vs: [None if not v else status_from(v[0]) for v in vs],
        query=True,
    ),
    # Broadcaster (ICRC-72 candidate "Broadcaster Update Functions")
    _batch(
        "icrc72_update_publication",
        PublicationUpdate,
        PublicationUpdateResult,
        _vec(update_publication_to),
        _vec(update_publication_from),
    ),
    # The embedded ledger (ICRC-1 / ICRC-2 standards), served by the orchestrator.
    Method(
        "icrc1_balance_of",
        T.Account,
        Types.Nat,
        account_to,
        account_from,
        _ident,
        _ident,
        query=True,
    ),
    Method(
        "icrc2_approve",
        T.ApproveArgs,
        T.ApproveResult,
        approve_to,
        approve_from,
        result_to,
        result_from,
    ),
    _batch(
        "icrc72_publish",
        EventWire,
        T.PublishResult,
        _vec(event_to),
        _vec(event_from),
    ),
    Method(
        "icrc72_confirm_notifications",
        Types.Vec(Types.Nat),
        T.ConfirmationResult,
        _nats_to,
        _ident,
        confirm_to,
        confirm_from,
    ),
    # Subscriber, and every role for system namespaces (ICRC-72 "Subscriber Update Functions").
    # The candidate writes `(vec notification) -> ()` (one-shot); we return the count accepted so
    # an HTTP caller learns it was processed.
    Method(
        "icrc72_handle_notification",
        Types.Vec(T.EventNotification),
        Types.Nat,
        _vec(notification_to),
        _vec(notification_from),
        _ident,
        _ident,
    ),
]
# loglake's local methods (Candid too): a publisher's own key publishes, a subscriber's own key
# reads its inbox. Not ICRC methods; the CLI and tests use them.
PublishItem = Types.Record({"data": T.ICRC16, "headers": Types.Opt(T.ICRC16Map)})
_LOCAL = {
    "loglake_publish": Method(
        "loglake_publish",
        Types.Tuple(Types.Text, Types.Vec(PublishItem)),
        Types.Vec(Types.Nat),
        lambda a: [
            a[0],
            [
                {
                    "data": icrc16.to_candid(icrc16.validate(d)),
                    "headers": [] if h is None else [icrc16.map_to_candid(h)],
                }
                for d, h in a[1]
            ],
        ],
        lambda v: (
            v[0],
            [
                (
                    icrc16.from_candid(i["data"]),
                    icrc16.map_from_candid(i["headers"][0]) if i["headers"] else None,
                )
                for i in v[1]
            ],
        ),
        list,
        list,
    ),
    # loglake's own: register a namespace from outside the publisher process (the publisher
    # retries until the orchestrator answers), and read where each registration stands
    "loglake_register": Method(
        "loglake_register",
        Types.Tuple(Types.Text, Types.Nat),
        Types.Text,
        list,
        tuple,
        str,
        str,
    ),
    "loglake_registrations": Method(
        "loglake_registrations",
        Types.Vec(Types.Text),
        Types.Vec(Types.Tuple(Types.Text, Types.Text, Types.Nat, Types.Text)),
        list,
        list,
        lambda rows: [list(r) for r in rows],
        lambda rows: [tuple(r) for r in rows],
    ),
    # (acknowledged up to, at most this many) -> (cursor, the oldest notifications): the
    # subscriber removes a notification once a later call acknowledges its page (InboxPage)
    "loglake_inbox": Method(
        "loglake_inbox",
        Types.Tuple(Types.Nat, Types.Nat),
        Types.Tuple(Types.Nat, Types.Vec(T.EventNotification)),
        list,
        tuple,
        lambda p: [p[0], [notification_to(n) for n in p[1]]],
        lambda v: InboxPage(v[0], [notification_from(x) for x in v[1]]),
    ),
}

# The replay data plane's methods read and write their batches as dataclasses, lazy batches and
# numpy rows (``fastcodec``); the others go through the converters above.
_BATCHES: dict[str, dict[str, Any]] = {
    "icrc72_publish": {
        "fast_arg": fastcodec.encode_events,
        "fast_ret": fastcodec.encode_publish_results,
        "fast_arg_decode": fastcodec.decode_event_batch,
        "fast_ret_decode": fastcodec.decode_publish_results,
    },
    "icrc72_confirm_notifications": {
        "fast_ret": _confirm_fast,
        "fast_arg": fastcodec.encode_nats,
        "fast_arg_decode": fastcodec.decode_nats,
    },
    "icrc72_handle_notification": {
        "fast_arg": fastcodec.encode_notifications,
        "fast_arg_decode": fastcodec.decode_notification_batch,
    },
    "loglake_inbox": {
        "fast_ret": fastcodec.encode_inbox_page,
        "fast_ret_decode": fastcodec.decode_inbox_page,
    },
}
METHODS: dict[str, Method] = {
    m.name: replace(m, **_BATCHES.get(m.name, {})) for m in [*_M, *_LOCAL.values()]
}
