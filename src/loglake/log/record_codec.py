"""Bytes of one stored record, as written in a segment file.

Why hand-written: the format is loglake's own (no spec or library defines a segment record), it
must be encoded a whole batch at a time with one ``write`` (``struct`` + ``crc32c``, both C),
and decoding must tell a torn tail from a corrupt record precisely. The framing follows the
log-structured tradition (Kafka's record batches, LevelDB's log format): a length prefix and a
checksum over the body, so recovery can find the last whole record without any other file.

Frame (all integers little-endian)::

    frame   = length:u32  crc:u32  body[length]
    crc     = CRC32C (Castagnoli, the ``crc32c`` package) of the whole body
    body    = index:u64  timestamp_ns:i64  flags:u8
              [key_len:u32  key]              (present iff flags & FLAG_KEY)
              header_count:u16  { name_len:u16 name(UTF-8)  value_len:u32 value }*
              data                            (the rest of the body)

``decode_frame`` returns a record or raises ``TornRecord`` (the bytes end before the frame
does: a torn tail) or ``CorruptRecord`` (the bytes are all there but wrong). Both are
``RecordDecodeError``, a ``DecodeError``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from crc32c import crc32c

from loglake.errors import DecodeError
from loglake.log.api import Entry, Headers, check_timestamp

try:  # the batch framer in C, built by the install where a compiler is (setup.py)
    from loglake.log import _framing  # type: ignore[attr-defined]
except ImportError:  # the same bytes, framed in Python below
    _framing = None

Buffer: TypeAlias = bytes | bytearray | memoryview
"""Record data as the log takes it (written as given, not copied)."""

FRAME_HEAD = struct.Struct("<II")
"""length, crc"""
BODY_HEAD = struct.Struct("<QqB")
"""index, timestamp_ns, flags"""
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
FLAG_KEY = 0x01
KNOWN_FLAGS = FLAG_KEY
MIN_BODY = BODY_HEAD.size + U16.size
MAX_BODY = 1 << 30
"""Largest body accepted (1 GiB): a bigger length field is garbage, not a record."""
MAX_HEADERS = 0xFFFF
MAX_HEADER_NAME = 0xFFFF


class RecordDecodeError(DecodeError):
    """The bytes at ``offset`` are not a valid record."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"bad record at byte {offset}: {reason}")
        self.offset, self.reason = offset, reason


class TornRecord(RecordDecodeError):
    """The buffer ends inside the frame (a write that did not finish)."""


class CorruptRecord(RecordDecodeError):
    """The frame is complete but its checksum or contents are wrong."""


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A decoded record plus where it sits in its segment."""

    index: int
    timestamp_ns: int
    key: bytes | None
    headers: Headers
    data: bytes
    offset: int
    size: int
    """Bytes of the whole frame."""


BODY_HEAD_NO_KEY = struct.Struct("<QqBH")
"""index, timestamp_ns, flags=0, header_count=0: the prefix of a record with no key or headers"""


def encode_batch(
    entries: Sequence[Entry], first_index: int, now_ns: int
) -> tuple[bytes, list[int], int]:
    """Frames for ``entries`` numbered from ``first_index``, as one buffer.

    Returns ``(buffer, offsets, max_timestamp_ns)`` with ``offsets[i]`` where record ``i``
    starts in the buffer (``encode_batch_parts`` joined; the log writes the parts)."""
    parts, _, offsets, max_ts = encode_batch_parts(entries, first_index, now_ns)
    return b"".join(parts), offsets, max_ts


def encode_batch_parts(
    entries: Sequence[Entry], first_index: int, now_ns: int
) -> tuple[list[Buffer], int, list[int], int]:
    """Frames for ``entries`` numbered from ``first_index``, as parts for one ``writev``.

    Returns ``(parts, size, offsets, max_timestamp_ns)``: the frames are the concatenation of
    ``parts`` (``size`` bytes), ``offsets[i]`` is where record ``i`` starts in it. Hot path:
    one ``struct`` call for the prefix, the CRC chained over prefix and data (no body copy),
    and each record's data is a part as given (a ``bytes``, or a view of the caller's buffer:
    not copied, nor joined — the parts go to ``fs.writev_all``). With the C framer
    (``_framing``) and no entry with a key or headers: one part, every frame in it."""
    if (
        _framing is not None
        and entries
        and not any(e.key is not None or e.headers for e in entries)
    ):
        stamps = [now_ns if e.timestamp_ns is None else e.timestamp_ns for e in entries]
        framed = _framing.frame_plain([e.data for e in entries], first_index, now_ns, stamps)
        if framed is not None:
            return [framed[0]], len(framed[0]), framed[1], max(stamps)
    parts: list[Buffer] = []
    offsets: list[int] = []
    add = parts.append
    pack_plain = BODY_HEAD_NO_KEY.pack
    pack_frame = FRAME_HEAD.pack
    pos = 0
    idx = first_index
    max_ts = -(1 << 63)
    ts = now_ns
    try:
        for e in entries:
            ts = now_ns if e.timestamp_ns is None else e.timestamp_ns
            if ts > max_ts:
                max_ts = ts
            data = e.data
            if type(data) is not bytes:
                data = as_octets(data)
            if e.key is None and not e.headers:
                prefix = pack_plain(idx, ts, 0, 0)
            else:
                prefix = _encode_prefix(idx, ts, e.key, e.headers)
            length = len(prefix) + len(data)
            if length > MAX_BODY:
                raise ValueError(f"record of {length} bytes exceeds the {MAX_BODY}-byte maximum")
            offsets.append(pos)
            add(pack_frame(length, crc32c(data, crc32c(prefix))))
            add(prefix)
            add(data)
            pos += 8 + length
            idx += 1
    except (struct.error, TypeError):
        # a timestamp that is no int64 is named as such (InvalidTimestamp), as the C framer's
        # fallback to here has it; a check per record would cost the loop, a try nothing
        check_timestamp(ts)
        raise
    return parts, pos, offsets, max_ts


def encode_plain(
    datas: Sequence[Buffer], first_index: int, now_ns: int
) -> tuple[bytes, list[int], int]:
    """``encode_batch`` for data-only records (no key, no headers, timestamp ``now_ns``): the
    same bytes, without an ``Entry`` per record (``encode_plain_parts`` joined)."""
    parts, _, offsets, max_ts = encode_plain_parts(datas, first_index, now_ns)
    return b"".join(parts), offsets, max_ts


_PLAIN_HEAD = struct.Struct("<IIQqBH")
"""length, crc, then ``BODY_HEAD_NO_KEY``: a data-only record's whole head in one part"""
_PLAIN_MAX_DATA = MAX_BODY - BODY_HEAD_NO_KEY.size


