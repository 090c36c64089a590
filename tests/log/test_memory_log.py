"""The in-memory backend follows the Ockam index rules of loglake.log.api."""

import pytest

from loglake.log import Entry, MemoryLog, StreamConfig, UnknownStream
from loglake.streams import LocalStreams


def test_indexes_start_at_zero_and_increase_by_one_per_partition():
    log = MemoryLog()
    log.create_stream("s", StreamConfig(partitions=2))
    assert log.append_many("s", [Entry(b"a"), Entry(b"b")]) == [0, 1]
    assert log.append("s", b"c", partition=1) == 0
    assert [r.data for r in log.read("s", 0)] == [b"a", b"b"]


def test_read_below_first_index_starts_at_first_index_after_retention():
    log = MemoryLog()
    log.create_stream("s", StreamConfig(retention_records=2))
    for i in range(5):
        log.append("s", bytes([i]))
    assert log.enforce_retention() == 3
    assert [r.index for r in log.read("s", 0)] == [3, 4]


def test_consumer_index_is_monotonic():
    log = MemoryLog()
    log.create_stream("s")
    log.save_index("c", "s", 5)
    assert log.save_index("c", "s", 4) == 5  # lower: the stored index, unchanged
    assert log.get_index("c", "s") == 5


def test_local_streams_index_service_creates_zero_and_ignores_lower_saves():
    streams = LocalStreams(MemoryLog())
    streams.create_stream("s")
    assert streams.get_index("c", "s") == 0
    assert streams.save_index("c", "s", 3) == 3
    assert streams.save_index("c", "s", 1) == 3
    with pytest.raises(UnknownStream):
        streams.get_index("c", "nope")
