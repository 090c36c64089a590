"""The archive builder: the control node's protocol core, sans-I/O.

Messages in, archive bytes + index + torrent out; no files, sockets or clocks (the caller passes
``now``). Follows specs/status-community-history-archives.txt "Serving community history
archives" (steps 6-8), "Serving archives for missed messages" (one archive per missed 7-day
window, in order) and "Ensuring reproducible data pieces" (``data`` is append-only and every
archive fills whole pieces), with status-go's window rules (manager_archive.go
``GetHistoryArchivePartitionStartTimestamp``, manager_archive_file.go
``createHistoryArchiveTorrent``): windows count from the end of the last archive, or from the
oldest stored message; a window is ``[from, to)``; a window without messages yields no archive
but is still consumed.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from loglake.archives.errors import ArchiveConfigError
from loglake.archives.layout import (
    NS,
    ArchiveMetadata,
    EncodedArchive,
    IndexEntry,
    Layout,
)
from loglake.archives.messages import MessageRow
from loglake.archives.torrent import PieceHashes, Torrent, build_torrent, check_trackers

WINDOW_NS = 7 * 24 * 3600 * NS
"""Spec "Overview" step 6 and status-go's archive interval: 7 days."""

RETENTION_NS = 30 * 24 * 3600 * NS
"""Spec "Requirements / Assumptions": the storage time range limit is 30 days."""

MAX_FUTURE_NS = 20 * NS
"""How far ahead of the control node's clock a message may be dated when it is ingested; one
dated further ahead is refused, as a record that is not the layout's message is. The Waku store
nodes the spec relies on refuse it the same way: go-waku's ``MaxTimeVariance`` (20 s), which
status-go's own store applies too (wakuv2/persistence/dbstore.go ``Validate``:
``ErrFutureMessage`` past the receiver's time + 20 s). Why refuse and not keep: an archive's
window must hold its messages' own timestamps (a member refuses one that does not, and the
record's bytes are what the archive carries), so a message of the year 2200 can only be
archived in 2200; kept, it held every record after it in the live stream until then, and
retention stopped (one such record in 71: one record truncated)."""


MAX_TOPIC_BYTES = 256
"""The longest content topic an archive's metadata lists (UTF-8 bytes for the spec layout's
strings). Neither the spec nor status-go bounds it, and every archive's metadata repeats its
topics in the append-only index: found from outside, 600 posts on distinct 60 KB topics made an
index of 36 MB, past ``MAX_INDEX_BYTES``, which every member then refused for good. status-go's
topics are 4 bytes (``types.TopicType``); Waku content topics
(``/{application}/{version}/{name}/{encoding}``, spec "special channel") are tens of bytes."""

MAX_ARCHIVE_TOPICS = 100
"""The most content topics one archive's metadata lists (spec: "all community channel topics").
With ``MAX_TOPIC_BYTES`` an index entry stays about 26 KB (26,006 bytes, measured), so
``MAX_INDEX_BYTES`` holds 1,290 entries even when every topic is a stranger's (no topics
configured): 24 years of weekly archives, or, in the status-go layout (an entry per chunk of
30,000,000 bytes of payload + signatures), 39 GB of posts; a community's channels are far fewer
(status-go: one topic a chat, plus the community's own)."""


def topic_size(topic: bytes | str) -> int:
    """A topic's size in the metadata: its bytes (status-go) or its UTF-8 bytes (spec)."""
    return len(topic.encode("utf-8", "surrogatepass")) if isinstance(topic, str) else len(topic)


MAX_CONFIGURED_TOPICS_BYTES = MAX_ARCHIVE_TOPICS * MAX_TOPIC_BYTES
"""The most bytes of configured channel topics (all together): the same room in an index entry
as ``MAX_ARCHIVE_TOPICS`` topics of ``MAX_TOPIC_BYTES``. Why bytes, not a count: a community
with more than 100 chats is real, and status-go's topics are 4 bytes (6,400 of them fit)."""


def check_topics(topics: Iterable[bytes | str] | None) -> tuple[bytes | str, ...] | None:
    """The community's channel topics as configured (``--topic``, ``[archives] topics``), held
    to the bounds every archive's metadata keeps (``MAX_TOPIC_BYTES`` each,
    ``MAX_CONFIGURED_TOPICS_BYTES`` in all): a list past them made every archive's index entry
    that big. None stays None (no topics configured: ``ArchiveBuilder.build`` infers them,
    bounded)."""
    if topics is None:
        return None
    out = tuple(topics)
    for t in out:
        if topic_size(t) > MAX_TOPIC_BYTES:
            raise ArchiveConfigError(
                f"channel topic {str(t)[:40]!r}… is {topic_size(t)} bytes: at most "
                f"{MAX_TOPIC_BYTES}"
            )
    total = sum(map(topic_size, out))
    if total > MAX_CONFIGURED_TOPICS_BYTES:
        raise ArchiveConfigError(
            f"{len(out)} channel topics of {total:,} bytes in all: an archive lists at most "
            f"{MAX_CONFIGURED_TOPICS_BYTES:,} bytes of topics"
        )
    return out


