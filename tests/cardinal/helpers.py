"""Shared builders for the Cardinal tests."""

from __future__ import annotations

from loglake.cardinal.codec import encode
from loglake.cardinal.ordering import OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer


def h(n: int) -> bytes:
    """Go ``types.HexToHash``/``BytesToHash`` of a small number: left-padded to 32 bytes."""
    return n.to_bytes(32, "big")


REF_SCHEMA = {"foo/": "foo", "bar/[^/]+/baz/": "bar", "state/": "state"}


def flat(producer: Producer, block: BlockPayload) -> list[tuple[str, bytes, bytes]]:
    """(topic, key, value) of every message of ``block``."""
    return [
        (topic, *encode(m))
        for topic, msgs in sorted(producer.block_messages(block).items())
        for m in msgs
    ]


def expected_content(block: BlockPayload) -> tuple[dict[str, bytes], set[str]]:
    values = dict(block.updates)
    deletes = set(block.deletes)
    for sb in block.batches.values():
        deletes.update(sb.deletes)
        values.update(sb.updates)
    return values, deletes


class ChainModel:
    """Applies ChainUpdates to a list, asserting each is consistent with the chain so far."""

    def __init__(self, chain: list[bytes], parents: dict[bytes, bytes] | None = None) -> None:
        self.chain = list(chain)
        self.added: dict[bytes, int] = {}

    def apply(self, update) -> None:
        if hasattr(update, "complete"):  # ReorgEvent: back to the common ancestor
            if not update.complete and update.hash in self.chain:
                del self.chain[self.chain.index(update.hash) + 1 :]
            return
        for r in reversed(update.removed):
            assert self.chain and self.chain[-1] == r.hash, "removed block is not the head"
            self.chain.pop()
        for b in update.added:
            if self.chain:
                assert b.parent == self.chain[-1], "added block does not extend the head"
            assert b.hash not in self.chain, "block added twice"
            self.chain.append(b.hash)
            self.added[b.hash] = self.added.get(b.hash, 0) + 1


def run(consumer: OrderedConsumer, deliveries) -> list:
    out = []
    for source, offset, key, value in deliveries:
        out += consumer.receive(key, value, source, offset)
    return out


def seg(parent: BlockPayload | None, n: int, tag: str, w0: int, dw: int) -> list[BlockPayload]:
    """``n`` blocks on ``parent`` (a chain from #0 if None), weights ``w0 + dw``, ``+ 2·dw``, …
    (``tag`` names their content): a branch for reorg tests."""
    from loglake.cardinal.synthetic import make_block

    out = []
    for i in range(n):
        b = make_block(parent.number + 1 if parent else 0, parent, w0 + dw * (i + 1), tag)
        out.append(b)
        parent = b
    return out
