"""Bad values for ``loglake archives`` options: click's one-line usage error, exit status 2, no
traceback, nothing built or fetched."""

from __future__ import annotations

import random
import time

import pytest
from click.testing import CliRunner
from coincurve import PrivateKey

from loglake.archives.cli import command
from loglake.archives.control import ControlNode
from loglake.archives.errors import ArchiveConfigError, CorruptStore
from loglake.archives.layout import NS, get_layout
from loglake.archives.store import MessageStore
from loglake.log import MemoryLog, open_log
from loglake.streams.api import LocalStreams

from .helpers import START, WEEK, fill_weeks, record

BAD_TIMES = ["inf", "-inf", "nan", "1e300", "1e12", "-1", "9999-12-31", "next tuesday"]
"""Past 2262 (``1e12`` s, year 9999), before 1970, not numbers, not times."""


def _usage_error(r, option: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    [line] = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert option in line, line


@pytest.mark.parametrize("value", BAD_TIMES)
def test_build_now_outside_1970_to_2262_is_a_usage_error(tmp_path, value):
    # --now inf, 1e300: OverflowError traceback; --now 1e13: 7-day windows planned one by one
    # up to then (2.8 GB, 9 s), then the same traceback
    key = tmp_path / "key"
    key.write_text(PrivateKey().to_hex())
    log = open_log(tmp_path / "log")
    fill_weeks(log, "community", get_layout("spec"), range(1), 5, size=10)
    log.close()
    root = tmp_path / "archives"
    t0 = time.monotonic()
    r = CliRunner().invoke(
        command,
        ["build", "--data-dir", str(tmp_path / "log"), "--root", str(root),
         "--key-file", str(key), "--now", value],
    )  # fmt: skip
    _usage_error(r, "--now")
    assert time.monotonic() - t0 < 5
    assert not list(root.glob("*/index"))


@pytest.mark.parametrize("option", ["--since", "--until"])
@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "-5"])
def test_fetch_range_outside_1970_to_2262_is_a_usage_error(tmp_path, option, value):
    magnet = "magnet:?xt=urn:btih:" + "ee" * 20
    r = CliRunner().invoke(
        command,
        ["fetch", "--magnet", magnet, "--root", str(tmp_path / "m"), "--timeout", "1",
         option, value],
    )  # fmt: skip
    _usage_error(r, option)


