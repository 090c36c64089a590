"""``loglake archives``: build, seed, fetch and list community history archives.

Mounted by ``loglake.cli`` as ``archives``; also runnable alone (``python -m
loglake.archives.cli``), which is how the tests start a member in another process.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from loglake.archives.errors import ArchiveConfigError
from loglake.archives.layout import INT64_MAX, MAX_FETCHED_ARCHIVE_BYTES, NS, get_layout
from loglake.archives.member import FETCH_DEADLINE_S, MAX_FETCH_BYTES
from loglake.clitools import (
    CONTEXT_SETTINGS,
    HOST_PORT,
    PORT,
    POSITIVE_SECONDS,
    SECONDS,
    TIME,
    Renamed,
    TypedErrorGroup,
)
from loglake.log.api import UnknownStream, check_data_dir

if TYPE_CHECKING:
    from coincurve import PrivateKey

    from loglake.archives.bt import Progress as FetchProgress
    from loglake.archives.control import BuildOutcome, ControlNode
    from loglake.streams.api import Streams

F = TypeVar("F", bound=Callable[..., Any])

console = Console(stderr=True)


def _key(key_file: str | None) -> PrivateKey:
    from loglake.archives.signing import load_private_key

    raw = Path(key_file).read_text().strip() if key_file else os.environ.get("LOGLAKE_ARCHIVES_KEY")
    if not raw:
        raise ArchiveConfigError("give --key-file (hex secp256k1 key) or LOGLAKE_ARCHIVES_KEY")
    return load_private_key(raw)


def _ts(ns: int) -> str:
    return datetime.fromtimestamp(ns / NS, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _report_unarchived(node: ControlNode, since: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """A line on each kind of record the ingests since the counts ``since`` (``future_count``,
    ``late_count``) found no archive will hold, naming the first when known: refused as dated
    in the future, or stored after its window was archived. A user who sees retention truncate
    them must know why. Returns the counts now, the next call's ``since``."""
    from loglake.archives.builder import MAX_FUTURE_NS

    for count, kept, n, what, then in (
        (
            node.future_count,
            node.future,
            since[0],
            f"refused {{}} record(s) dated more than {MAX_FUTURE_NS // NS} s ahead of this clock",
            "never archived, and they do not hold retention",
        ),
        (
            node.late_count,
            node.late,
            since[1],
            "{} record(s) arrived after their window was archived",
            "never archived, and truncated once older than 30 days",
        ),
    ):
        if count > n:
            first = kept[n] if n < len(kept) else None
            where = f" (first at index {first[0]}, dated {_ts(first[1])})" if first else ""
            console.print(f"[yellow]{what.format(count - n)}[/yellow]{where}: {then}")
    return node.future_count, node.late_count


def _topics_opt(f: F) -> F:
    return click.option(
        "--topic",
        "topics",
        multiple=True,
        help="Community channel topic (repeatable; hex for status-go): only messages on these "
        "are archived, and every archive lists them all, as the spec requires. Without one, "
        "each archive lists the topics its messages carry, at most 100 of at most 256 bytes "
        "(messages on others are not archived): anyone who can post picks them.",
    )(f)


def _report_topic_skipped(out: BuildOutcome) -> None:
    """A line on the messages a build left out as their topic was past the bounds of an
    archive's metadata (no --topic): a user who sees them missing must know why."""
    from loglake.archives.builder import MAX_ARCHIVE_TOPICS, MAX_TOPIC_BYTES

    if n := out.result.topic_skipped:
        shown = ", ".join(repr(t) for t in out.result.topic_sample)
        console.print(
            f"[yellow]{n} record(s) on topics past an archive's bounds (at most "
            f"{MAX_ARCHIVE_TOPICS} topics of at most {MAX_TOPIC_BYTES} bytes) were not "
            f"archived[/yellow] (e.g. {shown}): give the community's channels with --topic"
        )


def _trackers_opt(f: F) -> F:
    f = click.option(
        "--no-trackers",
        is_flag=True,
        help="A torrent without trackers (members find the seeder from the magnet's peers).",
    )(f)
    return click.option(
        "--tracker",
        "trackers",
        multiple=True,
        help="Tracker announce URL put in the torrent and magnet (repeatable; replaces the "
        "layout's defaults: none for spec, status-go's two UDP trackers for status-go).",
    )(f)


