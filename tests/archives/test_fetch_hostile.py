"""A member fetching from a hostile torrent: every file layout, size and byte it reads from the
network is the seeder's choice. Real libtorrent on loopback, small torrents, bounded waits."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from coincurve import PrivateKey

from loglake.archives.bt import Fetcher, Seeder
from loglake.archives.control import ControlNode
from loglake.archives.errors import (
    ArchiveError,
    ArchiveTooLarge,
    CorruptArchive,
    CorruptIndex,
    TorrentTimeout,
)
from loglake.archives.layout import (
    MAX_FETCHED_ARCHIVE_BYTES,
    MAX_INDEX_BYTES,
    MEMBER_PEAK_CHUNK_BYTES,
    NS,
    PIECE_LENGTH,
    get_layout,
)
from loglake.archives.member_node import MemberNode, fetch_archives
from loglake.archives.messages import ArchiveMetadata
from loglake.archives.signing import community_id
from loglake.archives.store import MessageStore
from loglake.archives.torrent import bencode
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams

from .helpers import DAY, START, WEEK, fill_weeks, record

pytestmark = pytest.mark.slow

KEY = PrivateKey(bytes.fromhex("55" * 32))
CID = community_id(KEY)


def _piece_hashes(contents: list[bytes | int], p: int = PIECE_LENGTH) -> bytes:
    """SHA-1 of every ``p``-byte piece of the concatenated ``contents`` (an int: that many zero
    bytes, whose whole pieces are hashed once)."""
    zero = hashlib.sha1(bytes(p)).digest()
    out, buf = [], b""
    for c in contents:
        if isinstance(c, int):
            fill = min(c, -len(buf) % p)
            buf, c = buf + bytes(fill), c - fill
            if len(buf) == p:
                out.append(hashlib.sha1(buf).digest())
                buf = b""
            out += [zero] * (c // p)
            buf += bytes(c % p)
        else:
            buf += c
            while len(buf) >= p:
                out.append(hashlib.sha1(buf[:p]).digest())
                buf = buf[p:]
    if buf:
        out.append(hashlib.sha1(buf).digest())
    return b"".join(out)


def seed_files(
    seeder: Seeder,
    base: Path,
    files: list[dict],
    contents: list[bytes | int],
    p: int = PIECE_LENGTH,
) -> str:
    """Seed a torrent named ``CID`` of ``p``-byte pieces with these info-dict ``files``
    (``contents`` of the regular ones, in order, written under ``base``; an int is that many
    zero bytes, written as a sparse file); return its magnet."""
    pieces = _piece_hashes(contents, p)
    regular = iter(contents)
    for f in files:
        if "attr" not in f:
            path = base / CID / Path(*f["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            content = next(regular)
            if isinstance(content, int):
                with open(path, "wb") as out:
                    out.truncate(content)
            else:
                path.write_bytes(content)
    info = bencode({"files": files, "name": CID, "piece length": p, "pieces": pieces})
    seeder.seed(b"d" + bencode("info") + info + b"e", base)
    return f"magnet:?xt=urn:btih:{hashlib.sha1(info).hexdigest()}&dn={CID}&x.pe={seeder.peer}"


def built_weeks(tmp_path: Path, weeks: int = 1, per_week: int = 50, size: int = 300) -> ControlNode:
    """A control node under ``tmp_path/control`` that archived ``weeks`` weeks of ``per_week``
    spec-layout records of ``size`` bytes each."""
    layout = get_layout("spec")
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(weeks), per_week, size)
    control = ControlNode(tmp_path / "control", KEY, layout, MessageStore())
    control.ingest_streams(LocalStreams(log), "community")
    control.build(START + weeks * WEEK)
    return control


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())


@pytest.mark.parametrize(
    "shape",
    ["index in a subfolder", "index a symlink", "data in a subfolder", "a third file"],
)
def test_a_torrent_not_made_of_data_then_index_is_refused_before_a_byte_is_written(
    tmp_path, seeder, shape
):
    # the member reads <name>/data and <name>/index: a torrent laying its files out otherwise
    # made it open a missing file (ENOENT), a symlink libtorrent points at itself (ELOOP), or
    # an index an earlier fetch left there, untyped, and MemberNode.step did not postpone
    control = built_weeks(tmp_path)
    data = (tmp_path / "control" / CID / "data").read_bytes()
    index = (tmp_path / "control" / CID / "index").read_bytes()
    files: list[dict] = [
        {"length": len(data), "path": ["data"]},
        {"length": len(index), "path": ["index"]},
    ]
    contents = [data, index]
    if shape == "index in a subfolder":
        files[1]["path"] = ["sub", "index"]
    elif shape == "index a symlink":
        files[1] = {"length": 0, "path": ["index"], "attr": "l", "symlink path": ["..", "x"]}
        contents = [data]
    elif shape == "data in a subfolder":
        files[0]["path"] = ["sub", "data"]
    else:
        files.append({"length": PIECE_LENGTH, "path": ["extra"]})
        contents.append(bytes(PIECE_LENGTH))
    magnet = seed_files(seeder, tmp_path / "hostile", files, contents)
    store = MessageStore()
    before = store.snapshot()
    with pytest.raises(CorruptIndex, match="exactly the plain files"):
        fetch_archives(magnet, tmp_path / "m", store, get_layout("spec"), CID, timeout=10)
    assert store.snapshot() == before
    assert _files_under(tmp_path / "m") == []
    # the member node postpones the link as for any bad fetch, and keeps following
    member = MemberNode(tmp_path / "m", store, get_layout("spec"), CID, wait_ns=NS)
    member.core.magnet, member.core.last_at_ns = magnet, 0
    with pytest.raises(ArchiveError):
        member.step(5 * NS, timeout=10)
    assert member.core.due(5 * NS) is None and member.core.due(6 * NS) == magnet
    # a good torrent into the same folder afterwards: fetched and hydrated
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    report = fetch_archives(
        control.magnet((seeder.peer,)), tmp_path / "m", store, get_layout("spec"), CID, timeout=10
    )
    assert report.hydrated_messages == 50 and store.count() == 50


@pytest.mark.parametrize("piece", [2 * PIECE_LENGTH, PIECE_LENGTH // 2, 16 * 1024])
def test_a_torrent_whose_pieces_are_not_100_kib_is_refused_before_a_byte_is_downloaded(
    tmp_path, seeder, piece
):
    # Found from outside: the index counts 100 KiB pieces (status-go ``pieceLength``), the
    # member never checked the torrent's own: 200 KiB pieces made it ask libtorrent for pieces
    # past the end (a bare IndexError through MemberNode.step: the link was never postponed
    # and ``archives follow`` died), 50/16 KiB pieces fetched the wrong ones (CorruptArchive)
    layout = get_layout("spec")
    archives, offset = [], 0
    for w in range(3):  # three archives of one 100 KiB piece each: 300 KiB of data
        records = [record(layout, START + w * WEEK + i * DAY) for i in range(5)]
        meta = ArchiveMetadata(START + w * WEEK, START + (w + 1) * WEEK, ())
        archives.append(layout.encode_archive(meta, records, offset))
        offset += archives[-1].size
    data = b"".join(a.data_bytes() for a in archives)
    index = layout.encode_index([a.entry for a in archives])
    files = [{"length": len(data), "path": ["data"]}, {"length": len(index), "path": ["index"]}]
    magnet = seed_files(seeder, tmp_path / "hostile", files, [data, index], piece)
    store = MessageStore()
    before = store.snapshot()
    seen: list[int] = []
    with pytest.raises(CorruptIndex, match=f"torrent has {piece}-byte pieces, not the 102400"):
        fetch_archives(
            magnet, tmp_path / "m", store, layout, CID, timeout=10, deadline=30,
            progress=lambda pr: seen.append(pr.bytes_downloaded),
        )  # fmt: skip
    assert seen == [] and store.snapshot() == before
    assert _files_under(tmp_path / "m") == []
    # the member node backs off as for any bad torrent (its loop catches ArchiveError)
    member = MemberNode(tmp_path / "m", store, layout, CID, wait_ns=NS)
    member.core.magnet, member.core.last_at_ns = magnet, 0
    with pytest.raises(CorruptIndex):
        member.step(5 * NS, timeout=10, deadline=30)
    assert member.core.due(5 * NS) is None and member.core.due(6 * NS) == magnet


def test_a_torrent_without_the_file_asked_for_is_the_seeders_fault(tmp_path, seeder):
    # Fetcher.file_range raised ArchiveConfigError (the caller's configuration) for a torrent
    # the seeder made without an index
    data = bytes(PIECE_LENGTH)
    magnet = seed_files(
        seeder, tmp_path / "hostile", [{"length": len(data), "path": ["data"]}], [data]
    )
    fetcher = Fetcher(tmp_path / "m")
    try:
        fetcher.metadata(magnet, timeout=10)
        assert fetcher.file_range("data") == (0, PIECE_LENGTH)
        with pytest.raises(CorruptIndex, match="torrent has no 'index' file"):
            fetcher.file_range("index")
    finally:
        fetcher.close()


def test_an_index_past_max_index_bytes_is_refused_before_it_is_downloaded(tmp_path, seeder):
    # the member read the torrent's whole index into memory, whatever its size (a 9 MB index of
    # 100,000 minimal entries decoded in 1.8 s and 76 MB: gigabytes took the member's memory)
    size = MAX_INDEX_BYTES + 1
    files = [{"length": 0, "path": ["data"]}, {"length": size, "path": ["index"]}]
    magnet = seed_files(seeder, tmp_path / "hostile", files, [b"", bytes(size)])
    store = MessageStore()
    seen: list[int] = []
    with pytest.raises(CorruptIndex, match=f"index of {size} bytes: more than"):
        fetch_archives(
            magnet, tmp_path / "m", store, get_layout("spec"), CID, timeout=10,
            progress=lambda p: seen.append(p.bytes_downloaded),
        )  # fmt: skip
    assert seen == [] and store.archive_ids() == set()
    index = tmp_path / "m" / CID / "index"
    assert not index.exists() or index.read_bytes().count(0) == index.stat().st_size
    # and the bound holds for an index already on disk (``archives ls``)
    with pytest.raises(CorruptIndex, match="more than"):
        get_layout("status-go").decode_index(bytes(size))


def test_an_archive_past_max_fetched_archive_bytes_is_refused_before_it_is_downloaded(
    tmp_path, seeder
):
    # the member downloaded whatever size the index named (data is the seeder's choice: 128 MiB
    # of zeros here), then read it whole into memory: a torrent naming 100 GB took the disk,
    # then the memory. Refused on the index, with the default bound
    layout = get_layout("spec")
    p = PIECE_LENGTH
    size = (MAX_FETCHED_ARCHIVE_BYTES // p + 1) * p
    entry = layout.make_entry(ArchiveMetadata(START, START + WEEK, ()), 0, size, 0)
    index = layout.encode_index([entry])
    files = [{"length": size, "path": ["data"]}, {"length": len(index), "path": ["index"]}]
    magnet = seed_files(seeder, tmp_path / "hostile", files, [size, index])
    store = MessageStore()
    before = store.snapshot()
    seen: list[int] = []
    with pytest.raises(ArchiveTooLarge, match=f"is {size} bytes .*more than the") as ei:
        fetch_archives(
            magnet, tmp_path / "m", store, layout, CID, timeout=10,
            progress=lambda pr: seen.append(pr.bytes_downloaded),
        )  # fmt: skip
    assert isinstance(ei.value, CorruptIndex)  # the seeder's fault, not the member's config
    assert store.snapshot() == before
    assert max(seen) <= len(index)  # the index only
    assert not (tmp_path / "m" / CID / "data").exists()


def test_fetch_max_archive_bytes_is_an_option_of_the_cli(tmp_path, seeder):
    # a member with less memory takes smaller archives: one line naming the archive and the
    # option, the store unchanged; the default takes the same archive
    control = built_weeks(tmp_path)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    [entry] = control.entries
    store = tmp_path / "member.sqlite"
    cli = [
        sys.executable, "-m", "loglake.archives.cli", "fetch", "--magnet",
        control.magnet((seeder.peer,)), "--root", str(tmp_path / "m"), "--store", str(store),
        "--community", CID, "--timeout", "10", "--json",
    ]  # fmt: skip
    small = entry.size - 1
    out = subprocess.run(
        [*cli, "--max-archive-bytes", str(small)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1, out.stderr
    err = " ".join(out.stderr.split())
    assert f"Error: archive {entry.archive_id[:18]}… is {entry.size} bytes" in err, err
    assert f"more than the {small} bytes this member takes (--max-archive-bytes)" in err
    assert MessageStore(store).count() == 0
    out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["hydrated_messages"] == 50


def test_a_fetch_that_stopped_after_the_index_is_retried_into_the_same_folder(tmp_path, seeder):
    # the retry found the whole index on disk: libtorrent held the torrent finished (every
    # piece wanted was had), met the seeder as one upload-only peer meets another, dropped it
    # for good, and the archive's pieces never came ("fetched 0/1 pieces, then no progress for
    # 30 s (0 peers)") — on every retry of the link (MemberNode, the node's member loop)
    control = built_weeks(tmp_path)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    magnet, layout = control.magnet((seeder.peer,)), get_layout("spec")
    store = MessageStore()

    class Stop(Exception):
        pass

    def stop(entries, missing):  # as an archive that timed out, was corrupt or too large
        raise Stop

    with pytest.raises(Stop):
        fetch_archives(magnet, tmp_path / "m", store, layout, CID, timeout=10, on_index=stop)
    assert (tmp_path / "m" / CID / "index").stat().st_size > 0
    t0 = time.monotonic()
    report = fetch_archives(magnet, tmp_path / "m", store, layout, CID, timeout=10)
    assert report.hydrated_messages == 50 and store.count() == 50
    assert time.monotonic() - t0 < 10


def test_a_seeder_that_trickles_is_cut_off_by_the_fetch_deadline(tmp_path, seeder):
    # each archive had its own 120 s (and 30 s without a piece): a seeder sending 3 pieces a
    # second held this fetch of 3 archives 7 s, one sending a piece every 29 s held N archives
    # N x 120 s. The deadline bounds the whole fetch; the pieces it got are kept for the retry
    control = built_weeks(tmp_path, 3, 60, size=2000)
    layout = control.layout
    p = PIECE_LENGTH
    data = control.data_path.read_bytes()
    assert len(data) == 6 * p
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    assert seeder.handle is not None
    # bytes a second: one piece (at 3 pieces a second, a member that keeps its connection to
    # the seed between archives fetched all 6 pieces in about the 4 s, so the cut was a race)
    seeder.handle.set_upload_limit(p)
    magnet = control.magnet((seeder.peer,))
    store = MessageStore()
    before = store.snapshot()
    t0 = time.monotonic()
    with pytest.raises(TorrentTimeout, match="the fetch's deadline of 4 s passed: fetched"):
        fetch_archives(magnet, tmp_path / "m", store, layout, CID, timeout=10, deadline=4)
    assert time.monotonic() - t0 < 5.5
    assert store.snapshot() == before
    part = tmp_path / "m" / CID / "data"
    # no data file: the deadline came before any archive piece (a loaded CI machine, where
    # metadata and index took the 4 s)
    got = part.read_bytes() if part.exists() else b""
    kept = sum(got[i : i + p] == data[i : i + p] for i in range(0, len(data), p))
    assert kept < 6  # (2 in most runs seen: the first archive's)
    seeder.handle.set_upload_limit(0)  # no limit: the retry takes what is missing
    report = fetch_archives(magnet, tmp_path / "m", store, layout, CID, timeout=10)
    assert report.hydrated_messages == 180 and store.count() == 180
    index = (tmp_path / "control" / CID / "index").stat().st_size
    assert report.bytes_downloaded <= len(data) - kept * p + index


def test_a_fetch_holds_one_archive_in_memory_not_every_one_it_fetched(tmp_path, seeder):
    # every missing archive was decoded before the first was hydrated: 8 archives of 2 MB
    # peaked at 19 MB of Python objects, and a member catching up on years of weeks at all
    # of them at once
    control = built_weeks(tmp_path, 8, 500, size=4000)
    layout = control.layout
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    largest = max(e.size for e in control.entries)
    store = MessageStore(tmp_path / "member.sqlite")
    tracemalloc.start()
    try:
        report = fetch_archives(
            control.magnet((seeder.peer,)), tmp_path / "m", store, layout, CID, timeout=10
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.hydrated_messages == 4000 and store.count() == 4000
    assert peak < 3 * largest, (peak, largest, sum(e.size for e in control.entries))


def test_an_archive_outside_its_window_after_a_good_one_leaves_the_store_as_it_was(
    tmp_path, seeder
):
    # archives are decoded as they are hydrated, in one transaction: the bad second one rolls
    # back the first
    layout = get_layout("spec")
    good = [record(layout, START + i * DAY) for i in range(5)]
    bad = [record(layout, START + 3 * WEEK)]  # in the archive of week 2
    a = layout.encode_archive(ArchiveMetadata(START, START + WEEK, ()), good, 0)
    b = layout.encode_archive(ArchiveMetadata(START + WEEK, START + 2 * WEEK, ()), bad, a.size)
    data = a.data_bytes() + b.data_bytes()
    index = layout.encode_index([a.entry, b.entry])
    files = [{"length": len(data), "path": ["data"]}, {"length": len(index), "path": ["index"]}]
    magnet = seed_files(seeder, tmp_path / "hostile", files, [data, index])
    store = MessageStore(tmp_path / "member.sqlite")
    store.add([layout.decode_record(record(layout, START + 1))])  # a live message of week 1
    before = store.snapshot()
    with pytest.raises(CorruptArchive, match="outside its time range"):
        fetch_archives(magnet, tmp_path / "m", store, layout, CID, timeout=10)
    assert store.snapshot() == before


_PEAK_CHILD = """
import pickle, sys
from loglake.archives.layout import get_layout
from loglake.archives import member
from loglake.archives.store import MessageStore
layout, entry = pickle.load(open(sys.argv[1], "rb"))
layout = get_layout(layout)
region = open(sys.argv[2], "rb").read()
def hwm():
    return int(next(x for x in open("/proc/self/status") if x.startswith("VmHWM")).split()[1])
