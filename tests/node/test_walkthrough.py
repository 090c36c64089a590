"""``loglake node walkthrough`` (``make run``): all five protocols against one node."""

from __future__ import annotations

from pathlib import Path

import pytest

from loglake.node.walkthrough import run_walkthrough


@pytest.mark.slow
def test_walkthrough_runs_every_protocol_against_the_node(tmp_path: Path, capsys) -> None:
    s = run_walkthrough(data_dir=tmp_path)
    assert s["streams"]["records"] == 30 and s["streams"]["partitions"] == 3
    assert s["streams"]["consumer_lag"] == 6  # 10 records on partition 1, saved index 4
    assert s["icrc"]["replay_status"] == "completed" and s["icrc"]["replayed"] == 10
    assert s["icrc"]["live"] == 10  # published after the subscription
    assert s["icrc"]["notifications"] == 20  # + the 10 missed ones, replayed
    assert s["cardinal"]["reorgs"] >= 1 and s["cardinal"]["reorg_messages"] >= 1
    assert s["sds"]["repaired"] >= 1 and s["sds"]["healthy"]
    assert s["archives"]["archives"] == 1 and s["archives"]["fetched"] == 1
    assert s["archives"]["hydrated"] == s["archives"]["messages"]
    m = s["metrics"]  # scraped from /metrics at the end
    assert m["loglake_push_records_total"] > 0 and m["loglake_pull_records_total"] > 0
    assert m["loglake_replay_events_sent_total"] == 10
    assert m["loglake_sds_ack_latency_seconds_count"] >= 1
    assert m["loglake_archive_bytes_total"] >= 2 * 102_400  # built, then fetched
    assert m["loglake_consumer_lag"] >= 6
    out = " ".join(capsys.readouterr().out.split())
    assert "loglake node walkthrough" in out and "/console/#login=" in out
    # the last line says how to keep the node whose console URL was just printed
    assert out.rstrip().endswith("(or `make run RUN_ARGS=--keep`)")
    token = (tmp_path / "node.token").read_text().strip()
    assert token and token not in out.replace(" ", "")  # the console link holds a login code


@pytest.mark.parametrize(
    "before",
    [["--backend", "nats://127.0.0.1:1"], ["--http-port", "8080"], ["--no-sds-enabled"]],
)
def test_node_options_before_the_walkthrough_are_a_usage_error_not_ignored(before) -> None:
    """Found from outside: ``loglake node --backend nats://… walkthrough`` walked through on the
    embedded log: the options of ``loglake node`` itself were dropped without a word when a
    subcommand followed them."""
    from click.testing import CliRunner

    from loglake.cli import main

    r = CliRunner().invoke(main, ["node", *before, "walkthrough"])
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert "options of `loglake node` itself, not of `walkthrough`" in r.output, r.output
    assert before[0] in r.output and "0. starting a node" not in r.output
