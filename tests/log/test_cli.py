"""``loglake log`` (src/loglake/log/cli.py), driven through click's runner on a real data dir."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from loglake.log import CorruptSegment, LogLocked, StreamConfig, open_log
from loglake.log.cli import command


@pytest.fixture
def data_dir(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(partitions=2, segment_bytes=400, retention_records=3))
        for i in range(30):
            log.append("s", b"rec-%d" % i, key=b"k")
    return tmp_path


def run(*args: str):
    return CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=True)


@pytest.mark.parametrize("sub", [[], ["info"], ["read"], ["verify"], ["retention"]])
def test_help_everywhere(sub):
    res = run(*sub, "--help")
    assert res.exit_code == 0 and "Usage" in res.output


def test_info_json(data_dir):
    res = run("info", "--data-dir", data_dir, "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [(r["stream"], r["partition"], r["next_index"]) for r in rows] == [
        ("s", 0, 30),
        ("s", 1, 0),
    ]
    assert "stream" in run("info", "--data-dir", data_dir).output


def test_read_json_and_table(data_dir):
    res = run("read", "--data-dir", data_dir, "s", "--from", "28", "--json")
    assert [bytes.fromhex(r["data"]) for r in json.loads(res.output)] == [b"rec-28", b"rec-29"]
    assert "rec-5" in run("read", "--data-dir", data_dir, "s", "--from", "5", "-n", "1").output


def test_verify_passes_then_names_the_damaged_file(data_dir):
    res = run("verify", "--data-dir", data_dir, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["records"] == 30
    seg = sorted((data_dir / "streams" / "s" / "0").glob("*.seg"))[0]
    raw = bytearray(seg.read_bytes())
    raw[30] ^= 0xFF
    seg.write_bytes(bytes(raw))
    res = run("verify", "--data-dir", data_dir)
    assert isinstance(res.exception, CorruptSegment) and res.exception.path == str(seg)


def test_retention_needs_the_writer_lock(data_dir):
    """Found from outside: beside a running writer it said "... locked by another writer; open
    it with readonly=True to read it", an API's hint; now the words of ``verify --repair``."""
    with open_log(data_dir):
        res = run("retention", "--data-dir", data_dir)
        assert res.exit_code == 1 and not isinstance(res.exception, LogLocked)
        assert res.output == (
            f"Error: data directory {data_dir} is in use by a writer (a running `loglake "
            "serve`?): stop it, then run `loglake log retention` again\n"
        )
    res = run("retention", "--data-dir", data_dir)
    assert res.exit_code == 0 and "retention applied: 0" in res.output  # the lake keeps it


@pytest.mark.parametrize("sub", ["info", "read", "verify", "retention"])
def test_an_absent_data_dir_is_an_error_not_an_empty_log(tmp_path, sub):
    res = run(sub, "--data-dir", tmp_path / "nonexistent")
    assert res.exit_code == 2
    assert "does not exist" in res.output


@pytest.mark.parametrize(
    "args", [["info"], ["read", "s"], ["verify"]], ids=["info", "read", "verify"]
)
def test_a_file_system_refusal_in_the_log_is_one_line_naming_the_path(data_dir, args):
    """Found from outside: a segment that was a directory (``open`` of one succeeds, its first
    read fails) printed ``Error: Is a directory``: an error of a read on a descriptor names no
    file. The main command prints it as one line with the path."""
    from loglake.cli import main

    seg = sorted((data_dir / "streams" / "s" / "0").glob("*.seg"))[-1]
    seg.unlink()
    seg.mkdir()
    res = CliRunner().invoke(main, ["log", *args, "--data-dir", str(data_dir)])
    assert res.exit_code == 1
    assert res.output == f"Error: Is a directory: {seg}\n"


def test_a_read_error_of_a_segment_names_it(data_dir):
    seg = sorted((data_dir / "streams" / "s" / "0").glob("*.seg"))[-1]
    seg.unlink()
    seg.mkdir()
    for readonly in (True, False):
        with pytest.raises(IsADirectoryError) as e, open_log(data_dir, readonly=readonly) as log:
            log.read("s", 0)
        assert e.value.filename == str(seg)


@pytest.mark.parametrize("sub", ["info", "verify", "retention"])
def test_a_folder_that_is_no_log_is_refused_and_left_alone(tmp_path, sub):
    """Found from outside: any existing folder was taken for a data dir: ``verify`` of a wrong
    folder said "ok: 0 records", ``retention`` wrote a lock, index files and ``streams/`` into
    it. Now a one-line error naming it, and the folder as it was."""
    (tmp_path / "notes.txt").write_text("mine")
    r = CliRunner().invoke(command, [sub, "--data-dir", str(tmp_path)])
    assert r.exit_code == 2 and "not a loglake data directory" in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
