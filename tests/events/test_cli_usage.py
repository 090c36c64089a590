"""``loglake events`` and a user's mistakes: a clear one-line error and a non-zero exit (2 for a
usage error), never a traceback (real role servers on loopback).

- ``serve`` on a port in use printed its "on http://…" banner, then a 30-line ``OSError``
  traceback; now one line, ``cannot listen on HOST:PORT: address already in use``, and the
  banner only once the port is bound.
- ``--url notaurl`` (or ``'http://[::1'``) on a client command was urllib's ``ValueError``
  traceback; now a usage error naming the option, and ``RoleUnreachable`` from the library.
- ``whoami`` took only ``--key``, so docs/events.md's walkthrough (``whoami --key-file``)
  failed at its second line; now the shared ``--key-file`` (``--key`` still taken).
- ``cancel`` of a replay the orchestrator refused (``NotFound``, ``CannotCancel``) printed the
  refusal and exited 0; now exit 1 when any id was refused.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from loglake.events.cli import command
from loglake.events.client import HttpEventsClient, RoleUnreachable, post_raw
from loglake.events.identity import Identity
from loglake.events.messages import ReplayState
from loglake.events.orchestrator import Replay
from tests.events.served import serve_orchestrator
from tests.events.test_cli_unreachable import COMMANDS
from tests.procs import free_port, wait_port

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events.md"
BAD_URLS = ["notaurl", "http://[::1", "ftp://127.0.0.1:1", "http://", "http://127.0.0.1:99999"]


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "me.key"
    path.write_text(Identity.generate().seed.hex())
    return path


# -- serve on a port in use ------------------------------------------------------------------


def _serve_broadcaster(tmp_path: Path, key: Path, port: int) -> list[str]:
    directory = tmp_path / "dir.json"
    directory.write_text("{}")
    orchestrator = Identity.generate().principal.to_str()
    return [
        sys.executable, "-m", "loglake.cli", "events", "serve", "--role", "broadcaster",
        "--key-file", str(key), "--port", str(port), "--directory", str(directory),
        "--orchestrator", orchestrator,
    ]  # fmt: skip


def test_serve_on_a_port_in_use_is_one_line_and_no_banner(tmp_path, key):
    with socket.create_server(("127.0.0.1", free_port())) as taken:
        port = taken.getsockname()[1]
        r = subprocess.run(
            _serve_broadcaster(tmp_path, key, port), capture_output=True, text=True, timeout=60
        )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == f"Error: cannot listen on 127.0.0.1:{port}: address already in use"
    assert "on http://" not in r.stdout, r.stdout  # the banner said it was serving


def test_serve_prints_its_banner_once_it_listens(tmp_path, key):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(
        _serve_broadcaster(tmp_path, key, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_port(port, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"on http://127.0.0.1:{port}; streams: none" in out, out


# -- a malformed --url ------------------------------------------------------------------------


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_a_malformed_url_is_a_usage_error_on_every_client_command(args, key):
    for url in BAD_URLS:
        r = CliRunner().invoke(command, [*args, "--url", url, "--key-file", str(key)])
        assert r.exit_code == 2, (url, r.output, r.exception)
        assert f"Invalid value for '--url': {url!r}: expected http(s)://host:port" in r.output
    # and from the environment variable
    r = CliRunner().invoke(
        command, [*args, "--key-file", str(key)], env={"LOGLAKE_EVENTS_URL": "notaurl"}
    )
    assert r.exit_code == 2, (r.output, r.exception)
    assert "Invalid value for '--url': 'notaurl'" in r.output


def test_a_malformed_url_in_a_subprocess_is_one_line(key):
    r = subprocess.run(
        [sys.executable, "-m", "loglake.cli", "events", "received", "--url", "http://[::1",
         "--key-file", str(key)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "Error: Invalid value for '--url': 'http://[::1': expected http(s)://host:port"
    )


@pytest.mark.parametrize("url", [*BAD_URLS, "http://a b:1", "http://127.0.0.1:1/\x01"])
def test_the_client_raises_role_unreachable_for_a_malformed_url(url):
    with pytest.raises(RoleUnreachable, match="not an http\\(s\\)://host:port URL") as e:
        post_raw(url, "loglake_inbox", b"", {}, 5)
    assert e.value.url == url
    with pytest.raises(RoleUnreachable):
        HttpEventsClient(url, Identity.generate(), timeout=5).call("loglake_inbox", (0, 1))


def test_a_url_with_a_path_or_upper_case_scheme_is_still_taken(key):
    """What urllib took before still goes through: only the call's outcome differs."""
    for url in (f"http://127.0.0.1:{free_port()}/prefix/", f"HTTP://127.0.0.1:{free_port()}"):
        r = CliRunner().invoke(command, ["replays", "--url", url, "--key-file", str(key)])
        assert r.exit_code == 1, r.output
        assert f"cannot reach {url}: connection refused" in r.output


