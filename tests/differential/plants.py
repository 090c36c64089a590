"""Planted bugs: a differential fuzzer that finds nothing means something only if it finds a
bug put there on purpose. Each plant swaps one function of loglake for a copy with a realistic
defect, for the duration of a ``with`` block, and names the fuzzer that must catch it.

Used by ``test_plants.py`` (each plant caught within the CI budget) and ``benchmarks/fuzz.py
--plant NAME`` (inputs and seconds to the first catch, and replay with ``--seed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from loglake.archives import layout as archives_layout
from loglake.archives import torrent as archives_torrent
from loglake.sds import codec as sds_codec
from loglake.sds.messages import HistoryEntry
from loglake.wire import bare, candid, candid_vec
from loglake.wire.varint import encode_uleb


@contextmanager
def _swapped(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _optional_flag_two(self: bare.Optional, buf: Any, pos: int) -> tuple[Any, int]:
    """``optional<T>`` taking flag 2 as "present" too."""
    if pos >= len(buf):
        raise bare.BareDecodeError("truncated optional", pos)
    flag = buf[pos]
    if flag == 0:
        return None, pos + 1
    if flag not in (1, 2):
        raise bare.BareDecodeError(f"optional flag must be 0 or 1, got {flag}", pos)
    return self.inner.dec(buf, pos + 1)


def _length_unchecked(buf: Any, pos: int) -> tuple[bytes, int]:
    """A length that runs past the end read as whatever is left (the slice does not fail)."""
    n, pos = bare.decode_uint(buf, pos)
    raw = bytes(buf[pos : pos + n])
    return raw, pos + len(raw)


def _empty_hint_dropped(pb: Any) -> HistoryEntry:
    """A present but empty ``retrieval_hint`` read as absent (truthiness for presence)."""
    return HistoryEntry(
        pb.message_id,
        pb.retrieval_hint or None,
        pb.sender_id if pb.HasField("sender_id") else None,
    )


def _padding_at_varint_jump(body_len: int, piece: int) -> bytes:
    """The spec padding field with ``<=`` for ``==`` on the length's varint size: a gap of 130
    takes 127 zeros with a one-byte length, one byte short of the boundary."""
    if body_len % piece == 0:
        return b""
    target = (body_len // piece + 1) * piece
    while True:
        gap = target - body_len
        for vlen in range(1, 6):
            n = gap - 1 - vlen
            if n >= 1 and len(encode_uleb(n)) <= vlen:
                return b"\x22" + encode_uleb(n) + bytes(n)
        target += piece


def _bencode_chars(v: object, out: list[bytes]) -> None:
    """bencode with a string's length counted in characters, not UTF-8 bytes."""
    if isinstance(v, str):
        out.append(b"%d:" % len(v))
        out.append(v.encode())
    elif isinstance(v, (list, tuple)):
        out.append(b"l")
        for x in v:
            _bencode_chars(x, out)
        out.append(b"e")
    elif isinstance(v, dict):
        out.append(b"d")
        items = sorted(((k.encode() if isinstance(k, str) else k), x) for k, x in v.items())
        for k, x in items:
            _bencode_chars(k, out)
            _bencode_chars(x, out)
        out.append(b"e")
    else:
        _ORIGINAL_BENCODE(v, out)


_ORIGINAL_BENCODE = archives_torrent._bencode


def _run_ignoring_leftover(self: candid.Plan, data: bytes) -> list[Any]:
    """Bytes left over after the arguments ignored (what icp_candid's path did)."""
    i, out = self.start, []
    for r in self.readers:
        v, i = r(data, i, 0)
        out.append(v)
    return out


@contextmanager
def _opt_flag_any_nonzero() -> Iterator[None]:
    """An ``opt`` flag other than 0 read as "present" (icp_candid's path read a flag of 3 as
    "none"): every compiled plan is dropped on the way in and out."""
    original = candid._Compiler._opt

    def lax(self: Any, w: int, e: Any) -> Any:
        read = original(self, w, e)

        def opt(b: bytes, i: int, d: int) -> Any:
            if i < len(b) and b[i] > 1:
                b = b[:i] + b"\x01" + b[i + 1 :]
            return read(b, i, d)

        return opt

    candid._PLANS.clear()
    candid._OWN.clear()
    candid._Compiler._opt = lax  # type: ignore[method-assign]
    try:
        yield
    finally:
        candid._Compiler._opt = original  # type: ignore[method-assign]
        candid._PLANS.clear()
        candid._OWN.clear()


@dataclass(frozen=True)
class Plant:
    name: str
    fuzzer: str
    what: str
    apply: Callable[[], Any]
    """Returns the context manager that holds the bug in place."""


PLANTS: dict[str, Plant] = {
    p.name: p
    for p in (
        Plant(
            "bare-optional-flag",
            "bare",
            "optional<T> accepts flag 2 as present",
            lambda: _swapped(bare.Optional, "dec", _optional_flag_two),
        ),
        Plant(
            "bare-length",
            "bare",
            "a string/data length past the end is read as what is left",
            lambda: _swapped(bare, "_decode_len_bytes", _length_unchecked),
        ),
        Plant(
            "sds-empty-hint",
            "sds-messages",
            "a present, empty retrieval_hint of a history entry is read as absent",
            lambda: _swapped(sds_codec, "entry_from_pb", _empty_hint_dropped),
        ),
        Plant(
            "archives-padding",
            "archives",
            "the spec padding field one byte short where its length's varint grows",
            lambda: _swapped(archives_layout, "padding_field", _padding_at_varint_jump),
        ),
        Plant(
            "candid-leftover",
            "candid",
            "bytes left over after the Candid arguments ignored",
            lambda: _swapped(candid.Plan, "run", _run_ignoring_leftover),
        ),
        Plant(
            "candid-opt-flag",
            "candid",
            "a Candid opt flag other than 0 or 1 read as present",
            _opt_flag_any_nonzero,
        ),
        Plant(
            "candid-vec-opt-flag",
            "candid-batches",
            "the batch executor's opt kernel takes any flag byte (2 read as absent)",
            lambda: _swapped(candid_vec, "_opt_flags", lambda flags: True),
        ),
        Plant(
            "torrent-str-length",
            "torrents",
            "bencode counts a string's length in characters, not UTF-8 bytes",
            lambda: _swapped(archives_torrent, "_bencode", _bencode_chars),
        ),
    )
}
