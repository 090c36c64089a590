"""Sample values of every ICRC-16 variant and every ICRC-77 type (shared by tests)."""

from __future__ import annotations

from icp_principal import Principal

from loglake.events import codec
from loglake.events.messages import (
    Err,
    Event,
    EventNotification,
    GetReplays,
    Ok,
    OrchestrationFilter,
    ReplayRegistration,
    ReplayState,
    ReplayStatus,
    ReplayStatusUpdate,
)
from loglake.wire import icrc16
from loglake.wire.icrc16 import Property

P1 = Principal.from_str("2vxsx-fae")
P2 = Principal(bytes(range(29)))

EVERY_VARIANT = {
    "Map": [
        ("array", {"Array": [{"Nat": 1}, {"Text": "two"}]}),
        ("blob", {"Blob": b"\x00\xff"}),
        ("bool", {"Bool": True}),
        ("bytes", {"Bytes": b"abc"}),
        ("class", {"Class": [Property("p", {"Int": -5}, True), Property("q", {"Nat": 0}, False)]}),
        ("float", {"Float": 1.5}),
        ("floats", {"Floats": [0.25, -2.0]}),
        ("int", {"Int": -(2**70)}),
        ("int16", {"Int16": -32768}),
        ("int32", {"Int32": 2**31 - 1}),
        ("int64", {"Int64": -(2**63)}),
        ("int8", {"Int8": -128}),
        ("valuemap", {"ValueMap": [({"Nat": 1}, {"Text": "one"})]}),
        ("nat", {"Nat": 2**80}),
        ("nat16", {"Nat16": 65535}),
        ("nat32", {"Nat32": 2**32 - 1}),
        ("nat64", {"Nat64": 2**64 - 1}),
        ("nat8", {"Nat8": 255}),
        ("nats", {"Nats": [0, 2**65]}),
        ("some", {"Option": {"Text": "x"}}),
        ("none", {"Option": None}),
        ("principal", {"Principal": P2}),
        ("set", {"Set": [{"Bool": False}]}),
        ("text", {"Text": "héllo"}),
    ]
}
CONFIG = [
    ("filter", {"Option": {"Text": "kind == 'a'"}}),
    ("skip", {"Option": {"Array": [{"Nat": 3}, {"Nat": 1}]}}),
]
STATUS = ReplayStatus(
    7, "com.example.ns", CONFIG, [("sent", {"Nat": 9})], 10, None, ReplayState("running")
)


def candid_samples() -> dict[str, list[object]]:
    """Type name → values in icp_candid's form (built with our codec)."""
    reg = ReplayRegistration("com.example.ns", 0, 100, CONFIG, b"\x01" * 32)
    ev = Event(
        3, 2, 1_700_000_000_000_000_000, "com.example.ns", EVERY_VARIANT, P2, [("k", {"Nat": 1})]
    )
    notif = EventNotification(9, 3, None, 5, "ns", {"Text": "d"}, None, P1, "a == 1")
    errs = [
        Err("Unauthorized"),
        Err("UnauthorizedSubscriber", {"namespace": "ns"}),
        Err("ImproperConfig", "bad"),
        Err("PaymentRequired", "pay"),
        Err("RangeTooLarge", "big"),
        Err("GenericError", {"error_code": 3, "message": "m"}),
        Err("GenericBatchError", "batch"),
        Err("PublicationNotFound"),
        Err("SubscriptionNotFound"),
    ]
    cerrs = [
        Err("Unauthorized"),
        Err("NotFound"),
        Err("CannotCancel", "done"),
        Err("GenericError", {"error_code": 1, "message": "m"}),
        Err("GenericBatchError", "b"),
    ]
    states = [
        ReplayState("pending"),
        ReplayState("running"),
        ReplayState("completed", 5),
        ReplayState("canceled", 2),
        ReplayState("errored", "boom"),
    ]
    flt = OrchestrationFilter("List", ("a",), (("BySubscriber", P2), ("ByNamespace", "ns")))
    return {
        "ICRC16": [icrc16.to_candid(EVERY_VARIANT)],
        "ICRC16Map": [icrc16.map_to_candid(CONFIG)],
        "ReplayRegistration": [codec.replay_registration_to(reg)],
        "ReplayRegisterError": [{e.tag: e.payload} for e in errs],
        "ReplayRegisterResult": [[codec.result_to(r)] for r in [Ok(1), *errs]] + [[]],
        "ReplayState": [codec.state_to(s) for s in states],
        "ReplayStatus": [codec.status_to(STATUS)],
        "ReplayStatusUpdate": [codec.update_to(ReplayStatusUpdate(1, s)) for s in states],
        "CancelReplayError": [{e.tag: e.payload} for e in cerrs],
        "CancelReplayResult": [[codec.result_to(r)] for r in [Ok(4), *cerrs]] + [[]],
        "ReplayStatusUpdateResult": [
            codec.result_to(Ok(None)),
            {"Err": {"error_code": 1, "message": "x"}},
        ],
        "GetReplaysArgs": [
            codec.get_replays_to(GetReplays(P1, 10, flt)),
            codec.get_replays_to(GetReplays()),
        ],
        "OrchestrationFilter": [codec.filter_to(flt), codec.filter_to(OrchestrationFilter("All"))],
        "Event": [codec.event_to(ev)],
        "EventNotification": [codec.notification_to(notif)],
    }
