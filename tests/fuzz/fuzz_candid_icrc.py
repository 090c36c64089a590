"""Fuzz the Candid codecs of every ICRC-72/77 method loglake serves or calls
(``loglake.events.codec.METHODS``): each method's argument and result decoders, which run
``icrc16.candid_decode`` (the compiled fast reader for our own type tables, icp_candid for any
other) and then the converters into ``events.messages`` dataclasses.

Typed error: ``ICRC16DecodeError`` (a ``DecodeError``). The first input byte picks the method and
the direction; the rest is the Candid message.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.errors import DecodeError
from loglake.events.codec import METHODS
from loglake.events.messages import (
    Err,
    Event,
    EventNotification,
    GetReplays,
    Ok,
    OrchestrationFilter,
    Registration,
    ReplayRegistration,
    ReplayState,
    ReplayStatusUpdate,
)
from tests.events.samples import CONFIG, EVERY_VARIANT, P1, P2, STATUS
from tests.fuzz import _harness

EXPECTED = (DecodeError,)
INSTRUMENT = ("loglake.events.codec", "loglake.wire", "icp_candid")
NAMES = sorted(METHODS)


def one(data: bytes) -> None:
    if not data:
        return
    method = METHODS[NAMES[(data[0] >> 1) % len(NAMES)]]
    if data[0] & 1:
        method.decode_ret(data[1:])
    else:
        method.decode_arg(data[1:])


def _values() -> dict[str, tuple[list[object], list[object]]]:
    """Method name → (arguments, results) worth encoding as seeds."""
    ev = Event(3, 2, 1_700_000_000, "com.example.ns", EVERY_VARIANT, P2, [("k", {"Nat": 1})])
    note = EventNotification(9, 3, None, 5, "ns", {"Text": "d"}, None, P1, "a == 1")
    note2 = EventNotification(10, 4, 3, 6, "ns", EVERY_VARIANT, CONFIG, P2, None)
    states = [ReplayState("pending"), ReplayState("completed", 5), ReplayState("errored", "x")]
    flt = OrchestrationFilter("List", ("a",), (("BySubscriber", P2), ("ByNamespace", "ns")))
    results = [[Ok(1), None, Err("Unauthorized"), Err("ImproperConfig", "bad")]]
    return {
        "icrc72_register_publication": ([[Registration("ns", CONFIG, b"m")]], results),
        "icrc72_register_subscription": ([[Registration("ns", CONFIG)]], results),
        "icrc77_register_replay": (
            [[ReplayRegistration("ns", 0, 100, CONFIG, b"\x01" * 32)]],
            [*results, [Err("RangeTooLarge", "big")]],
        ),
        "icrc77_cancel_replay": ([[1, 2**70]], [[Ok(4), None, Err("CannotCancel", "done")]]),
        "icrc77_replay_status": (
            [[ReplayStatusUpdate(1, s) for s in states]],
            [[Ok(None), Err("GenericError", {"error_code": 1, "message": "m"})]],
        ),
        "icrc77_get_replays": (
            [GetReplays(P1, 10, flt), GetReplays()],
            [[STATUS, None]],
        ),
        "icrc72_update_publication": ([[("ns", "key", {"Nat": 1})]], [[Ok(True), None]]),
        "icrc1_balance_of": ([(P1, None), (P2, b"\x00" * 32)], [0, 2**80]),
        "icrc2_approve": ([(P2, 1000)], [Ok(5), Err("InsufficientFunds", {"balance": 1})]),
        "icrc72_publish": ([[ev]], results),
        "icrc72_confirm_notifications": ([[1, 2, 3]], [None, [Ok(1), None]]),
        "icrc72_handle_notification": ([[note, note2]], [2]),
        "loglake_publish": ([("ns", [(EVERY_VARIANT, CONFIG), ({"Nat": 1}, None)])], [[0, 1]]),
        "loglake_inbox": ([(0, 5), (2**64, 0)], [(7, [note, note2]), (0, [])]),
    }


def seeds() -> list[bytes]:
    out = []
    for name, (args, rets) in _values().items():
        k = NAMES.index(name) << 1
        for a in args:
            with contextlib.suppress(Exception):  # a sample the types cannot hold: no seed
                out.append(bytes((k,)) + METHODS[name].encode_arg(a))
        for r in rets:
            with contextlib.suppress(Exception):
                out.append(bytes((k | 1,)) + METHODS[name].encode_ret(r))
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
