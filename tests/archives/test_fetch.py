"""Control node seeds with libtorrent on loopback; a member downloads, verifies, hydrates.

The first test runs the member in another process (``python -m loglake.archives.cli fetch``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from coincurve import PrivateKey

from loglake.archives.control import ControlNode
from loglake.archives.errors import CorruptIndex, MisalignedArchive, TorrentTimeout
from loglake.archives.layout import PIECE_LENGTH, get_layout
from loglake.archives.member_node import fetch_archives
from loglake.archives.signing import community_id
from loglake.archives.store import MessageStore
from loglake.archives.torrent import PieceHashes, build_torrent
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams

from .helpers import START, WEEK, fill_weeks

pytestmark = pytest.mark.slow

KEY = PrivateKey(bytes.fromhex("55" * 32))
CID = community_id(KEY)


def run_member(magnet, root, store, layout) -> dict:
    out = subprocess.run(
        [
            sys.executable, "-m", "loglake.archives.cli", "fetch", "--magnet", magnet,
            "--root", str(root), "--store", str(store), "--layout", layout,
            "--community", CID, "--timeout", "15", "--json",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("layout_name", ["spec", "status-go"])
def test_member_process_fetches_then_fetches_only_week_3(tmp_path, seeder, layout_name):
    layout = get_layout(layout_name)
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(3), 1500)
    control = ControlNode(tmp_path / "control", KEY, layout, MessageStore())
    control.ingest_streams(LocalStreams(log), "community")
    control.build(START + 2 * WEEK)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    store_path = tmp_path / "member.sqlite"

    first = run_member(control.magnet((seeder.peer,)), tmp_path / "m1", store_path, layout_name)
    weeks12 = control.entries
    assert first["archives"] == 2 and len(first["missing"]) == 2
    assert first["hydrated_messages"] == 3000
    member = MessageStore(store_path)
    assert [raw for *_, raw in member.messages()] == [
        raw for *_, raw in control.store.messages(START, START + 2 * WEEK)
    ]
    member.close()

    out = control.build(START + 3 * WEEK)
    week3 = out.new[0]
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    # a fresh folder: the member keeps only its store (the keccak ids of weeks 1-2)
    second = run_member(control.magnet((seeder.peer,)), tmp_path / "m2", store_path, layout_name)
    assert second["missing"] == [week3.archive_id]
    index_size = (tmp_path / "control" / CID / "index").stat().st_size
    assert week3.size <= second["bytes_downloaded"] <= week3.size + index_size
    assert second["bytes_downloaded"] < sum(e.size for e in weeks12)
    member = MessageStore(store_path)
    assert member.archive_ids() == {e.archive_id for e in control.entries}
    assert member.count() == 4500
    member.close()
    # nothing outside week 3 and index was written in the fresh folder
    data = (tmp_path / "m2" / CID / "data").read_bytes()
    assert data[: week3.offset].count(0) == week3.offset


def test_magnet_to_a_missing_torrent_times_out_and_store_is_unchanged(tmp_path):
    store = MessageStore()
    store.add([])
    before = store.snapshot()
    magnet = "magnet:?xt=urn:btih:" + "ee" * 20 + f"&dn={CID}&x.pe=127.0.0.1:9"
    with pytest.raises(TorrentTimeout, match="no peer gave the torrent's metadata"):
        fetch_archives(magnet, tmp_path, store, get_layout("spec"), CID, timeout=1.0)
    assert store.snapshot() == before


def test_fetch_deadline_bounds_the_whole_fetch_from_the_cli(tmp_path):
    # without a peer, `fetch` waited for the metadata twice (20 s, one retry): 40 s
    magnet = "magnet:?xt=urn:btih:" + "ee" * 20 + f"&dn={CID}&x.pe=127.0.0.1:9"
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "loglake.archives.cli", "fetch", "--magnet", magnet,
         "--root", str(tmp_path / "m"), "--deadline", "1.5", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    err = " ".join(out.stderr.split())
    assert "Error: the fetch's deadline of 1.5 s passed before a peer gave the torrent's" in err
    assert time.monotonic() - t0 < 8  # the interpreter and libtorrent start, then 1.5 s


def _seed_custom(tmp_path, seeder, data: bytes, index: bytes) -> str:
    folder = tmp_path / "control" / CID
    folder.mkdir(parents=True)
    (folder / "data").write_bytes(data)
    (folder / "index").write_bytes(index)
    hashes = PieceHashes()
    hashes.extend(data)
    t = build_torrent(CID, hashes, index)
    seeder.seed(t.metainfo(), tmp_path / "control")
    return t.magnet(CID, (seeder.peer,))


def _one_archive(layout, tmp_path):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(1), 100)
    control = ControlNode(tmp_path / "build", KEY, layout, MessageStore())
    control.ingest_streams(LocalStreams(log), "community")
    control.build(START + WEEK)
    return (tmp_path / "build" / CID / "data").read_bytes(), control.entries[0]


def _member_with_history():
    store = MessageStore()
    layout = get_layout("status-go")
    from .helpers import record

    store.add([layout.decode_record(record(layout, START + 5))])
    return store


def test_corrupt_index_is_a_typed_error_and_store_is_unchanged(tmp_path, seeder):
    layout = get_layout("status-go")
    data, _ = _one_archive(layout, tmp_path)
    magnet = _seed_custom(tmp_path, seeder, data, b"\x0a\x05garbage-not-an-index")
    store = _member_with_history()
    before = store.snapshot()
    with pytest.raises(CorruptIndex):
        fetch_archives(magnet, tmp_path / "m", store, layout, CID, timeout=10)
    assert store.snapshot() == before


def test_archive_size_not_a_multiple_of_piece_length_is_rejected(tmp_path, seeder):
    layout = get_layout("status-go")
    data, entry = _one_archive(layout, tmp_path)
    bad = layout._index_metadata_pb(entry.metadata, 0, entry.size - 100, entry.padding)
    raw = bad.SerializeToString(deterministic=True)
    from loglake.archives.layout import archive_id

    index = layout._index_cls()
    index.archives[archive_id(raw)].ParseFromString(raw)
    magnet = _seed_custom(tmp_path, seeder, data, index.SerializeToString())
    store = _member_with_history()
    before = store.snapshot()
    with pytest.raises(MisalignedArchive):
        fetch_archives(magnet, tmp_path / "m", store, layout, CID, timeout=10)
    assert store.snapshot() == before
    assert entry.size % PIECE_LENGTH == 0


def test_member_node_follows_the_special_channel_and_hydrates(tmp_path, seeder):
    from loglake.archives.layout import NS
    from loglake.archives.member_node import MemberNode
    from loglake.streams.api import LocalStreams

    layout = get_layout("spec")
    log = MemoryLog()
    streams = LocalStreams(log)
    fill_weeks(log, "community", layout, range(1), 200)
    control = ControlNode(tmp_path / "control", KEY, layout, MessageStore())
    control.ingest_streams(streams, "community")
    control.build(START + WEEK)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    control.publish_magnet(streams, "special", clock=1, peers=(seeder.peer,))
    member = MemberNode(tmp_path / "member", MessageStore(), layout, CID, wait_ns=2 * NS)
    member.poll(streams, "special", now_ns=10 * NS)
    assert member.step(11 * NS) is None  # still inside the quiet period
    report = member.step(12 * NS, timeout=10)
    assert report is not None and report.hydrated_messages == 200
    assert member.store.count() == 200
    assert member.step(100 * NS) is None  # the same magnet is not fetched twice


def test_fetch_only_archives_of_a_time_range(tmp_path, seeder):
    # spec "Downloading message archives", option 3: download specific archives
    layout = get_layout("spec")
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(3), 600)
    control = ControlNode(tmp_path / "control", KEY, layout, MessageStore())
    control.ingest_streams(LocalStreams(log), "community")
    control.build(START + 3 * WEEK)
    seeder.seed(control.torrent().metainfo(), tmp_path / "control")
    week2 = control.entries[1]
    store = MessageStore()
    report = fetch_archives(
        control.magnet((seeder.peer,)), tmp_path / "m", store, layout, CID, timeout=10,
        since_ns=START + WEEK + 1, until_ns=START + 2 * WEEK,
    )  # fmt: skip
    assert [e.archive_id for e in report.missing] == [week2.archive_id]
    index_size = (tmp_path / "control" / CID / "index").stat().st_size
    assert week2.size <= report.bytes_downloaded <= week2.size + index_size
    assert store.archive_ids() == {week2.archive_id} and store.count() == 600
