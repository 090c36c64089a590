"""``loglake archives`` commands end to end: keygen, build (from an on-disk loglake log),
publish, ls, seed (another process) and fetch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from loglake.archives.cli import command
from loglake.archives.layout import NS, get_layout
from loglake.archives.member import MemberCore
from loglake.archives.store import MessageStore
from loglake.log import open_log
from loglake.log.api import Entry, StreamConfig
from loglake.streams.api import LocalStreams

from .helpers import DAY, START, WEEK, fill_weeks, record


@pytest.mark.parametrize("sub", ["", "keygen", "build", "seed", "fetch", "ls"])
def test_help(sub):
    r = CliRunner().invoke(command, [*([sub] if sub else []), "--help"])
    assert r.exit_code == 0 and "Usage" in r.output


def test_build_without_key_is_a_readable_error(tmp_path, monkeypatch):
    monkeypatch.delenv("LOGLAKE_ARCHIVES_KEY", raising=False)
    r = CliRunner().invoke(command, ["build", "--data-dir", str(tmp_path), "--root", str(tmp_path)])
    assert r.exit_code != 0 and "--key-file" in r.output and "Traceback" not in r.output


def test_keygen_never_replaces_a_key_and_writes_it_private(tmp_path):
    """Found from outside: ``keygen --out`` naming the community's live control key replaced
    it silently (rc 0, a new community id), and the secret was written world-readable before
    its chmod. Now an existing file is refused, untouched, and a new one is 0600 from its
    creation (checked with a umask that would leave it readable)."""
    import os
    import stat

    key = tmp_path / "key"
    old = os.umask(0)
    try:
        r = CliRunner().invoke(command, ["keygen", "--out", str(key)])
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    before = key.read_bytes()
    r = CliRunner().invoke(command, ["keygen", "--out", str(key)])
    assert r.exit_code != 0 and "exists" in r.output and "Traceback" not in r.output
    assert key.read_bytes() == before


@pytest.mark.slow
def test_keygen_build_publish_ls_seed_fetch(tmp_path):
    runner = CliRunner()
    key = tmp_path / "key"
    r = runner.invoke(command, ["keygen", "--out", str(key)])
    assert r.exit_code == 0, r.output
    cid = r.output.strip()
    layout = get_layout("status-go")
    log = open_log(tmp_path / "log")
    fill_weeks(log, "community", layout, range(2), 300)
    log.close()
    root = tmp_path / "archives"
    r = runner.invoke(
        command,
        [
            "build", "--data-dir", str(tmp_path / "log"), "--root", str(root),
            "--key-file", str(key), "--layout", "status-go",
            "--now", str((START + 2 * WEEK) // NS), "--publish", "special",
        ],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.output.strip().splitlines()[-1].startswith("magnet:?xt=urn:btih:")
    log = open_log(tmp_path / "log", readonly=True)
    msgs = LocalStreams(log).pull("special", 0, 10)
    log.close()
    core = MemberCore(cid)
    assert core.on_message(msgs[0].data, 0).message.magnet_uri.startswith("magnet:")
    r = runner.invoke(command, ["ls", "--root", str(root), "--layout", "status-go"])
    assert r.exit_code == 0 and "2020-01-08" in r.output and r.output.count("yes") == 2, r.output

    seed = subprocess.Popen(
        [sys.executable, "-m", "loglake.archives.cli", "seed", "--root", str(root),
         "--key-file", str(key), "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        magnet = seed.stdout.readline().strip()
        assert magnet.startswith("magnet:?") and "x.pe=127.0.0.1:" in magnet, seed.stderr
        member = tmp_path / "member"
        r = runner.invoke(
            command,
            ["fetch", "--magnet", magnet, "--root", str(member), "--layout", "status-go",
             "--community", cid, "--timeout", "15", "--json"],
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        assert '"hydrated_messages": 600' in r.output
    finally:
        seed.terminate()
        seed.wait(10)
    store = MessageStore(member / "member.sqlite")
    assert store.count() == 600 and len(store.archive_ids()) == 2
    store.close()
    r = runner.invoke(command, ["ls", "--root", str(member), "--layout", "status-go"])
    assert r.exit_code == 0 and r.output.count("yes") == 2, r.output


@pytest.mark.slow
def test_run_and_follow_processes_share_an_embedded_log(tmp_path):
    """Control node loop (`archives run`, the log's writer) and member loop (`archives follow`,
    a read-only view of the same log) in two processes."""
    runner = CliRunner()
    key = tmp_path / "key"
    cid = runner.invoke(command, ["keygen", "--out", str(key)]).output.strip()
    layout = get_layout("status-go")
    log = open_log(tmp_path / "log")
    fill_weeks(log, "community", layout, range(2), 300)  # 2020: every window is due
    log.close()
    cli = [sys.executable, "-m", "loglake.archives.cli"]
    control = subprocess.Popen(
        [*cli, "run", "--data-dir", str(tmp_path / "log"), "--root", str(tmp_path / "arch"),
         "--key-file", str(key), "--layout", "status-go", "--check-every", "1",
         "--duration", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    member = None
    try:
        for line in control.stderr:
            if "magnet published" in line:
                break
        else:
            pytest.fail("control node exited before publishing")
        member = subprocess.Popen(
            [*cli, "follow", "--data-dir", str(tmp_path / "log"), "--community", cid,
             "--root", str(tmp_path / "member"), "--layout", "status-go", "--wait", "1",
             "--poll", "0.2", "--once", "--duration", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        out, err = member.communicate(timeout=90)
        assert member.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        assert report["hydrated_messages"] == 600 and len(report["missing"]) == 2
    finally:
        for p in (member, control):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(10)


@pytest.mark.slow
def test_run_and_follow_through_a_stream_server(tmp_path):
    """The same loops against `loglake serve`'s stream service over TCP (``--connect``)."""
    from loglake.log import MemoryLog
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    runner = CliRunner()
    key = tmp_path / "key"
    cid = runner.invoke(command, ["keygen", "--out", str(key)]).output.strip()
    layout = get_layout("spec")
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(1), 50)
    with BackgroundServer(StreamService(log)) as srv:
        connect = f"127.0.0.1:{srv.port}"
        control = subprocess.Popen(
            [sys.executable, "-m", "loglake.archives.cli", "run", "--connect", connect,
             "--root", str(tmp_path / "arch"), "--key-file", str(key), "--check-every", "1",
             "--duration", "60"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            for line in control.stderr:
                if "magnet published" in line:
                    break
            else:
                pytest.fail("control node exited before publishing")
            r = runner.invoke(
                command,
                ["follow", "--connect", connect, "--community", cid,
                 "--root", str(tmp_path / "member"), "--wait", "0.5", "--poll", "0.2",
                 "--once", "--duration", "60"],
            )  # fmt: skip
            assert r.exit_code == 0, r.output
            report = json.loads(r.output.strip().splitlines()[-1])
            assert report["hydrated_messages"] == 50
        finally:
            control.terminate()
            control.wait(10)


@pytest.mark.slow
def test_run_truncates_past_a_record_dated_in_the_future(tmp_path):
    """One record of the year 2200 (index 1) among 70 of 2020: `archives run` archived the 70
    and truncated 0 records from the live stream, as the 2200 one could only be archived in
    2200 and held every record after it."""
    layout = get_layout("spec")
    recs = [record(layout, START + i * DAY, b"x" * 200) for i in range(70)]
    recs.insert(1, record(layout, 7_258_118_400 * NS, b"of 2200"))
    err = _run_once(_disk_community(tmp_path, recs))
    assert "refused 1 record(s) dated more than 20 s ahead of this clock" in err, err
    assert "first at index 1, dated 2200-01-01 00:00:00" in err
    assert "ingested 70, new archives 10, truncated 71 from the live stream" in err, err
    assert _live(tmp_path) == []


def test_run_truncates_past_a_record_that_arrived_after_its_window_was_archived(tmp_path):
    """A record dated in week 1 appended (index 70) after `archives build` archived weeks 1-2,
    then 10 more: its window is closed, so no build ever exports it, and it held every record
    after it in the live stream for good (`archives run` years later truncated 70 of 81, the
    segments before it). Now `run` names it, and retention goes past it once it is older
    than 30 days."""
    layout = get_layout("spec")
    recs = [record(layout, START + i * DAY, b"x" * 200) for i in range(70)]
    common = _disk_community(tmp_path, recs)
    built = CliRunner().invoke(command, ["build", *common, "--now", str((START + 2 * WEEK) // NS)])
    assert built.exit_code == 0, built.output
    log = open_log(tmp_path / "log")
    late = record(layout, START + 3 * DAY, b"late")
    after = [record(layout, START + (70 + i) * DAY, b"x" * 200) for i in range(10)]
    log.append_many("community", [Entry(r) for r in [late, *after]])
    log.close()
    err = _run_once(common)
    assert "1 record(s) arrived after their window was archived" in err, err
    assert "first at index 70, dated 2020-01-04 00:00:00" in err, err
    assert "truncated 81 from the live stream" in err, err
    assert _live(tmp_path) == []


def _disk_community(tmp_path, recs: list[bytes]) -> list[str]:
    """A key and a disk log whose stream ``community`` holds ``recs`` (small segments: the disk
    log truncates whole segments); the arguments naming them and ``tmp_path/arch``."""
    key = tmp_path / "key"
    assert CliRunner().invoke(command, ["keygen", "--out", str(key)]).exit_code == 0
    log = open_log(tmp_path / "log")
    log.create_stream("community", StreamConfig(segment_bytes=4096, seal_to_lake=False))
    log.append_many("community", [Entry(r) for r in recs])
    log.close()
    return ["--data-dir", str(tmp_path / "log"), "--root", str(tmp_path / "arch"),
            "--key-file", str(key)]  # fmt: skip


def _run_once(args: list[str]) -> str:
    """``archives run ARGS --duration 0`` in a process of its own; its stderr, rich's line
    wrapping undone."""
    run = subprocess.run(
        [sys.executable, "-m", "loglake.archives.cli", "run", *args, "--duration", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return " ".join(run.stderr.split())


def _live(tmp_path) -> list:
    """What the live stream ``community`` of ``tmp_path/log`` still holds."""
    log = open_log(tmp_path / "log", readonly=True)
    try:
        return log.read("community", 0, 100)
    finally:
        log.close()


def _build_args(tmp_path, written: str, weeks: int) -> list[str]:
    """A key, a log of ``weeks`` weeks of 20 community records in the ``written`` layout, and
    the ``build`` arguments for them (into ``tmp_path/archives``, as of week 2), no layout."""
    key = tmp_path / "key"
    assert CliRunner().invoke(command, ["keygen", "--out", str(key)]).exit_code == 0
    log = open_log(tmp_path / "log")
    fill_weeks(log, "community", get_layout(written), range(weeks), 20)
    log.close()
    return ["build", "--data-dir", str(tmp_path / "log"), "--root", str(tmp_path / "archives"),
            "--key-file", str(key), "--now", str((START + 2 * WEEK) // NS)]  # fmt: skip


@pytest.mark.parametrize(("written", "chosen"), [("spec", "status-go"), ("status-go", "spec")])
def test_build_refuses_records_of_the_other_layout(tmp_path, written, chosen):
    """status-go's layout read spec records as messages of 1970 (their timestamp lands in an
    unknown field) and built an archive of the week of 1970-01-01 without a word."""
    root = tmp_path / "archives"
    r = CliRunner().invoke(command, [*_build_args(tmp_path, written, 1), "--layout", chosen])
    assert r.exit_code == 1, r.output
    assert f"20 record(s) of community do not decode in the {chosen} layout" in r.output
    assert f"--layout {written}" in r.output
    assert not list(root.glob("*/index")) and not list(root.glob("*.torrent"))


@pytest.mark.parametrize(("written", "chosen"), [("spec", "status-go"), ("status-go", "spec")])
def test_after_a_build_in_the_wrong_layout_the_right_one_archives_every_record(
    tmp_path, written, chosen
):
    """The refused build had stored the stream position past every record: the rerun with the
    layout the error names built nothing ("ingested 0 messages; 0 new archive(s)")."""
    args = _build_args(tmp_path, written, 2)
    r = CliRunner().invoke(command, [*args, "--layout", chosen])
    assert r.exit_code == 1 and f"--layout {written}" in r.output, r.output
    r = CliRunner().invoke(command, [*args, "--layout", written])
    assert r.exit_code == 0, r.output
    assert "ingested 40 messages; 2 new archive(s)" in r.output, r.output
    layout = get_layout(written)
    [index] = (tmp_path / "archives").glob("*/index")
    entries = layout.decode_index(index.read_bytes())
    data = (index.parent / "data").read_bytes()
    held = [
        raw for e in entries for raw in layout.decode_archive(data[e.offset : e.offset + e.size], e)
    ]
    assert len(held) == 40


@pytest.mark.parametrize("sub", ["build", "run", "follow"])
def test_a_mistyped_data_dir_is_refused_and_not_made(tmp_path, sub):
    """Found from outside: ``build --data-dir <typo> --publish special`` made ``<typo>/`` a new
    log (LOCK, consumers.*, streams/) and the archive folder before failing "unknown stream";
    the command reads streams of an existing log, so a folder that is not one is refused
    first, and nothing is made."""
    key = tmp_path / "key"
    assert CliRunner().invoke(command, ["keygen", "--out", str(key)]).exit_code == 0
    typo = tmp_path / "typo"
    args = {
        "build": ["--key-file", str(key), "--publish", "special"],
        "run": ["--key-file", str(key), "--duration", "1"],
        "follow": ["--community", "0x02" + "11" * 32, "--duration", "1"],
    }[sub]
    r = CliRunner().invoke(
        command, [sub, "--data-dir", str(typo), "--root", str(tmp_path / "arch"), *args]
    )
    assert r.exit_code == 1, r.output + repr(r.exception)
    assert r.output == (
        f"Error: {typo} is not a loglake data directory (no streams/ folder in it)\n"
    )
    assert not typo.exists() and not (tmp_path / "arch").exists()
