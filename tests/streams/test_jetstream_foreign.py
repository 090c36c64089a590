"""What other clients of the cluster do to the JetStream streams and buckets loglake uses
(streams/jetstream.py): records published straight onto a partition's subject with headers
loglake cannot read, consumer-index values no uint64 holds, a partition stream deleted by an
operator. loglake answers each with what the cluster really holds or a typed error, and keeps
serving."""

from __future__ import annotations

import base64
import time

import nats.js.errors
import pyarrow.parquet as pq
import pytest

from loglake.log import StreamConfig, StreamExists, UnknownStream
from loglake.log.api import INDEX_MAX, InvalidStreamName
from loglake.streams.jetstream import (
    ABSENT_DOUBT,
    BadIndexValue,
    ConsumerKeyTooLong,
    JetStreamError,
    JetStreamLog,
)
from loglake.streams.jetstream_seal import JetStreamSealer, sealed_next
from tests.streams import jetstream_fixtures as fx

pytestmark = pytest.mark.slow  # a real nats-server


@pytest.fixture
def jlog(nats_single, tmp_path):
    log = JetStreamLog(
        nats_single.url,
        prefix=fx.new_prefix(),
        lake_dir=str(tmp_path),
        request_timeout=2.0,
        push_timeout=3.0,
    )
    yield log
    log.close()


def publish_raw(log: JetStreamLog, stream: str, data: bytes, headers: dict[str, str]) -> None:
    """A message another NATS client puts on the partition's subject (nats-py, not loglake)."""
    log.call(log.js.publish(log.subject(stream, 0), data, headers=headers))


FOREIGN = [  # loglake's own header names, values loglake never writes
    {"Loglake-Key": "!!not base64"},
    {"Loglake-Key": "YQ"},  # base64 without its padding
    {"Loglake-Headers": "not json"},
    {"Loglake-Headers": '[["a"]]'},
    {"Loglake-Headers": '{"a": "YQ=="}'},
    {"Loglake-Headers": '[[1, "YQ=="]]'},
    {"Loglake-Headers": '[["a", "%%"]]'},
    {"Loglake-Timestamp": "yesterday"},
    {"Loglake-Timestamp": "1.5"},
    {"Loglake-Timestamp": "9" * 5000},
    {"Loglake-Timestamp": str(2**63)},  # past the lake's int64 column
]


def test_records_with_loglake_headers_it_cannot_read_are_served_and_sealed(jlog, tmp_path) -> None:
    """Before: each of these records made ``read`` raise a bare ValueError (binascii, json,
    int), and the sealer — which reads records, not payloads — stopped at the first one for
    good, so retention would later drop everything after it unsealed."""
    jlog.create_stream("f")
    jlog.push_many("f", 0, [b"ours"])
    for i, headers in enumerate(FOREIGN):
        publish_raw(jlog, "f", f"theirs{i}".encode(), headers)
    good_key = base64.b64encode(b"k").decode()
    publish_raw(jlog, "f", b"readable", {"Loglake-Key": good_key, "Loglake-Timestamp": "7"})
    n = len(FOREIGN) + 2

    recs = jlog.read("f", 0, lake=False)
    assert [r.index for r in recs] == list(range(n))
    assert [r.data for r in recs[1:-1]] == [f"theirs{i}".encode() for i in range(len(FOREIGN))]
    before = time.time_ns()
    for r in recs[1:-1]:  # the unreadable field is left out; the record's time is JetStream's
        assert (r.key, r.headers) == (None, ())
        assert 0 < r.timestamp_ns <= before
    assert (recs[-1].key, recs[-1].timestamp_ns) == (b"k", 7)  # a readable one is read as ever

    sealer = JetStreamSealer(jlog, tmp_path)
    sealer.seal(["f"])
    assert sealed_next(tmp_path, "f", 0) == n
    table = pq.read_table(next((tmp_path / "lake" / "f" / "partition=0").glob("*.parquet")))
    assert table.column("data").to_pylist()[-1] == b"readable"
    assert jlog.push_many("f", 0, [b"more"]) == [n]  # and the partition takes writes


