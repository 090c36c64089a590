"""The acknowledgement sweep runs on arrays (``_sweep_arrays``); it must give what the
message-by-message sweep (``_sweep_loop``) gives, acks and figures, on any channel: ids
repeated in a history, ids of no content message, a participant's own messages, references
before a message's first copy, bloom filters on some messages (holding ids acknowledged by a
history before, at or after the filter, ids of no content message, and false positives as
the filter's bits give them). The dependency figures the sweep task also makes
(``dependency_figures``) equal the exploded join the job did before. The sweep runs as many
tasks as run at once (``_concurrent_tasks``). A task's kept ids, looked up where they lie
(``_kept_causal``), are what a take of the rows and one ``index_in`` give, and a sender's
latency ranks from one partition (``_nearest_ranks``) those of the sorted latencies. No
Spark."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.pipeline.jobs.sds_audit import (
    LATE_SCHEMA,
    _causal_positions,
    _codes,
    _concurrent_tasks,
    _ContentArrays,
    _decoded,
    _kept_causal,
    _nearest_rank_of,
    _nearest_ranks,
    _sweep_arrays,
    _sweep_loop,
    dependency_figures,
)
from loglake.sds import DECODED_SCHEMA, IdIndex, dictionary_reference
from loglake.sds.bloom import BloomFilter

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
def channels(draw, blooms: bool = False):
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
            bloom = None
            shape = draw(st.sampled_from(["none", "held", "dense"])) if blooms else "none"
            if shape == "held":  # the ids a participant held, as its filter has them
                f = BloomFilter()
                for mid in draw(st.lists(st.sampled_from([*ids, "x", "y"]), max_size=n)):
                    f.insert(mid)
                bloom = f.to_bytes()
            elif shape == "dense":  # 7 bits in 8 set: about one id in four a false positive
                rng = random.Random(draw(st.integers(0, 2**32 - 1)))
                width = BloomFilter().n_bytes
                bloom = bytes(
                    rng.getrandbits(8) | rng.getrandbits(8) | rng.getrandbits(8)
                    for _ in range(width)
                )
            own.append((i, ts[i], kinds[i], refs, bloom))
    return (
        [ids[i] for i in content],
        content,
        [ts[i] for i in content],
        [senders[i] for i in content],
        own,
    )


@pytest.mark.slow  # hypothesis: 4-10 s
@settings(max_examples=100, deadline=None)
@given(ch=st.one_of(channels(), channels(blooms=True)))
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
            "bloom_filter": [r[4] for r in own_rows],
        },
        schema=OWN,
    )
    acks_l, part_l = _sweep_loop("a", own, ids, first, ts, senders)
    acks_a, part_a = _sweep_arrays("a", own, _ContentArrays.of(ids, first, ts, senders))

    def rows(t: pa.Table) -> list[tuple]:  # one q's acks come in history order in the loop
        return sorted(tuple(r.values()) for r in t.to_pylist())

    assert rows(acks_a) == rows(acks_l)
    assert part_a.to_pylist() == part_l.to_pylist()


def _figures_the_long_way(own_rows, ids, first):
    """What the job computed before with an exploded (message, id) join: per message, the
    ``causal_new`` entries of a content message first seen after it; ids of no content message."""
    pos = dict(zip(ids, first, strict=True))
    late = {}
    never = set()
    for i, _, _, refs, _ in own_rows:
        n = sum(1 for d in refs if d in pos and pos[d] > i)
        if n:
            late[f"own{i}"] = n
        never |= {d for d in refs if d not in pos}
    return late, sorted(never)


@pytest.mark.slow  # hypothesis: a few s
@settings(max_examples=100, deadline=None)
@given(ch=channels())
def test_dependency_figures_equal_the_exploded_join(ch):
    ids, first, ts, senders, own_rows = ch
    own = pa.table(
        {
            "message_id": [f"own{r[0]}" for r in own_rows],
            "index": pa.array([r[0] for r in own_rows], pa.int64()),
            "timestamp_ns": pa.array([r[1] for r in own_rows], pa.int64()),
            "kind": pa.array([r[2] for r in own_rows], pa.string()),
            "causal_new": pa.array([r[3] for r in own_rows], pa.list_(pa.string())),
        }
    )
    content = _ContentArrays.of(ids, first, ts, senders)
    want_late, want_never = _figures_the_long_way(own_rows, ids, first)
    # alone, and as the job's task calls it: with the ``index_in`` it made once for the array
    # sweep of the same table
    shared = _causal_positions(own, content)
    for positions in (None, shared):
        if positions is not None and own_rows:
            _sweep_arrays("a", own, content, positions)
        late, never = dependency_figures(own, content, positions)
        assert late.schema == LATE_SCHEMA
        assert dict(zip(*late.to_pydict().values(), strict=True)) == want_late
        assert never == want_never


@pytest.mark.parametrize(
    ("master", "parallelism", "tasks"),
    [
        ("local", 4, 1),
        ("local[3]", 4, 3),
        ("local[8]", 4, 4),
        ("local[2, 3]", 4, 2),
        ("local[*]", 64, None),  # the machine's cores
        ("spark://host:7077", 6, 6),
        ("local-cluster[2,1,1024]", 4, 4),
    ],
)
def test_the_sweep_runs_as_many_tasks_as_run_at_once(master, parallelism, tasks):
    """A sweep task reads every decoded file's sweep columns: tasks beyond the cores a local
    master has read them again for nothing; elsewhere the default parallelism."""
    import os
    from types import SimpleNamespace

    sc = SimpleNamespace(master=master, defaultParallelism=parallelism)
    want = min(parallelism, os.cpu_count() or 1) if tasks is None else tasks
    assert _concurrent_tasks(sc) == want


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(st.none(), st.lists(st.sampled_from("abcdexy"), max_size=4)), max_size=5
        ),
        max_size=4,
    ),
    st.integers(0, 2),
    st.data(),
)
def test_kept_causal_ids_are_those_of_the_rows_taken(chunks, cut, data):
    """Chunks of any length (empty ones, null rows, a chunk that is a slice of a larger
    array), any rows kept: each kept row's count of ids, their content positions and the ids
    of no content message are what a take of the rows of ``causal_new`` (before its coding,
    ``_codes``) and one ``index_in`` give."""
    import numpy as np
    import pyarrow.compute as pc

    typ = pa.list_(pa.string())
    whole = [pa.array(c, typ) for c in chunks]
    coded = [_codes(dictionary_reference(a)) for a in whole]
    # chunks that start past offset 0 (the codes of a batch as a slice of its column)
    arrays = [a.slice(min(cut, len(a))) for a in whole]
    codes = [c.slice(min(cut, len(c))) for c, _ in coded]
    col = pa.chunked_array(arrays, typ)
    n = len(col)
    at = np.array(sorted(data.draw(st.sets(st.integers(0, max(0, n - 1)), max_size=n))), np.int64)
    at = at[at < n]
    ids = pa.array(["a", "b", "c", "d", "e"])
    lens, pos, missing = _kept_causal(
        pa.chunked_array(codes, pa.list_(pa.int32())), [d for _, d in coded], at, IdIndex(ids)
    )
    taken = col.take(pa.array(at, pa.int64()))
    want_lens = [len(x or []) for x in taken.to_pylist()]
    flat = pa.chunked_array([c.flatten() for c in taken.chunks], pa.string())
    want = pc.fill_null(pc.index_in(flat, value_set=ids), -1).to_pylist()
    assert lens.tolist() == want_lens
    assert pos.tolist() == want
    assert missing.to_pylist() == [v for v, p in zip(flat.to_pylist(), want, strict=True) if p < 0]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.lists(st.sampled_from("abcdexy"), max_size=5)), max_size=8),
    st.integers(0, 3),
)
def test_causal_codes_are_the_decoded_columns_codes_and_ids(rows, cut):
    """A decoded ``causal_new`` column (dictionary-encoded, also a slice of one) as codes and
    ids: the same ids row by row, offsets and nulls as they were; ``_decoded`` gives the
    column back; a column of plain strings is refused."""

    plain = pa.array(rows, pa.list_(pa.string()))
    col = dictionary_reference(plain).slice(min(cut, len(rows)))
    codes, ids = _codes(col)
    assert codes.type == pa.list_(pa.int32())
    assert [
        None if r is None else [ids[c].as_py() for c in r] for r in codes.to_pylist()
    ] == col.to_pylist()
    back = _decoded(codes, ids)
    assert back.to_pylist() == col.to_pylist()
    assert back.type == DECODED_SCHEMA.field("causal_new").type == col.type
    with pytest.raises(TypeError):
        _codes(plain)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=300))
def test_latency_ranks_from_a_partition_are_those_of_the_sorted_latencies(xs):
    """Ties, one value, none: each rank is the sorted array's (``nearest_rank``)."""
    import numpy as np

    lat = np.array(xs, dtype=np.float64)
    want = [_nearest_rank_of(np.sort(lat), p) for p in (0.5, 0.9, 0.99)]
    assert _nearest_ranks(lat, (0.5, 0.9, 0.99)) == want


