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
