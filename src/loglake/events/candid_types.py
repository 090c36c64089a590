"""ICRC-72 and ICRC-77 Candid types, as icp_candid type objects.

ICRC-77 types are written exactly as ``specs/icrc-77-event-replay.txt`` ("Type definitions") has
them, field names and tag case included (lowercase ``ReplayState`` tags). The ICRC-72 types
(``Event``, ``EventNotification``, registrations, ``OrchestrationFilter``, ``GenericError``)
follow the candidate icdevs/ICEventsWG ``draft_proposals_current/candidate-ICRC72-20240924.md``.

Types the ICRC-77 text uses but never defines (choices, also written in the ``.did`` files):

- ``ReplayId`` = ``nat`` (the text's ``MessageFulfillmentId = nat``).
- ``CancelReplayResult = opt variant { Ok : ReplayId; Err : CancelReplayError }`` — the shape of
  every other ICRC-72/77 batch result, and how PanIndustrial-Org/icrc72-subscriber-mo reads it.
- ``ReplayStatusUpdateResult = variant { Ok : null; Err : GenericError }`` as
  icdevsorg/icrc72-publisher-mo ``src/ICRC77Service.mo`` has it.
- ``OrchestrationFilter`` as the ICRC-72 candidate defines it (``statistics`` + ``slice``).
- ``ICRC16Property`` is ICRC-16's ``{name; value; immutable}`` (see loglake.wire.icrc16).
"""

from __future__ import annotations

from typing import Any

from icp_candid import Types

from loglake.wire.icrc16 import ICRC16, ICRC16_RAW_AWARE, ICRC16Map

Namespace = Types.Text
Timestamp = Types.Nat
EventIdentifier = Types.Nat
ReplayId = Types.Nat  # MessageFulfillmentId

GenericError = Types.Record({"error_code": Types.Nat, "message": Types.Text})

# --- ICRC-72 (candidate-ICRC72-20240924.md) --------------------------------------------------
Event = Types.Record(
    {
        "eventId": EventIdentifier,
        "prevEventId": Types.Opt(EventIdentifier),
        "timestamp": Timestamp,
        "namespace": Namespace,
        "data": ICRC16,
        "source": Types.Principal,
        "headers": Types.Opt(ICRC16Map),
    }
)
# icrc72_publish's argument: the Event whose `data` may be spliced from stored bytes
# (icrc16.RawValue); same Candid type, same type table as Event.
EventWire = Types.Record(
    {
        "eventId": EventIdentifier,
        "prevEventId": Types.Opt(EventIdentifier),
        "timestamp": Timestamp,
        "namespace": Namespace,
        "data": ICRC16_RAW_AWARE,
        "source": Types.Principal,
        "headers": Types.Opt(ICRC16Map),
    }
)
EventNotification = Types.Record(
    {
        "notificationId": Types.Nat,
        "eventId": Types.Nat,
        "prevEventId": Types.Opt(Types.Nat),
        "timestamp": Types.Nat,
        "namespace": Types.Text,
        "data": ICRC16,
        "headers": Types.Opt(ICRC16Map),
        "source": Types.Principal,
        "filter": Types.Opt(Types.Text),
    }
)
PublicationRegistration = Types.Record(
    {"namespace": Types.Text, "config": ICRC16Map, "memo": Types.Vec(Types.Nat8)}
)
SubscriptionRegistration = PublicationRegistration


def _register_error(unauthorized: str) -> Any:
    """The candidate's ``PublicationRegisterError`` / ``SubscriptionRegisterError``: the same
    cases but the one naming who is not authorised."""
    return Types.Variant(
        {
            "Unauthorized": Types.Null,
            unauthorized: Types.Record({"namespace": Namespace}),
            "ImproperConfig": Types.Text,
            "GenericError": GenericError,
            "GenericBatchError": Types.Text,
        }
    )


def _batch_result(ok: Any, err: Any) -> Any:
    """``opt variant { Ok : ok; Err : err }``: every ICRC-72/77 batch method's item result."""
    return Types.Opt(Types.Variant({"Ok": ok, "Err": err}))


PublicationRegisterError = _register_error("UnauthorizedPublisher")
SubscriptionRegisterError = _register_error("UnauthorizedSubscriber")
PublicationRegisterResult = _batch_result(Types.Nat, PublicationRegisterError)
SubscriptionRegisterResult = _batch_result(Types.Nat, SubscriptionRegisterError)
PublishError = Types.Variant(
    {
        "Unauthorized": Types.Null,
        "ImproperId": Types.Text,
        "Busy": Types.Null,
        "GenericError": GenericError,
        "GenericBatchError": Types.Text,
    }
)
PublishResult = _batch_result(Types.Vec(Types.Nat), PublishError)
# ConfirmationError is not defined by the candidate; we use the GenericError shape for it.
ConfirmationError = Types.Variant(
    {"NotFound": Types.Null, "Unauthorized": Types.Null, "GenericError": GenericError}
)
ConfirmationResult = Types.Variant(
    {
        "allAccepted": Types.Null,
        "itemized": Types.Vec(
            Types.Opt(Types.Variant({"Ok": Types.Null, "Err": ConfirmationError}))
        ),
    }
)
OrchestrationQuerySlice = Types.Variant(
    {
        "BySubscriber": Types.Principal,
        "ByPublisher": Types.Principal,
        "ByBroadcaster": Types.Principal,
        "ByNamespace": Types.Text,
    }
)
OrchestrationFilter = Types.Record(
    {
        "statistics": Types.Variant(
            {"None": Types.Null, "All": Types.Null, "List": Types.Vec(Types.Text)}
        ),
        "slice": Types.Vec(OrchestrationQuerySlice),
    }
)

