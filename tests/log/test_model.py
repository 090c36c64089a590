"""``SegmentLog`` against ``MemoryLog`` as a model, with power losses: random appends, reads,
consumer index saves, clean reopens, power losses between operations and in the middle of an
append, retention and ``truncate_before``, compared call by call with hypothesis' stateful
testing.

The log runs on the simulated disk of ``tests/log/simdisk.py``: a power loss keeps only what was
fsynced (plus a seeded, random part of the rest), so what survives is what the log made
durable, not what the page cache happened to hold. After every power loss the whole log is read
back and must equal the model: every acknowledged record (an ``append_many`` that returned),
every consumer index save and every truncation survives, and of an append cut short by the power
loss nothing but a prefix of its records may appear, each exactly as written.

Stream "s" has the lake on, so every record stays readable; stream "n" has no lake, so the
model follows each truncation exactly. Small segments make rolls, seals and lake reads frequent.
The sealer runs inline (one thread touches the disk), so a failing example replays exactly."""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import loglake.log.segment_log as segment_log
from loglake.log import Entry, MemoryLog, StreamConfig, open_log
from tests.log.simdisk import PowerLoss, SimDisk

CFG = StreamConfig(partitions=2, segment_bytes=300, retention_records=3)
NO_LAKE = StreamConfig(partitions=2, segment_bytes=300, seal_to_lake=False)
"""Stream "n": what ``truncate_before`` drops is gone, so the model follows it exactly."""
STREAMS = st.sampled_from(["s", "n"])
SEEDS = st.integers(0, 2**32 - 1)

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


class InlineSealer:
    """The log's background sealer, run in the caller's thread: the simulated disk then sees
    one sequence of calls, and a power loss never finds a sealer thread mid-job."""

    def __init__(self, processes: bool = False) -> None:
        pass

    def run(self, fn, *args):
        return fn(*args)

    def submit(self, job) -> None:
        with contextlib.suppress(Exception):  # as the real sealer: the segment stays unsealed
            job()

    def drain(self) -> None:
        pass

    def stop(self) -> None:
        pass


def _row(r) -> tuple:
    return (r.data, r.key, tuple(r.headers), r.timestamp_ns)


class LogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.base = Path(tempfile.mkdtemp(prefix="loglake-model-"))
        self.saved_sealer = segment_log.Sealer
        segment_log.Sealer = InlineSealer
        self.disk = SimDisk(self.base)
        self.disk.__enter__()
        self.model = MemoryLog()
        self.model.create_stream("s", CFG)
        self.model.create_stream("n", NO_LAKE)
        self.real = open_log(self.disk.root / "data")
        self.real.create_stream("s", CFG)
        self.real.create_stream("n", NO_LAKE)
        self.power_losses = 0

    def restart_after_power_loss(self, seed: int) -> None:
        """Power off (if not yet), build the disk the loss leaves, and open the log on it (the
        recovery of a real restart). The dead process's log is dropped, not closed."""
        if not self.disk.dead:
            self.disk.power_off()
        self.real = None
        self.disk.restart(random.Random(seed))
        self.disk.crash_after(None)
        self.real = open_log(self.disk.root / "data")
        self.power_losses += 1

    def check_everything(self) -> None:
        """Every record of every partition, and every consumer index, as the model has them."""
        for s in ("s", "n"):
            for p in (0, 1):
                got = self.real.read(s, 0, partition=p)
                want = self.model.read(s, 0, partition=p)
                assert [(r.index, *_row(r)) for r in got] == [(r.index, *_row(r)) for r in want]
        self.same_state()

    @rule(s=STREAMS, p=st.integers(0, 1), entries=entries_st)
    def append(self, s, p, entries):
        assert self.real.append_many(s, entries, partition=p) == self.model.append_many(
            s, entries, partition=p
        )

    @rule(
        p=st.integers(0, 1),
        start=st.integers(-2, 80),
        limit=st.one_of(st.none(), st.integers(0, 20)),
        span=st.one_of(st.none(), st.integers(0, 30)),
    )
    def read(self, p, start, limit, span):
        end = None if span is None else start + span
        for s in ("s", "n"):
            assert self.real.read(s, start, limit, end, partition=p) == self.model.read(
                s, start, limit, end, partition=p
            )

    @rule(s=STREAMS, p=st.integers(0, 1), start=st.integers(-2, 80), limit=st.integers(0, 20))
    def read_payloads(self, s, p, start, limit):
        assert self.real.read_payloads(s, start, limit, partition=p) == self.model.read_payloads(
            s, start, limit, partition=p
        )

    @rule(p=st.integers(0, 1), index=st.integers(0, 90))
    def truncate(self, p, index):
        # with the lake on, segments below ``index`` go but every record stays readable there,
        # so the model does not change: the invariant and later reads check nothing was lost
        dropped = self.real.truncate_before("s", index, partition=p)
        assert 0 <= dropped <= index  # never a record at or above ``index``
        assert self.real.read("s", 0, partition=p) == self.model.read(
            "s", 0, partition=p
        )  # the lake serves them

    @rule(p=st.integers(0, 1), index=st.integers(0, 90))
    def truncate_without_lake(self, p, index):
        # whole segments: the real log may keep more than asked, never less than ``index``
        before = self.real.stream_info("n").partitions[p].first_index
        dropped = self.real.truncate_before("n", index, partition=p)
        after = self.real.stream_info("n").partitions[p].first_index
        assert before <= after <= max(before, index)
        assert dropped == after - before
        assert self.model.truncate_before("n", after, partition=p) == dropped

    @rule(client=st.sampled_from(["x", "y"]), p=st.integers(0, 1), index=st.integers(0, 50))
    def save_index(self, client, p, index):
        before = self.model.get_index(client, "s", partition=p)
        want = self.model.save_index(client, "s", index, partition=p)
        assert want == (index if before is None else max(before, index))  # never moves back
        assert self.real.save_index(client, "s", index, partition=p) == want

    @rule()
    def retention(self):
        self.real.enforce_retention()  # the lake keeps everything: nothing becomes unreadable

    @rule()
    def reopen(self):
        self.real.close()
        self.real = open_log(self.disk.root / "data")

    @rule(seed=SEEDS)
    def power_loss(self, seed):
        """Between operations: everything acknowledged so far must come back."""
        self.restart_after_power_loss(seed)
        self.check_everything()

    @rule(s=STREAMS, p=st.integers(0, 1), entries=entries_st, calls=st.integers(0, 8), seed=SEEDS)
    def append_cut_by_power_loss(self, s, p, entries, calls, seed):
        """The power goes after ``calls`` more disk writes, during (or just after) an append:
        if it returned, all of it survives; if not, at most a prefix of it, exactly."""
        before = self.model.stream_info(s).partitions[p].next_index
        self.disk.crash_after(calls)
        try:
            self.real.append_many(s, entries, partition=p)
            acked = True
        except PowerLoss:
            acked = False
        self.restart_after_power_loss(seed)
        got = [_row(r) for r in self.real.read(s, before, partition=p)]
        wrote = [(e.data, e.key, tuple(e.headers), e.timestamp_ns) for e in entries]
        if acked:
            assert got == wrote, "an acknowledged append lost records in a power loss"
        else:
            assert got == wrote[: len(got)], "an unacknowledged append left records it never wrote"
        self.model.append_many(s, entries[: len(got)], partition=p)
        self.check_everything()

    @invariant()
    def same_state(self):
        for s in ("s", "n"):
            for p in (0, 1):
                got = self.real.stream_info(s).partitions[p]
                want = self.model.stream_info(s).partitions[p]
                assert (got.first_index, got.next_index) == (want.first_index, want.next_index)
        for p in (0, 1):
            for c in ("x", "y"):
                got = self.real.get_index(c, "s", partition=p)
                assert got == self.model.get_index(c, "s", partition=p)

    def teardown(self) -> None:
        try:
            if self.real is not None and not self.disk.dead:
                self.real.close()
        finally:
            self.disk.__exit__(None, None, None)
            segment_log.Sealer = self.saved_sealer
            shutil.rmtree(self.base, ignore_errors=True)


LogModel.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSegmentLogAgainstMemoryLog = LogModel.TestCase
