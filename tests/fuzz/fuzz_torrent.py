"""Fuzz the archive torrent's bencode both ways.

loglake writes bencode itself (``archives.torrent.bencode``, for status-go-identical info
hashes) and reads torrents only through libtorrent (``lt.torrent_info`` in ``bt.Seeder.seed``
and ``loglake archives seed``; ``lt.bdecode`` in the tests). So this harness checks:

- writing: a value built from the input (nested lists, dicts with byte-string keys, byte
  strings, integers of -(2**63 - 1) .. 2**63 - 1) bencodes to bytes that ``lt.bdecode``
  reads back to the same value;
- reading: mutated ``.torrent`` files (seeded with metainfo loglake builds) given to
  ``lt.torrent_info`` raise only libtorrent's ``RuntimeError`` (its typed decode error), never
  crash or hang the process.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import atheris
import libtorrent as lt

from loglake.archives.torrent import PieceHashes, bencode, build_torrent
from tests.fuzz import _harness

EXPECTED = (RuntimeError,)
"""libtorrent's decode error (``lt.torrent_info`` on bad bytes); the writing half expects none."""
INSTRUMENT = ("loglake.archives.torrent",)


def _value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> object:
    kind = fdp.ConsumeIntInRange(0, 3 if depth < 8 else 1)
    if kind == 0:
        # not -2**63: libtorrent 2.1.1 reads ``i-9223372036854775808e`` as 0 (its parser
        # overflows on the magnitude); loglake's torrents hold no negative numbers
        return fdp.ConsumeIntInRange(-(2**63) + 1, 2**63 - 1)
    if kind == 1:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    n = fdp.ConsumeIntInRange(0, 6)
    if kind == 2:
        return [_value(fdp, depth + 1) for _ in range(n)]
    return {
        fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16)): _value(fdp, depth + 1) for _ in range(n)
    }


def one(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        lt.torrent_info(data[1:])
        return
    value = _value(atheris.FuzzedDataProvider(data[1:]))
    encoded = bencode(value)
    try:
        back = lt.bdecode(encoded)
    except RuntimeError as e:
        raise AssertionError(f"libtorrent cannot read our bencode of {value!r:.200}: {e}") from None
    assert back == value, (value, back)


def seeds() -> list[bytes]:
    hashes = PieceHashes(piece_length=64)
    hashes.extend(bytes(range(128)))
    name = "0x02" + "ab" * 32
    out = [b"\x00" + bytes(range(64)), b"\x02" + bytes(64)]
    for announce in ((), ("http://127.0.0.1:6969/announce",)):
        out.append(b"\x01" + build_torrent(name, hashes, b"index bytes", announce).metainfo())
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
