"""Differential fuzzing of loglake's archive torrents and magnet links against libtorrent 2.1's
parsers (``libtorrent.torrent_info``, ``libtorrent.parse_magnet_uri``, ``libtorrent.bencode``).

loglake writes bencode and the info dict by hand (``archives/torrent.py`` says why); libtorrent
is what members' clients run. Per batch drawn by hypothesis:

- a torrent over ``<name>/data`` (whole pieces) and ``<name>/index`` with random names (any
  letters, digits, ``-`` and ``_``, non-ASCII included), piece lengths, piece hashes, index
  bytes and tracker URLs: libtorrent loads loglake's ``.torrent`` with the same info-hash,
  name, files and sizes, piece length, piece count, piece hashes and trackers (one per tier,
  in order) and keeps the info dict's bytes exactly;
- the magnet link of it: libtorrent reads the same info-hash, name, trackers and peers;
- tracker URLs from a wide alphabet: every URL ``check_trackers`` accepts, libtorrent keeps
  (a URL it drops would reach no member);
- random bencodable values: loglake's ``bencode`` writes libtorrent's bytes.

loglake has no torrent decoder (libtorrent parses every torrent loglake reads), so there are
no mutants here; ``load_torrent``'s typed error for bytes libtorrent refuses is checked on a
few cut or flipped copies.
"""

from __future__ import annotations

import hashlib
import random
import string
import warnings
from urllib.parse import quote

import libtorrent as lt
from hypothesis import strategies as st

from loglake.archives.bt import load_torrent
from loglake.archives.errors import ArchiveConfigError, CorruptTorrent
from loglake.archives.torrent import PieceHashes, bencode, build_torrent, check_trackers
from tests.differential.mutate import RNGS, mutate