def topics_within_bounds(seen: Collection[bytes | str]) -> bool:
    """Whether a window's topics (no topics configured) are all listed as they are: at most
    ``MAX_ARCHIVE_TOPICS`` of at most ``MAX_TOPIC_BYTES`` (else ``bounded_topics`` picks)."""
    return len(seen) <= MAX_ARCHIVE_TOPICS and all(topic_size(t) <= MAX_TOPIC_BYTES for t in seen)


def bounded_topics(counts: Counter[bytes | str]) -> tuple[bytes | str, ...]:
    """The topics an archive lists when none are configured: the window's topics (``counts``:
    its messages per topic), those longer than ``MAX_TOPIC_BYTES`` left out, and of more than
    ``MAX_ARCHIVE_TOPICS`` the ones with the most messages (ties: the smaller topic), sorted.
    Messages on the others are not exported (the caller counts them). Why by messages: a
    stranger's many one-message topics cannot push out a channel the community uses; the spec
    (a MUST) and status-go export the community's channel topics only, and a configured list is
    the way to have exactly those (status-go reads them from the community's chats,
    manager_archive.go ``GetCommunityChatsTopics``, and builds nothing without them)."""
    ok = [t for t in counts if topic_size(t) <= MAX_TOPIC_BYTES]
    if len(ok) > MAX_ARCHIVE_TOPICS:  # a heap, not a sort of a million strangers' topics
        ok = heapq.nsmallest(MAX_ARCHIVE_TOPICS, ok, key=lambda t: (-counts[t], t))
    return tuple(sorted(ok))


def plan_windows(
    start_ns: int,
    now_ns: int,
    period_ns: int = WINDOW_NS,
    partial: bool = False,
    unit_ns: int = 1,
) -> list[tuple[int, int]]:
    """The windows to export between ``start_ns`` and ``now_ns``.

    Full windows only by default, so a node offline 30 days builds 4 archives (the spec's
    example); ``partial=True`` adds status-go's truncated last window ``[from, now)`` (what an
    on-demand build does there: ``to = endDate`` when ``from + partition`` passes it), its end
    cut to a multiple of ``unit_ns`` (the layout's ``time_unit_ns``: status-go's metadata holds
    whole seconds, and ``now`` at 12.5 s made an archive holding a message of second 12 with
    ``to`` = 12, which a member refuses; status-go selects by whole seconds too)."""
    if period_ns <= 0:
        raise ValueError("period must be positive")
    out = []
    frm = start_ns
    while frm + period_ns <= now_ns:
        out.append((frm, frm + period_ns))
        frm += period_ns
    end = now_ns - now_ns % unit_ns
    if partial and frm < end:
        out.append((frm, end))
    return out


@dataclass
class BuildResult:
    archives: list[EncodedArchive]
    index: bytes
    torrent: Torrent | None
    end_ns: int | None
    """End of the last window consumed (the next build starts here)."""
    topic_skipped: int = 0
    """Messages of the windows built left out because no topics were configured and theirs
    was past the bounds of an archive's metadata (``bounded_topics``)."""
    topic_sample: tuple[bytes | str, ...] = ()
    """The first few such topics (each cut to 64 characters), for the log."""

    @property
    def appended(self) -> int:
        return sum(a.size for a in self.archives)


