"""The sealer of a JetStream-backed stream: copy JetStream history into the lake
layout, ``<data_dir>/lake/<stream>/partition=<p>/<first>-<last>.parquet`` (``log/lake_schema.py``),
so history past JetStream's retention stays readable — by ``pipeline.read`` and every Spark job,
and by a pull below the retained range (``JetStreamLog(lake_dir=…)`` reads the lake there).

Each partition is sealed from the end of its newest lake file (``visible_lake_files``) up to
what JetStream holds, in files of at most ``file_records`` records, written atomically by
``log.lake.write_lake_table``. Sealing is idempotent: a range already sealed is not written
again, and two sealers racing on one range write the same file name with the same rows (a
reader sees either). History JetStream dropped before it was sealed cannot be recovered: the
sealer logs it (``"jetstream history lost before sealing"``) and seals from the first retained
index; run it more often than the streams' ``max_age`` (``serve --seal-interval``). Records
dropped on purpose (``truncate_before``, which leaves a mark in the index bucket) are not
reported.

Runs in ``loglake serve --backend … --data-dir D`` and as ``loglake job seal``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import click
import pyarrow as pa
import pyarrow.parquet as pq

from loglake.clitools import INT64_MAX
from loglake.log.api import Log, Record
from loglake.log.lake import LakeFile, list_lake_files, records_table, visible_lake_files
from loglake.log.lake import write_lake_table as _write
from loglake.log.lake_schema import BACKEND_NOTE, lake_partition_dir
from loglake.streams.jetstream import JetStreamLog, check_creds_readable
from loglake.streams.nats_url import backend_url
from loglake.structured_logging import log_event

logger = logging.getLogger(__name__)

FILE_RECORDS = 100_000
"""Records per lake file the sealer writes (at most)."""


def write_backend_note(data_dir: Path | str, log: JetStreamLog) -> None:
    """Write (atomically, only when it changed) the note naming ``log``'s cluster."""
    import json
    import os
    from urllib.parse import urlsplit, urlunsplit

    o = log.options
    servers = []
    for url in o.servers:
        u = urlsplit(url)
        netloc = u.hostname or ""
        if u.port:
            netloc += f":{u.port}"
        servers.append(urlunsplit((u.scheme, netloc, "", "", "")))
    note = {"servers": servers, "prefix": o.prefix, "credentials": o.credentials}
    path = Path(data_dir) / "lake" / BACKEND_NOTE
    text = json.dumps(note, sort_keys=True)
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def sealed_next(data_dir: Path | str, stream: str, partition: int) -> int:
    """One past the newest index in the partition's lake (0 when it has none)."""
    files = visible_lake_files(list_lake_files(lake_partition_dir(data_dir, stream, partition)))
    return max((f.last + 1 for f in files), default=0)


@dataclass
class JetStreamSealer:
    log: JetStreamLog
    data_dir: Path
    file_records: int = FILE_RECORDS
    min_records: int = 1
    """Seal a partition only when at least this many records are not in the lake yet."""

    def seal_partition(self, stream: str, partition: int) -> list[LakeFile]:
        info = self.log.stream_info(stream).partitions[partition]
        start = sealed_next(self.data_dir, stream, partition)
        if start < info.first_index:
            # Records an explicit ``truncate_before`` dropped (Cardinal's old checkpoint
            # records) were not lost: only what lies past the truncation mark is reported.
            truncated = self.log.truncated_before(stream, partition=partition)
            if max(start, truncated) < info.first_index:
                log_event(
                    logger,
                    logging.ERROR,
                    "jetstream history lost before sealing",
                    stream=stream,
                    partition=partition,
                    missing_from=max(start, truncated),
                    missing_to=info.first_index - 1,
                )
            start = info.first_index
        if info.next_index - start < self.min_records:
            return []
        out = []
        directory = lake_partition_dir(self.data_dir, stream, partition)
        while start < info.next_index:
            limit = min(self.file_records, info.next_index - start)
            recs = self.log.read(stream, start, limit=limit, lake=False, partition=partition)
            if not recs:
                break
            if recs[0].index != start:  # retention dropped more while we sealed
                start = recs[0].index
            table = records_table(cast(Any, recs), stream, partition)
            out.append(_write(directory, table))
            start = recs[-1].index + 1
        if out:
            log_event(
                logger,
                logging.INFO,
                "jetstream history sealed",
                stream=stream,
                partition=partition,
                files=len(out),
                next=start,
            )
        return out

    def seal(self, streams: list[str] | None = None) -> list[LakeFile]:
        """Seal every partition of ``streams`` (default: every loglake stream)."""
        write_backend_note(self.data_dir, self.log)
        out = []
        for name in streams if streams is not None else self.log.streams():
            for p in range(self.log.partitions(name)):
                out += self.seal_partition(name, p)
        return out


