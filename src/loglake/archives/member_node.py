"""Member node adapters: fetch through libtorrent, hydrate the store, follow the channel.

``fetch_archives`` follows status-go manager_archive.go ``DownloadHistoryArchivesByMagnetlink``:
resolve the magnet (20 s, one retry), download ``index`` first, then each missing archive's
pieces, oldest first. It checks more than status-go: every archive region read back must match
the torrent's piece SHA-1s, and it takes at most ``max_fetch_bytes`` of archives (the newest).
The missing archives are hydrated in one transaction, each downloaded, read, verified and
decoded only when its turn comes (one archive on the way and in memory at a time), so bad input
leaves the store unchanged and stops the fetch before the archives after it are downloaded.
``MemberNode`` feeds the special channel to ``member.MemberCore`` and fetches when the core
says so.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from loglake.archives.bt import METADATA_TIMEOUT_S, Fetcher, ProgressFn
from loglake.archives.errors import (
    ArchiveError,
    BadMagnetLink,
    BadMagnetMessage,
    BadRecord,
    CorruptArchive,
    CorruptIndex,
    FetchTooLarge,
    MisalignedArchive,
    UndecodableArchive,
)
from loglake.archives.layout import (
    MAX_FETCHED_ARCHIVE_BYTES,
    MAX_INDEX_BYTES,
    NS,
    DecodedMessage,
    IndexEntry,
    Layout,
)
from loglake.archives.member import (
    FETCH_DEADLINE_S,
    MAX_FETCH_BYTES,
    MEMBER_WAIT_NS,
    Accepted,
    Ignored,
    MemberCore,
    missing_archives,
    refuse_oversized,
    select_within,
    unpack_chunks,
)
from loglake.archives.store import MessageStore
from loglake.streams.api import Streams, warn_gap
from loglake.streams.fence import is_claim
from loglake.structured_logging import log_event

log = logging.getLogger(__name__)


@dataclass
class FetchReport:
    community: str
    archives: int
    missing: list[IndexEntry]
    hydrated_messages: int
    bytes_downloaded: int
    pieces: int
    left: list[IndexEntry] = field(default_factory=list)
    """Missing archives left for a later fetch, older than every one fetched: over
    ``max_fetch_bytes`` with them (``member.select_within``)."""


def fetch_archives(
    magnet: str,
    root: str | Path,
    store: MessageStore,
    layout: Layout,
    community_id: str | None = None,
    timeout: float = METADATA_TIMEOUT_S,
    progress: ProgressFn | None = None,
    on_index: Callable[[list[IndexEntry], list[IndexEntry]], None] | None = None,
    peers: list[tuple[str, int]] | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
    max_archive_bytes: int = MAX_FETCHED_ARCHIVE_BYTES,
    deadline: float | None = FETCH_DEADLINE_S,
    max_fetch_bytes: int = MAX_FETCH_BYTES,
) -> FetchReport:
    """Resolve ``magnet``, fetch ``index`` then the missing archives' pieces (optionally only
    those overlapping ``[since_ns, until_ns)``), hydrate. A missing archive over
    ``max_archive_bytes`` fails the fetch (``ArchiveTooLarge``) before any is downloaded.
    Missing archives over ``max_fetch_bytes`` together: the newest windows that fit are
    fetched, the older ones left (``FetchReport.left``; ``FetchTooLarge`` if the newest window
    does not fit). ``deadline``: seconds the fetch may wait on the network in all
    (``TorrentTimeout`` once they pass; ``timeout`` still bounds the metadata, each archive its
    own 120 s); None: no overall bound. Hydrating what arrived is local work, not counted in
    it.

    An archive whose pieces match the torrent's hashes but do not decode stops the fetch
    (nothing hydrated, the archives after it not downloaded) with ``UndecodableArchive``, and
    its pieces are removed from ``data``: the same bytes would fail again."""
    fetcher = Fetcher(root, deadline=deadline)
    decoding = _Decoding()
    folder: Path | None = None
    undecodable: IndexEntry | None = None
    try:
        info = fetcher.metadata(magnet, timeout=timeout)
        name = info.name()
        if not re.fullmatch(r"0x[0-9a-fA-F]{2,130}", name):  # also keeps paths inside root
            raise CorruptIndex(f"torrent name {name[:40]!r} is not a community id")
        if community_id is not None and name.lower() != community_id.lower():
            raise CorruptIndex(f"torrent is named {name!r}, not the community {community_id}")
        # exactly <name>/data and <name>/index, plain files: the member reads these two paths,
        # so a torrent whose index lay in a subfolder, or was a symlink (libtorrent points one
        # leaving the torrent at itself), made it read a missing file, a loop (ELOOP) or an
        # older fetch's index — untyped, and the member loop stopped on it
        layout_files = fetcher.files()
        if layout_files != [((name, "data"), 0), ((name, "index"), 0)]:
            shown = ", ".join("/".join(parts)[:80] for parts, _ in layout_files[:4])
            raise CorruptIndex(
                f"torrent must hold exactly the plain files {name[:18]}…/data and …/index, "
                f"it holds {len(layout_files)}: {shown}"
            )
        # the index's offsets and sizes count the layout's pieces (IndexEntry.pieces: 100 KiB,
        # status-go manager.go ``pieceLength = 100 * 1024``; the spec leaves it "??? (TODO)").
        # Found from outside: a torrent of 200 KiB pieces made the member ask libtorrent for
        # pieces past the torrent's end (a bare IndexError, and the member loop stopped on it,
        # the link never postponed); of 50 or 16 KiB pieces, for the wrong pieces (a misleading
        # CorruptArchive after a download). Refused here, before a byte is downloaded.
        if fetcher.piece_length() != layout.piece_length:
            raise CorruptIndex(
                f"torrent has {fetcher.piece_length()}-byte pieces, not the "
                f"{layout.piece_length}-byte pieces archives are laid out in"
            )
        idx_off, idx_size = fetcher.file_range("index")
        data_off, data_size = fetcher.file_range("data")
        if data_off != 0 or idx_off != data_size or data_size % layout.piece_length:
            raise CorruptIndex("torrent must hold data (whole pieces) then index")
        if idx_size > MAX_INDEX_BYTES:  # refused before a byte of it is downloaded
            raise CorruptIndex(f"index of {idx_size} bytes: more than {MAX_INDEX_BYTES} bytes")
        index_pieces = fetcher.pieces_of(idx_off, idx_size)
        folder = Path(root) / name
        # the index is fetched again: a retry that found it whole on disk (a fetch stopped
        # after it) added a torrent that held every piece it wanted, which libtorrent (2.1)
        # meets the seeder with as one upload-only peer meets another: it dropped the seeder
        # for good ("upload to upload connection"), and the archives' pieces never came. The
        # archive pieces on disk are kept (libtorrent checks them: they are not fetched again)
        (folder / "index").unlink(missing_ok=True)
        fetcher.start(peers or ())
        fetcher.download(index_pieces, progress=progress)
        with open(folder / "index", "rb") as f:
            index = f.read(idx_size)
        entries = layout.decode_index(index, data_size)
        missing = missing_archives(entries, store.archive_ids(), since_ns, until_ns)
        refuse_oversized(missing, max_archive_bytes)
        missing, left = select_within(missing, max_fetch_bytes)
        if left:
            log_event(
                log,
                logging.WARNING,
                "older archives left over the fetch's bound",
                fetched=len(missing),
                fetched_bytes=sum(e.size for e in missing),
                left=len(left),
                left_bytes=sum(e.size for e in left),
                max_fetch_bytes=max_fetch_bytes,
            )
        if on_index:
            on_index(entries, missing)
        wanted = sorted({p for e in missing for p in e.pieces})
        # downloaded, read, verified and decoded one archive at a time (oldest first, as
        # status-go) inside the hydrate's transaction (a bad one rolls back those before it).
        # Decoded all first, a fetch held every archive in memory at once (8 archives of 2 MB:
        # a 19 MB peak); downloaded all first, a corrupt first archive was found only once
        # every other one was on disk (8 x 128 MiB of zeros: 1 GiB in 15 s, for nothing)
        try:
            hydrated = store.hydrate_many(
                _archives(folder / "data", missing, layout, fetcher, progress, decoding)
            )
        except (CorruptArchive, BadRecord, MisalignedArchive) as e:
            undecodable = decoding.entry
            if undecodable is None:  # not a decoding error of verified bytes
                raise
            raise UndecodableArchive(
                f"{e} (its pieces match the torrent's hashes: removed, and this magnet link is "
                "not fetched again)",
                undecodable.archive_id,
            ) from e
        return FetchReport(
            name,
            len(entries),
            missing,
            hydrated,
            fetcher.downloaded,
            len(wanted) + len(index_pieces),
            left,
        )
    finally:
        fetcher.close()
        if undecodable is not None and folder is not None:
            # after close: libtorrent no longer has the file open for this torrent
            discard_region(folder / "data", undecodable.offset, undecodable.size)


RECENT_EVENTS = 100
"""How many of its last decisions a ``MemberNode`` keeps. It kept every one: 50,000 junk
messages on the special channel, which anyone can post to, held 11 MB in a member that
follows it for good, and the node counted them all again every tick."""


@dataclass
class _Decoding:
    entry: IndexEntry | None = None
    """The archive being decoded, once its bytes matched the torrent's piece hashes; None
    before and after."""


def _archives(
    data: Path,
    missing: list[IndexEntry],
    layout: Layout,
    fetcher: Fetcher,
    progress: ProgressFn | None,
    decoding: _Decoding,
) -> Iterator[tuple[IndexEntry, Iterator[list[DecodedMessage]]]]:
    """Each missing archive's messages in chunks, downloaded and read from ``data`` when asked
    for (so an archive that does not decode stops the fetch before the next is downloaded);
    ``CorruptArchive`` for one whose bytes on disk do not match the torrent's piece hashes.
    The time the caller spends hydrating an archive does not count in the fetch's deadline
    (it is local work; every archive was downloaded before any was hydrated, until the
    archives came one at a time)."""
    f: BinaryIO | None = None
    try:
        for e in missing:
            fetcher.download(e.pieces, progress=progress)
            if f is None:
                f = open(data, "rb")  # noqa: SIM115 (closed below, across the yields)
            local = time.monotonic()
            yield e, _read_archive(f, e, layout, fetcher, decoding)
            decoding.entry = None  # hydrated: the next error is not this archive's
            fetcher.extend_deadline(time.monotonic() - local)
    finally:
        if f is not None:
            f.close()


def _read_archive(
    f: BinaryIO, e: IndexEntry, layout: Layout, fetcher: Fetcher, decoding: _Decoding
) -> Iterator[list[DecodedMessage]]:
    """A function of its own so that the region read is freed once hydrated (the chunks'
    iterator holds it)."""
    f.seek(e.offset)
    region = f.read(e.size)
    if len(region) != e.size or not fetcher.verify(e.offset, region):
        raise CorruptArchive(
            f"archive {e.archive_id[:18]}… on disk does not match the torrent's piece hashes"
        )
    decoding.entry = e
    return unpack_chunks(layout, e, region)


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
"""``fallocate`` mode flags (linux/falloc.h)."""


@functools.cache
def _fallocate() -> Callable[..., int] | None:
    """libc's ``fallocate`` through ``ctypes`` (the standard library binds only
    ``posix_fallocate``, which cannot punch a hole), or None where libc has none."""
    import ctypes

    fn = getattr(ctypes.CDLL(None, use_errno=True), "fallocate", None)
    if fn is None:
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fn.restype = ctypes.c_int
    return fn


def discard_region(path: Path, offset: int, size: int) -> None:
    """Remove the bytes ``[offset, offset + size)`` of ``path`` (as far as the file goes): a
    hole punched where the file system makes one (the disk space is freed), else zeros written
    over them. Either way the pieces there no longer match the torrent's hashes, so libtorrent
    does not count them as had: a later fetch downloads them again if it wants them."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        end = min(offset + size, os.fstat(fd).st_size)
        if end <= offset:
            return
        fn = _fallocate()
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        if fn is not None and fn(fd, mode, offset, end - offset) == 0:
            return
        zeros = bytes(1 << 20)
        pos = offset
        while pos < end:
            pos += os.pwrite(fd, zeros[: min(len(zeros), end - pos)], pos)
    finally:
        os.close(fd)