base = hwm()
store = MessageStore()
if hasattr(member, "unpack_chunks"):  # what fetch_archives hydrates
    store.hydrate_many([(entry, member.unpack_chunks(layout, entry, region))])
else:  # (the code before the chunks, to check that this test fails on it)
    store.hydrate(entry, member.unpack(layout, entry, region))
print(len(region), (hwm() - base) * 1024)
"""


@pytest.mark.parametrize("layout_name", ["spec", "status-go"])
def test_an_archive_of_the_smallest_messages_stays_within_the_documented_peak(
    tmp_path, layout_name
):
    # Found from outside: max_archive_bytes did not bound a member's memory: an archive of
    # 4-byte records, parsed, decoded and hydrated whole, took 58-66x its bytes at the peak
    # (about 10 GB at the default bound). Hydrated a chunk at a time, the peak beyond the
    # archive's own bytes is one chunk, whatever the archive's size (in a process of its own
    # that only reads the archive: peak RSS, protobuf's arena included, the region read not)
    layout = get_layout(layout_name)
    rec = b"\x50\x02" if layout_name == "spec" else b"\x10\x01"  # a timestamp only
    n = 1_000_000
    a = layout.encode_archive(ArchiveMetadata(0, WEEK, ()), [rec] * n, 0)
    (tmp_path / "data").write_bytes(a.data_bytes())
    (tmp_path / "entry").write_bytes(pickle.dumps((layout_name, a.entry)))
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, str(tmp_path / "entry"), str(tmp_path / "data")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    size, peak = map(int, out.stdout.split())
    assert size >= 4 * n
    # measured 1-3 MB, the same for 4, 8 or 24 MB archives, 4.1 MB in a fresh-clone CI run (was
    # 58-66x the archive: 240 MB); the documented bound is one chunk, half of it asserted
    assert peak <= MEMBER_PEAK_CHUNK_BYTES // 2, (size, peak, peak / size)
