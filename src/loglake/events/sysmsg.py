"""Control messages over the ICRC-72 system namespaces (ICRC-77 "Control Plane").

Namespaces (``specs/icrc-77-event-replay.txt``, "Control Plane via ICRC-72 System Namespaces"):
``icrc72:broadcaster:sys:<principal>`` and ``icrc72:publisher:sys:<principal>``. For
"Broadcaster → Subscriber" the text repeats ``icrc72:publisher:sys:<publisher_principal>``,
which cannot reach a subscriber; we read it as a copy slip and use
``icrc72:subscriber:sys:<subscriber_principal>``.

A system notification's ``data`` is ``#Map([(key, payload)])``. ICRC-77 payload shapes:

- ``icrc77:broadcaster:replay:add``: ``#Array[#Array[#Nat id, #Text namespace, #Blob relay,
  #Blob subscriber, #Option(null)|#Text filter, #Option(null)|#Array[#Nat, #Nat] skip,
  #Blob publisher]]``. ``relay`` is the relay broadcaster the replay's events come through
  (the broadcaster itself when there is no relay tier). The text calls the skip pair
  ``(skipStart, skipEnd)``; we carry ICRC-72's ``[mod, offset]`` there.
- ``icrc77:broadcaster:replay_relay:add`` (to the relay): ``#Array[#Array[#Nat id, #Text
  namespace, #Blob target broadcaster, #Blob publisher, #Option(null)|#Text filter,
  #Option(null)|#Array[#Nat, #Nat] skip]]``.
- ``icrc77:broadcaster:replay_relayer:add`` (to the target broadcaster: which relay feeds it):
  ``#Array[#Nat id, #Text namespace, #Blob relay]`` — one flat triple, as the text types it.
- ``icrc77:broadcaster:replay_relay:remove`` / ``…:replay_relayer:remove``: ``#Array[#Nat id]``
  (the text's type; its prose lists fields the type does not have, as for ``replay:remove``).
- ``icrc77:broadcaster:replay:remove``: ``#Array[#Array[#Nat id]]`` (the text's type; the prose
  lists more fields the type does not have).
- ``icrc77:publisher:replay:add``: ``#Array[#Array[#Nat id, #Text namespace, #Nat start,
  #Option(#Nat end)|#Option(null), #Blob broadcaster]]``; ``…:remove``: ``#Array[#Nat id]``.
  loglake's orchestrator appends a sixth element, ``#Nat priced end``, to an open-ended item
  (end ``#Option(null)``): the head it priced and capped the request at. The Publisher stops
  there, so events stored after the registration are not delivered unpaid and past
  ``max_events_per_replay``; an item of five (another orchestrator) still reads.
- ``icrc77:subscriber:replay:add``: ``#Array[#Array[#Nat id, #Blob broadcaster]]``;
  ``…:remove``: ``#Array[#Array[#Nat id]]``.

ICRC-72 assignment messages: ``icrc72:publisher:broadcaster:add`` = ``#Array[#Array[#Nat
publicationId, #Blob broadcaster]]`` (candidate "Publisher Life Cycle"). The candidate leaves the
broadcaster's and subscriber's assignment payloads to implementations; loglake's are
``icrc72:broadcaster:publication:add`` = ``#Array[#Array[#Text namespace, #Blob publisher]]``,
``icrc72:broadcaster:subscriber:add`` = ``#Array[#Array[#Text namespace, #Blob subscriber,
#Map config]]`` and ``icrc72:subscriber:broadcaster:add`` = ``#Array[#Array[#Text namespace,
#Blob broadcaster]]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from icp_principal import Principal

from loglake.errors import RemoteProtocolError
from loglake.events.filters import Skip
from loglake.wire.icrc16 import RawValue, Value

BROADCASTER_REPLAY_ADD = "icrc77:broadcaster:replay:add"
BROADCASTER_REPLAY_REMOVE = "icrc77:broadcaster:replay:remove"
BROADCASTER_RELAY_ADD = "icrc77:broadcaster:replay_relay:add"
BROADCASTER_RELAY_REMOVE = "icrc77:broadcaster:replay_relay:remove"
BROADCASTER_RELAYER_ADD = "icrc77:broadcaster:replay_relayer:add"
BROADCASTER_RELAYER_REMOVE = "icrc77:broadcaster:replay_relayer:remove"
BROADCASTER_REPLAY_JOB_ADD = "loglake:broadcaster:replay_job:add"
"""loglake's own (ICRC-77 names none): a replay's notifications were procured by a job; deliver
them from its output. ``#Array[#Array[#Nat id, #Text output, #Nat selected]]``."""
PUBLISHER_REPLAY_ADD = "icrc77:publisher:replay:add"
PUBLISHER_REPLAY_REMOVE = "icrc77:publisher:replay:remove"
SUBSCRIBER_REPLAY_ADD = "icrc77:subscriber:replay:add"
SUBSCRIBER_REPLAY_REMOVE = "icrc77:subscriber:replay:remove"
PUBLISHER_BROADCASTER_ADD = "icrc72:publisher:broadcaster:add"
BROADCASTER_PUBLICATION_ADD = "icrc72:broadcaster:publication:add"
BROADCASTER_SUBSCRIBER_ADD = "icrc72:broadcaster:subscriber:add"
SUBSCRIBER_BROADCASTER_ADD = "icrc72:subscriber:broadcaster:add"


