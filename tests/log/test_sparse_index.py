"""``SparseIndex.parse`` (numpy over the whole file) against the entry-by-entry rules it
replaced: the same entries, or the same refusal, for any bytes."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.log.sparse_index import ENTRY, SparseIndex


def parse_by_entry(raw: bytes, base: int, segment_size: int) -> tuple[list[int], list[int]] | None:
    """The rules one entry at a time, as the index was first read."""
    indexes: list[int] = []
    positions: list[int] = []
    whole = len(raw) - len(raw) % ENTRY.size
    prev_i, prev_p = base - 1, -1
    for i, p in ENTRY.iter_unpack(raw[:whole]):
        if p >= segment_size:
            break
        if i <= prev_i or p <= prev_p or (p == 0) != (i == base):
            return None
        indexes.append(i)
        positions.append(p)
        prev_i, prev_p = i, p
    return indexes, positions


def as_pair(idx: SparseIndex | None) -> tuple[list[int], list[int]] | None:
    return None if idx is None else (idx.indexes, idx.positions)


def entries(pairs: list[tuple[int, int]], tail: bytes = b"") -> bytes:
    return b"".join(ENTRY.pack(i, p) for i, p in pairs) + tail


@st.composite
def index_files(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """Mostly well-formed files (increasing entries from the segment's base), with a chance of
    each way to break one: a repeat, a step back, a zero position off the base, a torn tail,
    entries past the segment, huge values."""
    base = draw(st.sampled_from([0, 1, 1000, 2**63 - 5, 2**64 - 3]))
    n = draw(st.integers(0, 40))
    i, p = base, 0
    pairs = []
    for _ in range(n):
        pairs.append((i, p))
        i += draw(st.integers(1, 50))
        p += draw(st.integers(1, 9000))
    pairs = [(i % 2**64, p) for i, p in pairs]
    if pairs and draw(st.booleans()):
        k = draw(st.integers(0, len(pairs) - 1))
        pairs[k] = (
            draw(st.sampled_from([0, base, pairs[k][0] - 1, 2**64 - 1])) % 2**64,
            draw(st.sampled_from([0, pairs[k][1], pairs[k][1] + 1, 2**64 - 1])),
        )
    tail = draw(st.binary(max_size=15))
    size = draw(st.one_of(st.just(p + 1), st.integers(0, max(1, p + 100))))
    return entries(pairs, tail), base, size


@settings(max_examples=400, deadline=None)
@given(index_files())
def test_parse_keeps_or_refuses_as_the_entry_by_entry_rules(case):
    raw, base, size = case
    assert as_pair(SparseIndex.parse(raw, base, size)) == parse_by_entry(raw, base, size)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_parse_of_any_bytes_is_the_entry_by_entry_answer(raw, base, size):
    assert as_pair(SparseIndex.parse(raw, base, size)) == parse_by_entry(raw, base, size)


def test_known_files():
    good = entries([(10, 0), (12, 4096), (20, 9000)])
    idx = SparseIndex.parse(good, 10, 10_000)
    assert idx is not None and (idx.indexes, idx.positions, idx.last_pos) == (
        [10, 12, 20],
        [0, 4096, 9000],
        9000,
    )
    # truncated segment: entries at or past its size are dropped, the rest kept
    assert as_pair(SparseIndex.parse(good, 10, 9000)) == ([10, 12], [0, 4096])
    # entries after the first one past the end are not checked
    assert as_pair(SparseIndex.parse(good + entries([(5, 1)]), 10, 9000)) == ([10, 12], [0, 4096])
    # a torn last entry is ignored
    assert as_pair(SparseIndex.parse(good + b"\x01" * 7, 10, 10_000)) == (
        [10, 12, 20],
        [0, 4096, 9000],
    )
    assert SparseIndex.parse(entries([(10, 0), (10, 4096)]), 10, 10_000) is None  # index repeats
    assert SparseIndex.parse(entries([(10, 0), (11, 0)]), 10, 10_000) is None  # position repeats
    assert SparseIndex.parse(entries([(10, 5)]), 10, 10_000) is None  # the base not at 0
    assert SparseIndex.parse(entries([(11, 0)]), 10, 10_000) is None  # 0 not the base
    assert SparseIndex.parse(entries([(9, 0)]), 10, 10_000) is None  # before the base
    empty = SparseIndex.parse(b"", 10, 10_000)
    assert empty is not None and len(empty) == 0 and empty.last_pos == SparseIndex().last_pos
    assert struct.calcsize("<QQ") == ENTRY.size
