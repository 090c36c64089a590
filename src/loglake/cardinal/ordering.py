"""Ordered processing: completed blocks → chain updates in chain order, reorgs, checkpoints.

Reference: ``delivery/ordering.go`` (``OrderedMessageProcessor``: ``HandlePendingBatch``,
``prepareEmit``, ``getPendingChild``, ``prepareReorg``, ``HandleReorg``) and the resumption of
``delivery/consumer.go``/``transports/kafka.go`` (a stored last number/hash/weight plus
per-partition offsets). Spec: "Reorg Handling".

Rules, as the reference applies them:

- a block whose parent is the head extends the chain at once, along the heaviest chain of
  already-completed descendants (``prepareEmit`` + ``getPendingChild``);
- a block on a fork whose parent is on the chain (within the window) is held; when the heaviest
  tip of its fork is strictly heavier than the head, the chain reorganises: the blocks above the
  common ancestor are removed (oldest first) and the fork's path is added (``prepareReorg``);
- a block whose parent is unknown waits for it (an orphan), within the window;
- a block whose number is not its parent's + 1 is refused (logged) once its parent is known:
  on the chain, or held and hanging from it (a deviation, see ``_refuse``);
- blocks more than ``reorg_threshold`` below the head are dropped, and so is the history kept
  for reorgs (memory is bounded by the window); at most ``max_held`` blocks wait off the chain
  (beyond it the highest-numbered orphan goes);
- a Reorg message (a reorg deeper than the threshold, on its own channel) reverts to the
  common ancestor: it must be on the chain, or older than the window (then everything held is
  removed); otherwise ``UnknownAncestor`` and nothing changes. The reorg channel's blocks then
  extend the ancestor (those the Reorg removed too, when the channel re-sends them); the
  ReorgComplete of the pending Reorg, read on its channel, is passed on (any other is ignored).
  A Reorg/ReorgComplete whose ancestor hash was applied already (a redundant producer's copy,
  or read again after a restart) changes nothing, unless the transport found it starts a new
  reorg to the same ancestor (``expect_new_reorg``): the applied reorgs are kept (at most
  ``MAX_REORGS``) and checkpointed.

Deviation (documented in docs/cardinal.md): the reference's ``ChainUpdate.removed`` always has
full blocks; after a restart we hold only ``BlockRef``s of the blocks emitted before it.

Resumption: ``Checkpoint`` = the chain window (``BlockRef``s, head last) + per-source offsets =
the lowest offset of any message of a block in the window (on the chain, pending, queued, held
on a fork or as an orphan), else the next unread offset. A consumer restored from it and fed
everything from those offsets ends where an uninterrupted one would: blocks on the stored chain
are assembled again and recognised (their data is kept, nothing is emitted), so a later reorg
can still remove them or return to them, and nothing needed lies before the offsets.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from loglake.cardinal.blocks import Block, BlockRef, ChainUpdate, ReorgEvent
from loglake.cardinal.codec import decode
from loglake.cardinal.consumer import DEFAULT_REORG_THRESHOLD, BlockAssembler
from loglake.cardinal.errors import CheckpointError, UnknownAncestor
from loglake.cardinal.messages import ZERO_HASH, Message, Reorg, ReorgComplete
from loglake.log.api import ascii_digits
from loglake.structured_logging import log_event

log = logging.getLogger(__name__)

MAX_REORGS = 32
"""Applied reorgs remembered (and checkpointed) for recognising a repeated Reorg."""


def _nat(v: object, minimum: int = 0) -> int:
    """A checkpoint number or offset: a JSON integer (not a float/bool) >= ``minimum``."""
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"expected an integer >= {minimum}, got {v!r}")
    return v


def _weight(w: object) -> int:
    """A 256-bit weight, written as a decimal string (JSON numbers lose precision past 2^53)."""
    if not isinstance(w, str) or not ascii_digits(w) or len(w) > 78:
        raise ValueError(f"a weight is a decimal string of at most 78 digits, got {w!r}")
    return int(w)


def _hash(h: object) -> bytes:
    """A block hash: 32 bytes as hex (Cardinal hashes are 32-byte Keccak/types.Hash values)."""
    if not isinstance(h, str):
        raise ValueError(f"a block hash is a hex string, got {h!r}")
    raw = bytes.fromhex(h)
    if len(raw) != 32:
        raise ValueError(f"a block hash is 32 bytes, got {len(raw)}")
    return raw


@dataclass(frozen=True, slots=True)
class Checkpoint:
    chain: tuple[BlockRef, ...] = ()
    """The emitted chain within the reorg window, oldest first; the head is last."""
    offsets: dict[str, int] = field(default_factory=dict)
    reorgs: tuple[tuple[int, bytes, bool], ...] = ()
    """Reorgs already applied, oldest first: (ancestor number, ancestor hash, whether their
    ReorgComplete was seen). A Reorg/ReorgComplete read again after a restart (its offset not
    committed yet) is recognised from this and not applied twice. At most ``MAX_REORGS``."""
    reverted: tuple[bytes, ...] = ()
    """Blocks a Reorg removed whose ReorgComplete has not come yet: read again from the topics
    after a restart, they are not added back (the reorg channel brings the new branch)."""
    done: tuple[tuple[int, bytes], ...] = ()
    """(number, hash) of blocks assembled (or dropped as too old) before this checkpoint and
    needed no more: neither on the chain window nor held. Their Batch may lie before the
    offsets while other messages of theirs lie after them (keys hash to different partitions);
    a restarted consumer drops those on sight instead of queueing them for a Batch it will
    never read again, which would hold their partitions' offsets back at every restart. At
    most the assembler's ``max_done``."""

    @property
    def head(self) -> BlockRef | None:
        return self.chain[-1] if self.chain else None

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "chain": [
                    [b.number, b.hash.hex(), b.parent.hex(), str(b.weight)] for b in self.chain
                ],
                "offsets": self.offsets,
                "reorgs": [[n, h.hex(), int(done)] for n, h, done in self.reorgs],
                "reverted": [h.hex() for h in self.reverted],
                "done": [[n, h.hex()] for n, h in self.done],
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Checkpoint:
        try:
            d = json.loads(data)
            chain = tuple(
                # number -1: "before block 0", where `cardinal consume` starts a fresh chain
                BlockRef(_nat(n, -1), _hash(h), _hash(p), _weight(w))
                for n, h, p, w in d["chain"]
            )
            # -1 is the consumer's "no source offset" (``receive(..., offset=-1)``)
            offsets = {str(k): _nat(v, -1) for k, v in d["offsets"].items()}
            reorgs = tuple(  # absent in checkpoints written before it existed
                (_nat(n), _hash(h), bool(done)) for n, h, done in d.get("reorgs", [])
            )
            reverted = tuple(_hash(h) for h in d.get("reverted", []))
            done = tuple((_nat(n), _hash(h)) for n, h in d.get("done", []))
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            OverflowError,
            RecursionError,
        ) as e:
            raise CheckpointError(f"bad Cardinal checkpoint: {type(e).__name__}: {e}") from None
        return cls(chain, offsets, reorgs, reverted, done)

    @classmethod
    def starting_at(
        cls,
        number: int,
        hash_: bytes,
        weight: int,
        parent: bytes = ZERO_HASH,
        offsets: dict[str, int] | None = None,
    ) -> Checkpoint:
        """Resume after block (number, hash, weight) — the reference's LastEmittedNum/LastHash/
        LastWeight — reading each ``topic:partition`` from ``offsets`` (from 0 if absent)."""
        return cls((BlockRef(number, hash_, parent, weight),), dict(offsets or {}))