class SysMessageError(RemoteProtocolError):
    """A system notification whose data does not have the shape its key requires."""


def broadcaster_sys(p: Principal) -> str:
    return f"icrc72:broadcaster:sys:{p.to_str()}"


def publisher_sys(p: Principal) -> str:
    return f"icrc72:publisher:sys:{p.to_str()}"


def subscriber_sys(p: Principal) -> str:
    return f"icrc72:subscriber:sys:{p.to_str()}"


def is_system(namespace: str) -> bool:
    return namespace.startswith("icrc72:") or namespace.startswith("icrc77:")


@dataclass(frozen=True)
class BroadcasterReplayAdd:
    replay_id: int
    namespace: str
    relay: Principal
    subscriber: Principal
    filter: str | None
    skip: Skip | None
    publisher: Principal


@dataclass(frozen=True)
class RelayAdd:
    replay_id: int
    namespace: str
    target: Principal
    publisher: Principal
    filter: str | None
    skip: Skip | None


@dataclass(frozen=True)
class RelayerAdd:
    replay_id: int
    namespace: str
    relay: Principal


@dataclass(frozen=True)
class PublisherReplayAdd:
    replay_id: int
    namespace: str
    start: int
    end: int | None
    broadcaster: Principal
    priced_end: int | None = None
    """An open-ended request's end as the orchestrator priced and capped it (None: not sent)."""


def message(key: str, payload: Value) -> Value:
    return {"Map": [(key, payload)]}


def _arr(*items: Value) -> Value:
    return {"Array": list(items)}


def broadcaster_replay_add(items: list[BroadcasterReplayAdd]) -> Value:
    return message(
        BROADCASTER_REPLAY_ADD,
        _arr(
            *(
                _arr(
                    {"Nat": i.replay_id},
                    {"Text": i.namespace},
                    {"Blob": i.relay.bytes},
                    {"Blob": i.subscriber.bytes},
                    {"Option": None} if i.filter is None else {"Text": i.filter},
                    {"Option": None} if i.skip is None else i.skip.to_icrc16(),
                    {"Blob": i.publisher.bytes},
                )
                for i in items
            )
        ),
    )


def _opt_filter(f: str | None) -> Value:
    return {"Option": None} if f is None else {"Text": f}


def _opt_skip(s: Skip | None) -> Value:
    return {"Option": None} if s is None else s.to_icrc16()


def broadcaster_relay_add(items: list[RelayAdd]) -> Value:
    return message(
        BROADCASTER_RELAY_ADD,
        _arr(
            *(
                _arr(
                    {"Nat": i.replay_id},
                    {"Text": i.namespace},
                    {"Blob": i.target.bytes},
                    {"Blob": i.publisher.bytes},
                    _opt_filter(i.filter),
                    _opt_skip(i.skip),
                )
                for i in items
            )
        ),
    )


def broadcaster_relayer_add(item: RelayerAdd) -> Value:
    return message(
        BROADCASTER_RELAYER_ADD,
        _arr({"Nat": item.replay_id}, {"Text": item.namespace}, {"Blob": item.relay.bytes}),
    )