def encode_plain_parts(
    datas: Sequence[Buffer], first_index: int, now_ns: int
) -> tuple[list[Buffer], int, list[int], int]:
    """``encode_batch_parts`` for data-only records (the stream service's push path): two
    parts per record, its 27-octet head and its data as given (``bytes``, ``bytearray`` or
    ``memoryview``, not copied). Why two parts and not three: fewer iovecs per ``writev``
    and one list append fewer per record (the body prefix is packed twice, once alone for
    its CRC; a ``struct`` call costs less than a part). With the C framer (``_framing``) and
    ``datas`` a list or tuple of ``bytes``: one part, every frame in it (~4× less CPU, and
    one ``write``)."""
    if _framing is not None and datas:
        framed = _framing.frame_plain(datas, first_index, now_ns)
        if framed is not None:
            return [framed[0]], len(framed[0]), framed[1], now_ns
    parts: list[Buffer] = []
    offsets: list[int] = []
    add = parts.append
    note = offsets.append
    pack_plain = BODY_HEAD_NO_KEY.pack
    pack_head = _PLAIN_HEAD.pack
    max_data = _PLAIN_MAX_DATA
    pos = 0
    try:
        for idx, data in enumerate(datas, first_index):
            if type(data) is not bytes:
                data = as_octets(data)
            n = len(data)
            if n > max_data:
                raise ValueError(
                    f"record of {n + BODY_HEAD_NO_KEY.size} bytes exceeds the "
                    f"{MAX_BODY}-byte maximum"
                )
            note(pos)
            add(
                pack_head(
                    n + 19, crc32c(data, crc32c(pack_plain(idx, now_ns, 0, 0))), idx, now_ns, 0, 0
                )
            )
            add(data)
            pos += n + 27
    except (struct.error, TypeError):
        check_timestamp(now_ns)  # InvalidTimestamp, as in encode_batch_parts
        raise
    return parts, pos, offsets, now_ns if offsets else -(1 << 63)


def as_octets(data: Buffer) -> bytes | memoryview:
    """``data`` (any bytes-like object) as octets without a copy where possible: a flat
    byte view of a contiguous buffer (so ``len`` counts bytes, whatever its item format),
    else a copy. The view refers to the caller's buffer, which must not change until the
    write returns (the log writes before ``append`` returns)."""
    view = memoryview(data)
    if not view.c_contiguous:
        return view.tobytes()
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def encode_entries(entries: Sequence[Entry], first_index: int, now_ns: int) -> list[bytes]:
    """One frame per entry (tests and tools; the log writes with ``encode_batch``)."""
    buf, offsets, _ = encode_batch(entries, first_index, now_ns)
    ends = [*offsets[1:], len(buf)]
    return [buf[a:b] for a, b in zip(offsets, ends, strict=True)]


