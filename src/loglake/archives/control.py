"""The control node: ingest the community stream, build archives, write the torrent folder,
publish the signed magnet link, prune what is archived and older than 30 days.

The protocol decisions live in ``builder.ArchiveBuilder`` (sans-I/O); this module is the adapter
that owns files: ``<root>/<community id>/data`` (append-only), ``<root>/<community id>/index``
(rewritten atomically), ``<root>/<community id>.torrent``. status-go keeps the same folder
layout (manager_archive_file.go: ``archiveDir = DataDir + "/" + communityID``; torrent file in
``TorrentDir``). A crash between appending to ``data`` and writing ``index`` is repaired on the
next start by truncating ``data`` to the end of the last indexed archive, and a torrent file
older than the index is rewritten from it. Every file write goes through ``loglake.log.fs`` (so
the fault and power-loss tests in ``tests/faults`` reach it); a build whose writes fail reloads
the builder from the files and raises the ``OSError``.

Where messages live: the community stream (a loglake ``Log`` stream, one partition) is the
source of truth. The control node copies it into its ``MessageStore``, a working index for
window queries; a build flags the rows it exported; ``prune`` truncates from the *live stream*
the longest prefix whose records are all archived and older than 30 days (spec "Storing live
messages"; ``Log.truncate_before``), then drops the same rows from the store. A message not yet
exported is never truncated and holds the prefix behind it; so ingest refuses one dated more
than ``MAX_FUTURE_NS`` ahead of its clock (as Waku's stores do), which no build could archive
before its date. A message that arrives after its window was archived is never exported
(archives are append-only, a build starts where the last one ended; status-go's builds query
their database by time range from there too): ingest logs and counts it (``late``), and
retention truncates it once it is older than 30 days, as every row of a built window, archived
or not (kept, it held every record after it in the live stream for good). A lost or lagging
store is rebuilt: ingest re-reads the stream from its first index, and rows older than the last
archive are re-flagged by decoding the local archives (a row is archived iff its record is in
one).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from coincurve import PrivateKey

from loglake.archives.builder import (
    MAX_FUTURE_NS,
    RETENTION_NS,
    ArchiveBuilder,
    BuildResult,
    check_topics,
    plan_windows,
)
from loglake.archives.errors import ArchiveConfigError, BadRecord
from loglake.archives.layout import INT64_MAX, IndexEntry, Layout
from loglake.archives.signing import community_id, encode_magnet_message
from loglake.archives.store import MessageStore
from loglake.archives.torrent import PieceHashes, Torrent
from loglake.log import fs
from loglake.streams.api import Streams, warn_gap
from loglake.streams.fence import UNFENCED, Fence
from loglake.structured_logging import log_event

logger = logging.getLogger(__name__)


SKIPPED_KEPT = 100
"""How many skipped records a ``ControlNode`` names. Anyone can post to a community stream, and
the node kept every skipped record's index and reason for as long as it ran (``archives run``,
the node's control loop): junk grew its memory without end."""


@dataclass(frozen=True, slots=True)
class Pruned:
    log_records: int
    """Records truncated from the live community stream."""
    store_rows: int
    """Rows dropped from the working store."""
    kept_from: int | None
    """The stream index the live log now keeps from (None: no live log to truncate)."""


@dataclass(frozen=True, slots=True)
class BuildOutcome:
    new: list[IndexEntry]
    torrent: Torrent | None
    result: BuildResult


