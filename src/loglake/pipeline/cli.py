"""``loglake job NAME [options]``: run a named Spark job with progress shown.

Mounted flat by ``loglake.cli`` (this module's ``command`` is a group whose subcommands become
top-level ones). Options are checked, and typed errors raised, before Spark starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from loglake.clitools import SECONDS
from loglake.errors import LoglakeError
from loglake.pipeline.errors import BadOption
from loglake.pipeline.jobs.archives_build_cli import archives_build_command
from loglake.pipeline.jobs.cardinal_blocks_cli import cardinal_blocks_command
from loglake.pipeline.jobs.sds_audit_cli import sds_audit_command
from loglake.pipeline.session import MASTER_ENV
from loglake.streams.jetstream_seal import seal_command

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str, option: str = "--target-size") -> int:
    """``128MB``, ``64m``, ``1GiB``, ``1048576`` → bytes (binary units)."""
    m = _SIZE.match(text or "")
    if not m:
        raise BadOption(option, text, "expected a size like 128MB")
    unit = (m.group(2) or "").lower()[:1]
    return int(float(m.group(1)) * _UNITS[unit])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Spark pipeline commands."""


_FIELD_PARAMS = {
    "target_bytes": "target_size",
    "row_group_bytes": "row_group_size",
    "now_ns": "now",
    "communities": "streams",
}
"""A job's options field -> the parameter of its command that sets it, where the two names
differ (a field named as its parameter needs no entry)."""


class _JobGroup(click.Group):
    """A job's options dataclass names its fields in ``BadOption`` (``target_bytes``, as the
    Python API calls it); run from the command line, the error names the command's own option
    (``--target-size``), the one the user typed."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BadOption as e:
            sub = self.get_command(ctx, ctx.invoked_subcommand or "")
            if sub is None or e.option.startswith("-"):
                raise
            want = _FIELD_PARAMS.get(e.option, e.option)
            for p in sub.params:
                if p.name == want and isinstance(p, click.Option):
                    raise BadOption(p.opts[0], e.value, e.reason) from e
            raise


@command.group(cls=_JobGroup)
def job() -> None:
    """Run a named Spark job (jobs live in loglake/pipeline/jobs/)."""


F = TypeVar("F", bound=Callable[..., Any])


def _spark_master_option(f: F) -> F:
    return click.option(
        "--spark-master",
        envvar=MASTER_ENV,
        default=None,
        help=f"Spark master URL (default local[*]; env {MASTER_ENV}), e.g. spark://host:7077.",
    )(f)


def _nothing_sealed(data_dir: str, stream: str) -> bool:
    """``stream`` is one of the log's in ``data_dir`` but has no lake folder yet: none of its
    segments has rolled and been sealed. Why: the README's first ``job compact`` on a new
    stream failed "no lake folder for it", exit 1, for a stream with nothing to do yet. A stream
    the log does not know keeps that error (a typo). The log is opened read-only: safe beside
    a running ``loglake serve``, and it writes nothing."""
    from loglake.log import open_log
    from loglake.pipeline.lake import stream_lake_dir

    if not os.path.isdir(data_dir) or stream_lake_dir(data_dir, stream).is_dir():
        return False
    try:
        with open_log(data_dir, readonly=True) as log:
            return stream in log.streams()
    except LoglakeError:  # not a log (or a damaged one): CompactOptions says what is wrong
        return False


@job.command("compact")
@click.option("--data-dir", required=True, help="The loglake data directory.")
@click.option("--stream", required=True, help="The stream whose sealed history to compact.")
@click.option("--target-size", default="128MB", show_default=True, help="Target file size.")
@click.option("--partitions", default=None, help="Only these log partitions, e.g. 0,2.")
@click.option(
    "--grace-seconds",
    type=SECONDS,  # inf, 1e300: superseded files kept for ever; nan: exit 1 naming grace_seconds
    default=0.0,
    show_default=True,
    help="Keep superseded files this long for readers that listed them.",
)
@click.option("--row-group-size", default="8MB", show_default=True, help="Parquet row group.")
@_spark_master_option
def compact_command(
    data_dir: str,
    stream: str,
    target_size: str,
    partitions: str | None,
    grace_seconds: float,
    row_group_size: str,
    spark_master: str | None,
) -> None:
    """Rewrite STREAM's sealed history into larger, index-sorted Parquet files (atomic)."""
    from pathlib import Path

    from loglake.pipeline.jobs.compact import CompactOptions, run

    try:
        parts = tuple(int(p) for p in partitions.split(",")) if partitions else None
    except ValueError:
        raise BadOption("--partitions", partitions, "expected numbers like 0,2") from None
    data = str(Path(data_dir).expanduser().resolve())
    if _nothing_sealed(data, stream):
        click.echo(f"stream {stream!r} has nothing sealed to compact yet")
        return
    opts = CompactOptions(
        data_dir=data,
        stream=stream,
        target_bytes=parse_size(target_size),
        partitions=parts,
        grace_seconds=grace_seconds,
        row_group_bytes=parse_size(row_group_size, "--row-group-size"),
    )
    console = Console(stderr=True)
    from loglake.pipeline.session import build_session

    with console.status(f"starting Spark ({spark_master or 'local[*]'})"):
        # compact reads the lake with Spark's own Parquet reader, never the loglake source: not
        # registered, Spark starts no Python at all (build_session). With it, the stock
        # daemon Spark starts to look sources up printed a BrokenPipeError traceback when a
        # job failing on a damaged page stopped Spark under it (a fresh-clone CI run)
        spark = build_session(master=spark_master, app_name="loglake-compact", data_source=False)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(step: str, done: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = bar.add_task(f"{step} groups", total=max(total, 1))
            bar.update(tasks[step], completed=done if total else 1, total=max(total, 1))

        result = run(spark, opts, progress)
    table = Table(title=f"compact {stream}")
    for col in ("groups", "rows", "bytes in", "files before", "files after", "deleted"):
        table.add_column(col, justify="right")
    table.add_row(
        str(len(result.groups)),
        f"{sum(g.rows for g in result.groups):,}",
        f"{sum(g.bytes for g in result.groups):,}",
        str(result.files_before),
        str(result.files_after),
        str(result.deleted),
    )
    Console().print(table)


# Each protocol job lives beside its code (pipeline/jobs/<name>_cli.py, or the JetStream sealer
# beside its backend) and is mounted here.
for _command in (
    archives_build_command,  # a community's weekly archives, built from its stream
    cardinal_blocks_command,  # Cardinal messages assembled into block tables
    sds_audit_command,  # what happened in a stored SDS channel
    seal_command,  # JetStream history into the lake layout
):
    job.add_command(_command)