@pytest.mark.parametrize("value", [str(INDEX_MAX + 1).encode(), b"9" * 5000, b"9" * 21 + b"\nbob"])
def test_index_values_no_uint64_holds_are_bad_index_values(jlog, value: bytes) -> None:
    """Before: ``2**64`` came back from ``get_index`` (and was listed; the stream service then
    failed to encode it: "internal error: BareEncodeError"), and a 5,000-digit value raised
    Python's bare int-conversion ValueError from every call, ``consumer_indexes`` — the node's
    consumers list — included."""
    jlog.create_stream("orders")
    jlog.call(jlog.kv.put(jlog._key("bad", "orders", 0), value))
    jlog.save_index("good", "orders", INDEX_MAX)
    with pytest.raises(BadIndexValue, match="not an index"):
        jlog.get_index("bad", "orders")
    with pytest.raises(BadIndexValue):
        jlog.save_index("bad", "orders", 5)
    assert jlog.consumer_indexes() == {("good", "orders", 0): INDEX_MAX}
    assert jlog.save_index("good", "orders", 5) == INDEX_MAX  # the largest index is one


def test_the_stream_service_answers_a_bad_index_value_with_an_error_reply(jlog) -> None:
    from loglake.streams.client import StreamClient, StreamServiceError
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    jlog.create_stream("orders")
    jlog.call(jlog.kv.put(jlog._key("bad", "orders", 0), str(INDEX_MAX + 1).encode()))
    with BackgroundServer(StreamService(jlog)) as srv, StreamClient(port=srv.port) as c:
        with pytest.raises(StreamServiceError) as e:
            c.get_index("bad", "orders")
        assert "internal error" not in str(e.value) and "not an index" in str(e.value)
        assert c.push("orders", b"x") == 0  # the connection and the service carry on


def test_a_stream_deleted_outside_loglake_is_unknown_at_once_and_can_be_made_again(jlog) -> None:
    """Before: this process kept the deleted stream's partition count, so a read waited out
    ``request_timeout`` and a push ``push_timeout`` to raise ``ClusterUnavailable``,
    ``has_stream`` said True, and ``create_stream`` failed ("stream not found") until restart."""
    jlog.create_stream("d", StreamConfig(partitions=2))
    jlog.push_many("d", 1, [b"a", b"b"])
    for p in range(2):  # an operator's `nats stream rm`
        jlog.call(jlog.js.delete_stream(jlog.js_name("d", p)))

    t0 = time.monotonic()
    with pytest.raises(UnknownStream):
        jlog.read_payloads("d", 0, partition=1)
    with pytest.raises(UnknownStream):
        jlog.push_many("d", 1, [b"c"])
    with pytest.raises(UnknownStream):
        jlog.stream_info("d")
    assert time.monotonic() - t0 < 1.5  # at once, not after the deadlines (2 s, 3 s)
    assert not jlog.has_stream("d")

    jlog.create_stream("d", StreamConfig(partitions=3))  # made again, with its new shape
    assert jlog.partitions("d") == 3
    assert jlog.push_many("d", 2, [b"new"]) == [0]
    assert jlog.read_payloads("d", 0, partition=2) == [(0, b"new")]


def test_a_partition_deleted_outside_loglake_is_unknown_after_a_second_of_doubt(jlog) -> None:
    """Partition 2 of 3 deleted (``nats stream rm``) while partition 0 still names it. A server
    still making a partition another process made says "not found" too, so the answer is asked
    again for ``ABSENT_DOUBT`` (1 s), then believed: the stream's info, a
    read and a push each raise ``UnknownStream`` then, well within their deadlines (2 s, 3 s).
    A stream deleted whole is still unknown at once (the test above)."""
    jlog.create_stream("one", StreamConfig(partitions=3))
    jlog.push_many("one", 2, [b"a"])
    jlog.call(jlog.js.delete_stream(jlog.js_name("one", 2)))
    calls = {
        "stream_info": lambda: jlog.stream_info("one"),
        "read": lambda: jlog.read_payloads("one", 0, partition=2),
        "push": lambda: jlog.push_many("one", 2, [b"b"]),
    }
    for what, call in calls.items():
        assert jlog.partitions("one") == 3  # learnt again (each UnknownStream forgets it)
        t0 = time.monotonic()
        with pytest.raises(UnknownStream):
            call()
        took = time.monotonic() - t0
        assert ABSENT_DOUBT <= took < ABSENT_DOUBT + 0.8, (what, took)


