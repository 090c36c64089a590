"""The archive torrent: a v1, multi-file metainfo over ``<community id>/{data,index}``.

status-go builds it with anacrolix ``metainfo.Info{PieceLength: 100*1024}.BuildFromFilePath
(archiveDir)`` (manager_archive_file.go): name = the folder name (the community id), files in
path order (``data``, ``index``), no pad files, ``pieces`` = SHA-1 of each piece of the files'
concatenation. The magnet is anacrolix ``metaInfo.Magnet(nil, &info)``:
``magnet:?xt=urn:btih:<hex>&dn=<name>`` (+ ``tr`` for each announce URL).

Why bencode is written here: libtorrent 2.x's ``create_torrent`` refuses the 102,400-byte piece
length and inserts pad files even at powers of two, which changes the info-hash
(FIELD-NOTES "More on archives and BitTorrent"); the info dict is four keys, and a 25-line encoder
keeps its bytes exact and testable (tests decode it with ``libtorrent.bdecode`` and load it with
``libtorrent.torrent_info``).

Because ``data`` is append-only and every archive fills whole pieces, the SHA-1 of earlier pieces
never changes: ``PieceHashes`` keeps them and hashes only what was appended.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

import numpy as np

from loglake.archives.errors import ArchiveConfigError
from loglake.archives.layout import PIECE_LENGTH
from loglake.errors import shown

TRACKER_SCHEMES = ("http", "https", "udp")
"""Announce URL schemes BitTorrent clients speak: HTTP(S) trackers (BEP 3) and UDP trackers
(BEP 15)."""


_HOST = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?")


def _tracker_host(netloc: str) -> bool:
    """An ASCII host name, IPv4 or bracketed IPv6 address and an optional port, nothing else.

    libtorrent (2.1) drops, without a word, an announce URL whose host holds anything else — a
    user name (``user@host``), a non-ASCII name not written as punycode, ``_`` or any other
    sub-delimiter, an empty port after ``:`` — from a torrent's ``announce-list`` and from a
    magnet's ``tr``, so such a URL would reach no member's client."""
    return _HOST.fullmatch(netloc) is not None


def check_trackers(urls: object) -> tuple[str, ...]:
    """Tracker URLs as given, checked (scheme, host, no whitespace) and without repeats, or
    ``ArchiveConfigError`` naming the first bad one: a torrent's ``announce-list`` is read by
    every member's client, so a typo must stop the build, not reach them."""
    if isinstance(urls, str) or not isinstance(urls, list | tuple):
        raise ArchiveConfigError("trackers: expected a list of tracker URLs")
    out: list[str] = []
    for url in urls:
        if not isinstance(url, str):
            raise ArchiveConfigError(f"tracker {shown(url)} is not a URL")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as e:
            raise ArchiveConfigError(f"tracker {shown(url)} is not a URL: {e}") from None
        if (
            parts.scheme not in TRACKER_SCHEMES
            or not parts.hostname
            or any(c.isspace() or ord(c) < 32 or c == "\x7f" for c in url)
            or not _tracker_host(parts.netloc)
        ):
            raise ArchiveConfigError(
                f"tracker {shown(url)} is not an announce URL (http://, https:// or udp://host[:port]/...)"
            )
        if url not in out:
            out.append(url)
    return tuple(out)


def bencode(value: object) -> bytes:
    out: list[bytes] = []
    _bencode(value, out)
    return b"".join(out)


def _bencode(v: object, out: list[bytes]) -> None:
    if isinstance(v, bool):
        raise TypeError("bencode has no booleans")
    if isinstance(v, int):
        out.append(b"i%de" % v)
    elif isinstance(v, (bytes, bytearray)):
        out.append(b"%d:" % len(v))
        out.append(bytes(v))
    elif isinstance(v, str):
        _bencode(v.encode(), out)
    elif isinstance(v, (list, tuple)):
        out.append(b"l")
        for x in v:
            _bencode(x, out)
        out.append(b"e")
    elif isinstance(v, dict):
        out.append(b"d")
        items = sorted(((k.encode() if isinstance(k, str) else k), x) for k, x in v.items())
        for k, x in items:
            _bencode(k, out)
            _bencode(x, out)
        out.append(b"e")
    else:
        raise TypeError(f"cannot bencode {type(v).__name__}")