def _encode_prefix(idx: int, ts: int, key: bytes | None, headers: Headers) -> bytes:
    parts = [BODY_HEAD.pack(idx, ts, 0 if key is None else FLAG_KEY)]
    if key is not None:
        key = bytes(key)
        parts.append(U32.pack(len(key)))
        parts.append(key)
    parts.append(_encode_headers(headers))
    return b"".join(parts)


def _encode_headers(headers: Headers) -> bytes:
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"at most {MAX_HEADERS} headers per record")
    parts = [U16.pack(len(headers))]
    for name, value in headers:
        raw = name.encode("utf-8")
        if len(raw) > MAX_HEADER_NAME:
            raise ValueError("header name longer than 65535 bytes")
        value = bytes(value)
        parts += [U16.pack(len(raw)), raw, U32.pack(len(value)), value]
    return b"".join(parts)


def frame_length_at(buf: bytes | memoryview, pos: int) -> int:
    """Total frame size of the record starting at ``pos`` (header only; raises if torn)."""
    if len(buf) - pos < FRAME_HEAD.size:
        raise TornRecord(pos, "frame header cut short")
    length, _ = FRAME_HEAD.unpack_from(buf, pos)
    if length < MIN_BODY or length > MAX_BODY:
        raise CorruptRecord(pos, f"implausible body length {length}")
    return FRAME_HEAD.size + length


def decode_frame(buf: bytes | memoryview, pos: int = 0, base: int = 0) -> StoredRecord:
    """Decode the record at ``buf[pos:]``; ``base`` is added to offsets in errors/results
    (the file position of ``buf[0]``)."""
    where = base + pos
    avail = len(buf) - pos
    if avail < FRAME_HEAD.size:
        raise TornRecord(where, f"frame header needs 8 bytes, {avail} left")
    length, crc = FRAME_HEAD.unpack_from(buf, pos)
    if length < MIN_BODY or length > MAX_BODY:
        raise CorruptRecord(where, f"implausible body length {length}")
    start = pos + FRAME_HEAD.size
    end = start + length
    if end > len(buf):
        raise TornRecord(where, f"body of {length} bytes cut short at {len(buf) - start}")
    body = bytes(buf[start:end])
    if crc32c(body) != crc:
        raise CorruptRecord(where, "CRC32C mismatch")
    index, ts, flags = BODY_HEAD.unpack_from(body, 0)
    if flags & ~KNOWN_FLAGS:
        raise CorruptRecord(where, f"unknown flags {flags:#x}")
    p = BODY_HEAD.size
    key: bytes | None = None
    try:
        if flags & FLAG_KEY:
            (klen,) = U32.unpack_from(body, p)
            p += 4
            if p + klen > length:
                raise CorruptRecord(where, "key runs past the body")
            key = body[p : p + klen]
            p += klen
        (count,) = U16.unpack_from(body, p)
        p += 2
        headers: list[tuple[str, bytes]] = []
        for _ in range(count):
            (nlen,) = U16.unpack_from(body, p)
            p += 2
            if p + nlen > length:
                raise CorruptRecord(where, "header name runs past the body")
            name = body[p : p + nlen].decode("utf-8")
            p += nlen
            (vlen,) = U32.unpack_from(body, p)
            p += 4
            if p + vlen > length:
                raise CorruptRecord(where, "header value runs past the body")
            headers.append((name, body[p : p + vlen]))
            p += vlen
    except struct.error:
        raise CorruptRecord(where, "field runs past the body") from None
    except UnicodeDecodeError:
        raise CorruptRecord(where, "header name is not UTF-8") from None
    return StoredRecord(index, ts, key, tuple(headers), body[p:], where, FRAME_HEAD.size + length)


def scan(
    buf: bytes | memoryview, pos: int = 0, base: int = 0
) -> tuple[list[StoredRecord], int, RecordDecodeError | None]:
    """Decode records from ``pos`` until the buffer ends or a record fails.

    Returns ``(records, end, error)``: ``end`` is the position just past the last good record
    and ``error`` why scanning stopped early (None when the buffer ended exactly at a frame)."""
    out: list[StoredRecord] = []
    n = len(buf)
    while pos < n:
        try:
            rec = decode_frame(buf, pos, base)
        except RecordDecodeError as e:
            return out, pos, e
        out.append(rec)
        pos += rec.size
    return out, pos, None


@dataclass(slots=True)
class PlainColumns:
    """Where the fields of a run of plain records (no key, no headers) sit in a buffer (numpy
    arrays, one element per record)."""

    index: np.ndarray
    timestamp_ns: np.ndarray
    data_start: np.ndarray
    data_end: np.ndarray
    frame_size: int | None = None
    """Set when every frame has this size (the data is then a strided block of the buffer)."""