def test_has_stream_asks_the_cluster_after_another_process_deleted_it(cluster) -> None:
    """Before: ``has_stream`` answered from this process's memory (``_discover`` returns the
    cached count), so a stream deleted by another client (nats-py, as ``nats stream rm``)
    stayed True here until this process happened to read or push it."""
    opts = dict(prefix=fx.new_prefix(), replicas=cluster.n)
    a, b = JetStreamLog(cluster.url, **opts), JetStreamLog(cluster.url, **opts)
    try:
        a.create_stream("h", StreamConfig(partitions=2))
        assert b.partitions("h") == 2 and b.has_stream("h")  # b has learnt it
        a.call(a.js.delete_stream(a.js_name("h", 0)))
        assert not b.has_stream("h")
        assert not b.has_stream("never")
        b.create_stream("h", StreamConfig(partitions=2))  # made again, partition 0 last
        assert a.has_stream("h") and b.has_stream("h")
    finally:
        a.close()
        b.close()


def test_serve_answers_a_push_to_a_deleted_stream_at_once_and_creates_it_again(jlog) -> None:
    """Through the stream service: before, the push waited out ``push_timeout`` and the stream
    service's create found the stream "existing" (this process's memory), so the client could
    never make it again."""
    from loglake.streams.client import PushFailed, StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with BackgroundServer(StreamService(jlog)) as srv, StreamClient(port=srv.port) as c:
        c.create_stream("e")
        assert c.push("e", b"old") == 0
        jlog.call(jlog.js.delete_stream(jlog.js_name("e", 0)))
        t0 = time.monotonic()
        with pytest.raises(PushFailed):  # Ockam's PushConfirm ERROR (the log: UnknownStream)
            c.push("e", b"lost")
        assert time.monotonic() - t0 < 1.5
        c.create_stream("e")
        assert c.push("e", b"new") == 1  # past the old record's index (0), not 0 again
        assert [m.data for m in c.pull("e", 0, 10)] == [b"new"]


@pytest.mark.parametrize("count", ["many", "-3", "0", "²", ""])
def test_a_stream_under_the_prefix_with_a_partition_count_loglake_never_writes_is_refused(
    jlog, count: str
) -> None:
    """Another client's stream named like partition 0 of ``imit`` whose metadata claims it for
    loglake. Before: "many" raised a bare ValueError from every call on ``imit``; "-3" was
    believed (then a bare ``LocalProtocolError``, a ``KeyError`` from ``stream_info``, and
    pushes refused with "partitions 0..-4")."""
    from nats.js import api as jsapi

    from loglake.streams.jetstream import META_PARTITION, META_PARTITIONS, META_STREAM

    meta = {META_STREAM: "imit", META_PARTITION: "0", META_PARTITIONS: count}
    name = jlog.js_name("imit", 0)
    jlog.call(
        jlog.js.add_stream(jsapi.StreamConfig(name=name, subjects=[f"{name}.x"], metadata=meta))
    )
    for call in (
        lambda: jlog.partitions("imit"),
        lambda: jlog.stream_info("imit"),
        lambda: jlog.push_many("imit", 0, [b"x"]),
        lambda: jlog.create_stream("imit"),
    ):
        with pytest.raises(JetStreamError, match="not created by loglake"):
            call()
    jlog.create_stream("mine")  # and the log carries on
    assert jlog.push_many("mine", 0, [b"x"]) == [0]


