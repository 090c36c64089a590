"""``loglake stream …`` through click's CliRunner against a real server on loopback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from loglake.streams.cli import command
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService


@pytest.fixture
def run(memory_log):
    with BackgroundServer(StreamService(memory_log)) as srv:
        runner = CliRunner()

        def invoke(*args: str, input: str | None = None, ok: bool = True):
            r = runner.invoke(command, ["--port", str(srv.port), *args], input=input)
            if ok:
                assert r.exit_code == 0, r.output + repr(r.exception)
            return r

        yield invoke


def test_every_subcommand_has_help() -> None:
    runner = CliRunner()
    assert "create" in runner.invoke(command, ["--help"]).output
    for sub in ("create", "push", "pull", "index", "list", "info"):
        r = runner.invoke(command, [sub, "--help"])
        assert r.exit_code == 0 and "Usage" in r.output


def test_create_push_pull_as_json(run) -> None:
    doc = json.loads(run("create", "orders", "--partitions", "2", "--json").output)
    assert doc["stream"] == "orders" and set(doc["addresses"]) == {"0", "1"}
    doc = json.loads(run("push", "orders", "a", "b", "-p", "1", "--json").output)
    assert doc["indexes"] == [0, 1]
    doc = json.loads(run("pull", "orders", "-p", "1", "--from", "1", "--json").output)
    assert [(m["index"], m["data"]) for m in doc["messages"]] == [(1, "b")]


def test_push_from_stdin_and_tables(run) -> None:
    run("create", "logs")
    out = run("push", "logs", "--stdin", input="one\ntwo\n").output
    assert "one" in out and "two" in out
    out = run("pull", "logs").output
    assert "one" in out and "1" in out
    out = run("list").output
    assert "logs" in out
    out = run("info", "logs", "--json").output
    assert json.loads(out)["partitions"][0]["next_index"] == 2


def test_index_get_and_save(run) -> None:
    run("create", "s")
    assert json.loads(run("index", "c1", "s", "--json").output)["index"] == 0
    assert json.loads(run("index", "c1", "s", "--save", "5", "--json").output)["index"] == 5
    assert json.loads(run("index", "c1", "s", "--save", "2", "--json").output)["index"] == 5
    assert "index 5" in run("index", "c1", "s").output


def test_errors_are_readable(run) -> None:
    r = run("pull", "nope", ok=False)
    assert r.exit_code != 0
    assert "nope" in str(r.exception)
    r = run("push", "s", ok=False)
    assert r.exit_code == 2 and "nothing to push" in r.output


def test_server_max_frame_lets_a_push_use_the_servers_larger_limit(tmp_path) -> None:
    """A server started with ``--limits-max-frame`` 48 MiB takes a 33 MiB push; the CLI's
    client, which cannot learn the server's limit, refuses it before sending (``PushTooLarge``,
    one line, exit 1) unless ``--server-max-frame`` tells it the server's value."""
    import subprocess
    import sys

    from loglake.log import open_log
    from loglake.streams.client import SERVER_MAX_FRAME, StreamClient
    from loglake.streams.limits import MiB, ServerLimits

    big = b"x" * (SERVER_MAX_FRAME + MiB)  # one line of standard input, one push
    with (
        open_log(tmp_path / "data") as log,
        BackgroundServer(
            StreamService(log), port=0, limits=ServerLimits(max_frame=48 * MiB)
        ) as srv,
    ):

        def stream_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
            cmd = [sys.executable, "-m", "loglake.cli", "stream", "--port", str(srv.port)]
            return subprocess.run([*cmd, *args], input=big, capture_output=True, timeout=120)

        assert stream_cli("create", "big").returncode == 0
        refused = stream_cli("push", "big", "--stdin", "--json")
        lines = refused.stderr.decode().strip().splitlines()
        assert refused.returncode == 1 and len(lines) == 1, refused.stderr[-2000:]
        assert lines[0].startswith("Error: push 0: a frame of ")
        assert f"exceeds the server's limit of {SERVER_MAX_FRAME} bytes" in lines[0]
        assert "--server-max-frame" in lines[0]

        ok = stream_cli("push", "big", "--stdin", "--json", "--server-max-frame", "48MiB")
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert json.loads(ok.stdout)["indexes"] == [0]
        ok = stream_cli("--server-max-frame", str(48 * MiB), "push", "big", "--stdin", "--json")
        assert ok.returncode == 0 and json.loads(ok.stdout)["indexes"] == [1], ok.stderr[-2000:]
        with StreamClient(port=srv.port) as c:
            for i in (0, 1):  # a pull reply holds one message this large
                [m] = c.pull("big", i, 1)
                assert (m.index, m.data == big) == (i, True)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "expected a size of 64-4294967295 bytes (e.g. 32MiB), got '0'"),
        ("-5", "expected a size of 64-4294967295 bytes (e.g. 32MiB), got '-5'"),
        ("lots", "expected a size of 64-4294967295 bytes (e.g. 32MiB), got 'lots'"),
        ("5GiB", "expected a size of 64-4294967295 bytes (e.g. 32MiB), got '5GiB'"),
        ("4294967296", "expected a size of 64-4294967295 bytes (e.g. 32MiB), got '4294967296'"),
    ],
)
def test_server_max_frame_is_validated(value: str, says: str) -> None:
    for args in (["push", "s", "x", "--server-max-frame", value], ["--server-max-frame", value]):
        r = CliRunner().invoke(command, args)
        assert r.exit_code == 2, r.output
        assert "Invalid value for '--server-max-frame'" in r.output and says in r.output


def test_create_of_an_existing_stream_lists_every_partition(run) -> None:
    """Found from outside: ``create orders --partitions 2`` of a 5-partition stream listed
    partitions 0-1 only; now all five, and a note says how many it has."""
    run("create", "orders", "--partitions", "5")
    doc = json.loads(run("create", "orders", "--partitions", "2", "--json").output)
    assert set(doc["addresses"]) == {"0", "1", "2", "3", "4"} and doc["partitions"] == 5
    assert "stream has 5 partitions" in run("create", "orders", "--partitions", "2").output
    # asked as it is, the output is as it was: no note
    doc = json.loads(run("create", "orders", "--partitions", "5", "--json").output)
    assert doc == {"stream": "orders", "addresses": doc["addresses"]}


def test_timeout_bounds_the_wait_for_a_silent_service() -> None:
    """A peer that accepts and never answers held every command for a hard-coded 30 s."""
    import socket
    import time

    from loglake.cli import main

    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = str(silent.getsockname()[1])
        for args in (["--port", port, "--timeout", "0.5", "list"],
                     ["list", "--port", port, "--timeout", "0.5"]):  # fmt: skip
            t0 = time.monotonic()
            r = CliRunner().invoke(main, ["stream", *args])
            assert r.exit_code == 1 and "timed out" in r.output, r.output
            assert time.monotonic() - t0 < 10
    r = CliRunner().invoke(command, ["--timeout", "0", "list"])
    assert r.exit_code == 2 and "--timeout" in r.output
