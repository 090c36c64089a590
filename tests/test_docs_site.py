"""The documentation site builds with ``mkdocs build --strict``.

Strict mode turns every warning into a failure: a broken link between pages, a page left out of
the nav, or an API page whose ``:::`` target no longer imports. Running it in the suite keeps the
site true as the code and pages change.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    # mkdocs is a dev dependency (pyproject.toml), installed by `make test`: never skipped
    cmd = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "-d",
        str(tmp_path / "site"),
    ]
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "WARNING" not in output, output
    for part in ("streams", "node", "wire"):
        assert (tmp_path / "site" / "api" / part / "index.html").exists(), part
