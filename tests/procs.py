"""Ports and child processes for tests and benchmarks: one way to pick a loopback port, wait
for a server to listen, and stop what was started."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_consecutive_ports(n: int) -> int:
    """The first of ``n`` consecutive loopback ports that were all free at once (bound together,
    then released), for a server that listens on ``port``, ``port + 1``, …. Why not
    ``free_port() + 1``: that second port was never checked, and a server of another test
    running beside it may hold it."""
    for _ in range(200):
        first = free_port()
        socks: list[socket.socket] = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free loopback ports")


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    """Return once something accepts on 127.0.0.1:``port``; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


@contextlib.contextmanager
def process(cmd: list[str], port: int, **popen) -> Iterator[subprocess.Popen]:
    """Start ``cmd``, wait until it listens on ``port``, stop it on exit."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    proc = subprocess.Popen(cmd, **popen)
    try:
        wait_port(port, proc)
        yield proc
    finally:
        stop(proc)
