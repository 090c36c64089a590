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


def test_free_ports_are_outside_the_kernels_range_distinct_and_bindable() -> None:
    """Ports the kernel would give an outgoing connection meanwhile are never handed out (a
    node's stream port was taken so in a CI run), nor one port twice by one process."""
    import socket

    from tests.procs import _ephemeral_low, free_port

    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200
    assert all(1024 <= p < _ephemeral_low() for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_each_xdist_worker_has_its_own_ports(monkeypatch) -> None:
    from tests import procs

    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    slices = []
    for w in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", w)
        slices.append(set(procs._my_ports()))
    assert slices[0] and slices[1] and not slices[0] & slices[1]
