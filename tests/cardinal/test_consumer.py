"""Consumer rules (spec "…/Consumers"; reference delivery/consumer.go, consumer_test.go)."""

from __future__ import annotations

import logging
import random

import pytest

from loglake.cardinal.blocks import Block
from loglake.cardinal.codec import encode
from loglake.cardinal.consumer import BlockAssembler
from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import SubBatchHeader, SubBatchMsg
from loglake.cardinal.producer import Producer
from tests.cardinal.helpers import h

UPDATES = {
    "foo/something": b"gnihtemos/oof",
    "bar/whatever/baz/stuff": b"data",
    "default/thing": b"defaulttopic",
}
DELETES = {"foo/delete", "bar/delete/baz/thing", "default/delete"}
SCHEMA = {"foo/": "foo", "bar/[^/]+/baz/": "bar", "state/thing": "state"}


def block_messages(n: int = 1, seed: int = 0) -> list[tuple[bytes, bytes]]:
    """consumer_test.go getTestMessages: blocks 1..n, each with a sub-batch."""
    p = Producer("default", SCHEMA)
    out = []
    for i in range(1, n + 1):
        bid = bytes([255, i - 1]).rjust(32, b"\0")
        for msgs in (
            p.add_block(i, h(i), h(i - 1), 0, UPDATES, DELETES, {"state/": bid}),
            p.send_batch(bid, ["whatever/", "other/"], {"state/thing": b"thing!"}),
        ):
            for _, ms in sorted(msgs.items()):
                out += [encode(m) for m in ms]
    return out


def feed(c: BlockAssembler, msgs) -> list:
    out = []
    for i, (k, v) in enumerate(msgs):
        out += c.receive(k, v, "t:0", i)
    return out


def test_reference_test_consumer_waits_for_the_sub_batch():
    msgs = block_messages(1)
    c = BlockAssembler()
    split = next(i for i, (k, _) in enumerate(msgs) if k[0] == 1)  # first SubBatchHeader
    assert feed(c, msgs[:split]) == []
    (blk,) = feed(c, msgs[split:])
    assert isinstance(blk, Block)
    assert (blk.number, blk.weight, blk.parent) == (1, 0, h(0))
    assert len(blk.values) == 4  # consumer_test.go: 4 values
    assert len(blk.deletes) == 5  # and 5 deletes
    assert blk.values["state/thing"] == b"thing!"