def _announce(trackers: tuple[str, ...], no_trackers: bool) -> tuple[str, ...] | None:
    """The ``announce`` a ``ControlNode`` takes: None keeps the layout's default trackers."""
    from loglake.archives.torrent import check_trackers

    if no_trackers and trackers:
        raise ArchiveConfigError("give --tracker or --no-trackers, not both")
    return () if no_trackers else (check_trackers(trackers) if trackers else None)


_max_archive_opt = click.option(
    "--max-archive-bytes",
    type=click.IntRange(1, INT64_MAX),  # compared with the index's int64 sizes
    default=MAX_FETCHED_ARCHIVE_BYTES,
    show_default=True,
    help="Refuse a fetch whose index names a missing archive bigger than this, before "
    "downloading it (an archive is read whole into memory and hydrated a chunk at a time: at "
    "the peak its bytes plus up to 32 MiB, plus about 5x its largest message over 4 MiB).",
)

_max_fetch_opt = click.option(
    "--max-fetch-bytes",
    type=click.IntRange(1, INT64_MAX),
    default=MAX_FETCH_BYTES,
    show_default=True,
    help="Download at most this many bytes of archives in one fetch: the newest windows that "
    "fit, the older ones left for a later fetch (an error if the newest window does not fit).",
)

_deadline_opt = click.option(
    "--deadline",
    "fetch_deadline",
    type=POSITIVE_SECONDS,
    default=FETCH_DEADLINE_S,
    show_default=True,
    help="Seconds a fetch may wait on peers in all (metadata, index, every archive); the "
    "pieces it got are kept for the next one.",
)

_layout_opt = click.option(
    "--layout",
    type=click.Choice(["spec", "status-go"]),
    default="spec",
    show_default=True,
    help="Byte layout: the spec's text, or what status-go writes.",
)


@click.group(cls=TypedErrorGroup, context_settings=CONTEXT_SETTINGS)
def command() -> None:
    """Status community history archives: weekly torrents of a community's messages."""


@command.command()
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Key file to write.")
def keygen(out: str) -> None:
    """Create a control node key; print the community id (its compressed public key).

    An existing file is never replaced (a community's control key lost is the community
    lost), and the secret is created 0600, never readable by others between its write and a
    chmod. Found from outside: ``--out`` naming the live key replaced it silently."""
    from coincurve import PrivateKey

    from loglake.archives.signing import community_id
    from loglake.log.fs import create_exclusive

    key = PrivateKey()
    if not create_exclusive(out, (key.to_hex() + "\n").encode()):
        raise click.ClickException(f"{out} exists: not replacing a key (move it away first)")
    click.echo(community_id(key))