# --- ICRC-77 (specs/icrc-77-event-replay.txt, "Type definitions") ----------------------------
ReplayRegistration = Types.Record(
    {
        "namespace": Types.Text,
        "range": Types.Tuple(Types.Nat, Types.Opt(Types.Nat)),
        "config": ICRC16Map,
        "memo": Types.Vec(Types.Nat8),
    }
)
ReplayRegisterError = Types.Variant(
    {
        "Unauthorized": Types.Null,
        "UnauthorizedSubscriber": Types.Record({"namespace": Namespace}),
        "ImproperConfig": Types.Text,
        "PaymentRequired": Types.Text,
        "RangeTooLarge": Types.Text,
        "GenericError": GenericError,
        "GenericBatchError": Types.Text,
        "PublicationNotFound": Types.Null,
        "SubscriptionNotFound": Types.Null,
    }
)
ReplayRegisterResult = _batch_result(ReplayId, ReplayRegisterError)
ReplayState = Types.Variant(
    {
        "pending": Types.Null,
        "running": Types.Null,
        "completed": Types.Nat,
        "canceled": Types.Nat,
        "errored": Types.Text,
    }
)
ReplayStatus = Types.Record(
    {
        "replayId": ReplayId,
        "namespace": Types.Text,
        "config": ICRC16Map,
        "stats": ICRC16Map,
        "range": Types.Tuple(Types.Nat, Types.Opt(Types.Nat)),
        "status": ReplayState,
    }
)
ReplayStatusUpdate = Types.Record({"replayId": ReplayId, "status": ReplayState})
CancelReplayError = Types.Variant(
    {
        "Unauthorized": Types.Null,
        "NotFound": Types.Null,
        "CannotCancel": Types.Text,
        "GenericError": GenericError,
        "GenericBatchError": Types.Text,
    }
)
CancelReplayResult = _batch_result(ReplayId, CancelReplayError)
ReplayStatusUpdateResult = Types.Variant({"Ok": Types.Null, "Err": GenericError})
GetReplaysArgs = Types.Record(
    {
        "prev": Types.Opt(Types.Principal),
        "take": Types.Opt(Types.Nat),
        "filter": Types.Opt(OrchestrationFilter),
    }
)

# --- ICRC-1 / ICRC-2 subset of the embedded ledger (ICRC-1, ICRC-2 standards) --------------
Account = Types.Record({"owner": Types.Principal, "subaccount": Types.Opt(Types.Vec(Types.Nat8))})
ApproveArgs = Types.Record(
    {
        "from_subaccount": Types.Opt(Types.Vec(Types.Nat8)),
        "spender": Account,
        "amount": Types.Nat,
        "expected_allowance": Types.Opt(Types.Nat),
        "expires_at": Types.Opt(Types.Nat64),
        "fee": Types.Opt(Types.Nat),
        "memo": Types.Opt(Types.Vec(Types.Nat8)),
        "created_at_time": Types.Opt(Types.Nat64),
    }
)
ApproveError = Types.Variant(
    {
        "BadFee": Types.Record({"expected_fee": Types.Nat}),
        "InsufficientFunds": Types.Record({"balance": Types.Nat}),
        "AllowanceChanged": Types.Record({"current_allowance": Types.Nat}),
        "Expired": Types.Record({"ledger_time": Types.Nat64}),
        "TooOld": Types.Null,
        "CreatedInFuture": Types.Record({"ledger_time": Types.Nat64}),
        "Duplicate": Types.Record({"duplicate_of": Types.Nat}),
        "TemporarilyUnavailable": Types.Null,
        "GenericError": GenericError,
    }
)
ApproveResult = Types.Variant({"Ok": Types.Nat, "Err": ApproveError})

# Every ICRC-77 type, by name (the interop test walks this table).
ICRC77_TYPES = {
    "ICRC16": ICRC16,
    "ICRC16Map": ICRC16Map,
    "ReplayRegistration": ReplayRegistration,
    "ReplayRegisterError": ReplayRegisterError,
    "ReplayRegisterResult": ReplayRegisterResult,
    "ReplayState": ReplayState,
    "ReplayStatus": ReplayStatus,
    "ReplayStatusUpdate": ReplayStatusUpdate,
    "CancelReplayError": CancelReplayError,
    "CancelReplayResult": CancelReplayResult,
    "ReplayStatusUpdateResult": ReplayStatusUpdateResult,
    "GetReplaysArgs": GetReplaysArgs,
    "OrchestrationFilter": OrchestrationFilter,
    "Event": Event,
    "EventNotification": EventNotification,
}