class MemberNode:
    """Subscribes to the special channel stream and fetches when the core says so."""

    def __init__(
        self,
        root: str | Path,
        store: MessageStore,
        layout: Layout,
        community_id: str,
        wait_ns: int = MEMBER_WAIT_NS,
    ) -> None:
        self.root, self.store, self.layout = Path(root), store, layout
        self.core = MemberCore(community_id.lower(), wait_ns)
        self._state_key = f"member_state:{self.core.community_id}"
        saved = store.get_meta(self._state_key)
        if saved:  # a restart: the pending link (and its quiet period) is not lost
            self.core.restore(json.loads(saved))
        self.events: deque[Accepted | Ignored] = deque(maxlen=RECENT_EVENTS)
        """The last ``RECENT_EVENTS`` decisions on special-channel messages."""
        self.ignored = 0
        """Special-channel messages ignored since this node started (unsigned, foreign, stale,
        not a magnet message): counted, not kept, as anyone can post to the channel."""

    def _state(self) -> dict[str, str]:
        return {self._state_key: json.dumps(self.core.state())}

    def poll(self, streams: Streams, channel: str, now_ns: int) -> list[Accepted | Ignored]:
        """Read new special-channel messages. The position is kept in the member's own store
        (so a read-only view of the channel is enough)."""
        key = f"channel_next_index:{channel}"
        pos = int(self.store.get_meta(key) or 0)
        new = []
        got = streams.pull(channel, pos, 1000)
        warn_gap(log, pos, got, stream=channel)
        for m in got:
            pos = m.index + 1
            if is_claim(m.data):  # a control node taking the channel over (streams.fence)
                continue
            new.append(self.core.on_message(m.data, now_ns))
        # with the read position, in one transaction: a link read is never a link forgotten
        # (kept in memory only, a restart before its fetch lost it until the next week's)
        self.store.set_metas({key: pos, **self._state()})
        self.events.extend(new)
        self.ignored += sum(isinstance(e, Ignored) for e in new)
        return new

    def step(self, now_ns: int, **kw: Any) -> FetchReport | None:
        """Fetch the pending link if its quiet period is over. A fetch that fails (no peer in
        time, a corrupt index) raises, and the link is tried again after another quiet
        period; one that found an archive that does not decode (``UndecodableArchive``: the
        same bytes would fail again) is not tried again, only a new link is.

        A fetch that left older archives over ``max_fetch_bytes`` (``FetchReport.left``) keeps
        the link pending: it is fetched again after another quiet period (``wait_ns``, 20 s by
        default: the seeder is not asked again at once), taking the newest of those left, until
        none is left (``MemberCore.leave``). Each such fetch must leave fewer than the last, or
        the link is done (a warning); one whose newest window left is over the bound alone
        (``FetchTooLarge``) makes the link done too, as the same index and bound would refuse
        it after every quiet period. The control node publishes a link only for a new archive
        or at its start: done after the first fetch, a member caught up a bound per week."""
        magnet = self.core.due(now_ns)
        if magnet is None:
            return None
        try:
            try:
                report = fetch_archives(
                    magnet, self.root, self.store, self.layout, self.core.community_id, **kw
                )
            except BadMagnetLink as e:
                # the link came signed from the control node: its fault, not this member's
                # configuration (an ArchiveConfigError, which the node showed as such)
                raise BadMagnetMessage(
                    f"the control node's signed magnet link is not one libtorrent takes: {e}"
                ) from e
        except UndecodableArchive:
            self.core.refuse(magnet)
            self.store.set_metas(self._state())
            raise
        except FetchTooLarge as e:
            if self.core.left is None:  # the link's first fetch: tried again, as before
                self.core.postpone(now_ns)
                self.store.set_metas(self._state())
                raise
            # a window left by this link's last fetch is over the bound alone: the same
            # index, the same bound, the same refusal after every quiet period
            self.core.done(magnet)
            self.store.set_metas(self._state())
            raise FetchTooLarge(
                f"{e}; the newer windows of this magnet link were fetched, the older ones are "
                "not fetched again with this bound (the next link is fetched as usual)"
            ) from e
        except ArchiveError:
            self.core.postpone(now_ns)
            self.store.set_metas(self._state())
            raise
        if report.left and self.core.leave(magnet, len(report.left), now_ns):
            log_event(
                log,
                logging.INFO,
                "fetching the same link again after the quiet period for the older archives left",
                left=len(report.left),
                wait_s=self.core.wait_ns / NS,
            )
        elif not report.left:
            self.core.done(magnet)
        self.store.set_metas(self._state())
        return report
