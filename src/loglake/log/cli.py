"""``loglake log``: look inside a data dir, check it, apply retention.

``info``, ``read`` and ``verify`` open the log read-only (``open_log(..., readonly=True)``), so
they are safe while ``loglake serve`` writes the same data dir; ``retention`` and ``verify
--repair`` need the writer lock (stop the server first): a repair swaps files a running writer
holds open (see ``repair.py``). Errors are ``LoglakeError`` subclasses (e.g. ``CorruptSegment``
with file and offset), which the main CLI prints as messages.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click
import platformdirs
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from loglake.clitools import INT64_MAX
from loglake.log.api import (
    CorruptSegment,
    LogLocked,
    NotADataDir,
    check_data_dir,
    in_use_by_writer,
)
from loglake.log.lake_schema import MAX_PARTITION
from loglake.log.repair import Damage, planned_bytes, scan_damage
from loglake.log.repair import repair as repair_damage
from loglake.log.segment_log import SegmentLog

DEFAULT_DATA_DIR = platformdirs.user_data_dir("loglake")

# exists=True: an absent data dir is a typo, not an empty log (it used to print an empty table)


def _a_log(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """Found from outside: any existing folder was taken for a log, so ``verify`` of a wrong
    folder said "ok: 0 records" and ``retention`` wrote a lock, index files and ``streams/``
    into it (``check_data_dir``, which the archives commands ask too)."""
    try:
        check_data_dir(value)
    except NotADataDir as e:
        raise click.BadParameter(str(e), ctx, param) from None
    return value


data_dir_option = click.option(
    "--data-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    callback=_a_log,
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="The log's data directory (as given to `loglake serve`).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group(name="log", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Inspect and maintain the embedded storage engine's data directory."""


@command.command()
@data_dir_option
@json_option
def info(data_dir: Path, as_json: bool) -> None:
    """Streams, partitions, index ranges, bytes and lake files (read-only)."""
    with SegmentLog(data_dir, readonly=True) as log:
        rows: list[dict[str, Any]] = []
        health = {(h.stream, h.partition): h for h in log.health()}
        for name in log.streams():
            si = log.stream_info(name)
            for p in si.partitions:
                h = health.get((name, p.partition))  # none: never written, nothing failed
                seal, storage = (None, None) if h is None else (h.seal_failure, h.storage_failure)
                rows.append(
                    {
                        "stream": name,
                        "partition": p.partition,
                        "first_index": p.first_index,
                        "next_index": p.next_index,
                        "records": p.next_index - p.first_index,
                        "segment_bytes": p.bytes,
                        "durability": si.config.durability,
                        "seal_failure": None if seal is None else dataclasses.asdict(seal),
                        "storage_failure": None if storage is None else dataclasses.asdict(storage),
                    }
                )
    if as_json:
        click.echo(json.dumps(rows))
        return
    table = Table(title=f"loglake data dir {data_dir}")
    for col in ("stream", "partition", "first_index", "next_index", "records", "segment_bytes"):
        table.add_column(col, justify="left" if col == "stream" else "right")
    table.add_column("durability")
    table.add_column("problem")
    for r in rows:
        failure, storage = r.pop("seal_failure"), r.pop("storage_failure")
        problems = []
        if storage:
            tried = storage["reopen_attempts"]
            last = f"; last: {storage['reopen_error']}" if storage["reopen_error"] else ""
            problems.append(
                f"[red]storage failed, reopening ({tried} reopen attempts failed"
                f"{last}): {storage['error']}[/]"
            )
        if failure:
            problems.append(
                f"[red]seal failing ({failure['attempts']} attempts): {failure['error']}[/]"
            )
        problem = "; ".join(problems)
        cells = [f"{v:,}" if isinstance(v, int) else str(v) for v in r.values()]
        table.add_row(*cells, problem)
    Console().print(table)


@command.command()
@data_dir_option
@click.argument("stream")
@click.option(
    "--partition",
    "-p",
    type=click.IntRange(0, MAX_PARTITION),
    default=0,
    show_default=True,
    help="Partition.",
)
@click.option(
    "--from",
    "start",
    type=click.IntRange(0, INT64_MAX),  # -1 was read as 0; the lake's index is int64
    default=0,
    show_default=True,
    help="First index.",
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(0, INT64_MAX),  # -1 was an empty table
    default=20,
    show_default=True,
    help="At most this many records.",
)
@json_option
def read(
    data_dir: Path, stream: str, partition: int, start: int, limit: int, as_json: bool
) -> None:
    """Records of STREAM from an index on (read-only; spans lake and segments)."""
    with SegmentLog(data_dir, readonly=True) as log:
        recs = log.read(stream, start, limit=limit, partition=partition)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "index": r.index,
                        "timestamp_ns": r.timestamp_ns,
                        "key": None if r.key is None else r.key.hex(),
                        "headers": [[k, v.hex()] for k, v in r.headers],
                        "data": r.data.hex(),
                    }
                    for r in recs
                ]
            )
        )
        return
    table = Table(title=f"{stream}/{partition} from {start}")
    for col in ("index", "timestamp_ns", "key", "bytes", "data"):
        table.add_column(col)
    for r in recs:
        preview = r.data[:40].decode("utf-8", "replace")
        key = "" if r.key is None else r.key.decode("utf-8", "replace")
        table.add_row(str(r.index), str(r.timestamp_ns), key, str(len(r.data)), preview)
    Console().print(table)