@command.command()
@click.option("--data-dir", type=click.Path(file_okay=False), required=True, help="loglake log.")
@click.option(
    "--stream", "stream", default="community", show_default=True, help="Community stream."
)
@click.option("--root", type=click.Path(file_okay=False), required=True, help="Archive folder.")
@click.option("--key-file", type=click.Path(dir_okay=False), help="Control node key (hex).")
@_layout_opt
@click.option(
    "--now", type=TIME, help="Build as of this time (Unix seconds or ISO 8601); default now."
)
@click.option("--partial", is_flag=True, help="Also export the unfinished last window.")
@_topics_opt
@click.option("--publish", "channel", help="Push the signed magnet link to this stream.")
@click.option("--peer", "peers", multiple=True, help="host:port hint put in the magnet (x.pe).")
@_trackers_opt
def build(
    data_dir: str,
    stream: str,
    root: str,
    key_file: str | None,
    layout: str,
    now: int | None,
    partial: bool,
    topics: tuple[str, ...],
    channel: str | None,
    peers: tuple[str, ...],
    trackers: tuple[str, ...],
    no_trackers: bool,
) -> None:
    """Export the next 7-day windows of a community stream into archives (control node)."""
    from loglake.archives.control import ControlNode
    from loglake.archives.signing import community_id
    from loglake.archives.store import MessageStore
    from loglake.log import open_log
    from loglake.streams.api import LocalStreams

    key = _key(key_file)
    lay = get_layout(layout)
    cid = community_id(key)
    announce = _announce(trackers, no_trackers)
    check_data_dir(data_dir)  # before anything is made: a mistyped one became a new log
    Path(root).mkdir(parents=True, exist_ok=True)
    store = MessageStore(Path(root) / f"{cid}.sqlite")
    node = ControlNode(
        root, key, lay, store, [lay.parse_topic(t) for t in topics] or None, announce
    )
    log = open_log(data_dir, readonly=channel is None)
    try:
        before = store.get_meta("ingest_next_index")
        n = node.ingest_streams(LocalStreams(log), stream)
        if node.skipped:
            if not node.decoded:
                # not one record is the layout's: the ingest stored nothing, and its position
                # is forgotten. Kept, it had moved past every record, so the rerun with the
                # other layout this error advises ingested none (and retention, which lets
                # records never stored go, could truncate them unarchived)
                store.set_meta("ingest_next_index", before or 0)
            idx, why = node.skipped[0]
            other = "spec" if layout == "status-go" else "status-go"
            raise ArchiveConfigError(
                f"{node.skipped_count} record(s) of {stream} do not decode in the {layout} layout "
                f"(first at index {idx}: {why}); nothing was built. Is the stream in the "
                f"{other} layout (--layout {other})?"
            )
        _report_unarchived(node)
        out = node.build(time.time_ns() if now is None else now, partial=partial)
        _report_topic_skipped(out)
        table = Table(title=f"archives of {cid[:18]}… ({layout})")
        for col in ("id", "from", "to", "offset", "size", "pieces"):
            table.add_column(col)
        for e in node.entries:
            new = "new " if e in out.new else ""
            table.add_row(
                new + e.archive_id[:18] + "…",
                _ts(e.metadata.from_ns),
                _ts(e.metadata.to_ns),
                str(e.offset),
                str(e.size),
                str(e.num_pieces),
            )
        console.print(f"ingested {n} messages; {len(out.new)} new archive(s)")
        console.print(table)
        if node.entries:
            magnet = node.magnet(tuple(peers))
            if channel:
                idx = node.publish_magnet(
                    LocalStreams(log), channel, int(time.time() * 1000), tuple(peers)
                )
                console.print(f"published on {channel} at index {idx}")
            click.echo(magnet)
    finally:
        log.close()
        store.close()


@command.command()
@click.option("--root", type=click.Path(file_okay=False), required=True, help="Archive folder.")
@click.option("--key-file", type=click.Path(dir_okay=False), help="Control node key (hex).")
@click.option("--port", type=PORT, default=0, help="Listen port on 127.0.0.1 (0: any).")
@click.option("--duration", type=SECONDS, help="Seconds to seed (default: until Ctrl-C).")
@click.option(
    "--peer",
    "--connect",
    "connects",
    cls=Renamed,
    old=("--connect",),
    multiple=True,
    type=HOST_PORT,
    help="host:port of a BitTorrent peer to dial.",
)
def seed(
    root: str,
    key_file: str | None,
    port: int,
    duration: float | None,
    connects: tuple[tuple[str, int], ...],
) -> None:
    """Seed the newest archive torrent on loopback and print its magnet link."""
    from loglake.archives.bt import Seeder, load_torrent
    from loglake.archives.signing import community_id
    from loglake.archives.torrent import magnet_link

    cid = community_id(_key(key_file))
    tfile = Path(root) / f"{cid}.torrent"
    if not tfile.exists():
        raise ArchiveConfigError(f"no torrent at {tfile}: run `loglake archives build` first")
    meta = tfile.read_bytes()
    info = load_torrent(meta, str(tfile))
    announce = tuple(t.url for t in info.trackers())
    seeder = Seeder(port)
    try:
        seeder.seed(meta, root, source=str(tfile))
        click.echo(magnet_link(str(info.info_hashes().v1), cid, announce, (seeder.peer,)), nl=True)
        for host, p in connects:
            seeder.connect(host, p)
        deadline = None if duration is None else time.monotonic() + duration
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        seeder.close()


