"""``OrderedProcessor.add``'s direct path (a block extending the head with nothing held below
it) leaves the same chain, held blocks and updates as the general steps, for blocks of any tree
(forks, heavier branches, orphans, copies) in any order, with a small window and hold limit."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal.blocks import Block
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
    """Blocks of any weight and number (lighter and heavier forks, numbers that need not grow
    along a fork, long light forks), in any order, with reorgs to a chain block between."""
    blocks: list[Block] = []
    ops: list[tuple[str, Block | int]] = []
    for i in range(draw(st.integers(1, 40))):
        parent = draw(st.sampled_from(blocks)) if blocks and draw(st.integers(0, 6)) else None
        number = draw(st.integers(0, 12))
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


@settings(max_examples=600, deadline=None)
@given(hostile_trees(), st.integers(1, 6), st.integers(1, 12))
def test_shortcuts_equal_the_general_steps_on_hostile_trees(ops, threshold, max_held):
    """The direct path, the fork-root memo and the light-fork bound (``OrderedProcessor.add``)
    against the general steps: same updates, errors and state, for any weights and numbers."""
    direct = OrderedProcessor(threshold, max_held=max_held)
    general = OrderedProcessor(threshold, max_held=max_held)
    general.direct = False
    for op, arg in ops:
        if op == "add":
            assert isinstance(arg, Block)
            assert direct.add(arg) == general.add(arg)
        else:
            chain = direct.chain
            if not chain:
                continue
            target = chain[int(arg) % len(chain)]
            assert direct.reorg(target.number, target.hash) == general.reorg(
                target.number, target.hash
            )
        assert _snap(direct) == _snap(general)


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
        assert p.add(Block(6, h, parent, 1)) == []
        parent = h
    assert time.process_time() - t0 < 1.0
    assert p.head == head and p.held == 5000
    heavy = Block(7, hashlib.sha256(b"heavy").digest(), parent, 10**6)
    (update,) = p.add(heavy)  # the fork's tip outweighs the head: the whole fork is taken
    assert len(update.added) == 5001 and p.head == heavy.ref