NAME_ALPHABET = st.characters(categories=["L", "N"]) | st.sampled_from("-_")
names = st.text(NAME_ALPHABET, min_size=1, max_size=20)
PIECES = (16, 64, 1000, 16384, 102_400)
"""102,400 is status-go's piece length; the rest cross more piece boundaries per byte."""
HOST_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=@%é_[]:"
PATH_CHARS = string.ascii_letters + string.digits + "/-._~!$&'()*+,;=:@%?#é\x7f"
urls = st.builds(
    "{}://{}{}{}".format,
    st.sampled_from(["http", "https", "udp", "ftp"]),
    st.text(HOST_CHARS, min_size=1, max_size=12),
    st.sampled_from(["", ":80", ":6969", ":0", ":65535", ":"]),
    st.text(PATH_CHARS, max_size=16),
)
plain_urls = st.builds(
    "{}://tracker{}.example:{}/announce".format,
    st.sampled_from(["http", "https", "udp"]),
    st.integers(0, 99),
    st.integers(1, 65535),
)
torrents = st.fixed_dictionaries(
    {
        "name": names,
        "piece": st.sampled_from(PIECES),
        "data_pieces": st.integers(0, 4),
        "index_len": st.sampled_from([0, 1, 15, 16, 17, 1000, 16384, 16385]) | st.integers(0, 3000),
        "trackers": st.lists(plain_urls | urls, max_size=4),
        "peers": st.lists(st.integers(1, 65535).map("127.0.0.1:{}".format), max_size=2),
    }
)
leaves = st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=12) | st.text(max_size=8)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.binary(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
batches = st.tuples(st.lists(torrents, min_size=1, max_size=8), st.lists(values), RNGS)


def _trackers(ti: lt.torrent_info) -> list[tuple[str, int]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return [(a.url, a.tier) for a in ti.trackers()]


def _files(ti: lt.torrent_info) -> list[tuple[str, int]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        fs = ti.files()
        return [(fs.file_path(i), fs.file_size(i)) for i in range(fs.num_files())]


def check_torrent(d: dict, rng: random.Random) -> tuple[int, list[str]]:
    bad: list[str] = []
    try:
        trackers = check_trackers(d["trackers"])
    except ArchiveConfigError:
        trackers = check_trackers([u for u in d["trackers"] if _accepted(u)])
    piece, name = d["piece"], d["name"]
    hashes = PieceHashes(piece, [rng.randbytes(20) for _ in range(d["data_pieces"])])
    index = rng.randbytes(d["index_len"])
    where = f"torrent {name!r}, piece {piece}, {d['data_pieces']} data pieces, index {len(index)}"
    if hashes.data_size + len(index) == 0:
        return 0, []  # never built: a torrent always holds the index (libtorrent refuses 0)
    t = build_torrent(name, hashes, index, trackers)
    meta = t.metainfo()
    try:
        ti = lt.torrent_info(lt.bdecode(meta))
    except RuntimeError as e:
        return 1, [f"{where}: libtorrent refuses loglake's torrent ({e}): {meta[:200].hex()}"]
    tail = [hashlib.sha1(index[i : i + piece]).digest() for i in range(0, len(index), piece)]
    want_hashes = hashes.hashes + tail
    got = {
        "info_hash": str(ti.info_hashes().v1),
        "name": ti.name(),
        "files": _files(ti),
        "piece_length": ti.piece_length(),
        "num_pieces": ti.num_pieces(),
        "hashes": [ti.hash_for_piece(i) for i in range(ti.num_pieces())],
        "trackers": _trackers(ti),
        "info": bytes(ti.info_section()),
    }
    want = {
        "info_hash": t.info_hash,
        "name": name,
        "files": [(f"{name}/data", hashes.data_size), (f"{name}/index", len(index))],
        "piece_length": piece,
        "num_pieces": len(want_hashes),
        "hashes": want_hashes,
        "trackers": [(u, i) for i, u in enumerate(trackers)],
        "info": t.info,
    }
    for k in want:
        if got[k] != want[k]:
            bad.append(
                f"{where}: libtorrent reads {k} {got[k]!r:.200}, loglake wrote {want[k]!r:.200}"
            )
    magnet = t.magnet(name, tuple(d["peers"]))
    try:
        p = lt.parse_magnet_uri(magnet)
    except RuntimeError as e:
        return 2, [*bad, f"{where}: libtorrent refuses the magnet ({e}): {magnet}"]
    peers = [("127.0.0.1", int(x.rsplit(":", 1)[1])) for x in d["peers"]]
    got_m = (str(p.info_hashes.v1), p.name, list(p.trackers), list(p.peers))
    want_m = (t.info_hash, name, list(trackers), peers)
    if got_m != want_m:
        bad.append(f"{where}: libtorrent reads the magnet {magnet} as {got_m}, want {want_m}")
    # bytes libtorrent refuses are loglake's typed error, never a crash
    cases = 2
    for _ in range(3):
        mutant = mutate(meta, rng)
        cases += 1
        try:
            load_torrent(mutant)
        except CorruptTorrent:
            pass
        except Exception as e:
            bad.append(f"{where}: load_torrent raised {type(e).__name__}: {e}")
    return cases, bad


def _accepted(url: str) -> bool:
    try:
        check_trackers([url])
    except ArchiveConfigError:
        return False
    return True


def check_tracker_urls(d: dict) -> tuple[int, list[str]]:
    """Every URL ``check_trackers`` accepts survives libtorrent's reading."""
    bad = []
    for url in d["trackers"]:
        if not _accepted(url):
            continue
        t = build_torrent("n", PieceHashes(16, []), b"x", (url,))
        ti = lt.torrent_info(lt.bdecode(t.metainfo()))
        p = lt.parse_magnet_uri(f"magnet:?xt=urn:btih:{t.info_hash}&tr={quote(url, safe='')}")
        if [u for u, _ in _trackers(ti)] != [url] or list(p.trackers) != [url]:
            bad.append(f"check_trackers accepts {url!r}, libtorrent drops it")
    return len(d["trackers"]), bad


def _utf8(v: object) -> object:
    """``v`` with every str as its UTF-8 bytes: libtorrent's bencode takes str only with a
    deprecation warning; loglake's writes a str as its UTF-8 bytes."""
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, list):
        return [_utf8(x) for x in v]
    if isinstance(v, dict):
        return {k: _utf8(x) for k, x in v.items()}
    return v


def check_bencode(items: list) -> tuple[int, list[str]]:
    bad = []
    for v in items:
        ours = bencode(v)
        theirs = lt.bencode(_utf8(v))
        if ours != theirs:
            bad.append(f"bencode of {v!r:.120}: loglake {ours[:80]!r}, libtorrent {theirs[:80]!r}")
    return len(items), bad


def check(drawn: tuple[list[dict], list, random.Random]) -> tuple[int, list[str]]:
    items, vals, rng = drawn
    cases, bad = check_bencode(vals)
    for d in items:
        for n, b in (check_torrent(d, rng), check_tracker_urls(d)):
            cases, bad = cases + n, bad + b
    return cases, bad
