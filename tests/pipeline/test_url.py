"""The ``url`` option: read and write a stream of a running node over the Ockam stream protocol
(``loglake.streams`` server and client on loopback), from Spark's Python workers."""

from __future__ import annotations

import pytest

from loglake.log import open_log
from loglake.pipeline import read, write
from loglake.pipeline.errors import BadOption
from loglake.streams.client import StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService

pytestmark = pytest.mark.spark


@pytest.fixture
def node(tmp_path):
    log = open_log(tmp_path / "node")
    with BackgroundServer(StreamService(log)) as srv:
        yield f"loglake://127.0.0.1:{srv.port}", srv.port
    log.close()


def test_read_over_the_stream_protocol(spark, node):
    url, port = node
    with StreamClient(port=port) as c:
        c.create_stream("remote", partitions=2)
        c.push_many("remote", [b"a%d" % i for i in range(30)], partition=0)
        c.push_many("remote", [b"b%d" % i for i in range(5)], partition=1)
    df = read(spark, url=url, stream="remote")
    got = sorted((r["partition"], r["index"], bytes(r["data"])) for r in df.collect())
    assert got == [(0, i, b"a%d" % i) for i in range(30)] + [(1, i, b"b%d" % i) for i in range(5)]
    ranged = read(spark, url=url, stream="remote", partitions=[0], start_index=10, end_index=12)
    assert sorted(r["index"] for r in ranged.collect()) == [10, 11]


def test_write_over_the_stream_protocol(spark, node):
    url, port = node
    with StreamClient(port=port) as c:
        c.create_stream("sink", partitions=1)
    write(spark.createDataFrame([(b"x",), (b"y",)], "data binary"), url=url, stream="sink")
    with StreamClient(port=port) as c:
        assert sorted(m.data for m in c.pull("sink", 0, 10)) == [b"x", b"y"]


def test_unknown_remote_stream(spark, node):
    url, _ = node
    with pytest.raises(BadOption, match="unknown stream"):
        read(spark, url=url, stream="nope")


def test_write_over_the_stream_protocol_refuses_keys_and_changes_nothing(spark, node):
    url, port = node
    with StreamClient(port=port) as c:
        c.create_stream("keyed", partitions=1)
    df = spark.createDataFrame([(b"x", b"k1"), (b"y", None)], "data binary, key binary")
    with pytest.raises(Exception, match="carries data only") as err:
        write(df, url=url, stream="keyed")
    assert "key" in str(err.value)
    with StreamClient(port=port) as c:
        assert c.pull("keyed", 0, 10) == []
