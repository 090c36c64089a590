"""Crash test (issue 3 §5): a ``batch``-durability writer process is SIGKILLed at random
moments; after each kill the data dir is reopened and every acknowledged record must be there,
byte-identical, with no partial record visible. ``benchmarks/crash.py`` runs 100 lives."""

from __future__ import annotations

import os

import pytest

from tests.log.crash_writer import run_cycles

RUNS = 20


@pytest.mark.slow
def test_acknowledged_records_survive_sigkill(tmp_path):
    seed = int(os.environ.get("LOGLAKE_CRASH_SEED", "20261123"))
    acked, stored = run_cycles(tmp_path, RUNS, seed)
    print(f"crash test seed={seed} runs={RUNS} acknowledged={acked} stored={stored}")
    assert acked > 0, f"seed {seed}: the writer never acknowledged anything"
    assert stored >= acked
