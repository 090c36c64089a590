"""Every number option of ``loglake``: ``nan``, ``inf``, negative and absurd values are click's
one-line usage error naming the option (exit 2), before anything starts. Each case below was
taken before: a traceback, a hang, or a run that went wrong later (the comments say which).

Each group has a case run as a real ``loglake`` process; the rest go through click's runner with
the command's other arguments broken on purpose (a missing key file, a data dir that is a file,
a port nothing listens on), so that a value the option wrongly takes fails fast with exit 1
instead of starting a server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from loglake.cli import main
from loglake.clitools import Number

NOT_FINITE = ["nan", "inf", "-inf", "1e300"]
INT64_PAST = str(2**63)
"""One past int64, the ceiling of the counts, sizes and indexes nothing smaller bounds."""


def _refused(code: int, output: str, option: str) -> None:
    """Exit 2 and one ``Error:`` line that names ``option``; no traceback."""
    assert code == 2, (code, output)
    assert "Traceback" not in output, output
    [line] = [x for x in output.splitlines() if x.startswith("Error:")]
    assert f"'{option}'" in line, line


def _loglake(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loglake.cli", *args], capture_output=True, text=True, timeout=60
    )


def _sweep(command: list[str], option: str, value: str, rest: list[str]) -> None:
    """``loglake COMMAND OPTION VALUE REST``: the option first, so that click checks it first."""
    r = CliRunner().invoke(main, [*command, option, value, *rest])
    _refused(r.exit_code, r.output, option)


ANY_INTEGER = {("loglake sds sim", "seed")}
"""Integer options any value of which is good."""


def _every_parameter() -> list[tuple[str, click.Parameter]]:
    """(command path, parameter) for every parameter of every ``loglake`` command."""
    ctx = click.Context(main)
    out: list[tuple[str, click.Parameter]] = []

    def walk(cmd: click.Command, path: str) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, f"{path} {name}")
        out.extend((path, p) for p in cmd.params)

    walk(main, "loglake")
    return out


def test_no_number_option_takes_nan_inf_or_any_integer() -> None:
    """A new option typed ``float`` or ``FloatRange`` takes ``nan`` (and ``inf``); one typed
    ``int`` takes negative and huge values: each number option says its range instead."""
    loose = [
        f"{path} {p.name}: {p.type!r}"
        for path, p in _every_parameter()
        if (isinstance(p.type, click.types.FloatParamType) and not isinstance(p.type, Number))
        or (type(p.type) is click.types.IntParamType and (path, p.name) not in ANY_INTEGER)
    ]
    assert not loose, "\n".join(loose)
    assert len(_every_parameter()) > 300  # every part's commands were walked


UNBOUNDED = {
    ("loglake events approve", "amount"): "an ICRC-2 amount: a Candid nat",
    (
        "loglake events cancel",
        "replay_ids",
    ): "replay ids: Candid nats, the orchestrator's to answer",
    ("loglake events replay", "start"): "an event id: a Candid nat, the orchestrator's to check",
    ("loglake events replay", "end"): "an event id: a Candid nat, the orchestrator's to check",
    ("loglake events replay-status", "replay_id"): "a replay id: a Candid nat ('no replay N')",
    ("loglake events register", "price_per_event"): "icrc77:pricing: a Candid nat",
    ("loglake events serve", "price_per_event"): "icrc77:pricing: a Candid nat",
    ("loglake", "verbose"): "click's count option -v: how many times it is given",
}
"""(command path, parameter) → why its ``IntRange`` has no maximum: values the protocol
leaves unbounded, which the peer answers for."""


def test_every_integer_range_has_a_maximum() -> None:
    """``IntRange(min=...)`` alone takes any integer: ``events publish --size 10**12`` ended in
    a MemoryError traceback, ``sds sim --history 1001`` in a run whose messages were dropped as
    oversized. Each integer option says its ceiling (``--help`` shows it), unless listed in
    ``UNBOUNDED`` with the reason."""
    params = {(path, p.name): p for path, p in _every_parameter()}
    open_ended = {
        key
        for key, p in params.items()
        if isinstance(p.type, click.IntRange) and p.type.max is None
    }
    assert not open_ended - UNBOUNDED.keys(), "\n".join(
        map(str, sorted(open_ended - set(UNBOUNDED)))
    )
    assert not UNBOUNDED.keys() - open_ended, (
        f"bounded now, or gone: {UNBOUNDED.keys() - open_ended}"
    )


@pytest.mark.parametrize(
    ("command", "option", "shown"),
    [
        (["serve"], "--retention-interval", "0.1<=x<=31536000"),
        (["events", "serve"], "--throttle-ms", "0<=x<=31536000000"),
        (["events", "serve"], "--replay-rate", "0<x<=1000000000"),
        (["archives", "follow"], "--poll", "0<x<=31536000"),
        (["events", "publish"], "--size", "0<=x<=1000000"),
        (["sds", "sim"], "--participants", "1<=x<=10000"),
        (["serve"], "--retention-ms", "0<=x<=9223372036854"),
        (["cardinal", "produce"], "--blocks", "1<=x<=1000000"),
    ],
)
def test_help_shows_each_range(command: list[str], option: str, shown: str) -> None:
    r = CliRunner().invoke(main, [*command, "--help"], terminal_width=200)
    [line] = [x for x in r.output.splitlines() if x.strip().startswith(option)]
    assert shown in line, line


# ---- loglake serve ---------------------------------------------------------------------------


def test_serve_retention_interval_nan_is_refused_by_the_real_command(tmp_path: Path) -> None:
    # took nan: the retention task died at start (retention never ran) and Ctrl-C ended in a
    # ValueError traceback ("cannot convert float NaN to integer"); here the service just ran
    r = _loglake("serve", "--data-dir", str(tmp_path / "d"), "--port", "0",
                 "--retention-interval", "nan")  # fmt: skip
    _refused(r.returncode, r.stderr, "--retention-interval")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("option", ["--retention-interval", "--seal-interval"])
@pytest.mark.parametrize("value", [*NOT_FINITE, "31536001", "0.05", "-1", "soon"])
def test_serve_periods(tmp_path: Path, option: str, value: str) -> None:
    # inf, 1e300: retention (or sealing) never ran
    (tmp_path / "file").write_text("")  # a data dir under a file: mkdir fails, exit 1
    _sweep(["serve"], option, value, ["--data-dir", str(tmp_path / "file" / "d"), "--port", "0"])


@pytest.mark.parametrize(
    ("option", "value"),
    [("--limits-frame-timeout", "nan"), ("--limits-idle-timeout", "inf"),
     ("--limits-shutdown-timeout", "1e300"), ("--limits-max-connections", "-1")],
)  # fmt: skip
def test_serve_limits(tmp_path: Path, option: str, value: str) -> None:
    # refused, exit 2, but naming "frame_timeout" and "the --limits-* flags", not the flag
    (tmp_path / "file").write_text("")
    _sweep(["serve"], option, value, ["--data-dir", str(tmp_path / "file" / "d"), "--port", "0"])


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--retention-ms", str((2**63 - 1) // 10**6 + 1)),  # past int64 ns (JetStream max_age)
        ("--retention-bytes", INT64_PAST),
        ("--retention-records", INT64_PAST),
        ("--segment-bytes", str(2**40 + 1)),  # the node's [streams] segment_bytes range
    ],
)
def test_serve_sizes(tmp_path: Path, option: str, value: str) -> None:
    (tmp_path / "file").write_text("")
    _sweep(["serve"], option, value, ["--data-dir", str(tmp_path / "file" / "d"), "--port", "0"])


# ---- loglake events --------------------------------------------------------------------------


def test_events_publish_size_past_a_message_is_refused_by_the_real_command(tmp_path: Path) -> None:
    # every payload was made before the first call: a MemoryError traceback, whatever the URL
    (tmp_path / "key").write_text("00" * 32)
    r = _loglake("events", "publish", "--url", "http://127.0.0.1:1",
                 "--key-file", str(tmp_path / "key"), "--count", "1", "--size", "1000000000000",
                 "ns")  # fmt: skip
    _refused(r.returncode, r.stderr, "--size")


def test_events_serve_throttle_nan_is_refused_by_the_real_command(tmp_path: Path) -> None:
    # the publisher served, and its pump stopped at the first sleep: every replay stayed
    # pending (measured on a four-role cluster: nan, inf and 1e300 alike; 5 completed in 0.5 s)
    key = tmp_path / "key"
    assert _loglake("events", "keygen", str(key)).returncode == 0
    (tmp_path / "directory.json").write_text("{}")
    r = _loglake("events", "serve", "--role", "publisher", "--key-file", str(key),
                 "--port", "0", "--directory", str(tmp_path / "directory.json"),
                 "--orchestrator", "aaaaa-aa", "--data-dir", str(tmp_path / "d"),
                 "--throttle-ms", "nan")  # fmt: skip
    _refused(r.returncode, r.stderr, "--throttle-ms")


EVENTS_CALL = ["--url", "http://127.0.0.1:9", "--key-file", "/nonexistent/key"]
"""A key file that is not there: a value wrongly taken ends at once, naming the key file."""
EVENTS_SERVE = ["--role", "publisher", "--port", "0", "--directory", "/nonexistent/d.json",
                "--key-file", "/nonexistent/key"]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "option", "value", "rest"),
    [
        *[(["events", "serve"], "--throttle-ms", v, EVENTS_SERVE) for v in NOT_FINITE],
        (["events", "serve"], "--throttle-ms", "-1", EVENTS_SERVE),
        # nan: a ValueError traceback from the publisher; inf, 1e300: taken
        *[(["events", "serve"], "--replay-rate", v, EVENTS_SERVE) for v in NOT_FINITE],
        (["events", "serve"], "--replay-rate", "0", EVENTS_SERVE),
        (["events", "serve"], "--replay-rate", "1.1e9", EVENTS_SERVE),
        # 0: a replay stayed running for ever, sending nothing
        (["events", "serve"], "--batch-size", "0", EVENTS_SERVE),
        (["events", "serve"], "--max-events-per-replay", "0", EVENTS_SERVE),
        (["events", "serve"], "--price-per-event", "-1", EVENTS_SERVE),
        # nan, inf: a registration or a replay waited for ever
        *[(["events", "register"], "--timeout", v, [*EVENTS_CALL, "ns"]) for v in NOT_FINITE],
        (["events", "register"], "--timeout", "-1", [*EVENTS_CALL, "ns"]),
        (["events", "register"], "--price-per-event", "-1", [*EVENTS_CALL, "ns"]),
        *[
            (["events", "replay"], "--timeout", v, [*EVENTS_CALL, "ns", "--from", "0"])
            for v in NOT_FINITE
        ],
        (["events", "replay"], "--from", "-1", [*EVENTS_CALL, "ns"]),
        (["events", "replay"], "--to", "-1", [*EVENTS_CALL, "ns", "--from", "0"]),
        # --batch 0: a ValueError traceback from range(); -1: nothing published, exit 0
        (["events", "publish"], "--batch", "0", [*EVENTS_CALL, "ns", "--text", "a"]),
        (["events", "publish"], "--batch", "-1", [*EVENTS_CALL, "ns", "--text", "a"]),
        (["events", "publish"], "--count", "-1", [*EVENTS_CALL, "ns"]),
        (["events", "publish"], "--size", "-1", [*EVENTS_CALL, "ns"]),
        # past a call's 1 MB: an event the publisher would send on alone, over its budget
        (["events", "publish"], "--size", "1000001", [*EVENTS_CALL, "ns"]),
        (["events", "publish"], "--count", str(10**9 + 1), [*EVENTS_CALL, "ns"]),
        (["events", "publish"], "--batch", "10001", [*EVENTS_CALL, "ns", "--text", "a"]),
        (["events", "replays"], "--take", "-1", EVENTS_CALL),  # an empty table, exit 0
        (["events", "replays"], "--take", "600001", EVENTS_CALL),
        (["events", "received"], "--take", "-1", EVENTS_CALL),
        (["events", "received"], "--take", "2000001", EVENTS_CALL),  # a subscriber keeps less
        (["events", "serve"], "--max-events-per-replay", INT64_PAST, EVENTS_SERVE),
        (["events", "serve"], "--batch-size", "100001", EVENTS_SERVE),  # one pull holds less
        (["events", "serve"], "--max-unconfirmed", "1000001", EVENTS_SERVE),
        (["events", "serve"], "--max-body-bytes", str(2**30 + 1), EVENTS_SERVE),
        # MOD 0: refused by the orchestrator (exit 1); -1: the Candid codec's error
        *[
            (["events", "subscribe"], "--skip", v, [*EVENTS_CALL, "ns"])
            for v in ["0", "-1", "abc", "2,-1", "1,2,3", "nan"]
        ],
        (["events", "replay"], "--skip", "0", [*EVENTS_CALL, "ns", "--from", "0"]),
        # =nan, =abc: a ValueError traceback at start
        *[
            (["events", "serve"], "--mint", f"aaaaa-aa={v}", EVENTS_SERVE)
            for v in ["nan", "abc", "-5", "1e300"]
        ],
        (["events", "serve"], "--mint", "aaaaa-aa", EVENTS_SERVE),
    ],
)
def test_events_numbers(command: list[str], option: str, value: str, rest: list[str]) -> None:
    _sweep(command, option, value, rest)


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["approve", *EVENTS_CALL, "aaaaa-aa", "--", "-1"], "AMOUNT"),
        (["replay-status", *EVENTS_CALL, "--", "-1"], "REPLAY_ID"),
        (["cancel", *EVENTS_CALL, "--", "3", "-1"], "REPLAY_IDS..."),
    ],
)
def test_events_negative_ids_and_amounts(args: list[str], what: str) -> None:
    r = CliRunner().invoke(main, ["events", *args])
    _refused(r.exit_code, r.output, what)


# ---- loglake cardinal ------------------------------------------------------------------------


def test_cardinal_consume_idle_seconds_nan_is_refused_by_the_real_command(tmp_path: Path) -> None:
    # polled on, printing nothing, until consume's one-hour cap: "nothing new for nan seconds"
    # is never true (inf and 1e300 alike)
    r = _loglake("cardinal", "consume", "--data-dir", str(tmp_path / "d"), "--topic", "t",
                 "--idle-seconds", "nan")  # fmt: skip
    _refused(r.returncode, r.stderr, "--idle-seconds")


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        *[(["cardinal", "consume"], "--idle-seconds", v) for v in NOT_FINITE],
        (["cardinal", "consume"], "--idle-seconds", "-1"),
        # nan, inf: no checkpoint committed while blocks came
        *[(["cardinal", "consume"], "--commit-seconds", v) for v in NOT_FINITE],
        (["cardinal", "consume"], "--commit-seconds", "-1"),
        (["cardinal", "consume"], "--reorg-threshold", "0"),
        (["cardinal", "consume"], "--reorg-threshold", "-1"),
        (["cardinal", "produce"], "--reorg-threshold", "-1"),  # the Avro codec's error, exit 1
        (["cardinal", "produce"], "--blocks", "0"),  # "sent 8 messages for 0 blocks"
        (["cardinal", "produce"], "--blocks", "-1"),
        (["cardinal", "produce"], "--deep-reorg", "-1"),
        (["cardinal", "produce"], "--sub-items", "-1"),
        # the whole chain is built in memory before a message is sent
        (["cardinal", "produce"], "--blocks", "1000000000000"),
        (["cardinal", "produce"], "--deep-reorg", "1000001"),
        (["cardinal", "produce"], "--sub-items", "100001"),
        # a Reorg names its block by an Avro int (int32): no deeper reorg can be told
        (["cardinal", "consume"], "--reorg-threshold", str(2**31)),
        (["cardinal", "produce"], "--reorg-threshold", str(2**31)),
        # the stream service serves no topic with more (its CREATE is refused)
        (["cardinal", "consume"], "--partitions", "4097"),
        (["cardinal", "produce"], "--partitions", "4097"),
    ],
)
def test_cardinal_numbers(tmp_path: Path, command: list[str], option: str, value: str) -> None:
    (tmp_path / "file").write_text("")  # streams in a folder under a file: exit 1 at once
    rest = ["--topic", "t", "--data-dir", str(tmp_path / "file" / "d")]
    if command[1] == "produce" and option != "--blocks":
        rest += ["--blocks", "5"]
    _sweep(command, option, value, rest)


def test_cardinal_produce_blocks_past_a_chain_is_refused_by_the_real_command(
    tmp_path: Path,
) -> None:
    # the synthetic chain is built whole before the first message: memory ran out
    r = _loglake("cardinal", "produce", "--blocks", "1000000000000", "--topic", "t",
                 "--data-dir", str(tmp_path / "d"))  # fmt: skip
    _refused(r.returncode, r.stderr, "--blocks")
    assert not (tmp_path / "d").exists()


def test_cardinal_produce_refuses_a_chain_of_too_many_sub_batch_items(tmp_path: Path) -> None:
    # each within its ceiling, 101 blocks of 100,000 items are over the chain's 10,000,000
    rest = ["--topic", "t", "--data-dir", str(tmp_path / "d")]
    r = CliRunner().invoke(main, ["cardinal", "produce", "--blocks", "101",
                                  "--sub-items", "100000", *rest])  # fmt: skip
    _refused(r.exit_code, r.output, "--sub-items")
    assert "10,000,000" in r.output
    assert not (tmp_path / "d").exists()


# ---- loglake job -----------------------------------------------------------------------------


def test_job_follow_nan_is_refused_by_the_real_command(tmp_path: Path) -> None:
    # exit 1, "option --follow=nan: …", after the data dir and topics were looked at
    r = _loglake("job", "cardinal-blocks", "--data-dir", str(tmp_path), "--topic", "t",
                 "--out", str(tmp_path / "out"), "--follow", "nan")  # fmt: skip
    _refused(r.returncode, r.stderr, "--follow")


JOB_ARGS = {
    "compact": ["--data-dir", "/nonexistent", "--stream", "s"],
    "cardinal-blocks": ["--data-dir", "/nonexistent", "--topic", "t", "--out", "/nonexistent/o"],
    "sds-audit": ["--data-dir", "/nonexistent", "--stream", "sds.s", "--out", "/nonexistent/o"],
    "seal": ["--backend", "nats://127.0.0.1:9", "--data-dir", "/nonexistent"],
}
"""A data dir that is not there: a value wrongly taken ends before Spark, naming --data-dir."""


@pytest.mark.parametrize(
    ("job", "option", "value"),
    [
        # inf, 1e300: superseded files kept for ever; nan: exit 1 naming "grace_seconds"
        *[("compact", "--grace-seconds", v) for v in NOT_FINITE],
        ("compact", "--grace-seconds", "-1"),
        *[("cardinal-blocks", "--follow", v) for v in NOT_FINITE],
        ("cardinal-blocks", "--follow", "-1"),
        ("cardinal-blocks", "--follow", "86401"),
        ("cardinal-blocks", "--reorg-threshold", "0"),
        ("cardinal-blocks", "--max-records-per-trigger", "0"),
        ("sds-audit", "--partition", "-1"),
        ("cardinal-blocks", "--reorg-threshold", str(2**31)),  # past a Reorg's Avro int
        ("cardinal-blocks", "--max-records-per-trigger", INT64_PAST),
        ("sds-audit", "--partition", str(2**31)),  # the lake's partition column is int32
        ("seal", "--file-records", INT64_PAST),
        ("seal", "--file-records", "0"),
    ],
)
def test_job_numbers(job: str, option: str, value: str) -> None:
    _sweep(["job", job], option, value, JOB_ARGS[job])


# ---- loglake log -----------------------------------------------------------------------------


def test_log_read_from_negative_is_refused_by_the_real_command(tmp_path: Path) -> None:
    # read as 0: the table said "from -1" and showed records from index 0
    (tmp_path / "streams").mkdir()  # a data dir with no streams
    r = _loglake("log", "read", "--data-dir", str(tmp_path), "s", "--from", "-1")
    _refused(r.returncode, r.stderr, "--from")


@pytest.mark.parametrize(
    ("option", "value"),
    [("--partition", "-1"), ("--from", "-1"), ("--limit", "-1"), ("-n", "-5"),
     ("--partition", str(2**31)), ("--from", INT64_PAST), ("--limit", INT64_PAST)],
)  # fmt: skip
def test_log_read_numbers(tmp_path: Path, option: str, value: str) -> None:
    # a data dir with no streams: a value wrongly taken ends at once ("no stream 's'")
    _sweep(["log", "read"], option, value, ["--data-dir", str(tmp_path), "s"])


# ---- loglake stream --------------------------------------------------------------------------


def test_stream_pull_from_negative_is_refused_by_the_real_command() -> None:
    # a BareEncodeError traceback ("uint out of range: -1") once connected
    r = _loglake("stream", "--port", "9", "pull", "s", "--from", "-1")
    _refused(r.returncode, r.stderr, "--from")


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        (["push", "s", "x"], "-p", "-1"),  # a KeyError traceback
        (["pull", "s"], "-p", "-1"),  # a KeyError traceback
        (["pull", "s"], "--partition", "4096"),
        (["pull", "s"], "--from", str(2**64)),  # a BareEncodeError traceback
        (["pull", "s"], "--limit", "-1"),  # a BareEncodeError traceback
        (["index", "get", "c", "s"], "--save", "-1"),  # a BareEncodeError traceback
        (["index", "get", "c", "s"], "-p", "-1"),  # a BareEncodeError traceback
        (["index", "reset", "c", "s"], "--to", "-1"),
        (["create", "s"], "--partitions", "0"),  # the server's refusal, exit 1
        (["create", "s"], "--partitions", "4097"),  # the server's "Invalid request", exit 1
    ],
)
def test_stream_numbers(command: list[str], option: str, value: str) -> None:
    # port 9 (discard), where nothing listens: a value wrongly taken fails to connect, exit 1
    r = CliRunner().invoke(main, ["stream", "--port", "9", *command, option, value])
    _refused(r.exit_code, r.output, option)


# ---- loglake sds -----------------------------------------------------------------------------


def test_sds_sim_latency_nan_is_refused_by_the_real_command() -> None:
    # a ValueError traceback ("cannot convert float NaN to integer") once the run started
    r = _loglake("sds", "sim", "--participants", "3", "--messages", "3", "--latency-ms", "nan")
    _refused(r.returncode, r.stderr, "--latency-ms")


SIM = ["sds", "sim", "--participants", "3", "--messages", "3"]


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        # the chat's --interval went to select(): nan, inf, 1e300, -1 were tracebacks; 0 spun
        *[(["sds", "chat"], "--interval", v) for v in [*NOT_FINITE, "-1", "0"]],
        (["sds", "chat"], "--sync-ms", "-1"),
        (["sds", "chat"], "--sync-ms", "31536000001"),  # a year, as every duration
        *[(SIM, "--latency-ms", v) for v in NOT_FINITE],  # nan, inf: tracebacks
        (SIM, "--latency-ms", "-1"),
        *[(SIM, "--loss", v) for v in ["nan", "inf", "-1", "2"]],  # a run, PASS or FAIL
        (SIM, "--sync-ms", "0"),  # a randrange() traceback
        (SIM, "--sync-ms", "-1"),
        (SIM, "--sync-ms", "31536000001"),
        (SIM, "--participants", "0"),  # a randrange() traceback
        (SIM, "--participants", "10001"),
        (SIM, "--messages", "-1"),
        (SIM, "--messages", str(10**8 + 1)),
        (SIM, "--history", "-1"),
        (SIM, "--history", "1001"),  # a longer causal history is dropped as oversized
        (SIM, "--late-joiners", "-1"),
        (SIM, "--late-joiners", "10001"),
        (SIM, "--offline", "-1"),
        (SIM, "--offline", "10001"),
        (SIM, "--partition", "0:1000:nan"),  # a split with nobody on side B
        (SIM, "--partition", "1000:0:0.5"),
        (SIM, "--partition", "0:1000:2"),
    ],
)
def test_sds_numbers(command: list[str], option: str, value: str) -> None:
    # the chat: port 9, where nothing listens, so a value wrongly taken fails to connect
    rest = ["--port", "9", "--channel", "c", "--id", "a"] if command[1] == "chat" else []
    _sweep(command, option, value, rest)


# ---- loglake archives ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["fetch", "follow"])
@pytest.mark.parametrize("value", ["0", INT64_PAST])  # compared with the index's int64 sizes
def test_archives_max_archive_bytes(tmp_path: Path, command: str, value: str) -> None:
    # a member folder under a file: a value wrongly taken ends at once
    (tmp_path / "file").write_text("")
    root = ["--root", str(tmp_path / "file" / "r")]
    rest = (
        ["--magnet", "magnet:?xt=urn:btih:" + "0" * 40, *root]
        if command == "fetch"
        else ["--connect", "127.0.0.1:9", "--community", "0x00", *root, "--once"]
    )
    _sweep(["archives", command], "--max-archive-bytes", value, rest)
