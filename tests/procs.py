"""Ports and child processes for tests and benchmarks: one way to pick a loopback port, wait
for a server to listen, and stop what was started."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections and port 0."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


_PORTS_HIGH = min(_ephemeral_low(), 32768)
_PORTS = range(max(1024, _PORTS_HIGH - 12000), _PORTS_HIGH)
_handed: set[int] = set()


def _my_ports() -> range:
    """This process's share of ``_PORTS``: one slice per pytest-xdist worker, so two workers
    never hand out the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    k = int(worker) % count if worker.isdigit() else 0
    size = len(_PORTS) // count
    return range(_PORTS.start + k * size, _PORTS.start + (k + 1) * size)


def free_port() -> int:
    """A loopback port free now, for a server a test starts, below the kernel's ephemeral
    range, from this xdist worker's slice, and not handed out before by this process. Why:
    a port the kernel chose (bind to 0) is one it also gives any process's outgoing
    connection, and in the time between this call and the server's bind one did (a node's
    stream port taken in a fresh-clone CI run: "address already in use")."""
    ports = _my_ports()
    start = random.randrange(len(ports))
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        return port
    _handed.clear()  # every port of the slice handed out once: start over
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


def _tail(out: Any, limit: int = 4000) -> str:
    """The end of what a child wrote to ``out`` (a file given as its stderr), for the error
    that says it exited: without it a start that fails once in a CI run leaves no cause."""
    try:
        if isinstance(getattr(out, "name", None), str):
            out.flush()
            data = Path(out.name).read_bytes()
        elif hasattr(out, "seek"):
            out.seek(0)
            data = out.read()
        else:
            return "(its stderr was not kept)"
    except (OSError, ValueError) as e:
        return f"(its stderr could not be read: {e})"
    text = data[-limit:].decode(errors="replace") if isinstance(data, bytes) else data[-limit:]
    return text.strip() or "(its stderr is empty)"


@contextlib.contextmanager
def process(cmd: list[str], port: int, **popen) -> Iterator[subprocess.Popen]:
    """Start ``cmd``, wait until it listens on ``port``, stop it on exit. Its stderr, unless
    the caller takes it, goes to a temporary file whose end an early exit reports."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    with contextlib.ExitStack() as files:
        if "stderr" not in popen:
            popen["stderr"] = files.enter_context(tempfile.TemporaryFile())
        proc = subprocess.Popen(cmd, **popen)
        try:
            try:
                wait_port(port, proc)
            except RuntimeError as e:
                raise RuntimeError(f"{e}; its stderr ends:\n{_tail(popen['stderr'])}") from None
            yield proc
        finally:
            stop(proc)