class ControlNode:
    def __init__(
        self,
        root: str | Path,
        key: PrivateKey,
        layout: Layout,
        store: MessageStore,
        topics: list[bytes | str] | None = None,
        announce: tuple[str, ...] | None = None,
    ) -> None:
        """``topics``: the community's channel topics, the only ones exported and what every
        archive's metadata lists (spec "Exporting messages for bundling"); None: inferred from
        each window's messages, bounded (``builder.bounded_topics``), with a warning: anyone
        who can post to the stream then picks topics the archives list, up to the bounds.
        ``announce``: the torrent's tracker URLs (None: the layout's default trackers, which
        for status-go are status-go's own ``defaultAnnounceList``; ``()``: none)."""
        self.root = Path(root)
        self.key = key
        self.layout = layout
        self.store = store
        checked = check_topics(topics)  # ArchiveConfigError before any file is touched
        self.topics: list[bytes | str] | None = None if checked is None else list(checked)
        if self.topics is None:
            log_event(
                logger,
                logging.WARNING,
                "no channel topics configured: each archive lists the topics its messages "
                "carry, bounded (configure the community's channel topics: --topic, "
                "[archives] topics)",
            )
        self.community_id = community_id(key)
        self.folder = self.root / self.community_id
        fs.makedirs_durable(self.folder)  # a created folder must not vanish in a crash
        self.data_path = self.folder / "data"
        self.index_path = self.folder / "index"
        self.torrent_path = self.root / f"{self.community_id}.torrent"
        self._reload_due = False
        self.skipped: list[tuple[int, str]] = []
        """(stream index, reason) of the first ``SKIPPED_KEPT`` records ingest skipped as not the
        layout's message; ``skipped_count`` counts them all."""
        self.skipped_count = 0
        self.decoded = 0
        """Records ingest decoded as the layout's message (stored, copies of stored ones, or
        dated in the future)."""
        self.future: list[tuple[int, int]] = []
        """(stream index, timestamp ns) of the first ``SKIPPED_KEPT`` records ingest refused as
        dated more than ``MAX_FUTURE_NS`` ahead of its clock; ``future_count`` counts them
        all."""
        self.future_count = 0
        self.late: list[tuple[int, int]] = []
        """(stream index, timestamp ns) of the first ``SKIPPED_KEPT`` records ingest stored
        after their window was archived (never exported: retention truncates them once older
        than 30 days, unarchived); ``late_count`` counts them all."""
        self.late_count = 0
        self.topic_skipped_count = 0
        """Messages of built windows left out as their topic was past the bounds of an
        archive's metadata (no topics configured: ``builder.bounded_topics``). A build counts
        them; a later build of other windows does not see them again."""
        self.builder = self._load(announce)
        on_disk = {e.archive_id for e in self.builder.entries}
        stored = self.store.archive_ids()
        if lost := stored - on_disk:
            # the store's flags say its rows are archived, and prune would truncate the live
            # stream past them, while no archive on disk holds them any more
            raise ArchiveConfigError(
                f"the store records {len(lost)} archive(s) that {self.folder} does not hold "
                "(the archive folder was lost or replaced): move the store aside, and a new one "
                "is filled from the stream and the archives left"
            )
        self._repair_torrent()
        # how to truncate the live community stream last ingested from (None: nothing yet)
        self._truncate: Callable[[int], int] | None = None
        # a new or lagging store (crash after writing the index): its rows older than the last
        # archive must be re-flagged from the archives themselves
        # (or one whose update failed after a build wrote its files: the store knows fewer
        # archives than the index, though a later build moved its end past them)
        last = self.store.last_archive_end_ns()
        entries = self.builder.entries
        self._reflag_due = bool(entries) and (
            last is None or last < max(e.metadata.to_ns for e in entries) or not on_disk <= stored
        )

    def _repair_torrent(self) -> None:
        """A crash (or a failed write) between replacing ``index`` and the torrent file leaves
        a torrent of the older index: write the one the index gives."""
        if not self.builder.entries:
            return
        want = self.builder.torrent().metainfo()
        have = self.torrent_path.read_bytes() if self.torrent_path.exists() else None
        if have != want:
            log_event(logger, logging.WARNING, "torrent file rewritten from the index")
            fs.replace_file_atomic(self.torrent_path, want)

    def _make_durable(self) -> None:
        """fsync ``index``, ``data`` and their folder before acting on what they hold: after
        a failed folder fsync (a build's rename of ``index``), the files read back may not be
        durable yet, and the store must never record archives a power loss could still take
        (it would then skip their windows). As the log's recovery does with its tail."""
        for path in (self.index_path, self.data_path):
            if path.exists():
                fs.fsync_file(path)
        fs.fsync_dir(self.folder)

    def _load(self, announce: tuple[str, ...] | None) -> ArchiveBuilder:
        self._make_durable()
        entries: list[IndexEntry] = []
        if self.index_path.exists():
            entries = self.layout.decode_index(self.index_path.read_bytes())
        end = entries[-1].offset + entries[-1].size if entries else 0
        hashes = PieceHashes(self.layout.piece_length)
        if self.data_path.exists():
            size = self.data_path.stat().st_size
            if size < end:
                raise ArchiveConfigError(f"{self.data_path} is shorter than its index says")
            if size > end:  # torn build: bytes appended but never indexed
                log_event(logger, logging.WARNING, "truncating unindexed data", extra=size - end)
                fs.truncate(self.data_path, end)
            with open(self.data_path, "rb") as f:
                while chunk := f.read(self.layout.piece_length * 256):
                    hashes.extend(chunk)
        return ArchiveBuilder(
            self.layout,
            self.community_id,
            entries,
            hashes,
            # the store remembers where the last build stopped (including empty windows); the
            # index knows the last archived window even if the store is lost or lags behind a
            # crash: never re-export a window that is already archived
            max(
                (
                    t
                    for t in (
                        self.store.last_archive_end_ns(),
                        max((e.metadata.to_ns for e in entries), default=None),
                    )
                    if t is not None
                ),
                default=None,
            ),
            announce,
        )

    # -- ingest -----------------------------------------------------------------------------
    def ingest_streams(
        self, streams: Streams, stream: str, batch: int = 10_000, now_ns: int | None = None
    ) -> int:
        """Copy new records of the community stream into the store (records that are not the
        layout's WakuMessage, or dated more than ``MAX_FUTURE_NS`` ahead of ``now_ns``, are
        logged and skipped, a copy of a stored record is not stored: ``MessageStore.add``);
        returns how many were stored; stored records dated in an archived window are logged
        and counted (``late``). ``now_ns``: the clock records are received by (None: the
        system's; not a build's ``now``, which may be in the past). ``prune`` truncates
        ``stream`` through ``streams`` (an embedded log can: ``LocalStreams(log)``; a remote
        stream service cannot, and ``prune`` says so)."""
        self._truncate = partial(streams.truncate_before, stream, partition=0)
        latest = (time.time_ns() if now_ns is None else now_ns) + MAX_FUTURE_NS
        pos = int(self.store.get_meta("ingest_next_index") or 0)
        after = self.store.last_rowid()
        total = 0
        while True:
            msgs = streams.pull(stream, pos, batch)
            if not msgs:
                break
            warn_gap(logger, pos, msgs, stream=stream)
            total += self._ingest([(m.index, m.data) for m in msgs], msgs[-1].index + 1, latest)
            pos = msgs[-1].index + 1
        self._reflag()
        if total:
            self._count_late(after)
        return total

    def _count_late(self, after_rowid: int) -> None:
        """Log and count the rows stored after ``after_rowid`` (this ingest's) that are dated
        in a window already archived and are not in an archive (after ``_reflag``: a rebuilt
        store's rows that are, are flagged): no build exports them. A copy of a stored record
        is not stored, so one re-sent after its window was archived is not counted."""
        end = self.builder.end_ns
        if end is None:
            return
        count, first = self.store.late_rows(
            after_rowid, end, self.topics, self.layout.max_archive_bytes, SKIPPED_KEPT
        )
        if not count:
            return
        log_event(
            logger,
            logging.WARNING,
            "records arrived after their window was archived: never archived",
            count=count,
            first_index=first[0][0],
            first_timestamp_ns=first[0][1],
            archived_until_ns=end,
        )
        self.late_count += count
        self.late.extend(first[: SKIPPED_KEPT - len(self.late)])

    def _ingest(self, recs: list[tuple[int, bytes]], next_index: int, latest_ns: int) -> int:
        """Store the records dated up to ``latest_ns``; skip (log, count) the others."""
        good, idxs = [], []
        for idx, raw in recs:
            try:
                msg = self.layout.decode_record(raw)
            except BadRecord as e:
                log_event(logger, logging.WARNING, "skipping record", index=idx, reason=str(e))
                self.skipped_count += 1
                if len(self.skipped) < SKIPPED_KEPT:
                    self.skipped.append((idx, str(e)))
                continue
            self.decoded += 1
            if msg.timestamp_ns > latest_ns:
                log_event(
                    logger,
                    logging.WARNING,
                    "refusing record dated in the future",
                    index=idx,
                    timestamp_ns=msg.timestamp_ns,
                    latest_ns=latest_ns,
                )
                self.future_count += 1
                if len(self.future) < SKIPPED_KEPT:
                    self.future.append((idx, msg.timestamp_ns))
                continue
            good.append(msg)
            idxs.append(idx)
        return self.store.add(good, next_index, idxs)

    def _reflag(self) -> None:
        """Rebuild the store's ``archived`` flags from the local archives (once, after the
        first ingest into a new or lagging store): a row older than the last archive's end is
        archived iff its record is in an archive. Holds every archived record in memory.
        ``decode_archive`` gives records back as protobuf writes them: a row whose bytes are
        not among them is looked for as it would come back (``Layout.as_decoded``), or a
        record in valid but other protobuf bytes was never flagged again, and held the
        live log from truncation for good."""
        if not self._reflag_due:
            return
        self._reflag_due = False
        entries = self.builder.entries
        end = max(e.metadata.to_ns for e in entries)
        rows = self.store.rows_before(end)
        if rows:
            archived: set[bytes] = set()
            with open(self.data_path, "rb") as f:
                for e in entries:
                    f.seek(e.offset)
                    archived.update(self.layout.decode_archive(f.read(e.size), e))
            again = self.layout.as_decoded
            self.store.flag_archived(
                [rid for rid, raw in rows if raw in archived or again(raw) in archived]
            )
        self.store.record_archives(entries, self.builder.end_ns)
        log_event(logger, logging.INFO, "store re-flagged from archives", rows=len(rows))

    # -- build ------------------------------------------------------------------------------
    def build(
        self, now_ns: int, partial: bool = False, period_ns: int | None = None
    ) -> BuildOutcome:
        if not 0 <= now_ns <= INT64_MAX:
            # windows are planned one at a time up to now: 1e22 ns took 2.8 GB and 9 s before
            # failing untyped, and every time the store and the index keep is int64 ns
            raise ArchiveConfigError(f"now_ns {now_ns} is outside 0..{INT64_MAX} (1970..2262)")
        if self._reload_due:  # a failed build could not reload the builder from the files
            self.builder = self._load(self.builder.announce)
            self._reload_due = False
        start = self.builder.end_ns
        if start is None:
            start = self.store.oldest_ns()
        if start is None:
            return BuildOutcome([], None, BuildResult([], b"", None, None))
        kw = {} if period_ns is None else {"period_ns": period_ns}
        windows = plan_windows(
            start, now_ns, partial=partial, unit_ns=self.layout.time_unit_ns, **kw
        )
        if not windows:
            return BuildOutcome([], self._current_torrent(), BuildResult([], b"", None, start))
        msgs = self.store.decoded(windows[0][0], windows[-1][1])
        before = len(self.builder.entries)
        result = self.builder.build(windows, msgs, self.topics, presorted=True)
        assert result.end_ns is not None  # set by every window built
        if result.archives:
            try:
                self._append_data(result)
                # temporary file, fsync, rename, folder fsync: a crash leaves the old or the
                # new index (and torrent), and the folder fsync also makes a new ``data``
                # entry durable
                fs.replace_file_atomic(self.index_path, result.index)
                assert result.torrent is not None  # a build with archives has a torrent
                fs.replace_file_atomic(self.torrent_path, result.torrent.metainfo())
            except OSError:
                # The builder is ahead of the files (a full disk, a failed fsync): forget it
                # and start again from what the files hold (unindexed data is cut off), so
                # the next build, once the fault clears, redoes these windows. A failed fsync
                # is not retried: the data is written again by that next build. If even the
                # reload fails (the fault persists), the next build reloads first.
                try:
                    self.builder = self._load(self.builder.announce)
                except OSError:
                    self._reload_due = True
                raise
        new = self.builder.entries[before:]
        if result.topic_skipped:
            log_event(
                logger,
                logging.WARNING,
                "records on topics past the archive metadata's bounds: not archived",
                count=result.topic_skipped,
                topics=[repr(t) for t in result.topic_sample],
            )
            self.topic_skipped_count += result.topic_skipped
        # the rows this build exported (its windows, its topics, status-go's size cap); with
        # no topics configured, those ``bounded_topics`` left out too: the store's filter has
        # no per-window topics, and what prune and ``late`` do with a row of a built window
        # does not depend on it (it is in an archive or never will be)
        try:
            self.store.record_archives(
                new,
                result.end_ns,
                exported=(windows[0][0], result.end_ns),
                topics=self.topics,
                max_cap=self.layout.max_archive_bytes,
            )
        except BaseException:
            # the files hold these archives, the store does not know: the next ingest
            # re-flags its rows from the archives (the next build went on past them, and a
            # restart saw no store lagging the index: they were never flagged, never pruned)
            self._reflag_due = True
            raise
        log_event(
            logger,
            logging.INFO,
            "archives built",
            community=self.community_id,
            new=len(new),
            windows=len(windows),
            data_bytes=self.builder.data_size,
        )
        return BuildOutcome(new, result.torrent or self._current_torrent(), result)

    def _append_data(self, result: BuildResult) -> None:
        """Append the new archives to ``data`` through ``loglake.log.fs`` (the file layer the
        fault and power-loss tests replace) and fsync it. One write per archive (at most the
        layout's archive cap): joining an archive's many small parts is one copy in C."""
        fd = fs.open(self.data_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for a in result.archives:
                fs.write_all(fd, b"".join(a.parts))
                if a.trailing_zeros:
                    fs.write_all(fd, bytes(a.trailing_zeros))
            fs.fsync(fd)
        finally:
            fs.close(fd)

    def _current_torrent(self) -> Torrent | None:
        return self.builder.torrent() if self.builder.entries else None

    @property
    def entries(self) -> list[IndexEntry]:
        return list(self.builder.entries)

    def torrent(self) -> Torrent:
        t = self._current_torrent()
        if t is None:
            raise ArchiveConfigError(f"community {self.community_id} has no archives yet")
        return t

    def magnet(self, peers: tuple[str, ...] = ()) -> str:
        return self.torrent().magnet(self.community_id, peers)

    # -- publish ----------------------------------------------------------------------------
    def magnet_message(self, clock: int, peers: tuple[str, ...] = ()) -> bytes:
        return encode_magnet_message(clock, self.magnet(peers), self.key)

    def publish_magnet(
        self,
        streams: Streams,
        channel: str,
        clock: int,
        peers: tuple[str, ...] = (),
        fence: Fence = UNFENCED,
    ) -> int:
        """Push the signed ``ApplicationMetadataMessage`` to the special channel stream;
        through ``fence`` when several nodes share the cluster and one of them at a time is
        the control node (a former one's push is refused, ``streams.fence``)."""
        streams.create_stream(channel)
        return fence.append(streams, channel, [self.magnet_message(clock, peers)])[0]

    # -- retention --------------------------------------------------------------------------
    def prune(self, now_ns: int) -> Pruned:
        """Spec "Storing live messages": remove messages older than 30 days, but only those
        already turned into archives. Truncates the live community stream (the one last
        ingested from a ``Log`` or ``LocalStreams``) before the first record that is not older
        than 30 days and in an archived window, then drops the rows older than that from the
        store. A row of an archived window is in an archive or never will be (it arrived
        after the window was archived, ``late``; or a build leaves it out: another topic,
        over the size cap): held, it held the live stream for good. (While the store's flags
        lag the archives, ``_reflag`` due, its unflagged rows of built windows are in the
        archives on disk or late.) Only while the builder's end is past windows no file holds
        (a failed build whose reload failed too: the next build redoes them) do unflagged rows
        stay."""
        end = self.builder.end_ns
        if end is None:
            return Pruned(0, 0, None)
        cutoff = min(now_ns - RETENTION_NS, end)
        archived_only = self._reload_due
        dropped, kept_from = 0, None
        if self._truncate is not None:
            ingested = int(self.store.get_meta("ingest_next_index") or 0)
            kept_from = self.store.removable_before(cutoff, ingested, archived_only)
            try:
                dropped = self._truncate(kept_from)
            except NotImplementedError as e:  # a backend without truncation: keep everything
                log_event(logger, logging.WARNING, "live log not truncated", reason=str(e))
                kept_from = None
        else:
            log_event(logger, logging.WARNING, "no live log to truncate (nothing ingested yet)")
        rows = self.store.prune(cutoff, archived_only)
        log_event(logger, logging.INFO, "pruned", log_records=dropped, store_rows=rows)
        return Pruned(dropped, rows, kept_from)
