"""Spark jobs through the node: start, status, progress.

Why in process: Spark's own ``statusTracker`` gives the running job's stages and tasks, which
is the progress a person wants to see, and the node's data dir is already here. The node
starts one ``SparkSession`` (``pipeline.build_session``, ``local[*]`` unless
``LOGLAKE_SPARK_MASTER`` says otherwise) on the first job, and runs one job at a time on a
worker thread (jobs queue behind each other); each job gets its own Spark job group, so its
progress is the tasks of that group's stages. Only ``[jobs] enabled`` nodes start Spark (it
needs Java 17+ and ~1 GB).

Jobs offered: ``compact`` (rewrite a stream's sealed history into larger files) and
``sds-audit`` (the SDS channel audit; tables and report under ``<data dir>/jobs/<id>/``): the
two whose inputs are only the node's own data dir. The other jobs stay ``loglake job ...``.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from loglake.errors import LoglakeError
from loglake.node.api.context import Node, NodeContext, part

router = APIRouter(tags=["jobs"])
_logger = logging.getLogger("loglake.node.jobs")

JobName = Literal["compact", "sds-audit"]


class UnknownJob(LoglakeError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Job:
    id: int
    name: str
    stream: str
    state: str = "queued"
    """queued | running | succeeded | failed"""
    submitted_ns: int = field(default_factory=time.time_ns)
    started_ns: int | None = None
    finished_ns: int | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    steps: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The job's own progress callback, step → (done, total) (``compact``)."""


class JobManager:
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "loglake-jobs")
        self._spark: Any = None
        self._owns_spark = False
        """Whether this node started the session: one that was running in the process before
        (an application embedding the node, a notebook) belongs to its owner and is not stopped
        when the node closes."""

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._spark is not None and self._owns_spark:
            self._spark.stop()

    def submit(self, name: str, stream: str) -> Job:
        self.ctx.log.stream_info(stream)  # 404 before queueing for a stream that is not there
        with self._lock:
            job = Job(next(self._ids), name, stream)
            self.jobs[job.id] = job
        self._pool.submit(self._run, job)
        return job

    def get(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJob(f"no job {job_id}")
        return job

    def _session(self) -> Any:
        if self._spark is None:
            from pyspark import SparkContext

            from loglake.pipeline import build_session

            # getOrCreate hands back a context already running in this process (sessions are
            # per thread, the context per process), so look at the context.
            self._owns_spark = SparkContext._active_spark_context is None
            self._spark = build_session(app_name="loglake-node")
        return self._spark

    def _run(self, job: Job) -> None:
        job.state, job.started_ns = "running", time.time_ns()
        try:
            spark = self._session()
            spark.sparkContext.setJobGroup(f"loglake-job-{job.id}", f"{job.name} {job.stream}")
            job.result = self._perform(spark, job)
            job.state = "succeeded"
        except Exception as e:
            job.state, job.error = "failed", f"{type(e).__name__}: {e}"
            # a typed error is the user's (a bad stream); anything else is a bug worth its trace
            bug = not isinstance(e, LoglakeError)
            _logger.log(
                logging.ERROR if bug else logging.WARNING,
                "job failed",
                exc_info=bug,
                extra={"fields": {"job": job.id, "name": job.name, "error": job.error}},
            )
        finally:
            job.finished_ns = time.time_ns()

    def _perform(self, spark: Any, job: Job) -> dict[str, Any]:
        data_dir = str(self.ctx.data_dir.resolve())
        if job.name == "compact":
            from loglake.pipeline.jobs.compact import CompactOptions, run

            def progress(step: str, done: int, total: int) -> None:
                job.steps[step] = (done, total)

            r = run(spark, CompactOptions(data_dir=data_dir, stream=job.stream), progress)
            return {
                "groups": len(r.groups),
                "files_before": r.files_before,
                "files_after": r.files_after,
                "deleted": r.deleted,
            }
        from loglake.pipeline.jobs.sds_audit import SdsAuditOptions
        from loglake.pipeline.jobs.sds_audit import run as audit

        out = self.ctx.data_dir / "jobs" / str(job.id)
        out.mkdir(parents=True, exist_ok=True)
        # validate() returns the options with their defaults filled in (the channel from the
        # stream's name): running the unfilled ones failed on a bare AssertionError
        opts = SdsAuditOptions(data_dir=data_dir, stream=job.stream, out_dir=str(out)).validate()
        summary: dict[str, Any] = audit(spark, opts).as_dict()
        summary["out_dir"] = str(out)
        return summary

    def progress(self, job: Job) -> dict[str, Any]:
        """Tasks done/total over the Spark stages of the job's group (while it runs), and the
        job's own step counters."""
        seen: dict[int, tuple[int, int]] = {}
        if job.state == "running" and self._spark is not None:
            from loglake.pipeline.progress import stage_tasks

            tracker = self._spark.sparkContext.statusTracker()
            for jid in tracker.getJobIdsForGroup(f"loglake-job-{job.id}"):
                info = tracker.getJobInfo(jid)
                if info is not None:
                    seen.update(stage_tasks(tracker, info.stageIds))
        stages = len(seen)
        tasks_done = sum(d for d, _ in seen.values())
        tasks_total = sum(t for _, t in seen.values())
        if job.state == "succeeded":
            fraction = 1.0
        elif tasks_total:
            fraction = tasks_done / tasks_total
        else:
            fraction = 0.0
        return {
            "stages": stages,
            "tasks_done": tasks_done,
            "tasks_total": tasks_total,
            "fraction": round(fraction, 3),
            "steps": {k: {"done": d, "total": t} for k, (d, t) in job.steps.items()},
        }


# -- routes ------------------------------------------------------------------------------------
class JobIn(BaseModel):
    name: JobName
    stream: str = Field(min_length=1, max_length=200)


class StepOut(BaseModel):
    done: int
    total: int


class ProgressOut(BaseModel):
    stages: int
    tasks_done: int
    tasks_total: int
    fraction: float
    steps: dict[str, StepOut]


class JobOut(BaseModel):
    id: int
    name: str
    stream: str
    state: str
    submitted_ns: int
    started_ns: int | None
    finished_ns: int | None
    error: str | None
    result: dict[str, Any] | None
    progress: ProgressOut


JobId = Annotated[int, PathParam(ge=0, le=2**63 - 1)]


def _jobs(node: NodeContext) -> JobManager:
    m: JobManager = part(node.jobs, "Spark jobs")
    return m


def _out(m: JobManager, job: Job) -> JobOut:
    return JobOut(
        id=job.id,
        name=job.name,
        stream=job.stream,
        state=job.state,
        submitted_ns=job.submitted_ns,
        started_ns=job.started_ns,
        finished_ns=job.finished_ns,
        error=job.error,
        result=job.result,
        progress=ProgressOut(**m.progress(job)),
    )


@router.get("/jobs", response_model=list[JobOut], summary="Spark jobs started on this node")
def list_jobs(node: Node) -> list[JobOut]:
    m = _jobs(node)
    return [_out(m, j) for j in sorted(m.jobs.values(), key=lambda j: j.id)]


@router.post("/jobs", response_model=JobOut, status_code=202, summary="Start a Spark job")
def start_job(body: JobIn, node: Node) -> JobOut:
    m = _jobs(node)
    return _out(m, m.submit(body.name, body.stream))


@router.get("/jobs/{job_id}", response_model=JobOut, summary="A job's status and progress")
def job_status(job_id: JobId, node: Node) -> JobOut:
    m = _jobs(node)
    return _out(m, m.get(job_id))
