"""Typed errors of the Spark pipeline.

Every error names the option and the value that caused it, so a user can fix it from the
message alone, and is raised on the driver before any Spark job starts where it can be, so
nothing half-runs. What only a task can find (``LiveHistoryGone``: a range read in an executor)
fails the job from there, and the job's entry point raises it as itself
(``raises_task_errors``). They derive from ``loglake.errors`` so the ``loglake`` CLI prints
them as messages, not tracebacks.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from loglake.errors import LocalProtocolError, LoglakeError, task_error

P = ParamSpec("P")
R = TypeVar("R")


class PipelineError(LoglakeError):
    """Base of the pipeline's errors."""


class JavaNotFound(PipelineError):
    """Spark 4 needs Java 17+; raised before the JVM is started."""


class SparkStartFailed(PipelineError):
    """The SparkSession did not start: a master that does not answer, a Spark setting the JVM
    refused. One line naming the master and Spark's reason, instead of the Py4J and JVM
    traces PySpark raises (what the JVM itself printed before it exited stays above it)."""

    def __init__(self, master: str, cause: BaseException) -> None:
        lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
        reason = next((ln for ln in lines if not ln.startswith("at ")), type(cause).__name__)
        super().__init__(f"Spark did not start (master {master}): {reason[:300]}")
        self.master = master


class BadOption(PipelineError, LocalProtocolError, ValueError):
    """An option of the ``loglake`` source, ``read()`` or a job has an unusable value."""

    def __init__(self, option: str, value: object, reason: str) -> None:
        super().__init__(f"option {option}={value!r}: {reason}")
        self.option, self.value, self.reason = option, value, reason


def check_dir(option: str, value: object, path: str | os.PathLike[str]) -> None:
    """``BadOption`` naming ``option`` unless ``path`` is a folder: ``no such directory``, or
    ``not a directory`` for a file there (``--data-dir /etc/passwd`` said "no such directory")."""
    if os.path.isdir(path):
        return
    reason = "not a directory" if os.path.exists(path) else "no such directory"
    raise BadOption(option, value, reason)


class SchemaMismatch(PipelineError, LocalProtocolError, ValueError):
    """A DataFrame written to a stream does not fit the record schema."""


class LakeLayoutError(PipelineError):
    """Files under ``<data_dir>/lake`` that break the layout rules (e.g. partial overlaps)."""


class JobFailed(PipelineError):
    """A named job could not finish; the stream is left as it was before the job."""


class LiveHistoryGone(PipelineError, LookupError):
    """A range of a stream is in neither the lake nor the live log: JetStream's retention
    dropped it before the sealer copied it (seal more often than the streams' ``max_age``), or
    a data dir's retention removed it before a streaming query resumed from a checkpoint that
    still expects it (Kafka's ``failOnDataLoss``: said, not skipped, unless the reader set
    ``failOnDataLoss=false``)."""

    def __init__(
        self, stream: str, partition: int, missing: int, first_held: int, held_by: str = ""
    ) -> None:
        why = (
            f"the live log of {held_by} (removed by retention)"
            if held_by
            else "JetStream (dropped by retention before they were sealed)"
        )
        super().__init__(
            f"stream {stream!r} partition {partition}: indexes {missing}..{first_held - 1} are "
            f"in neither the lake nor {why}"
        )
        self.stream, self.partition = stream, partition
        self.missing, self.first_held = missing, first_held


class StreamBehindCheckpoint(PipelineError, LookupError):
    """A streaming query's checkpoint is past the end of its stream: the stream was deleted
    and made again, or its data dir restored from an older copy. Kafka's source calls this
    data loss (``failOnDataLoss``); reading on would skip every record appended below the
    checkpoint's offset without a word. With ``failOnDataLoss=false`` it is not raised: the
    query goes on from the stream's end with a warning (``datasource.reset_behind``)."""

    def __init__(self, stream: str, partition: int, offset: int, next_index: int) -> None:
        super().__init__(
            f"stream {stream!r} partition {partition} ends at index {next_index}, below the "
            f"checkpoint's offset {offset} (the stream was made again or restored from an "
            "older copy): start the query on a new checkpoint, or set failOnDataLoss=false to "
            "go on from the stream's end"
        )
        self.stream, self.partition = stream, partition
        self.offset, self.next_index = offset, next_index


def raises_task_errors(job: Callable[P, R]) -> Callable[P, R]:
    """``job`` (a job's entry point), raising the typed error a Spark task raised as itself
    (``loglake.errors.task_error``) rather than Spark's wrapper around its traceback: a caller
    catches ``LiveHistoryGone`` or a job's refusal the same whether the driver or an executor
    found it, and the CLI prints it as one line."""

    @functools.wraps(job)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return job(*args, **kwargs)
        except Exception as e:
            typed = task_error(e)
            if typed is None:
                raise
            raise typed from e

    return run
