"""The top-level fields of an encoded ``WakuMessageArchive``, found without parsing it.

Why this exists: a member hydrates an archive of up to ``max_archive_bytes`` (128 MiB by default)
and protobuf parses a message whole: the archive became one list of parsed ``WakuMessage``s, the
records written again, a ``DecodedMessage`` and a store row each, all held at once. Found from
outside: 36-47x the archive's bytes at the peak for the smallest messages, 58-66x with the
hydrate (about 10 GB for a hostile archive at the default bound). Cut at its top-level field
boundaries, an archive parses as the same messages chunk by chunk (protobuf: "parsing the
concatenation of two messages is the same as merging them"; ``messages`` is a repeated field,
so merged chunks append in order), so a member holds one chunk's messages at a time.

Why by hand: the Python protobuf runtime (upb) has no reader of a message field by field (its
``internal.decoder`` serves the pure-Python runtime only, and is private), and loglake's C
helpers (``_waku.c``) frame records of a batch, not an archive. Only the framing is read here,
tags and lengths (varints, ``loglake.wire.varint``): protobuf itself parses every chunk, so the
content of each field (a ``WakuMessage``, the metadata, a group) is checked by protobuf exactly
as before. The walker vouches for a boundary only where protobuf's wire format leaves no doubt;
at the first field it cannot vouch for (bytes protobuf refuses, or a construct it does not
walk: a group nested deeper than ``MAX_GROUP_DEPTH``, a varint longer than protobuf reads) it
stops, and the rest of the archive is one ``tail`` that protobuf parses whole — as it did the
whole archive before. ``tests/archives/test_framing.py`` holds the two to the same results
(differential, hypothesis: valid, mutated and truncated archives, unknown fields, groups).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loglake.wire.varint import VarintError, decode_uleb

CHUNK_FIELDS = 4096
"""Top-level fields (messages, mostly) protobuf parses at a time. A chunk of the smallest
messages (4 framed bytes) costs about 1 MB at the peak (its parsed messages, records,
``DecodedMessage``s and store rows); 300-byte messages about 3 MB."""
CHUNK_BYTES = 4 * 1024 * 1024
"""And at most about this many bytes (a chunk ends at the first field boundary past it): a
chunk of 4096 large messages would hold several times their bytes at once."""
MAX_GROUP_DEPTH = 32
"""Groups (wire types 3/4: unknown fields to both layouts' archives, which protobuf keeps)
nested deeper than this are not walked: the rest of the archive is left to protobuf (its own
limit is 100 levels)."""
MAX_TAG_OCTETS = 5
"""upb reads a tag as a varint of at most 5 octets and 32 bits (a longer one fails the parse)."""
MAX_VARINT_OCTETS = 10
"""Protobuf's varints: at most 10 octets."""


@dataclass(frozen=True, slots=True)
class ArchiveFraming:
    """Where an archive's fields lie in its buffer."""

    chunks: list[tuple[int, int]]
    """``[start, end)`` ranges, in order, for protobuf to parse as ``WakuMessageArchive``:
    every field but those of ``skipped`` numbers (each range at most ``CHUNK_FIELDS`` fields,
    about ``CHUNK_BYTES``)."""
    last_skipped: tuple[int, int] | None
    """The value (``[start, end)``) of the last length-delimited field numbered
    ``padding_field``: the spec layout's ``padding``, which protobuf sets to the last one."""
    tail: int | None
    """Where the walk stopped (None: it reached the end): ``[tail, end)`` is for protobuf to
    parse whole."""


def walk_archive(
    buf: Sequence[int],
    end: int,
    parsed_fields: frozenset[int],
    padding_field: int | None = None,
    chunk_fields: int = CHUNK_FIELDS,
    chunk_bytes: int = CHUNK_BYTES,
) -> ArchiveFraming:
    """The top-level fields of the archive ``buf[:end]`` (``bytes``: indexing gives ints).

    Fields numbered in ``parsed_fields`` (``version``, ``metadata``, ``messages``) and groups
    go to the chunks protobuf parses; any other field of wire type 0, 1, 2 or 5 (the spec
    layout's ``padding``, unknown fields) cannot fail protobuf's parse once its framing is
    whole, and holds no message: it is left out, so that a large padding is never copied."""
    chunks: list[tuple[int, int]] = []
    last_skipped: tuple[int, int] | None = None
    start = p = field_start = 0  # the current chunk starts at ``start``
    fields = 0
    while p < end:
        field_start = p
        value_start = -1
        tag = buf[p]
        if tag < 0x80:  # one octet: fields 1-15, every tag of a well-formed archive
            p += 1
        else:
            tag, p = _varint(buf, p, end, MAX_TAG_OCTETS)
            if p < 0 or tag >> 32:
                break
        number, wire = tag >> 3, tag & 7
        if number == 0:
            break
        if wire == 2:
            n = buf[p] if p < end else 0x80
            if n < 0x80:  # a length below 128: most messages
                p += 1
            else:
                n, p = _varint(buf, p, end, MAX_VARINT_OCTETS)
                if p < 0:
                    break
            value_start = p
            p += n
        elif wire == 0:
            _, p = _varint(buf, p, end, MAX_VARINT_OCTETS)
            if p < 0:
                break
        elif wire == 1:
            p += 8
        elif wire == 5:
            p += 4
        elif wire == 3:
            p = _skip_group(buf, p, end, number, 1)
            if p < 0:
                break
        else:  # an end-group at the top, or wire types 6 and 7: protobuf refuses them
            break
        if p > end:  # truncated
            break
        if number in parsed_fields or wire == 3:
            fields += 1
            if fields >= chunk_fields or p - start >= chunk_bytes:
                chunks.append((start, p))
                start, fields = p, 0
        else:
            if field_start > start:
                chunks.append((start, field_start))
            start, fields = p, 0
            if number == padding_field and wire == 2:
                last_skipped = (value_start, p)
    else:
        if end > start:
            chunks.append((start, end))
        return ArchiveFraming(chunks, last_skipped, None)
    if field_start > start:
        chunks.append((start, field_start))
    return ArchiveFraming(chunks, last_skipped, field_start)


def _varint(buf: Sequence[int], p: int, end: int, max_octets: int) -> tuple[int, int]:
    """``(value, next position)``, or ``(0, -1)`` for no varint of at most ``max_octets``
    octets ending within ``end``."""
    try:
        value, q = decode_uleb(buf, p, max_octets)  # type: ignore[arg-type]
    except VarintError:
        return 0, -1
    return (value, q) if q <= end else (0, -1)


def _skip_group(buf: Sequence[int], p: int, end: int, number: int, depth: int) -> int:
    """The position after the end-group of group ``number`` whose fields start at ``p``, or
    -1 where the walk does not vouch for it (protobuf then reads it, with the rest)."""
    if depth > MAX_GROUP_DEPTH:
        return -1
    while p < end:
        tag, p = _varint(buf, p, end, MAX_TAG_OCTETS)
        if p < 0 or tag >> 32 or tag >> 3 == 0:
            return -1
        wire = tag & 7
        if wire == 4:
            return p if tag >> 3 == number else -1
        if wire == 2:
            n, p = _varint(buf, p, end, MAX_VARINT_OCTETS)
            if p < 0:
                return -1
            p += n
        elif wire == 0:
            _, p = _varint(buf, p, end, MAX_VARINT_OCTETS)
        elif wire == 1:
            p += 8
        elif wire == 5:
            p += 4
        elif wire == 3:
            p = _skip_group(buf, p, end, tag >> 3, depth + 1)
        else:
            return -1
        if p < 0 or p > end:
            return -1
    return -1
