"""A consumer cut short in the middle of a round — a broker error while it follows a reorg
channel, an interrupt while it applies a message — neither loses nor skips a block, and a
redundant producer's Batch copy in another map order is no conflict. Found by an outside review
of the round-keeping fix (a raise inside the reorg channel's follow, a second Ctrl-C between the
core's state change and the round's list, a byte comparison of Avro maps)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from pathlib import Path

import fastavro
import pytest

from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
from loglake.cardinal.cli import consume_topic
from loglake.cardinal.codec import encode
from loglake.cardinal.errors import UndeliveredUpdates, UpdatesLost
from loglake.cardinal.messages import ZERO_HASH, Batch
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer
from loglake.cardinal.transport import StreamConsumer, StreamProducer, StreamTransport, envelope
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from loglake.streams.client import StreamServiceError
from tests.cardinal.helpers import ChainModel

START = Checkpoint.starting_at(-1, ZERO_HASH, 0)
BATCH_SCHEMA = fastavro.parse_schema(
    json.loads((Path(__file__).parents[2] / "src/loglake/cardinal/batch.avsc").read_text())
)


def chain(n: int, start: int, parent: bytes, tag: str, w0: int) -> list[BlockPayload]:
    out = []
    for i in range(start, start + n):
        h = hashlib.sha256(f"{tag}{i}".encode() + parent).digest()
        out.append(BlockPayload(i, h, parent, w0 + i, {f"k/{tag}{i}": b"v", "x/a": b"y"}))
        parent = h
    return out


def applied(events: list[ChainUpdate | ReorgEvent]) -> ChainModel:
    model = ChainModel([])  # asserts each update extends what the application holds
    for ev in events:
        model.apply(ev)
    return model


def deep_reorg(streams: LocalStreams) -> tuple[list[BlockPayload], list[BlockPayload]]:
    """Chain A #0..#9, then a reorg from #3 to a 200-block branch B: its channel takes several
    fetches of 64."""
    sp = StreamProducer(StreamTransport(streams), Producer("chain"))
    a = chain(10, 0, ZERO_HASH, "a", 0)
    sp.send_blocks(a)
    b = chain(200, 4, a[3].hash, "b", 10_000)
    sp.send_reorg(a[3].number, a[3].hash, b)
    return a, b


class FailingChannelFetch(StreamTransport):
    """The broker fails (a connection lost) at the ``nth`` fetch of a reorg channel."""

    def __init__(self, streams: LocalStreams, nth: int) -> None:
        super().__init__(streams)
        self.nth, self.calls = nth, 0

    def fetch(self, source, offset, limit):
        if "-re-" in source:
            self.calls += 1
            if self.calls == self.nth:
                raise StreamServiceError("connection lost")
        return super().fetch(source, offset, limit)


@pytest.mark.parametrize("nth", [1, 2, 3])
def test_a_failure_while_following_a_reorg_channel_loses_no_block(nth):
    # Found from outside: the second fetch of the channel raised; the updates of its first
    # batch were lost, the channel counted as followed, and the app stayed on chain A for
    # good (10 blocks, core head B#66) — a commit then checkpointed past what it never saw.
    streams = LocalStreams(MemoryLog())
    a, b = deep_reorg(streams)
    c = StreamConsumer(FailingChannelFetch(streams, nth), ["chain"], "app", start=START)
    with pytest.raises(StreamServiceError):
        c.run()
    with pytest.raises(UndeliveredUpdates):  # the channel half read (or the Reorg unapplied)
        c.commit()
    events = c.run()
    assert applied(events).chain == [x.hash for x in a[:4] + b]
    assert c.core.head is not None and c.core.head.hash == b[-1].hash
    c.commit()
    again = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    assert again.run() == []  # all handed over: nothing twice


def test_a_failure_at_the_channels_first_fetch_keeps_the_reorg_after_a_caught_up_commit():
    # Nothing undelivered when the channel's first fetch fails (chain A handed over and
    # committed before): the Reorg's offset was counted as read, so a commit then lost it.
    streams = LocalStreams(MemoryLog())
    sp = StreamProducer(StreamTransport(streams), Producer("chain"))
    a = chain(10, 0, ZERO_HASH, "a", 0)
    sp.send_blocks(a)
    c = StreamConsumer(FailingChannelFetch(streams, 1), ["chain"], "app", start=START)
    events = c.run()
    c.commit()
    b = chain(200, 4, a[3].hash, "b", 10_000)
    sp.send_reorg(a[3].number, a[3].hash, b)
    with pytest.raises(StreamServiceError):
        c.poll()
    with pytest.raises(UndeliveredUpdates):
        c.commit()
    events += c.run()
    c.commit()
    assert applied(events).chain == [x.hash for x in a[:4] + b]


class ShortChannel(StreamTransport):
    """A reorg channel reads as ending at ``end`` (a replica not caught up, a channel still
    being written): the consumer follows it to there, as far as it can see."""

    def __init__(self, streams: LocalStreams, end: int) -> None:
        super().__init__(streams)
        self.end = end

    def fetch(self, source, offset, limit):
        if "-re-" in source:
            limit = max(0, min(limit, self.end - offset))
            if not limit:
                return []
        return super().fetch(source, offset, limit)


def test_a_restart_from_a_checkpoint_inside_a_reorg_channel_reads_its_rest():
    # The checkpoint holds the Reorg applied but not complete, and the channel's offset: the
    # restart counted the channel as followed and never read the rest (app head B#~66).
    streams = LocalStreams(MemoryLog())
    a, b = deep_reorg(streams)
    c = StreamConsumer(ShortChannel(streams, 64), ["chain"], "app", start=START)
    events = c.run()
    c.commit()
    assert c.core.head is not None and c.core.head.number < b[-1].number  # mid-channel
    again = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    events += again.run()
    assert applied(events).chain == [x.hash for x in a[:4] + b]
    again.commit()
    third = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    assert third.run() == []


def linear(n: int) -> list[BlockPayload]:
    out, parent = [], ZERO_HASH
    for i in range(n):
        h = hashlib.sha256(b"block %d" % i).digest()
        out.append(BlockPayload(i, h, parent, i, {f"k/{i % 5}": b"v%d" % i}))
        parent = h
    return out


@pytest.fixture
def interrupt_after_the_first_update(monkeypatch):
    """A KeyboardInterrupt (a second Ctrl-C, any BaseException) landing right after the core
    applied the message that completed a block, before the round's list holds its update."""
    receive = OrderedConsumer.receive
    armed = [False]

    def interrupted(self, *args, **kwargs):
        got = receive(self, *args, **kwargs)
        if got and armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        return got

    monkeypatch.setattr(OrderedConsumer, "receive", interrupted)
    return armed