PLAIN_HEAD = np.dtype(
    [
        ("length", "<u4"),
        ("crc", "<u4"),
        ("index", "<u8"),
        ("timestamp_ns", "<i8"),
        ("flags", "u1"),
        ("header_count", "<u2"),
    ]
)
"""Frame head plus the body prefix of a plain record: 27 bytes, read a whole segment at once."""
PLAIN_HEAD_SIZE = FRAME_HEAD.size + BODY_HEAD_NO_KEY.size
assert PLAIN_HEAD.itemsize == PLAIN_HEAD_SIZE


def frame_offsets(buf: bytes) -> tuple[np.ndarray, int | None, RecordDecodeError | None]:
    """Start of every whole, plausibly framed record of ``buf``: ``(offsets, frame_size,
    error)``. ``frame_size`` is set when all frames have one size (found without a Python step
    per record); ``error`` is why the walk stopped before the end of the buffer (the offsets
    before it are still good)."""
    n = len(buf)
    if n >= FRAME_HEAD.size:
        (length,) = U32.unpack_from(buf, 0)
        size = FRAME_HEAD.size + length
        if MIN_BODY <= length <= MAX_BODY and n % size == 0:
            lengths = np.ndarray((n // size,), "<u4", buf, 0, (size,))
            if bool((lengths == length).all()):
                return np.arange(0, n, size, dtype=np.int64), size, None
    out: list[int] = []
    add = out.append
    unpack = U32.unpack_from
    pos = 0
    err: RecordDecodeError | None = None
    while pos < n:
        if n - pos < FRAME_HEAD.size:
            err = TornRecord(pos, "frame header cut short")
            break
        (length,) = unpack(buf, pos)
        if length < MIN_BODY or length > MAX_BODY:
            err = CorruptRecord(pos, f"implausible body length {length}")
            break
        end = pos + FRAME_HEAD.size + length
        if end > n:
            err = TornRecord(pos, f"body of {length} bytes cut short")
            break
        add(pos)
        pos = end
    return np.asarray(out, dtype=np.int64), None, err


def plain_columns(
    buf: bytes, first_index: int, pause: Callable[[], None] | None = None, every: int = 4096
) -> PlainColumns | None:
    """Check every frame of a whole segment (CRC, framing, indexes ``first_index, +1, …``) and
    return its columns without a Python object per row (the sealer's fast path): the frame
    walk, then the checks, are done on numpy arrays; only the CRC is one C call per record.
    None if some record has a key or headers (the caller decodes one by one then; the frames
    after the first such record are not CRC'd here). Damage →
    ``CorruptRecord``/``TornRecord`` at the first bad frame, as a frame-by-frame scan would
    report it. ``pause`` is called every ``every`` records (the sealer yields the GIL)."""
    offsets, size, walk_error = frame_offsets(buf)
    m = len(offsets)
    if size is not None:
        heads = np.ndarray((m,), PLAIN_HEAD, buf, 0, (size,))
    elif m:
        raw = np.frombuffer(buf, np.uint8)
        heads = raw[offsets[:, None] + np.arange(PLAIN_HEAD_SIZE)].view(PLAIN_HEAD).reshape(m)
    else:
        heads = np.zeros(0, PLAIN_HEAD)
    not_plain = (heads["flags"] != 0) | (heads["header_count"] != 0)
    # Past the first record with a key or headers the answer is None or damage before it:
    # the frames after it are not CRC'd (a keyed stream pays one CRC here, not a segment's).
    first_keyed = np.flatnonzero(not_plain)
    checked = int(first_keyed[0]) + 1 if len(first_keyed) else m
    heads, not_plain, offsets = heads[:checked], not_plain[:checked], offsets[:checked]
    starts = offsets + FRAME_HEAD.size
    ends = starts + heads["length"]
    mv = memoryview(buf)
    crcs = np.empty(checked, np.uint32)
    lo_list, hi_list = starts.tolist(), ends.tolist()
    for lo in range(0, checked, every):
        hi = min(checked, lo + every)
        crcs[lo:hi] = list(
            map(crc32c, map(mv.__getitem__, map(slice, lo_list[lo:hi], hi_list[lo:hi])))
        )
        if pause is not None:
            pause()
    bad_crc = crcs != heads["crc"]
    expect = np.arange(first_index, first_index + checked, dtype=np.uint64)
    bad_index = heads["index"] != expect
    bad = np.flatnonzero(bad_crc | not_plain | bad_index)
    if len(bad):
        j = int(bad[0])
        at = int(offsets[j])
        if bad_crc[j]:
            raise CorruptRecord(at, "CRC32C mismatch")
        if not_plain[j]:
            return None
        raise CorruptRecord(at, f"index {int(heads['index'][j])}, expected {first_index + j}")
    if walk_error is not None:
        raise walk_error
    return PlainColumns(
        heads["index"].astype(np.int64),
        heads["timestamp_ns"].astype(np.int64),
        starts + BODY_HEAD_NO_KEY.size,
        ends.astype(np.int64),
        size,
    )
