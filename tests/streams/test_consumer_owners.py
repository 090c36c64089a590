"""Consumers belong to someone: under an access file the first identity to save a client id's
index owns it; another identity needs a ``consume`` grant; an operator (``admin``) resets or
deletes an index. Tested on the store (durable owners, the entry format, damage), the policy,
and through a real mutual-TLS server with real clients, including the bounded attacks: a save of
2^64-1 for another identity's consumer, a ``read`` grant overwriting a consumer, and an
operator un-sticking a consumer stuck at 2^64-1.
"""

from __future__ import annotations

import json
import struct
import sys

import pytest
from click.testing import CliRunner
from crc32c import crc32c

from loglake.log import open_log
from loglake.log.api import CorruptStore, NotOwner, StreamConfig, UnknownPartition
from loglake.log.consumer_store import FILE_NAME, encode_entry
from loglake.streams import codec
from loglake.streams.cli import command as stream_command
from loglake.streams.client import IndexNotSaved, PermissionDenied, StreamClient
from loglake.streams.codec import LOGLAKE_INDEX_RESET
from loglake.streams.messages import GetIndex, Index
from loglake.streams.permissions import AccessConfigError, AccessPolicy, Peer, Permission
from loglake.streams.server import BackgroundServer
from loglake.streams.service import INDEX_SERVICE_ADDRESS, StreamService
from loglake.streams.tls import client_context, server_context, write_test_pki
from loglake.wire.ockam import route
from tests.procs import free_port, process

TOP = 2**64 - 1
ACCESS_TOML = """
[[grant]]
identities = ["cn:alice"]
streams = ["orders"]
allow = ["admin"]

[[grant]]
identities = ["cn:bob", "cn:mallory"]
streams = ["orders"]
allow = ["read"]

[[grant]]
identities = ["cn:carol"]
streams = ["orders"]
clients = ["billing-*"]
allow = ["consume"]
"""


# -- the store ---------------------------------------------------------------------------------
def test_owner_reset_and_delete_are_durable(tmp_path):
    log = open_log(tmp_path)
    log.create_stream("s")
    assert log.save_index_as("c", "s", 5, "cn:bob") == 5
    with pytest.raises(NotOwner, match="belongs to cn:bob; cn:mallory may not"):
        log.save_index_as("c", "s", TOP, "cn:mallory")
    assert log.save_index_as("c", "s", 7, "cn:carol", override=True) == 7
    log.close()
    log = open_log(tmp_path)  # the owner came back from disk, not the carol override
    assert (log.get_index("c", "s"), log.index_owner("c", "s")) == (7, "cn:bob")
    assert log.reset_index("c", "s", 2) == 7  # lower: only an operator's reset does this
    log.close()
    log = open_log(tmp_path)
    assert (log.get_index("c", "s"), log.index_owner("c", "s")) == (2, "cn:bob")
    assert log.reset_index("c", "s", None) == 2
    log.close()
    log = open_log(tmp_path)
    assert (log.get_index("c", "s"), log.index_owner("c", "s")) == (None, None)
    assert log.save_index_as("c", "s", 1, "cn:mallory") == 1  # deleted: a new owner
    assert log.index_owner("c", "s") == "cn:mallory"
    log.close()


def test_entries_without_an_owner_are_the_old_shape_and_still_load(tmp_path):
    # the format before owners, built by hand: length crc | index partition clen client slen s
    body = struct.pack("<QIH", 9, 0, 1) + b"c" + struct.pack("<H", 1) + b"s"
    old = struct.pack("<II", len(body), crc32c(body)) + body
    assert encode_entry("c", "s", 0, 9) == old  # a plain save still writes exactly that
    log = open_log(tmp_path)
    log.create_stream("s")
    log.close()
    (tmp_path / FILE_NAME).write_bytes(old)
    log = open_log(tmp_path)
    assert (log.get_index("c", "s"), log.index_owner("c", "s")) == (9, None)
    assert log.save_index_as("c", "s", 3, "cn:bob") == 9  # claims it, keeps the higher
    assert log.index_owner("c", "s") == "cn:bob"
    log.close()


def test_an_entry_with_a_bad_kind_before_others_is_damage_not_a_torn_tail(tmp_path):
    log = open_log(tmp_path)
    log.create_stream("s")
    log.close()
    body = bytearray(encode_entry("c", "s", 0, 1, 1, "cn:x")[8:])
    body[8 + 4 + 2 + 1 + 2 + 1] = 7  # kind 7 does not exist
    bad = struct.pack("<II", len(body), crc32c(bytes(body))) + bytes(body)
    (tmp_path / FILE_NAME).write_bytes(bad + encode_entry("d", "s", 0, 1))
    with pytest.raises(CorruptStore, match="not at the tail"):
        open_log(tmp_path)


