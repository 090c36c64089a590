"""Partition counts come from the stream (follow-up F4 item 1): the producer creates a missing
topic with its configured count, the consumer reads the count (``Streams.partitions``), and a
configured count that differs from an existing topic's is ``PartitionMismatch`` — over
``LocalStreams`` and over a real stream server (``BackgroundServer`` + ``StreamClient``)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from loglake.cardinal.cli import command, consume_topic, produce_chain
from loglake.cardinal.errors import PartitionMismatch
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint
from loglake.cardinal.producer import Producer
from loglake.cardinal.synthetic import schema_for, synthetic_chain, topics_for
from loglake.cardinal.transport import (
    DEFAULT_PARTITIONS,
    StreamConsumer,
    StreamProducer,
    StreamTransport,
)
from loglake.errors import LocalProtocolError
from loglake.log import MemoryLog
from loglake.log.api import UnknownStream
from loglake.streams.api import LocalStreams
from tests.cardinal.helpers import ChainModel


@pytest.fixture
def server_streams(memory_log):
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with BackgroundServer(StreamService(memory_log)) as srv:
        client = StreamClient(port=srv.port)
        try:
            yield client
        finally:
            client.close()


@pytest.fixture(params=["local", "server"])
def streams(request):
    if request.param == "local":
        return LocalStreams(MemoryLog())
    return request.getfixturevalue("server_streams")


def _consume(streams, partitions=None, client="c"):
    c = StreamConsumer(
        StreamTransport(streams, partitions),
        topics_for("t"),
        client,
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )
    model = ChainModel([])
    for ev in c.run():
        model.apply(ev)
    return c, model


def test_consumer_reads_the_partition_count_the_producer_created(streams):
    _sent, canonical = produce_chain(streams, "t", 30, partitions=3)
    assert streams.partitions("t") == 3
    c, model = _consume(streams)  # no count given
    assert model.chain == [b.hash for b in canonical]
    assert sorted(s for s in c.positions if s.startswith("t:")) == ["t:0", "t:1", "t:2"]


def test_producer_defaults_and_adopts_an_existing_count(streams):
    produce_chain(streams, "t", 5)  # a new topic: the default count
    assert streams.partitions("t") == DEFAULT_PARTITIONS
    streams.create_stream("u", 2)  # created elsewhere: a producer without a count uses its 2
    cp = StreamProducer(StreamTransport(streams), Producer("u", schema_for("u")))
    cp.send_blocks(synthetic_chain(5).canonical[1:])
    assert streams.partitions("u") == 2
    assert sum(len(streams.pull("u", 0, 1000, p)) for p in range(2)) > 0


def test_a_configured_count_that_differs_is_a_typed_error(streams):
    produce_chain(streams, "t", 5, partitions=3)
    with pytest.raises(PartitionMismatch) as e:
        produce_chain(streams, "t", 5, partitions=5)
    assert (e.value.topic, e.value.configured, e.value.actual) == ("t", 5, 3)
    assert isinstance(e.value, LocalProtocolError)
    assert "has 3 partitions, not the 5 configured" in str(e.value)
    with pytest.raises(PartitionMismatch):
        _consume(streams, partitions=2)
    _c, model = _consume(streams, partitions=3)  # agreeing is fine
    assert model.chain


def test_consumer_started_first_picks_the_topics_up_when_they_appear(streams):
    c = StreamConsumer(
        StreamTransport(streams),
        topics_for("t"),
        "early",
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )
    assert c.poll() == [] and c.positions == {}
    with pytest.raises(UnknownStream):  # the consumer created nothing
        streams.partitions("t")
    _, canonical = produce_chain(streams, "t", 20, partitions=2)
    model = ChainModel([])
    for ev in c.run():
        model.apply(ev)
    assert model.chain == [b.hash for b in canonical]


def test_consume_topic_resumes_without_a_count():
    streams = LocalStreams(MemoryLog())
    _, canonical = produce_chain(streams, "t", 40, partitions=5)
    c = consume_topic(streams, "t", "me")
    assert c.core.head.hash == canonical[-1].hash
    again = consume_topic(streams, "t", "me")
    assert again.core.head == c.core.head


def test_cli_consume_needs_no_partitions_and_reports_a_mismatch(tmp_path):
    data = str(tmp_path / "d")
    r = CliRunner().invoke(
        command,
        ["produce", "--blocks", "20", "--topic", "t", "--data-dir", data, "--partitions", "3"],
    )
    assert r.exit_code == 0, r.output
    head = r.output.split("canonical head #")[1].split()
    r = CliRunner().invoke(command, ["consume", "--topic", "t", "--data-dir", data])
    assert r.exit_code == 0, r.output
    assert f"head #{head[0]} {head[1]}" in r.output
    from loglake.cli import main

    r = CliRunner().invoke(
        main,
        ["cardinal", "consume", "--topic", "t", "--data-dir", data, "--partitions", "4"],
    )
    assert r.exit_code != 0
    assert "has 3 partitions, not the 4 configured" in r.output
