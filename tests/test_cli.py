"""The `loglake` command: every command and subcommand answers --help, errors are readable."""

from __future__ import annotations

import click
from click.testing import CliRunner

from loglake import __version__
from loglake.cli import main


def _walk(cmd: click.Command, path: tuple[str, ...] = ()):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _walk(sub, (*path, name))


PARTS = {"serve", "demo", "node", "log", "stream", "events", "cardinal", "archives", "sds", "job"}


def test_every_part_is_mounted():
    assert set(main.commands) == PARTS


def test_every_command_answers_help_with_a_description():
    runner = CliRunner()
    for path, cmd in _walk(main):
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output
        assert cmd.help and cmd.help.strip(), f"`loglake {' '.join(path)}` has no help text"
        assert cmd.help.split("\n")[0].strip()[:20] in " ".join(result.output.split())


def test_every_option_has_help():
    missing = [
        f"loglake {' '.join(path)} {p.opts[0]}"
        for path, cmd in _walk(main)
        for p in cmd.params
        if isinstance(p, click.Option) and not (p.help or "").strip()
    ]
    assert missing == []


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "No such command" in result.output


def test_typed_error_is_one_readable_line_and_a_bug_keeps_its_traceback():
    from loglake.clitools import TypedErrorGroup
    from loglake.errors import LoglakeError

    @click.group(cls=TypedErrorGroup)
    def g():
        """A group."""

    @g.command()
    def typed():
        """Fails on purpose."""
        raise LoglakeError("stream 'x' does not exist")

    @g.command()
    def bug():
        """Fails like a bug."""
        raise KeyError("oops")

    r = CliRunner().invoke(g, ["typed"])
    assert r.exit_code == 1
    assert r.output == "Error: stream 'x' does not exist\n"
    r = CliRunner().invoke(g, ["bug"])
    assert isinstance(r.exception, KeyError)


def test_a_part_run_alone_reports_typed_errors_readably(tmp_path):
    from loglake.events.cli import command as events

    r = CliRunner().invoke(events, ["whoami", "--key", str(tmp_path / "missing.key")])
    assert r.exit_code == 1
    assert r.output.startswith("Error: ") and "Traceback" not in r.output
