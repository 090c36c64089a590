"""``make run RUN_ARGS=--backend`` (``loglake node walkthrough --backend``): the five protocols
against a node on a local 3-node JetStream cluster the command starts itself, run as the user
runs it (a real process), and nothing of the cluster left behind afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import require_peer
from tests.nats_cluster import NATS_HINT, have_nats_server


def nats_processes_under(root: str) -> list[int]:
    """Live processes whose command line names ``root`` (the cluster's config files)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if root in cmd and "nats-server" in cmd:
            pids.append(int(d.name))
    return pids


@pytest.mark.slow
def test_walkthrough_with_backend_runs_the_five_protocols_on_a_local_cluster() -> None:
    require_peer("nats-server", have_nats_server(), NATS_HINT)
    out = subprocess.run(
        [sys.executable, "-m", "loglake.cli", "node", "walkthrough", "--backend"],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "COLUMNS": "400"},  # one line per step
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout
    assert "starting a local 3-node NATS JetStream cluster" in text
    root = re.search(r"stores in (\S+);", text)
    assert root, text
    assert "streams in NATS JetStream nats://127.0.0.1:" in text and "(R3)" in text
    for step in ("1. streams", "2. ICRC-72/77", "3. Cardinal", "4. SDS", "5. archives"):
        assert step in text, text
    assert "replay 1 of [0, 10): completed, 10/10" in text
    assert "repaired 1" in text and "hydrated 100 messages" in text
    cluster = re.search(r"6\. cluster\s+NATS JetStream R3, reachable; meta leader n[123];.*", text)
    assert cluster, text
    assert "leases: " in cluster.group(0) and "sealer held by this node" in cluster.group(0)
    # the cluster was stopped and its stores removed
    assert not Path(root.group(1)).exists()
    assert nats_processes_under(root.group(1)) == []


def test_backend_alone_means_a_local_cluster_and_a_url_is_kept(monkeypatch) -> None:
    from loglake.node import walkthrough
    from loglake.node.command import command

    seen: list[dict] = []
    monkeypatch.setattr(walkthrough, "run_walkthrough", lambda **kw: seen.append(kw))
    runner = CliRunner()
    for args in (["--backend"], ["--backend", "--keep"], ["--backend", "nats://h:1"], []):
        r = runner.invoke(command, ["walkthrough", *args])
        assert r.exit_code == 0, r.output
    assert [kw["backend"] for kw in seen] == ["local", "local", "nats://h:1", None]
    assert seen[1]["keep"] is True


def test_no_nats_server_binary_is_a_one_line_error(monkeypatch, tmp_path: Path) -> None:
    from loglake.node import localcluster

    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(localcluster.LocalClusterError, match="no nats-server binary"):
        localcluster.LocalNatsCluster(3)
