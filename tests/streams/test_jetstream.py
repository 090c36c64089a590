"""The JetStream backend (streams/jetstream.py, issue 13) on a real single server and a real
3-node R3 cluster: the same ``Log`` conformance suite as the embedded logs, the ``Streams`` and
stream-service tests of the embedded default, and the mapping's own rules (one JetStream stream
per partition, index = sequence − 1, msg-id dedupe, indexes in a KV bucket by compare-and-set,
partition counts from the cluster, retention as JetStream limits, gaps reported)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loglake.log import StreamConfig, UnknownPartition, UnknownStream
from loglake.streams.api import Streams
from loglake.streams.jetstream import (
    JetStreamLog,
    JetStreamStreams,
    StreamGap,
    decode_name,
    encode_name,
)

# The Log conformance suite, run here on the ``log`` fixture below (every rule of
# tests/log/test_conformance.py except retention by segment, which JetStream enforces itself:
# see test_retention_maps_to_jetstream_limits).
from tests.log.test_conformance import (  # noqa: F401
    test_a_timestamp_is_an_int64_and_its_bounds_are_kept,
    test_a_timestamp_outside_int64_is_a_typed_error_and_nothing_is_written,
    test_append_payloads_stores_data_only_records_like_append_many,
    test_create_stream_is_idempotent,
    test_create_stream_with_other_partitions_is_stream_exists,
    test_grow_stream_adds_empty_partitions_and_keeps_the_others,
    test_indexes_start_at_zero_per_partition_and_increase_by_one,
    test_invalid_stream_names_are_rejected,
    test_read_payloads_is_index_and_data_of_read,
    test_read_ranges_limits_and_past_the_end,
    test_records_keep_every_field,
    test_save_index_speaks_the_streams_vocabulary_and_never_moves_back,
    test_truncate_before_drops_only_records_below_the_index,
    test_truncate_before_keeps_consumer_indexes_and_types_its_errors,
    test_unknown_stream_and_partition_are_typed_errors,
)
from tests.streams import jetstream_fixtures as fx

# The Streams tests of the embedded default, on JetStreamStreams.
from tests.streams.test_api import (  # noqa: F401
    test_partitions_counts_a_streams_partitions,
    test_partitions_of_an_unknown_stream_is_unknown_stream,
)

pytestmark = pytest.mark.slow  # real nats-server processes

# nats_single, nats_r3, cluster and js_log: tests/streams/conftest.py (one of each server a session)


@pytest.fixture
def log(js_log):
    return js_log


@pytest.fixture
def streams(js_log):
    return JetStreamStreams(js_log)


def test_names_map_injectively_onto_jetstream_tokens() -> None:
    names = ["a.b", "a_db", "a__b", "a_.b", "x:y-z", "_", ".", "a_d"]
    tokens = [encode_name(n) for n in names]
    assert len(set(tokens)) == len(names)
    assert all("." not in t for t in tokens)
    assert [decode_name(t) for t in tokens] == names


def test_jetstream_streams_implements_the_protocol(streams) -> None:
    assert isinstance(streams, Streams)


def test_a_partition_is_one_jetstream_stream_and_the_index_is_its_sequence_minus_one(
    js_log: JetStreamLog, cluster
) -> None:
    s = JetStreamStreams(js_log)
    s.create_stream("or.ders", partitions=3)
    assert s.push_many("or.ders", [b"a", b"b", b"c"], partition=2) == [0, 1, 2]

    async def seqs():
        out = []
        for p in range(3):
            si = await js_log.js.stream_info(js_log.js_name("or.ders", p))
            out.append((si.config.num_replicas, si.config.subjects, si.state.last_seq))
        m = await js_log.js.get_msg(js_log.js_name("or.ders", 2), 2)
        return out, m.data

    info, second = js_log._call(seqs())
    assert info == [
        (cluster.n, [js_log.subject("or.ders", p)], last) for p, last in enumerate([0, 0, 3])
    ]
    assert second == b"b"  # sequence 2 = index 1


def test_partition_counts_are_discovered_from_the_cluster(js_log: JetStreamLog) -> None:
    JetStreamStreams(js_log).create_stream("p", partitions=4)
    other = JetStreamLog(js_log.options)  # another process's view: nothing cached
    try:
        assert other.partitions("p") == 4
        assert other.streams() == ["p"]
        assert other.stream_info("p").config.partitions == 4
        with pytest.raises(UnknownPartition):
            other.push_many("p", 4, [b"x"])
        with pytest.raises(UnknownStream):
            other.partitions("q")
    finally:
        other.close()


def test_a_retried_push_with_the_same_msg_id_is_stored_once(streams) -> None:
    streams.create_stream("d")
    first = streams.push_many("d", [b"a", b"b"], msg_ids=["m1", "m2"])
    again = streams.push_many("d", [b"a", b"b", b"c"], msg_ids=["m1", "m2", "m3"])
    assert first == [0, 1] and again == [0, 1, 2]
    assert streams.push("d", b"b", msg_id="m2") == 1
    assert [m.data for m in streams.pull("d", 0, 10)] == [b"a", b"b", b"c"]


def test_consumer_indexes_live_in_the_kv_bucket_and_stay_monotonic(js_log: JetStreamLog) -> None:
    import threading

    s = JetStreamStreams(js_log)
    s.create_stream("ix", partitions=2)
    assert s.get_index("weird client/ä", "ix", 1) == 0  # created with 0 (Ockam)
    # racing savers: compare-and-set keeps the highest
    errors: list[BaseException] = []

    def save(k: int) -> None:
        try:
            for i in range(k, 60, 6):
                s.save_index("racer", "ix", i, 1)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert s.get_index("racer", "ix", 1) == 59
    assert s.save_index("racer", "ix", 3, 1) == 59

    async def raw():
        e = await js_log.kv.get(js_log._key("racer", "ix", 1))
        return e.value

    assert js_log._call(raw()) == b"59"


def test_retention_maps_to_jetstream_limits(js_log: JetStreamLog) -> None:
    js_log.create_stream(
        "r", StreamConfig(retention_ms=60_000, retention_bytes=1 << 20, retention_records=5)
    )

    async def cfg():
        return (await js_log.js.stream_info(js_log.js_name("r", 0))).config

    c = js_log._call(cfg())
    assert (c.max_age, c.max_bytes, c.max_msgs) == (60.0, 1 << 20, 5)
    js_log.push_many("r", 0, [bytes([i]) for i in range(12)])
    assert js_log.read_payloads("r", 0) == [(i, bytes([i])) for i in range(7, 12)]
    p = js_log.stream_info("r").partitions[0]
    assert (p.first_index, p.next_index) == (7, 12)
    assert js_log.push_many("r", 0, [b"x"]) == [12]  # indexes never restart


def test_a_message_deleted_outside_loglake_is_a_gap_never_renumbered(js_log: JetStreamLog) -> None:
    js_log.create_stream("g")
    js_log.push_many("g", 0, [bytes([i]) for i in range(6)])

    async def delete():
        await js_log.js.delete_msg(js_log.js_name("g", 0), 4)  # index 3

    js_log._call(delete())
    assert js_log.gaps("g") == {0: 1}
    assert js_log.read_payloads("g", 0) == [(0, b"\0"), (1, b"\1"), (2, b"\2")]
    with pytest.raises(StreamGap) as e:
        js_log.read_payloads("g", 3)
    assert (e.value.missing, e.value.next_present) == (3, 4)
    assert js_log.read_payloads("g", 4) == [(4, b"\4"), (5, b"\5")]
    assert js_log.push_many("g", 0, [b"n"]) == [6]


def test_the_stream_service_serves_ockam_clients_from_jetstream(js_log: JetStreamLog) -> None:
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with BackgroundServer(StreamService(js_log)) as srv, StreamClient(port=srv.port) as c:
        c.create_stream("o", partitions=2)
        assert c.push("o", b"a", partition=1) == 0
        assert c.push_many("o", [i.to_bytes(2, "big") * 512 for i in range(500)], 1) == list(
            range(1, 501)
        )
        got = c.pull("o", 0, 10, partition=1)
        assert [m.index for m in got] == list(range(10)) and got[0].data == b"a"
        assert c.partitions("o") == 2
        assert c.save_index("me", "o", 7, 1) == 7 and c.save_index("me", "o", 2, 1) == 7
        assert c.get_index("me", "o", 1) == 7
    # a second serve process on the same cluster serves the same stream
    second = JetStreamLog(js_log.options)
    try:
        with BackgroundServer(StreamService(second)) as srv, StreamClient(port=srv.port) as c:
            assert c.partitions("o") == 2
            assert c.push("o", b"b", partition=1) == 501
            assert c.get_index("me", "o", 1) == 7
    finally:
        second.close()


def test_serve_backend_processes_share_one_cluster(nats_r3, tmp_path) -> None:
    """``loglake serve --backend nats://…``: two serve processes over one R3 cluster serve the
    same streams to unchanged Ockam clients."""
    import subprocess
    import sys
    import time

    from loglake.streams.client import StreamClient
    from tests.procs import free_port, process

    prefix = fx.new_prefix()
    ports = [free_port(), free_port()]
    cmds = [
        [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(tmp_path / f"d{i}"),
         "--port", str(p), "--backend", nats_r3.url, "--replicas", "3", "--nats-prefix", prefix,
         "--seal-interval", "0.5"]
        for i, p in enumerate(ports)
    ]  # fmt: skip
    with process(cmds[0], ports[0], stderr=subprocess.PIPE) as a, process(cmds[1], ports[1]):
        with StreamClient(port=ports[0], timeout=20) as c:
            c.create_stream("shared", partitions=2)
            assert c.push_many("shared", [b"a", b"b"], partition=1) == [0, 1]
            c.save_index("reader", "shared", 1, partition=1)
        with StreamClient(port=ports[1], timeout=20) as c:
            assert c.partitions("shared") == 2
            assert c.push("shared", b"c", partition=1) == 2
            assert [m.data for m in c.pull("shared", 0, 10, partition=1)] == [b"a", b"b", b"c"]
            assert c.get_index("reader", "shared", partition=1) == 1
        # each serve seals JetStream history into its data dir's lake
        from loglake.streams.jetstream_seal import sealed_next

        deadline = time.monotonic() + 20
        while sealed_next(tmp_path / "d1", "shared", 1) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sealed_next(tmp_path / "d1", "shared", 1) == 3
    assert a.stderr is not None
    assert b"NATS JetStream" in a.stderr.read()


def test_a_grown_stream_is_taken_up_by_another_process_while_it_reads(nats_r3) -> None:
    """``grow_stream`` on the R3 cluster: the new partitions are JetStream streams configured as
    partition 0 (R3, its limits), partition 0's count says 4 afterwards, and another process
    that had learnt 2 — pulling partitions 0 and 1 all the while — reads them unchanged, pushes
    to partition 3 and reports 4 partitions without being restarted."""
    import threading

    prefix = fx.new_prefix()
    a = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    b = JetStreamLog(nats_r3.url, prefix=prefix, replicas=3)
    stop, errors, reads = threading.Event(), [], [0]
    try:
        a.create_stream("g", StreamConfig(partitions=2, retention_records=1000))
        a.push_many("g", 0, [b"a0", b"a1"])
        a.push_many("g", 1, [b"b0"])
        assert b.partitions("g") == 2
        want = {0: fx.read_to_head(b, "g", 0), 1: fx.read_to_head(b, "g", 1)}
        assert [r.data for r in want[0]] == [b"a0", b"a1"]

        def reader() -> None:  # another process's pulls of the old partitions go on
            try:
                while not stop.is_set():
                    for p in (0, 1):
                        assert b.read("g", 0, limit=10, partition=p, lake=False) == want[p]
                    reads[0] += 1
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=reader)
        t.start()
        info = a.grow_stream("g", 4)
        stop.set()
        t.join(30)
        assert not errors and reads[0] > 0, errors
        assert [(p.partition, p.next_index) for p in info.partitions] == [
            (0, 2),
            (1, 1),
            (2, 0),
            (3, 0),
        ]

        def config(p: int):
            return a.call(a.js.stream_info(a.js_name("g", p))).config

        first = config(0)
        assert first.metadata["loglake.partitions"] == "4"
        for p in (2, 3):
            made = config(p)
            assert made.metadata == {
                **first.metadata,
                "loglake.partition": str(p),
                "loglake.partitions": str(p + 1),  # the least the stream has once p exists
            }
            assert (made.num_replicas, made.max_msgs, made.subjects) == (
                3,
                1000,
                [a.subject("g", p)],
            )
        # b learnt 2 partitions; a push to partition 3 asks the cluster again
        assert b.push_many("g", 3, [b"d0"]) == [0]
        assert b.partitions("g") == 4 and len(b.stream_info("g").partitions) == 4
        assert fx.read_to_head(a, "g", 3)[0].data == b"d0"
        assert a.grow_stream("g", 2).config.partitions == 4  # never shrinks
        # a fresh process discovers 4
        c = JetStreamLog(nats_r3.url, prefix=prefix)
        try:
            assert c.partitions("g") == 4
        finally:
            c.close()
    finally:
        stop.set()
        a.close()
        b.close()


def test_the_count_never_names_a_partition_that_is_not_there(nats_single, monkeypatch) -> None:
    """New partitions first, partition 0's count last: a grow that stops between the two (here
    partition 0's update is refused) leaves the count as it was, so no process is sent to a
    partition that does not exist; the next grow takes up the partitions already made."""
    import nats.js.errors

    log = JetStreamLog(nats_single.url, prefix=fx.new_prefix())
    other = JetStreamLog(log.options)
    try:
        log.create_stream("h", StreamConfig(partitions=1))
        log.push_many("h", 0, [b"x"])

        async def refused(*args, **kwargs):
            raise nats.js.errors.BadRequestError(description="refused for the test")

        with monkeypatch.context() as m:
            m.setattr(log.js, "update_stream", refused)
            with pytest.raises(Exception, match="refused for the test"):
                log.grow_stream("h", 3)
        made = [log.call(log.js.stream_info(log.js_name("h", p))).config.name for p in (1, 2)]
        assert made == [log.js_name("h", 1), log.js_name("h", 2)]
        assert other.partitions("h") == 1
        with pytest.raises(UnknownPartition):
            other.push_many("h", 2, [b"y"])
        assert log.grow_stream("h", 3).config.partitions == 3
        assert other.push_many("h", 2, [b"y"]) == [0]
        assert other.read_payloads("h", 0, partition=0) == [(0, b"x")]
    finally:
        log.close()
        other.close()


def _race(call, logs: list[JetStreamLog], args: tuple[int, ...]) -> list[BaseException]:
    """``call(log, arg)`` for each pair at once (on threads released together); the errors."""
    import threading

    go, errors = threading.Barrier(len(logs)), []

    def run(log: JetStreamLog, arg: int) -> None:
        try:
            go.wait(10)
            call(log, arg)
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=run, args=la) for la in zip(logs, args, strict=True)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return errors


def test_a_smaller_count_written_last_is_raised_again_by_the_next_grow(nats_single) -> None:
    """The race's outcome made by hand: partition 0 says 2 while partitions 2 and 3 exist (a
    grower to 4 wrote first, one to 2 last). The round every grow ends with looks for the
    partition past the count, finds partition 2 made for 4, and writes 4 again."""
    log = JetStreamLog(nats_single.url, prefix=fx.new_prefix())
    try:
        log.create_stream("s", StreamConfig(partitions=2))
        log.grow_stream("s", 4)
        first = log.call(log.js.stream_info(log.js_name("s", 0))).config
        stale = {**first.metadata, "loglake.partitions": "2"}
        log.call(log.js.update_stream(replace(first, metadata=stale)))
        assert log.partitions("s") == 2
        assert log.grow_stream("s", 2).config.partitions == 4
        assert log.partitions("s") == 4
    finally:
        log.close()


def test_racing_growers_settle_on_the_larger_count(nats_r3) -> None:
    """Two processes grow one stream at once, to 3 and to 6. Partition 0's config has no
    compare-and-set, so the smaller count may be written last; the grower that wrote it sees the
    partition past it and writes the larger one again: at rest the count is 6, and every
    partition it names exists. On the 3-node cluster, where a partition the other grower has
    just made answers no stream info until its first leader is elected (``INFO_ATTEMPT``): about
    one race in 18 used to wait out the request timeout there and fail."""
    prefix = fx.new_prefix()
    logs = [JetStreamLog(nats_r3.url, prefix=prefix, replicas=3) for _ in range(2)]
    try:
        for round_ in range(3):
            name = f"r{round_}"
            logs[0].create_stream(name, StreamConfig(partitions=1))
            errors = _race(lambda lg, n, name=name: lg.grow_stream(name, n), logs, (3, 6))
            assert not errors, errors
            fresh = JetStreamLog(nats_r3.url, prefix=prefix)
            try:
                assert fresh.partitions(name) == 6
                assert [p.partition for p in fresh.stream_info(name).partitions] == list(range(6))
                assert fresh.push_many(name, 5, [b"z"]) == [0]
            finally:
                fresh.close()
    finally:
        for lg in logs:
            lg.close()


def test_the_stream_service_grows_a_stream_on_jetstream(js_log: JetStreamLog) -> None:
    """A CREATE for more partitions over the stream service on ``--backend nats://…``: INIT for
    every partition, the new ones empty (it was an ``error`` reply before)."""
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with BackgroundServer(StreamService(js_log)) as srv, StreamClient(port=srv.port) as c:
        c.create_stream("o", partitions=1)
        assert c.push("o", b"a") == 0
        c.create_stream("o", partitions=3)
        assert c.partitions("o") == 3
        assert c.push("o", b"c", partition=2) == 0
        assert [m.data for m in c.pull("o", 0, 10)] == [b"a"]
