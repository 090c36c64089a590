"""What a running Spark job shows a person: stages, tasks and records, while it runs.

Spark's own console progress bar is off (``spark.ui.showConsoleProgress``: it interleaves with
our output and counts one stage at a time), so a long job used to print nothing for tens of
seconds. ``JobProgress`` polls Spark's status tracker from a thread — every stage the job has
started, its tasks done and total — and, for a Structured Streaming job, the records its
micro-batches read (``StreamingQuery.recentProgress``), and draws them with rich. The node's
jobs API counts tasks the same way (``stage_tasks``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def stage_tasks(tracker: Any, stage_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
    """stage id → (tasks completed, tasks) for the stages the tracker still knows."""
    out: dict[int, tuple[int, int]] = {}
    for sid in stage_ids:
        info = tracker.getStageInfo(sid)
        if info is not None:
            out[sid] = (info.numCompletedTasks, info.numTasks)
    return out


class JobProgress:
    """``with JobProgress(spark, console, "auditing sds.room"): run(spark, opts)``.

    Stages are remembered once seen, so the totals only grow (a finished job's skipped
    stages, whose output was reused, are left out); a query's records are summed
    over its distinct micro-batches. Polls every ``interval`` seconds; draws nothing when the
    console is not a terminal but the final line (rich's behaviour)."""

    def __init__(
        self, spark: Any, console: Console, description: str, interval: float = 0.5
    ) -> None:
        self.spark = spark
        self.description = description
        self.interval = interval
        self.stages: dict[int, tuple[int, int]] = {}
        self.records = 0
        self._batches: set[tuple[str, int]] = set()
        self._jobs: set[int] = set()
        self._stop = threading.Event()
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[text]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._bar.add_task(description, total=None, text="starting")
        self._thread = threading.Thread(target=self._run, name="loglake-progress", daemon=True)

    def poll(self) -> None:
        """One look at Spark: active stages' tasks, streaming queries' new micro-batches."""
        tracker = self.spark.sparkContext.statusTracker()
        # every stage of every job seen running, refreshed: a stage that ran between two polls
        # is counted whole, and one seen half done is counted done once it is
        self._jobs.update(tracker.getActiveJobsIds())
        for jid in self._jobs:
            info = tracker.getJobInfo(jid)
            if info is None:
                continue
            for sid, (done, total) in stage_tasks(tracker, info.stageIds).items():
                if info.status == "SUCCEEDED" and not done:  # skipped: its output was reused
                    self.stages.pop(sid, None)
                else:
                    self.stages[sid] = (done, total)
        for query in self.spark.streams.active:
            for p in query.recentProgress:
                key = (str(p.get("runId") if isinstance(p, dict) else p.runId), _batch_id(p))
                if key not in self._batches:
                    self._batches.add(key)
                    self.records += _input_rows(p)
        done = sum(d for d, _ in self.stages.values())
        total = sum(t for _, t in self.stages.values())
        text = f"{len(self.stages)} stages, {done:,}/{total:,} tasks"
        if self._batches:
            text += f", {len(self._batches):,} micro-batches, {self.records:,} records"
        self._bar.update(self._task, completed=done, total=total or None, text=text)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # the session is stopping: the job's own error will say why
                return

    def __enter__(self) -> JobProgress:
        self._bar.start()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            with contextlib.suppress(Exception):  # the numbers stay as last drawn
                self.poll()
        self._bar.stop()


def _batch_id(p: Any) -> int:
    return int(p["batchId"] if isinstance(p, dict) else p.batchId)


def _input_rows(p: Any) -> int:
    return int(p["numInputRows"] if isinstance(p, dict) else p.numInputRows)