@dataclass
class PieceHashes:
    """SHA-1 of every whole piece of ``data`` seen so far (``data`` grows by whole pieces)."""

    piece_length: int = PIECE_LENGTH
    hashes: list[bytes] = field(default_factory=list)

    def extend(self, appended: bytes) -> None:
        p = self.piece_length
        if len(appended) % p:
            raise ValueError("data grows by whole pieces only")
        mv = memoryview(appended)
        sha1 = hashlib.sha1
        self.hashes.extend(sha1(mv[i : i + p]).digest() for i in range(0, len(appended), p))

    def extend_parts(
        self,
        parts: Sequence[bytes | memoryview],
        length: int,
        zeros: int,
        part_lengths: np.ndarray | None = None,
    ) -> None:
        """``extend(b"".join(parts) + bytes(zeros))`` without building that copy: each piece is
        joined from the parts it spans (100 KiB, still in cache when SHA-1 reads it). Piece
        boundaries are found with numpy over the parts' lengths, not a Python loop."""
        p = self.piece_length
        total = length + zeros
        if total % p:
            raise ValueError("data grows by whole pieces only")
        if part_lengths is None:
            part_lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        offs = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(part_lengths, out=offs[1:])
        if int(offs[-1]) != length:
            raise ValueError("parts do not add up to the archive length")
        starts = np.arange(0, length, p, dtype=np.int64)
        ends = np.minimum(starts + p, length)
        i0s = (np.searchsorted(offs, starts, side="right") - 1).tolist()
        i1s = (np.searchsorted(offs, ends, side="left") - 1).tolist()
        o0s = (starts - offs[i0s]).tolist() if len(starts) else []
        o1s = (ends - offs[i1s]).tolist() if len(starts) else []
        sha1 = hashlib.sha1
        out = self.hashes
        for k, (i0, i1, o0, o1) in enumerate(zip(i0s, i1s, o0s, o1s, strict=True)):
            short = p - (int(ends[k]) - int(starts[k]))
            buf: bytes | memoryview
            if i0 == i1:
                buf = memoryview(parts[i0])[o0:o1]
                if short:
                    buf = bytes(buf) + bytes(short)
            else:
                chunk = [
                    memoryview(parts[i0])[o0:],
                    *parts[i0 + 1 : i1],
                    memoryview(parts[i1])[:o1],
                ]
                if short:
                    chunk.append(bytes(short))
                buf = b"".join(chunk)
            out.append(sha1(buf).digest())
        rest = total - len(starts) * p
        if rest:
            out.extend([sha1(bytes(p)).digest()] * (rest // p))

    @property
    def data_size(self) -> int:
        return len(self.hashes) * self.piece_length


def info_dict(name: str, hashes: PieceHashes, index_bytes: bytes) -> dict:
    """The v1 info dict for ``name/data`` (whole pieces, hashed already) and ``name/index``."""
    p = hashes.piece_length
    mv = memoryview(index_bytes)
    tail = [hashlib.sha1(mv[i : i + p]).digest() for i in range(0, len(index_bytes), p)]
    files = [{"length": hashes.data_size, "path": ["data"]}]
    files.append({"length": len(index_bytes), "path": ["index"]})
    return {
        "files": files,
        "name": name,
        "piece length": p,
        "pieces": b"".join(hashes.hashes) + b"".join(tail),
    }


@dataclass(frozen=True, slots=True)
class Torrent:
    info: bytes
    """The bencoded info dict (its SHA-1 is the info-hash)."""
    announce: tuple[str, ...] = ()

    @property
    def info_hash(self) -> str:
        return hashlib.sha1(self.info).hexdigest()

    def metainfo(self) -> bytes:
        """The ``.torrent`` file: ``{announce, announce-list, info}`` (raw info bytes kept).
        ``announce-list`` has one tracker per tier, as status-go's ``defaultAnnounceList``;
        ``announce`` (the first tracker) is for clients without BEP 12 (status-go leaves it
        out; neither is part of the info-hash)."""
        head = b"d"
        if self.announce:
            head += bencode("announce") + bencode(self.announce[0])
            head += bencode("announce-list") + bencode([[a] for a in self.announce])
        return head + bencode("info") + self.info + b"e"

    def magnet(self, name: str, peers: tuple[str, ...] = ()) -> str:
        """anacrolix's shape (``xt``, ``dn``, ``tr``...) plus ``x.pe`` peer hints (BEP 9), which
        libtorrent uses to dial the seeder on loopback where there is no DHT."""
        return magnet_link(self.info_hash, name, self.announce, peers)


def magnet_link(
    info_hash: str, name: str, announce: tuple[str, ...] = (), peers: tuple[str, ...] = ()
) -> str:
    parts = [f"xt=urn:btih:{info_hash}", f"dn={quote(name, safe='')}"]
    parts += [f"tr={quote(a, safe='')}" for a in announce]
    parts += [f"x.pe={p}" for p in peers]
    return "magnet:?" + "&".join(parts)


def build_torrent(
    name: str, hashes: PieceHashes, index_bytes: bytes, announce: tuple[str, ...] = ()
) -> Torrent:
    return Torrent(bencode(info_dict(name, hashes, index_bytes)), tuple(announce))
