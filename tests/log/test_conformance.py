"""The ``Log`` contract (loglake.log.api), checked on every backend: ``MemoryLog`` and
``SegmentLog``. Rules come from the Ockam stream service spec (indexes per stream/partition,
monotonic; pull from an index returns nothing below it; consumer index storage MUST be
monotonic) and from the docstrings of ``loglake.log.api``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loglake.log import (
    Entry,
    InvalidIndex,
    InvalidStreamName,
    InvalidTimestamp,
    Log,
    MemoryLog,
    StreamConfig,
    StreamExists,
    UnknownPartition,
    UnknownStream,
    open_log,
)


@pytest.fixture(params=["memory", "segment"])
def log(request, tmp_path) -> Iterator[Log]:
    lg: Log = MemoryLog() if request.param == "memory" else open_log(tmp_path / "data")
    yield lg
    lg.close()


def test_indexes_start_at_zero_per_partition_and_increase_by_one(log: Log):
    log.create_stream("s", StreamConfig(partitions=3))
    assert log.append_many("s", [Entry(b"a"), Entry(b"b"), Entry(b"c")]) == [0, 1, 2]
    assert log.append("s", b"x", partition=2) == 0
    assert log.append("s", b"d") == 3
    assert log.append_many("s", [], partition=1) == []
    info = log.stream_info("s")
    assert [(p.first_index, p.next_index) for p in info.partitions] == [(0, 4), (0, 0), (0, 1)]
    assert info.records == 5


def test_records_keep_every_field(log: Log):
    log.create_stream("s")
    log.append("s", b"data", key=b"k", headers=(("h", b"1"), ("h", b"2")), timestamp_ns=42)
    log.append("s", b"", key=b"", headers=())
    r0, r1 = log.read("s", 0)
    assert (r0.stream, r0.partition, r0.index, r0.timestamp_ns) == ("s", 0, 0, 42)
    assert (r0.key, r0.headers, r0.data) == (b"k", (("h", b"1"), ("h", b"2")), b"data")
    assert (r1.key, r1.headers, r1.data) == (b"", (), b"")
    assert r1.timestamp_ns > 0  # assigned by the log


def test_a_timestamp_is_an_int64_and_its_bounds_are_kept(log: Log):
    # the record's timestamp_ns:i64 (log.record_codec), the lake's int64 column
    log.create_stream("s")
    log.append_many(
        "s", [Entry(b"lo", timestamp_ns=-(2**63)), Entry(b"hi", timestamp_ns=2**63 - 1)]
    )
    assert [r.timestamp_ns for r in log.read("s", 0)] == [-(2**63), 2**63 - 1]


@pytest.mark.parametrize("ts", [2**63, -(2**63) - 1, 2**64, 1.5, "1", True])
def test_a_timestamp_outside_int64_is_a_typed_error_and_nothing_is_written(log: Log, ts):
    # the log on disk raised a bare struct.error (a TypeError for a str), the in-memory one
    # stored it: both refuse it now, before writing any record of the batch
    log.create_stream("s")
    log.append("s", b"before")
    for append in (
        lambda: log.append("s", b"x", timestamp_ns=ts),
        lambda: log.append("s", b"x", key=b"k", timestamp_ns=ts),
        lambda: log.append_many("s", [Entry(b"ok"), Entry(b"x", timestamp_ns=ts)]),
    ):
        with pytest.raises(InvalidTimestamp):
            append()
    assert log.next_index("s") == 1
    assert [r.data for r in log.read("s", 0)] == [b"before"]
    assert log.append("s", b"after") == 1


def test_read_ranges_limits_and_past_the_end(log: Log):
    log.create_stream("s")
    log.append_many("s", [Entry(bytes([i])) for i in range(10)])
    assert [r.index for r in log.read("s", 3, limit=4)] == [3, 4, 5, 6]
    assert [r.index for r in log.read("s", 3, end=6)] == [3, 4, 5]
    assert [r.index for r in log.read("s", 8, limit=100)] == [8, 9]
    assert log.read("s", 3, limit=0) == []
    assert log.read("s", 10) == []
    assert log.read("s", 1000, limit=5) == []
    assert log.read("s", 5, end=5) == []
    assert [r.data for r in log.iter_records("s", 2, batch=3)] == [bytes([i]) for i in range(2, 10)]
    assert log.next_index("s") == 10


def test_read_below_first_index_starts_at_first_index_after_retention(tmp_path, log: Log):
    # Small segments so that a segment-based backend has whole segments to drop; no lake so
    # the dropped history is really gone.
    log.create_stream("s", StreamConfig(segment_bytes=200, retention_records=3, seal_to_lake=False))
    for i in range(40):
        log.append("s", bytes([i]) * 20)
    before = log.stream_info("s").partitions[0]
    dropped = log.enforce_retention()
    after = log.stream_info("s").partitions[0]
    assert dropped == after.first_index - before.first_index > 0
    assert after.next_index == 40
    assert after.next_index - after.first_index >= 3  # at least the window is kept
    got = log.read("s", 0)
    assert [r.index for r in got] == list(range(after.first_index, 40))
    assert all(r.data == bytes([r.index]) * 20 for r in got)
    assert log.append("s", b"next") == 40  # indexes never restart


def test_consumer_index_is_monotonic_and_keeps_the_stored_one_on_lower_saves(log: Log):
    log.create_stream("s", StreamConfig(partitions=2))
    assert log.get_index("c", "s") is None
    assert log.save_index("c", "s", 5) == 5
    assert log.save_index("c", "s", 5) == 5
    assert log.save_index("c", "s", 4) == 5  # lower: the stored index, unchanged
    assert log.get_index("c", "s") == 5
    assert log.save_index("c", "s", 9) == 9
    assert log.get_index("c", "s", partition=1) is None  # per partition
    assert log.get_index("other", "s") is None  # per client


def test_unknown_stream_and_partition_are_typed_errors(log: Log):
    log.create_stream("s", StreamConfig(partitions=2))
    with pytest.raises(UnknownStream):
        log.append("nope", b"x")
    with pytest.raises(UnknownStream):
        log.read("nope", 0)
    with pytest.raises(UnknownStream):
        log.stream_info("nope")
    with pytest.raises(UnknownStream):
        log.get_index("c", "nope")
    with pytest.raises(UnknownPartition):
        log.append("s", b"x", partition=2)
    with pytest.raises(UnknownPartition):
        log.read("s", 0, partition=-1)
    with pytest.raises(UnknownPartition):
        log.save_index("c", "s", 1, partition=5)


def test_create_stream_is_idempotent(log: Log):
    log.create_stream("s", StreamConfig(partitions=2))
    log.append("s", b"x", partition=1)
    info = log.create_stream("s", StreamConfig(partitions=2))
    assert info.partitions[1].next_index == 1
    assert log.create_stream("s").config.partitions == 2
    assert log.streams() == ["s"]
    assert log.has_stream("s") and not log.has_stream("t")


def test_create_stream_with_other_partitions_is_stream_exists(log: Log):
    log.create_stream("s", StreamConfig(partitions=2))
    with pytest.raises(StreamExists):
        log.create_stream("s", StreamConfig(partitions=3))


def test_grow_stream_adds_empty_partitions_and_keeps_the_others(log: Log):
    log.create_stream("s", StreamConfig(partitions=2))
    log.append_many("s", [Entry(b"a"), Entry(b"b")], partition=1)
    log.save_index("c", "s", 2, partition=1)
    info = log.grow_stream("s", 4)
    assert [(p.partition, p.first_index, p.next_index) for p in info.partitions] == [
        (0, 0, 0),
        (1, 0, 2),
        (2, 0, 0),
        (3, 0, 0),
    ]
    assert log.partition_count("s") == 4 and log.stream_info("s").config.partitions == 4
    assert log.append("s", b"new", partition=3) == 0
    assert log.read_payloads("s", 0, partition=1) == [(0, b"a"), (1, b"b")]
    assert (
        log.get_index("c", "s", partition=1) == 2 and log.get_index("c", "s", partition=3) is None
    )
    assert log.grow_stream("s", 3).config.partitions == 4  # never shrinks
    with pytest.raises(UnknownStream):
        log.grow_stream("nosuch", 2)


@pytest.mark.parametrize(
    "name",
    [
        *("", ".", "..", "a/b", "a b", "x" * 201),
        "abc\n",  # ``$`` matched before a final newline: streams/abc\n/ was made beside abc
        "_jetstream.json",  # the lake's note of a JetStream node: its folder hid the note
        "_x",
        ".hidden",
    ],
)
def test_invalid_stream_names_are_rejected(log: Log, name: str):
    with pytest.raises(InvalidStreamName):
        log.create_stream(name)


@pytest.mark.parametrize(
    "bad",
    [
        {"partitions": 0},
        {"durability": "sometimes"},
        {"segment_bytes": 0},
        {"retention_records": -1},
        {"lake_retention_ms": -5},
        # past int64 once in nanoseconds (JetStream's max_age) or as a count: 2**62 ms was taken
        {"retention_ms": 2**62},
        {"lake_retention_ms": (2**63 - 1) // 1_000_000 + 1},
        {"retention_bytes": 2**63},
        {"retention_records": 2**63},
    ],
)
def test_invalid_stream_configs_are_refused(bad):
    from loglake.errors import LocalProtocolError

    with pytest.raises(LocalProtocolError):
        StreamConfig(**bad)


def test_the_longest_retention_is_292_years_and_is_taken():
    from loglake.log.api import INT64_MAX, MAX_RETENTION_MS

    cfg = StreamConfig(
        retention_ms=MAX_RETENTION_MS,
        lake_retention_ms=MAX_RETENTION_MS,
        retention_bytes=INT64_MAX,
        retention_records=INT64_MAX,
    )
    assert cfg.retention_ms * 1_000_000 <= INT64_MAX


def test_truncate_before_drops_only_records_below_the_index(log: Log):
    # Small segments and no lake: a segment-based backend drops whole segments and what it
    # drops is gone; MemoryLog drops exactly the records below the index.
    log.create_stream("s", StreamConfig(partitions=2, segment_bytes=200, seal_to_lake=False))
    for i in range(40):
        log.append("s", bytes([i]) * 20)
    log.append("s", b"other", partition=1)
    assert log.truncate_before("s", 0) == 0
    dropped = log.truncate_before("s", 17)
    after = log.stream_info("s").partitions[0]
    assert 0 < after.first_index <= 17
    assert dropped == after.first_index
    assert after.next_index == 40
    got = log.read("s", 0)
    assert [r.index for r in got] == list(range(after.first_index, 40))
    assert all(r.data == bytes([r.index]) * 20 for r in got)
    assert log.truncate_before("s", after.first_index) == 0  # nothing left below
    assert log.stream_info("s").partitions[1].first_index == 0  # other partitions untouched
    # past the end: everything goes, and indexes go on where they were
    assert log.truncate_before("s", 1000) == 40 - after.first_index
    assert log.read("s", 0) == []
    end = log.stream_info("s").partitions[0]
    assert (end.first_index, end.next_index) == (40, 40)
    assert log.append("s", b"next") == 40
    assert [r.data for r in log.read("s", 0)] == [b"next"]


def test_truncate_before_keeps_consumer_indexes_and_types_its_errors(log: Log):
    log.create_stream("s", StreamConfig(seal_to_lake=False))
    log.append_many("s", [Entry(b"a"), Entry(b"b")])
    log.save_index("c", "s", 1)
    log.truncate_before("s", 2)
    assert log.get_index("c", "s") == 1
    with pytest.raises(UnknownStream):
        log.truncate_before("nope", 1)
    with pytest.raises(UnknownPartition):
        log.truncate_before("s", 1, partition=1)


def test_consumer_indexes_lists_every_saved_index(log: Log):
    log.create_stream("s", StreamConfig(partitions=2))
    assert log.consumer_indexes() == {}
    log.save_index("a", "s", 3)
    log.save_index("a", "s", 5)
    log.save_index("b", "s", 1, partition=1)
    assert log.consumer_indexes() == {("a", "s", 0): 5, ("b", "s", 1): 1}


def test_append_payloads_stores_data_only_records_like_append_many(log: Log):
    log.create_stream("s", StreamConfig(partitions=2))
    assert log.append_payloads("s", [b"a", b"", bytearray(b"c")], partition=1) == [0, 1, 2]
    assert log.append_many("s", [Entry(b"d")], partition=1) == [3]
    assert log.append_payloads("s", [], partition=1) == []
    got = log.read("s", 0, partition=1)
    assert [(r.index, r.key, r.headers, r.data) for r in got] == [
        (0, None, (), b"a"),
        (1, None, (), b""),
        (2, None, (), b"c"),
        (3, None, (), b"d"),
    ]
    assert all(r.timestamp_ns > 0 for r in got)  # the log's clock
    assert log.read("s", 0) == []
    with pytest.raises(UnknownStream):
        log.append_payloads("nope", [b"x"])
    with pytest.raises(UnknownPartition):
        log.append_payloads("s", [b"x"], partition=2)


def test_read_payloads_is_index_and_data_of_read(log: Log):
    log.create_stream("s")
    log.append_many("s", [Entry(b"a"), Entry(b"b", key=b"k", headers=(("h", b"v"),))])
    log.append_payloads("s", [b"c", b"d"])
    assert log.read_payloads("s", 0) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert log.read_payloads("s", 1, limit=2) == [(1, b"b"), (2, b"c")]
    assert log.read_payloads("s", 4) == []
    assert log.read_payloads("s", 0, limit=0) == []
    with pytest.raises(UnknownStream):
        log.read_payloads("nope", 0)


def test_save_index_speaks_the_streams_vocabulary_and_never_moves_back(log):
    """Issue 18: ``Log.save_index(client, stream, index, partition=0)`` as in ``Streams``; a
    lower save leaves the stored index and returns it (Ockam: "it MUST NOT be changed")."""
    log.create_stream("v", StreamConfig(partitions=2))
    assert log.get_index("c", "v") is None
    assert log.save_index("c", "v", 5) == 5
    assert log.save_index("c", "v", 3) == 5
    assert log.get_index("c", "v") == 5
    assert log.save_index("c", "v", 7, partition=1) == 7
    assert log.get_index("c", "v", partition=1) == 7 and log.get_index("c", "v") == 5


@pytest.mark.parametrize("index", [-1, 2**64, True, 1.5])
def test_a_consumer_index_outside_uint64_is_a_typed_error(log: Log, index):
    # the log on disk raised a bare struct.error, the in-memory one stored it: they agree now
    log.create_stream("s")
    for save in (
        lambda: log.save_index("c", "s", index),
        lambda: log.save_index_as("c", "s", index, "me"),
        lambda: log.reset_index("c", "s", index),
    ):
        with pytest.raises(InvalidIndex):
            save()
    assert log.save_index("c", "s", 2**64 - 1) == 2**64 - 1