def test_a_consumer_id_too_long_for_a_bucket_key_is_refused_and_the_connection_lives(jlog) -> None:
    """Before: a 5,000-character consumer id (the node's reset route takes 65,535) made a KV
    request whose protocol line passed nats-server's 4 KiB ``max_control_line``; the server
    closed the connection, nats-py did not reconnect, and every later call — any stream's
    push included — failed with ``ClusterUnavailable`` after its deadline until a restart."""
    jlog.create_stream("s")
    longest = "é" * 765  # 1,530 UTF-8 bytes: a key of 2,047 characters, which the server takes
    assert len(jlog._key(longest, "s", 0)) == 2047
    assert jlog.save_index(longest, "s", 5) == 5 and jlog.get_index(longest, "s") == 5
    for n in (5000, 65_535):
        with pytest.raises(ConsumerKeyTooLong, match="too long"):
            jlog.save_index("c" * n, "s", 5)
        with pytest.raises(ConsumerKeyTooLong):
            jlog.get_index("c" * n, "s")
        with pytest.raises(ConsumerKeyTooLong):
            jlog.reset_index("c" * n, "s", None)
    t0 = time.monotonic()
    assert jlog.push_many("s", 0, [b"x"]) == [0]
    assert jlog.consumer_indexes() == {(longest, "s", 0): 5}
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("value", [b"x", str(INDEX_MAX + 1).encode(), b"\xff\xfe"])
def test_an_operators_reset_or_delete_repairs_a_value_that_is_not_an_index(jlog, value) -> None:
    """Before: ``reset_index`` and the deletion raised ``BadIndexValue`` too (a 500 on the node's
    reset route), so nothing in loglake could repair such a consumer."""
    jlog.create_stream("orders")
    key = jlog._key("bad", "orders", 0)
    jlog.call(jlog.kv.put(key, value))
    assert jlog.reset_index("bad", "orders", 3) is None  # it had no index
    assert (jlog.get_index("bad", "orders"), jlog.index_owner("bad", "orders")) == (3, None)
    assert jlog.save_index_as("bad", "orders", 4, "cn:bob") == 4  # a consumer like any other
    jlog.call(jlog.kv.put(key, value))
    assert jlog.reset_index("bad", "orders", None) is None
    assert jlog.get_index("bad", "orders") is None
    assert jlog.consumer_indexes() == {}


def test_a_read_no_replica_answers_asks_again_at_a_bounded_rate(jlog, monkeypatch) -> None:
    """No replica serving a partition (no quorum, all down): every direct get comes back "no
    responders" at once. The read asks again until its ``request_timeout`` (2 s here) and then
    raises, with a pause between attempts: it asked again at once before (5 million attempts in
    those 2 s against this instant answer; each a request to the cluster in the real outage)."""
    from loglake.streams.jetstream import ClusterUnavailable

    jlog.create_stream("s", StreamConfig(partitions=1))
    jlog.append("s", b"x")
    calls = 0

    async def unanswered(name: str, seq: int, n: int) -> tuple[None, int]:
        nonlocal calls
        calls += 1
        return None, 0

    async def not_deleted(stream: str, partition: int) -> bool:
        return False

    monkeypatch.setattr(jlog, "_direct_batch", unanswered)
    monkeypatch.setattr(jlog, "_deleted", not_deleted)
    t0 = time.monotonic()
    with pytest.raises(ClusterUnavailable):
        jlog.read("s", 0, 10)
    assert 1.9 <= time.monotonic() - t0 < 4.0
    assert 5 <= calls <= 40, calls  # 2 s at ≤ 0.1 s apart: ~25


def _name_of_length(log: JetStreamLog, js_len: int, partition: int = 0) -> str:
    """A loglake name (within its 200 characters) whose partition stream name is ``js_len``
    characters long: mostly dots, each written ``_d``."""
    fixed = len(log.js_name("", partition))
    dots = (js_len - fixed - 1) // 2  # and at least one letter: a name starts with one
    return "a" * (js_len - fixed - 2 * dots) + "." * dots