def test_good_times_still_parse(tmp_path):
    key = tmp_path / "key"
    key.write_text(PrivateKey().to_hex())
    log = open_log(tmp_path / "log")
    fill_weeks(log, "community", get_layout("spec"), range(2), 5, size=10)
    log.close()
    for now in (str((START + WEEK) // NS), "2020-01-15T00:00:00", "2020-01-15T00:00:00+00:00"):
        r = CliRunner().invoke(
            command,
            ["build", "--data-dir", str(tmp_path / "log"), "--root", str(tmp_path / now),
             "--key-file", str(key), "--now", now],
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        assert r.output.strip().splitlines()[-1].startswith("magnet:?")


@pytest.mark.parametrize("now_ns", [10**22, -1, 2**63])
def test_control_node_build_refuses_a_now_past_int64_nanoseconds(tmp_path, now_ns):
    layout = get_layout("spec")
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(1), 5, size=10)
    control = ControlNode(tmp_path, PrivateKey(), layout, MessageStore())
    control.ingest_streams(LocalStreams(log), "community")
    t0 = time.monotonic()
    with pytest.raises(ArchiveConfigError, match="is outside 0"):
        control.build(now_ns)
    assert time.monotonic() - t0 < 1 and control.entries == []


def _follow(tmp_path, *extra: str) -> list[str]:
    return ["follow", "--data-dir", str(tmp_path / "log"), "--community", "0x02" + "11" * 32,
            "--root", str(tmp_path / "member"), "--duration", "1", *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--wait", "nan"], "--wait"),  # ValueError traceback
        (["--wait", "inf"], "--wait"),  # OverflowError traceback
        (["--wait", "-1"], "--wait"),
        (["--poll", "-1"], "--poll"),  # ValueError from time.sleep after the first poll
        (["--poll", "0"], "--poll"),
        (["--timeout", "nan"], "--timeout"),
        (["--timeout", "inf"], "--timeout"),  # a metadata wait without end
        (["--duration", "nan"], "--duration"),  # a loop that never ran, exit 0
        (["--wait", "1e300"], "--wait"),  # OverflowError traceback: past a year
        (["--poll", "1e300"], "--poll"),  # OverflowError traceback from time.sleep
        (["--timeout", "1e300"], "--timeout"),
        (["--wait", "soon"], "--wait"),
    ],
)
def test_follow_durations_not_finite_or_negative_are_usage_errors(tmp_path, extra, option):
    open_log(tmp_path / "log").close()
    t0 = time.monotonic()
    r = CliRunner().invoke(command, _follow(tmp_path, *extra))
    _usage_error(r, option)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("value", ["host:abc", "127.0.0.1", "127.0.0.1:0", "h:70000", "h:-1"])
def test_connect_and_peer_not_host_port_are_usage_errors(tmp_path, value):
    # --connect host:abc and seed --peer foo were ValueError tracebacks
    open_log(tmp_path / "log").close()
    r = CliRunner().invoke(
        command,
        ["follow", "--connect", value, "--community", "0x02" + "11" * 32,
         "--root", str(tmp_path / "member"), "--duration", "1"],
    )  # fmt: skip
    _usage_error(r, "--connect")
    key = tmp_path / "key"
    key.write_text(PrivateKey().to_hex())
    r = CliRunner().invoke(
        command, ["seed", "--root", str(tmp_path), "--key-file", str(key), "--peer", value]
    )
    _usage_error(r, "--peer")


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "1e300"])
def test_run_check_every_not_a_positive_finite_duration_is_a_usage_error(tmp_path, value):
    # nan or -1 made the control loop run without a pause until --duration
    key = tmp_path / "key"
    key.write_text(PrivateKey().to_hex())
    open_log(tmp_path / "log").close()
    t0 = time.monotonic()
    r = CliRunner().invoke(
        command,
        ["run", "--data-dir", str(tmp_path / "log"), "--root", str(tmp_path / "arch"),
         "--key-file", str(key), "--check-every", value, "--duration", "2"],
    )  # fmt: skip
    _usage_error(r, "--check-every")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("content", ["random", "text", "truncated store"])
@pytest.mark.parametrize("sub", ["fetch", "ls"])
def test_a_store_file_that_is_not_a_store_is_one_line_and_left_as_it_was(tmp_path, content, sub):
    # apsw.NotADBError ("file is not a database") was a traceback
    junk = tmp_path / "junk.sqlite"
    if content == "random":
        junk.write_bytes(random.Random(7).randbytes(5000))
    elif content == "text":
        junk.write_text("not a database\n" * 300)
    else:
        s = MessageStore(tmp_path / "real.sqlite")
        s.add([get_layout("spec").decode_record(record(get_layout("spec"), START))])
        s.close()
        junk.write_bytes((tmp_path / "real.sqlite").read_bytes()[:100] + bytes(4000))
    before = junk.read_bytes()
    root = tmp_path / "root"
    (root / "0xab").mkdir(parents=True)
    (root / "0xab" / "index").write_bytes(b"")
    args = {
        "fetch": ["fetch", "--magnet", "magnet:?xt=urn:btih:" + "ee" * 20, "--timeout", "1"],
        "ls": ["ls"],
    }[sub]
    r = CliRunner().invoke(command, [*args, "--root", str(root), "--store", str(junk)])
    assert isinstance(r.exception, SystemExit), repr(r.exception)  # click's exit, no traceback
    assert r.exit_code == 1, r.output
    [line] = r.output.strip().splitlines()[-1:]
    assert line.startswith("Error:") and "is not a message store" in line, r.output
    assert junk.read_bytes() == before
    with pytest.raises(CorruptStore, match="is not a message store"):
        MessageStore(junk)
