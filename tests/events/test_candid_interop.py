"""Cross-check our Candid with @dfinity/candid, by value, both ways (FIELD-NOTES "Candid").

For every ICRC-77 type (and the ICRC-72 Event/EventNotification the replay data plane uses):
the Node script interop/node/candid_icrc77.mjs, which declares the types with @dfinity/candid
as specs/icrc-77-event-replay.txt writes them, decodes our bytes to the same value, and we
decode its bytes to the same value. Bytes are not compared: type tables may differ legally.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from icp_candid import encode

from loglake.events.candid_types import ICRC77_TYPES
from loglake.wire.icrc16 import candid_decode
from tests.conftest import require_peer
from tests.events.candid_json import typed
from tests.events.samples import candid_samples

pytestmark = pytest.mark.interop
NODE_DIR = Path(__file__).resolve().parents[2] / "interop" / "node"


def _node(requests: list[dict]) -> list[dict]:
    require_peer(
        "node + @dfinity/candid",
        shutil.which("node") is not None and (NODE_DIR / "node_modules" / "@dfinity").exists(),
        "make node-deps",
    )
    out = subprocess.run(
        ["node", "candid_icrc77.mjs"],
        cwd=NODE_DIR,
        input=json.dumps(requests).encode(),
        capture_output=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_every_icrc77_type_is_sampled():
    assert set(candid_samples()) == set(ICRC77_TYPES)


def test_dfinity_candid_decodes_our_bytes_and_we_decode_theirs():
    cases = [(name, v) for name, vs in candid_samples().items() for v in vs]
    ours = [encode([{"type": ICRC77_TYPES[n], "value": v}]) for n, v in cases]
    requests = [
        {"op": "decode", "type": n, "hex": b.hex()} for (n, _), b in zip(cases, ours, strict=True)
    ]
    requests += [{"op": "encode", "type": n, "value": typed(ICRC77_TYPES[n], v)} for n, v in cases]
    answers = _node(requests)
    assert len(answers) == 2 * len(cases)
    for (name, v), ans in zip(cases, answers[: len(cases)], strict=False):
        assert "error" not in ans, (name, ans)
        assert ans["value"] == typed(ICRC77_TYPES[name], v), name
    for (name, v), ans in zip(cases, answers[len(cases) :], strict=False):
        assert "error" not in ans, (name, ans)
        theirs = candid_decode(bytes.fromhex(ans["hex"]), [ICRC77_TYPES[name]])[0]
        assert typed(ICRC77_TYPES[name], theirs) == typed(ICRC77_TYPES[name], v), name


def test_dfinity_candid_rejects_what_our_validator_rejects():
    # icp-py-core would encode True as a nat; @dfinity/candid refuses it, and so do we.
    ans = _node([{"op": "encode", "type": "ICRC16", "value": {"Nat": True}}])
    assert "error" in ans[0]


def test_principals_agree_with_dfinity_principal():
    from loglake.events.identity import Identity, PrincipalError, principal_from_text

    ids = [Identity.generate() for _ in range(5)]
    upper = ids[0].principal.to_str().upper()
    reqs = [{"op": "principal", "der": i.public_der.hex()} for i in ids]
    reqs.append({"op": "parse_principal", "text": upper})
    ans = _node(reqs)
    for i, a in zip(ids, ans, strict=False):
        assert a["text"] == i.principal.to_str()
        assert principal_from_text(a["text"]) == i.principal
    assert "error" in ans[-1]  # @dfinity/principal rejects upper case ...
    with pytest.raises(PrincipalError):  # ... and so do we
        principal_from_text(upper)


# -- the fast encoder of the replay data plane (loglake.events.fastcodec) ------------------------
def _finite_notifications():
    from hypothesis import strategies as st

    from tests.events.test_fastcodec import notifications

    return st.lists(notifications, min_size=40, max_size=40)


def _check_batch_with_dfinity(kind: str, items: list, to_value, t, encode_fast) -> None:
    from hypothesis import assume

    ours = encode_fast(items)
    want = typed(t, [to_value(x) for x in items])
    try:  # JSON carries no infinities (the Node harness reads JSON)
        json.dumps(want, allow_nan=False)
    except ValueError:
        assume(False)
    [dec, enc] = _node(
        [
            {"op": "decode", "type": kind, "hex": ours.hex()},
            {"op": "encode", "type": kind, "value": want},
        ]
    )
    assert "error" not in dec, dec
    assert _same(dec["value"], want)  # @dfinity/candid reads our bytes as the same values
    assert "error" not in enc, enc
    theirs = candid_decode(bytes.fromhex(enc["hex"]), [t])[0]
    assert typed(t, theirs) == want  # and writes the same values


def _same(a, b) -> bool:
    """Equal JSON, where JavaScript may print an integral float64 without a fraction."""
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b or float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


ALL = list(__import__("hypothesis").HealthCheck)


def test_dfinity_candid_decodes_fast_notification_batches_value_for_value():
    from hypothesis import Phase, given, settings
    from icp_candid import Types

    from loglake.events import candid_types as T
    from loglake.events.codec import notification_to
    from loglake.events.fastcodec import encode_notifications

    @settings(max_examples=4, deadline=None, phases=[Phase.generate], suppress_health_check=ALL)
    @given(_finite_notifications())
    def check(notes):
        _check_batch_with_dfinity(
            "EventNotificationBatch",
            notes,
            notification_to,
            Types.Vec(T.EventNotification),
            encode_notifications,
        )

    check()


def test_dfinity_candid_decodes_fast_event_batches_value_for_value():
    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st
    from icp_candid import Types

    from loglake.events.codec import EventWire, event_to
    from loglake.events.fastcodec import encode_events
    from tests.events.test_fastcodec import events

    @settings(max_examples=3, deadline=None, phases=[Phase.generate], suppress_health_check=ALL)
    @given(st.lists(events, min_size=40, max_size=40))
    def check(evs):
        _check_batch_with_dfinity("EventBatch", evs, event_to, Types.Vec(EventWire), encode_events)

    check()
