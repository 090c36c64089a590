"""Fuzz ICRC-16 values as Candid (``loglake.wire.icrc16``): ``decode`` (one ``ICRC16``),
``decode_map`` (an ``ICRC16Map``) and ``RawValue.decode`` (stored value bytes after our own
header), through both the compiled fast reader and icp_candid.

Typed error: ``ICRC16DecodeError``. Beyond "no crash": whatever decodes is a valid ICRC-16 value —
it encodes again (``encode`` validates first) and decodes back to an equal value — so the decoder
never accepts a value the rest of loglake refuses to write.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.wire import icrc16
from tests.events.samples import CONFIG, EVERY_VARIANT
from tests.fuzz import _harness

EXPECTED = (icrc16.ICRC16DecodeError,)
INSTRUMENT = (
    "loglake.wire.icrc16",
    "loglake.wire.candid",
    "loglake.wire.varint",
    "icp_candid",
)


def _same(a: object, b: object) -> bool:
    return a == b or repr(a) == repr(b)  # NaN floats compare unequal to themselves


def one(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 3, data[1:]
    if mode == 0:
        v = icrc16.decode(body)
        assert _same(icrc16.decode(icrc16.encode(v)), v)
    elif mode == 1:
        m = icrc16.decode_map(body)
        assert _same(icrc16.decode_map(icrc16.encode_map(m)), m)
    else:
        v = icrc16.RawValue(body).decode()
        assert _same(icrc16.decode(icrc16.encode(v)), v)


def seeds() -> list[bytes]:
    values = [EVERY_VARIANT, {"Nat": 0}, {"Text": ""}, {"Array": [{"Option": None}]}]
    out = [b"\x00" + icrc16.encode(v) for v in values]
    out += [b"\x01" + icrc16.encode_map(CONFIG), b"\x01" + icrc16.encode_map([])]
    out += [b"\x02" + icrc16.encode(v)[len(icrc16.MESSAGE_PREFIX) :] for v in values]
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