def broadcaster_relay_remove(ids: list[int]) -> Value:
    return message(BROADCASTER_RELAY_REMOVE, _arr(*({"Nat": i} for i in ids)))


def broadcaster_relayer_remove(ids: list[int]) -> Value:
    return message(BROADCASTER_RELAYER_REMOVE, _arr(*({"Nat": i} for i in ids)))


def publisher_replay_add(items: list[PublisherReplayAdd]) -> Value:
    return message(
        PUBLISHER_REPLAY_ADD,
        _arr(
            *(
                _arr(
                    {"Nat": i.replay_id},
                    {"Text": i.namespace},
                    {"Nat": i.start},
                    {"Option": None if i.end is None else {"Nat": i.end}},
                    {"Blob": i.broadcaster.bytes},
                    *(
                        [{"Nat": i.priced_end}]
                        if i.end is None and i.priced_end is not None
                        else []
                    ),
                )
                for i in items
            )
        ),
    )


def broadcaster_replay_remove(ids: list[int]) -> Value:
    return message(BROADCASTER_REPLAY_REMOVE, _arr(*(_arr({"Nat": i}) for i in ids)))


def broadcaster_replay_job_add(items: list[tuple[int, str, int]]) -> Value:
    return message(
        BROADCASTER_REPLAY_JOB_ADD,
        _arr(*(_arr({"Nat": i}, {"Text": out}, {"Nat": n}) for i, out, n in items)),
    )


def read_replay_job_add(payload: Value) -> list[tuple[int, str, int]]:
    key = BROADCASTER_REPLAY_JOB_ADD
    out = []
    for item in _items(payload, key):
        f = _items(item, key)
        if len(f) != 3:
            raise SysMessageError(f"{key}: expected [id, output, selected]")
        out.append((_get(f[0], "Nat", key), _get(f[1], "Text", key), _get(f[2], "Nat", key)))
    return out


def publisher_replay_remove(ids: list[int]) -> Value:
    return message(PUBLISHER_REPLAY_REMOVE, _arr(*({"Nat": i} for i in ids)))


def subscriber_replay_add(items: list[tuple[int, Principal]]) -> Value:
    return message(
        SUBSCRIBER_REPLAY_ADD, _arr(*(_arr({"Nat": i}, {"Blob": b.bytes}) for i, b in items))
    )


def subscriber_replay_remove(ids: list[int]) -> Value:
    return message(SUBSCRIBER_REPLAY_REMOVE, _arr(*(_arr({"Nat": i}) for i in ids)))


def publisher_broadcaster_add(items: list[tuple[int, Principal]]) -> Value:
    return message(
        PUBLISHER_BROADCASTER_ADD,
        _arr(*(_arr({"Nat": i}, {"Blob": b.bytes}) for i, b in items)),
    )


def broadcaster_publication_add(items: list[tuple[str, Principal]]) -> Value:
    return message(
        BROADCASTER_PUBLICATION_ADD,
        _arr(*(_arr({"Text": ns}, {"Blob": p.bytes}) for ns, p in items)),
    )


def broadcaster_subscriber_add(items: list[tuple[str, Principal, list[Any]]]) -> Value:
    return message(
        BROADCASTER_SUBSCRIBER_ADD,
        _arr(*(_arr({"Text": ns}, {"Blob": p.bytes}, {"Map": cfg}) for ns, p, cfg in items)),
    )


def subscriber_broadcaster_add(items: list[tuple[str, Principal]]) -> Value:
    return message(
        SUBSCRIBER_BROADCASTER_ADD,
        _arr(*(_arr({"Text": ns}, {"Blob": p.bytes}) for ns, p in items)),
    )


# --- reading ---------------------------------------------------------------------------------
def entries(data: Value | RawValue) -> list[tuple[str, Value]]:
    if not isinstance(data, dict) or "Map" not in data:
        raise SysMessageError("system notification data must be #Map")
    return list(data["Map"])


def _items(payload: Value, key: str) -> list[Value]:
    if not isinstance(payload, dict) or "Array" not in payload:
        raise SysMessageError(f"{key}: payload must be #Array")
    return payload["Array"]


def _fields(item: Value, key: str, n: int) -> list[Value]:
    if not isinstance(item, dict) or "Array" not in item or len(item["Array"]) != n:
        raise SysMessageError(f"{key}: each item must be #Array of {n}")
    return item["Array"]


