"""Each differential fuzzer catches a bug planted in loglake (``tests/differential/plants.py``)
within its ``make test`` budget and seed: the evidence that the clean runs beside it mean
something. The long-run figures (inputs and seconds to the first catch) come from
``benchmarks/fuzz.py --plant NAME``."""

from __future__ import annotations

import pytest

from tests.differential.conftest import EXAMPLES, MAX_SECONDS, SEED
from tests.differential.fuzzers import FUZZERS
from tests.differential.peer import DiffPeer
from tests.differential.plants import PLANTS


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_the_fuzzer_catches_a_planted_bug(name: str, request: pytest.FixtureRequest) -> None:
    plant = PLANTS[name]
    fuzzer = FUZZERS[plant.fuzzer]
    peer: DiffPeer | None = request.getfixturevalue("peer") if fuzzer.needs_peer else None
    with plant.apply():
        out = fuzzer.run(
            peer, examples=EXAMPLES, seed=SEED, max_seconds=MAX_SECONDS, stop_at_first=True
        )
    assert out.disagreements, f"{plant.what}: not caught — {out.report()}"
