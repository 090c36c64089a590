"""``SegmentLog`` against ``MemoryLog`` as a model: random appends, reads, consumer index saves,
reopens and retention (lake on, so every record stays readable), compared call by call with
hypothesis' stateful testing. Small segments make rolls, seals and lake reads frequent."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from loglake.log import Entry, IndexRegression, MemoryLog, StreamConfig, open_log

CFG = StreamConfig(partitions=2, segment_bytes=300, retention_records=3)

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
        self.real = open_log(self.dir)
        self.real.create_stream("s", CFG)

    @rule(p=st.integers(0, 1), entries=entries_st)
    def append(self, p, entries):
        assert self.real.append_many("s", p, entries) == self.model.append_many("s", p, entries)

    @rule(
        p=st.integers(0, 1),
        start=st.integers(-2, 80),
        limit=st.one_of(st.none(), st.integers(0, 20)),
        span=st.one_of(st.none(), st.integers(0, 30)),
    )
    def read(self, p, start, limit, span):
        end = None if span is None else start + span
        assert self.real.read("s", p, start, limit, end) == self.model.read(
            "s", p, start, limit, end
        )

    @rule(client=st.sampled_from(["x", "y"]), p=st.integers(0, 1), index=st.integers(0, 50))
    def save_index(self, client, p, index):
        try:
            want = self.model.save_consumer_index(client, "s", p, index)
        except IndexRegression:
            try:
                self.real.save_consumer_index(client, "s", p, index)
            except IndexRegression:
                return
            raise AssertionError("SegmentLog accepted a lower consumer index") from None
        assert self.real.save_consumer_index(client, "s", p, index) == want

    @rule()
    def retention(self):
        self.real.enforce_retention()  # the lake keeps everything: nothing becomes unreadable

    @rule()
    def reopen(self):
        self.real.close()
        self.real = open_log(self.dir)

    @invariant()
    def same_state(self):
        for p in (0, 1):
            got = self.real.stream_info("s").partitions[p]
            want = self.model.stream_info("s").partitions[p]
            assert (got.first_index, got.next_index) == (want.first_index, want.next_index)
            for c in ("x", "y"):
                assert self.real.get_consumer_index(c, "s", p) == self.model.get_consumer_index(
                    c, "s", p
                )

    def teardown(self) -> None:
        self.real.close()
        shutil.rmtree(self.dir, ignore_errors=True)


LogModel.TestCase.settings = settings(max_examples=20, stateful_step_count=40, deadline=None)
TestSegmentLogAgainstMemoryLog = LogModel.TestCase
