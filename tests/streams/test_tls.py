"""TLS on the stream service (issue 15 §1): TLS 1.3, mutual TLS, refused handshakes.

Certificates come from ``streams.tls.write_test_pki`` (the ``cryptography`` package): a CA, a
server certificate for 127.0.0.1/localhost, client certificates; a second, unrelated CA plays
the stranger. Every server is a real ``StreamServer`` on loopback; every client a real client.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest

from loglake.errors import Unavailable
from loglake.streams.client import (
    AsyncStreamClient,
    StreamClient,
    TlsError,
)
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService
from loglake.streams.tls import (
    TlsConfigError,
    client_context,
    server_context,
    write_test_pki,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return write_test_pki(tmp_path_factory.mktemp("pki"), ("alice",))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory):
    """Another CA with a client named alice too: same name, wrong issuer."""
    return write_test_pki(tmp_path_factory.mktemp("pki-other"), ("alice",), ca_name="other CA")


@pytest.fixture
def tls_server(pki, memory_log):
    ctx = server_context(pki.server_cert, pki.server_key)
    with BackgroundServer(StreamService(memory_log), tls=ctx) as srv:
        yield srv


@pytest.fixture
def mtls_server(pki, memory_log):
    ctx = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)
    with BackgroundServer(StreamService(memory_log), tls=ctx) as srv:
        yield srv


def alice(pki) -> ssl.SSLContext:
    cert, key = pki.clients["alice"]
    return client_context(pki.ca, cert, key)


def test_a_client_trusting_the_ca_works_over_tls(pki, tls_server):
    with StreamClient(port=tls_server.port, timeout=10, tls=client_context(pki.ca)) as c:
        assert isinstance(c.sock, ssl.SSLSocket)
        assert c.sock.version() == "TLSv1.3"
        c.create_stream("s", 2)
        assert c.push_many("s", [b"a", b"b"], partition=1) == [0, 1]
        assert [m.data for m in c.pull("s", 0, 10, partition=1)] == [b"a", b"b"]
        assert c.save_index("me", "s", 2, 1) == 2


def test_localhost_is_a_name_the_server_certificate_carries(pki, tls_server):
    with StreamClient("localhost", tls_server.port, timeout=10, tls=client_context(pki.ca)) as c:
        assert c.list_streams() == []


def test_a_client_that_does_not_trust_the_servers_ca_refuses_it(stranger, tls_server):
    with pytest.raises(TlsError, match="certificate verify failed"):
        StreamClient(port=tls_server.port, timeout=10, tls=client_context(stranger.ca))


def test_a_server_certificate_for_another_name_is_refused(pki, tls_server):
    with pytest.raises(TlsError, match=r"match|mismatch"):
        StreamClient(
            port=tls_server.port,
            timeout=10,
            tls=client_context(pki.ca),
            server_hostname="elsewhere.example",
        )


def test_tls_1_2_is_refused(pki, tls_server):
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(pki.ca)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(TlsError):
        StreamClient(port=tls_server.port, timeout=10, tls=old)


def test_mutual_tls_client_with_its_certificate_works(pki, mtls_server):
    with StreamClient(port=mtls_server.port, timeout=10, tls=alice(pki)) as c:
        c.create_stream("s")
        assert c.push("s", b"x") == 0


def test_mutual_tls_without_a_client_certificate_is_refused_at_connect(pki, mtls_server):
    with pytest.raises(TlsError, match=r"refused|certificate"):
        StreamClient(port=mtls_server.port, timeout=10, tls=client_context(pki.ca))


def test_mutual_tls_with_a_certificate_from_another_ca_is_refused(pki, stranger, mtls_server):
    cert, key = stranger.clients["alice"]  # same CN, signed by a CA the server does not trust
    with pytest.raises(TlsError):
        StreamClient(port=mtls_server.port, timeout=10, tls=client_context(pki.ca, cert, key))


def test_a_plain_tcp_client_to_a_tls_server_fails_cleanly(tls_server):
    # the server reads our Ockam version byte as a broken ClientHello and closes: an error,
    # not a hang
    with StreamClient(port=tls_server.port, timeout=10) as c, pytest.raises(Unavailable):
        c.list_streams()


def test_a_silent_client_is_dropped_after_the_handshake_timeout(pki, memory_log):
    ctx = server_context(pki.server_cert, pki.server_key)
    with (
        BackgroundServer(StreamService(memory_log), tls=ctx, handshake_timeout=0.3) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s,
    ):
        assert s.recv(10) == b""  # closed by the server, never sent a byte


def test_async_client_over_mutual_tls(pki, mtls_server):
    async def main():
        c = await AsyncStreamClient.connect(port=mtls_server.port, tls=alice(pki))
        try:
            await c.create_stream("s")
            assert await c.push_many("s", [b"a", b"b"]) == [0, 1]
            assert [m.data for m in await c.pull("s", 0, 5)] == [b"a", b"b"]
        finally:
            await c.close()
        with pytest.raises(TlsError):
            await AsyncStreamClient.connect(port=mtls_server.port, tls=client_context(pki.ca))

    asyncio.run(main())


def test_bad_tls_files_are_a_typed_error(tmp_path, pki):
    with pytest.raises(TlsConfigError):
        server_context(tmp_path / "missing.crt", pki.server_key)
    with pytest.raises(TlsConfigError):
        server_context(pki.server_cert, pki.clients["alice"][1])  # key of another cert
    with pytest.raises(TlsConfigError):
        client_context(tmp_path / "missing-ca.pem")
