"""A publisher started before its orchestrator registers once the orchestrator is up.

It used to fail ``icrc72_register_publication`` once ("Connect call failed") and never try
again, so minutes later every replay of its namespace got ``PublicationNotFound``. Each role
here is its own process on loopback, started in the wrong order.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from loglake.events.cli import command
from tests.events.cluster import Cluster
from tests.events.wait import wait_until

pytestmark = pytest.mark.slow


def test_a_publisher_started_first_registers_when_the_orchestrator_comes_up(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.start_one("publisher")  # the orchestrator is not there yet
        pub = c.client("publisher")

        def state() -> tuple:
            [(_, st, attempts, error)] = pub.call("loglake_registrations", [c.namespace])
            return st, attempts, error

        retrying = wait_until(
            lambda: (s := state())[0] == "retrying" and s[1] >= 2 and s,
            what="the publisher retrying its registration",
        )
        assert retrying[2], "the last error is reported"
        for r in ("orchestrator", "broadcaster", "subscriber"):
            c.start_one(r)
        wait_until(lambda: state()[0] == "registered", 60, what="the registration landing")
        # the namespace now works end to end: published events replay to a late subscriber
        run = CliRunner().invoke
        pubargs = ["--url", c.urls["publisher"], "--key-file", str(c.keys["publisher"])]
        assert run(command, ["publish", *pubargs, c.namespace, "--count", "20"]).exit_code == 0
        sub = ["--url", c.urls["orchestrator"], "--key-file", str(c.keys["subscriber"])]
        assert run(command, ["subscribe", *sub, c.namespace]).exit_code == 0
        r = wait_until(
            lambda: (
                (
                    x := run(command, ["replay", *sub, c.namespace, "--from", "0", "--to", "20"])
                ).exit_code
                == 0
                and x
            ),
            30,
            what="a replay of the registered namespace",
        )
        assert "completed(20)" in r.output
        # and the register command reports a second namespace through to "registered"
        r = run(command, ["register", *pubargs, "com.example.second"])
        assert r.exit_code == 0, r.output
        assert r.output.strip().splitlines()[-1].startswith("com.example.second: registered")
    except Exception as e:
        raise AssertionError(f"{e}\n{c.logs()}") from e
    finally:
        c.stop()
