"""`loglake events` client commands pointed at a URL nothing answers on: one line naming the
URL and why, exit 1 — not urllib's ``URLError`` traceback (real processes, loopback only)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.procs import free_port

COMMANDS = [
    ["publish", "ns", "--text", "a"],
    ["register", "ns", "--timeout", "5"],
    ["subscribe", "ns"],
    ["replay", "ns", "--from", "0"],
    ["replay-status", "1"],
    ["cancel", "1"],
    ["replays"],
    ["approve", "aaaaa-aa", "5"],
    ["received"],
]


def _events(args: list[str], url: str, key: str, timeout: float = 60, **env: str):
    cmd = [sys.executable, "-m", "loglake.cli", "events", *args, "--url", url, "--key-file", key]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


@pytest.fixture
def key(tmp_path) -> str:
    from loglake.events.identity import Identity

    path = tmp_path / "me.key"
    path.write_text(Identity.generate().seed.hex())
    return str(path)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_a_closed_port_is_one_line_naming_the_url(args, key):
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    r = _events(args, url, key)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "URLError" not in r.stderr, r.stderr
    assert f"Error: cannot reach {url}: connection refused" in r.stderr, r.stderr


def test_a_server_that_never_answers_times_out_in_the_call_timeout(key):
    """It accepts the connection (the kernel does, from the backlog) and never answers: the
    call gives up after ``--call-timeout`` (here its environment variable) and says so."""
    with socket.create_server(("127.0.0.1", free_port())) as mute:
        url = f"http://127.0.0.1:{mute.getsockname()[1]}"
        for args in (["replay", "ns", "--from", "0"], ["received"]):
            t0 = time.monotonic()
            r = _events(args, url, key, timeout=30, LOGLAKE_EVENTS_CALL_TIMEOUT="1")
            took = time.monotonic() - t0
            assert r.returncode == 1, r.stderr
            assert "Traceback" not in r.stderr, r.stderr
            assert f"Error: cannot reach {url}: timed out (no answer)" in r.stderr, r.stderr
            assert took < 15, took  # 1 s of waiting plus the interpreter's start


def test_a_name_that_does_not_resolve_says_so(key):
    url = "http://loglake-no-such-host.invalid:1"  # .invalid never resolves (RFC 2606)
    r = _events(["replays"], url, key)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert f"Error: cannot reach {url}: host name not resolved" in r.stderr, r.stderr
