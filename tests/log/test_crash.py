"""Crash test (issue 3 §5): a ``batch``-durability writer process is SIGKILLed at random
moments; after each kill the data dir is reopened and every acknowledged record must be there,
byte-identical, with no partial record visible. ``benchmarks/crash.py`` runs 100 lives.

A SIGKILL leaves the kernel's page cache intact, so this test would pass with every fsync of the
log removed: it checks recovery from a dead process, not durability. Power loss (what an fsync
is for) is simulated in ``tests/log/test_power_loss.py`` on ``tests/log/simdisk.py``, which also
shows that its checker fails when fsync does nothing."""

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
