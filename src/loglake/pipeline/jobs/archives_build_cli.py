"""``loglake job archives-build``: the command for ``jobs/archives_build.py``.

Kept beside the job (``pipeline/cli.py`` only mounts it) so the job's options and report live in
one place. Options are checked, and typed errors raised, before Spark starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from loglake.clitools import Renamed, time_ns
from loglake.pipeline.errors import BadOption, check_dir
from loglake.pipeline.session import MASTER_ENV


def parse_time_ns(text: str | None, option: str = "--now") -> int | None:
    """``clitools.time_ns``, None staying None; a refusal is ``BadOption``. Past 2262
    (``1e30``) the job planned a 7-day window at a time up to ``now``, ~10^24 of them."""
    if text is None:
        return None
    try:
        return time_ns(text)
    except ValueError as e:
        raise BadOption(option, text, str(e)) from None


@click.command("archives-build")
@click.option("--data-dir", required=True, help="The loglake data directory.")
@click.option(
    "--stream",
    "--streams",
    "streams",
    cls=Renamed,
    old=("--streams",),
    required=True,
    help="Community stream, or a pattern (fnmatch, e.g. 'community-*'): one output each.",
)
@click.option("--root", required=True, help="Archive folder (as `archives build --root`).")
@click.option("--key-file", help="Control node key (hex) of the one community stream.")
@click.option("--key-dir", help="Folder of <stream>.key control node keys (for a pattern).")
@click.option(
    "--layout",
    type=click.Choice(["spec", "status-go"]),
    default="spec",
    show_default=True,
    help="Archive layout: the spec's text, or status-go's bytes (as `loglake archives build`).",
)
@click.option("--now", help="Build as of this time (Unix seconds or ISO 8601); default now.")
@click.option("--partial", is_flag=True, help="Also export the unfinished last window.")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    help="Community channel topic (repeatable; hex for status-go): only messages on these are "
    "archived, and every archive lists them all, as the spec requires. Without one, each "
    "archive lists the topics its messages carry, at most 100 of at most 256 bytes (messages "
    "on others are not archived, counted as 'past topic bounds'), as `loglake archives build`.",
)
@click.option(
    "--announce",
    multiple=True,
    help="Tracker URL put in the torrent (repeatable; default: the layout's, as "
    "`loglake archives build`).",
)
@click.option("--no-trackers", is_flag=True, help="A torrent without trackers.")
@click.option(
    "--on-bad-record",
    type=click.Choice(["fail", "skip"]),
    default="fail",
    show_default=True,
    help="A record that is not a WakuMessage: fail naming it, or skip and count it.",
)
@click.option(
    "--scratch",
    type=click.Choice(["auto", "memory", "disk"]),
    default="auto",
    show_default=True,
    help="Where the scan's spills go: auto = in memory (/dev/shm) when it has room and the "
    "master is local, else on disk under --root; memory = also for a cluster whose executors "
    "run on this machine.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the job report as JSON.")
@click.option(
    "--spark-master",
    envvar=MASTER_ENV,
    default=None,
    help=f"Spark master URL (default local[*]; env {MASTER_ENV}).",
)
def archives_build_command(
    data_dir: str,
    streams: str,
    root: str,
    key_file: str | None,
    key_dir: str | None,
    layout: str,
    now: str | None,
    partial: bool,
    topics: tuple[str, ...],
    announce: tuple[str, ...],
    no_trackers: bool,
    on_bad_record: str,
    scratch: str,
    as_json: bool,
    spark_master: str | None,
) -> None:
    """Build the due 7-day archives of community streams on Spark (byte-identical to
    `loglake archives build`), staged and committed atomically."""
    from rich.console import Console
    from rich.table import Table

    from loglake.archives import get_layout
    from loglake.pipeline.jobs.archives_build import (
        ArchivesBuildOptions,
        communities_from_keys,
        run,
    )
    from loglake.pipeline.session import build_session

    data = str(Path(data_dir).expanduser().resolve())
    check_dir("--data-dir", data_dir, data)
    lay = get_layout(layout)
    if no_trackers and announce:
        raise BadOption("--no-trackers", "", "give --announce or --no-trackers, not both")
    opts = ArchivesBuildOptions(
        data_dir=data,
        root=str(Path(root).expanduser().resolve()),
        communities=communities_from_keys(data, streams, key_file, key_dir),
        layout=layout,
        now_ns=parse_time_ns(now),
        partial=partial,
        topics=tuple(lay.parse_topic(t) for t in topics) or None,
        announce=() if no_trackers else (announce or None),
        on_bad_record=on_bad_record,
        scratch=scratch,
    )
    console = Console(stderr=True)
    with console.status(f"starting Spark ({spark_master or 'local[*]'})"):
        # C1 only: the JVM only schedules this job's plain tasks (session.C1_ONLY); they read
        # the stream themselves, so the loglake data source is not registered (build_session)
        spark = build_session(
            master=spark_master,
            app_name="loglake-archives-build",
            c1_only=True,
            data_source=False,
        )

    def progress(step: str, done: int, total: int) -> None:
        console.log(f"{step}: {done}/{total}")

    from loglake.pipeline.progress import JobProgress

    with JobProgress(spark, console, "building archives"):
        report = run(spark, opts, progress)
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    table = Table(title=f"archives-build ({layout})")
    cols = ("stream", "community", "windows", "new", "records", "bad skipped", "past topic bounds")
    for col in (*cols, "data bytes"):
        table.add_column(col, justify="left" if col in ("stream", "community") else "right")
    for c in report.communities:
        table.add_row(
            c.stream,
            c.community_id[:18] + "…",
            str(c.windows),
            str(c.new_archives),
            f"{c.records:,}",
            f"{c.bad_records:,}",
            f"{c.topic_skipped:,}",
            f"{c.data_bytes:,}",
        )
    Console().print(table)
    secs = ", ".join(f"{k} {v:.2f} s" for k, v in report.seconds.items())
    console.print(f"recovered {report.recovered}; {secs}")
