"""``loglake log``: look inside a data dir, check it, apply retention.

``info``, ``read`` and ``verify`` open the log read-only (``open_log(..., readonly=True)``), so
they are safe while ``loglake serve`` writes the same data dir; ``retention`` needs the writer
lock (stop the server first). Errors are ``LoglakeError`` subclasses (e.g. ``CorruptSegment``
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
from rich.table import Table

from loglake.log.segment_log import SegmentLog

DEFAULT_DATA_DIR = platformdirs.user_data_dir("loglake")

# exists=True: an absent data dir is a typo, not an empty log (it used to print an empty table)
data_dir_option = click.option(
    "--data-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
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
@click.option("--partition", "-p", type=int, default=0, show_default=True, help="Partition.")
@click.option("--from", "start", type=int, default=0, show_default=True, help="First index.")
@click.option(
    "--limit", "-n", type=int, default=20, show_default=True, help="At most this many records."
)
@json_option
def read(data_dir: Path, stream: str, partition: int, start: int, limit: int, as_json: bool):
    """Records of STREAM from an index on (read-only; spans lake and segments)."""
    with SegmentLog(data_dir, readonly=True) as log:
        recs = log.read(stream, partition, start, limit=limit)
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
def verify(data_dir: Path, as_json: bool) -> None:
    """Read every segment whole and check every lake file (read-only). Damage is reported
    with the file and byte offset, and the command fails."""
    with SegmentLog(data_dir, readonly=True) as log:
        rows = log.verify()
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


@command.command()
@data_dir_option
def retention(data_dir: Path) -> None:
    """Apply every stream's retention now (needs the writer lock: stop the server first)."""
    with SegmentLog(data_dir) as log:
        dropped = log.enforce_retention()
    Console().print(f"retention applied: {dropped:,} records no longer readable")
