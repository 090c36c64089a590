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


def test_the_cli_counts_what_a_skip_keeps_as_the_broadcaster_does():
    from hypothesis import given
    from hypothesis import strategies as st

    from loglake.events.cli import _checked_skip, _skip_keeps
    from loglake.events.filters import Skip

    @given(st.integers(1, 9), st.integers(0, 9), st.integers(0, 50), st.integers(0, 50))
    def check(mod, offset, start, n):
        kept = sum(Skip(mod, offset).keeps(i) for i in range(start, start + n))
        skip = _checked_skip(None, None, f"{mod},{offset}")
        assert _skip_keeps(skip, start, start + n) == kept

    check()


def test_serve_refuses_a_broadcaster_window_below_one_before_starting(tmp_path):
    """``--max-unconfirmed 0`` would answer every event Busy for ever: refused as a usage error
    (one line naming the option), before any key or port is touched."""
    base = ["serve", "--role", "broadcaster", "--key-file", str(tmp_path / "none.key")]
    base += ["--port", "1", "--directory", str(tmp_path / "none.json")]
    for bad in ("0", "-5", "many"):
        r = CliRunner().invoke(command, [*base, "--max-unconfirmed", bad])
        assert r.exit_code == 2, r.output
        assert "Invalid value for '--max-unconfirmed'" in r.output, r.output
    # a window of one is taken (the run then stops at the missing key file)
    r = CliRunner().invoke(command, [*base, "--max-unconfirmed", "1"])
    assert "--max-unconfirmed" not in r.output and "none.key" in r.output, r.output
