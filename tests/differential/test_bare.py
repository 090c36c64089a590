"""The stream service's BARE payloads against @bare-ts/lib by differential fuzzing (see
``tests/differential/bare.py``): same bytes both ways for every message, mutants accepted or
rejected alike by the schema decoder, the public entry points and the hot paths."""

from __future__ import annotations

from tests.differential.conftest import EXAMPLES, MAX_SECONDS, SEED
from tests.differential.fuzzers import FUZZERS
from tests.differential.peer import DiffPeer


def test_stream_payloads_agree_with_bare_ts(peer: DiffPeer) -> None:
    out = FUZZERS["bare"].run(peer, examples=EXAMPLES, seed=SEED, max_seconds=MAX_SECONDS)
    assert out.cases > 0
    assert not out.disagreements, out.report()