# -- the policy --------------------------------------------------------------------------------
def test_consume_grants_cover_streams_and_client_id_patterns(tmp_path):
    (tmp_path / "a.toml").write_text(ACCESS_TOML)
    p = AccessPolicy.load(tmp_path / "a.toml")
    carol = Peer(frozenset({"*", "cn:carol"}))
    assert p.permissions(carol, "orders") == {Permission.CONSUME}
    assert p.may_consume(carol, "orders", "billing-eu")
    assert not p.may_consume(carol, "orders", "shipping")
    assert not p.may_consume(carol, "orders2", "billing-eu")
    assert not p.may_consume(Peer(frozenset({"*", "cn:bob"})), "orders", "billing-eu")


@pytest.mark.parametrize(
    "text, says",
    [
        ("identities=['cn:a']\nstreams=['x']\nallow=['consume']\nclients=[]", "clients"),
        ("identities=['cn:a']\nstreams=['x']\nallow=['consume']\nclients='b*'", "are lists"),
        ("identities=['cn:a']\nstreams=['x']\nallow=['consume']\nowner=['b']", "optionally"),
    ],
)
def test_bad_clients_in_an_access_file_are_a_typed_error(tmp_path, text, says):
    (tmp_path / "a.toml").write_text("[[grant]]\n" + text)
    with pytest.raises(AccessConfigError, match=r"a\.toml") as e:
        AccessPolicy.load(tmp_path / "a.toml")
    assert says in str(e.value)


# -- through a real mutual-TLS server ---------------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return write_test_pki(tmp_path_factory.mktemp("pki"), ("alice", "bob", "carol", "mallory"))


@pytest.fixture
def log(tmp_path):
    log = open_log(tmp_path / "data")
    log.create_stream("orders", StreamConfig(partitions=2))
    yield log
    log.close()


@pytest.fixture
def server(pki, log, tmp_path):
    (tmp_path / "access.toml").write_text(ACCESS_TOML)
    service = StreamService(log, access=AccessPolicy.load(tmp_path / "access.toml"))
    ctx = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)
    with BackgroundServer(service, tls=ctx) as srv:
        yield srv


def connect(pki, server, who: str) -> StreamClient:
    cert, key = pki.clients[who]
    return StreamClient(port=server.port, timeout=10, tls=client_context(pki.ca, cert, key))


def test_another_identity_saving_top_index_is_refused_and_the_owner_carries_on(pki, server, log):
    with connect(pki, server, "bob") as bob, connect(pki, server, "mallory") as mallory:
        assert bob.save_index("billing-eu", "orders", 3, partition=1) == 3
        with pytest.raises(IndexNotSaved, match="another identity"):
            mallory.save_index("billing-eu", "orders", TOP, partition=1)
        assert bob.get_index("billing-eu", "orders", partition=1) == 3
        assert bob.save_index("billing-eu", "orders", 4, partition=1) == 4
        # mallory's read grant still reads others' consumers and saves her own
        assert mallory.get_index("billing-eu", "orders", partition=1) == 4
        assert mallory.save_index("mine", "orders", 2) == 2
    assert log.index_owner("billing-eu", "orders", partition=1) == "cn:bob"
    assert log.index_owner("mine", "orders") == "cn:mallory"


def test_a_consume_grant_saves_the_consumers_it_names_only(pki, server, log):
    with connect(pki, server, "bob") as bob, connect(pki, server, "carol") as carol:
        bob.save_index("billing-eu", "orders", 3)
        bob.save_index("shipping", "orders", 3)
        assert carol.save_index("billing-eu", "orders", 8) == 8
        assert carol.get_index("billing-eu", "orders") == 8
        with pytest.raises(PermissionDenied, match=r"cn:carol may not (save|get)"):
            carol.save_index("shipping", "orders", 9)
        assert bob.get_index("shipping", "orders") == 3
    assert log.index_owner("billing-eu", "orders") == "cn:bob"  # carol did not take it


