"""Consumer owners on the JetStream backend: the owner is kept with the index in the KV bucket's
value (``b"<index>\\n<owner>"``), so ``serve``/``node`` with ``--backend`` and an access file
keep consumers owned as the embedded log does — checked on a real server against the same
rules as ``test_consumer_owners.py``, through a real mutual-TLS stream server, with values
written before owners existed, with damaged values, and with savers racing for a new consumer.
"""

from __future__ import annotations

import threading

import pytest

from loglake.log.api import NotOwner, StreamConfig
from loglake.streams.client import IndexNotSaved, PermissionDenied, StreamClient
from loglake.streams.jetstream import (
    BadIndexValue,
    JetStreamLog,
    decode_index_value,
    encode_index_value,
)
from loglake.streams.permissions import AccessPolicy
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService
from loglake.streams.tls import client_context, server_context, write_test_pki
from tests.nats_cluster import NatsCluster
from tests.streams.jetstream_fixtures import new_prefix
from tests.streams.test_consumer_owners import ACCESS_TOML

TOP = 2**64 - 1


@pytest.fixture
def jlog(nats_single: NatsCluster):
    log = JetStreamLog(nats_single.url, prefix=new_prefix())
    log.create_stream("orders", StreamConfig(partitions=2))
    yield log
    log.close()


def raw_put(log: JetStreamLog, client: str, stream: str, partition: int, value: bytes) -> None:
    """Write a bucket value as something other than loglake would (an older version, a tool)."""
    log.call(log.kv.put(log._key(client, stream, partition), value))


def test_owner_reset_and_delete_live_in_the_cluster(jlog: JetStreamLog, nats_single) -> None:
    assert jlog.save_index_as("c", "orders", 5, "cn:bob", partition=0) == 5
    with pytest.raises(NotOwner, match="belongs to cn:bob; cn:mallory may not"):
        jlog.save_index_as("c", "orders", TOP, "cn:mallory", partition=0)
    assert jlog.get_index("c", "orders") == 5  # the refused save wrote nothing
    assert jlog.save_index_as("c", "orders", 7, "cn:carol", partition=0, override=True) == 7
    # another process on the same cluster sees the owner (not the override's identity)
    other = JetStreamLog(nats_single.url, prefix=jlog.options.prefix)
    try:
        assert (other.get_index("c", "orders"), other.index_owner("c", "orders")) == (7, "cn:bob")
        assert other.reset_index("c", "orders", 2) == 7  # lower: only an operator's reset
        assert (jlog.get_index("c", "orders"), jlog.index_owner("c", "orders")) == (2, "cn:bob")
        assert other.reset_index("c", "orders", None) == 2
    finally:
        other.close()
    assert (jlog.get_index("c", "orders"), jlog.index_owner("c", "orders")) == (None, None)
    assert (
        jlog.save_index_as("c", "orders", 1, "cn:mallory", partition=0) == 1
    )  # deleted: a new owner
    assert jlog.index_owner("c", "orders") == "cn:mallory"
    assert jlog.consumer_indexes() == {("c", "orders", 0): 1}


def test_a_lower_save_keeps_the_index_and_an_equal_save_by_the_owner_writes_nothing(
    jlog: JetStreamLog,
) -> None:
    assert jlog.save_index_as("c", "orders", 9, "cn:bob", partition=1) == 9
    key = jlog._key("c", "orders", 1)
    revision = jlog.call(jlog.kv.get(key)).revision
    assert jlog.save_index_as("c", "orders", 3, "cn:bob", partition=1) == 9
    assert jlog.save_index_as("c", "orders", 9, "cn:bob", partition=1) == 9
    assert jlog.save_index("c", "orders", 4, partition=1) == 9  # unauthenticated saves: same rule
    assert jlog.call(jlog.kv.get(key)).revision == revision
    assert jlog.save_index("c", "orders", 10, partition=1) == 10
    assert jlog.index_owner("c", "orders", partition=1) == "cn:bob"  # a plain save keeps the owner


def test_values_written_before_owners_existed_read_unchanged_and_can_be_claimed(
    jlog: JetStreamLog,
) -> None:
    raw_put(jlog, "old", "orders", 0, b"42")
    assert (jlog.get_index("old", "orders"), jlog.index_owner("old", "orders")) == (42, None)
    assert jlog.consumer_indexes() == {("old", "orders", 0): 42}
    # the first authenticated save claims it, even at a lower index (which does not move it)
    assert jlog.save_index_as("old", "orders", 40, "cn:bob", partition=0) == 42
    assert jlog.index_owner("old", "orders") == "cn:bob"
    assert jlog.call(jlog.kv.get(jlog._key("old", "orders", 0))).value == b"42\ncn:bob"


