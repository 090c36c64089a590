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


def _grow_and_shrink(s: Streams) -> list[object]:
    """CREATE an existing stream with more, then fewer partitions; what a part sees."""
    s.create_stream("g", partitions=2)
    s.push_many("g", [b"a", b"b"], partition=1)
    seen: list[object] = [s.create_stream("g", partitions=4), s.partitions("g")]
    seen += [s.bounds("g", p) for p in range(4)]
    seen += [s.push("g", b"new", partition=3), s.push("g", b"c", partition=1)]
    seen += [s.create_stream("g", partitions=1), s.partitions("g")]
    seen += [[(m.index, m.data) for m in s.pull("g", 0, 10, partition=p)] for p in range(4)]
    return seen


def test_create_with_more_partitions_grows_as_the_stream_service_does(streams) -> None:
    """The stream service grows a stream a CREATE asks more partitions of (the Ockam
    reference's ``ensure_streams``) and leaves one asked fewer as it is; ``LocalStreams`` did
    refuse both (``StreamExists``). Both now answer alike, checked against a real server."""
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    local = _grow_and_shrink(streams)
    with BackgroundServer(StreamService(MemoryLog())) as srv, StreamClient(port=srv.port) as c:
        remote = _grow_and_shrink(c)
    assert local == remote
    assert local[:6] == ["g", 4, (0, 0), (0, 2), (0, 0), (0, 0)]
    assert local[8:10] == ["g", 4]


def test_a_grown_stream_keeps_its_partitions_across_a_restart(tmp_path) -> None:
    with open_log(tmp_path / "d") as log:
        s = LocalStreams(log)
        s.create_stream("g")
        s.push("g", b"kept")
        s.create_stream("g", partitions=3)
        s.push("g", b"p2", partition=2)
    with open_log(tmp_path / "d") as log:
        s = LocalStreams(log)
        assert s.partitions("g") == 3
        assert [m.data for m in s.pull("g", 0, 10)] == [b"kept"]
        assert [m.data for m in s.pull("g", 0, 10, partition=2)] == [b"p2"]


def test_truncate_before_drops_live_history_below_the_index(tmp_path) -> None:
    from loglake.log import StreamConfig

    streams = LocalStreams(MemoryLog())
    streams.create_stream("s")
    streams.push_many("s", [bytes([i]) for i in range(10)])
    assert streams.truncate_before("s", 4) == 4
    assert [m.index for m in streams.pull("s", 0, 100)] == list(range(4, 10))
    # segment-granular on the durable log; without a lake nothing below stays readable
    with open_log(tmp_path / "d") as log:
        seg = LocalStreams(log, StreamConfig(segment_bytes=256, seal_to_lake=False))
        seg.create_stream("s")
        for _ in range(30):  # one push each: a segment rolls between appends, not inside one
            seg.push("s", bytes(100))
        dropped = seg.truncate_before("s", 20)
        assert 0 < dropped <= 20
        assert seg.pull("s", 0, 100)[0].index == dropped


def test_a_remote_client_cannot_truncate(memory_log) -> None:
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with BackgroundServer(StreamService(memory_log)) as srv, StreamClient(port=srv.port) as c:
        assert isinstance(c, Streams)
        c.create_stream("s")
        c.push("s", b"x")
        with pytest.raises(NotImplementedError, match="no deletion API"):
            c.truncate_before("s", 1)
        assert [m.data for m in c.pull("s", 0, 10)] == [b"x"]
