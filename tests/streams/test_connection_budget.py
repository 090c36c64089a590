"""Idle connections cannot take the descriptors the log needs, against a real ``loglake serve``.

Before: the stream server's only bounds were its own caps (1,024 connections, 256 a peer), so
under ``ulimit -n 256`` one client's 300 idle connections took every descriptor the process
had, and a well-behaved client's next push to a partition not yet open failed (the log could
not open its files). Now every connection takes a place in the process's budget
(``streams.descriptors.CONNECTIONS``: a quarter of the soft limit); one past it is closed as
it is accepted, and the log keeps its share. A server also raises its soft limit to the hard
one at start."""

from __future__ import annotations

import contextlib
import resource
import socket
import subprocess
import sys
from pathlib import Path

from loglake.streams import descriptors
from loglake.streams.client import StreamClient
from tests.procs import free_port, wait_port
from tests.streams.test_storage_limits import stop

ATTACK = 300  # idle connections, more than the limit below
PARTITIONS = 40  # first pushes (each opens a partition's files) while they are held


def _serve(data: Path, port: int, soft: int, hard: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(data), "--port",
         str(port), "--durability", "batch"],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def _soft_limit_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


def test_idle_connections_leave_the_log_its_descriptors(tmp_path) -> None:
    port = free_port()
    proc = _serve(tmp_path / "data", port, 256, 256)  # the hard limit: nothing to raise to
    held: list[socket.socket] = []
    try:
        wait_port(port, proc)
        with StreamClient(port=port, timeout=30) as good:
            good.create_stream("s", PARTITIONS)
            for _ in range(ATTACK):
                with contextlib.suppress(OSError):
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            for p in range(PARTITIONS):
                assert good.push("s", b"p%d" % p, partition=p) == 0
            for p in range(PARTITIONS):
                assert [m.data for m in good.pull("s", 0, 10, partition=p)] == [b"p%d" % p]
        for s in held:
            s.close()
        rc, err = stop(proc)
        assert rc == 0 and "Traceback" not in err, err
        assert "descriptor limit (256)" in err, err  # the refusals are logged, with the cause
        assert "Too many open files" not in err, err
    finally:
        for s in held:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_server_raises_its_soft_descriptor_limit_to_the_hard_one(tmp_path) -> None:
    ours = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # a child's cannot be higher
    hard = 1024 if ours == resource.RLIM_INFINITY else min(ours, 1024)
    port = free_port()
    proc = _serve(tmp_path / "data", port, hard // 4, hard)
    try:
        wait_port(port, proc)
        assert _soft_limit_of(proc.pid) == hard
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_budget_is_a_quarter_of_the_soft_limit(monkeypatch) -> None:
    monkeypatch.setattr(descriptors, "soft_limit", lambda: 40)
    budget = descriptors.Connections()
    assert [budget.admit() for _ in range(12)] == [True] * 10 + [False] * 2
    assert (budget.open, budget.refused) == (10, 2)
    budget.release()
    assert budget.admit() and not budget.admit()
    for _ in range(20):  # more releases than admissions never count below zero
        budget.release()
    assert budget.open == 0


def test_a_refused_raise_tries_a_lower_limit_and_never_lowers_the_soft_one(monkeypatch) -> None:
    """An unlimited hard limit: 2**20 refused (macOS allows 10,240), then 10,240 taken; and a
    soft limit already above 10,240 is never lowered by the fallback."""
    calls = []
    state = {"soft": 256}

    def setrlimit(_which: int, limits: tuple[int, int]) -> None:
        calls.append(limits[0])
        if limits[0] > 10_240:
            raise ValueError("not allowed")
        state["soft"] = limits[0]

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    monkeypatch.setattr(
        resource, "getrlimit", lambda _which: (state["soft"], resource.RLIM_INFINITY)
    )
    assert descriptors.raise_soft_limit() == 10_240
    assert calls == [descriptors.UNLIMITED, 10_240]
    state["soft"], calls[:] = 20_000, []
    assert descriptors.raise_soft_limit() == 20_000
    assert calls == [descriptors.UNLIMITED]  # refused; 10,240 would have lowered it