def test_an_interrupt_while_a_message_is_applied_lets_no_commit_skip_a_block(
    interrupt_after_the_first_update,
):
    # Found from outside: nothing was undelivered, so consume's commit on the way out was
    # taken, past block #20 the application never got; the restart went on from #21.
    streams = LocalStreams(MemoryLog())
    blocks = linear(40)
    send = StreamProducer(StreamTransport(streams), Producer("chain")).send_blocks
    send(blocks[:20])
    seen: list[ChainUpdate | ReorgEvent] = []
    consume_topic(streams, "chain", "app", on_event=seen.append)
    send(blocks[20:])
    interrupt_after_the_first_update[0] = True
    with pytest.raises(KeyboardInterrupt):
        consume_topic(streams, "chain", "app", on_event=seen.append)
    consume_topic(streams, "chain", "app", on_event=seen.append)
    assert applied(seen).chain == [b.hash for b in blocks]


def test_a_consumer_interrupted_while_applying_refuses_to_commit_or_poll(
    interrupt_after_the_first_update,
):
    streams = LocalStreams(MemoryLog())
    blocks = linear(40)
    StreamProducer(StreamTransport(streams), Producer("chain")).send_blocks(blocks)
    c = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    interrupt_after_the_first_update[0] = True
    with pytest.raises(KeyboardInterrupt):
        c.poll()
    with pytest.raises(UpdatesLost):
        c.commit()
    with pytest.raises(UpdatesLost):  # a poll would hand blocks on top of the one lost
        c.poll()
    again = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    assert applied(again.run()).chain == [b.hash for b in blocks]


def go_map_order(batch: Batch) -> bytes:
    """The Batch as the reference (Go) producer may write it: the same record, its
    ``updates`` map in another order (Go's map iteration order varies run to run), written
    here by fastavro from a dict in reverse key order."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        BATCH_SCHEMA,
        {
            "num": batch.number,
            "weight": batch.weight.to_bytes((batch.weight.bit_length() + 7) // 8, "big"),
            "parent": batch.parent,
            "updates": {
                k: {"value": r.value, "count": r.count, "delete": r.delete, "subbatch": r.subbatch}
                for k, r in sorted(batch.updates.items(), reverse=True)
            },
        },
    )
    return buf.getvalue()


def test_a_batch_copy_with_its_map_in_another_order_is_no_conflict(caplog):
    # Found from outside: two redundant producers' equal Batches were compared as bytes, so
    # the copy counted as a conflicting Batch and logged an ERROR.
    streams = LocalStreams(MemoryLog())
    blocks = chain(20, 0, ZERO_HASH, "a", 0)
    producer = Producer("chain", {"k/": "chain", "x/": "chain"})  # counted: kept pending
    msgs = producer.block_messages(blocks[7])
    (batch,) = [m for ms in msgs.values() for m in ms if isinstance(m, Batch)]
    key, ours = encode(batch)
    theirs = go_map_order(batch)
    assert theirs != ours  # the premise: other bytes, the same record
    sp = StreamProducer(StreamTransport(streams), producer)
    sp.send_blocks(blocks[:7])
    streams.push_many("chain", [envelope(key, ours), envelope(key, theirs)], 0)
    sp.send_blocks(blocks[7:])  # with its own Batch copy too
    c = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    with caplog.at_level(logging.ERROR, logger="loglake.cardinal.consumer"):
        assert applied(c.run()).chain == [x.hash for x in blocks]
    assert c.core.consumer.stats.conflicting == 0
    assert not [r for r in caplog.records if "conflicting Batch" in r.getMessage()]