def test_a_name_too_long_for_jetstream_is_an_invalid_stream_name_at_the_servers_limit(
    jlog,
) -> None:
    """nats-server takes a stream name of 255 characters (``JSMaxNameLen``) and no longer. A
    loglake name within its own 200 characters can encode past it (``.`` → ``_d``). Before:
    ``create_stream`` sent it and got an opaque ``JetStreamError`` ("ServerError code=500
    err_code=10")."""
    fits, over = _name_of_length(jlog, 255), _name_of_length(jlog, 256)
    assert (len(jlog.js_name(fits, 0)), len(jlog.js_name(over, 0))) == (255, 256)
    assert len(over) <= 200
    jlog.create_stream(fits)  # the real server takes the longest
    assert jlog.push_many(fits, 0, [b"x"]) == [0]
    # and refuses one more: the limit is the server's
    with pytest.raises(nats.js.errors.APIError, match="maximum allowed is 255"):
        jlog.call(jlog.js.add_stream(name=jlog.js_name(over, 0), subjects=["over.x"]))
    for name in (over, "a" + "." * 199):
        with pytest.raises(InvalidStreamName, match="at most 255"):
            jlog.create_stream(name)
        assert not jlog.has_stream(name)
    # the last partition's name is the longest: 10 partitions (0..9) fit where 11 do not
    many = "b" + fits[1:]
    jlog.create_stream(many, StreamConfig(partitions=10))
    with pytest.raises(InvalidStreamName, match="256 characters"):
        jlog.create_stream("c" + fits[1:], StreamConfig(partitions=11))
    assert jlog.streams() == sorted([fits, many])


def test_a_partition_deleted_outside_loglake_is_made_again_by_create_stream(jlog) -> None:
    """An operator's ``nats stream rm`` of partition 1 of 3. Before: reads of it raised
    ``UnknownStream`` for good, and ``create_stream`` (which the module says makes a deleted
    stream again) found partition 0 and returned — then raised ``UnknownStream`` itself from
    the stream info that follows. Now the missing partition is made again (empty, its indexes
    going on past the old ones), configured like partition 0, and the others keep their
    records."""
    jlog.create_stream("p", StreamConfig(partitions=3, retention_ms=3_600_000))
    for p in range(3):
        jlog.push_many("p", p, [b"a%d" % p, b"b%d" % p])
    jlog.call(jlog.js.delete_stream(jlog.js_name("p", 1)))
    with pytest.raises(UnknownStream):
        jlog.read_payloads("p", 0, partition=1)

    info = jlog.create_stream("p", StreamConfig(partitions=3))
    assert [(q.first_index, q.next_index) for q in info.partitions] == [(0, 2), (2, 2), (0, 2)]
    assert jlog.read_payloads("p", 0, partition=1) == []
    assert jlog.push_many("p", 1, [b"new"]) == [2]
    assert jlog.read_payloads("p", 0, partition=1) == [(2, b"new")]
    assert jlog.read_payloads("p", 0, partition=2) == [(0, b"a2"), (1, b"b2")]
    made = jlog.call(jlog.js.stream_info(jlog.js_name("p", 1))).config
    first = jlog.call(jlog.js.stream_info(jlog.js_name("p", 0))).config
    assert made.metadata == {**first.metadata, "loglake.partition": "1"}
    assert (made.first_seq, first.first_seq) == (3, None)  # index 2 is sequence 3
    assert (made.max_age, made.num_replicas, made.subjects) == (
        first.max_age,
        first.num_replicas,
        [jlog.subject("p", 1)],
    )
    with pytest.raises(StreamExists):  # another count is still refused
        jlog.create_stream("p", StreamConfig(partitions=4))

    # a fresh process (no memory of the stream) sees the same
    other = JetStreamLog(jlog.options)
    try:
        assert other.partitions("p") == 3
        assert other.read_payloads("p", 0, partition=1) == [(2, b"new")]
    finally:
        other.close()


def test_create_stream_remakes_partition_zero_last_when_it_was_deleted_too(jlog) -> None:
    """Partitions 0 and 2 of 3 deleted: the stream is unknown (partition 0 is what says it
    exists), and ``create_stream`` with the same count makes both again, 0 last; partition 1
    keeps its records."""
    jlog.create_stream("z", StreamConfig(partitions=3))
    jlog.push_many("z", 1, [b"kept"])
    for p in (0, 2):
        jlog.call(jlog.js.delete_stream(jlog.js_name("z", p)))
    jlog.create_stream("z", StreamConfig(partitions=3))
    assert jlog.read_payloads("z", 0, partition=1) == [(0, b"kept")]
    assert [jlog.push_many("z", p, [b"x"]) for p in (0, 2)] == [[0], [0]]


