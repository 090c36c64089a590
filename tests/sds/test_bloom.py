"""Bloom filter facts of @waku/sds 0.0.8 (src/bloom_filter/bloom.ts, dist/nim_hashn/nim_hashn.mjs).

Vectors marked "from @waku/sds" were produced by running the reference through
interop/node/diff_peer.mjs (commands ``sds_hash_n`` / ``bloom``) and recorded here.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.sds.bloom import (
    BloomFilter,
    bits_set,
    contains,
    contains_batch,
    hash_n,
    max_honest_bits,
    nim_hash,
    positions_batch,
    sizing,
)
from loglake.sds.messages import message_id_of


def test_default_sizing_is_k10_m150000_2344_words() -> None:
    # bloom.ts constructor with {capacity: 10000, errorRate: 0.001}
    assert sizing(10_000, 0.001) == (10, 150_000, 2_344)
    f = BloomFilter()
    assert len(f.to_bytes()) == 18_752


def test_hash_n_vectors_from_waku_sds() -> None:
    # from @waku/sds: hashN("dummy",0,1) (the module's own self-check), ASCII, Latin-1 +
    # BMP + astral characters (charCodeAt quirk)
    assert hash_n("dummy", 0, 1) == 0
    assert hash_n("hello", 3, 150_000) == 135_973
    assert hash_n("héllo€😀", 1, 150_000) == 92_418
    assert hash_n("ab€cdefg😀xyz", 2, 150_000) == 65_440


def test_nim_hash_is_signed_murmur3_x86_32_seed_0() -> None:
    # MurmurHash3_x86_32("", seed 0) = 0; ("hello") = 0x248bfa47 (public test vector)
    assert nim_hash("") == 0
    assert nim_hash("hello") == 0x248BFA47
    assert nim_hash("The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert -(2**31) <= nim_hash("any") < 2**31


def test_bit_layout_is_big_endian_uint64_words() -> None:
    # bit h is word h>>6, bit h&63, the word written big-endian (bloom.ts toBytes)
    f = BloomFilter()
    pos = f.positions("x")
    f.insert("x")
    data = f.to_bytes()
    for h in pos:
        word = int.from_bytes(data[(h >> 6) * 8 : (h >> 6) * 8 + 8], "big")
        assert word >> (h & 63) & 1
    assert sum(bin(b).count("1") for b in data) == len(set(pos))


@settings(deadline=None)
@given(st.lists(st.text(min_size=1, max_size=70), max_size=30), st.text(min_size=1, max_size=70))
def test_no_false_negatives_and_roundtrip(ids: list[str], other: str) -> None:
    f = BloomFilter()
    for i in ids:
        f.insert(i)
    g = BloomFilter.from_bytes(f.to_bytes())
    for i in ids:
        assert i in f and i in g
        assert contains(f.to_bytes(), f.positions(i))
    assert g.lookup(other) == f.lookup(other)


def test_from_bytes_rejects_wrong_length() -> None:
    with pytest.raises(ValueError):
        BloomFilter.from_bytes(bytes(18_751))


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.one_of(st.text(max_size=70), st.from_regex(r"[0-9a-f]{64}", fullmatch=True))),
    seed=st.integers(0, 2**32 - 1),
)
def test_batch_bloom_checks_equal_positions_and_contains(ids: list[str], seed: int) -> None:
    """``positions_batch`` equals ``BloomFilter.positions`` id by id (ASCII ids of any length,
    Latin-1, astral characters, the empty id) and ``contains_batch`` equals ``contains``."""
    f = BloomFilter()
    want = np.array([f.positions(i) for i in ids], dtype=np.int64).reshape(len(ids), f.k)
    got = positions_batch(pa.array(ids, pa.string()))
    assert np.array_equal(got, want)
    rng = random.Random(seed)
    filters = []
    for _ in range(3):
        g = BloomFilter()
        for i in ids:
            if rng.random() < 0.5:
                g.insert(i)
        filters.append(g.to_bytes())
    matrix = np.frombuffer(b"".join(filters), dtype=np.uint8).reshape(3, -1)
    rows = np.array([rng.randrange(3) for _ in ids], dtype=np.int64)
    hits = contains_batch(matrix, rows, got)
    assert hits.tolist() == [
        contains(filters[r], p) for r, p in zip(rows.tolist(), want, strict=True)
    ]


def test_a_filter_of_capacity_ids_stays_within_max_honest_bits() -> None:
    # The bound past which a received filter acknowledges nothing must never catch an honest
    # filter: @waku/sds's default sizing filled with exactly ``capacity`` distinct ids.
    f = BloomFilter()
    for i in range(f.capacity):
        f.insert(message_id_of(b"%d" % i))
    assert bits_set(f.to_bytes()) <= max_honest_bits(f.capacity, f.error_rate) == 74_537
    assert (max_honest_bits(f.capacity, f.error_rate) / f.m_bits) ** f.k < 2 * f.error_rate
