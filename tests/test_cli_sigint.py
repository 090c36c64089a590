"""Ctrl-C (a real SIGINT to a real ``loglake`` process): a batch command ends with the one line
``interrupted`` and exit status 130, never ``Aborted!`` and status 1 nor a traceback; a server
ends with ``stopped`` and status 0, its way to stop (``loglake.clitools.interrupted``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _start(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    return subprocess.Popen(
        [sys.executable, "-m", "loglake.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # the SIGINT goes to this process alone
    )


def _interrupt_after(p: subprocess.Popen[str], stream: str, marker: str) -> tuple[str, str]:
    """SIGINT once ``marker`` shows on ``stream`` (the command is in its work), then its output."""
    pipe = p.stdout if stream == "stdout" else p.stderr
    assert pipe is not None
    seen = []
    for line in pipe:
        seen.append(line)
        if marker in line:
            break
    else:
        out, err = p.communicate(timeout=30)
        pytest.fail(f"exited {p.returncode} before {marker!r}: {''.join(seen)}{out}{err}")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    if stream == "stdout":
        out = "".join(seen) + out
    else:
        err = "".join(seen) + err
    return out, err


def _producing(data: Path) -> bool:
    """The producer's first records are in the log: it is in its work (for ~100 s more)."""
    streams = data / "streams"
    return streams.is_dir() and any(f.stat().st_size for f in streams.rglob("*.seg"))


def test_ctrl_c_in_a_batch_command_is_interrupted_and_130(tmp_path):
    """Found from outside: ``cardinal produce``, ``sds sim`` and ``node walkthrough`` ended
    ``Aborted!``, exit 1 (click's handling of KeyboardInterrupt), as a failure would."""
    data = tmp_path / "d"
    # 50,000 blocks: ~100 s of producing, and the chain built in ~2 s (a million took 37 s
    # to build and 7 s to let go of at exit: over the 30 s allowed on a loaded machine)
    p = _start("cardinal", "produce", "--blocks", "50000", "--topic", "t", "--data-dir", str(data))
    try:
        deadline = time.monotonic() + 60
        while not _producing(data) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None and _producing(data), p.communicate(timeout=30)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, (out, err)
    assert err.splitlines()[-1] == "interrupted", err
    assert "Aborted" not in err and "Traceback" not in err


def test_ctrl_c_stops_a_server_with_stopped_and_0(tmp_path):
    """The servers keep their way: SIGINT is how they are stopped (node/runner.py)."""
    p = _start("serve", "--data-dir", str(tmp_path / "d"), "--port", "0")
    try:
        out, err = _interrupt_after(p, "stderr", "Ctrl-C to stop")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, (out, err)
    assert err.splitlines()[-1] == "stopped" and "interrupted" not in err
