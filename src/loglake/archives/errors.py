"""Typed errors of the archives part, split by whose fault it is (STYLE.md, the h11 model)."""

from __future__ import annotations

from loglake.errors import DecodeError, LocalProtocolError, LoglakeError, RemoteProtocolError


class ArchiveError(LoglakeError):
    """Base of the archives errors."""


class CorruptIndex(ArchiveError, DecodeError):
    """The ``index`` file does not decode, or an entry's key is not keccak-256 of its value."""


class ArchiveTooLarge(CorruptIndex):
    """The index names a missing archive larger than the member takes (``fetch_archives``'
    ``max_archive_bytes``): refused before a byte of it is downloaded. A ``CorruptIndex``, as an
    index over ``MAX_INDEX_BYTES`` is: the seeder's torrent, not the member's configuration."""


class FetchTooLarge(ArchiveTooLarge):
    """Even the newest window's missing archives together are more than the member takes in one
    fetch (``fetch_archives``' ``max_fetch_bytes``, ``--max-fetch-bytes``): refused on the
    index, before any archive is downloaded. A fetch whose missing archives are more than that
    takes the newest windows that fit and leaves the older ones (``FetchReport.left``)."""


class CorruptArchive(ArchiveError, DecodeError):
    """An archive region of ``data`` does not decode as the layout's ``WakuMessageArchive``."""


class UndecodableArchive(CorruptArchive):
    """An archive whose bytes match the torrent's piece hashes does not decode (or holds a bad
    record, or a message outside its time range): the same bytes would fail again, so the fetch
    removed its pieces, and ``MemberNode`` does not fetch this magnet link again (only a new
    one). Raised from the decoding error; ``archive_id`` names the archive."""

    def __init__(self, message: str, archive_id: str) -> None:
        super().__init__(message)
        self.archive_id = archive_id


class MisalignedArchive(ArchiveError, DecodeError):
    """An archive's size or offset is not a multiple of the piece length (spec: "Ensuring
    reproducible data pieces")."""


class BadRecord(ArchiveError, DecodeError):
    """A community stream record is not the layout's ``WakuMessage``."""


class BadMagnetMessage(ArchiveError, RemoteProtocolError, DecodeError):
    """A special-channel message is not a well-formed ``ApplicationMetadataMessage`` carrying a
    ``CommunityMessageArchiveMagnetlink``."""


class UnsignedMessage(BadMagnetMessage):
    """The special-channel message has no signature."""


class WrongSigner(BadMagnetMessage):
    """The signature does not recover to the control node's key (spec: "Canonical message
    histories": messages not signed by the control node MUST be ignored)."""


class CorruptStore(ArchiveError, DecodeError):
    """A node's store file (``--store``, ``<root>/member.sqlite``) is not a SQLite database, or
    SQLite finds it corrupt: named with SQLite's reason, which apsw raises as its own
    exception."""


class CorruptTorrent(ArchiveError, DecodeError):
    """A ``.torrent`` file (metainfo) libtorrent refuses to load; names the file and libtorrent's
    reason, which libtorrent itself raises as a bare ``RuntimeError``."""


class TorrentTimeout(ArchiveError, RemoteProtocolError):
    """No peer gave the torrent's metadata or pieces in time."""


class ArchiveConfigError(ArchiveError, LocalProtocolError):
    """The caller asked for something impossible (unknown layout, bad key, no archives)."""


class BadMagnetLink(ArchiveConfigError):
    """A magnet link libtorrent does not take (unparsable, an all-zero info-hash): the caller's
    when it gave the link (``archives fetch --magnet``); a link from the special channel is the
    control node's, and ``MemberNode`` raises ``BadMagnetMessage`` for it instead."""