@click.command("seal")
@click.option(
    "--backend",
    required=True,
    callback=backend_url,
    metavar="nats://H1:4222,...",
    help="The NATS cluster.",
)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the lake goes (<data-dir>/lake/<stream>/partition=<p>/).",
)
@click.option("--stream", "streams", multiple=True, help="Only these streams (repeatable).")
@click.option(
    "--nats-prefix",
    default="loglake",
    show_default=True,
    help="The namespace the streams were created under (serve --nats-prefix).",
)
@click.option(
    "--nats-creds",  # checked by jetstream.check_creds_readable, as serve's: one message
    type=click.Path(dir_okay=False),
    help="A NATS .creds file.",
)
@click.option(
    "--file-records",
    type=click.IntRange(1, INT64_MAX),  # the lake's index column is int64
    default=FILE_RECORDS,
    show_default=True,
    help="At most this many records per lake file.",
)
def seal_command(
    backend: str,
    data_dir: Path,
    streams: tuple[str, ...],
    nats_prefix: str,
    nats_creds: str | None,
    file_records: int,
) -> None:
    """Copy JetStream-backed streams into the lake layout under DATA_DIR/lake."""
    if nats_creds:  # click's exists=True said "does not exist" of a name too long, uncut
        try:
            check_creds_readable(nats_creds)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--nats-creds'") from None
    log = JetStreamLog(backend, prefix=nats_prefix, credentials=nats_creds)
    try:
        files = JetStreamSealer(log, data_dir, file_records).seal(list(streams) or None)
    finally:
        log.close()
    for f in files:
        click.echo(f"{f.path}\t{f.first}-{f.last}")
    click.echo(f"sealed {len(files)} file(s)")


IDLE_CHECK = 0.1
"""Seconds between checks of ``should_run`` while another node seals: a node that takes the
lease over seals within this of acquiring it (a check is a local read of the lease's state)."""


def warm_up() -> None:
    """Build and write (to memory) a one-record lake table, so the imports and codecs a seal
    needs are loaded before this node's first round rather than in it. The first
    ``pa.array`` of Python objects makes pyarrow import pandas (to ask whether the object is
    array-like), and ``pq.write_table`` loads the Parquet writer and zstd: seconds on a loaded
    machine, which a node taking the sealer over from a dead one would otherwise add to the
    failover. Never raises: a failure here only leaves the cost to the first seal."""
    try:
        record = Record("warm", 0, 0, 0, b"k", (("h", b"v"),), b"d")
        table = records_table([record], "warm", 0)
        pq.write_table(table, pa.BufferOutputStream(), compression="zstd")
    except Exception as e:
        log_event(logger, logging.WARNING, "jetstream sealer warm-up failed", error=repr(e))


async def seal_loop(
    log: Log,
    data_dir: Path,
    interval: float,
    stop: Any,
    should_run: Callable[[], bool] | None = None,
) -> None:
    """``serve --backend``'s sealer: ``seal()`` every ``interval`` seconds off the event loop
    until ``stop`` (an ``asyncio.Event``) is set; a failed round is logged and retried. With
    ``should_run`` (a node's lease on the sealer), a round runs only while it says so: several
    nodes on one cluster seal once, not once each."""
    import asyncio

    if not isinstance(log, JetStreamLog):
        raise TypeError("the sealer copies a JetStreamLog's history")
    sealer = JetStreamSealer(log, Path(data_dir))
    loop = asyncio.get_running_loop()
    # off the loop and not awaited: a standby is warm by the time it takes the lease over; a
    # holder's first seal waits for the same imports (the import lock) no longer than before
    loop.run_in_executor(None, warm_up)
    while not stop.is_set():
        wait = interval
        if should_run is None or should_run():
            try:
                await loop.run_in_executor(None, sealer.seal)
            except Exception as e:
                log_event(logger, logging.WARNING, "jetstream sealing failed", error=repr(e))
        else:
            wait = min(interval, IDLE_CHECK)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
