"""``loglake job sds-audit``: the command for ``jobs/sds_audit.py``.

Options are checked, with errors naming the option, before Spark starts.
"""

from __future__ import annotations

import json

import click

from loglake.log.lake_schema import MAX_PARTITION
from loglake.pipeline.session import MASTER_ENV


@click.command("sds-audit")
@click.option("--data-dir", required=True, help="The loglake data directory.")
@click.option("--stream", required=True, help="The stream of the SDS channel, e.g. sds.room.")
@click.option("--out", "out_dir", required=True, help="Folder of the tables and report.html.")
@click.option(
    "--channel", default=None, help="The SDS channel id (default: the stream name minus 'sds.')."
)
@click.option(
    "--partition",
    type=click.IntRange(0, MAX_PARTITION),
    default=0,
    show_default=True,
    help="Stream partition.",
)
@click.option("--no-report", is_flag=True, help="Write the tables only, no report.html.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --out folder's audit files.")
@click.option(
    "--spark-master",
    envvar=MASTER_ENV,
    default=None,
    help=f"Spark master URL (default local[*]; env {MASTER_ENV}).",
)
@click.option(
    "--spark-conf",
    "spark_conf",
    multiple=True,
    help="A Spark setting KEY=VALUE (repeatable), e.g. spark.executor.memory=1g for a small "
    "cluster's workers.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def sds_audit_command(
    data_dir: str,
    stream: str,
    out_dir: str,
    channel: str | None,
    partition: int,
    no_report: bool,
    overwrite: bool,
    spark_master: str | None,
    spark_conf: tuple[str, ...],
    as_json: bool,
) -> None:
    """Audit a stored SDS channel: per message (sender, lamport, dependencies, who acknowledged
    it and when, repairs) and per participant (delivery ratio, ack latency p50/p90/p99,
    unresolved dependencies), as Parquet tables and an HTML report with plots."""
    from rich.console import Console
    from rich.table import Table

    from loglake.pipeline.errors import BadOption
    from loglake.pipeline.jobs.sds_audit import SdsAuditOptions, run, session_conf

    conf = {}
    for item in spark_conf:
        key, eq, value = item.partition("=")
        if not eq or not key.strip().startswith("spark."):
            raise BadOption("--spark-conf", item, "expected spark.KEY=VALUE")
        conf[key.strip()] = value
    opts = SdsAuditOptions(
        data_dir, stream, out_dir, channel, partition, not no_report, overwrite
    ).validate()
    console = Console(stderr=True)
    from loglake.pipeline.session import build_session

    with console.status(f"starting Spark ({spark_master or 'local[*]'})"):
        # C1 only: the JVM schedules plain tasks and runs the report's one quantile
        # (session.C1_ONLY; docs/pipeline.md has what it saved here)
        # and its workers' memory kept for their next allocations (SESSION_CONF)
        spark = build_session(
            master=spark_master,
            app_name="loglake-sds-audit",
            conf=session_conf(conf),
            c1_only=True,
            data_source=False,  # its tasks read the lake themselves (pipeline/units.py)
        )
    from loglake.pipeline.progress import JobProgress

    with JobProgress(spark, console, f"auditing {stream}"):
        summary = run(spark, opts)
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
        return
    table = Table(title=f"sds-audit {stream} → {opts.out_dir}")
    cols = ("records", "content", "sync", "participants", "acks", "repairs", "never", "rejects")
    for col in cols:
        table.add_column(col, justify="right")
    table.add_row(
        f"{summary.records:,}",
        f"{summary.content_messages:,}",
        f"{summary.sync_messages:,}",
        f"{summary.participants:,}",
        f"{summary.acks:,}",
        f"{summary.repair_requests:,}",
        f"{summary.never_delivered:,}",
        f"{summary.rejects:,}",
    )
    Console().print(table)
    if opts.report:
        Console().print(f"report: {opts.out_dir}/report.html ({summary.seconds:.1f} s)")
