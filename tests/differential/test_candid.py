"""loglake's Candid codec against @dfinity/candid by differential fuzzing (see
``tests/differential/candid.py``): random types and values both ways, and byte mutants — of
the values, and anywhere in the message, type table included — accepted or rejected alike
with equal values."""

from __future__ import annotations

from tests.differential.conftest import EXAMPLES, MAX_SECONDS, SEED
from tests.differential.fuzzers import FUZZERS
from tests.differential.peer import DiffPeer


def test_candid_agrees_with_dfinity_candid(peer: DiffPeer) -> None:
    out = FUZZERS["candid"].run(peer, examples=EXAMPLES, seed=SEED, max_seconds=MAX_SECONDS)
    assert out.cases > 0
    assert not out.disagreements, out.report(10)


def test_candid_batches_agree_with_dfinity_candid(peer: DiffPeer) -> None:
    """Long batches through the codec's batch executor (``candid_batches.py``)."""
    out = FUZZERS["candid-batches"].run(peer, examples=EXAMPLES, seed=SEED, max_seconds=MAX_SECONDS)
    assert out.cases > 0
    assert not out.disagreements, out.report(10)
