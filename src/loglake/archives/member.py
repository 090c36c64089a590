"""The member node: listen on the special channel, wait, fetch the archives it lacks, hydrate.

``MemberCore`` is the protocol core, sans-I/O (bytes and a clock in, decisions out), following
specs/status-community-history-archives.txt "Canonical message histories" (ignore anything not
signed by the control node), "Downloading message archives" (wait 20 s after the last magnet
message, then fetch the index, find missing archives by their keccak-256 ids) and "Storing
historical messages" (replace the archive's time range). status-go's member flow is
manager_archive.go ``DownloadHistoryArchivesByMagnetlink``: 20 s for metadata, the ``index``
file first, then each missing archive's pieces, oldest first; a magnet link with a clock not
newer than the last one seen is ignored (messenger_communities.go).

The I/O adapters (libtorrent, files, a ``Streams`` channel) are in ``member_node.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from loglake.archives.errors import (
    ArchiveTooLarge,
    BadMagnetMessage,
    CorruptArchive,
    FetchTooLarge,
)
from loglake.archives.layout import NS, DecodedMessage, IndexEntry, Layout
from loglake.archives.signing import MagnetLinkMessage, decode_magnet_message
from loglake.structured_logging import log_event

logger = logging.getLogger(__name__)

MEMBER_WAIT_NS = 20 * NS
"""Spec "Downloading message archives": members MUST wait 20 seconds after the last
CommunityMessageArchive before fetching the index."""

FETCH_DEADLINE_S = 600.0
"""How long a whole fetch may wait on the network (metadata, index, every archive), by default.
status-go bounds only the metadata (20 s) and cancels a download when asked; here each archive
had 120 s, and 30 s without a piece, so a seeder that trickles a piece every 29 s held a member
N x 120 s for N archives (its loop stuck in that fetch). Ten minutes move gigabytes on a LAN;
a fetch cut short keeps the pieces it got, and the next one (the member's retry) starts from
them."""

MAX_FETCH_BYTES = 1 << 30
"""How many bytes of archives one fetch downloads at most, by default (``fetch_archives``'
``max_fetch_bytes``, ``--max-fetch-bytes``): 1 GiB, eight archives at the per-archive bound
(``MAX_FETCHED_ARCHIVE_BYTES``). Neither the spec nor status-go bounds the total (status-go's
member downloads every missing archive). Found from outside: each archive was bounded, not their
sum, so a signed index of 8 archives of 128 MiB had the member write 1 GiB in 15 s (the 32 MiB
index bound admits ~47,000 archives). Over the bound, a fetch takes the newest windows that fit
and leaves the older ones (``select_within``)."""


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
    last_fetched: str | None = None
    """status-go's ``lastSeenMagnetlink``: the link whose download finished last."""
    refused: str | None = None
    """The link whose fetch found an archive that does not decode, its pieces matching the
    torrent's hashes (``UndecodableArchive``): the same bytes fail again, so it is not fetched
    again, nor taken when sent again; a new link is."""
    left: int | None = None
    """How many missing archives the last fetch of the pending link left over the fetch's bound
    (``FetchReport.left``; ``leave``); None before a fetch of it left any."""

    def on_message(self, raw: bytes, now_ns: int) -> Accepted | Ignored:
        try:
            msg = decode_magnet_message(raw, self.community_id)
        except BadMagnetMessage as e:
            log_event(logger, logging.WARNING, "ignoring special-channel message", reason=str(e))
            return Ignored(str(e))
        # status-go takes a link whose clock is not older than the last one (``clock >=
        # lastClock``, messenger_communities.go) unless it is the one last fetched: a control
        # node that rebuilt its torrent within one clock tick (ms) publishes a new link under
        # the same clock, and that link must not be lost
        if msg.clock < self.last_clock:
            return Ignored(f"clock {msg.clock} is older than {self.last_clock}")
        if msg.magnet_uri == self.last_fetched:
            return Ignored("magnet link already fetched")
        if msg.magnet_uri == self.refused:
            return Ignored("magnet link whose archive does not decode")
        if msg.clock == self.last_clock and msg.magnet_uri == self.magnet:
            # a repeat of the pending link (status-go restarts its download for it; here the
            # fetch it asks for is pending already, and the quiet period is not restarted)
            return Ignored("the same magnet link again")
        if msg.magnet_uri != self.magnet:
            self.left = None  # counted for the pending link: a new one starts afresh
        self.last_clock, self.magnet, self.last_at_ns = msg.clock, msg.magnet_uri, now_ns
        return Accepted(msg)

    def due(self, now_ns: int) -> str | None:
        """The magnet to fetch now, if the quiet period after the last one has passed."""
        if self.magnet is None or self.last_at_ns is None:
            return None
        if self.magnet in (self.last_fetched, self.refused):
            return None
        return self.magnet if now_ns - self.last_at_ns >= self.wait_ns else None

    def pending(self) -> bool:
        """A link waits to be fetched (now or after its quiet period)."""
        return self.magnet is not None and self.magnet not in (self.last_fetched, self.refused)

    def done(self, magnet: str) -> None:
        self.fetched.add(magnet)
        self.last_fetched = magnet
        self.left = None

    def leave(self, magnet: str, left: int, now_ns: int) -> bool:
        """A fetch of ``magnet`` left ``left`` older archives over its bound: keep the link
        pending and fetch it again after another quiet period (the pause keeps a member from
        asking the seeder again at once), which takes the newest of them. True if so; False
        (the link done, a warning logged) if this fetch left as many as the last one of this
        link, or more: no progress, so the same fetch would come again and again. (The control
        node publishes a link only when it builds a new archive, weekly, or starts: a link done
        after its first fetch had a member behind by more than the bound catch up a bound per
        week.)"""
        if self.left is not None and left >= self.left:
            log_event(
                logger,
                logging.WARNING,
                "a fetch of the same link left as many older archives as the last: not fetched "
                "again, the next link is",
                left=left,
                before=self.left,
            )
            self.done(magnet)
            return False
        self.left = left
        self.postpone(now_ns)
        return True

    def postpone(self, now_ns: int) -> None:
        """The fetch of the pending magnet failed: try it again after another quiet period."""
        if self.magnet is not None:
            self.last_at_ns = now_ns

    def refuse(self, magnet: str) -> None:
        """The fetch of ``magnet`` found an archive that does not decode (its bytes those the
        torrent names): not tried again after the quiet period, as a timeout is, since the same
        bytes would fail again; only a new link is fetched."""
        self.refused = magnet

    STATE_FIELDS = ("last_clock", "magnet", "last_at_ns", "last_fetched", "refused", "left")

    def state(self) -> dict[str, Any]:
        """What a member must keep across a restart: the pending link and when it came, the
        newest clock (an older signed link replayed later stays refused), the link fetched
        last, the link refused, how many archives its last fetch left."""
        return {k: getattr(self, k) for k in self.STATE_FIELDS}

    def restore(self, state: Mapping[str, Any]) -> None:
        for k in self.STATE_FIELDS:
            if k in state:
                setattr(self, k, state[k])


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


def refuse_oversized(missing: list[IndexEntry], max_bytes: int) -> None:
    """``ArchiveTooLarge`` for the first of the ``missing`` archives larger than ``max_bytes``:
    checked on the index, before any archive is downloaded, and all of them, as any bad archive
    fails the fetch whole (one hydrate transaction)."""
    for e in missing:
        if e.size > max_bytes:
            raise ArchiveTooLarge(
                f"archive {e.archive_id[:18]}… is {e.size} bytes (padding {e.padding}): more than "
                f"the {max_bytes} bytes this member takes (--max-archive-bytes)"
            )


def select_within(
    missing: list[IndexEntry], max_bytes: int
) -> tuple[list[IndexEntry], list[IndexEntry]]:
    """The ``missing`` archives (oldest first) one fetch takes within ``max_bytes`` in all, and
    those it leaves: the newest windows whose archives fit together, whole windows only (the
    several archives status-go makes of one window over 30 MB come together, or the window's
    live messages would be replaced by part of its archives), and no window older than one
    left (the history hydrated has no gap). A later fetch finds the older ones missing and
    takes the newest of them: a member behind by more than the bound catches up a bound per
    fetch, newest first (what the spec's options 2 and 3 want: "Download only the latest
    archive", "archives of a specific time range"). ``MemberNode`` fetches the same link again
    after the quiet period while a fetch leaves some (``MemberCore.leave``).

    Why not refuse the fetch: an honest community whose history is over the bound would give a
    new member nothing, on every link, until its operator raised the bound; a hostile index
    gets ``max_bytes`` downloaded either way. ``FetchTooLarge`` when not even the newest
    window fits."""
    # grouped by window, not by adjacency: the list is sorted by (from, offset), so a signed
    # index whose windows share a ``from`` and interleave by offset (A1, B, A2) had window A
    # split, its newest archive taken without the other
    windows: dict[tuple[int, int], list[IndexEntry]] = {}
    for e in missing:
        windows.setdefault((e.metadata.from_ns, e.metadata.to_ns), []).append(e)
    taken: set[tuple[int, int]] = set()
    total = 0
    for key in sorted(windows, reverse=True):  # newest first
        size = sum(e.size for e in windows[key])
        if total + size > max_bytes:
            if not taken:
                raise FetchTooLarge(
                    f"the newest window's {len(windows[key])} missing archive(s) are {size} bytes: "
                    f"more than the {max_bytes} bytes this member fetches at once "
                    "(--max-fetch-bytes)"
                )
            break
        taken.add(key)
        total += size
    take = [e for e in missing if (e.metadata.from_ns, e.metadata.to_ns) in taken]
    left = [e for e in missing if (e.metadata.from_ns, e.metadata.to_ns) not in taken]
    return take, left


def unpack(layout: Layout, entry: IndexEntry, region: bytes) -> list[DecodedMessage]:
    """The archive's messages, all at once (``unpack_chunks`` joined)."""
    return [x for chunk in unpack_chunks(layout, entry, region) for x in chunk]


def unpack_chunks(
    layout: Layout, entry: IndexEntry, region: bytes
) -> Iterator[list[DecodedMessage]]:
    """The archive's messages a chunk at a time (``Layout.archive_records``), what a member
    hydrates: ``max_archive_bytes`` did not bound its memory while an archive was decoded
    whole (found from outside: 58-66x the archive at the peak for the smallest messages).

    The errors are those of decoding it whole, and the same one for the same archive: a
    malformed archive is refused by this call, before any chunk; then a record that is not
    one (``BadRecord``) is raised when its chunk comes, and a message outside the archive's
    time range once every record decoded (so an archive holding both gives ``BadRecord``, as
    before). A caller hydrating the chunks does so in one transaction, which the error rolls
    back."""
    chunks = layout.archive_records(region, entry)
    return _decoded(layout, entry, chunks)


def _decoded(
    layout: Layout, entry: IndexEntry, chunks: Iterator[list[bytes]]
) -> Iterator[list[DecodedMessage]]:
    m = entry.metadata
    outside = False
    for records in chunks:
        msgs = [layout.decode_record(r) for r in records]
        # [from, to), as status-go selects an archive's messages (GetWakuMessagesByFilterTopic:
        # timestamp >= from AND timestamp < to) and as hydration replaces them: a message at
        # ``to`` would belong to no archive's window, and be deleted by the next one's
        outside = outside or not all(m.from_ns <= x.timestamp_ns < m.to_ns for x in msgs)
        if not outside:
            yield msgs
    if outside:
        raise CorruptArchive(
            f"archive {entry.archive_id[:18]}… holds a message outside its time range"
        )
