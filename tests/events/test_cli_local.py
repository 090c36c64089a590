"""`loglake events` commands that need no running role."""

from __future__ import annotations

from click.testing import CliRunner

from loglake.events.cli import command
from loglake.events.identity import principal_from_text


def test_keygen_writes_a_key_and_whoami_prints_its_principal(tmp_path):
    key = tmp_path / "me.key"
    r = CliRunner().invoke(command, ["keygen", str(key)])
    assert r.exit_code == 0
    printed = r.output.strip()
    principal_from_text(printed)  # a valid principal text
    r = CliRunner().invoke(command, ["whoami", "--key", str(key)])
    assert r.output.strip() == printed
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    r = CliRunner().invoke(command, ["keygen", str(key)])
    assert r.exit_code != 0  # never overwrites a key


def test_every_command_has_help():
    for name in command.commands:
        r = CliRunner().invoke(command, [name, "--help"])
        assert r.exit_code == 0 and "Usage" in r.output, name