# -- whoami --key-file, and the walkthrough of docs/events.md -------------------------------


def test_whoami_takes_the_shared_key_option(key):
    want = Identity.from_seed(bytes.fromhex(key.read_text())).principal.to_str()
    for args in (["--key-file", str(key)], ["--key", str(key)]):
        r = CliRunner().invoke(command, ["whoami", *args])
        assert r.exit_code == 0, r.output
        assert r.output.strip() == want
    r = CliRunner().invoke(command, ["whoami"], env={"LOGLAKE_EVENTS_KEY": str(key)})
    assert r.exit_code == 0 and r.output.strip() == want, r.output


def _walkthrough() -> list[list[str]]:
    """The arguments of every ``loglake events`` call in docs/events.md's "How to run it"."""
    text = DOCS.read_text().split("## How to run it", 1)[1]
    block = text.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    code = "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("#"))
    return [shlex.split(m) for m in re.findall(r"loglake events ([^;&)\n]+)", code)]


def test_the_walkthrough_of_the_docs_parses():
    """Each call's options exist and its values are taken (parsed, not run)."""
    calls = _walkthrough()
    assert {c[0] for c in calls} >= {"keygen", "whoami", "serve", "publish", "cancel"}, calls
    for name, *args in calls:
        sub = command.commands[name]
        sub.make_context(name, args)  # a usage error raises


# -- cancel's exit status ---------------------------------------------------------------------


def test_cancel_exits_1_when_any_id_is_refused(key):
    orch, url, stop = serve_orchestrator()
    try:
        me = Identity.from_seed(bytes.fromhex(key.read_text())).principal
        elsewhere = Identity.generate().principal  # its remove messages are dropped, unlisted
        for rid, status in ((7, ReplayState("running")), (8, ReplayState("completed", 10))):
            orch.replays[rid] = Replay(
                rid, me, "com.example.cli", 0, 10, [], elsewhere, elsewhere, 10, 0, 1, status
            )
        base = ["cancel", "--url", url, "--key-file", str(key)]
        r = CliRunner().invoke(command, [*base, "7"])
        assert (r.exit_code, r.output) == (0, "7: canceled\n"), (r.output, r.exception)
        r = CliRunner().invoke(command, [*base, "8", "99", "7"])
        assert r.exit_code == 1, (r.output, r.exception)
        assert r.output.splitlines() == [
            "8: CannotCancel: replay is already completed(10)",
            "99: NotFound",
            "7: CannotCancel: cancel already requested",
            "Error: 3 of 3 cancel(s) refused",
        ]
        r = CliRunner().invoke(command, [*base, "99"])
        assert r.exit_code == 1 and "99: NotFound" in r.output, r.output
    finally:
        stop()


def test_cancel_documents_its_exit_status():
    r = CliRunner().invoke(command, ["cancel", "--help"])
    assert "exit status 0 when every cancel was accepted, 1 when any was refused" in " ".join(
        r.output.split()
    )
    assert "exit status 1 if any was refused" in DOCS.read_text()
