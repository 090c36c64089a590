"""Status community history archives (specs/status-community-history-archives.txt, 61/STATUS).

The control node exports a community's messages into weekly, append-only, piece-aligned
archives indexed by keccak-256, shares them as a v1 torrent through a signed magnet link on a
special channel, and members fetch only the archives they lack and hydrate their store.

Two byte layouts share every line of logic: ``spec`` (the spec text) and ``status-go`` (what
status-im/status-go writes). See docs/archives.md.

What a user needs is exported here. The nodes do the I/O (files, BitTorrent, streams):
``ControlNode`` (ingest, build, publish the magnet, prune) and ``MemberNode`` (follow the special
channel, fetch, hydrate; ``fetch_archives`` for a one-off fetch), each over a ``MessageStore``.
The sans-I/O cores they drive: ``ArchiveBuilder`` and ``MemberCore``.
"""

from loglake.archives.builder import ArchiveBuilder
from loglake.archives.control import BuildOutcome, ControlNode, Pruned
from loglake.archives.errors import (
    ArchiveConfigError,
    ArchiveError,
    BadMagnetMessage,
    BadRecord,
    CorruptArchive,
    CorruptIndex,
    MisalignedArchive,
    TorrentTimeout,
    UnsignedMessage,
    WrongSigner,
)
from loglake.archives.layout import LAYOUTS, Layout, get_layout
from loglake.archives.member import MemberCore
from loglake.archives.member_node import FetchReport, MemberNode, fetch_archives
from loglake.archives.messages import ArchiveMetadata, DecodedMessage, IndexEntry
from loglake.archives.signing import community_id, load_private_key
from loglake.archives.store import MessageStore

__all__ = [
    "LAYOUTS",
    "ArchiveBuilder",
    "ArchiveConfigError",
    "ArchiveError",
    "ArchiveMetadata",
    "BadMagnetMessage",
    "BadRecord",
    "BuildOutcome",
    "ControlNode",
    "CorruptArchive",
    "CorruptIndex",
    "DecodedMessage",
    "FetchReport",
    "IndexEntry",
    "Layout",
    "MemberCore",
    "MemberNode",
    "MessageStore",
    "MisalignedArchive",
    "Pruned",
    "TorrentTimeout",
    "UnsignedMessage",
    "WrongSigner",
    "community_id",
    "fetch_archives",
    "get_layout",
    "load_private_key",
]
