"""``loglake serve`` with TLS, mutual TLS and an access file; ``loglake stream`` speaking TLS.

Issue 15 §1: serve refuses a non-loopback bind without TLS unless ``--insecure``; the CLI and the
service agree on TLS and permissions end to end (a real ``serve`` process on loopback).
"""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from loglake.node.cli import ServeError, check_exposure, is_loopback
from loglake.node.cli import command as node_command
from loglake.streams.cli import command as stream_command
from loglake.streams.client import StreamClient
from loglake.streams.tls import client_context, write_test_pki
from tests.procs import free_port, process

ACCESS = """
[[grant]]
identities = ["cn:alice"]
streams = ["*"]
allow = ["admin"]

[[grant]]
identities = ["cn:bob"]
streams = ["orders"]
allow = ["read"]
"""


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_binds_need_no_tls(host):
    assert is_loopback(host)
    check_exposure(host, tls=False, insecure=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.1.2.3", "192.0.2.7"])
def test_other_binds_without_tls_are_refused_unless_insecure(host):
    assert not is_loopback(host)
    with pytest.raises(ServeError, match=r"refusing to serve .* without TLS"):
        check_exposure(host, tls=False, insecure=False)
    check_exposure(host, tls=True, insecure=False)
    check_exposure(host, tls=False, insecure=True)


def test_serve_on_all_interfaces_without_tls_stops_before_anything(tmp_path):
    data = tmp_path / "data"
    r = CliRunner().invoke(node_command, ["serve", "--data-dir", str(data), "--host", "0.0.0.0"])
    assert isinstance(r.exception, ServeError)
    assert "--tls-cert" in str(r.exception) and "--insecure" in str(r.exception)
    assert not data.exists()  # refused before opening the log or binding


def test_serve_tls_options_go_together(tmp_path):
    pki = write_test_pki(tmp_path / "pki")
    r = CliRunner().invoke(
        node_command, ["serve", "--data-dir", str(tmp_path), "--tls-cert", str(pki.server_cert)]
    )
    assert r.exit_code == 2 and "--tls-cert and --tls-key go together" in r.output


@pytest.fixture(scope="module")
def tls_serve(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls-serve")
    pki = write_test_pki(root / "pki", ("alice", "bob"))
    (root / "access.toml").write_text(ACCESS)
    port = free_port()
    cmd = [
        sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(root / "data"),
        "--port", str(port), "--tls-cert", str(pki.server_cert), "--tls-key",
        str(pki.server_key), "--tls-client-ca", str(pki.ca), "--access", str(root / "access.toml"),
    ]  # fmt: skip
    with process(cmd, port):
        yield pki, port


def stream_cli(pki, port, who, *args):
    opts = ["--port", str(port), "--tls-ca", str(pki.ca)]
    if who:
        cert, key = pki.clients[who]
        opts += ["--tls-cert", str(cert), "--tls-key", str(key)]
    return CliRunner().invoke(stream_command, [*opts, *args])


@pytest.mark.slow
def test_the_cli_and_a_served_service_speak_mutual_tls(tls_serve):
    pki, port = tls_serve
    r = stream_cli(pki, port, "alice", "create", "orders", "--json")
    assert r.exit_code == 0, r.output
    r = stream_cli(pki, port, "alice", "push", "orders", "a", "b", "--json")
    assert json.loads(r.output)["indexes"] == [0, 1]
    r = stream_cli(pki, port, "bob", "pull", "orders", "--json")
    assert [m["data"] for m in json.loads(r.output)["messages"]] == ["a", "b"]
    r = stream_cli(pki, port, "bob", "push", "orders", "c")
    assert r.exit_code != 0
    assert "permission denied: cn:bob may not push to stream 'orders'" in str(r.exception)
    r = stream_cli(pki, port, None, "list")  # no client certificate
    assert r.exit_code != 0 and "TLS handshake" in str(r.exception)
    cert, key = pki.clients["alice"]
    with StreamClient(port=port, timeout=10, tls=client_context(pki.ca, cert, key)) as c:
        assert [m.data for m in c.pull("orders", 0, 10)] == [b"a", b"b"]  # bob's push: refused


def test_demo_over_mutual_tls_shows_a_read_only_client_refused():
    r = CliRunner().invoke(node_command, ["demo", "--no-spark", "--tls"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    out = " ".join(r.output.split())
    assert "mutual TLS" in out and "pulled" in out
    assert "his push is refused: permission denied: cn:bob may not push to stream" in out
