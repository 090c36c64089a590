"""The acknowledgement sweep without bloom filters runs on arrays (``_sweep_arrays``); it must
give what the message-by-message sweep (``_sweep_loop``) gives, acks and figures, on any
channel: ids repeated in a history, ids of no content message, a participant's own messages,
references before a message's first copy. No Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.pipeline.jobs.sds_audit import _ContentArrays, _sweep_arrays, _sweep_loop

OWN = pa.schema(
    [
        ("index", pa.int64()),
        ("timestamp_ns", pa.int64()),
        ("kind", pa.string()),
        ("causal_new", pa.list_(pa.string())),
        ("bloom_filter", pa.binary()),
    ]
)


@st.composite
def channels(draw):
    n = draw(st.integers(1, 40))
    senders = draw(st.lists(st.sampled_from("abc"), min_size=n, max_size=n))
    kinds = draw(st.lists(st.sampled_from(["content", "content", "sync"]), min_size=n, max_size=n))
    ts = sorted(draw(st.lists(st.integers(0, 10**12), min_size=n, max_size=n)))
    ids = [f"m{i}" for i in range(n)]
    content = [i for i in range(n) if kinds[i] == "content"]
    own = []
    for i in range(n):
        if senders[i] == "a":
            refs = draw(st.lists(st.sampled_from([*ids, "x", "y"]), max_size=8))
            own.append((i, ts[i], kinds[i], refs))
    return (
        [ids[i] for i in content],
        content,
        [ts[i] for i in content],
        [senders[i] for i in content],
        own,
    )


@pytest.mark.slow  # hypothesis: 4-10 s
@settings(max_examples=100, deadline=None)
@given(ch=channels())
def test_array_sweep_equals_the_loop(ch):
    ids, first, ts, senders, own_rows = ch
    if not own_rows:
        return
    own = pa.table(
        {
            "index": [r[0] for r in own_rows],
            "timestamp_ns": [r[1] for r in own_rows],
            "kind": [r[2] for r in own_rows],
            "causal_new": [r[3] for r in own_rows],
            "bloom_filter": [None] * len(own_rows),
        },
        schema=OWN,
    )
    acks_l, part_l = _sweep_loop("a", own, ids, first, ts, senders)
    acks_a, part_a = _sweep_arrays("a", own, _ContentArrays.of(ids, first, ts, senders))

    def rows(t: pa.Table) -> list[tuple]:  # one q's acks come in history order in the loop
        return sorted(tuple(r.values()) for r in t.to_pylist())

    assert rows(acks_a) == rows(acks_l)
    assert part_a.to_pylist() == part_l.to_pylist()
