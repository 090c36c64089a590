"""Ordered processing (reference delivery/ordering.go; cases from ordering_test.go TestReorg).

The block tree is the reference's ``getTestBlock`` tree: weight = parent weight + 1;
b, c children of a; d of c; e, g of b; f of e; h of g; i of h; j of f; k of i. Each case feeds
every message of the listed blocks, in that order, through producer → bytes → consumer, and
expects the same chain updates as the reference test (hash lists of added/removed).
"""

from __future__ import annotations

import pytest

from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
from loglake.cardinal.errors import UnknownAncestor
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer, OrderedProcessor
from loglake.cardinal.producer import BlockPayload, Producer, SubBatch
from tests.cardinal.helpers import REF_SCHEMA, ChainModel, flat


def make_block(number: int, nonce: int, parent: BlockPayload | None) -> BlockPayload:
    hash_ = f"{nonce}{number}".encode().rjust(32, b"\0")  # BytesToHash(fmt "%v%v")
    return BlockPayload(
        number=number,
        hash=hash_,
        parent=parent.hash if parent else ZERO_HASH,
        weight=parent.weight + 1 if parent else 0,
        updates={f"foo/{number}/item": str(nonce).encode()},
        deletes=frozenset({f"foo/{number}/gone"}),
        batches={
            "state/": SubBatch(
                f"batch{number}{nonce}".encode().rjust(32, b"\0"),
                (f"state/{nonce}/whatever",),
                {f"state/{number}/addition": str(nonce).encode()},
            )
        },
    )


A = make_block(0, 0, None)
B = make_block(1, 0, A)
C = make_block(1, 1, A)
D = make_block(2, 1, C)
E = make_block(2, 0, B)
F = make_block(3, 0, E)
G = make_block(2, 2, B)
H = make_block(3, 1, G)
I = make_block(4, 0, H)  # noqa: E741 - the reference's name
J = make_block(4, 1, F)
K = make_block(5, 0, I)
NAMES = dict(zip("ABCDEFGHIJK", [A, B, C, D, E, F, G, H, I, J, K], strict=True))

CHAIN1 = [A]
CHAIN2 = [A]
for n in range(1, 100):
    CHAIN1.append(make_block(n, 1, CHAIN1[-1]))
    CHAIN2.append(make_block(n, 2, CHAIN2[-1]))


def run_blocks(blocks, last: BlockPayload) -> list[ChainUpdate]:
    p = Producer("default", REF_SCHEMA)
    c = OrderedConsumer(
        checkpoint=Checkpoint.starting_at(last.number, last.hash, last.weight, last.parent)
    )
    out = []
    for i, blk in enumerate(blocks):
        for j, (topic, k, v) in enumerate(flat(p, blk)):
            out += c.receive(k, v, topic, i * 100 + j)
    return out


def names(bs) -> str:
    inv = {b.hash: n for n, b in NAMES.items()}
    return "".join(inv.get(b.hash, "?") for b in bs)


CASES = {
    "ABCD": ["+B", "+CD-B"],
    "ABDC": ["+B", "+CD-B"],
    "ACDB": ["+C", "+D"],
    "ABCDEF": ["+B", "+CD-B", "+BEF-CD"],
    "AEGFBHI": ["+BEF", "+GHI-EF"],
    "AEGFHIB": ["+BGHI"],
    "AEFHIGB": ["+BGHI"],
    "ABEFJHIKG": ["+B", "+E", "+F", "+J", "+GHIK-EFJ"],
    "ABEFJGIKH": ["+B", "+E", "+F", "+J", "+GHIK-EFJ"],
    "ABEFJGHIK": ["+B", "+E", "+F", "+J", "+GHIK-EFJ"],
    "ABEFJIKHG": ["+B", "+E", "+F", "+J", "+GHIK-EFJ"],
    "ABEFJGHKI": ["+B", "+E", "+F", "+J", "+GHIK-EFJ"],
    "ADC": ["+CD"],
}


@pytest.mark.parametrize("order", list(CASES))
def test_reference_reorg_cases(order):
    updates = run_blocks([NAMES[n] for n in order], A)
    got = ["+" + names(u.added) + ("-" + names(u.removed) if u.removed else "") for u in updates]
    assert got == CASES[order]


def test_start_at_c_then_acdbef():
    # "Reorg start(c) ACDBEF": a block from before the start (A) is learnt as an ancestor
    updates = run_blocks([A, C, D, B, E, F], C)
    assert [(names(u.added), names(u.removed)) for u in updates] == [("D", ""), ("BEF", "CD")]


def test_chain1_50_to_chain2_53():
    msgs = [*CHAIN1[:50], *CHAIN2[:25], *CHAIN2[30:53], *CHAIN2[25:29], CHAIN2[53], CHAIN2[29]]
    updates = run_blocks(msgs, A)
    assert [[b.hash for b in u.added] for u in updates[:49]] == [[b.hash] for b in CHAIN1[1:50]]
    last = updates[-1]
    assert [b.hash for b in last.added] == [b.hash for b in CHAIN2[1:54]]
    assert [b.hash for b in last.removed] == [b.hash for b in CHAIN1[1:50]]
    assert len(updates) == 50