def test_a_stream_made_again_goes_on_past_the_indexes_used_before(
    cluster, tmp_path, caplog
) -> None:
    """An operator's ``nats stream rm`` of a partition, then of the whole stream, each made
    again by ``create_stream``. Before: the new JetStream stream started at sequence 1, so the
    indexes restarted at 0: the consumer whose saved index was 5 skipped the first five new
    records, and index 0 named an old record and a new one. Now the new stream's
    ``first_seq`` is past every index known used: what this process pushed, and the highest
    index a consumer saved (a fresh process knows only that one)."""
    import logging

    opts = dict(prefix=fx.new_prefix(), replicas=cluster.n, request_timeout=5.0)
    log = JetStreamLog(cluster.url, **opts)
    try:
        log.create_stream("r", StreamConfig(partitions=2))
        assert log.push_many("r", 0, [b"old%d" % i for i in range(5)]) == list(range(5))
        log.push_many("r", 1, [b"a", b"b", b"c"])
        log.save_index("reader", "r", 5)  # it read all five
        log.save_index("reader", "r", 2, partition=1)

        log.call(log.js.delete_stream(log.js_name("r", 1)))  # one partition
        with caplog.at_level(logging.WARNING, logger="loglake.streams.jetstream"):
            info = log.create_stream("r", StreamConfig(partitions=2))
        assert (info.partitions[1].first_index, info.partitions[1].next_index) == (3, 3)
        assert log.push_many("r", 1, [b"new1"]) == [3]  # past this process's pushes (0..2)
        remade = [r for r in caplog.records if "made again" in r.getMessage()]
        assert remade and remade[-1].fields["first_indexes"] == {"1": 3}  # type: ignore[attr-defined]

        for p in range(2):  # the whole stream
            log.call(log.js.delete_stream(log.js_name("r", p)))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="loglake.streams.jetstream"):
            log.create_stream("r", StreamConfig(partitions=2))
        remade = [r for r in caplog.records if "past the indexes used" in r.getMessage()]
        assert remade[-1].fields["first_indexes"] == {"0": 5, "1": 4}  # type: ignore[attr-defined]
        assert log.push_many("r", 0, [b"new0", b"new1"]) == [5, 6]
        assert log.push_many("r", 1, [b"x"]) == [4]
        # the consumer resumes where it was and reads exactly the new records
        start = log.get_index("reader", "r")
        assert start == 5
        assert log.read_payloads("r", start) == [(5, b"new0"), (6, b"new1")]
        # partition 0's first_seq is its own: a grow neither copies it nor trips on it
        log.grow_stream("r", 3)
        assert log.push_many("r", 2, [b"grown"]) == [0]
    finally:
        log.close()

    # a fresh process (nothing acknowledged in memory) learns the used indexes from the bucket
    fresh = JetStreamLog(cluster.url, **opts)
    try:
        fresh.save_index("far", "r", 9)
        fresh.call(fresh.js.delete_stream(fresh.js_name("r", 0)))
        fresh.create_stream("r", StreamConfig(partitions=2))
        assert fresh.stream_info("r").partitions[0].first_index == 9
        assert fresh.push_many("r", 0, [b"after"]) == [9]
        assert fx.read_to_head(fresh, "r", 1)[-1].data == b"x"  # partition 1 kept its records
    finally:
        fresh.close()


def test_a_stream_made_again_goes_on_past_another_process_s_sealed_lake(jlog, tmp_path) -> None:
    """The lake holds files another process sealed past what this process pushed: a stream
    made again starts past the lake's end (``lake_dir``), so a lake file and a new record
    never share an index, and a read from 0 is the old history then the new records."""
    jlog.create_stream("l")
    assert jlog.push_many("l", 0, [b"mine%d" % i for i in range(3)]) == [0, 1, 2]
    other = JetStreamLog(jlog.options)  # another process: pushes 3..9 and seals 0..9
    try:
        other.push_many("l", 0, [b"theirs%d" % i for i in range(3, 10)])
        fx.read_to_head(other, "l")
        JetStreamSealer(other, tmp_path).seal(["l"])
    finally:
        other.close()
    assert sealed_next(tmp_path, "l", 0) == 10

    jlog.call(jlog.js.delete_stream(jlog.js_name("l", 0)))
    jlog.create_stream("l")
    assert jlog.push_many("l", 0, [b"new"]) == [10]  # not 3 (this process's end), nor 0
    got = jlog.read_payloads("l", 0)
    assert [i for i, _ in got] == list(range(11))
    assert got[2:4] == [(2, b"mine2"), (3, b"theirs3")] and got[-1] == (10, b"new")


