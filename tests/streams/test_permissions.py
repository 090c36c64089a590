"""Who may do what (issue 15 §1): client-certificate names → per-stream read/write/admin.

The policy is tested alone (parsing, patterns, what each permission allows), then through a real
mTLS server and real clients: a refused create, push, pull, index get/save is an ``error`` reply
naming the action (the client raises ``PermissionDenied``), and the connection carries on.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from loglake.streams.client import AsyncStreamClient, PermissionDenied, StreamClient
from loglake.streams.permissions import (
    ANONYMOUS,
    AccessConfigError,
    AccessPolicy,
    Peer,
    Permission,
    peer_from_certificate,
)
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.streams.tls import client_context, server_context, write_test_pki
from loglake.wire.ockam import Address

ACCESS_TOML = """
[[grant]]
identities = ["cn:alice"]
streams = ["orders", "orders.*"]
allow = ["admin"]

[[grant]]
identities = ["cn:bob"]
streams = ["orders*"]
allow = ["read"]

[[grant]]
identities = ["uri:loglake://client/carol"]
streams = ["orders"]
allow = ["write"]

[[grant]]
identities = ["*"]
streams = ["public.*"]
allow = ["read"]
"""
R, W, A = Permission.READ, Permission.WRITE, Permission.ADMIN


def peer(*names: str) -> Peer:
    return Peer(frozenset({"*", *names}))


# -- the policy alone -------------------------------------------------------------------------
def test_names_of_a_certificate_as_getpeercert_gives_them():
    cert = {
        "subject": ((("organizationName", "x"),), (("commonName", "alice"),)),
        "subjectAltName": (("DNS", "a.example"), ("URI", "spiffe://t/a"), ("IP Address", "::1")),
    }
    assert peer_from_certificate(cert).names == {
        "*",
        "cn:alice",
        "dns:a.example",
        "uri:spiffe://t/a",
        "ip:::1",
    }
    assert peer_from_certificate(None) is ANONYMOUS
    assert peer_from_certificate({}) is ANONYMOUS


def test_grants_add_up_and_admin_implies_read_and_write(tmp_path):
    (tmp_path / "a.toml").write_text(ACCESS_TOML)
    p = AccessPolicy.load(tmp_path / "a.toml")
    assert p.permissions(peer("cn:alice"), "orders.eu") == {R, W, A}
    assert p.permissions(peer("cn:alice"), "ordersX") == set()  # "orders.*" needs the dot
    assert p.permissions(peer("cn:bob"), "ordersX") == {R}
    assert p.permissions(peer("uri:loglake://client/carol"), "orders") == {W}
    assert p.permissions(peer("cn:carol"), "orders") == set()  # the grant names her URI
    assert p.permissions(peer("cn:anyone"), "public.news") == {R}
    assert p.permissions(ANONYMOUS, "public.news") == set()  # "*" is verified peers only


def test_json_access_file_is_the_same_shape(tmp_path):
    doc = {"grant": [{"identities": ["anonymous"], "streams": ["*"], "allow": ["read"]}]}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    p = AccessPolicy.load(tmp_path / "a.json")
    assert p.permissions(ANONYMOUS, "x") == {R}
    assert p.refusal(ANONYMOUS, "push to", "x") == (
        "permission denied: anonymous may not push to stream 'x' (needs write)"
    )


@pytest.mark.parametrize(
    "text, says",
    [
        ("[[grant]]\nidentities=['alice']\nstreams=['x']\nallow=['read']", "identity 'alice'"),
        ("[[grant]]\nidentities=['cn:a']\nstreams=[]\nallow=['read']", "streams"),
        ("[[grant]]\nidentities=['cn:a']\nstreams=['x']\nallow=['delete']", "allow 'delete'"),
        ("[[grant]]\nidentities=['cn:a']\nstreams=['x']", "expected identities, streams, allow"),
        ("[users]\nx=1", "only [[grant]]"),
        ("[[grant", "Expected"),
    ],
)
def test_bad_access_files_are_a_typed_error_naming_the_problem(tmp_path, text, says):
    (tmp_path / "a.toml").write_text(text)
    with pytest.raises(AccessConfigError, match=r"a\.toml") as e:
        AccessPolicy.load(tmp_path / "a.toml")
    assert says in str(e.value)


# -- through a real mTLS server ---------------------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return write_test_pki(tmp_path_factory.mktemp("pki"), ("alice", "bob", "carol", "mallory"))


@pytest.fixture
def server(pki, memory_log, tmp_path):
    (tmp_path / "access.toml").write_text(ACCESS_TOML)
    service = StreamService(memory_log, access=AccessPolicy.load(tmp_path / "access.toml"))
    ctx = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)
    with BackgroundServer(service, tls=ctx) as srv:
        yield srv


def connect(pki, server, who: str) -> StreamClient:
    cert, key = pki.clients[who]
    return StreamClient(port=server.port, timeout=10, tls=client_context(pki.ca, cert, key))


def knows(c: StreamClient, stream: str, partition: int = 0) -> None:
    """Give the client the worker address without asking the service (it is derived from the
    name), so the request reaches the worker and the worker's own check answers."""
    c.addresses.map[(stream, partition)] = (Address.local(worker_address(stream, partition)),)


