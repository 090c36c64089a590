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
