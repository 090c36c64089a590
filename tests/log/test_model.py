"""``SegmentLog`` against ``MemoryLog`` as a model: random appends, reads, consumer index saves,
reopens, retention and ``truncate_before``, compared call by call with hypothesis' stateful
testing. Stream "s" has the lake on, so every record stays readable; stream "n" has no lake, so
the model follows each truncation exactly. Small segments make rolls, seals and lake reads
frequent."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from loglake.log import Entry, MemoryLog, StreamConfig, open_log

CFG = StreamConfig(partitions=2, segment_bytes=300, retention_records=3)
NO_LAKE = StreamConfig(partitions=2, segment_bytes=300, seal_to_lake=False)
"""Stream "n": what ``truncate_before`` drops is gone, so the model follows it exactly."""
STREAMS = st.sampled_from(["s", "n"])

entries_st = st.lists(
    st.builds(
        Entry,
        data=st.binary(min_size=20, max_size=120),
        key=st.one_of(st.none(), st.binary(max_size=8)),
        headers=st.lists(
            st.tuples(st.sampled_from(["a", "b"]), st.binary(max_size=4)), max_size=2
        ).map(tuple),
        timestamp_ns=st.integers(0, 2**62),
    ),
    min_size=1,
    max_size=12,
)


class LogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="loglake-model-"))
        self.model = MemoryLog()
        self.model.create_stream("s", CFG)
        self.model.create_stream("n", NO_LAKE)
        self.real = open_log(self.dir)
        self.real.create_stream("s", CFG)
        self.real.create_stream("n", NO_LAKE)

    @rule(s=STREAMS, p=st.integers(0, 1), entries=entries_st)
    def append(self, s, p, entries):
        assert self.real.append_many(s, p, entries) == self.model.append_many(s, p, entries)

    @rule(
        p=st.integers(0, 1),
        start=st.integers(-2, 80),
        limit=st.one_of(st.none(), st.integers(0, 20)),
        span=st.one_of(st.none(), st.integers(0, 30)),
    )
    def read(self, p, start, limit, span):
        end = None if span is None else start + span
        for s in ("s", "n"):
            assert self.real.read(s, p, start, limit, end) == self.model.read(
                s, p, start, limit, end
            )

    @rule(s=STREAMS, p=st.integers(0, 1), start=st.integers(-2, 80), limit=st.integers(0, 20))
    def read_payloads(self, s, p, start, limit):
        assert self.real.read_payloads(s, p, start, limit) == self.model.read_payloads(
            s, p, start, limit
        )

    @rule(p=st.integers(0, 1), index=st.integers(0, 90))
    def truncate(self, p, index):
        # with the lake on, segments below ``index`` go but every record stays readable there,
        # so the model does not change: the invariant and later reads check nothing was lost
        assert self.real.truncate_before("s", p, index) >= 0

    @rule(p=st.integers(0, 1), index=st.integers(0, 90))
    def truncate_without_lake(self, p, index):
        # whole segments: the real log may keep more than asked, never less than ``index``
        before = self.real.stream_info("n").partitions[p].first_index
        dropped = self.real.truncate_before("n", p, index)
        after = self.real.stream_info("n").partitions[p].first_index
        assert before <= after <= max(before, index)
        assert dropped == after - before
        assert self.model.truncate_before("n", p, after) == dropped

    @rule(client=st.sampled_from(["x", "y"]), p=st.integers(0, 1), index=st.integers(0, 50))
    def save_index(self, client, p, index):
        before = self.model.get_index(client, "s", p)
        want = self.model.save_index(client, "s", index, partition=p)
        assert want == (index if before is None else max(before, index))  # never moves back
        assert self.real.save_index(client, "s", index, partition=p) == want

    @rule()
    def retention(self):
        self.real.enforce_retention()  # the lake keeps everything: nothing becomes unreadable

    @rule()
    def reopen(self):
        self.real.close()
        self.real = open_log(self.dir)

    @invariant()
    def same_state(self):
        for s in ("s", "n"):
            for p in (0, 1):
                got = self.real.stream_info(s).partitions[p]
                want = self.model.stream_info(s).partitions[p]
                assert (got.first_index, got.next_index) == (want.first_index, want.next_index)
        for p in (0, 1):
            for c in ("x", "y"):
                assert self.real.get_index(c, "s", p) == self.model.get_index(c, "s", p)

    def teardown(self) -> None:
        self.real.close()
        shutil.rmtree(self.dir, ignore_errors=True)


LogModel.TestCase.settings = settings(max_examples=20, stateful_step_count=40, deadline=None)
TestSegmentLogAgainstMemoryLog = LogModel.TestCase