@pytest.fixture
def orders(pki, server):
    with connect(pki, server, "alice") as a:
        a.create_stream("orders", 2)
        a.push_many("orders", [b"o1", b"o2"], partition=1)
    return "orders"


def test_admin_creates_writes_reads_and_saves_indexes(pki, server, orders):
    with connect(pki, server, "alice") as a:
        assert a.create_stream("orders.eu") == "orders.eu"
        assert a.push("orders.eu", b"x") == 0
        assert [m.data for m in a.pull("orders", 0, 5, partition=1)] == [b"o1", b"o2"]
        assert a.save_index("billing", "orders", 1, partition=1) == 1


def test_a_client_without_permission_cannot_create_push_pull_or_save_an_index(pki, server, orders):
    with connect(pki, server, "mallory") as m:
        with pytest.raises(PermissionDenied, match="cn:mallory may not create stream 'evil'"):
            m.create_stream("evil")
        with pytest.raises(PermissionDenied, match="may not create stream 'orders'"):
            m.create_stream("orders", 2)  # not even opening it: no permission at all
        with pytest.raises(PermissionDenied, match="may not see stream 'orders'"):
            m.push("orders", b"x")  # the client's stream-info lookup is refused first
        knows(m, "orders", 1)
        with pytest.raises(PermissionDenied, match="may not push to stream 'orders'"):
            m.push("orders", b"x", partition=1)
        with pytest.raises(PermissionDenied, match="may not push to stream 'orders'"):
            m.push_many("orders", [b"x"] * 50, partition=1)  # all refused, each answered
        with pytest.raises(PermissionDenied, match="may not pull from stream 'orders'"):
            m.pull("orders", 0, 10, partition=1)
        # a save is a cast (refusal only logged); the client's get after it is refused
        with pytest.raises(PermissionDenied, match="may not get the consumer index of"):
            m.save_index("billing", "orders", 2, partition=1)
        with pytest.raises(PermissionDenied, match="may not get the consumer index of"):
            m.get_index("billing", "orders", partition=1)
        knows(m, "nosuch")
        with pytest.raises(PermissionDenied, match="may not use stream 'nosuch'"):
            m.pull("nosuch", 0, 1)  # refused, not "unknown": existence is not revealed
        # the connection is kept: the same client still gets answers
        assert m.list_streams() == []  # a listing shows only what it may see
    with connect(pki, server, "alice") as a:  # nothing of the refused requests landed
        assert [x.data for x in a.pull("orders", 0, 100, partition=1)] == [b"o1", b"o2"]
        assert a.get_index("billing", "orders", partition=1) == 0
        assert "evil" not in a.list_streams()


def test_a_read_only_client_reads_but_cannot_push_or_create(pki, server, orders):
    with connect(pki, server, "bob") as b:
        assert [m.data for m in b.pull("orders", 0, 5, partition=1)] == [b"o1", b"o2"]
        with pytest.raises(PermissionDenied, match="cn:bob may not push to stream 'orders'"):
            b.push("orders", b"nope", partition=1)
        assert b.save_index("bob", "orders", 2, partition=1) == 2  # a consumer saves its index
        with pytest.raises(PermissionDenied, match=r"may not create stream 'orders\.new'"):
            b.create_stream("orders.new")  # read on orders* is not admin
        assert b.list_streams() == ["orders"]
        assert len(b.pull("orders", 0, 5, partition=1)) == 2  # still connected, nothing added


def test_a_write_only_client_pushes_but_cannot_pull(pki, server, orders):
    with connect(pki, server, "carol") as c:  # granted by her certificate's URI SAN
        assert c.push("orders", b"c1") == 0
        with pytest.raises(PermissionDenied, match="may not pull from stream 'orders'"):
            c.pull("orders", 0, 5)
        assert c.push("orders", b"c2") == 1


def test_async_client_refused_push_then_allowed_calls_on_the_same_connection(pki, server, orders):
    async def main():
        cert, key = pki.clients["bob"]
        c = await AsyncStreamClient.connect(port=server.port, tls=client_context(pki.ca, cert, key))
        try:
            with pytest.raises(PermissionDenied, match="may not push to"):
                await c.push_many("orders", [b"x"] * 20, partition=1)
            got = await c.pull("orders", 0, 5, partition=1)
            assert [m.data for m in got] == [b"o1", b"o2"]
        finally:
            await c.close()

    asyncio.run(main())


def test_tls_without_client_certificates_maps_everyone_to_anonymous(pki, memory_log):
    doc = {"grant": [{"identities": ["anonymous"], "streams": ["public.*"], "allow": ["admin"]}]}
    service = StreamService(memory_log, access=AccessPolicy.from_dict(doc))
    ctx = server_context(pki.server_cert, pki.server_key)
    with (
        BackgroundServer(service, tls=ctx) as srv,
        StreamClient(port=srv.port, timeout=10, tls=client_context(pki.ca)) as c,
    ):
        c.create_stream("public.news")
        assert c.push("public.news", b"hi") == 0
        with pytest.raises(PermissionDenied, match="anonymous may not create stream 'private'"):
            c.create_stream("private")
