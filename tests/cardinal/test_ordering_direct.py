"""``OrderedProcessor.add``'s direct path (a block extending the head with nothing held below
it) leaves the same chain, held blocks and updates as the general steps, for blocks of any tree
(forks, heavier branches, orphans, copies) in any order, with a small window and hold limit."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal.blocks import Block, BlockRef, ChainUpdate
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import OrderedProcessor

STATE = ("_chain", "_on_chain", "_held", "_connected", "_children", "_pruned_at")


@st.composite
def trees(draw) -> list[Block]:
    blocks: list[Block] = []
    for i in range(draw(st.integers(1, 30))):
        parent = draw(st.sampled_from(blocks[-4:])) if blocks and draw(st.integers(0, 5)) else None
        number = parent.number + 1 if parent else draw(st.integers(0, 3))
        weight = (parent.weight if parent else 0) + draw(st.integers(1, 5))
        h = hashlib.sha256(b"%d" % i).digest()
        blocks.append(Block(number, h, parent.hash if parent else ZERO_HASH, weight))
    order = draw(st.permutations(blocks))
    copies = draw(st.lists(st.sampled_from(blocks), max_size=5))
    return [*order, *copies] if draw(st.booleans()) else sorted(blocks, key=lambda b: b.number)


def _snap(p: OrderedProcessor) -> list:
    return [list(v.items()) if isinstance(v, dict) else v for v in (getattr(p, f) for f in STATE)]


@settings(max_examples=100, deadline=None)
@given(trees(), st.integers(1, 6), st.integers(1, 8))
def test_direct_path_equals_the_general_steps(blocks, threshold, max_held):
    direct = OrderedProcessor(threshold, max_held=max_held)
    general = OrderedProcessor(threshold, max_held=max_held)
    general.direct = False
    for b in blocks:
        assert direct.add(b) == general.add(b)
        assert _snap(direct) == _snap(general)


@st.composite
def hostile_trees(draw) -> list[tuple[str, Block | int]]:
    """Blocks of any weight (lighter and heavier forks, long light forks), numbered their
    parent's + 1 or, one in six, any number (refused once the parent is known), in any order,
    with reorgs to a chain block between."""
    blocks: list[Block] = []
    ops: list[tuple[str, Block | int]] = []
    for i in range(draw(st.integers(1, 40))):
        parent = draw(st.sampled_from(blocks)) if blocks and draw(st.integers(0, 6)) else None
        wrong = parent is None or draw(st.integers(0, 5)) == 0
        number = draw(st.integers(0, 12)) if wrong else parent.number + 1
        weight = draw(st.integers(0, 30))
        h = hashlib.sha256(b"h%d" % i).digest()
        b = Block(number, h, parent.hash if parent else ZERO_HASH, weight)
        blocks.append(b)
        ops.append(("add", b))
        if draw(st.integers(0, 9)) == 0:
            ops.append(("reorg", draw(st.integers(0, 40))))
    if draw(st.booleans()):
        adds = draw(st.permutations([op for op in ops if op[0] == "add"]))
        ops = [*adds, *[op for op in ops if op[0] == "reorg"]]
    return ops


class _Application:
    """What an application holds after applying each ``ChainUpdate`` as ``blocks.py`` says:
    the removed blocks taken off its head (newest last), then the added ones put on. The
    updates must keep it a chain (every block's parent the one before it), the processor's.
    Blocks below the first one it got (a fork's root's ancestors come later, ``_extend_down``)
    it is taken to have had, as after a checkpoint."""

    def __init__(self) -> None:
        self.chain: list[BlockRef] = []

    def apply(self, updates: list[ChainUpdate], p: OrderedProcessor) -> None:
        for u in updates:
            for r in reversed(u.removed):
                if self.chain:  # else below the first block it got: it had those already
                    assert self.chain[-1].hash == r.hash, "removed is not the head"
                    self.chain.pop()
            for b in u.added:
                if self.chain:
                    assert b.parent == self.chain[-1].hash, "added block not on the head"
                self.chain.append(b.ref)
        tail = p.chain[-len(self.chain) :] if self.chain else ()
        assert [b.hash for b in tail] == [b.hash for b in self.chain[-len(p.chain) :]]


@settings(max_examples=600, deadline=None)
@given(hostile_trees(), st.integers(1, 6), st.integers(1, 12))
def test_shortcuts_equal_the_general_steps_on_hostile_trees(ops, threshold, max_held):
    """The direct path, the fork-root memo and the light-fork bound (``OrderedProcessor.add``)
    against the general steps: same updates, errors and state, for any weights and numbers;
    and the updates keep the application's chain a chain."""
    direct = OrderedProcessor(threshold, max_held=max_held)
    general = OrderedProcessor(threshold, max_held=max_held)
    general.direct = False
    app = _Application()
    for op, arg in ops:
        if op == "add":
            assert isinstance(arg, Block)
            updates = direct.add(arg)
            assert updates == general.add(arg)
        else:
            chain = direct.chain
            if not chain:
                continue
            target = chain[int(arg) % len(chain)]
            updates = direct.reorg(target.number, target.hash)
            assert updates == general.reorg(target.number, target.hash)
        app.apply(updates, direct)
        assert _snap(direct) == _snap(general)


def test_a_fork_taken_after_a_reorg_replaces_the_head() -> None:
    """Found by replaying the differential test's hostile trees in an application: after a
    Reorg back to ``a``, ``d`` extended the new head and then ``e`` made the held fork ``c``
    (heavier) win; the switch cut the chain back by block *number*, and with every number 0
    it cut nothing: the update added ``c`` on top of ``d``, and the application held both.
    The switch now cuts back to the fork's anchor block itself (and blocks numbered other than
    their parent's + 1 are refused: ``test_a_block_numbered_out_of_line_is_refused``). Also
    the case a mutation dropping the light-fork bound (``_bound``) gets wrong (the
    differential test found it only at ~5,000 examples): ``c`` (weight 3) hangs from ``z``,
    below the Reorg's ancestor, and outweighs the head from the Reorg on."""
    z = Block(0, _h("z"), ZERO_HASH, 0)
    a, c = Block(1, _h("a"), z.hash, 0), Block(1, _h("c"), z.hash, 3)
    b = Block(2, _h("b"), a.hash, 5)
    d, e = Block(2, _h("d"), a.hash, 0), Block(2, _h("e"), c.hash, 0)
    p = OrderedProcessor(8, max_held=2)
    app = _Application()
    for blk in (z, a, b, c):
        app.apply(p.add(blk), p)
    assert p.chain == (z.ref, a.ref, b.ref) and p.holds(c.hash)  # c is lighter than b
    app.apply(p.reorg(a.number, a.hash), p)
    app.apply(p.add(d), p)
    assert p.chain == (z.ref, a.ref, d.ref)
    update = p.add(e)  # c's fork (weight 3) outweighs the head d (weight 0)
    assert update == [ChainUpdate((c,), (a, d))]
    app.apply(update, p)
    assert p.chain == (z.ref, c.ref) and [x.hash for x in app.chain] == [z.hash, c.hash]


def _h(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def test_a_long_light_fork_costs_little_a_block() -> None:
    """Found from outside: a producer's light fork off the chain, grown a block at a time (each
    a complete ~80-byte Batch), cost O(fork²) a block: 3,000 blocks took 16 s. Now every block
    is O(1): 5,000 blocks, well under a second of CPU, and the chain untouched."""
    import time

    p = OrderedProcessor(128)
    prev = ZERO_HASH
    for i in range(11):
        h = hashlib.sha256(b"c%d" % i).digest()
        p.add(Block(i, h, prev, 1000 * (i + 1)))
        prev = h
    head = p.head
    parent = p.chain[5].hash
    t0 = time.process_time()
    for i in range(5000):
        h = hashlib.sha256(b"f%d" % i).digest()
        assert p.add(Block(6 + i, h, parent, 1)) == []
        parent = h
    assert time.process_time() - t0 < 1.0
    assert p.head == head and p.held == 5000
    heavy = Block(5006, hashlib.sha256(b"heavy").digest(), parent, 10**6)
    (update,) = p.add(heavy)  # the fork's tip outweighs the head: the whole fork is taken
    assert len(update.added) == 5001 and p.head == heavy.ref
