"""``assemble_blocks`` (one assembler for many blocks) equals ``assemble_block`` a block: the same
block, kept messages and rejects for every group — complete, incomplete, without a Batch, with
corrupt values, extras, copies and a tracked-prefix filter — whatever order the groups come in."""

from __future__ import annotations

import random

import pytest

from loglake.cardinal.codec import encode
from loglake.cardinal.consumer import assemble_block, assemble_blocks
from loglake.cardinal.messages import BatchMsg
from loglake.cardinal.producer import Producer
from loglake.cardinal.synthetic import schema_for, synthetic_chain


def _groups(seed: int) -> list[list[tuple[bytes, bytes, str, int]]]:
    rng = random.Random(seed)
    chain = synthetic_chain(10, updates=1 + seed % 3)
    producer = Producer("chain", schema_for("chain"))
    groups = []
    for i, block in enumerate(chain.canonical):
        msgs = [encode(m) for _, ms in sorted(producer.block_messages(block).items()) for m in ms]
        g = [(k, v, f"chain:{rng.randrange(3)}", rng.randrange(1000)) for k, v in msgs]
        g += rng.sample(g, len(g) // 2)  # copies
        shape = (i + seed) % 6  # every shape in every seed
        if shape == 1:  # incomplete: a message missing
            g = [m for m in g if m[0] != g[-1][0]]
        elif shape == 2:  # no Batch
            g = [m for m in g if m[0][0] != 0]
        elif shape == 3:  # a corrupt copy beside the good one, and a value that is not Avro
            k, v, _, _ = g[0]
            g += [(k, v[:-1], "chain:9", 0), (k[:1] + k[1:33] + b"x", b"\xff", "chain:8", 1)]
        elif shape == 4:  # an extra message under no announced prefix
            k, v = encode(BatchMsg(block.hash, "zzz/nowhere", b"1"))
            g.append((k, v, "chain:1", 5))
        rng.shuffle(g)
        groups.append(g)
    rng.shuffle(groups)
    return groups


@pytest.mark.parametrize("tracked", [(".*",), ("^state/",)])
@pytest.mark.parametrize("seed", range(6))
def test_assemble_blocks_equals_assemble_block_a_block(seed, tracked):
    groups = _groups(seed)
    shared = assemble_blocks(groups, tracked)
    alone = [assemble_block(g, tracked) for g in groups]
    assert len(shared) == len(alone)
    done = rejected = 0
    for s, a in zip(shared, alone, strict=True):
        assert s.kept == a.kept and s.rejected == a.rejected
        assert (s.block is None) == (a.block is None)
        if a.block is not None:
            done += 1
            fields = ("number", "hash", "parent", "weight", "values", "deletes", "offsets")
            assert [getattr(s.block, f) for f in fields] == [getattr(a.block, f) for f in fields]
        rejected += len(a.rejected)
    assert done >= 3 and rejected >= 1, "too little exercised"