def test_an_operator_reset_unsticks_a_consumer_stuck_at_the_top(pki, server, log):
    with connect(pki, server, "bob") as bob, connect(pki, server, "alice") as alice:
        bob.save_index("billing-eu", "orders", TOP)  # stuck: indexes only go up
        assert bob.save_index("billing-eu", "orders", 5) == TOP
        with pytest.raises(PermissionDenied, match="cn:bob may not reset the consumer index"):
            bob.reset_index("billing-eu", "orders", 0)
        assert alice.reset_index("billing-eu", "orders", 0) == 0
        assert bob.save_index("billing-eu", "orders", 5) == 5
        assert alice.reset_index("billing-eu", "orders", None) is None
        assert bob.get_index("billing-eu", "orders") == 0  # a new record, as the spec says
        with pytest.raises(UnknownPartition):  # a typed error, never "internal error"
            alice.reset_index("billing-eu", "orders", 0, partition=7)
    assert log.index_owner("billing-eu", "orders") is None


def test_malformed_reset_requests_are_dropped_and_the_connection_carries_on(memory_log):
    memory_log.create_stream("s")
    bad = [b"", b"\x01c", b"\x01c\x01s\x00\x02", b"\x01c\x01s\x00\x01" + b"\xff" * 11]
    with (
        BackgroundServer(StreamService(memory_log)) as srv,
        StreamClient(port=srv.port, timeout=10) as c,
    ):
        c.save_index("x", "s", TOP)
        casts = b"".join(
            c.core.cast(route(INDEX_SERVICE_ADDRESS), codec.encode_base(LOGLAKE_INDEX_RESET, d))
            for d in bad
        )
        get = codec.encode_payload(GetIndex("x", "s"))
        reply = c._call(route(INDEX_SERVICE_ADDRESS), get, 1, casts)[0]
        assert codec.decode_response(reply.payload, Index).index == TOP  # nothing moved it
        assert c.reset_index("x", "s", 1) == 1  # auth off: any client may (the banner says)
        assert c.get_index("x", "s") == 1


# -- the CLI against a real `loglake serve` ----------------------------------------------------
def serve_cmd(root, port, *extra):
    return [
        sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(root / "data"),
        "--port", str(port), *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_cli_index_reset_and_delete_against_a_served_mtls_service(pki, tmp_path):
    (tmp_path / "access.toml").write_text(ACCESS_TOML)
    port = free_port()
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    tls += ["--tls-client-ca", str(pki.ca), "--access", str(tmp_path / "access.toml")]
    out = tmp_path / "serve.err"
    with out.open("wb") as err, process(serve_cmd(tmp_path, port, *tls), port, stderr=err):

        def cli(who, *args):
            cert, key = pki.clients[who]
            opts = ["--port", str(port), "--tls-ca", str(pki.ca)]
            opts += ["--tls-cert", str(cert), "--tls-key", str(key)]
            return CliRunner().invoke(stream_command, [*opts, *args])

        assert cli("alice", "create", "orders").exit_code == 0
        r = cli("bob", "index", "billing", "orders", "--save", str(TOP), "--json")
        assert json.loads(r.output)["index"] == TOP  # the old spelling: a get/save
        r = cli("bob", "index", "reset", "billing", "orders")
        assert r.exit_code != 0 and isinstance(r.exception, PermissionDenied)
        r = cli("alice", "index", "reset", "billing", "orders", "--to", "3", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["index"] == 3
        r = cli("mallory", "index", "billing", "orders", "--save", "9")
        assert isinstance(r.exception, IndexNotSaved)  # still bob's after the reset
        assert json.loads(cli("bob", "index", "billing", "orders", "--json").output)["index"] == 3
        r = cli("alice", "index", "delete", "billing", "orders")
        assert r.exit_code == 0 and "deleted" in r.output
        r = cli("mallory", "index", "billing", "orders", "--save", "9", "--json")
        assert json.loads(r.output)["index"] == 9  # deleted: mallory is its first saver now
        r = CliRunner().invoke(stream_command, ["index", "reset", "--help"])
        assert r.exit_code == 0 and "--to" in r.output
    assert "consumers belong to no one" not in out.read_text()


@pytest.mark.slow
def test_serve_without_access_says_any_client_can_move_any_consumer(tmp_path):
    port = free_port()
    out = tmp_path / "serve.err"
    with out.open("wb") as err, process(serve_cmd(tmp_path, port), port, stderr=err):
        with StreamClient(port=port, timeout=10) as c:
            c.create_stream("s")
            c.save_index("x", "s", TOP)
        r = CliRunner().invoke(stream_command, ["--port", str(port), "index", "reset", "x", "s"])
        assert r.exit_code == 0 and "index 0" in r.output
    text = " ".join(out.read_text().split())
    assert "any client can save, and so move, any consumer's index" in text