def test_a_purge_between_two_batches_of_one_read_is_not_a_gap(jlog, monkeypatch, caplog) -> None:
    """Retention (or ``truncate_before``) purging the head while a read is between two batched
    direct gets: the next batch starts at the new first sequence. That is the head moving, not
    messages deleted from the middle (``gaps()`` is empty). Before: the read logged an ERROR
    "jetstream stream has a gap (messages deleted outside loglake)". Now it serves the batch it
    has, and the next read from there starts at the new head, as any read from below it does."""
    import logging

    from loglake.streams import jetstream as jsmod

    jlog.create_stream("g")
    jlog.push_many("g", 0, [b"%03d" % i + b"." * 97 for i in range(100)])  # 100 B each
    monkeypatch.setattr(jsmod, "MAX_PULL_BYTES", 1500)  # a batch is cut after a few records
    real = jlog._direct_batch
    calls = 0

    async def purge_after_first(name: str, seq: int, n: int):
        nonlocal calls
        calls += 1
        if calls == 2:  # between the first and the second batch: retention runs
            await jlog._truncate("g", 0, 50)
        return await real(name, seq, n)

    monkeypatch.setattr(jlog, "_direct_batch", purge_after_first)
    with caplog.at_level(logging.ERROR, logger="loglake.streams.jetstream"):
        first = jlog.read("g", 0, lake=False)
    assert calls >= 2
    assert jlog.gaps("g") == {}  # JetStream agrees: nothing deleted from the middle
    assert not [r for r in caplog.records if "gap" in r.getMessage()]
    got = [r.index for r in first]
    assert got == list(range(len(got))) and 0 < len(got) < 50  # the first batch, contiguous
    monkeypatch.setattr(jlog, "_direct_batch", real)
    rest = jlog.read("g", got[-1] + 1, lake=False)
    assert [r.index for r in rest] == list(range(50, 100))  # from the new head


def test_a_grow_after_a_remake_with_fewer_partitions_goes_on_past_their_old_indexes(
    cluster, tmp_path, caplog
) -> None:
    """A stream of 3 partitions deleted outside loglake, made again with 1, then grown to 3.
    Before: the re-added partitions 1 and 2 started at index 0 (a grow made them with no
    ``first_seq``) although this process had pushed 0..3 to partition 1 and a consumer had
    saved index 6 on partition 2: the consumer skipped the first new records and index 0
    named an old record and a new one. Now a grow chooses their first indexes as a remake
    does (``_first_indexes``)."""
    import logging

    opts = dict(prefix=fx.new_prefix(), replicas=cluster.n, request_timeout=5.0)
    log = JetStreamLog(cluster.url, **opts)
    try:
        log.create_stream("g", StreamConfig(partitions=3))
        log.push_many("g", 1, [b"old%d" % i for i in range(4)])
        log.push_many("g", 2, [b"a", b"b"])
        log.save_index("reader", "g", 6, partition=2)
        for p in range(3):  # an operator's `nats stream rm` of every partition
            log.call(log.js.delete_stream(log.js_name("g", p)))
        log.create_stream("g", StreamConfig(partitions=1))
        with caplog.at_level(logging.WARNING, logger="loglake.streams.jetstream"):
            info = log.grow_stream("g", 3)
        assert [(q.first_index, q.next_index) for q in info.partitions[1:]] == [(4, 4), (6, 6)]
        remade = [r for r in caplog.records if "past the indexes used" in r.getMessage()]
        assert remade[-1].fields["first_indexes"] == {"1": 4, "2": 6}  # type: ignore[attr-defined]
        assert log.push_many("g", 1, [b"new"]) == [4]
        assert log.push_many("g", 2, [b"new"]) == [6]
        start = log.get_index("reader", "g", partition=2)
        assert log.read_payloads("g", start, partition=2) == [(6, b"new")]
    finally:
        log.close()


