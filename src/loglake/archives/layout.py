"""The two byte layouts of a community history archive, behind one interface.

``spec`` follows specs/status-community-history-archives.txt to the letter ("Message history
archives", "Message history archive index", "Ensuring reproducible data pieces"): the padding
lives *inside* ``WakuMessageArchive`` (field 4) and the encoded archive is re-sized until it is a
multiple of the piece length; the index metadata carries ``num_pieces``; messages are
14/WAKU2-MESSAGE; times are Unix nanoseconds, like ``WakuMessage.timestamp``.

``status-go`` is what status-im/status-go writes for unencrypted communities
(protocol/communities/manager_archive_file.go: ``createHistoryArchiveTorrent``,
``createWakuMessageArchive``; protocol/protobuf/communities.proto): no padding field, zero bytes
appended *after* the encoded archive in ``data`` and recorded as ``size``/``padding`` in
``WakuMessageArchiveIndexMetadata``; a window is split into chunks of at most 30,000,000 bytes of
payload+sig (``maxArchiveSizeInBytes``), messages above that are dropped; times are Unix seconds.

Both key the index by ``crypto.Keccak256Hash(encoded index metadata).String()`` = ``0x`` + hex
(the spec names keccak-256 but no text form; status-go's is the one deployed).

Everything else (windows, append-only ``data``, torrents, fetch, hydrate) is shared and does
not know which layout it runs.

Why the archive bytes are framed here instead of by ``SerializeToString`` of one big message:
community stream records *are* encoded ``WakuMessage``s, so an archive is the metadata field
followed by ``0x1a varint(len) record`` per message — the exact bytes protobuf writes (fields in
number order; tests compare with the protobuf runtime) without parsing a million records again.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
from Crypto.Hash import keccak
from google.protobuf.message import DecodeError as PbDecodeError
from google.protobuf.message import Message

from loglake.archives.errors import (
    ArchiveConfigError,
    BadRecord,
    CorruptArchive,
    CorruptIndex,
    MisalignedArchive,
)
from loglake.archives.framing import CHUNK_FIELDS, walk_archive
from loglake.archives.messages import (
    NS,
    PIECE_LENGTH,
    ArchiveMetadata,
    DecodedMessage,
    EncodedArchive,
    IndexEntry,
    MessageRow,
)
from loglake.wire.pb import archives_spec_pb2 as spec_pb
from loglake.wire.pb import archives_statusgo_pb2 as sg_pb
from loglake.wire.varint import encode_uleb

INT64_MAX = 2**63 - 1
"""The largest nanosecond time kept anywhere (store, log, lake, Parquet)."""
MAX_INDEX_BYTES = 32 * 1024 * 1024
"""The largest ``index`` a member downloads or decodes. Neither the spec nor status-go bounds
it, and a member reads the torrent's whole index into memory: decoding 9 MB of minimal entries
(100,000 archives) took 1.8 s and 76 MB, so a 4 GB index would take the member's memory, not
just its disk. 32 MiB still holds 47,000 archives of 100 status-go topics each (702 bytes an
entry, measured; at one a week, 900 years)."""
MAX_ARCHIVE_SIZE = 30_000_000
"""status-go manager.go: ``maxArchiveSizeInBytes`` (status-go layout only)."""
MAX_FETCHED_ARCHIVE_BYTES = 128 * 1024 * 1024
"""The largest archive a member fetches by default (``fetch_archives``' ``max_archive_bytes``,
``--max-archive-bytes``). Neither the spec nor status-go's member bounds it, and a member reads
an archive whole into memory to check its pieces' SHA-1s: an index naming one archive of 100
GB, within a torrent's ``data``, took the member's disk and then its memory. What an archive
costs at the peak: its bytes, plus one chunk of it decoded and hydrated
(``MEMBER_PEAK_CHUNK_BYTES``), plus about 5x its largest message if that is over
``framing.CHUNK_BYTES``. Found from outside: decoded and hydrated whole, it cost about ``3 x``
its bytes plus 230-270 bytes a message (protobuf's parsed ``WakuMessage``, the record written
again, its ``DecodedMessage`` and its store row, all held at once): 58-66x its bytes for the
smallest records a control node can put in an archive (4 framed bytes, a timestamp only), about
10 GB for a hostile archive at the default bound. Now the archive is walked field by field
(``framing.walk_archive``) and hydrated a chunk at a time, in the same transaction: measured
+1 MB beyond its bytes for the smallest records, whatever the archive's size (8 and 24 MiB).
The default holds status-go's own archives (its builder caps an archive's payload + signatures
at ``MAX_ARCHIVE_SIZE``: below 81 MiB framed, even of signed empty messages) and a spec-layout
week of about 400,000 messages of 300 bytes; a busier community's member raises it, a member
that must stay under M bytes sets it to about (M - 32 MiB) / 6 if the control node may send one
huge message, else M - 32 MiB."""

MEMBER_PEAK_CHUNK_BYTES = 32 * 1024 * 1024
"""The most a member holds beyond an archive's own bytes while it decodes and hydrates it, for
messages up to ``framing.CHUNK_BYTES`` (4 MiB): one chunk (``framing.CHUNK_FIELDS`` messages, or
about ``CHUNK_BYTES``) parsed by protobuf, its records, ``DecodedMessage``s and store rows, and
the store's cache. Measured: +1 MB for the smallest records (4 framed bytes), +4 to +9 MB for
messages of 0-300 bytes, +17 MB for 30 KB ones, +24 MB for 2 MB ones. A larger message is a
chunk of its own, and costs about 5x its bytes at the peak (protobuf's parse, the record,
SQLite's copy and pages: 287 MB for an archive of two 60 MB messages, 285 MB decoded whole).
``tests/archives/test_fetch_hostile.py`` holds the bound for the smallest records."""

STATUS_GO_TRACKERS = (
    "udp://tracker.opentrackr.org:1337/announce",
    "udp://tracker.openbittorrent.com:6969/announce",
)
"""status-go protocol/communities/manager.go ``defaultAnnounceList`` (one tracker per tier),
which manager_archive_file.go puts in every archive torrent's ``announce-list``; anacrolix's
``MetaInfo.Magnet`` then writes each as a ``tr=`` of the magnet link."""


def keccak256(data: bytes) -> bytes:
    return keccak.new(data=data, digest_bits=256).digest()


def archive_id(encoded_index_metadata: bytes) -> str:
    """status-go: ``crypto.Keccak256Hash(bytes).String()``, i.e. ``0x`` + 64 lowercase hex."""
    return "0x" + keccak256(encoded_index_metadata).hex()


# protobuf varints are unsigned LEB128 (loglake.wire.varint); the ``messages`` field prefixes
# of records below 16 KiB come from a table (frame_parts, the build's hot loop).
_MESSAGES_PREFIX = tuple(b"\x1a" + encode_uleb(n) for n in range(1 << 14))
_PREFIX_ARRAY = np.empty(len(_MESSAGES_PREFIX), dtype=object)
_PREFIX_ARRAY[:] = _MESSAGES_PREFIX
"""The same prefixes as a numpy object array: ``_PREFIX_ARRAY[lengths]`` picks a million of
them in one C loop (6x faster than a ``map`` of ``tuple.__getitem__``, measured)."""


def frame_parts(records: Sequence[bytes]) -> tuple[list[bytes], np.ndarray]:
    """``0x1a varint(len)`` and the record, for every record: field 3 (``messages``) of
    ``WakuMessageArchive`` in both layouts, as a list of buffers (no per-record concatenation:
    this is the build's hot loop) and their lengths (numpy, for piece boundaries)."""
    n = len(records)
    # lengths once into numpy (no list of ints); prefixes picked by numpy from a table
    rec = np.fromiter(map(len, records), dtype=np.int64, count=n)
    if n and int(rec.max()) >= len(_MESSAGES_PREFIX):
        prefixes = [b"\x1a" + encode_uleb(x) for x in rec.tolist()]
    else:
        prefixes = _PREFIX_ARRAY[rec].tolist()
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = prefixes
    parts[1::2] = records
    part_lens = np.empty(2 * n, dtype=np.int64)
    part_lens[1::2] = rec
    pre = np.full(n, 2, dtype=np.int64)  # tag + one varint byte
    x = rec >> 7
    while x.any():  # one more varint byte per 7 bits
        pre += x > 0
        x >>= 7
    part_lens[0::2] = pre
    return parts, part_lens


class Layout(ABC):
    name: str
    piece_length: int = PIECE_LENGTH
    max_archive_bytes: int | None = None
    default_trackers: tuple[str, ...] = ()
    """Tracker URLs a torrent gets unless the user names others. The spec names none (peers
    come from the magnet link and DHT); status-go sets its ``defaultAnnounceList``."""
    archive_version: int = 0
    time_unit_ns: int = 1
    """The resolution of the archive metadata's ``from``/``to`` (status-go: whole seconds):
    a window's bounds must be multiples of it, or the metadata cuts its end below a message
    the window holds (``plan_windows``)."""

    # -- records ----------------------------------------------------------------------------
    @abstractmethod
    def decode_record(self, raw: bytes) -> DecodedMessage:
        """Parse one community-stream record (the layout's ``WakuMessage``) or ``BadRecord``."""

    @abstractmethod
    def make_record(
        self, *, payload: bytes, topic: bytes | str, timestamp_ns: int, **extra: object
    ) -> bytes:
        """Encode a ``WakuMessage`` for this layout (used by tests, demos and benchmarks)."""

    @abstractmethod
    def parse_topic(self, text: str) -> bytes | str:
        """A topic from the command line: hex for status-go, the string for spec."""

    _record_cls: Any
    """The layout's generated ``WakuMessage`` class."""

    def as_decoded(self, raw: bytes) -> bytes:
        """``raw`` as ``decode_archive`` gives it back from an archive: parsed and written
        again by protobuf (deterministic). An archive frames a record's own bytes, which a
        valid record need not write as protobuf does (fields in another order, a default
        value written out): a record is in an archive iff its ``as_decoded`` is among the
        archive's records. ``raw`` as it is where it does not parse (never archived)."""
        m = self._record_cls()
        try:
            m.ParseFromString(raw)
        except (PbDecodeError, RuntimeError, ValueError):
            return raw
        out: bytes = m.SerializeToString(deterministic=True)
        return out

    # -- archives ---------------------------------------------------------------------------
    @abstractmethod
    def _metadata_pb(self, meta: ArchiveMetadata) -> Message: ...

    @abstractmethod
    def _metadata_from_pb(self, pb: Any) -> ArchiveMetadata: ...

    @abstractmethod
    def encode_archive(
        self, meta: ArchiveMetadata, records: Sequence[bytes], offset: int
    ) -> EncodedArchive:
        """The archive's bytes for ``data`` at ``offset`` and its index entry."""

    def decode_archive(self, region: bytes, entry: IndexEntry) -> list[bytes]:
        """The raw ``WakuMessage`` records of the archive occupying ``region`` (``entry.size``
        bytes read at ``entry.offset``), or ``CorruptArchive``."""
        return [r for chunk in self.archive_records(region, entry) for r in chunk]

    @abstractmethod
    def archive_records(self, region: bytes, entry: IndexEntry) -> Iterator[list[bytes]]:
        """``decode_archive``'s records a chunk at a time (at most ``CHUNK_FIELDS`` records,
        about ``CHUNK_BYTES``), for a member to hydrate without holding the archive's messages
        at once. Every error ``decode_archive`` raises is raised by this call, before any
        chunk: the whole archive is parsed (chunk by chunk, let go) before it is decoded."""

    _archive_cls: Any
    """The layout's generated ``WakuMessageArchive`` class."""

    def _records_of(
        self, region: bytes, end: int, entry: IndexEntry, padding_field: int | None
    ) -> Iterator[list[bytes]]:
        """The records of the archive ``region[:end]`` in chunks (``framing.walk_archive``),
        after checking that all of it parses (``CorruptArchive``, as protobuf's parse of the
        whole did) and that its ``padding`` field, if the layout has one, holds only zeros.

        Each chunk is parsed into a message of its own: upb's arena of a message grows with
        every parse into it until the message goes, so reusing one would hold them all."""
        framing = walk_archive(region, end, _ARCHIVE_PARSED_FIELDS, padding_field)
        view = memoryview(region)
        for s, e in framing.chunks:
            self._parse_archive(view[s:e], entry)
        padding_ok = True
        if framing.tail is not None:
            # the rest is protobuf's alone; merged into an archive holding the padding seen so
            # far, its ``padding`` is the last one of the whole archive, as a parse of it says
            last = framing.last_skipped
            before = bytes(view[last[0] : last[1]]) if last else b""
            tail = self._parse_archive(view[framing.tail : end], entry, before, padding_field)
            if padding_field is not None:
                padding_ok = not tail.padding.strip(b"\x00")
            del tail
        elif framing.last_skipped is not None:
            s, e = framing.last_skipped
            padding_ok = region.count(0, s, e) == e - s
        if not padding_ok:
            raise CorruptArchive("archive padding holds non-zero bytes")
        return self._chunk_records(view, end, framing.chunks, framing.tail)

    def _parse_archive(
        self, data: memoryview, entry: IndexEntry, padding: bytes = b"", field: int | None = None
    ) -> Any:
        a = self._archive_cls()
        try:
            if padding and field is not None:
                a.padding = padding
                a.MergeFromString(data)
            else:
                a.ParseFromString(data)
        except (PbDecodeError, RuntimeError, ValueError) as e:
            raise CorruptArchive(f"archive {entry.archive_id[:18]}… does not decode: {e}") from e
        return a

    def _chunk_records(
        self, view: memoryview, end: int, chunks: list[tuple[int, int]], tail: int | None
    ) -> Iterator[list[bytes]]:
        for s, e in chunks:
            yield self._records_in(view[s:e])
        if tail is not None:
            a = self._archive_cls.FromString(view[tail:end])
            for i in range(0, len(a.messages), CHUNK_FIELDS):
                part = a.messages[i : i + CHUNK_FIELDS]
                yield [m.SerializeToString(deterministic=True) for m in part]

    def _records_in(self, data: memoryview) -> list[bytes]:
        """Each record of a chunk parsed and written again by protobuf (deterministic), as
        ``as_decoded``; a function of its own so that the parsed chunk (upb's arena: as large
        as the chunk) is let go before the records are decoded and stored."""
        a = self._archive_cls.FromString(data)
        return [m.SerializeToString(deterministic=True) for m in a.messages]

    @abstractmethod
    def _index_metadata_pb(
        self, entry_meta: ArchiveMetadata, offset: int, size: int, padding: int
    ) -> Message: ...

    @abstractmethod
    def _entry_from_pb(self, key: str, pb: Any, encoded: bytes) -> IndexEntry: ...

    @property
    @abstractmethod
    def _index_cls(self) -> Any:  # the layout's generated WakuMessageArchiveIndex class
        ...

    # -- shared -------------------------------------------------------------------------------
    def make_entry(self, meta: ArchiveMetadata, offset: int, size: int, padding: int) -> IndexEntry:
        if offset % self.piece_length or size % self.piece_length or size <= 0:
            raise MisalignedArchive(
                f"archive at offset {offset} with size {size} is not aligned to "
                f"{self.piece_length}-byte pieces"
            )
        pb = self._index_metadata_pb(meta, offset, size, padding)
        encoded = pb.SerializeToString(deterministic=True)
        return IndexEntry(archive_id(encoded), meta, offset, size, padding, encoded)

    def encode_index(self, entries: Sequence[IndexEntry]) -> bytes:
        index = self._index_cls()
        for e in entries:
            index.archives[e.archive_id].ParseFromString(e.encoded)
        # Deterministic map order (sorted keys) so the same index always has the same bytes.
        return index.SerializeToString(deterministic=True)

    def decode_index(self, raw: bytes, data_size: int | None = None) -> list[IndexEntry]:
        """Entries sorted by offset. Checks every key is keccak-256 of its metadata, every
        archive is piece-aligned, archives do not overlap and (if given) fit in ``data``."""
        if len(raw) > MAX_INDEX_BYTES:
            raise CorruptIndex(f"index of {len(raw)} bytes: more than {MAX_INDEX_BYTES} bytes")
        index = self._index_cls()
        try:
            index.ParseFromString(raw)
        except (PbDecodeError, RuntimeError, ValueError) as e:
            raise CorruptIndex(f"index does not decode as WakuMessageArchiveIndex: {e}") from e
        if raw and not index.archives:
            raise CorruptIndex("index has bytes but no archives (encrypted or not an index)")
        out = []
        for key, meta in index.archives.items():
            encoded = meta.SerializeToString(deterministic=True)
            if archive_id(encoded) != key:
                raise CorruptIndex(f"index key {key[:18]}… is not keccak-256 of its metadata")
            entry = self._entry_from_pb(key, meta, encoded)
            m = entry.metadata
            if not 0 <= m.from_ns <= m.to_ns <= INT64_MAX:
                # uint64 on the wire, but every time of the store, the log and the lake is
                # int64 nanoseconds: such an archive would fail its hydration untyped
                raise CorruptIndex(
                    f"archive {key[:18]}… covers {m.from_ns}..{m.to_ns} ns: ending before it "
                    "starts, or past what int64 nanoseconds hold"
                )
            out.append(entry)
        out.sort(key=lambda e: e.offset)
        end = 0
        for entry in out:
            if entry.offset < end:
                raise CorruptIndex(f"archive {entry.archive_id[:18]}… overlaps the previous one")
            end = entry.offset + entry.size
        if data_size is not None and end > data_size:
            raise CorruptIndex(f"index describes {end} bytes of data, the torrent has {data_size}")
        return out

    def check_alignment(self, offset: int, size: int) -> None:
        if offset % self.piece_length or size % self.piece_length or size <= 0:
            raise MisalignedArchive(
                f"archive at offset {offset}, size {size}: not a whole number of "
                f"{self.piece_length}-byte pieces"
            )

    def chunk(self, messages: Sequence[MessageRow]) -> list[list[MessageRow]]:
        """status-go splits a window into chunks of at most ``maxArchiveSizeInBytes`` of
        payload+sig and drops bigger messages; the spec layout keeps one archive per window."""
        if self.max_archive_bytes is None:
            return [messages if isinstance(messages, list) else list(messages)]
        # manager_archive_file.go: greedy chunks whose payload+sig sum stays <= the cap. With
        # numpy: a chunk starting at i ends at the last j with cum[j] - cum[i] <= cap.
        cap = self.max_archive_bytes
        msgs = list(messages)
        sizes = np.fromiter(map(operator.itemgetter(3), msgs), dtype=np.int64, count=len(msgs))
        keep = sizes <= cap
        if not keep.all():  # messages above the cap are dropped
            msgs = [m for m, k in zip(msgs, keep.tolist(), strict=True) if k]
            sizes = sizes[keep]
        cum = np.zeros(len(msgs) + 1, dtype=np.int64)
        np.cumsum(sizes, out=cum[1:])
        chunks: list[list[MessageRow]] = []
        i = 0
        while i < len(msgs):
            j = int(np.searchsorted(cum, cum[i] + cap, side="right")) - 1
            j = max(j, i + 1)
            chunks.append(msgs[i:j])
            i = j
        return chunks or [[]]


_ARCHIVE_PARSED_FIELDS = frozenset({1, 2, 3})
"""``version``, ``metadata`` and ``messages`` of ``WakuMessageArchive``, in both layouts: the
fields protobuf parses chunk by chunk (``framing.walk_archive``). Any other field is the spec
layout's ``padding`` or an unknown field, which no parse can fail once its framing is whole."""
_SPEC_PADDING_FIELD = 4
"""``bytes padding = 4`` of the spec's ``WakuMessageArchive``."""


class SpecLayout(Layout):
    name = "spec"
    archive_version = 1
    _record_cls = spec_pb.WakuMessage
    _archive_cls = spec_pb.WakuMessageArchive

    def decode_record(self, raw: bytes) -> DecodedMessage:
        m = spec_pb.WakuMessage()
        try:
            m.ParseFromString(raw)
        except (PbDecodeError, RuntimeError, ValueError) as e:
            raise BadRecord(f"record is not a 14/WAKU2-MESSAGE: {e}") from e
        if not m.HasField("timestamp"):
            raise BadRecord("14/WAKU2-MESSAGE without timestamp cannot be archived")
        if m.timestamp < 0:
            # before 1970: an archive's from/to are uint64 (the build failed, untyped, at the
            # oldest message's window; decode_index refuses such an index too)
            raise BadRecord(f"14/WAKU2-MESSAGE timestamp {m.timestamp} is before 1970")
        return DecodedMessage(m.timestamp, m.content_topic, raw, len(m.payload))

    def make_record(
        self, *, payload: bytes, topic: bytes | str, timestamp_ns: int, **extra: Any
    ) -> bytes:
        m = spec_pb.WakuMessage(payload=payload, content_topic=str(topic), timestamp=timestamp_ns)
        for k in ("version", "meta", "ephemeral"):
            if extra.get(k) is not None:
                setattr(m, k, extra[k])
        return m.SerializeToString(deterministic=True)

    def parse_topic(self, text: str) -> str:
        return text

    def _metadata_pb(self, meta: ArchiveMetadata) -> spec_pb.WakuMessageArchiveMetadata:
        return spec_pb.WakuMessageArchiveMetadata(
            version=meta.version,
            to=meta.to_ns,
            contentTopic=[str(t) for t in meta.content_topics],
            **{"from": meta.from_ns},
        )

    def _metadata_from_pb(self, pb: Any) -> ArchiveMetadata:
        return ArchiveMetadata(getattr(pb, "from"), pb.to, tuple(pb.contentTopic), pb.version)

    def encode_archive(
        self, meta: ArchiveMetadata, records: Sequence[bytes], offset: int
    ) -> EncodedArchive:
        head = b""
        if self.archive_version:
            head += b"\x08" + encode_uleb(self.archive_version)
        md = self._metadata_pb(meta).SerializeToString(deterministic=True)
        head += b"\x12" + encode_uleb(len(md)) + md
        parts, lens = frame_parts(records)
        body_len = len(head) + int(lens.sum())
        pad = padding_field(body_len, self.piece_length)
        parts.insert(0, head)
        parts.append(pad)
        lens = np.concatenate(([len(head)], lens, [len(pad)]))
        entry = self.make_entry(meta, offset, body_len + len(pad), 0)
        return EncodedArchive(parts, body_len + len(pad), 0, entry, lens)

    def archive_records(self, region: bytes, entry: IndexEntry) -> Iterator[list[bytes]]:
        self.check_alignment(entry.offset, len(region))
        return self._records_of(region, len(region), entry, _SPEC_PADDING_FIELD)

    def _index_metadata_pb(
        self, meta: ArchiveMetadata, offset: int, size: int, padding: int
    ) -> Message:
        return spec_pb.WakuMessageArchiveIndexMetadata(
            version=self.archive_version,
            metadata=self._metadata_pb(meta),
            offset=offset,
            num_pieces=size // self.piece_length,
        )

    def _entry_from_pb(self, key: str, pb: Any, encoded: bytes) -> IndexEntry:
        size = pb.num_pieces * self.piece_length
        self.check_alignment(pb.offset, size)
        return IndexEntry(key, self._metadata_from_pb(pb.metadata), pb.offset, size, 0, encoded)

    @property
    def _index_cls(self) -> Any:
        return spec_pb.WakuMessageArchiveIndex


def padding_field(body_len: int, piece: int) -> bytes:
    """The encoded ``bytes padding = 4`` field that makes ``body_len`` a multiple of ``piece``.

    Spec: "its padding field MUST be filled with zero bytes and the WakuMessageArchive MUST be
    re-encoded until its size becomes multiple of pieceLength". The field costs a tag byte and a
    varint length, so the zero count ``n`` solves ``body_len + 1 + len(varint(n)) + n = k*piece``;
    some gaps have no solution (a gap of 1, or where ``len(varint(n))`` jumps), then the next
    multiple is used. An empty field is not encoded by proto3, so an aligned body gets none, and
    ``n`` is at least 1: a gap of 2 would take ``22 00``, bytes no protobuf encoder writes (it
    drops an empty ``bytes`` field), so an archive re-encoded by anyone else would come out two
    bytes short of the piece boundary and hash to other pieces.
    """
    if body_len % piece == 0:
        return b""
    target = (body_len // piece + 1) * piece
    while True:
        gap = target - body_len
        for vlen in range(1, 6):
            n = gap - 1 - vlen
            if n >= 1 and len(encode_uleb(n)) == vlen:
                return b"\x22" + encode_uleb(n) + bytes(n)
        target += piece


class StatusGoLayout(Layout):
    name = "status-go"
    max_archive_bytes = MAX_ARCHIVE_SIZE
    default_trackers = STATUS_GO_TRACKERS
    time_unit_ns = NS  # from/to in seconds
    archive_version = 0  # status-go never sets WakuMessageArchive.version
    _record_cls = sg_pb.WakuMessage
    _archive_cls = sg_pb.WakuMessageArchive

    def decode_record(self, raw: bytes) -> DecodedMessage:
        m = sg_pb.WakuMessage()
        try:
            m.ParseFromString(raw)
        except (PbDecodeError, RuntimeError, ValueError) as e:
            raise BadRecord(f"record is not a status-go WakuMessage: {e}") from e
        if not m.timestamp:
            # a record of the other layout parses (its fields land in unknown ones) with no
            # timestamp: archiving it would put it in the week of 1970-01-01
            raise BadRecord("status-go WakuMessage without timestamp cannot be archived")
        if m.timestamp > INT64_MAX // NS:
            # seconds past 2262-04-11: the week's nanoseconds would not fit the int64 every
            # timestamp of the log, the lake and the index is kept in
            raise BadRecord(
                f"status-go WakuMessage timestamp {m.timestamp} s is past"
                " what int64 nanoseconds hold"
            )
        return DecodedMessage(m.timestamp * NS, m.topic, raw, len(m.payload) + len(m.sig))

    def make_record(
        self, *, payload: bytes, topic: bytes | str, timestamp_ns: int, **extra: Any
    ) -> bytes:
        if isinstance(topic, str):
            raise TypeError("a status-go topic is 4 bytes, not text (parse_topic reads hex)")
        m = sg_pb.WakuMessage(payload=payload, topic=bytes(topic), timestamp=timestamp_ns // NS)
        for k in ("sig", "padding", "hash"):
            if extra.get(k) is not None:
                setattr(m, k, extra[k])
        if extra.get("third_party_id"):
            m.thirdPartyId = str(extra["third_party_id"])
        return m.SerializeToString(deterministic=True)

    def parse_topic(self, text: str) -> bytes:
        t = text[2:] if text.startswith("0x") else text
        try:
            return bytes.fromhex(t)
        except ValueError:
            raise ArchiveConfigError(f"status-go topics are hex (4 bytes), not {text!r}") from None

    def _metadata_pb(self, meta: ArchiveMetadata) -> sg_pb.WakuMessageArchiveMetadata:
        return sg_pb.WakuMessageArchiveMetadata(
            version=meta.version,
            to=meta.to_ns // NS,
            contentTopic=[bytes(cast(bytes, t)) for t in meta.content_topics],  # bytes here
            **{"from": meta.from_ns // NS},
        )

    def _metadata_from_pb(self, pb: Any) -> ArchiveMetadata:
        return ArchiveMetadata(
            getattr(pb, "from") * NS, pb.to * NS, tuple(pb.contentTopic), pb.version
        )

    def encode_archive(
        self, meta: ArchiveMetadata, records: Sequence[bytes], offset: int
    ) -> EncodedArchive:
        md = self._metadata_pb(meta).SerializeToString(deterministic=True)
        parts, lens = frame_parts(records)
        head = b"\x12" + encode_uleb(len(md)) + md
        parts.insert(0, head)
        lens = np.concatenate(([len(head)], lens))
        raw, piece = int(lens.sum()), self.piece_length
        # manager_archive_file.go: an archive above one piece always gets padding up to the
        # next multiple — a whole extra piece when it is already aligned; one at or below one
        # piece is padded to exactly one piece.
        size = raw + piece - (raw % piece) if raw > piece else piece
        padding = size - raw
        entry = self.make_entry(meta, offset, size, padding)
        return EncodedArchive(parts, raw, padding, entry, lens)

    def archive_records(self, region: bytes, entry: IndexEntry) -> Iterator[list[bytes]]:
        self.check_alignment(entry.offset, len(region))
        if entry.padding > len(region):
            raise CorruptArchive(f"archive {entry.archive_id[:18]}… padding exceeds its size")
        end = len(region) - entry.padding
        if region.count(0, end) != entry.padding:  # (no copy of the padding)
            raise CorruptArchive("archive padding holds non-zero bytes")
        return self._records_of(region, end, entry, None)

    def _index_metadata_pb(
        self, meta: ArchiveMetadata, offset: int, size: int, padding: int
    ) -> Message:
        return sg_pb.WakuMessageArchiveIndexMetadata(
            metadata=self._metadata_pb(meta), offset=offset, size=size, padding=padding
        )

    def _entry_from_pb(self, key: str, pb: Any, encoded: bytes) -> IndexEntry:
        self.check_alignment(pb.offset, pb.size)
        if pb.padding > pb.size:
            raise CorruptIndex(f"archive {key[:18]}… has padding {pb.padding} > size {pb.size}")
        return IndexEntry(
            key, self._metadata_from_pb(pb.metadata), pb.offset, pb.size, pb.padding, encoded
        )

    @property
    def _index_cls(self) -> Any:
        return sg_pb.WakuMessageArchiveIndex


LAYOUTS: dict[str, Layout] = {"spec": SpecLayout(), "status-go": StatusGoLayout()}


def get_layout(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ArchiveConfigError(f"unknown layout {name!r}: use spec or status-go") from None
