"""Trackers in archive torrents and magnet links.

status-go puts its ``defaultAnnounceList`` (protocol/communities/manager.go) in every archive
torrent's ``announce-list`` (manager_archive_file.go) and derives the magnet with anacrolix
``MetaInfo.Magnet``, which writes one ``tr=`` per tracker after ``dn``. The spec layout has none
unless the user names some; both are configurable (CLI, node config, Spark job).
"""

from __future__ import annotations

import warnings

import libtorrent as lt
import pytest
from click.testing import CliRunner
from coincurve import PrivateKey

from loglake.archives.bt import Seeder
from loglake.archives.cli import command
from loglake.archives.control import ControlNode
from loglake.archives.errors import ArchiveConfigError
from loglake.archives.layout import NS, get_layout
from loglake.archives.member_node import fetch_archives
from loglake.archives.signing import community_id
from loglake.archives.store import MessageStore
from loglake.log import MemoryLog, open_log
from loglake.node.config import ConfigError, load_config
from loglake.streams.api import LocalStreams

from .helpers import START, WEEK, fill_weeks
from .tracker import Tracker

KEY = PrivateKey(bytes.fromhex("88" * 32))
CID = community_id(KEY)

# status-go protocol/communities/manager.go, ``defaultAnnounceList`` (one tracker per tier)
STATUS_GO_ANNOUNCE_LIST = [
    ["udp://tracker.opentrackr.org:1337/announce"],
    ["udp://tracker.openbittorrent.com:6969/announce"],
]


def _control(tmp_path, layout_name: str, log: MemoryLog | None = None, **kw) -> ControlNode:
    layout = get_layout(layout_name)
    if log is None:
        log = MemoryLog()
        fill_weeks(log, "community", layout, range(1), 20)
    node = ControlNode(tmp_path / "control", KEY, layout, MessageStore(), **kw)
    node.ingest_streams(LocalStreams(log), "community")
    node.build(START + WEEK)
    return node


def _announce_list(metainfo: bytes) -> tuple[str | None, list[list[str]]]:
    d = lt.bdecode(metainfo)
    first = d.get(b"announce")
    tiers = [[u.decode() for u in tier] for tier in d.get(b"announce-list", [])]
    return (first.decode() if first else None), tiers


def test_status_go_torrent_and_magnet_carry_status_go_default_trackers(tmp_path):
    node = _control(tmp_path, "status-go")
    meta = node.torrent().metainfo()
    first, tiers = _announce_list(meta)
    assert tiers == STATUS_GO_ANNOUNCE_LIST
    assert first == STATUS_GO_ANNOUNCE_LIST[0][0]
    # libtorrent reads them from the .torrent file ...
    with warnings.catch_warnings():  # trackers() is marked deprecated in the 2.x binding
        warnings.simplefilter("ignore", DeprecationWarning)
        got = [(t.url, t.tier) for t in lt.torrent_info(meta).trackers()]
    assert got == [
        (STATUS_GO_ANNOUNCE_LIST[0][0], 0),
        (STATUS_GO_ANNOUNCE_LIST[1][0], 1),
    ]
    # ... and from the magnet link, which has anacrolix's shape: xt, dn, then each tr
    magnet = node.magnet()
    assert magnet == (
        f"magnet:?xt=urn:btih:{node.torrent().info_hash}&dn={CID}"
        "&tr=udp%3A%2F%2Ftracker.opentrackr.org%3A1337%2Fannounce"
        "&tr=udp%3A%2F%2Ftracker.openbittorrent.com%3A6969%2Fannounce"
    )
    assert list(lt.parse_magnet_uri(magnet).trackers) == [t[0] for t in STATUS_GO_ANNOUNCE_LIST]


def test_trackers_do_not_change_the_info_hash(tmp_path):
    log = MemoryLog()
    fill_weeks(log, "community", get_layout("status-go"), range(1), 20)
    with_defaults = _control(tmp_path / "a", "status-go", log).torrent()
    without = _control(tmp_path / "b", "status-go", log, announce=()).torrent()
    assert with_defaults.info_hash == without.info_hash
    assert _announce_list(without.metainfo()) == (None, [])
    assert "tr=" not in without.magnet(CID)


def test_spec_layout_has_no_trackers_unless_given(tmp_path):
    assert _announce_list(_control(tmp_path / "a", "spec").torrent().metainfo()) == (None, [])
    mine = ("http://tracker.example:6969/announce", "udp://10.0.0.1:1337")
    node = _control(tmp_path / "b", "spec", announce=mine)
    assert _announce_list(node.torrent().metainfo()) == (mine[0], [[mine[0]], [mine[1]]])
    assert list(lt.parse_magnet_uri(node.magnet()).trackers) == list(mine)