def test_startup_reorg():
    updates = run_blocks([*CHAIN1[:7], *CHAIN2[:8]], CHAIN1[6])
    assert len(updates) == 1
    assert [b.hash for b in updates[0].added] == [b.hash for b in CHAIN2[1:8]]
    assert [b.hash for b in updates[0].removed] == [b.hash for b in CHAIN1[1:7]]


def test_startup_reorg_out_of_order_ends_on_the_same_chain():
    # Reference "Startup Reorg OO" waits for CHAIN1[6]'s data before reorganising and so emits
    # one update; we know its weight from the checkpoint and reorganise as soon as CHAIN2[7]
    # outweighs it, then extend by CHAIN2[8]. Same final chain, same removed set.
    updates = run_blocks([*CHAIN1[:6], *CHAIN2[:8], CHAIN1[6], CHAIN2[8]], CHAIN1[6])
    model = ChainModel([b.hash for b in CHAIN1[:7]])
    for u in updates:
        model.apply(u)
    assert model.chain == [b.hash for b in CHAIN2[:9]]
    assert {b.hash for u in updates for b in u.removed} == {b.hash for b in CHAIN1[1:7]}


def test_reorg_message_reverts_to_a_known_ancestor():
    updates = run_blocks([B, E, F], A)
    assert len(updates) == 3
    c = OrderedConsumer(checkpoint=Checkpoint.starting_at(A.number, A.hash, A.weight))
    p = Producer("default", REF_SCHEMA)
    for blk in (B, E, F):
        for _t, k, v in flat(p, blk):
            c.receive(k, v)
    from loglake.cardinal.codec import encode

    out = c.receive(*encode(p.reorg(B.number, B.hash)))
    assert [(names(u.added), names(u.removed)) for u in out[:-1]] == [("", "EF")]
    assert out[-1] == ReorgEvent(B.number, B.hash, complete=False)
    assert c.head.hash == B.hash
    # the reorg channel's blocks extend the ancestor, even when already seen before
    added = []
    for blk in (G, H):
        for _t, k, v in flat(p, blk):
            added += [u for u in c.receive(k, v) if isinstance(u, ChainUpdate)]
    assert names(b for u in added for b in u.added) == "GH"
    assert c.receive(*encode(p.reorg_done(B.number, B.hash))) == [
        ReorgEvent(B.number, B.hash, complete=True)
    ]


def test_reorg_to_unknown_ancestor_is_a_typed_error_and_changes_nothing():
    c = OrderedConsumer(checkpoint=Checkpoint.starting_at(A.number, A.hash, A.weight))
    p = Producer("default", REF_SCHEMA)
    for blk in (B, E, F):
        for _t, k, v in flat(p, blk):
            c.receive(k, v)
    from loglake.cardinal.codec import encode

    before = (c.ordering.chain, c.consumer.stats.blocks)
    with pytest.raises(UnknownAncestor):
        c.receive(*encode(p.reorg(2, G.hash)))  # G is not on our chain
    with pytest.raises(UnknownAncestor):
        c.receive(*encode(p.reorg(3, E.hash)))  # wrong number for E
    assert (c.ordering.chain, c.consumer.stats.blocks) == before
    # duplicates of already emitted blocks are still ignored (completed set not cleared)
    for _t, k, v in flat(p, F):
        assert c.receive(k, v) == []


def test_window_is_bounded():
    op = OrderedProcessor(reorg_threshold=5)
    from loglake.cardinal.blocks import Block

    parent = ZERO_HASH
    for n in range(50):
        h = (n + 1).to_bytes(32, "big")
        op.add(Block(n, h, parent, n))
        parent = h
    assert len(op.chain) == 6
    assert op.add(Block(10, b"x" * 32, (10).to_bytes(32, "big"), 1000)) == []  # too old
    assert op.held == 0


def test_hostile_parent_cycles_do_not_hang():
    from loglake.cardinal.blocks import Block

    op = OrderedProcessor(chain=[Checkpoint.starting_at(0, b"g" * 32, 0).head])
    assert op.add(Block(1, b"s" * 32, b"s" * 32, 5)) == []  # its own parent
    assert op.add(Block(1, b"a" * 32, b"b" * 32, 5)) == []
    assert op.add(Block(2, b"b" * 32, b"a" * 32, 6)) == []  # a <-> b
    (u,) = op.add(Block(1, b"c" * 32, b"g" * 32, 1))
    assert [b.hash for b in u.added] == [b"c" * 32]


def test_orphans_cannot_grow_memory_without_bound():
    from loglake.cardinal.blocks import Block

    op = OrderedProcessor(chain=[Checkpoint.starting_at(0, b"g" * 32, 0).head], max_held=4)
    for n in range(10):
        op.add(Block(5 + n, bytes([n + 1]) * 32, bytes([200 + n]) * 32, n))  # unknown parents
    assert op.held == 4
    (u,) = op.add(Block(1, b"c" * 32, b"g" * 32, 1))
    assert [b.hash for b in u.added] == [b"c" * 32]
