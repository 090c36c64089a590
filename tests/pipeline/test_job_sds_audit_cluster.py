"""``loglake job sds-audit`` on a real Spark standalone cluster (master + one worker from the
installed pyspark, on loopback, and one driver application on it; the session fixtures in
``conftest.py``): the job unchanged, and every table and the summary equal those of
``local[*]`` on the same channel (issue 12 §3, the SDS half)."""

from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from loglake.log import Entry, open_log
from loglake.pipeline.jobs.sds_audit import TABLES, SdsAuditOptions, run, table

from .test_job_sds_audit import CFG, STREAM, simulated

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1800)]
# a smaller run than test_job_sds_audit's: the job's cost here is Spark's per-stage overhead on
# the cluster (~20 stages), not the channel's size
CLUSTER_CFG = replace(CFG, participants=6, messages=20)


# the job as `loglake job sds-audit` runs it, in the cluster application (``cluster_driver``,
# sized for the test cluster's 2 GB worker: the CLI's session asks 4 GB executors, which this
# worker cannot give)
DRIVER = textwrap.dedent(
    """
    from loglake.pipeline.jobs.sds_audit import SdsAuditOptions, run
    data_dir, out = argv
    assert spark.sparkContext.master == master
    result = run(spark, SdsAuditOptions(data_dir, "sds.sim", out).validate()).as_dict()
    """
)


def rows_of(spark, out: Path) -> dict[str, list[str]]:
    def cell(v):
        if isinstance(v, bytes | bytearray):
            return v.hex()
        if isinstance(v, list):
            return [cell(x) for x in v]
        return v

    return {
        name: sorted(
            json.dumps([cell(v) for v in r], sort_keys=True)
            for r in table(spark, str(out), name).collect()
        )
        for name in TABLES
    }


def test_sds_audit_on_the_cluster_equals_local(spark, cluster_driver, tmp_path):
    src = tmp_path / "src"
    simulated(src, CLUSTER_CFG)
    with open_log(src) as log:  # and a reject, so that table is compared too
        log.append_many(STREAM, [Entry(b"\x08\xff not an SdsMessage")])
    on_cluster, local = tmp_path / "on_cluster", tmp_path / "local"
    shutil.copytree(src, on_cluster)
    shutil.copytree(src, local)
    on_cluster_summary = cluster_driver.run(
        DRIVER, str(on_cluster), str(tmp_path / "out_cluster"), timeout=1500
    )
    local_summary = run(
        spark, SdsAuditOptions(str(local), STREAM, str(tmp_path / "out_local")).validate()
    ).as_dict()
    for timing in ("seconds", "stage_seconds"):
        on_cluster_summary.pop(timing, None)
        local_summary.pop(timing, None)
    assert on_cluster_summary == local_summary
    assert local_summary["rejects"] == 1 and local_summary["acks"] > 0
    assert rows_of(spark, tmp_path / "out_cluster") == rows_of(spark, tmp_path / "out_local")
    assert (tmp_path / "out_cluster" / "report.html").stat().st_size > 10_000
