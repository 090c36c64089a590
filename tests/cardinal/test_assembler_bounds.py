"""BlockAssembler limits: only typed errors leave it, and its memory is bounded at every
message, not only when the chain head advances (module docstring of ``cardinal.consumer``,
"Bounded memory")."""

from __future__ import annotations

import contextlib
import hashlib
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cardinal.codec import encode
from loglake.cardinal.consumer import BlockAssembler
from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import ZERO_HASH, BatchMsg
from loglake.cardinal.producer import BlockPayload, Producer, SubBatch
from tests.cardinal.helpers import flat, h


def test_max_pending_one_then_a_second_blocks_batch_after_its_message():
    # A Batch (pending), a message for a second block (queued), then that block's Batch: the
    # second batch is over max_pending=1 and is the highest, so it is the one shed, with its
    # queued message; nothing escapes and the first block still completes.
    p = Producer("d", {"foo/": "d"})
    first = p.add_block(1, h(1), h(0), 1, {"foo/a": b"1"})["d"]
    second = p.add_block(2, h(2), h(1), 2, {"foo/a": b"2"})["d"]
    batch1 = next(m for m in first if type(m).__name__ == "Batch")
    msg1 = next(m for m in first if type(m).__name__ == "BatchMsg")
    batch2 = next(m for m in second if type(m).__name__ == "Batch")
    msg2 = next(m for m in second if type(m).__name__ == "BatchMsg")
    c = BlockAssembler(max_pending=1)
    assert c.receive(*encode(batch1), "d:0", 0) == []
    assert c.receive(*encode(msg2), "d:0", 1) == []
    assert c.receive(*encode(batch2), "d:0", 2) == []
    assert (c.pending, c.queued) == (1, 0)
    assert [b.number for b in c.receive(*encode(msg1), "d:0", 3)] == [1]


def _blocks(n: int) -> list[BlockPayload]:
    out, parent = [], ZERO_HASH
    for i in range(n):
        hash_ = hashlib.sha256(b"b%d" % i).digest()
        sb = SubBatch(hashlib.sha256(b"s%d" % i).digest(), (), {f"state/{i}": b"x"})
        out.append(
            BlockPayload(
                i,
                hash_,
                parent,
                i,
                {f"foo/{i}": b"v", "x": b"i"},
                frozenset(),
                {"state/": sb} if i % 2 else {},
            )
        )
        parent = hash_
    return out


_PRODUCER = Producer("d", {"foo/": "d", "state/": "d"})
_MESSAGES = [(k, v) for b in _blocks(6) for _t, k, v in flat(_PRODUCER, b)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(_MESSAGES),
            st.tuples(st.binary(max_size=70), st.binary(max_size=20)),
        ),
        max_size=60,
    ),
    st.integers(0, 3),
    st.integers(0, 4),
    st.integers(0, 3),
)
def test_only_typed_errors_leave_the_assembler_and_limits_hold(
    messages, max_pending, max_queued, threshold
):
    c = BlockAssembler(threshold, max_pending=max_pending, max_queued=max_queued)
    for i, (key, value) in enumerate(messages):
        with contextlib.suppress(CardinalDecodeError):
            c.receive(key, value, "d:0", i)
        assert c.pending <= max_pending
        assert c.queued <= max_queued
        assert len(c.done()) <= c.max_done


def test_messages_for_batches_that_never_arrive_stay_within_max_queued():
    # 60,000 messages for 60,000 blocks whose Batch never comes, no block ever completing (the
    # head never advances): the queue stays at max_queued entries and memory stops growing.
    c = BlockAssembler(max_queued=1_000)
    msgs = [BatchMsg(hashlib.sha256(b"%d" % i).digest(), "foo/a", b"v" * 32) for i in range(60_000)]
    tracemalloc.start()
    try:
        for i, m in enumerate(msgs[:10_000]):
            c.handle(m, "d:0", i)
        at_10k, _ = tracemalloc.get_traced_memory()
        for i, m in enumerate(msgs[10_000:], 10_000):
            c.handle(m, "d:0", i)
            assert c.queued <= 1_000
        at_60k, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert c.queued == 1_000
    # 50,000 more queued messages (~20 MiB if kept) add next to nothing
    assert at_60k - at_10k < 512 * 1024, (at_10k, at_60k)
    assert peak - at_10k < 1024 * 1024, (at_10k, peak)