@pytest.mark.parametrize("value", [b"x", b"9\n", b"-1", b"\xff\xfe", b"\n", b"1 2", "٣".encode()])
def test_a_value_that_is_not_an_index_is_a_typed_error_and_skipped_in_listings(
    jlog: JetStreamLog, value: bytes
) -> None:
    raw_put(jlog, "bad", "orders", 0, value)
    jlog.save_index("good", "orders", 3)
    with pytest.raises(BadIndexValue, match="not an index"):
        jlog.get_index("bad", "orders")
    with pytest.raises(BadIndexValue):
        jlog.save_index_as("bad", "orders", 5, "cn:bob", partition=0)
    assert jlog.consumer_indexes() == {("good", "orders", 0): 3}
    assert jlog.reset_index("good", "orders", 0) == 3  # the others carry on


@pytest.mark.parametrize(
    ("value", "decoded"),
    [(b"0", (0, None)), (b"18446744073709551615", (TOP, None)), (b"7\na\nb", (7, "a\nb"))],
)
def test_value_format(value: bytes, decoded: tuple) -> None:
    assert decode_index_value(value) == decoded
    assert encode_index_value(*decoded) == value


def test_savers_racing_for_a_new_consumer_leave_exactly_one_owner(jlog: JetStreamLog) -> None:
    who = [f"cn:w{i}" for i in range(6)]
    won: list[str] = []
    refused: list[str] = []
    barrier = threading.Barrier(len(who))

    def save(w: str) -> None:
        barrier.wait(10)
        try:
            jlog.save_index_as("race", "orders", 1, w, partition=0)
            won.append(w)
        except NotOwner:
            refused.append(w)

    threads = [threading.Thread(target=save, args=(w,)) for w in who]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    owner = jlog.index_owner("race", "orders")
    assert won == [owner] and sorted(refused + won) == sorted(who)


# -- through a real mutual-TLS stream server on the JetStream backend ---------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return write_test_pki(tmp_path_factory.mktemp("pki"), ("alice", "bob", "carol", "mallory"))


@pytest.fixture
def server(pki, jlog, tmp_path):
    (tmp_path / "access.toml").write_text(ACCESS_TOML)
    service = StreamService(jlog, access=AccessPolicy.load(tmp_path / "access.toml"))
    ctx = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)
    with BackgroundServer(service, tls=ctx) as srv:
        yield srv


def connect(pki, server, who: str) -> StreamClient:
    cert, key = pki.clients[who]
    return StreamClient(port=server.port, timeout=10, tls=client_context(pki.ca, cert, key))


def test_served_on_jetstream_another_identity_cannot_move_a_consumer(pki, server, jlog) -> None:
    with (
        connect(pki, server, "bob") as bob,
        connect(pki, server, "mallory") as mallory,
        connect(pki, server, "carol") as carol,
        connect(pki, server, "alice") as alice,
    ):
        assert bob.save_index("billing-eu", "orders", 3, partition=1) == 3
        with pytest.raises(IndexNotSaved, match="another identity"):
            mallory.save_index("billing-eu", "orders", TOP, partition=1)
        assert bob.get_index("billing-eu", "orders", partition=1) == 3
        assert carol.save_index("billing-eu", "orders", 8, partition=1) == 8  # consume grant
        with pytest.raises(PermissionDenied, match="cn:bob may not reset"):
            bob.reset_index("billing-eu", "orders", 0, partition=1)
        assert alice.reset_index("billing-eu", "orders", 0, partition=1) == 0
        assert bob.save_index("billing-eu", "orders", 5, partition=1) == 5
    assert jlog.index_owner("billing-eu", "orders", partition=1) == "cn:bob"


def test_the_consumers_list_is_empty_on_an_empty_bucket_and_leaves_deleted_keys_out(
    jlog: JetStreamLog,
) -> None:
    """The list is read from the bucket stream's per-subject state, not nats-py's key
    watcher (whose initial replay can end early and list too few keys)."""
    assert jlog.consumer_indexes() == {}
    for i in range(30):
        jlog.save_index(f"c{i}", "orders", i + 1, partition=i % 2)
    jlog.reset_index("c7", "orders", None, partition=1)
    want = {(f"c{i}", "orders", i % 2): i + 1 for i in range(30) if i != 7}
    assert jlog.consumer_indexes() == want
