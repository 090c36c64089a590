"""``loglake job seal --nats-creds``: a path that cannot be a ``.creds`` file is refused before
anything connects, in the words ``loglake serve --nats-creds`` uses for the same path (one
check, ``jetstream.check_creds_readable``). No NATS server is needed: nothing gets that far."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from loglake.cli import main

BACKEND = "nats://127.0.0.1:1"  # never dialled: every case is refused first


def _error(args: list[str]) -> tuple[int, str]:
    """The exit code and the one ``Error:`` line of ``loglake <args>``."""
    r = CliRunner().invoke(main, args)
    errors = [line for line in r.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, r.output + repr(r.exception)
    return r.exit_code, errors[0]


def _seal(tmp_path: Path, creds: str) -> tuple[int, str]:
    args = ["job", "seal", "--backend", BACKEND, "--data-dir", str(tmp_path / "seal")]
    return _error([*args, "--nats-creds", creds])


def _serve(tmp_path: Path, creds: str) -> tuple[int, str]:
    args = ["serve", "--backend", BACKEND, "--data-dir", str(tmp_path / "serve"), "--port", "0"]
    return _error([*args, "--nats-creds", creds])


def test_a_missing_creds_file_is_not_a_file(tmp_path: Path) -> None:
    """click's ``exists=True`` said ``File '…' does not exist.``; serve says "is not a file"."""
    missing = str(tmp_path / "nope.creds")
    code, line = _seal(tmp_path, missing)
    assert (code, line) == (2, f"Error: Invalid value for '--nats-creds': {missing} is not a file")
    assert (code, line) == _serve(tmp_path, missing)
    assert not (tmp_path / "seal").exists()


def test_a_directory_is_refused_as_serve_refuses_it(tmp_path: Path) -> None:
    code, line = _seal(tmp_path, str(tmp_path))
    assert code == 2
    assert line == f"Error: Invalid value for '--nats-creds': File '{tmp_path}' is a directory."
    assert (code, line) == _serve(tmp_path, str(tmp_path))


@pytest.mark.parametrize("length", [300, 5000])
def test_a_path_too_long_for_the_file_system_is_cut_and_says_why(
    tmp_path: Path, length: int
) -> None:
    """``ENAMETOOLONG``: click said the file "does not exist" and quoted the whole path (5,000
    characters on one line); now the reason, the path cut after 512 characters, as serve."""
    path = str(tmp_path / ("c" * length)) + ".creds"
    code, line = _seal(tmp_path, path)
    assert code == 2 and line.startswith("Error: Invalid value for '--nats-creds': ")
    assert line.endswith(": File name too long") and len(line) < 600
    assert "c" * 513 not in line
    if length == 5000:
        assert f"({len(path)} characters)" in line
    assert (code, line) == _serve(tmp_path, path)


def test_a_creds_file_without_nkeys_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-py signs with nkeys: without it the seal failed at connect, naming something else."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nkeys" else real(name, *a)
    )
    creds = tmp_path / "user.creds"
    creds.write_text("creds")
    code, line = _seal(tmp_path, str(creds))
    assert code == 2 and "a .creds file needs the nkeys package" in line
    assert (code, line) == _serve(tmp_path, str(creds))
