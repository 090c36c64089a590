"""``assemble_blocks``' direct path for the common block (a Batch of inline entries and prefix
counts, then its BatchMsgs) gives what ``assemble_block`` gives, message by message through
``BlockAssembler``: the same block, offsets, kept messages and rejects; and it steps aside
(None) for every other shape, which the reference then assembles."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal.codec import encode
from loglake.cardinal.consumer import _assemble_simple, assemble_block, assemble_blocks
from loglake.cardinal.messages import Batch, BatchDeleteMsg, BatchMsg, BatchRecord

H = bytes(range(32))
P = bytes(32)
FIELDS = ("number", "hash", "parent", "weight", "values", "deletes", "offsets")


def _same(a, b) -> None:
    assert a.kept == b.kept and a.rejected == b.rejected
    assert (a.block is None) == (b.block is None)
    if a.block is not None:
        assert [getattr(a.block, f) for f in FIELDS] == [getattr(b.block, f) for f in FIELDS]


def _group(updates, msgs, sources):
    out = [encode(Batch(H, 7, 9, P, updates))] + [encode(m) for m in msgs]
    return [(k, v, *sources[i % len(sources)]) for i, (k, v) in enumerate(out)]


def test_common_block_is_built_directly_and_equal():
    updates = {"a/": BatchRecord(count=2), "x": BatchRecord(b"1"), "d": BatchRecord(delete=True)}
    msgs = [BatchMsg(H, "a/1", b"v1"), BatchMsg(H, "a/2", b"v2")]
    g = _group(updates, msgs, [("t:1", 5), ("t:0", 9), ("t:0", 3)])
    g += [(g[2][0], g[2][1], "t:0", 1)]  # a copy from another place: the lowest one counts
    fast = _assemble_simple(g)
    assert fast is not None and fast.block is not None
    assert fast.block.values == {"x": b"1", "a/1": b"v1", "a/2": b"v2"}
    assert fast.block.deletes == {"d"} and fast.block.offsets == {"t:1": 5, "t:0": 1}
    _same(fast, assemble_block(g))


def test_other_shapes_step_aside():
    a2 = {"a/": BatchRecord(count=2)}
    m1, m2 = BatchMsg(H, "a/1", b"v1"), BatchMsg(H, "a/2", b"v2")
    src = [("t:0", 1)]
    shapes = {
        "incomplete": _group(a2, [m1], src),
        "extra": _group(a2, [m1, m2, BatchMsg(H, "a/3", b"v3")], src),
        "no prefix": _group(a2, [m1, BatchMsg(H, "b/1", b"v")], src),
        "delete msg": _group(a2, [m1, BatchDeleteMsg(H, "a/2")], src),
        "sub-batch": _group({"a/": BatchRecord(subbatch=b"\x01" * 32)}, [], src),
        "negative count": _group({"a/": BatchRecord(count=-1)}, [], src),
        "inline twice": _group({"a/": BatchRecord(count=1), "a/1": BatchRecord(b"x")}, [m1], src),
        "no batch": _group(a2, [m1, m2], src)[1:],
        "corrupt batch": [(k, v[:-1], s, o) for k, v, s, o in _group(a2, [], src)],
    }
    k, v, _s, _o = _group(a2, [m1, m2], src)[1]
    shapes["two values"] = [*_group(a2, [m1, m2], src), (k, v + b"!", "t:9", 0)]
    for name, g in shapes.items():
        assert _assemble_simple(g) is None, name
        _same(assemble_blocks([g])[0], assemble_block(g))


@st.composite
def _blocks(draw):
    """A Batch of prefix counts and inline entries with the BatchMsgs it announces (keys under
    each prefix, maybe also under a longer one), mostly complete; then maybe one change that
    makes it another shape (a message more or less, a key elsewhere, an inline key again)."""
    prefixes = draw(st.lists(st.sampled_from(["", "a/", "a/b/", "b/", "ab"]), unique=True))
    updates = {p: BatchRecord(count=draw(st.integers(0, 3))) for p in prefixes}
    for k in draw(st.lists(st.sampled_from(["x", "a/i", "d"]), unique=True, max_size=2)):
        updates[k] = BatchRecord(draw(st.binary(max_size=2)), 0, draw(st.booleans()))
    msgs = []
    for p, rec in updates.items():
        for i in range(rec.count):
            msgs.append(BatchMsg(H, f"{p}{draw(st.sampled_from(['', 'b/', 'q']))}{i}", b"v"))
    change = draw(st.sampled_from(["none"] * 4 + ["drop", "add", "inline"]))
    if change == "drop" and msgs:
        msgs.pop(draw(st.integers(0, len(msgs) - 1)))
    elif change == "add":
        msgs.append(BatchMsg(H, draw(st.sampled_from(["a/9", "b/9", "zz", "x"])), b"w"))
    elif change == "inline" and msgs:
        updates[msgs[0].key] = BatchRecord(b"i")
    return updates, msgs


@settings(max_examples=120, deadline=None)
@given(
    _blocks(),
    st.lists(st.tuples(st.sampled_from(["t:0", "t:1", "u:0"]), st.integers(0, 9)), min_size=1),
    st.randoms(use_true_random=False),
)
def test_direct_path_equals_the_reference(block, sources, rng):
    updates, msgs = block
    g = _group(updates, msgs, sources)
    g += [(k, v, "t:1", o + 1) for k, v, _s, o in rng.sample(g, len(g) // 2)]  # copies
    rng.shuffle(g)
    _same(assemble_blocks([g])[0], assemble_block(g))
    fast = _assemble_simple(g)
    if fast is not None:
        _same(fast, assemble_block(g))
