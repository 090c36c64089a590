"""``loglake serve --access FILE`` rereads the file on SIGHUP (issue 15 §1): a grant added takes
effect without a restart, and a broken file keeps the grants in force (a real ``serve`` process
over mutual TLS)."""

from __future__ import annotations

import signal
import sys

import pytest

from loglake.streams.client import PermissionDenied, StreamClient
from loglake.streams.permissions import AccessPolicy, Peer, Permission
from loglake.streams.tls import client_context, write_test_pki
from tests.procs import free_port, process
from tests.streams.test_tls_serve import ACCESS as READ_ONLY  # alice admin, bob reads orders
from tests.waiting import wait_until

BOB_WRITES = READ_ONLY.replace('allow = ["read"]', 'allow = ["read", "write"]')


def test_replace_takes_the_new_grants_and_drops_cached_answers():
    bob = Peer(frozenset({"cn:bob"}))
    policy = AccessPolicy.from_dict({"grant": []})
    assert policy.permissions(bob, "orders") == frozenset()  # now cached
    policy.replace(
        AccessPolicy.from_dict(
            {"grant": [{"identities": ["cn:bob"], "streams": ["orders"], "allow": ["write"]}]}
        )
    )
    assert policy.permissions(bob, "orders") == {Permission.WRITE}


@pytest.mark.slow
def test_sighup_rereads_the_access_file_and_a_bad_one_changes_nothing(tmp_path):
    pki = write_test_pki(tmp_path / "pki", ("alice", "bob"))
    access = tmp_path / "access.toml"
    access.write_text(READ_ONLY)
    port = free_port()
    cmd = [
        sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(tmp_path / "data"),
        "--port", str(port), "--tls-cert", str(pki.server_cert), "--tls-key",
        str(pki.server_key), "--tls-client-ca", str(pki.ca), "--access", str(access),
    ]  # fmt: skip
    err = tmp_path / "serve.err"
    with err.open("wb") as errf, process(cmd, port, stderr=errf) as proc:

        def client(who: str) -> StreamClient:
            cert, key = pki.clients[who]
            return StreamClient(port=port, timeout=10, tls=client_context(pki.ca, cert, key))

        with client("alice") as alice:
            alice.create_stream("orders")
        with client("bob") as bob, pytest.raises(PermissionDenied, match="may not push"):
            bob.push("orders", b"refused")

        access.write_text(BOB_WRITES)
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "access file reloaded" in err.read_text(), timeout=10)
        with client("bob") as bob:
            assert bob.push("orders", b"granted") == 0

        access.write_text("[[grant]]\nidentities = [")  # half saved
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "access file not reloaded" in err.read_text(), timeout=10)
        with client("bob") as bob:  # the grants in force stay
            assert bob.push("orders", b"still") == 1
        assert proc.poll() is None
    assert "access.toml" in err.read_text()  # the error names the file
