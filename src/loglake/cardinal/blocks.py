"""What the Cardinal consumer hands to the application: completed blocks, chain updates and
reorg notices (reference ``delivery/consumer.go: PendingBatch``, ``delivery/ordering.go:
ChainUpdate``; the reorg feed is ``map[int64]types.Hash`` there, a ``ReorgEvent`` here)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BlockRef:
    """A block's identity and place in the chain, without its data."""

    number: int
    hash: bytes
    parent: bytes
    weight: int

    def __repr__(self) -> str:
        return f"BlockRef(#{self.number} {self.hash.hex()[:12]} w={self.weight})"


@dataclass(slots=True, eq=False)
class Block:
    """A completed block: all prefix counters zero and every sub-batch item received."""

    number: int
    hash: bytes
    parent: bytes
    weight: int
    values: dict[str, bytes] = field(default_factory=dict)
    deletes: set[str] = field(default_factory=set)
    offsets: dict[str, int] = field(default_factory=dict)
    """Lowest (source → offset) of the messages that made this block: where to re-read it."""

    @property
    def ref(self) -> BlockRef:
        return BlockRef(self.number, self.hash, self.parent, self.weight)

    def __repr__(self) -> str:
        return (
            f"Block(#{self.number} {self.hash.hex()[:12]} w={self.weight} "
            f"values={len(self.values)} deletes={len(self.deletes)})"
        )


@dataclass(frozen=True, slots=True)
class ChainUpdate:
    """Blocks removed from the head (oldest first) then blocks added (oldest first).

    ``removed`` holds the full ``Block`` while the consumer still has it, a ``BlockRef`` for
    blocks known only from a checkpoint (after a restart) or below a Reorg message's window.
    """

    added: tuple[Block, ...] = ()
    removed: tuple[Block | BlockRef, ...] = ()


@dataclass(frozen=True, slots=True)
class ReorgEvent:
    """A Reorg (``complete=False``) or ReorgComplete (``complete=True``) message was applied:
    the chain was reverted to ancestor (``number``, ``hash``)."""

    number: int
    hash: bytes
    complete: bool = False
