"""A synthetic chain for demos, tests and the benchmark: forks, reorgs and sub-batches.

Blocks carry updates under three application prefixes (``foo/``, ``bar/<x>/baz/`` — the
reference tests' prefixes — and a ``state/`` sub-batch) plus one key no prefix matches. Every
``lose_every`` blocks a lighter sibling of the head appears (it never becomes canonical);
every ``win_every`` blocks a two-block fork from two below the head outweighs it (a reorg within
the threshold). With ``deep_reorg``, the last step replaces the newest ``depth`` blocks through a
reorg channel (Reorg … ReorgComplete). ``SyntheticChain.canonical`` is the chain a consumer must
end with. Deterministic for a seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.producer import BlockPayload, SubBatch


def schema_for(topic: str) -> dict[str, str]:
    """Prefix → topic map of the synthetic application: sub-batches on ``<topic>.state``."""
    return {"foo/": topic, "bar/[^/]+/baz/": topic, "state/": f"{topic}.state"}


def topics_for(topic: str) -> list[str]:
    return [topic, f"{topic}.state"]


def _h(*parts: object) -> bytes:
    return hashlib.sha256(":".join(map(str, parts)).encode()).digest()


@dataclass(frozen=True, slots=True)
class ReorgStep:
    ancestor: BlockPayload
    blocks: tuple[BlockPayload, ...]


@dataclass(slots=True)
class SyntheticChain:
    steps: list[BlockPayload | ReorgStep] = field(default_factory=list)
    canonical: list[BlockPayload] = field(default_factory=list)
    genesis: BlockPayload | None = None

    @property
    def blocks(self) -> int:
        return sum(1 if isinstance(s, BlockPayload) else len(s.blocks) for s in self.steps)


def make_block(
    number: int,
    parent: BlockPayload | None,
    weight: int,
    tag: object = "",
    updates: int = 2,
    sub_items: int = 2,
) -> BlockPayload:
    h = _h("block", number, tag, parent.hash.hex() if parent else "")
    ups = {f"foo/{number}/item{i}": f"{tag}:{i}".encode() for i in range(max(0, updates - 1))}
    if updates:
        ups[f"bar/x{number}/baz/v"] = f"{tag}".encode()
    ups[f"plain/{number}"] = b"inline"
    batches = {}
    if sub_items >= 0:
        batches["state/"] = SubBatch(
            _h("sub", h.hex()),
            (f"state/{number}/gone",),
            {f"state/{number}/k{i}": str(i).encode() for i in range(sub_items)},
        )
    return BlockPayload(
        number=number,
        hash=h,
        parent=parent.hash if parent else ZERO_HASH,
        weight=weight,
        updates=ups,
        deletes=frozenset({f"foo/{number}/gone"}),
        batches=batches,
    )


def synthetic_chain(
    blocks: int,
    lose_every: int = 7,
    win_every: int = 11,
    deep_reorg: int = 0,
    updates: int = 2,
    sub_items: int = 2,
) -> SyntheticChain:
    """About ``blocks`` block payloads in production order (see module docstring)."""
    out = SyntheticChain()
    genesis = make_block(0, None, 0, "g", updates, sub_items)
    out.genesis = genesis
    chain = [genesis]
    out.steps.append(genesis)
    n = 1
    # counted here, not with ``out.blocks``: that walks every step, so the loop was quadratic
    # (10,000 blocks took 2 s, 100,000 took 209 s)
    made = 1
    while made < blocks:
        head = chain[-1]
        if win_every and n % win_every == 0 and len(chain) >= 3:
            base = chain[-3]
            a = make_block(base.number + 1, base, base.weight + 15, f"w{n}", updates, sub_items)
            b = make_block(base.number + 2, a, head.weight + 5, f"w{n}", updates, sub_items)
            out.steps += [a, b]
            chain[-2:] = [a, b]
            made += 2
        elif lose_every and n % lose_every == 0 and len(chain) >= 2:
            sib = make_block(head.number, chain[-2], head.weight - 1, f"l{n}", updates, sub_items)
            out.steps.append(sib)
            made += 1
        else:
            blk = make_block(head.number + 1, head, head.weight + 10, "", updates, sub_items)
            out.steps.append(blk)
            chain.append(blk)
            made += 1
        n += 1
    if deep_reorg and len(chain) > deep_reorg + 1:
        ancestor = chain[-deep_reorg - 1]
        removed_weight = chain[-1].weight
        new: list[BlockPayload] = []
        parent = ancestor
        for i in range(deep_reorg + 1):
            w = parent.weight + 10 if i < deep_reorg else removed_weight + 1
            blk = make_block(parent.number + 1, parent, w, "deep", updates, sub_items)
            new.append(blk)
            parent = blk
        out.steps.append(ReorgStep(ancestor, tuple(new)))
        chain[-deep_reorg:] = new
    out.canonical = chain
    return out
