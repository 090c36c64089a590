"""SIGTERM or SIGINT while the node starts cuts the start short: what was bound is released
(ports, ``node.lock``), a token never shown is forgotten, and the process exits as a stopped
node does (code 0, "stopped"). It used to start every part, then stop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from loglake.node.config import load_config
from tests.procs import free_port


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the node exited before it took its lock"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_slow_backend_connect_stops_the_start(tmp_path: Path, sig) -> None:
    # A NATS "server" that accepts and never says anything: the node's connect waits for its
    # timeout (5 s by default, then the start fails). A signal then was read only after it.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        data = tmp_path / "data"
        cmd = [
            *(sys.executable, "-m", "loglake.cli", "node", "--data-dir", str(data)),
            *("--http-port", "0", "--no-streams-enabled"),
            *("--backend", f"nats://127.0.0.1:{silent.getsockname()[1]}"),
        ]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(data / "node.lock", proc)  # the signal handlers are in place by then
            time.sleep(0.5)  # into the connect
            sent = time.monotonic()
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=30)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert (proc.returncode, err.splitlines()[-1:]) == (0, ["stopped"]), err
    assert "Error" not in err and "Traceback" not in err, err
    assert took < 2.5, f"{took:.1f} s from the signal to the exit"
    assert not (data / "node.token").exists()  # made by this start, never shown: forgotten


def test_a_signal_between_parts_starts_no_further_part_and_releases_all(
    tmp_path: Path, monkeypatch
) -> None:
    from loglake.node.api.archives import ArchivesHandle
    from loglake.node.api.sds import SdsHandle
    from loglake.node.runner import lock_data_dir, run_until_signalled

    real_sds_start = SdsHandle.start.__func__  # type: ignore[attr-defined]
    archives_started = threading.Event()

    def slow_sds_start(cls, ctx, section):  # a part whose start takes a while
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        return real_sds_start(cls, ctx, section)

    def archives_start(cls, ctx, section):
        archives_started.set()
        raise AssertionError("a part was started after the signal")

    monkeypatch.setattr(SdsHandle, "start", classmethod(slow_sds_start))
    monkeypatch.setattr(ArchivesHandle, "start", classmethod(archives_start))
    stream_port = free_port()
    cfg = load_config(
        data={
            "data_dir": str(tmp_path),
            "console": False,
            "http": {"port": 0},
            "streams": {"port": stream_port},
            "sds": {"enabled": True},
            "archives": {"enabled": True},
        },
        env={},
    )
    said: list[str] = []
    t = time.monotonic()
    asyncio.run(asyncio.wait_for(run_until_signalled(cfg, say=said.append), 30))
    assert time.monotonic() - t < 10
    assert not archives_started.is_set()
    assert said == ["stopped"], said  # no banner: the node never served
    with socket.create_server(("127.0.0.1", stream_port)):  # the stream port is free again
        pass
    os.close(lock_data_dir(tmp_path))  # and node.lock
    assert not (tmp_path / "node.token").exists()
