"""``InstrumentedLog`` forwards the pipelined append (``append_payloads_then``) to the log it
wraps, so a node's stream server keeps its written/durable split, and counts a push when it
is durable."""

from __future__ import annotations

import threading

from loglake.log import StreamConfig, open_log
from loglake.log.segment_log import SegmentLog
from loglake.node.metrics import InstrumentedLog, NodeMetrics


def test_the_pipelined_append_reaches_the_wrapped_log_and_counts_when_durable(
    tmp_path, monkeypatch
):
    calls: list[int] = []
    real = SegmentLog.append_payloads_then

    def spy(self, stream, datas, done, *, partition=0):
        calls.append(len(datas))
        return real(self, stream, datas, done, partition=partition)

    monkeypatch.setattr(SegmentLog, "append_payloads_then", spy)
    metrics = NodeMetrics()
    log = InstrumentedLog(open_log(tmp_path), metrics)
    try:
        log.create_stream("s", StreamConfig(partitions=1))
        durable = threading.Event()
        outcome: list[BaseException | None] = []

        def done(error: BaseException | None) -> None:
            outcome.append(error)
            durable.set()

        assert log.append_payloads_then("s", [b"ab", b"cde"], done) == [0, 1]
        assert durable.wait(10)
        assert outcome == [None]
        assert calls == [2]  # the wrapped log's own pipelined path, not the blocking default
        assert metrics.traffic()["s"] == (2, 5, 0, 0)
    finally:
        log.close()