@command.command()
@click.option("--magnet", required=True, help="Magnet link of the archive torrent.")
@click.option("--root", type=click.Path(file_okay=False), required=True, help="Member folder.")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), help="Member store.")
@click.option("--community", help="Expected community id (0x…); checked against the torrent.")
@_layout_opt
@click.option(
    "--timeout", type=POSITIVE_SECONDS, default=20.0, show_default=True, help="Metadata wait, s."
)
@click.option(
    "--since", type=TIME, help="Only archives overlapping [since, until): Unix s or ISO 8601."
)
@click.option("--until", type=TIME, help="End of that range (default: open).")
@_max_archive_opt
@_max_fetch_opt
@_deadline_opt
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report on stdout.")
def fetch(
    magnet: str,
    root: str,
    store_path: str | None,
    community: str | None,
    layout: str,
    timeout: float,
    since: int | None,
    until: int | None,
    max_archive_bytes: int,
    max_fetch_bytes: int,
    fetch_deadline: float,
    as_json: bool,
) -> None:
    """Fetch the index and the missing archives, then hydrate the member store."""
    from loglake.archives.bt import parse_magnet
    from loglake.archives.member_node import fetch_archives
    from loglake.archives.store import MessageStore

    parse_magnet(magnet)
    Path(root).mkdir(parents=True, exist_ok=True)
    store = MessageStore(store_path or Path(root) / "member.sqlite")
    lay = get_layout(layout)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} pieces"),
        TextColumn("{task.fields[bytes]} B"),
        TextColumn("{task.fields[peers]} peers"),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    ) as bar:
        task = bar.add_task("metadata", total=None, bytes=0, peers=0)

        def progress(p: FetchProgress) -> None:
            bar.update(
                task,
                description="fetching",
                completed=p.pieces_done,
                total=p.pieces_wanted,
                bytes=p.bytes_downloaded,
                peers=p.peers,
            )

        try:
            report = fetch_archives(
                magnet,
                root,
                store,
                lay,
                community,
                timeout=timeout,
                progress=progress,
                since_ns=since,
                until_ns=until,
                max_archive_bytes=max_archive_bytes,
                deadline=fetch_deadline,
                max_fetch_bytes=max_fetch_bytes,
            )
        finally:
            store.close()
    out = _report_json(report, pieces=True)
    if as_json:
        click.echo(json.dumps(out))
    else:
        console.print(
            f"{report.archives} archive(s) in the index, {len(report.missing)} fetched, "
            f"{report.hydrated_messages} messages hydrated, {report.bytes_downloaded} B downloaded"
        )
    if report.left:
        console.print(_left_line(report.left, max_fetch_bytes))


def _left_line(left: list[Any], max_fetch_bytes: int) -> str:
    """The line a fetch that left older archives prints (``FetchReport.left``)."""
    return (
        f"[yellow]left[/yellow] {len(left)} older archive(s) ({sum(e.size for e in left)} B, "
        f"up to {_ts(left[-1].metadata.to_ns)}): over --max-fetch-bytes {max_fetch_bytes} with "
        "the newer ones; the next fetch takes the newest of them"
    )


def _check_source(data_dir: str | None, connect: tuple[str, int] | None) -> None:
    """Exactly one of ``--data-dir`` and ``--connect``, and the data dir an existing log
    (``check_data_dir``): ``run`` and ``follow`` ingest from and publish to streams of it."""
    if (data_dir is None) == (connect is None):
        raise ArchiveConfigError("give exactly one of --data-dir and --connect")
    if data_dir is not None:
        check_data_dir(data_dir)


def _open_streams(
    data_dir: str | None, connect: tuple[str, int] | None, readonly: bool
) -> tuple[Streams, Callable[[], None]]:
    """A ``Streams`` on the embedded log (``--data-dir``) or on ``loglake serve``
    (``--connect host:port``), and a function that closes it."""
    _check_source(data_dir, connect)
    if connect is not None:
        from loglake.streams.client import StreamClient
        from loglake.streams.retry import RetryingStreams

        host, port = connect
        # the builder reads history: every call it makes is safe to repeat after a restart
        client = RetryingStreams(lambda: StreamClient(host, port))
        return client, client.close
    from loglake.log import open_log
    from loglake.streams.api import LocalStreams

    assert data_dir is not None  # exactly one of the two, checked above
    log = open_log(data_dir, readonly=readonly)
    return LocalStreams(log), log.close


_source_opts = [
    click.option("--data-dir", type=click.Path(file_okay=False), help="Embedded loglake log."),
    click.option(
        "--connect", type=HOST_PORT, help="host:port of a running `loglake serve` instead."
    ),
]


def _source(f: F) -> F:
    for opt in reversed(_source_opts):
        f = opt(f)
    return f