@pytest.mark.parametrize("seed", range(20))
def test_shuffled_with_duplicates_emits_each_block_once(seed):
    # TestShuffledDups / TestShuffledDupsMultiBlock
    rng = random.Random(seed)
    msgs = block_messages(3)
    rng.shuffle(msgs)
    msgs += msgs[: len(msgs) // 2]
    rng.shuffle(msgs)
    out = feed(BlockAssembler(), msgs)
    assert sorted(b.number for b in out) == [1, 2, 3]
    assert all(len(b.values) == 4 and len(b.deletes) == 5 for b in out)


def test_sub_batch_index_past_item_count_is_dropped_and_logged(caplog):
    c = BlockAssembler()
    msgs = block_messages(1)
    body = [m for m in msgs if m[0][0] != 1 and m[0][0] != 2]  # no sub-batch yet
    feed(c, body)
    with caplog.at_level(logging.WARNING, logger="loglake.cardinal.consumer"):
        bid = bytes([255, 0]).rjust(32, b"\0")
        assert c.receive(*encode(SubBatchHeader(h(1), bid, 1))) == []
        assert c.receive(*encode(SubBatchMsg(h(1), bid, 5, (), {"state/x": b"1"}))) == []
    assert "index past ItemCount" in caplog.text
    assert c.stats.dropped == 1
    (blk,) = c.receive(*encode(SubBatchMsg(h(1), bid, 0, (), {"state/thing": b"ok"})))
    assert "state/x" not in blk.values


def test_garbage_raises_typed_error_and_leaves_other_blocks_untouched():
    msgs = block_messages(2)
    c = BlockAssembler()
    half = [m for m in msgs if m[0][1:33] == h(1)]
    other = [m for m in msgs if m[0][1:33] == h(2)]
    feed(c, half[:-1])
    pending = (c.pending, c.queued, c.why_not_ready(h(1)))
    for k, v in [(b"\x00" + h(2), b"\xff"), (b"\x03" + h(1)[:4], b""), (b"\x77", b"x")]:
        with pytest.raises(CardinalDecodeError):
            c.receive(k, v)
    assert (c.pending, c.queued, c.why_not_ready(h(1))) == pending
    out = feed(c, [half[-1], *other])
    assert sorted(b.number for b in out) == [1, 2]


def test_counts_that_never_complete_are_evicted_past_the_window(caplog):
    p = Producer("d", {"foo/": "d"})
    stuck = p.add_block(1, h(1), h(0), 1, {"foo/a": b"1", "foo/b": b"2"})["d"]
    c = BlockAssembler(reorg_threshold=3)
    batch = next(m for m in stuck if m.__class__.__name__ == "Batch")
    c.handle(batch)
    assert c.pending == 1
    with caplog.at_level(logging.WARNING):
        for n in range(2, 8):
            out = c.handle(p.add_block(n, h(n), h(n - 1), n, {})["d"][0])
            assert [b.number for b in out] == [n]
    assert c.pending == 0 and c.stats.evicted == 1
    assert "evicting incomplete batch" in caplog.text


def test_early_messages_for_a_batch_that_never_comes_are_evicted(caplog):
    # Bounded on every message queued, not only when the head advances: the oldest queued
    # block's messages go first.
    p = Producer("d", {"foo/": "d"})
    c = BlockAssembler(reorg_threshold=2, max_queued=1)
    first = p.add_block(1, h(98), h(0), 1, {"foo/a": b"1"})["d"]
    second = p.add_block(1, h(99), h(0), 1, {"foo/a": b"1"})["d"]
    c.handle(first[0], "d:0", 0)  # the BatchMsg, its Batch never sent
    assert c.queued == 1
    with caplog.at_level(logging.INFO):
        c.handle(second[0], "d:0", 1)
    assert c.queued == 1 and c.held_offsets() == {"d:0": 1}
    assert "Batch never came" in caplog.text
    out = c.handle(second[1], "d:0", 2)  # the second's Batch: it completes
    assert [b.hash for b in out] == [h(99)] and c.queued == 0


def test_tracking_a_subset_of_prefixes():
    msgs = block_messages(1)
    c = BlockAssembler(tracked_prefixes=["^foo/"])
    (blk,) = feed(c, msgs)
    assert blk.values == {"foo/something": b"gnihtemos/oof"}
    assert blk.deletes == {"foo/delete"}
    assert c.stats.ignored > 0


def test_message_under_no_announced_prefix_is_dropped(caplog):
    p = Producer("d", {"foo/": "d"})
    msgs = p.add_block(1, h(1), h(0), 1, {"foo/a": b"1"})["d"]
    c = BlockAssembler()
    c.handle(msgs[-1])  # Batch: foo/ count 1
    from loglake.cardinal.messages import BatchMsg

    with caplog.at_level(logging.WARNING):
        assert c.handle(BatchMsg(h(1), "zzz/a", b"x")) == []
    assert c.stats.dropped == 1
    (blk,) = c.handle(msgs[0])
    assert blk.values == {"foo/a": b"1"}


def test_far_future_batches_cannot_grow_memory_without_bound(caplog):
    p = Producer("d", {"foo/": "d"})
    c = BlockAssembler(max_pending=5)
    with caplog.at_level(logging.WARNING):
        for n in range(20):  # each announces a message that never comes
            c.handle(p.add_block(10**6 + n, h(1000 + n), h(0), 1, {"foo/a": b"1"})["d"][-1])
    assert c.pending == 5
    assert "too many incomplete batches" in caplog.text
    # a real block still completes
    (blk,) = c.handle(p.add_block(1, h(1), h(0), 1, {})["d"][0])
    assert blk.number == 1
