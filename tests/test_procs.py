"""The suite's process helper: a server that exits before it listens fails the test with the end
of what it wrote to stderr (the only trace a once-in-a-run start failure leaves)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.procs import free_port, process

DIES = [sys.executable, "-c", "import sys; sys.stderr.write('x' * 9000 + 'the cause'); sys.exit(3)"]


def test_an_early_exit_reports_the_end_of_its_stderr() -> None:
    with (
        pytest.raises(RuntimeError, match=r"exited with 3 .*\n.*the cause") as e,
        process(DIES, free_port()),
    ):
        pass
    assert len(str(e.value)) < 4200  # the end, not the whole


def test_an_early_exit_reports_a_stderr_file_the_caller_gave(tmp_path: Path) -> None:
    with (
        (tmp_path / "err").open("w") as f,
        pytest.raises(RuntimeError, match="the cause"),
        process(DIES, free_port(), stderr=f),
    ):
        pass
