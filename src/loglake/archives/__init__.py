"""Status community history archives (specs/status-community-history-archives.txt, 61/STATUS).

The control node exports a community's messages into weekly, append-only, piece-aligned
archives indexed by keccak-256, shares them as a v1 torrent through a signed magnet link on a
special channel, and members fetch only the archives they lack and hydrate their store.

Two byte layouts share every line of logic: ``spec`` (the spec text) and ``status-go`` (what
status-im/status-go writes). See docs/archives.md.

What a user needs is exported here. The nodes do the I/O (files, BitTorrent, streams):
``ControlNode`` (ingest, build, publish the magnet, prune) and ``MemberNode`` (follow the special
channel, fetch, hydrate; ``fetch_archives`` for a one-off fetch), each over a ``MessageStore``.
The sans-I/O cores they drive: ``ArchiveBuilder`` and ``MemberCore``. What the pipeline's build job
runs in Spark: ``decode_waku_batch`` and ``frame_records`` (columnar), ``plan_windows``, the
layout, ``PieceHashes``, the bounds of an archive's topics (``check_topics``,
``topics_within_bounds``). Names are imported on first use: a Spark task that decodes a batch
does not load libtorrent or the storage engine that the nodes need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loglake.faces import lazy_face

if TYPE_CHECKING:
    from loglake.archives.builder import (
        WINDOW_NS,
        ArchiveBuilder,
        check_topics,
        plan_windows,
        topics_within_bounds,
    )
    from loglake.archives.columnar import decode_waku_batch, frame_records
    from loglake.archives.control import BuildOutcome, ControlNode, Pruned
    from loglake.archives.errors import (
        ArchiveConfigError,
        ArchiveError,
        ArchiveTooLarge,
        BadRecord,
        CorruptArchive,
        FetchTooLarge,
        TorrentTimeout,
        UndecodableArchive,
    )
    from loglake.archives.layout import Layout, frame_parts, get_layout, padding_field
    from loglake.archives.member import MemberCore
    from loglake.archives.member_node import FetchReport, MemberNode, fetch_archives
    from loglake.archives.messages import ArchiveMetadata, IndexEntry
    from loglake.archives.signing import community_id, load_private_key
    from loglake.archives.store import MessageStore
    from loglake.archives.torrent import PieceHashes, check_trackers

_FACE = {
    "ArchiveBuilder": "loglake.archives.builder",
    "ArchiveConfigError": "loglake.archives.errors",
    "ArchiveError": "loglake.archives.errors",
    "ArchiveMetadata": "loglake.archives.messages",
    "ArchiveTooLarge": "loglake.archives.errors",
    "BadRecord": "loglake.archives.errors",
    "BuildOutcome": "loglake.archives.control",
    "ControlNode": "loglake.archives.control",
    "CorruptArchive": "loglake.archives.errors",
    "FetchReport": "loglake.archives.member_node",
    "FetchTooLarge": "loglake.archives.errors",
    "IndexEntry": "loglake.archives.messages",
    "Layout": "loglake.archives.layout",
    "MemberCore": "loglake.archives.member",
    "MemberNode": "loglake.archives.member_node",
    "MessageStore": "loglake.archives.store",
    "PieceHashes": "loglake.archives.torrent",
    "Pruned": "loglake.archives.control",
    "TorrentTimeout": "loglake.archives.errors",
    "UndecodableArchive": "loglake.archives.errors",
    "WINDOW_NS": "loglake.archives.builder",
    "check_topics": "loglake.archives.builder",
    "check_trackers": "loglake.archives.torrent",
    "community_id": "loglake.archives.signing",
    "decode_waku_batch": "loglake.archives.columnar",
    "fetch_archives": "loglake.archives.member_node",
    "frame_parts": "loglake.archives.layout",
    "frame_records": "loglake.archives.columnar",
    "get_layout": "loglake.archives.layout",
    "load_private_key": "loglake.archives.signing",
    "padding_field": "loglake.archives.layout",
    "plan_windows": "loglake.archives.builder",
    "topics_within_bounds": "loglake.archives.builder",
}
"""Each public name and the module that defines it, imported on first use: a Spark task that
needs one decoder does not pay for the nodes, BitTorrent or the storage engine."""


__getattr__, __dir__ = lazy_face(__name__, _FACE)


__all__ = [
    "WINDOW_NS",
    "ArchiveBuilder",
    "ArchiveConfigError",
    "ArchiveError",
    "ArchiveMetadata",
    "ArchiveTooLarge",
    "BadRecord",
    "BuildOutcome",
    "ControlNode",
    "CorruptArchive",
    "FetchReport",
    "FetchTooLarge",
    "IndexEntry",
    "Layout",
    "MemberCore",
    "MemberNode",
    "MessageStore",
    "PieceHashes",
    "Pruned",
    "TorrentTimeout",
    "UndecodableArchive",
    "check_topics",
    "check_trackers",
    "community_id",
    "decode_waku_batch",
    "fetch_archives",
    "frame_parts",
    "frame_records",
    "get_layout",
    "load_private_key",
    "padding_field",
    "plan_windows",
    "topics_within_bounds",
]
