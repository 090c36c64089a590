"""A member's fetch bounded in all, not only archive by archive: the bytes of archives it
downloads at once (``max_fetch_bytes``), the archives it downloads after a corrupt one (none),
and the link it fetches again after an archive that does not decode (none). Real libtorrent on
loopback, archives of one to three 100 KiB pieces, small bounds."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

from loglake.archives.bt import Fetcher
from loglake.archives.errors import CorruptArchive, FetchTooLarge, UndecodableArchive
from loglake.archives.layout import NS, PIECE_LENGTH, get_layout
from loglake.archives.member import MemberCore, missing_archives, select_within
from loglake.archives.member_node import MemberNode, fetch_archives
from loglake.archives.messages import ArchiveMetadata
from loglake.archives.signing import encode_magnet_message
from loglake.archives.store import MessageStore
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams

from .helpers import DAY, START, WEEK, record
from .test_fetch_hostile import CID, KEY, built_weeks, seed_files

pytestmark = pytest.mark.slow

P = PIECE_LENGTH


def test_over_max_fetch_bytes_a_fetch_takes_the_newest_weeks_and_leaves_the_older(tmp_path, seeder):
    # each archive was bounded, not their sum: an index of 8 archives of 128 MiB had the member
    # download 1 GiB. Over the bound, the newest weeks that fit are fetched (a new member gets
    # the recent history), the older ones left for the next fetch, which takes them
    control = built_weeks(tmp_path, 3)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    magnet, layout = control.magnet((seeder.peer,)), control.layout
    old, *new = control.entries
    assert all(e.size == P for e in control.entries)
    index = (tmp_path / "control" / CID / "index").stat().st_size
    store = MessageStore()
    seen: list[int] = []
    report = fetch_archives(
        magnet, tmp_path / "m", store, layout, CID, timeout=10, max_fetch_bytes=2 * P,
        progress=lambda pr: seen.append(pr.bytes_downloaded),
    )  # fmt: skip
    assert report.missing == new and report.left == [old]
    assert store.archive_ids() == {e.archive_id for e in new} and store.count() == 100
    assert max(seen) <= 2 * P + index  # the older week's piece was not downloaded
    report = fetch_archives(
        magnet, tmp_path / "m", store, layout, CID, timeout=10, max_fetch_bytes=2 * P
    )
    assert report.missing == [old] and report.left == []
    assert store.count() == 150


def test_a_newest_window_over_max_fetch_bytes_is_refused_from_the_cli(tmp_path, seeder):
    # the CLI's bound: one line naming the option and a non-zero exit when not even the newest
    # week fits, nothing downloaded but the index; the older weeks left are in the report
    control = built_weeks(tmp_path, 2)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    old, new = control.entries
    store = tmp_path / "member.sqlite"
    cli = [
        sys.executable, "-m", "loglake.archives.cli", "fetch", "--magnet",
        control.magnet((seeder.peer,)), "--root", str(tmp_path / "m"), "--store", str(store),
        "--community", CID, "--timeout", "10", "--json", "--max-fetch-bytes",
    ]  # fmt: skip
    out = subprocess.run([*cli, str(P - 1)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    err = " ".join(out.stderr.split())
    assert (
        f"Error: the newest window's 1 missing archive(s) are {P} bytes: more than the {P - 1} "
        "bytes this member fetches at once (--max-fetch-bytes)"
    ) in err, err
    assert MessageStore(store).count() == 0
    assert not (tmp_path / "m" / CID / "data").exists()
    out = subprocess.run([*cli, str(P)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["missing"], got["left"]) == ([new.archive_id], [old.archive_id])
    assert "left 1 older archive(s)" in " ".join(out.stderr.split())
    assert MessageStore(store).archive_ids() == {new.archive_id}


def test_max_fetch_bytes_takes_a_window_whole_or_not_at_all():
    # status-go splits a week over 30 MB into archives sharing its [from, to): taking some of
    # them would replace the week's live messages with part of its archives
    layout = get_layout("status-go")
    s = 10**9
    week0 = layout.make_entry(ArchiveMetadata(0, 7 * DAY // s * s, ()), 0, P, 0)
    w1 = ArchiveMetadata(week0.metadata.to_ns, 2 * week0.metadata.to_ns, ())
    week1 = [layout.make_entry(w1, P, P, 0), layout.make_entry(w1, 2 * P, P, 0)]
    missing = [week0, *week1]
    assert select_within(missing, 3 * P) == (missing, [])
    assert select_within(missing, 3 * P - 1) == (week1, [week0])
    assert select_within(missing, 2 * P) == (week1, [week0])
    with pytest.raises(FetchTooLarge, match="newest window's 2 missing archive"):
        select_within(missing, 2 * P - 1)


def _corrupt_after_good(tmp_path, seeder):
    """A torrent of a good week 1, a week 2 of random bytes (two pieces), a week 3 of zeros
    (three pieces): its magnet, the data and the entries."""
    layout = get_layout("spec")
    good = layout.encode_archive(
        ArchiveMetadata(START, START + WEEK, ()),
        [record(layout, START + i * DAY) for i in range(5)],
        0,
    )
    bad = layout.make_entry(
        ArchiveMetadata(START + WEEK, START + 2 * WEEK, ()), good.size, 2 * P, 0
    )
    zeros = layout.make_entry(
        ArchiveMetadata(START + 2 * WEEK, START + 3 * WEEK, ()), bad.offset + bad.size, 3 * P, 0
    )
    data = good.data_bytes() + random.Random(7).randbytes(bad.size) + bytes(zeros.size)
    index = layout.encode_index([good.entry, bad, zeros])
    files = [{"length": len(data), "path": ["data"]}, {"length": len(index), "path": ["index"]}]
    magnet = seed_files(seeder, tmp_path / "hostile", files, [data, index])
    return magnet, data, index, (good.entry, bad, zeros)


def test_a_corrupt_archive_stops_the_fetch_before_the_next_is_downloaded_and_is_removed(
    tmp_path, seeder
):
    # every missing archive was downloaded before the first was decoded: 8 archives of 128 MiB
    # of zeros wrote 1 GiB, then the first failed; and its pieces, which matched the torrent's
    # hashes, were kept "for a retry" that could only fail the same way
    magnet, data, index, (good, bad, zeros) = _corrupt_after_good(tmp_path, seeder)
    layout = get_layout("spec")
    store = MessageStore(tmp_path / "member.sqlite")
    store.add([layout.decode_record(record(layout, START + 1))])  # a live message of week 1
    before = store.snapshot()
    seen: list[int] = []
    with pytest.raises(UndecodableArchive, match="does not decode") as ei:
        fetch_archives(
            magnet, tmp_path / "m", store, layout, CID, timeout=10,
            progress=lambda pr: seen.append(pr.bytes_downloaded),
        )  # fmt: skip
    assert isinstance(ei.value, CorruptArchive) and ei.value.archive_id == bad.archive_id
    assert store.snapshot() == before  # the good week 1 rolled back with it
    assert max(seen) <= good.size + bad.size + len(index)  # week 3 never asked for
    path = tmp_path / "m" / CID / "data"
    with open(path, "rb") as f:
        got = f.read(zeros.offset)
    assert got[: good.size] == data[: good.size]  # the good week's pieces are kept
    assert got[bad.offset :] == bytes(bad.size)  # the bad week's are gone
    # a hole where the file system makes one: the disk holds the good week's piece, no more
    assert os.stat(path).st_blocks * 512 <= good.size + 8192


def test_a_member_node_does_not_fetch_again_a_link_whose_archive_does_not_decode(tmp_path, seeder):
    # MemberNode tried every failed link again after each quiet period: a link whose archive's
    # bytes, the ones its torrent names, do not decode downloaded them again every 20 s, to fail
    # again. It waits for a new link now, across a restart too
    magnet, *_ = _corrupt_after_good(tmp_path, seeder)
    streams = LocalStreams(MemoryLog())
    streams.create_stream("special")
    streams.push("special", encode_magnet_message(1, magnet, KEY))
    layout = get_layout("spec")
    store = MessageStore(tmp_path / "member.sqlite")
    member = MemberNode(tmp_path / "member", store, layout, CID, wait_ns=1 * NS)
    member.poll(streams, "special", now_ns=10 * NS)
    with pytest.raises(UndecodableArchive):
        member.step(12 * NS, timeout=10)
    assert member.step(100 * NS, timeout=10) is None  # not after the quiet period
    streams.push("special", encode_magnet_message(2, magnet, KEY))  # the link sent again
    [ignored] = member.poll(streams, "special", now_ns=200 * NS)
    assert ignored.reason == "magnet link whose archive does not decode"  # type: ignore[union-attr]
    assert member.step(300 * NS, timeout=10) is None
    member = MemberNode(tmp_path / "member", store, layout, CID, wait_ns=1 * NS)  # a restart
    assert member.step(400 * NS, timeout=10) is None
    # a new link is fetched, into the same folder
    control = built_weeks(tmp_path, 2)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    streams.push("special", encode_magnet_message(3, control.magnet((seeder.peer,)), KEY))
    member.poll(streams, "special", now_ns=500 * NS)
    report = member.step(502 * NS, timeout=10)
    assert report is not None and report.hydrated_messages == 100 and store.count() == 100


def test_the_fetcher_keeps_the_seeder_while_an_archive_is_hydrated(tmp_path, seeder):
    # archives come one at a time now, each hydrated before the next is asked for: libtorrent
    # closed the connection to the seed as soon as every piece asked for was had, and never
    # dialed it again (a 30 MB week of status-go archives, hydrated under load: "fetched 0/50
    # pieces, then no progress for 30 s (0 peers)")
    control = built_weeks(tmp_path, 2)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    first, second = control.entries
    fetcher = Fetcher(tmp_path / "m")
    try:
        fetcher.metadata(control.magnet((seeder.peer,)), timeout=10)
        fetcher.start()
        fetcher.download(first.pieces)
        h = fetcher.handle
        assert h is not None
        # as long as a slow hydrate: the connection went within a second, at libtorrent's tick
        end = time.monotonic() + 3
        while time.monotonic() < end:
            assert h.status().num_peers == 1
            time.sleep(0.05)
        fetcher.download(second.pieces, stall_timeout=10)
        assert all(h.have_piece(i) for i in second.pieces)
    finally:
        fetcher.close()


def test_a_member_node_fetches_the_same_link_again_until_no_archive_is_left(tmp_path, seeder):
    # MemberNode marked a link done after a fetch that left older archives over the bound, and
    # the control node publishes a link only for a new archive (weekly) or at its start: a
    # member behind by more than the bound caught up a bound per week. It fetches the same link
    # again after the quiet period now, a bound at a time, newest first, across a restart too
    control = built_weeks(tmp_path, 3)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    magnet, layout = control.magnet((seeder.peer,)), control.layout
    w1, w2, w3 = control.entries
    index = (tmp_path / "control" / CID / "index").stat().st_size
    streams = LocalStreams(MemoryLog())
    streams.create_stream("special")
    streams.push("special", encode_magnet_message(1, magnet, KEY))
    store = MessageStore(tmp_path / "member.sqlite")
    member = MemberNode(tmp_path / "member", store, layout, CID, wait_ns=10 * NS)
    member.poll(streams, "special", now_ns=10 * NS)
    kw = {"timeout": 10, "max_fetch_bytes": P}
    report = member.step(20 * NS, **kw)
    assert report is not None and (report.missing, report.left) == ([w3], [w1, w2])
    assert member.step(29 * NS, **kw) is None  # a pause of one quiet period first
    report = member.step(30 * NS, **kw)
    assert report is not None and (report.missing, report.left) == ([w2], [w1])
    assert report.bytes_downloaded <= P + index  # only the next week's piece
    member = MemberNode(tmp_path / "member", store, layout, CID, wait_ns=10 * NS)  # a restart
    assert member.step(39 * NS, **kw) is None
    report = member.step(40 * NS, **kw)
    assert report is not None and (report.missing, report.left) == ([w1], [])
    assert store.archive_ids() == {w1.archive_id, w2.archive_id, w3.archive_id}
    assert store.count() == 150
    assert member.step(1000 * NS, **kw) is None  # nothing left: the link is done
    streams.push("special", encode_magnet_message(2, magnet, KEY))
    [ignored] = member.poll(streams, "special", now_ns=2000 * NS)
    assert ignored.reason == "magnet link already fetched"  # type: ignore[union-attr]


def test_a_member_node_stops_fetching_a_link_whose_older_window_alone_is_over_the_bound(
    tmp_path, seeder
):
    # fetched again for the archives left, a link whose next window is over the bound alone
    # would be refused (FetchTooLarge) after every quiet period, the index downloaded each time:
    # the newer windows are kept, the link done, and the next link fetched as usual
    layout = get_layout("spec")
    big = layout.encode_archive(
        ArchiveMetadata(START, START + WEEK, ()),
        [record(layout, START + i * 1000, b"x" * 300) for i in range(400)],
        0,
    )
    assert big.size == 2 * P
    weeks = [big]
    for w in (1, 2):
        weeks.append(
            layout.encode_archive(
                ArchiveMetadata(START + w * WEEK, START + (w + 1) * WEEK, ()),
                [record(layout, START + w * WEEK + DAY)],
                weeks[-1].entry.offset + weeks[-1].size,
            )
        )
    assert [a.size for a in weeks] == [2 * P, P, P]
    data = b"".join(a.data_bytes() for a in weeks)
    index = layout.encode_index([a.entry for a in weeks])
    files = [{"length": len(data), "path": ["data"]}, {"length": len(index), "path": ["index"]}]
    magnet = seed_files(seeder, tmp_path / "seed", files, [data, index])
    streams = LocalStreams(MemoryLog())
    streams.create_stream("special")
    streams.push("special", encode_magnet_message(1, magnet, KEY))
    store = MessageStore(tmp_path / "member.sqlite")
    member = MemberNode(tmp_path / "member", store, layout, CID, wait_ns=1 * NS)
    member.poll(streams, "special", now_ns=10 * NS)
    kw = {"timeout": 10, "max_fetch_bytes": P}
    report = member.step(11 * NS, **kw)
    assert report is not None and len(report.left) == 2
    report = member.step(12 * NS, **kw)
    assert report is not None and report.left == [weeks[0].entry]
    with pytest.raises(FetchTooLarge, match="not fetched again with this bound"):
        member.step(13 * NS, **kw)
    assert store.archive_ids() == {weeks[1].entry.archive_id, weeks[2].entry.archive_id}
    assert member.step(100 * NS, **kw) is None  # not after the quiet period
    assert not member.core.pending()
    # a larger bound and the control node's next link take it
    control = built_weeks(tmp_path, 1)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    streams.push("special", encode_magnet_message(2, control.magnet((seeder.peer,)), KEY))
    member.poll(streams, "special", now_ns=200 * NS)
    assert member.core.left is None
    report = member.step(202 * NS, timeout=10)
    assert report is not None and report.left == []


def test_a_fetch_of_the_same_link_that_leaves_no_fewer_archives_ends_it():
    # each fetch of a link for the archives left must leave fewer: one that does not (nothing
    # it took was kept) would come again after every quiet period, for ever
    core = MemberCore(CID, wait_ns=1 * NS)
    core.magnet, core.last_at_ns = "magnet:?xt=urn:btih:" + "ab" * 20, 0
    assert core.leave(core.magnet, 3, 5 * NS) and core.due(5 * NS) is None
    assert core.due(6 * NS) == core.magnet
    assert core.leave(core.magnet, 2, 6 * NS)
    assert not core.leave(core.magnet, 2, 7 * NS)
    assert core.last_fetched == core.magnet and core.due(100 * NS) is None
    assert core.left is None


def test_max_fetch_bytes_takes_a_window_whole_when_a_signed_index_interleaves_windows():
    # the windows were grouped by adjacency in the list sorted by (from, offset): windows
    # sharing a `from`, interleaved by offset (A1, B, A2), had window A split, A2 taken, A1 left
    layout = get_layout("status-go")
    a, b = ArchiveMetadata(0, WEEK // NS * NS, ()), ArchiveMetadata(0, 2 * WEEK // NS * NS, ())
    a1, bb, a2 = (layout.make_entry(m, i * P, P, 0) for i, m in enumerate((a, b, a)))
    missing = missing_archives([a1, bb, a2], set())
    assert missing == [a1, bb, a2]
    assert select_within(missing, 2 * P) == ([bb], [a1, a2])
    assert select_within(missing, 3 * P) == (missing, [])