def _get(v: Value, tag: str, key: str) -> Any:
    if not isinstance(v, dict) or tag not in v:
        raise SysMessageError(f"{key}: expected #{tag}, got {v!r:.60}")
    return v[tag]


def _principal(v: Value, key: str) -> Principal:
    raw = _get(v, "Blob", key)
    if len(raw) > 29:
        raise SysMessageError(f"{key}: a principal is at most 29 bytes")
    return Principal(bytes(raw))


def read_broadcaster_replay_add(payload: Value) -> list[BroadcasterReplayAdd]:
    from loglake.events.filters import ImproperConfig, parse_skip

    k = BROADCASTER_REPLAY_ADD
    out = []
    for item in _items(payload, k):
        rid, ns, relay, sub, flt, skip, pub = _fields(item, k, 7)
        f = None if flt == {"Option": None} else _get(flt, "Text", k)
        try:
            s = parse_skip(skip)
        except ImproperConfig as e:
            raise SysMessageError(f"{k}: {e}") from e
        out.append(
            BroadcasterReplayAdd(
                _get(rid, "Nat", k),
                _get(ns, "Text", k),
                _principal(relay, k),
                _principal(sub, k),
                f,
                s,
                _principal(pub, k),
            )
        )
    return out


def _read_filter_skip(flt: Value, skip: Value, k: str) -> tuple[str | None, Skip | None]:
    from loglake.events.filters import ImproperConfig, parse_skip

    f = None if flt == {"Option": None} else _get(flt, "Text", k)
    try:
        return f, parse_skip(skip)
    except ImproperConfig as e:
        raise SysMessageError(f"{k}: {e}") from e


def read_relay_add(payload: Value) -> list[RelayAdd]:
    k = BROADCASTER_RELAY_ADD
    out = []
    for item in _items(payload, k):
        rid, ns, target, pub, flt, skip = _fields(item, k, 6)
        f, s = _read_filter_skip(flt, skip, k)
        out.append(
            RelayAdd(
                _get(rid, "Nat", k),
                _get(ns, "Text", k),
                _principal(target, k),
                _principal(pub, k),
                f,
                s,
            )
        )
    return out


def read_relayer_add(payload: Value) -> RelayerAdd:
    k = BROADCASTER_RELAYER_ADD
    rid, ns, relay = _fields(payload, k, 3)
    return RelayerAdd(_get(rid, "Nat", k), _get(ns, "Text", k), _principal(relay, k))


def read_publisher_replay_add(payload: Value) -> list[PublisherReplayAdd]:
    k = PUBLISHER_REPLAY_ADD
    out = []
    for item in _items(payload, k):
        six = isinstance(item, dict) and len(item.get("Array", ())) == 6
        rid, ns, start, end, bc, *priced = _fields(item, k, 6 if six else 5)
        e = _get(end, "Option", k)
        if priced and e is not None:
            raise SysMessageError(f"{k}: a priced end is only for an open-ended item")
        out.append(
            PublisherReplayAdd(
                _get(rid, "Nat", k),
                _get(ns, "Text", k),
                _get(start, "Nat", k),
                None if e is None else _get(e, "Nat", k),
                _principal(bc, k),
                _get(priced[0], "Nat", k) if priced else None,
            )
        )
    return out


def read_nested_ids(payload: Value, key: str) -> list[int]:
    return [_get(_fields(i, key, 1)[0], "Nat", key) for i in _items(payload, key)]


def read_ids(payload: Value, key: str) -> list[int]:
    return [_get(i, "Nat", key) for i in _items(payload, key)]


def read_pairs(payload: Value, key: str, first: str) -> list[tuple[Any, Principal]]:
    out = []
    for item in _items(payload, key):
        a, b = _fields(item, key, 2)
        out.append((_get(a, first, key), _principal(b, key)))
    return out


def read_subscriber_add(payload: Value) -> list[tuple[str, Principal, list[Any]]]:
    k = BROADCASTER_SUBSCRIBER_ADD
    out = []
    for item in _items(payload, k):
        ns, sub, cfg = _fields(item, k, 3)
        out.append((_get(ns, "Text", k), _principal(sub, k), _get(cfg, "Map", k)))
    return out
