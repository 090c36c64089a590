"""Every decoder harness fuzzed for a short budget (issue 15 §2: ``make test`` runs a short
budget of each; ``benchmarks/fuzz.py`` runs ≥ 1,000,000 inputs each).

Each harness runs in its own process (``tests/fuzz/runner.py``), two at a time; a harness fails
its test if libFuzzer stopped on a failure (an exception other than the decoder's typed error, a
broken round-trip property, a hang past 10 s, memory past 2 GB). The failing input is kept under
the test's temporary folder and named in the message: add it to ``tests/fuzz/crashes/<name>/``
so ``test_regressions.py`` holds it.

``LOGLAKE_FUZZ_RUNS`` (default 2,000) sets the inputs per harness; each is also capped at 15 s
of fuzzing so a loaded machine does not stretch the suite.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fuzz import runner

RUNS = int(os.environ.get("LOGLAKE_FUZZ_RUNS", "2000"))
MAX_SECONDS = 15

pytestmark = pytest.mark.slow

KNOWN_FAILING: dict[str, str] = {}
"""Harnesses that find a failure in code another part owns: strict xfail until it is fixed."""


def _params() -> list:
    out = []
    for n in runner.HARNESSES:
        reason = KNOWN_FAILING.get(n)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(n, marks=marks))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, runner.Result]:
    out = tmp_path_factory.mktemp("fuzz")

    def go(name: str) -> runner.Result:
        return runner.run(name, RUNS, out / name, max_total_time=MAX_SECONDS)

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(runner.HARNESSES, pool.map(go, runner.HARNESSES), strict=True))


@pytest.mark.parametrize("name", _params())
def test_decoder_survives_fuzzing(results: dict[str, runner.Result], name: str) -> None:
    r = results[name]
    where = ", ".join(str(f["file"]) for f in r.findings)
    assert r.completed and r.returncode == 0, (
        f"fuzz_{name} stopped after {r.runs} inputs (exit {r.returncode}); input kept at "
        f"{where or '?'}\n{r.log[-4000:]}"
    )
    assert r.runs > 0


def test_every_harness_is_run() -> None:
    """A new ``fuzz_*.py`` is picked up by name; this guards the glob against an empty folder."""
    assert len(runner.HARNESSES) >= 15
    assert all(Path(runner.script(n)).exists() for n in runner.HARNESSES)
