"""Producer rules (spec "…/Producers"; reference delivery/producer.go and producer_test.go)."""

from __future__ import annotations

import pytest

from loglake.cardinal.codec import decode, encode
from loglake.cardinal.errors import ProducerError
from loglake.cardinal.messages import Batch, BatchRecord, SubBatchHeader, SubBatchMsg
from loglake.cardinal.producer import BlockPayload, Producer, SubBatch, reorg_channel_name
from tests.cardinal.helpers import h

UPDATES = {
    "foo/something": b"gnihtemos/oof",
    "bar/whatever/baz/stuff": b"data",
    "default/thing": b"defaulttopic",
}
DELETES = {"foo/delete", "bar/delete/baz/thing", "default/delete"}


def ref_producer() -> Producer:
    return Producer("default", {"foo/": "foo", "bar/[^/]+/baz/": "bar", "state/": "state"})


def test_reference_test_producer_counts_per_topic():
    # producer_test.go TestProducer: 2 on foo, 2 on bar, 1 (the Batch) on default
    p = ref_producer()
    msgs = p.add_block(0, h(1), h(0), 0, UPDATES, DELETES, {"state/": h(0xFF)})
    assert {t: len(m) for t, m in msgs.items()} == {"default": 1, "foo": 2, "bar": 2}
    batch = decode(*encode(msgs["default"][0]))
    assert isinstance(batch, Batch)
    assert (batch.number, batch.weight, batch.parent) == (0, 0, h(0))
    # producer_test.go expects 6: 3 matched prefixes, 1 sub-batch, 2 inline changes
    assert len(batch.updates) == 6
    assert batch.updates["foo/"] == BatchRecord(count=2)
    assert batch.updates["bar/whatever/baz/"] == BatchRecord(count=1)
    assert batch.updates["bar/delete/baz/"] == BatchRecord(count=1)
    assert batch.updates["default/thing"] == BatchRecord(value=b"defaulttopic")
    assert batch.updates["default/delete"] == BatchRecord(delete=True)
    assert batch.updates["state/"] == BatchRecord(subbatch=h(0xFF))


def test_counts_match_the_messages_that_follow():
    p = ref_producer()
    msgs = p.add_block(0, h(1), h(0), 0, UPDATES, DELETES, {})
    batch = msgs["default"][-1]
    sent = [m for t in ("foo", "bar") for m in msgs[t]]
    for prefix, rec in batch.updates.items():
        if rec.count:
            assert rec.count == sum(1 for m in sent if m.key.startswith(prefix))


def test_send_batch_header_then_deletes_then_sorted_updates():
    p = ref_producer()
    p.add_block(0, h(1), h(0), 0, {}, (), {"state/": h(0xFF)})
    msgs = p.send_batch(h(0xFF), ["whatever/", "other/"], {"state/z": b"2", "state/a": b"1"})
    assert list(msgs) == ["state"]
    m = msgs["state"]
    assert m[0] == SubBatchHeader(h(1), h(0xFF), 3)
    assert m[1] == SubBatchMsg(h(1), h(0xFF), 0, ("whatever/", "other/"), {})
    assert m[2] == SubBatchMsg(h(1), h(0xFF), 1, (), {"state/a": b"1"})
    assert m[3] == SubBatchMsg(h(1), h(0xFF), 2, (), {"state/z": b"2"})


def test_empty_sub_batch_still_sends_a_header():
    p = ref_producer()
    p.add_block(0, h(1), h(0), 0, {}, (), {"state/": h(0xFF)})
    assert p.send_batch(h(0xFF)) == {"state": [SubBatchHeader(h(1), h(0xFF), 0)]}


def test_unknown_sub_batch_is_refused():
    with pytest.raises(ProducerError, match="unknown sub-batch"):
        ref_producer().send_batch(h(0xEE))


def test_overlapping_prefixes_are_refused():
    with pytest.raises(ProducerError, match="overlap"):
        Producer("d", {"foo/": "a", "foo/bar/": "b"})


def test_prefix_conflicts_are_refused():
    p = ref_producer()
    with pytest.raises(ProducerError, match="conflicts"):
        p.add_block(0, h(1), h(0), 0, {"x": b"1"}, (), {"x": h(2)})
    with pytest.raises(ProducerError):
        p.add_block(0, h(1), h(0), 0, {}, (), {"x": bytes(32)})


def test_reorg_channel_is_reorg_blocks_then_complete():
    p = ref_producer()
    blk = BlockPayload(
        5, h(5), h(4), 9, {"foo/a": b"1"}, frozenset(), {"state/": SubBatch(h(0xAB))}
    )
    channel, msgs = p.reorg_channel(4, h(4), [blk])
    assert channel == "default-re-" + h(4).hex() == reorg_channel_name("default", h(4))
    assert encode(msgs[0]) == (b"\x05" + h(4), b"\x08")
    assert encode(msgs[-1]) == (b"\x06" + h(4), b"\x08")
    assert len(msgs) == 2 + 3  # Batch, BatchMsg, SubBatchHeader


def _chain(n: int, tag: str, parent: BlockPayload, weight_step: int = 10) -> list[BlockPayload]:
    out = []
    for _ in range(n):
        b = BlockPayload(
            parent.number + 1,
            f"{tag}{parent.number + 1}".encode().rjust(32, b"\0"),
            parent.hash,
            parent.weight + weight_step,
            {"foo/x": b"1"},
        )
        out.append(b)
        parent = b
    return out


def test_chain_producer_sends_deep_reorgs_through_a_channel():
    from loglake.cardinal.messages import Reorg, ReorgComplete
    from loglake.cardinal.producer import ChainProducer

    genesis = BlockPayload(0, h(0xAA), bytes(32), 0)
    cp = ChainProducer(ref_producer(), reorg_threshold=3)
    assert cp.branch([genesis]).channel is None
    main = _chain(6, "m", genesis)
    for b in main:
        e = cp.branch([b])
        assert e.channel is None and isinstance(e.topics["default"][-1], Batch)
    # a fork from block 4 (depth 2 <= 3): plain messages
    shallow = _chain(3, "s", main[3], weight_step=11)
    e = cp.branch(shallow)
    assert e.channel is None and sum(isinstance(m, Batch) for m in e.topics["default"]) == 3
    assert cp.head == shallow[-1]
    # a fork from block 2 (depth 5 > 3): Reorg ... ReorgComplete on the channel
    deep = _chain(6, "d", main[1], weight_step=12)
    e = cp.branch(deep)
    assert e.channel == reorg_channel_name("default", main[1].hash)
    assert e.channel_messages[0] == Reorg(main[1].hash, 2)
    assert e.channel_messages[-1] == ReorgComplete(main[1].hash, 2)
    assert sum(isinstance(m, Batch) for m in e.channel_messages) == 6
    assert e.topics == {"default": [Reorg(main[1].hash, 2)]}
    assert cp.head == deep[-1]
