"""``loglake job cardinal-blocks``: the command for ``jobs/cardinal_blocks.py``.

Options are checked, with errors naming the option, before Spark starts.
"""

from __future__ import annotations

import json

import click

from loglake.cardinal import DEFAULT_REORG_THRESHOLD, MAX_REORG_THRESHOLD
from loglake.clitools import INT64_MAX, Number
from loglake.pipeline.jobs.cardinal_blocks import MAX_FOLLOW_SECONDS
from loglake.pipeline.session import MASTER_ENV

JOB_NICE = 10
"""``--nice``'s default. Why lower at all: the job usually follows a stream server on the
same machine, and at the shell's priority each micro-batch took both cores for a moment while
the server waited for a CPU: live at 1 update per block on 2 cores, the producers lost 6-12%
of their rate beside the job, 1-5% beside it niced +10, and it kept up either way
(docs/benchmarks.md). Why not 19: on a machine kept busy by other work the job still gets a
share, so a backlog still shrinks."""


@click.command("cardinal-blocks")
@click.option("--data-dir", required=True, help="The loglake data directory.")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    required=True,
    help="A topic of the application (repeatable); the first is the default topic, where "
    "Reorgs and reorg channels are, e.g. --topic chain --topic chain.state.",
)
@click.option("--out", "out_dir", required=True, help="Folder of the tables (Parquet).")
@click.option("--checkpoint", default=None, help="Spark checkpoint (default OUT/_checkpoint).")
@click.option(
    "--reorg-threshold",
    type=click.IntRange(1, MAX_REORG_THRESHOLD),
    default=DEFAULT_REORG_THRESHOLD,
    show_default=True,
    help="The application's ReorgThreshold (the window kept for reorgs).",
)
@click.option("--prefix", "prefixes", multiple=True, help="Track only these prefixes (regex).")
@click.option(
    "--max-records-per-trigger",
    type=click.IntRange(1, INT64_MAX),  # Spark's ReadMaxRows: a long
    default=None,
    help="Records per topic and micro-batch.",
)
@click.option(
    "--follow",
    type=Number(0, MAX_FOLLOW_SECONDS),  # nan, inf: exit 1, not a usage error
    default=None,
    help="Keep running, a micro-batch every this many seconds (default: stop when caught up).",
)
@click.option(
    "--spark-master",
    envvar=MASTER_ENV,
    default=None,
    help=f"Spark master URL (default local[*]; env {MASTER_ENV}).",
)
@click.option(
    "--nice",
    type=click.IntRange(0, 19),
    default=JOB_NICE,
    show_default=True,
    help="Run the job (a local session's JVM and Python workers too) this many steps lower in "
    "CPU priority, so a stream server on the same machine and its producers get the CPU first; "
    "0 keeps the shell's priority.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def cardinal_blocks_command(
    data_dir: str,
    topics: tuple[str, ...],
    out_dir: str,
    checkpoint: str | None,
    reorg_threshold: int,
    prefixes: tuple[str, ...],
    max_records_per_trigger: int | None,
    follow: float | None,
    spark_master: str | None,
    nice: int,
    as_json: bool,
) -> None:
    """Assemble a Cardinal topic's blocks into Parquet tables (blocks, chain_updates, rejects)
    by Structured Streaming, exactly once; restartable from its checkpoint."""
    from rich.console import Console
    from rich.table import Table

    from loglake.pipeline.jobs.cardinal_blocks import CardinalBlocksOptions, run

    opts = CardinalBlocksOptions(
        data_dir,
        topics,
        out_dir,
        checkpoint,
        reorg_threshold,
        prefixes or (".*",),
        max_records_per_trigger,
        follow,
    ).validate()
    console = Console(stderr=True)
    from loglake.pipeline import session

    session.lower_priority(nice)  # before the JVM starts: it and its workers inherit it
    with console.status(f"starting Spark ({spark_master or 'local[*]'})"):
        # C1 only: the records go to the driver's Python, the JVM plans micro-batches
        # (session.C1_ONLY; docs/pipeline.md has what it saved here)
        spark = session.build_session(
            master=spark_master, app_name="loglake-cardinal-blocks", c1_only=True
        )
    from loglake.pipeline.progress import JobProgress

    what = "assembling blocks" + (" (Ctrl-C stops)" if follow is not None else "")
    with JobProgress(spark, console, what):
        try:
            summary = run(spark, opts)
        except KeyboardInterrupt:
            from loglake.pipeline.jobs.cardinal_blocks import summarize

            summary = summarize(opts.out_dir)
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
        return
    table = Table(title=f"cardinal-blocks {', '.join(topics)} → {opts.out_dir}")
    for col in ("micro-batches", "blocks", "block rows", "chain updates", "rejects", "head"):
        table.add_column(col, justify="right")
    head = f"#{summary.head[0]} {summary.head[1][:16]}" if summary.head else "-"
    table.add_row(
        str(summary.batches),
        f"{summary.blocks:,}",
        f"{summary.block_rows:,}",
        f"{summary.chain_updates:,}",
        f"{summary.rejects:,}",
        head,
    )
    Console().print(table)
