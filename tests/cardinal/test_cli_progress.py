"""`loglake cardinal produce` shows its progress on a terminal, and only there."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

from click.testing import CliRunner

from loglake.cardinal.cli import command

RUN = [sys.executable, "-c", "from loglake.cli import main; main()"]


def _on_a_terminal(args: list[str], timeout: float = 60.0) -> tuple[int, str]:
    """Run ``loglake ARGS`` with stdout and stderr on a pseudo-terminal; (rc, what it drew)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    p = subprocess.Popen(RUN + args, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(leader)
    return rc, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode("utf-8", "replace"))


def test_produce_draws_a_progress_bar_on_a_terminal(tmp_path):
    # Found from outside: 20,000 blocks took 39 s with nothing on the screen.
    rc, drawn = _on_a_terminal(
        ["cardinal", "produce", "--blocks", "300", "--topic", "t", "--data-dir", str(tmp_path)]
    )
    assert rc == 0, drawn
    assert "producing" in drawn
    done, total = re.findall(r"(\d+)/(\d+)", drawn)[-1]  # blocks and reorg branches sent
    assert done == total and int(total) >= 300
    assert "sent" in drawn and "canonical head" in drawn


def test_produce_prints_only_its_summary_when_piped(tmp_path):
    r = CliRunner().invoke(
        command, ["produce", "--blocks", "50", "--topic", "t", "--data-dir", str(tmp_path)]
    )
    assert r.exit_code == 0, r.output
    assert r.output.startswith("sent ") and "producing" not in r.output
