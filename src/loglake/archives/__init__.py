"""Status community history archives (specs/status-community-history-archives.txt, 61/STATUS).

The control node exports a community's messages into weekly, append-only, piece-aligned
archives indexed by keccak-256, shares them as a v1 torrent through a signed magnet link on a
special channel, and members fetch only the archives they lack and hydrate their store.

Two byte layouts share every line of logic: ``spec`` (the spec text) and ``status-go`` (what
status-im/status-go writes). See docs/archives.md.
"""

from loglake.archives.layout import LAYOUTS, Layout, get_layout

__all__ = ["LAYOUTS", "Layout", "get_layout"]
