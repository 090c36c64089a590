"""Inputs that once broke a decoder, kept as files and run through the same harness check
(in process, without atheris): ``tests/fuzz/crashes/<harness>/<name>.bin``.

A file listed in ``KNOWN`` is a failure in code this suite may not change (another part owns it):
its test is ``xfail(strict=True)`` naming the fix, so it turns red — and must be moved out of
``KNOWN`` — the day the decoder is fixed. Also here, fast: every harness's seeds (known-good
encodings) pass its own check, so a seed that stops decoding is caught without fuzzing.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.fuzz import _harness, runner

CRASHES = Path(__file__).resolve().parent / "crashes"

KNOWN: dict[str, str] = {}
"""Stored inputs whose decoder is not fixed yet (strict xfail naming the fix); empty."""


def _load(name: str):
    return importlib.import_module(f"tests.fuzz.fuzz_{name}")


def _cases() -> list:
    out = []
    for path in sorted(CRASHES.glob("*/*.bin")):
        key = f"{path.parent.name}/{path.name}"
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN[key])] if key in KNOWN else []
        out.append(pytest.param(path, id=key, marks=marks))
    return out


@pytest.mark.parametrize("path", _cases())
def test_stored_crash_input_gets_a_typed_error(path: Path) -> None:
    mod = _load(path.parent.name)
    _harness.check(mod.one, mod.EXPECTED)(path.read_bytes())


def test_known_failures_have_their_input_files() -> None:
    assert all((CRASHES / key).exists() for key in KNOWN)


@pytest.mark.parametrize("name", runner.HARNESSES)
def test_seeds_pass_their_harness(name: str) -> None:
    mod = _load(name)
    run = _harness.check(mod.one, mod.EXPECTED)
    seeds = list(mod.seeds())
    assert seeds
    for s in seeds:
        run(s)
