"""Every number option of ``loglake``: ``nan``, ``inf``, negative and absurd values are click's
one-line usage error naming the option (exit 2), before anything starts. Each case below was
taken before: a traceback, a hang, or a run that went wrong later (the comments say which).

Each group has a case run as a real ``loglake`` process; the rest go through click's runner with
the command's other arguments broken on purpose (a missing key file, a data dir that is a file,
a port nothing listens on), so that a value the option wrongly takes fails fast with exit 1
instead of starting a server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from loglake.cli import main

NOT_FINITE = ["nan", "inf", "-inf", "1e300"]


def _refused(code: int, output: str, option: str) -> None:
    """Exit 2 and one ``Error:`` line that names ``option``; no traceback."""
    assert code == 2, (code, output)
    assert "Traceback" not in output, output
    [line] = [x for x in output.splitlines() if x.startswith("Error:")]
    assert f"'{option}'" in line, line


def _loglake(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loglake.cli", *args], capture_output=True, text=True, timeout=60
    )


def _sweep(command: list[str], option: str, value: str, rest: list[str]) -> None:
    """``loglake COMMAND OPTION VALUE REST``: the option first, so that click checks it first."""
    r = CliRunner().invoke(main, [*command, option, value, *rest])
    _refused(r.exit_code, r.output, option)


# ---- loglake serve ---------------------------------------------------------------------------


def test_serve_retention_interval_nan_is_refused_by_the_real_command(tmp_path: Path) -> None:
    # took nan: the retention task died at start (retention never ran) and Ctrl-C ended in a
    # ValueError traceback ("cannot convert float NaN to integer"); here the service just ran
    r = _loglake("serve", "--data-dir", str(tmp_path / "d"), "--port", "0",
                 "--retention-interval", "nan")  # fmt: skip
    _refused(r.returncode, r.stderr, "--retention-interval")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("option", ["--retention-interval", "--seal-interval"])
@pytest.mark.parametrize("value", [*NOT_FINITE, "31536001", "0.05", "-1", "soon"])
def test_serve_periods(tmp_path: Path, option: str, value: str) -> None:
    # inf, 1e300: retention (or sealing) never ran
    (tmp_path / "file").write_text("")  # a data dir under a file: mkdir fails, exit 1
    _sweep(["serve"], option, value, ["--data-dir", str(tmp_path / "file" / "d"), "--port", "0"])