@pytest.mark.parametrize(
    "bad",
    [
        "ftp://x/announce",
        "udp://",
        "tracker.example:80",
        "http://a b/",
        "http://x:99999/",
        # hosts libtorrent drops from a torrent and a magnet without a word
        "http://user@tracker.example/announce",
        "http://tr_acker.example/announce",
        "udp://trackér.example:80",
        "http://tracker.example/a\x7f",
        "http://tracker.example:/announce",
    ],
)
def test_a_bad_tracker_url_is_a_typed_error(tmp_path, bad):
    with pytest.raises(ArchiveConfigError, match="tracker"):
        _control(tmp_path, "status-go", announce=(bad,))


def test_a_torrent_written_before_trackers_is_rewritten_with_them(tmp_path):
    """A control node started on a root whose torrent file has no trackers (written by an
    earlier loglake) rewrites it from the index with the configured ones."""
    _control(tmp_path, "status-go", announce=())
    tfile = tmp_path / "control" / f"{CID}.torrent"
    assert _announce_list(tfile.read_bytes())[1] == []
    ControlNode(tmp_path / "control", KEY, get_layout("status-go"), MessageStore())
    assert _announce_list(tfile.read_bytes())[1] == STATUS_GO_ANNOUNCE_LIST


def _cli_build(tmp_path, *extra: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    key = tmp_path / "key"
    key.write_text(KEY.to_hex())
    layout = get_layout("status-go")
    log = open_log(tmp_path / "log")
    fill_weeks(log, "community", layout, range(1), 20)
    log.close()
    return CliRunner().invoke(
        command,
        [
            "build", "--data-dir", str(tmp_path / "log"), "--root", str(tmp_path / "root"),
            "--key-file", str(key), "--layout", "status-go",
            "--now", str((START + WEEK) // NS), *extra,
        ],
    )  # fmt: skip


def test_cli_build_takes_trackers(tmp_path):
    r = _cli_build(tmp_path / "a", "--tracker", "http://127.0.0.1:1/announce")
    assert r.exit_code == 0, r.output
    magnet = r.output.strip().splitlines()[-1]
    assert list(lt.parse_magnet_uri(magnet).trackers) == ["http://127.0.0.1:1/announce"]
    meta = (tmp_path / "a" / "root" / f"{CID}.torrent").read_bytes()
    assert _announce_list(meta)[1] == [["http://127.0.0.1:1/announce"]]

    r = _cli_build(tmp_path / "b")  # status-go's defaults
    assert list(lt.parse_magnet_uri(r.output.strip().splitlines()[-1]).trackers) == [
        t[0] for t in STATUS_GO_ANNOUNCE_LIST
    ]
    r = _cli_build(tmp_path / "c", "--no-trackers")
    assert "tr=" not in r.output.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "extra",
    [("--tracker", "ftp://nowhere"), ("--tracker", "http://127.0.0.1:1/a", "--no-trackers")],
)
def test_cli_bad_trackers_are_one_readable_line(tmp_path, extra):
    r = _cli_build(tmp_path, *extra)
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "tracker" in r.output


def test_node_config_trackers(tmp_path):
    cfg = load_config(data={"archives": {"trackers": ["udp://t.example:1337/announce"]}}, env={})
    assert cfg.archives.trackers == ("udp://t.example:1337/announce",)
    assert load_config(data={"archives": {"trackers": []}}, env={}).archives.trackers == ()
    assert load_config(data={}, env={}).archives.trackers is None  # the layout's defaults
    env = {"LOGLAKE_ARCHIVES_TRACKERS": "http://a.example/announce, udp://b.example:1"}
    assert load_config(data={}, env=env).archives.trackers == (
        "http://a.example/announce",
        "udp://b.example:1",
    )
    with pytest.raises(ConfigError, match=r"\[archives\] trackers: tracker 'gopher://x'"):
        load_config(data={"archives": {"trackers": ["gopher://x"]}}, env={})
    with pytest.raises(ConfigError, match=r"\[archives\] trackers: .*list of tracker URLs"):
        load_config(data={"archives": {"trackers": 5}}, env={})


@pytest.mark.slow
def test_a_member_finds_the_seeder_through_the_magnets_tracker_alone(tmp_path):
    """A magnet with ``tr=`` and no peer hint: libtorrent on both sides announces to the
    tracker (loopback), the member gets the seeder from it and fetches."""
    tracker = Tracker()
    seeder = Seeder()
    try:
        node = _control(tmp_path, "status-go", announce=(tracker.url,))
        seeder.seed(node.torrent().metainfo(), tmp_path / "control")
        seeder.handle.force_reannounce()
        magnet = node.magnet()
        assert "x.pe=" not in magnet and "tr=" in magnet
        store = MessageStore()
        report = fetch_archives(magnet, tmp_path / "m", store, get_layout("status-go"), CID)
        assert report.hydrated_messages == store.count() == 20
        assert tracker.announces >= 2  # the seeder and the member
    finally:
        seeder.close()
        tracker.close()
