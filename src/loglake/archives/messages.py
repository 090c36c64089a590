"""The archives part's messages: layout-neutral dataclasses the codecs produce and consume.

The bytes on the wire are the protobuf messages of ``loglake/wire/proto/archives_*.proto``
(generated modules in ``loglake.wire.pb``); ``layout.py`` and ``signing.py`` convert between
them and these. Times are Unix nanoseconds whatever the layout stores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np

PIECE_LENGTH = 100 * 1024
"""status-go protocol/communities/manager.go: ``pieceLength = 100 * 1024`` (the spec leaves it
"??? (TODO)")."""

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ArchiveMetadata:
    """``WakuMessageArchiveMetadata`` in layout-neutral form: times in Unix ns."""

    from_ns: int
    to_ns: int
    content_topics: tuple[bytes | str, ...]
    version: int = 0


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One ``WakuMessageArchiveIndexMetadata`` and its key. ``size`` is the archive's bytes in
    ``data`` including padding; ``padding`` is status-go's trailing zero count (0 for spec)."""

    archive_id: str
    metadata: ArchiveMetadata
    offset: int
    size: int
    padding: int
    encoded: bytes

    @property
    def first_piece(self) -> int:
        return self.offset // PIECE_LENGTH

    @property
    def num_pieces(self) -> int:
        return self.size // PIECE_LENGTH

    @property
    def pieces(self) -> range:
        return range(self.first_piece, self.first_piece + self.num_pieces)


@dataclass(frozen=True, slots=True)
class EncodedArchive:
    """What goes into ``data``: the encoded archive, then ``trailing_zeros`` zero bytes.

    The encoded archive is kept as the list of buffers it was framed from (``parts``, ready for
    ``writelines``/``writev``); ``body`` joins them. Not joining is what lets the builder hash
    pieces from cache-sized joins instead of one 300 MB copy read back from memory."""

    parts: list[bytes]
    length: int
    trailing_zeros: int
    entry: IndexEntry
    part_lengths: np.ndarray | None = None
    """The parts' lengths as a numpy int64 array, when the layout computed them."""

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)

    @property
    def size(self) -> int:
        return self.length + self.trailing_zeros

    def data_bytes(self) -> bytes:
        return self.body + bytes(self.trailing_zeros) if self.trailing_zeros else self.body


class DecodedMessage(NamedTuple):
    """A community record with what windowing and hydration need. A named tuple, not a frozen
    dataclass: a million are made per weekly build, straight from store rows, and a frozen
    dataclass costs several times more to construct."""

    timestamp_ns: int
    topic: bytes | str
    raw: bytes
    cap_size: int
    """status-go's size for the 30 MB cap: ``len(payload) + len(sig)``."""


MessageRow = tuple[int, bytes | str, bytes, int]
"""A message as the builder reads it, by position: ``(timestamp_ns, topic, raw, cap_size)``. A
``DecodedMessage`` is one; so is a plain store row (``MessageStore.decoded``), which saves
building a named tuple per message."""


@dataclass(frozen=True, slots=True)
class MagnetLinkMessage:
    """``CommunityMessageArchiveMagnetlink`` plus who signed it."""

    clock: int
    magnet_uri: str
    signer: str = ""
    """Recovered community id (``0x`` + compressed public key hex); empty before signing."""
