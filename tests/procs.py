"""Ports and child processes for tests and benchmarks: one way to pick a loopback port, wait
for a server to listen, and stop what was started."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