@command.command()
@data_dir_option
@json_option
@click.option(
    "--repair",
    is_flag=True,
    help="Rewrite each damaged copy of sealed history from the copy that verifies: a sealed "
    "segment from its lake file, a lake file from its sealed segments (atomically: temp file, "
    "fsync, rename). A copy with no verified other copy is left as it is and reported as "
    "unrecoverable (exit 1). Takes the writer lock: refuses while `loglake serve` runs on the "
    "data dir.",
)
def verify(data_dir: Path, as_json: bool, repair: bool) -> None:
    """Read every segment whole and check every lake file (read-only, safe beside a running
    server). Damage is listed with the file, byte offset and whether --repair can fix it, and
    the command fails."""
    if repair:
        _repair(data_dir, as_json)
        return
    with SegmentLog(data_dir, readonly=True) as log:
        try:
            rows = log.verify()
        except CorruptSegment:
            # verify stops at the first damage: list all of it, and which copies can fix it
            _print_damage(data_dir, scan_damage(data_dir).damage, as_json)
            raise
    if as_json:
        keys = ("stream", "partition", "segments", "records", "lake_files")
        click.echo(json.dumps([dict(zip(keys, r, strict=True)) for r in rows]))
        return
    table = Table(title="verified")
    for col in ("stream", "partition", "segments", "records", "lake files"):
        table.add_column(col)
    for r in rows:
        table.add_row(*map(str, r))
    Console().print(table)
    Console().print(f"[green]ok[/]: {sum(r[3] for r in rows):,} records, no damage found")


def _damage_json(d: Damage) -> dict[str, Any]:
    return {**dataclasses.asdict(d), "sources": list(d.sources), "recoverable": d.recoverable}


def _print_damage(
    data_dir: Path, damage: list[Damage], as_json: bool, repairing: bool = False
) -> None:
    """One line a damaged copy (stderr while verifying: stdout is for the JSON)."""
    if as_json:
        if not repairing:
            click.echo(json.dumps({"damage": [_damage_json(d) for d in damage]}))
        return
    out = Console(stderr=not repairing, soft_wrap=True, highlight=False)
    for d in damage:
        if d.repaired:
            state = f"[green]repaired[/] from {', '.join(_rel(data_dir, s) for s in d.sources)}"
        elif d.recoverable and not repairing:
            state = f"[yellow]repairable[/] from {_rel(data_dir, d.sources[0])}: run with --repair"
        elif d.recoverable:
            state = "[yellow]not rewritten[/]: the file changed since the check; run again"
        else:
            state = "[red]unrecoverable[/]: no other copy of these indexes verifies"
        out.print(
            f"damaged {d.kind} {d.stream}/{d.partition} indexes {d.first}..{d.last}: "
            f"{_rel(data_dir, d.path)} byte {d.offset}: {escape(' '.join(d.reason.split()))} "
            f"— {state}"
        )


def _rel(data_dir: Path, path: str) -> str:
    """``path`` under the data dir, escaped for rich's markup."""
    try:
        return escape(str(Path(path).relative_to(data_dir)))
    except ValueError:
        return escape(path)


def _repair(data_dir: Path, as_json: bool) -> None:
    err = Console(stderr=True)
    total = planned_bytes(data_dir)
    with Progress(
        TextColumn("checking sealed history"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=as_json or not err.is_terminal,
    ) as bar:
        task = bar.add_task("check", total=total)
        report = repair_damage(data_dir, lambda n: bar.advance(task, n))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "segments": report.segments,
                    "lake_files": report.lake_files,
                    "damage": [_damage_json(d) for d in report.damage],
                }
            )
        )
    else:
        if report.damage:
            _print_damage(data_dir, report.damage, as_json, repairing=True)
        lost = len(report.unrecoverable)
        colour = "red" if lost else "green"
        Console(soft_wrap=True, highlight=False).print(
            f"[{colour}]checked {report.segments:,} sealed segments and {report.lake_files:,} "
            f"lake files: {len(report.damage):,} damaged, {len(report.repaired):,} repaired, "
            f"{lost:,} unrecoverable[/]"
        )
    if report.unrecoverable or len(report.repaired) < len(report.damage):
        raise SystemExit(1)


@command.command()
@data_dir_option
def retention(data_dir: Path) -> None:
    """Apply every stream's retention now (needs the writer lock: stop the server first)."""
    try:
        log = SegmentLog(data_dir)
    except LogLocked:
        raise click.ClickException(
            in_use_by_writer(str(data_dir), "loglake log retention")
        ) from None
    with log:
        dropped = log.enforce_retention()
    Console().print(f"retention applied: {dropped:,} records no longer readable")