@dataclass
class ArchiveBuilder:
    layout: Layout
    name: str
    """Torrent name: the community id, ``0x`` + compressed public key hex."""
    entries: list[IndexEntry] = field(default_factory=list)
    hashes: PieceHashes = field(default_factory=PieceHashes)
    end_ns: int | None = None
    announce: tuple[str, ...] | None = None
    """Tracker URLs of the torrent; None: the layout's ``default_trackers``."""

    def __post_init__(self) -> None:
        self.hashes.piece_length = self.layout.piece_length
        self.announce = check_trackers(
            self.layout.default_trackers if self.announce is None else self.announce
        )

    @property
    def data_size(self) -> int:
        return self.hashes.data_size

    def build(
        self,
        windows: Sequence[tuple[int, int]],
        messages: Sequence[MessageRow],
        topics: Sequence[bytes | str] | None = None,
        presorted: bool = False,
    ) -> BuildResult:
        """Export ``messages`` into one archive (or status-go chunks) per window.

        ``topics``: the community's channel topics (metadata ``contentTopic``, and only
        messages on them are exported; ``check_topics`` bounds them); None = the topics seen
        in each window, bounded (``bounded_topics``: a topic past ``MAX_TOPIC_BYTES``, or past
        ``MAX_ARCHIVE_TOPICS`` in one window, is not listed and its messages are not exported,
        but counted: ``BuildResult.topic_skipped``), sorted.
        ``presorted``: the caller guarantees time order (the store's query sorts), which saves
        a sort of every message (a tenth of the build).

        Precondition: ``messages`` holds each message once (no two rows of the same record
        bytes); every row given is exported. status-go archives a window from
        ``waku_messages``, one row per message hash (protocol/communities/persistence.go), and
        loglake's callers hold the same: ``ControlNode`` passes the store's rows
        (``MessageStore.add`` keeps the first copy) and the ``archives-build`` job drops the
        same copies before its build tasks (``_copies``). Not checked here because it is
        not cheap in Python: a copy has its original's time, but finding one meant a list of
        every row's time and a comparison of the bytes of rows sharing a time, measured on a
        1M-row window (300-byte records) at +0.33 s over a 0.55 s build with whole-second
        times (status-go's), +0.06 s with distinct ones; a caller with rows from elsewhere
        removes the copies first (``MessageStore`` does: ``add`` them to one)."""
        # positional access: DecodedMessage or a store row laid out like it (ts, topic, raw, cap)
        ts = operator.itemgetter(0)
        msgs = messages if presorted else sorted(messages, key=ts)
        topics = check_topics(topics)
        wanted = None if topics is None else set(topics)
        # all or nothing: a build that raises leaves the builder as it was (its end moved, a
        # retry skipped the windows it had failed on)
        before = self.end_ns, len(self.entries), len(self.hashes.hashes)
        skipped: list[int] = [0]
        sample: list[bytes | str] = []
        try:
            out = self._build(windows, msgs, topics, wanted, skipped, sample)
        except BaseException:
            self.end_ns = before[0]
            del self.entries[before[1] :]
            del self.hashes.hashes[before[2] :]
            raise
        index = self.layout.encode_index(self.entries) if self.entries else b""
        torrent = self.torrent(index) if self.entries else None
        return BuildResult(out, index, torrent, self.end_ns, skipped[0], tuple(sample))

    def _build(
        self,
        windows: Sequence[tuple[int, int]],
        msgs: Sequence[MessageRow],
        topics: Sequence[bytes | str] | None,
        wanted: set[bytes | str] | None,
        skipped: list[int],
        sample: list[bytes | str],
    ) -> list[EncodedArchive]:
        ts = operator.itemgetter(0)
        out: list[EncodedArchive] = []
        for frm, to in windows:
            if self.end_ns is not None and frm < self.end_ns:
                raise ValueError(f"window starting {frm} overlaps archived history ({self.end_ns})")
            lo = bisect.bisect_left(msgs, frm, key=ts)
            hi = bisect.bisect_left(msgs, to, lo=lo, key=ts)
            window = msgs if lo == 0 and hi == len(msgs) else msgs[lo:hi]  # no 1M-ref copy
            if wanted is not None:
                window = [m for m in window if m[1] in wanted]
            self.end_ns = to
            if not window:
                continue
            if topics is not None:
                tops = tuple(topics)
            else:
                seen = set(map(operator.itemgetter(1), window))
                if topics_within_bounds(seen):
                    tops = tuple(sorted(seen))  # the honest case: no count of each topic
                else:
                    tops = bounded_topics(Counter(map(operator.itemgetter(1), window)))
                    keep = set(tops)
                    kept = [m for m in window if m[1] in keep]
                    skipped[0] += len(window) - len(kept)
                    sample += [t[:64] for t in itertools.islice(seen - keep, 5 - len(sample))]
                    window = kept
                    if not window:  # only topics past the bounds: no archive
                        continue
            meta = ArchiveMetadata(frm, to, tops, self.layout.archive_version)
            for chunk in self.layout.chunk(window):
                raws = [m[2] for m in chunk]
                enc = self.layout.encode_archive(meta, raws, self.data_size)
                self.hashes.extend_parts(
                    enc.parts, enc.length, enc.trailing_zeros, enc.part_lengths
                )
                self.entries.append(enc.entry)
                out.append(enc)
        return out

    def torrent(self, index: bytes | None = None) -> Torrent:
        if index is None:
            index = self.layout.encode_index(self.entries)
        return build_torrent(self.name, self.hashes, index, self.announce or ())
