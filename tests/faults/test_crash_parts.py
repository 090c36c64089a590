"""SIGKILL crash lives for every durable part besides the log (issue 15 §3): 10 kills each here,
100 in ``benchmarks/crash_parts.py``. After each kill the part is reopened (its recovery runs)
and held to every acknowledgement so far (``tests/faults/parts.py`` states each part's
invariants; ``tests/faults/crash.py`` runs the lives). ``LOGLAKE_CRASH_SEED`` replays a seed."""

from __future__ import annotations

import os

import pytest

from tests.faults.crash import run_part
from tests.faults.parts import PARTS

KILLS = 10


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARTS))
def test_part_survives_sigkill(tmp_path, name):
    seed = int(os.environ.get("LOGLAKE_CRASH_SEED", "20261126"))
    fig = run_part(name, tmp_path / "root", KILLS, seed)  # raises on a broken invariant
    print(f"{name}: seed={seed} kills={fig.lives} acknowledged={fig.acks} checked={fig.checked}")
    assert fig.lives == KILLS
    assert fig.acks > 0, f"seed {seed}: {name} never acknowledged anything before its kills"
