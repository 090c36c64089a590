"""``LocalStreams`` (streams/api.py) on both in-process logs: the parts of the ``Streams``
protocol that are not the Ockam wire's (``partitions``)."""

from __future__ import annotations

import pytest

from loglake.log import MemoryLog, UnknownStream, open_log
from loglake.streams.api import LocalStreams, Streams


@pytest.fixture(params=["memory", "segment"])
def streams(request, tmp_path):
    log = MemoryLog() if request.param == "memory" else open_log(tmp_path / "data")
    yield LocalStreams(log)
    log.close()


def test_local_streams_implements_the_protocol(streams) -> None:
    assert isinstance(streams, Streams)


def test_partitions_counts_a_streams_partitions(streams) -> None:
    streams.create_stream("one")
    streams.create_stream("three", partitions=3)
    assert streams.partitions("one") == 1
    assert streams.partitions("three") == 3
    streams.push("three", b"x", partition=2)  # records do not change the count
    assert streams.partitions("three") == 3


def test_partitions_of_an_unknown_stream_is_unknown_stream(streams) -> None:
    with pytest.raises(UnknownStream) as e:
        streams.partitions("nope")
    assert e.value.stream == "nope"