@command.command()
@_source
@click.option("--stream", default="community", show_default=True, help="Community stream.")
@click.option("--channel", default="community-archives", show_default=True, help="Special channel.")
@click.option("--root", type=click.Path(file_okay=False), required=True, help="Archive folder.")
@click.option("--key-file", type=click.Path(dir_okay=False), help="Control node key (hex).")
@_layout_opt
@_topics_opt
@click.option("--port", type=PORT, default=0, help="Seeder port on 127.0.0.1 (0: any).")
@click.option(
    "--check-every", type=POSITIVE_SECONDS, default=60.0, show_default=True, help="Seconds."
)
@click.option("--duration", type=SECONDS, help="Stop after this many seconds (default: never).")
@_trackers_opt
def run(
    data_dir: str | None,
    connect: tuple[str, int] | None,
    stream: str,
    channel: str,
    root: str,
    key_file: str | None,
    layout: str,
    topics: tuple[str, ...],
    port: int,
    check_every: float,
    duration: float | None,
    trackers: tuple[str, ...],
    no_trackers: bool,
) -> None:
    """Control node loop: ingest, build due 7-day windows, seed the newest torrent, publish its
    signed magnet link on the special channel, prune archived messages older than 30 days."""
    from loglake.archives.bt import Seeder
    from loglake.archives.control import ControlNode
    from loglake.archives.signing import community_id
    from loglake.archives.store import MessageStore

    key = _key(key_file)
    lay = get_layout(layout)
    cid = community_id(key)
    announce = _announce(trackers, no_trackers)
    _check_source(data_dir, connect)  # before anything is made
    Path(root).mkdir(parents=True, exist_ok=True)
    store = MessageStore(Path(root) / f"{cid}.sqlite")
    node = ControlNode(
        root, key, lay, store, [lay.parse_topic(t) for t in topics] or None, announce
    )
    streams, close = _open_streams(data_dir, connect, readonly=False)
    seeder = Seeder(port)
    seeded = None
    deadline = None if duration is None else time.monotonic() + duration
    reported = (0, 0)
    try:
        while True:
            now = time.time_ns()
            try:
                n = node.ingest_streams(streams, stream)
            except UnknownStream:
                n = 0  # no community message yet
            reported = _report_unarchived(node, reported)
            out = node.build(now)
            _report_topic_skipped(out)
            if node.entries and (out.new or seeded is None):
                seeder.seed(node.torrent().metainfo(), root)
                seeded = node.torrent().info_hash
                idx = node.publish_magnet(streams, channel, now // 1_000_000, (seeder.peer,))
                console.print(f"seeding {seeded}; magnet published on {channel} at {idx}")
            pruned = node.prune(now)
            console.print(
                f"ingested {n}, new archives {len(out.new)}, truncated {pruned.log_records} "
                f"from the live stream (store rows {pruned.store_rows})"
            )
            if deadline is not None and time.monotonic() >= deadline:
                return
            left = float("inf") if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(check_every, left)))
    except KeyboardInterrupt:
        pass
    finally:
        seeder.close()
        close()
        store.close()


