"""The member node: listen on the special channel, wait, fetch the archives it lacks, hydrate.

``MemberCore`` is the protocol core, sans-I/O (bytes and a clock in, decisions out), following
specs/status-community-history-archives.txt "Canonical message histories" (ignore anything not
signed by the control node), "Downloading message archives" (wait 20 s after the last magnet
message, then fetch the index, find missing archives by their keccak-256 ids) and "Storing
historical messages" (replace the archive's time range). status-go's member flow is
manager_archive.go ``DownloadHistoryArchivesByMagnetlink``: 20 s for metadata, the ``index``
file first, then each missing archive's pieces, oldest first; a magnet link with a clock not
newer than the last one seen is ignored (messenger_communities.go).

``fetch_archives`` and ``MemberNode`` are the I/O adapters (libtorrent, files, a ``Streams``
channel). Nothing is written to the store until every missing archive is downloaded and decoded;
then all are hydrated in one transaction, so bad input leaves the store unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loglake.archives.bt import METADATA_TIMEOUT_S, Fetcher, ProgressFn
from loglake.archives.errors import (
    BadMagnetMessage,
    CorruptArchive,
    CorruptIndex,
)
from loglake.archives.layout import NS, DecodedMessage, IndexEntry, Layout
from loglake.archives.signing import MagnetLinkMessage, decode_magnet_message
from loglake.archives.store import MessageStore
from loglake.logs import log_event
from loglake.streams.api import Streams

logger = logging.getLogger(__name__)

MEMBER_WAIT_NS = 20 * NS
"""Spec "Downloading message archives": members MUST wait 20 seconds after the last
CommunityMessageArchive before fetching the index."""


@dataclass(frozen=True, slots=True)
class Accepted:
    message: MagnetLinkMessage


@dataclass(frozen=True, slots=True)
class Ignored:
    reason: str


@dataclass
class MemberCore:
    community_id: str
    wait_ns: int = MEMBER_WAIT_NS
    last_clock: int = -1
    magnet: str | None = None
    last_at_ns: int | None = None
    fetched: set[str] = field(default_factory=set)

    def on_message(self, raw: bytes, now_ns: int) -> Accepted | Ignored:
        try:
            msg = decode_magnet_message(raw, self.community_id)
        except BadMagnetMessage as e:
            log_event(logger, logging.WARNING, "ignoring special-channel message", reason=str(e))
            return Ignored(str(e))
        if msg.clock <= self.last_clock:
            return Ignored(f"clock {msg.clock} is not newer than {self.last_clock}")
        self.last_clock, self.magnet, self.last_at_ns = msg.clock, msg.magnet_uri, now_ns
        return Accepted(msg)

    def due(self, now_ns: int) -> str | None:
        """The magnet to fetch now, if the quiet period after the last one has passed."""
        if self.magnet is None or self.magnet in self.fetched or self.last_at_ns is None:
            return None
        return self.magnet if now_ns - self.last_at_ns >= self.wait_ns else None

    def done(self, magnet: str) -> None:
        self.fetched.add(magnet)


def missing_archives(
    entries: list[IndexEntry],
    have: set[str],
    since_ns: int | None = None,
    until_ns: int | None = None,
) -> list[IndexEntry]:
    """Archives not stored locally, oldest first (status-go sorts by ``metadata.from``).

    ``since_ns``/``until_ns`` select the spec's option 3, "Download specific archives": only
    archives whose ``[from, to)`` overlaps ``[since, until)``."""
    return sorted(
        (
            e
            for e in entries
            if e.archive_id not in have
            and (since_ns is None or e.metadata.to_ns > since_ns)
            and (until_ns is None or e.metadata.from_ns < until_ns)
        ),
        key=lambda e: (e.metadata.from_ns, e.offset),
    )


def unpack(layout: Layout, entry: IndexEntry, region: bytes) -> list[DecodedMessage]:
    msgs = [layout.decode_record(r) for r in layout.decode_archive(region, entry)]
    m = entry.metadata
    for x in msgs:
        if not m.from_ns <= x.timestamp_ns < m.to_ns + (NS if layout.name == "status-go" else 1):
            raise CorruptArchive(
                f"archive {entry.archive_id[:18]}… holds a message outside its time range"
            )
    return msgs


@dataclass
class FetchReport:
    community: str
    archives: int
    missing: list[IndexEntry]
    hydrated_messages: int
    bytes_downloaded: int
    pieces: int


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
) -> FetchReport:
    """Resolve ``magnet``, fetch ``index`` then the missing archives' pieces (optionally only
    those overlapping ``[since_ns, until_ns)``), hydrate."""
    fetcher = Fetcher(root)
    try:
        info = fetcher.metadata(magnet, timeout=timeout)
        name = info.name()
        if community_id is not None and name.lower() != community_id.lower():
            raise CorruptIndex(f"torrent is named {name!r}, not the community {community_id}")
        fetcher.start(peers or ())
        idx_off, idx_size = fetcher.file_range("index")
        data_off, data_size = fetcher.file_range("data")
        if data_off != 0 or idx_off != data_size or data_size % layout.piece_length:
            raise CorruptIndex("torrent must hold data (whole pieces) then index")
        index_pieces = fetcher.pieces_of(idx_off, idx_size)
        fetcher.download(index_pieces, progress=progress)
        folder = Path(root) / name
        index = (folder / "index").read_bytes()
        entries = layout.decode_index(index, data_size)
        missing = missing_archives(entries, store.archive_ids(), since_ns, until_ns)
        if on_index:
            on_index(entries, missing)
        wanted = sorted({p for e in missing for p in e.pieces})
        for e in missing:  # oldest first, as status-go
            fetcher.download(e.pieces, progress=progress)
        unpacked: list[tuple[IndexEntry, list[DecodedMessage]]] = []
        if missing:
            with open(folder / "data", "rb") as f:
                for e in missing:
                    f.seek(e.offset)
                    region = f.read(e.size)
                    if len(region) != e.size or not fetcher.verify(e.offset, region):
                        raise CorruptArchive(
                            f"archive {e.archive_id[:18]}… on disk does not match the "
                            "torrent's piece hashes"
                        )
                    unpacked.append((e, unpack(layout, e, region)))
        hydrated = store.hydrate_many(unpacked)
        return FetchReport(
            name,
            len(entries),
            missing,
            hydrated,
            fetcher.downloaded,
            len(wanted) + len(index_pieces),
        )
    finally:
        fetcher.close()


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
        self.events: list[Accepted | Ignored] = []

    def poll(self, streams: Streams, channel: str, now_ns: int) -> list[Accepted | Ignored]:
        """Read new special-channel messages. The position is kept in the member's own store
        (so a read-only view of the channel is enough)."""
        key = f"channel_next_index:{channel}"
        pos = int(self.store.get_meta(key) or 0)
        new = []
        for m in streams.pull(channel, pos, 1000):
            new.append(self.core.on_message(m.data, now_ns))
            pos = m.index + 1
        self.store.set_meta(key, pos)
        self.events += new
        return new

    def step(self, now_ns: int, **kw) -> FetchReport | None:
        magnet = self.core.due(now_ns)
        if magnet is None:
            return None
        report = fetch_archives(
            magnet, self.root, self.store, self.layout, self.core.community_id, **kw
        )
        self.core.done(magnet)
        return report