def test_racing_growers_that_choose_different_first_indexes_make_one_stream(cluster) -> None:
    """Grower A looks for the indexes used (none on partition 2 yet), then, before it makes
    the partitions, a consumer index is saved on partition 2 (a process that still holds the
    old count) and grower B grows: B makes partition 2 at that index. A's ``add_stream``
    differs (no ``first_seq``): JetStream refuses it and A takes B's partition as it is, so
    both grows succeed on the identical stream."""
    opts = dict(prefix=fx.new_prefix(), replicas=cluster.n, request_timeout=5.0)
    a, b = JetStreamLog(cluster.url, **opts), JetStreamLog(cluster.url, **opts)
    try:
        a.create_stream("race", StreamConfig(partitions=1))
        real = a._first_indexes

        async def then_b_grows(name, partitions):
            firsts = await real(name, partitions)
            if not getattr(then_b_grows, "done", False):
                then_b_grows.done = True  # type: ignore[attr-defined]
                a_key = a._key("reader", "race", 2)
                await a.kv.put(a_key, b"8")  # the bucket changes between the two looks
                import asyncio

                await asyncio.to_thread(b.grow_stream, "race", 3)
            return firsts

        a._first_indexes = then_b_grows  # type: ignore[method-assign]
        info = a.grow_stream("race", 3)
        assert then_b_grows.done  # type: ignore[attr-defined]
        assert [q.first_index for q in info.partitions] == [0, 0, 8]  # B's, taken by A
        assert b.stream_info("race") == info
        assert b.push_many("race", 2, [b"x"]) == [8] and a.push_many("race", 1, [b"y"]) == [0]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("claim", [INDEX_MAX, 2**63, (1 << 40) + 3])
def test_a_saved_index_no_evidence_backs_does_not_stop_a_stream_being_made_again(
    cluster, claim: int, caplog
) -> None:
    """A consumer saved an index far past anything written (any client may save any index
    for its own consumer id). Before: the remake asked nats-server for ``first_seq``
    ``INDEX_MAX + 1`` = 2**64, which it refuses ("bad request"), so ``create_stream`` raised
    ``JetStreamError`` and the stream stayed missing (2**63 was taken, past the lake's int64
    index column). Now such a claim is not counted (logged); the other consumer's real index
    still is."""
    import logging

    opts = dict(prefix=fx.new_prefix(), replicas=cluster.n, request_timeout=5.0)
    log = JetStreamLog(cluster.url, **opts)
    try:
        log.create_stream("x", StreamConfig(partitions=2))
        log.push_many("x", 0, [b"a", b"b"])
        log.save_index("mallory", "x", claim)
        log.save_index("reader", "x", 2)
        log.save_index("mallory", "x", claim, partition=1)
        for p in range(2):
            log.call(log.js.delete_stream(log.js_name("x", p)))
        with caplog.at_level(logging.WARNING, logger="loglake.streams.jetstream"):
            info = log.create_stream("x", StreamConfig(partitions=2))
        assert [q.first_index for q in info.partitions] == [2, 0]
        assert log.push_many("x", 0, [b"new"]) == [2]
        assert log.push_many("x", 1, [b"new"]) == [0]
        ignored = [r for r in caplog.records if "not counted" in r.getMessage()]
        assert {r.fields["saved_index"] for r in ignored} == {claim}  # type: ignore[attr-defined]
    finally:
        log.close()


def test_a_saved_index_within_the_slack_of_the_evidence_is_counted(jlog) -> None:
    """The bound is relative to what was used: a saved index up to ``SAVED_INDEX_SLACK`` past
    this process's pushes is still a first index (the partition is usable from there)."""
    from loglake.streams.jetstream import SAVED_INDEX_SLACK

    jlog.create_stream("y")
    jlog.push_many("y", 0, [b"a"])
    jlog.save_index("far", "y", 1 + SAVED_INDEX_SLACK)
    jlog.call(jlog.js.delete_stream(jlog.js_name("y", 0)))
    jlog.create_stream("y")
    assert jlog.push_many("y", 0, [b"new"]) == [1 + SAVED_INDEX_SLACK]
