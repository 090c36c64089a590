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