class OrderedProcessor:
    """Completed blocks in, ``ChainUpdate``s out (see the module docstring)."""

    direct: bool = True
    """Extend the head directly when a block's parent is the head and nothing waits below it;
    False takes the general steps for every block (the reference the direct path is tested
    equal to, ``tests/cardinal/test_ordering_direct.py``)."""

    def __init__(
        self,
        reorg_threshold: int = DEFAULT_REORG_THRESHOLD,
        chain: Sequence[BlockRef] = (),
        max_held: int = 10_000,
    ) -> None:
        self.reorg_threshold = reorg_threshold
        self.max_held = max_held
        self._chain: list[BlockRef | Block] = list(chain)
        self._on_chain: dict[bytes, int] = {b.hash: b.number for b in self._chain}
        self._held: dict[bytes, Block] = {}
        self._connected: set[bytes] = set()  # held blocks whose ancestry reaches the chain
        self._pruned_at = -(2**63)
        self._children: dict[bytes, dict[bytes, None]] = {}
        self._root: dict[bytes, bytes] = {}
        """Held block -> its fork's root when ``add`` last found it (the nearest held ancestor
        whose parent is on the chain): taken for a block's parent while the root is still
        held and hangs from the chain, so a block extending a long fork does not walk it.
        Forgotten whenever held blocks are let go other than onto the chain (a block between
        could be one: numbers need not grow along a fork)."""
        self._held_at: dict[bytes, int] = {}
        """Held block -> when it was held (a sequence number): the order of ``_held``."""
        self._seqs = itertools.count()
        self._by_number: list[tuple[int, int, bytes]] = []
        self._orphans_by_number: list[tuple[int, int, bytes]] = []
        """Held blocks, and those held as orphans, highest number first, as (-number, seq,
        hash): lazy (an entry whose block is no longer held at that seq, or in the second one is
        connected now, is skipped where it is met; both are compacted past twice ``_held``'s
        size; the second is rebuilt at a ``reorg``, the one place a connected block becomes an
        orphan again). Why: ``_shed_orphan`` took the max of a list of every held block, so each
        orphan past ``max_held`` (10,000) cost 130 times an ordinary one (6.4 ms a block)."""
        self._misnumbered = 0
        """Blocks refused because their number is not their parent's + 1."""
        self._bound = -1
        """At least the weight of every connected held block (``_mark_connected`` and
        ``_switch`` raise it, ``reorg`` recounts it). While it is at most the head's weight,
        a block that connects to a fork hanging below the head changes nothing unless it, or
        what it connects, is heavier than the head, so ``add`` weighs only those."""

    @property
    def head(self) -> BlockRef | None:
        if not self._chain:
            return None
        b = self._chain[-1]
        return b.ref if isinstance(b, Block) else b

    @property
    def chain(self) -> tuple[BlockRef, ...]:
        return tuple(b.ref if isinstance(b, Block) else b for b in self._chain)

    def on_chain(self, hash_: bytes) -> bool:
        return hash_ in self._on_chain

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def orphans(self) -> int:
        """Held blocks whose ancestry does not reach the chain: they wait for a parent."""
        return len(self._held) - len(self._connected)  # every connected block is held

    def missing_parent(self) -> tuple[bytes, Block] | None:
        """(the parent hash, its child) the lowest-numbered orphan waits for: a block neither
        on the chain nor held. O(held): for a report, not for every block."""
        best: Block | None = None
        for h, b in self._held.items():
            if (
                h not in self._connected
                and b.parent not in self._held
                and b.parent not in self._on_chain
                and (best is None or b.number < best.number)
            ):
                best = b
        return None if best is None else (best.parent, best)

    def holds(self, hash_: bytes) -> bool:
        """Whether ``hash_`` waits off the chain (a fork or an orphan)."""
        return hash_ in self._held

    def held_offsets(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self._held.values():
            for s, o in b.offsets.items():
                if o < out.get(s, o + 1):
                    out[s] = o
        return out

    # -- blocks -----------------------------------------------------------------------------
    def add(self, block: Block) -> list[ChainUpdate]:
        h = block.hash
        if h in self._on_chain:
            self._fill(block)
            return []
        if h in self._held:
            return []
        if h == block.parent:
            log_event(log, logging.WARNING, "block is its own parent", hash=h.hex())
            return []
        head = self._chain[-1] if self._chain else None
        if head is not None and block.number <= head.number - self.reorg_threshold:
            log_event(
                log,
                logging.INFO,
                "dropping block older than the reorg window",
                number=block.number,
                hash=h.hex(),
                head=head.number,
            )
            return []
        pn = self._on_chain.get(block.parent)
        if pn is not None and block.number != pn + 1:
            self._refuse(block, pn)
            return []
        if self._chain and h == self._chain[0].parent:
            if block.number != self._chain[0].number - 1:
                self._refuse(block, None, child=self._chain[0].number)
                return []
            return self._extend_down(block)
        if (
            self.direct
            and head is not None
            and block.parent == head.hash
            and h not in self._children
            and len(self._held) < self.max_held
        ):
            # The common case: the block extends the head and no held block hangs below it.
            # The steps below would hold it, find it connected, walk no further, switch to the
            # one-block path from the head and unhold it again: the same chain, held blocks
            # and update, without the bookkeeping (a tenth of the block job's CPU a block).
            self._chain.append(block)
            self._on_chain[h] = block.number
            self._prune()
            return [ChainUpdate((block,), ())]
        self._hold(block, orphan=True)
        if len(self._held) > self.max_held:
            self._shed_orphan()
            if h not in self._held:
                return []
        p = block.parent
        if head is not None and p not in self._on_chain and p not in self._connected:
            return []  # an orphan, or below one: waits for its parent
        bound = self._bound
        heaviest_new = self._mark_connected(h)
        if h not in self._held:
            return []  # refused: its number is not its parent's + 1
        root = self._fork_root(block)
        if root is None:
            log_event(log, logging.WARNING, "parent links form a cycle", hash=h.hex())
            return []
        if root.parent not in self._on_chain:
            if head is None:  # bootstrap: the first block whose parent we lack is the root
                return self._switch(None, root)
            return []  # orphan: waits for its parent
        self._root[h] = root.hash
        if (
            self.direct
            and head is not None
            and root.parent != head.hash
            and max(bound, heaviest_new) <= head.weight
        ):
            # A fork below the head, no block of it heavier than the head: ``_switch`` would
            # weigh the whole fork and keep it. Why not let it: a producer's light fork grown
            # a block at a time cost O(fork) a block (3,000 blocks: 16 s).
            return []
        return self._switch(root.parent, root)

    def _fork_root(self, block: Block) -> Block | None:
        """The nearest of ``block`` and its held ancestors whose parent is not held (on the
        chain, or not come yet); None for parent links that form a cycle."""
        known = self._root.get(block.parent) if self.direct else None
        if known is not None:
            r = self._held.get(known)
            # still held and hanging from the chain: no block between is on the chain (the
            # chain's parent links below such a one would pass through the root), and none
            # was let go off it (``_root`` is cleared then)
            if r is not None and r.parent in self._on_chain:
                return r
        root = block
        for _ in range(len(self._held)):  # bounded: a hostile producer can make parent cycles
            if root.parent in self._on_chain:
                return root
            up = self._held.get(root.parent)
            if up is None:
                return root
            root = up
        return None

    def _hold(self, block: Block, orphan: bool) -> None:
        """Hold ``block`` off the chain; ``orphan``: it may not hang from the chain (yet)."""
        h = block.hash
        self._held[h] = block
        self._held_at[h] = seq = next(self._seqs)
        self._children.setdefault(block.parent, {})[h] = None
        entry = (-block.number, seq, h)
        heapq.heappush(self._by_number, entry)
        if orphan:
            heapq.heappush(self._orphans_by_number, entry)
        if len(self._by_number) + len(self._orphans_by_number) > 4 * len(self._held) + 64:
            self._by_number = [e for e in self._by_number if self._held_at.get(e[2]) == e[1]]
            self._orphans_by_number = [
                e
                for e in self._orphans_by_number
                if self._held_at.get(e[2]) == e[1] and e[2] not in self._connected
            ]
            heapq.heapify(self._by_number)
            heapq.heapify(self._orphans_by_number)

    def _highest(self, heap: list[tuple[int, int, bytes]], orphans: bool) -> bytes | None:
        """The highest-numbered held block (an orphan if ``orphans``) of ``heap``, the one held
        first of equals (as ``max`` over ``_held`` in its order), its stale entries dropped."""
        while heap:
            _n, seq, h = heap[0]
            if self._held_at.get(h) == seq and not (orphans and h in self._connected):
                return h
            heapq.heappop(heap)
        return None

    def _shed_orphan(self) -> None:
        """Over ``max_held``: drop the highest-numbered orphan (or, if none, held block)."""
        x = self._highest(self._orphans_by_number, True)
        if x is None:
            x = self._highest(self._by_number, False)
        assert x is not None  # over max_held: something is held
        b = self._held[x]
        self._unhold(b.hash)
        self._root.clear()
        log_event(
            log,
            logging.WARNING,
            "too many held blocks: dropping the highest orphan",
            hash=b.hash.hex(),
            number=b.number,
        )

    def _mark_connected(self, h: bytes) -> int:
        """``h`` (held) now descends from the chain, and so do its held descendants. Returns
        the heaviest weight of those newly connected (-1: none)."""
        stack = [h]
        heaviest = -1
        while stack:
            x = stack.pop()
            if x in self._connected or x not in self._held:
                continue
            b = self._held[x]
            up = self._held.get(b.parent)
            pn = up.number if up is not None else self._on_chain.get(b.parent)
            if pn is not None and b.number != pn + 1:
                self._refuse(b, pn)
                continue
            self._connected.add(x)
            heaviest = max(heaviest, b.weight)
            stack.extend(self._children.get(x, ()))
        self._bound = max(self._bound, heaviest)
        return heaviest

    def _refuse(self, block: Block, parent_number: int | None, child: int | None = None) -> None:
        """Drop ``block``, whose number is not its parent's + 1 (``parent_number``), or not its
        child's - 1 (``child``, a chain block): numbers are ``parent.number + 1`` in every
        Cardinal chain, and the window, the reorg channel's ancestor and the checkpoint all
        measure by them. Found from outside: one block numbered 10**12 (its parent #9, links
        right) went on the chain; the assembler's window jumped there and dropped every later
        block as too old, for good (the checkpoint carried head #10**12), with nothing logged
        above DEBUG. Its children wait as orphans (its hash is not on the chain) and the stall
        is reported (``StreamConsumer``).

        Deviation: the reference (``delivery/ordering.go``: ``HandlePendingBatch``) checks no
        number: a block whose parent is the last emitted one is emitted whatever its number,
        and ``prepareReorg`` walks a fork down by number, taking each block to be its parent's
        number + 1 without looking."""
        self._misnumbered += 1
        if block.hash in self._held:
            self._unhold(block.hash)
            self._root.clear()  # let go other than onto the chain (see ``_root``)
        log_event(
            log,
            logging.WARNING,
            "refusing a block whose number does not follow its parent's",
            number=block.number,
            hash=block.hash.hex(),
            parent=block.parent.hex(),
            **({"parent_number": parent_number} if parent_number is not None else {}),
            **({"child_number": child} if child is not None else {}),
        )

    @property
    def misnumbered(self) -> int:
        """Blocks refused because their number is not their parent's + 1."""
        return self._misnumbered

    def _unhold(self, h: bytes) -> Block | None:
        b = self._held.pop(h, None)
        self._held_at.pop(h, None)
        self._connected.discard(h)
        self._root.pop(h, None)
        if b is not None:
            kids = self._children.get(b.parent)
            if kids is not None:
                kids.pop(h, None)
                if not kids:
                    del self._children[b.parent]
        return b

    def _fill(self, block: Block) -> None:
        """A block we hold on the chain only as a ``BlockRef`` (from a checkpoint) was
        assembled again: keep its data, so a reorg can remove it with its data or return to it."""
        n = self._on_chain[block.hash]
        for i in range(len(self._chain) - 1, -1, -1):
            if self._chain[i].number == n and self._chain[i].hash == block.hash:
                if not isinstance(self._chain[i], Block):
                    self._chain[i] = block
                return

    @property
    def refs_only(self) -> int:
        """Chain blocks known only by reference (not yet assembled again since a restart)."""
        return sum(1 for b in self._chain if not isinstance(b, Block))

    def chain_offsets(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self._chain:
            if isinstance(b, Block):
                for s, o in b.offsets.items():
                    if o < out.get(s, o + 1):
                        out[s] = o
        return out

    def _extend_down(self, block: Block) -> list[ChainUpdate]:
        """``block`` is the parent of the oldest block we hold on the chain (known only from a
        checkpoint): it is an ancestor the application already has. Take it, and any held
        ancestors below it, onto the chain without emitting them, then weigh the forks that
        hang off them (the reference does the same with blocks it holds from before a start)."""
        head_n = self._chain[-1].number
        below: list[Block] = []
        b: Block | None = block
        while b is not None and b.number >= head_n - self.reorg_threshold:
            below.append(b)
            up = self._held.get(b.parent)
            if up is not None and up.number != b.number - 1:
                self._refuse(up, None, child=b.number)
                break
            b = self._unhold(b.parent)
        below.reverse()
        self._chain[:0] = below
        for b in below:
            self._on_chain[b.hash] = b.number
        out: list[ChainUpdate] = []
        for b in below:
            for child in list(self._children.get(b.hash, ())):
                self._mark_connected(child)
        for b in below:
            for child in list(self._children.get(b.hash, ())):
                if child in self._held and b.hash in self._on_chain:
                    out += self._switch(b.hash, self._held[child])
        return out

    def _heaviest_tip(self, root: Block) -> tuple[list[Block], int]:
        """Path from ``root`` to the heaviest held descendant (first seen wins a tie). The
        path is found back up the parent links once (a copy of it at every block visited cost
        O(fork²))."""
        if root.hash not in self._children:
            return [root], root.weight
        best = root
        stack = [root]
        seen = {root.hash}
        while stack:
            b = stack.pop()
            if b.weight > best.weight:
                best = b
            for c in reversed(list(self._children.get(b.hash, ()))):
                if c not in seen:
                    seen.add(c)
                    stack.append(self._held[c])
        path = [best]
        while (
            path[-1].hash != root.hash
        ):  # each visited block's parent is the one it was found from
            path.append(self._held[path[-1].parent])
        path.reverse()
        return path, best.weight

    def _switch(self, anchor: bytes | None, root: Block) -> list[ChainUpdate]:
        path, weight = self._heaviest_tip(root)
        head = self._chain[-1] if self._chain else None
        removed: list[Block | BlockRef] = []
        if anchor is not None and head is not None and anchor != head.hash:
            if weight <= head.weight:
                return []  # a lighter (or equal) fork: keep it for later
            # Back to the anchor block itself, not to its number: a hostile producer's numbers
            # need not grow along the chain (all 0: a cut by number kept the old head under
            # the fork, and the application held both branches).
            while self._chain and self._chain[-1].hash != anchor:
                old = self._chain.pop()
                del self._on_chain[old.hash]
                removed.append(old)
                if isinstance(old, Block):  # back to a fork we may return to
                    self._hold(old, orphan=False)
                    self._connected.add(old.hash)
                    self._bound = max(self._bound, old.weight)
            removed.reverse()
        for b in path:
            self._unhold(b.hash)
            self._chain.append(b)
            self._on_chain[b.hash] = b.number
        self._prune()
        return [ChainUpdate(tuple(path), tuple(removed))]

    def _prune(self) -> None:
        head_n = self._chain[-1].number
        floor = head_n - self.reorg_threshold
        cut = 0
        while cut < len(self._chain) - 1 and self._chain[cut].number < floor:
            del self._on_chain[self._chain[cut].hash]
            cut += 1
        if cut:
            del self._chain[:cut]
        if self._held and floor >= self._pruned_at + max(1, self.reorg_threshold // 8):
            self._pruned_at = floor
            for h in [h for h, b in self._held.items() if b.number <= floor]:
                self._unhold(h)
            self._root.clear()

    # -- reorg channel -----------------------------------------------------------------------
    def reorg(self, number: int, hash_: bytes) -> list[ChainUpdate]:
        """Revert to common ancestor (number, hash) of a Reorg message."""
        if hash_ in self._on_chain:
            if self._on_chain[hash_] != number:
                raise UnknownAncestor(number, hash_, f"it is #{self._on_chain[hash_]} on our chain")
            removed: list[Block | BlockRef] = []
            while self._chain[-1].hash != hash_:
                old = self._chain.pop()
                del self._on_chain[old.hash]
                removed.append(old)
            removed.reverse()
        elif not self._chain or number < self._chain[0].number:
            removed = list(self._chain)
            self._chain = [BlockRef(number, hash_, ZERO_HASH, 0)]
            self._on_chain = {hash_: number}
        else:
            raise UnknownAncestor(
                number,
                hash_,
                f"not on our chain #{self._chain[0].number}..#{self._chain[-1].number}",
            )
        # The reorg channel re-sends what follows the ancestor: forget the held blocks above it
        # that hang from the chain as it was (forks of the branch given up). Not the held
        # blocks whose parent has not come (read ahead of the Reorg from another partition:
        # in order only within one): they may extend the new branch once its blocks land, and
        # their messages do not come again (dropped here, the chain stopped at the channel's
        # end for good, every later block an orphan; the reference drops nothing pending).
        for h in [h for h, b in self._held.items() if b.number > number and h in self._connected]:
            self._unhold(h)
        self._connected.clear()
        self._root.clear()
        self._bound = -1  # counted again as they are marked
        for b in self._chain:
            for child in list(self._children.get(b.hash, ())):
                self._mark_connected(child)
        self._orphans_by_number = [
            (-b.number, self._held_at[h], h)
            for h, b in self._held.items()
            if h not in self._connected
        ]
        heapq.heapify(self._orphans_by_number)
        return [ChainUpdate((), tuple(removed))] if removed else []


class OrderedConsumer:
    """The whole consumer side, sans-I/O: ``BlockAssembler`` (assembly) + ``OrderedProcessor``.

    ``receive(key, value, source, offset)`` → ``ChainUpdate``s and ``ReorgEvent``s in the order
    the application must apply them; ``checkpoint()`` → what to store to resume.
    """

    def __init__(
        self,
        reorg_threshold: int = DEFAULT_REORG_THRESHOLD,
        tracked_prefixes: Iterable[str] = (".*",),
        checkpoint: Checkpoint | None = None,
    ) -> None:
        chain = checkpoint.chain if checkpoint else ()
        self.start_offsets = dict(checkpoint.offsets) if checkpoint else {}
        self.consumer = BlockAssembler(
            reorg_threshold,
            tracked_prefixes,
            last_number=chain[-1].number if chain else None,
            completed=((h, n) for n, h in (checkpoint.done if checkpoint else ())),
        )
        self.ordering = OrderedProcessor(reorg_threshold, chain)
        self.consumer.advance(chain[-1].number if chain else -1)
        self.consumer.next_offsets.update(self.start_offsets)
        # ancestor hash -> (number, ReorgComplete seen); insertion order = application order
        self._reorgs: dict[bytes, tuple[int, bool]] = {
            h: (n, done) for n, h, done in (checkpoint.reorgs if checkpoint else ())
        }
        self.repeated_reorgs = 0
        self.ignored_reorg_completes = 0
        """ReorgCompletes ignored: no Reorg of theirs pending, or read off its reorg channel."""
        # blocks removed by a Reorg whose ReorgComplete has not come yet (insertion-ordered)
        self._reverted: dict[bytes, None] = dict.fromkeys(checkpoint.reverted if checkpoint else ())
        self._again: tuple[bytes, str, int] | None = None
        """A Reorg (ancestor hash, source, offset) to apply though its ancestor hash was applied
        before: a new segment of an already followed reorg channel (``expect_new_reorg``)."""

    def receive(
        self, key: bytes, value: bytes, source: str = "", offset: int = -1
    ) -> list[ChainUpdate | ReorgEvent]:
        """Decode and apply one message. ``CardinalDecodeError``/``UnknownAncestor`` leave the
        state as it was (the offset counts as read: a bad message is not read again)."""
        if key[:1] in (b"\x05", b"\x06"):  # Reorg(Complete): applied once, checked first
            self.consumer.note_offset(source, offset)
            return self.handle(decode(key, value), source, offset)
        if self._reverted:
            self.readmit(key, source)
        return self._route(self.consumer.receive(key, value, source, offset))

    def pending_reorg(self) -> bytes | None:
        """The ancestor hash of the newest Reorg applied whose ReorgComplete has not come."""
        if not self._reorgs:
            return None
        h = next(reversed(self._reorgs))
        return None if self._reorgs[h][1] else h

    def _on_channel(self, source: str, hash_: bytes) -> bool:
        """Whether ``source`` (``topic:partition``) is the reorg channel of ancestor ``hash_``
        (``<default topic>-re-<hash hex>``, ``producer.reorg_channel_name``)."""
        return source.rpartition(":")[0].endswith("-re-" + hash_.hex())

    def readmit(self, key: bytes, source: str) -> None:
        """A block message read on the pending reorg's channel for a block that Reorg removed:
        the channel re-sends every block after the ancestor (spec "Reorg/Producers"), those
        the old and new branch share included (a producer that names an older common ancestor
        than the fork point). Found from outside: they were dropped as done, and as the old
        branch in ``_route``, so the new branch never connected (the chain stayed cut back at
        the ancestor). The assembler forgets it as done; ``_route`` lets it through."""
        h = key[1:33]
        if key[:1] <= b"\x04" and h in self._reverted:
            pending = self.pending_reorg()
            if pending is not None and self._on_channel(source, pending):
                self.consumer.forget_done(h)

    def expect_new_reorg(self, hash_: bytes, source: str, offset: int) -> None:
        """The Reorg at ``offset`` of reorg channel ``source`` starts a new reorg to ancestor
        ``hash_``, though a reorg to it was applied before: a later segment of the same
        channel (the name is keyed by the ancestor only) that is not a copy of the branch the
        channel installed (``transport.channel_segment``). It is applied when it is read."""
        self._again = (hash_, source, offset)

    def handle(
        self, msg: Message, source: str = "", offset: int = -1
    ) -> list[ChainUpdate | ReorgEvent]:
        """Apply one decoded message.

        A Reorg (or ReorgComplete) whose ancestor hash was applied already — a redundant
        producer's copy, or the same message read again after a restart because its offset was
        not committed — changes nothing: the reorg channel's name is keyed by that hash too
        (``%s-re-%x``), so it is the same reorg, and its blocks are recognised when they arrive
        again. Applying it twice would remove the new branch and add it back."""
        if isinstance(msg, (Reorg, ReorgComplete)):
            seen = self._reorgs.get(msg.hash)
            complete = isinstance(msg, ReorgComplete)
            if not complete and self._again == (msg.hash, source, offset):
                self._again = None
                seen = None  # a new reorg to the same ancestor: applied again
            if complete and (seen is None or not seen[1]) and not self._completes(msg, source):
                self.consumer.note_offset(source, offset)
                self.ignored_reorg_completes += 1
                log_event(
                    log,
                    logging.WARNING,
                    "ignoring ReorgComplete: no Reorg of its pending, or not on its channel",
                    number=msg.number,
                    hash=msg.hash.hex(),
                    source=source,
                )
                return []
            if seen is not None and (not complete or seen[1]):
                self.consumer.note_offset(source, offset)
                self.repeated_reorgs += 1
                return []
            updates: list[ChainUpdate | ReorgEvent] = []
            if not complete:
                reverted = self.ordering.reorg(msg.number, msg.hash)  # may raise: nothing noted
                updates += reverted
                self._reverted.clear()  # bounded: only the latest reorg's (<= window) blocks
                for u in reverted:
                    self._reverted.update(dict.fromkeys(b.hash for b in u.removed))
            else:
                self._reverted.clear()
            self._reorgs.pop(msg.hash, None)
            self._reorgs[msg.hash] = (msg.number, complete)
            while len(self._reorgs) > MAX_REORGS:
                del self._reorgs[next(iter(self._reorgs))]
            for ev in self.consumer.handle(msg, source, offset):
                assert isinstance(ev, ReorgEvent)  # a Reorg yields its event, never a block
                updates.append(ev)
            # The assembler forgot every done block (the reference's, so the channel's blocks
            # assemble again); the branch given up stays done: a redundant producer's late
            # copy of one of its messages was queued for a Batch never read again, and held
            # its partition's committed offset back for good. A later Reorg back to that
            # branch forgets them again.
            for change in updates:
                if isinstance(change, ChainUpdate):
                    for b in change.removed:
                        self.consumer.remember_done(b.hash, b.number)
            return updates
        return self._route(self.consumer.handle(msg, source, offset))

    def _completes(self, msg: Reorg | ReorgComplete, source: str) -> bool:
        """Whether ReorgComplete ``msg`` ends the pending reorg: it names the newest Reorg
        applied, and comes on that reorg's channel (or from nowhere in particular: ``source``
        empty, a caller of this sans-I/O core that does not say). Found from outside: a copy
        put on the default topic, read before its Reorg (another partition), was applied as
        complete and emitted, and the real Reorg then counted as a repeat (the chain stayed
        on the old branch, every later block an orphan)."""
        return self.pending_reorg() == msg.hash and (
            not source or self._on_channel(source, msg.hash)
        )

    def _route(self, events: list[Block | ReorgEvent]) -> list[ChainUpdate | ReorgEvent]:
        out: list[ChainUpdate | ReorgEvent] = []
        for ev in events:
            if isinstance(ev, Block):
                if ev.hash in self._reverted:  # the old branch, read again mid-reorg ...
                    pending = self.pending_reorg()
                    if pending is None or not any(self._on_channel(s, pending) for s in ev.offsets):
                        continue
                    del self._reverted[ev.hash]  # ... or a block the channel re-sends
                updates = self.ordering.add(ev)
                if updates:
                    out.extend(updates)
                    head = self.ordering.head
                    assert head is not None  # blocks were just added
                    self.consumer.advance(head.number)
            else:
                out.append(ev)
        return out

    def add_block(self, block: Block) -> list[ChainUpdate | ReorgEvent]:
        """Order a block assembled elsewhere (``consumer.assemble_block`` in a Spark stateful
        operator) exactly as one this consumer had assembled itself."""
        return self._route([block])

    def reorg_ready(self, number: int, hash_: bytes) -> bool:
        """Whether a Reorg to ancestor (``number``, ``hash_``) read on a topic can be applied:
        the chain has reached the ancestor, or passed it by more than the window (blocks sent
        before the Reorg may still be in other partitions: in-order delivery holds only within
        one)."""
        head = self.ordering.head
        return self.ordering.on_chain(hash_) or (
            head is not None and head.number - self.ordering.reorg_threshold > number
        )

    @property
    def head(self) -> BlockRef | None:
        return self.ordering.head

    def checkpoint(self) -> Checkpoint:
        offsets = dict(self.consumer.next_offsets)
        kept = [
            self.consumer.held_offsets(),
            self.ordering.held_offsets(),
            self.ordering.chain_offsets(),
        ]
        if self.ordering.refs_only:  # chain blocks not re-read yet: keep where they started
            kept.append(self.start_offsets)
        for held in kept:
            for s, o in held.items():
                if o < offsets.get(s, o + 1):
                    offsets[s] = o
        reorgs = tuple((n, h, done) for h, (n, done) in self._reorgs.items())
        # Chain and held blocks are assembled again after a restart (their offsets are kept
        # for that), so they are not "done"; every other block the assembler remembers is.
        done = tuple(
            (n, h)
            for h, n in self.consumer.done().items()
            if not self.ordering.on_chain(h) and not self.ordering.holds(h)
        )
        return Checkpoint(self.ordering.chain, offsets, reorgs, tuple(self._reverted), done)
