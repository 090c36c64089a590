"""Descriptors and CREATE quotas against a real ``loglake serve`` under ``ulimit -n 1024``.

Before partitions opened lazily, a data dir of 20,000 partitions could not start under 1,024
descriptors (three per partition at open), and three CREATEs of 4,096 partitions took 12,307
descriptors, then failed with "internal error: OSError" leaving thousands of folders behind.
Bounded: 20,000 partitions are made as configs only (no partition folder until first use), a few
hundred are written; the whole test takes seconds on loopback."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from loglake.log import StreamConfig, open_log
from loglake.streams.client import StreamClient, StreamServiceError
from tests.procs import free_port, wait_port

FD_LIMIT = 1024
STREAMS, PARTITIONS = 5, 4000  # 20,000 partitions on disk
WRITTEN = 300  # partitions a client pushes to: more than the server keeps open (1024 // 8)
TOTAL_QUOTA = 28_000  # room for one more CREATE of 4,096, not two


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def serve(data: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(data), "--port",
         str(port), "--durability", "batch", "--limits-max-partitions-total", str(TOTAL_QUOTA)],
        preexec_fn=_low_fd_limit,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err.decode(errors="replace")


@pytest.fixture
def wide_data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with open_log(data) as log:
        for s in range(STREAMS):
            log.create_stream(f"w{s}", StreamConfig(partitions=PARTITIONS, durability="none"))
        for p in range(0, PARTITIONS, 40):  # a hundred partitions on disk from an earlier run
            log.append_payloads("w0", [b"old %d" % p], partition=p)
    return data


def test_20000_partitions_serve_under_ulimit_1024_and_create_quotas_hold(wide_data_dir) -> None:
    data = wide_data_dir
    port = free_port()
    proc = serve(data, port)
    peak = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], fds(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        wait_port(port, proc)
        sampler.start()
        # an attacker's three CREATEs of 4,096 beside a well-behaved client
        outcomes: list[str] = []

        def attack() -> None:
            with StreamClient(port=port, timeout=30) as a:
                for i in range(3):
                    try:
                        a.create_stream(f"attack{i}", 4096)
                        outcomes.append("created")
                    except StreamServiceError as e:
                        outcomes.append(str(e))

        attacker = threading.Thread(target=attack)
        attacker.start()
        with StreamClient(port=port, timeout=30) as good:
            good.create_stream("good")
            served = 0
            while attacker.is_alive() or served < 20:
                good.push("good", b"%d" % served)
                served += 1
            attacker.join(30)
            assert [m.data for m in good.pull("good", 0, 1000)] == [
                b"%d" % i for i in range(served)
            ]
            # pushes and pulls across more partitions than the server keeps open
            for p in range(WRITTEN):
                assert good.push("w1", b"new %d" % p, partition=p) == 0
            for p in range(WRITTEN):
                assert [m.data for m in good.pull("w1", 0, 10, partition=p)] == [b"new %d" % p]
            assert [m.data for m in good.pull("w0", 0, 10, partition=40)] == [b"old 40"]
            assert good.pull("w4", 0, 10, partition=PARTITIONS - 1) == []
            (info,) = good.info("w0")  # a stream's info without opening its 4,000 partitions
            assert len(info.partitions) == PARTITIONS
            assert [p.next_index for p in info.partitions[:81:40]] == [1, 1, 1]
        assert outcomes[0] == "created", outcomes
        for reason in outcomes[1:]:  # typed, readable, never "internal error"
            assert "max_partitions_total" in reason and "internal error" not in reason
        streams = sorted(p.name for p in (data / "streams").iterdir())
        assert "attack1" not in streams and "attack2" not in streams  # nothing half made
        sampling.set()
        sampler.join()
        # the log keeps at most 128 partitions open (up to four descriptors each): far from
        # 12,307, and under the limit the process runs with
        assert peak[0] < 700, peak[0]
        rc, err = stop(proc)
        assert rc == 0, err
        # restart under the same limit: it starts, and every acknowledged push survived the
        # partitions being closed and reopened on the way
        proc = serve(data, port)
        wait_port(port, proc)
        with StreamClient(port=port, timeout=30) as c:
            for p in range(0, WRITTEN, 7):
                assert [m.data for m in c.pull("w1", 0, 10, partition=p)] == [b"new %d" % p]
        rc, err = stop(proc)
        assert rc == 0 and "Traceback" not in err, err
    finally:
        sampling.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_data_dir_it_cannot_open_is_one_readable_line(tmp_path) -> None:
    """Restarting under a descriptor limit too low even to open the data dir: one line, no
    traceback (it was a raw traceback and rc 1)."""
    data = tmp_path / "data"
    with open_log(data) as log:
        log.create_stream("s")

    def tiny() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (12, 12))

    proc = subprocess.run(
        [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(data), "--port",
         str(free_port())],
        preexec_fn=tiny,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.strip()]) <= 2, err
