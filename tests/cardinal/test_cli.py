"""`loglake cardinal produce/consume` on the embedded log, and the commands' logic."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
from loglake.cardinal.cli import command, consume_topic, produce_chain
from loglake.cli import main
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.cardinal.helpers import ChainModel


def test_produce_then_consume_then_resume_with_the_cli(tmp_path):
    data = str(tmp_path / "d")
    r = CliRunner().invoke(
        command,
        [
            *("produce", "--blocks", "30", "--topic", "t", "--data-dir", data),
            *("--deep-reorg", "9", "--reorg-threshold", "8"),
        ],
    )
    assert r.exit_code == 0, r.output
    head = r.output.split("canonical head #")[1].split()
    r = CliRunner().invoke(
        command, ["consume", "--topic", "t", "--data-dir", data, "--reorg-threshold", "8"]
    )
    assert r.exit_code == 0, r.output
    assert "REORG to" in r.output and "reorg complete" in r.output
    assert f"head #{head[0]} {head[1]}" in r.output
    # a second run resumes from the saved checkpoint: nothing new to print
    r = CliRunner().invoke(command, ["consume", "--topic", "t", "--data-dir", data])
    assert r.exit_code == 0, r.output
    assert "added 0, removed 0" in r.output
    assert f"head #{head[0]} {head[1]}" in r.output


def test_consume_logic_prints_events_in_chain_order():
    streams = LocalStreams(MemoryLog())
    sent, canonical = produce_chain(streams, "t", 25, partitions=2)
    assert sent > 25
    events = []
    c = consume_topic(streams, "t", "me", partitions=2, on_event=events.append)
    model = ChainModel([])
    for ev in events:
        assert isinstance(ev, ChainUpdate | ReorgEvent)
        model.apply(ev)
    assert model.chain == [b.hash for b in canonical]
    assert c.core.head.hash == canonical[-1].hash


def test_consume_idles_then_stops_with_an_injected_clock():
    streams = LocalStreams(MemoryLog())
    produce_chain(streams, "t", 3)
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    consume_topic(streams, "t", "me", idle_seconds=1.0, clock=lambda: now[0], sleep=sleep)
    assert slept and sum(slept) >= 1.0


def test_both_data_dir_and_port_is_a_readable_error(tmp_path):
    r = CliRunner().invoke(
        main, ["cardinal", "consume", "--topic", "t", "--data-dir", str(tmp_path), "--port", "1"]
    )
    assert r.exit_code != 0
    assert "either --data-dir or --host/--port" in r.output


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--port", "1"], "either --backend or --host/--port/--data-dir"),
        (["--client-id", "a b"], "client id 'a b' cannot name a lease"),
        (["--client-id", "a..b"], "cannot name a lease"),
    ],
)
def test_a_lease_held_member_with_bad_options_is_a_readable_error(extra, error):
    """``--backend`` (a member held by a lease) refuses other connections and a client id
    that cannot name a lease, before connecting to anything (the URL has no server)."""
    r = CliRunner().invoke(
        main, ["cardinal", "consume", "--topic", "t", "--backend", "nats://127.0.0.1:1", *extra]
    )
    assert r.exit_code != 0
    assert error in r.output, r.output


def test_help():
    for args in (["--help"], ["produce", "--help"], ["consume", "--help"]):
        r = CliRunner().invoke(command, args)
        assert r.exit_code == 0 and "Usage" in r.output


def test_produce_and_consume_against_a_running_stream_server(memory_log):
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with BackgroundServer(StreamService(memory_log)) as srv:
        port = str(srv.port)
        r = CliRunner().invoke(
            command, ["produce", "--blocks", "20", "--topic", "net", "--port", port]
        )
        assert r.exit_code == 0, r.output
        head = r.output.split("canonical head #")[1].split()
        r = CliRunner().invoke(
            command, ["consume", "--topic", "net", "--port", port, "--client-id", "n1"]
        )
        assert r.exit_code == 0, r.output
        assert f"head #{head[0]} {head[1]}" in r.output
    # the checkpoint went through the server's index service into the log: its commit index
    # and one offset per partition (0 here: the whole chain is inside the reorg window, which
    # a restart reads again)
    assert memory_log.get_index("n1", "cardinal.ckpt.n1") >= 1
    assert [memory_log.get_index("n1", "net", partition=p) for p in range(4)] == [0, 0, 0, 0]


def test_a_shallow_fork_needs_no_reorg_channel(tmp_path):
    data = str(tmp_path / "d")
    r = CliRunner().invoke(
        command,
        ["produce", "--blocks", "30", "--topic", "t", "--data-dir", data, "--deep-reorg", "5"],
    )  # depth 5 is within the default threshold of 128: plain blocks, the consumer reorgs
    assert r.exit_code == 0, r.output
    head = r.output.split("canonical head #")[1].split()
    r = CliRunner().invoke(command, ["consume", "--topic", "t", "--data-dir", data])
    assert r.exit_code == 0, r.output
    assert "REORG to" not in r.output
    assert f"head #{head[0]} {head[1]}" in r.output


def test_checkpoints_are_committed_at_most_once_per_interval_and_on_exit():
    streams = LocalStreams(MemoryLog())
    produce_chain(streams, "t", 60)
    c = consume_topic(streams, "t", "me", clock=lambda: 0.0, sleep=lambda s: None)
    assert streams.log.next_index("cardinal.ckpt.me") == 1  # many rounds, one record
    assert streams.get_index("me", "cardinal.ckpt.me") == 1
    assert c.core.head is not None


@pytest.mark.parametrize("backend", [[], ["--backend", "nats://127.0.0.1:1"]])
def test_a_prefix_that_is_not_a_regex_is_a_usage_error(tmp_path, backend):
    """Found from outside: ``cardinal consume --prefix '('`` ended in a 61-line ``re.error``
    traceback from inside the consumer. Now a usage error naming the option, before anything
    is opened or connected (the data directory is empty, the NATS URL has no server)."""
    where = backend or ["--data-dir", str(tmp_path)]
    r = CliRunner().invoke(
        main, ["cardinal", "consume", "--topic", "t", *where, "--prefix", "a/", "--prefix", "("]
    )
    assert r.exit_code == 2, r.output
    assert "Invalid value for '--prefix': '(' is not a regular expression" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