@command.command()
@_source
@click.option("--channel", default="community-archives", show_default=True, help="Special channel.")
@click.option("--community", required=True, help="Community id (0x…): the control node's key.")
@click.option("--root", type=click.Path(file_okay=False), required=True, help="Member folder.")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), help="Member store.")
@_layout_opt
@click.option("--wait", type=SECONDS, default=20.0, show_default=True, help="Quiet period, s.")
@click.option(
    "--poll", type=POSITIVE_SECONDS, default=1.0, show_default=True, help="Channel poll, s."
)
@click.option(
    "--timeout", type=POSITIVE_SECONDS, default=20.0, show_default=True, help="Metadata wait, s."
)
@_max_archive_opt
@_max_fetch_opt
@_deadline_opt
@click.option("--duration", type=SECONDS, help="Stop after this many seconds (default: never).")
@click.option("--once", is_flag=True, help="Stop after the first fetch.")
def follow(
    data_dir: str | None,
    connect: tuple[str, int] | None,
    channel: str,
    community: str,
    root: str,
    store_path: str | None,
    layout: str,
    wait: float,
    poll: float,
    timeout: float,
    max_archive_bytes: int,
    max_fetch_bytes: int,
    fetch_deadline: float,
    duration: float | None,
    once: bool,
) -> None:
    """Member loop: follow the special channel, ignore unsigned or foreign messages, wait the
    quiet period after the last magnet link, fetch missing archives, hydrate the store."""
    from loglake.archives.errors import ArchiveError, UndecodableArchive
    from loglake.archives.member import Accepted
    from loglake.archives.member_node import MemberNode
    from loglake.archives.store import MessageStore

    _check_source(data_dir, connect)  # before anything is made
    Path(root).mkdir(parents=True, exist_ok=True)
    store = MessageStore(store_path or Path(root) / "member.sqlite")
    member = MemberNode(root, store, get_layout(layout), community, wait_ns=int(wait * NS))
    streams, close = _open_streams(data_dir, connect, readonly=True)
    deadline = None if duration is None else time.monotonic() + duration
    try:
        while deadline is None or time.monotonic() < deadline:
            now = time.time_ns()
            try:
                events = member.poll(streams, channel, now)
            except UnknownStream:
                events = []  # the control node has not published yet
            for ev in events:
                if isinstance(ev, Accepted):
                    console.print(f"magnet clock={ev.message.clock}: waiting {wait:g} s")
                else:
                    console.print(f"[yellow]ignored[/yellow]: {ev.reason}")
            try:
                report = member.step(
                    now,
                    timeout=timeout,
                    max_archive_bytes=max_archive_bytes,
                    deadline=fetch_deadline,
                    max_fetch_bytes=max_fetch_bytes,
                )
            except UndecodableArchive as e:  # the same bytes would fail again: a new link only
                console.print(
                    f"[yellow]fetch failed[/yellow]: {e}; waiting for the control node's next link"
                )
                report = None
            except ArchiveError as e:  # no peer in time, a corrupt index: try again later
                again = (
                    f"trying again in {wait:g} s"
                    if member.core.pending()
                    else "waiting for the control node's next link"  # left over the bound
                )
                console.print(f"[yellow]fetch failed[/yellow]: {e}; {again}")
                report = None
            if report is not None:
                line = _report_json(report)
                if report.left:
                    console.print(_left_line(report.left, max_fetch_bytes))
                    if member.core.pending():
                        console.print(f"fetching the same link again in {wait:g} s for them")
                click.echo(json.dumps(line))
                if once:
                    return
            time.sleep(poll)
    except KeyboardInterrupt:
        pass
    finally:
        close()
        store.close()


@command.command(name="ls")
@click.option("--root", type=click.Path(file_okay=False), required=True, help="Archive folder.")
@click.option("--community", help="Community id (default: the only one under --root).")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), help="Store to compare.")
@_layout_opt
def ls(root: str, community: str | None, store_path: str | None, layout: str) -> None:
    """Show index entries: ranges, sizes, pieces, and which archives are local."""
    from loglake.archives.store import MessageStore

    lay = get_layout(layout)
    rootp = Path(root)
    if community is None:
        found = [p.name for p in rootp.iterdir() if p.is_dir() and p.name.startswith("0x")]
        if len(found) != 1:
            raise ArchiveConfigError(f"{len(found)} communities under {root}: give --community")
        community = found[0]
    index_path = rootp / community / "index"
    if not index_path.exists():
        raise ArchiveConfigError(f"no index at {index_path}")
    entries = lay.decode_index(index_path.read_bytes())
    if store_path is None:
        for cand in (rootp / "member.sqlite", rootp / f"{community}.sqlite"):
            if cand.exists():
                store_path = str(cand)
                break
    have = set()
    if store_path:
        s = MessageStore(store_path)
        have = s.archive_ids()
        s.close()
    table = Table(title=f"{community[:18]}… ({layout})")
    for col in ("id", "from", "to", "offset", "size", "pieces", "local"):
        table.add_column(col)
    for e in entries:
        table.add_row(
            e.archive_id[:18] + "…",
            _ts(e.metadata.from_ns),
            _ts(e.metadata.to_ns),
            str(e.offset),
            str(e.size),
            f"{e.first_piece}-{e.first_piece + e.num_pieces - 1}",
            "yes" if e.archive_id in have else "no",
        )
    Console().print(table)


def _report_json(report: Any, pieces: bool = False) -> dict[str, Any]:
    """A fetch report as ``fetch --json`` (with ``pieces``) and ``follow`` print it (``left``
    only when some archives were left: a report otherwise as before)."""
    out: dict[str, Any] = {
        "community": report.community,
        "archives": report.archives,
        "missing": [e.archive_id for e in report.missing],
        "hydrated_messages": report.hydrated_messages,
        "bytes_downloaded": report.bytes_downloaded,
    }
    if pieces:
        out["pieces"] = report.pieces
    if report.left:
        out["left"] = [e.archive_id for e in report.left]
    return out


if __name__ == "__main__":  # pragma: no cover
    command()