def test_the_jobs_session_keeps_its_workers_memory_and_a_users_conf_wins():
    """The CLI's and the benchmark's session (``session_conf``): the workers' mimalloc keeps
    what it frees (``SESSION_CONF``); a user's ``--spark-conf`` of the same key wins."""
    from loglake.pipeline.jobs.sds_audit import session_conf

    key = "spark.executorEnv.MIMALLOC_PURGE_DELAY"
    assert session_conf()[key] == "-1"
    assert session_conf()["spark.executorEnv.NUMPY_MADVISE_HUGEPAGE"] == "0"
    assert session_conf()["spark.executorEnv.MIMALLOC_ALLOW_THP"] == "0"
    mine = session_conf({key: "10", "spark.x": "1"})
    assert (mine[key], mine["spark.x"]) == ("10", "1")


_REFAULT = """
import resource, numpy as np
a = np.ones(40 << 20, dtype=np.uint8)  # 40 MB: above glibc's largest mmap threshold (32 MB)
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(40 << 20, dtype=np.uint8)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_jobs_workers_reuse_the_pages_numpy_freed():
    """``SESSION_CONF``'s glibc settings, as the workers get them (environment variables read
    at the process's first ``malloc``): an array freed and made again reuses its pages, where
    without them each large array is a fresh ``mmap`` faulted in page by page."""
    import os
    import subprocess
    import sys

    from loglake.pipeline.jobs.sds_audit import session_conf

    prefix = "spark.executorEnv."
    workers = {k[len(prefix) :]: v for k, v in session_conf().items() if k.startswith(prefix)}
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    base |= {k: v for k, v in workers.items() if not k.startswith("MALLOC_")}  # no huge pages

    def faults(env: dict[str, str]) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _REFAULT], env=env, capture_output=True, text=True, check=True
        )
        return int(out.stdout)

    pages = (40 << 20) // 4096
    assert faults(base) >= pages // 2  # the second array faulted in again
    assert faults({**base, **workers}) < pages // 10
