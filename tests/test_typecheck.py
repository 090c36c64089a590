"""The library stays typed: mypy, as configured in pyproject.toml (every function annotated,
every body checked), reports nothing. Run here so CI holds it, not only ``make lint``.

Incremental, with mypy's cache in ``.mypy_cache`` (git-ignored), the one ``make lint`` uses too:
a fresh clone pays the whole check once, a rerun checks only what changed (mypy compares each
cached module with its source, by size and mtime, then by hash), so a stale cache cannot hide
an error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
