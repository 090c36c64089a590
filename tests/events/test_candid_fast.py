"""loglake.wire.candid (the one Candid decoder) agrees with icp_candid on every ICRC-77 sample
value (the wire part's own test covers ICRC-16 values; this one needs the events part's types)."""

from __future__ import annotations

from icp_candid import decode, encode

from loglake.events.candid_types import ICRC77_TYPES
from loglake.wire import candid
from tests.events.samples import candid_samples


def test_the_plan_and_icp_candid_agree_on_every_icrc77_sample():
    checked = 0
    for name, vs in candid_samples().items():
        t = ICRC77_TYPES[name]
        for v in vs:
            data = encode([{"type": t, "value": v}])
            assert candid.decode(data, [t]) == [decode(data, [t])[0]["value"]], name
            checked += 1
    assert checked > 10
