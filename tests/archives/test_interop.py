"""Third-party BitTorrent clients download our torrent from our libtorrent seeder and get
byte-identical ``data`` and ``index``: aria2c (through a local tracker: it ignores ``x.pe``) and
transmission-cli (our seeder dials it: it ignores 127.x peers from trackers). Both come from
Debian (scripts/system-deps.sh)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from coincurve import PrivateKey

from loglake.archives.bt import Seeder
from loglake.archives.control import ControlNode
from loglake.archives.layout import STATUS_GO_TRACKERS, get_layout
from loglake.archives.signing import community_id
from loglake.archives.store import MessageStore
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.procs import free_port

from .helpers import START, WEEK, fill_weeks, run_transmission
from .tracker import Tracker

pytestmark = [pytest.mark.slow, pytest.mark.interop]

KEY = PrivateKey(bytes.fromhex("66" * 32))
CID = community_id(KEY)


@pytest.fixture
def tracker():
    t = Tracker()
    yield t
    t.close()


def build(tmp_path, announce=None):
    layout = get_layout("status-go")
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(2), 3000)
    control = ControlNode(tmp_path / "control", KEY, layout, MessageStore(), announce=announce)
    control.ingest_streams(LocalStreams(log), "community")
    control.build(START + 2 * WEEK)
    return control


def assert_identical(control_root, downloaded_root):
    for name in ("data", "index"):
        ours = (control_root / CID / name).read_bytes()
        theirs = (downloaded_root / CID / name).read_bytes()
        assert theirs == ours, name


@pytest.mark.peer("aria2c", shutil.which("aria2c") is not None, "apt-get install aria2")
def test_aria2c_downloads_identical_files(tmp_path, tracker):
    control = build(tmp_path, announce=(tracker.url,))
    seeder = Seeder()
    try:
        seeder.seed(control.torrent().metainfo(), tmp_path / "control")
        seeder.handle.force_reannounce()
        tfile = tmp_path / "archive.torrent"
        tfile.write_bytes(control.torrent().metainfo())
        out = tmp_path / "aria2"
        proc = subprocess.run(
            [
                "aria2c", "--enable-dht=false", "--enable-dht6=false", "--bt-enable-lpd=false",
                "--enable-peer-exchange=false", "--seed-time=0", f"--dir={out}",
                f"--listen-port={free_port()}", "--bt-stop-timeout=60", "--quiet=true",
                "--console-log-level=error", "--summary-interval=0", str(tfile),
            ],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert_identical(tmp_path / "control", out)
        assert tracker.announces >= 2
    finally:
        seeder.close()


@pytest.mark.peer("aria2c", shutil.which("aria2c") is not None, "apt-get install aria2")
def test_aria2c_fetches_through_the_magnets_tracker(tmp_path, tracker):
    """The magnet alone (its ``tr=``, no peer hint, no .torrent file): aria2c asks the tracker,
    gets our seeder, resolves the metadata from it (BEP 9) and downloads identical files. The
    torrent also lists status-go's default trackers after ours, as a status-go one would."""
    control = build(tmp_path, announce=(tracker.url, *STATUS_GO_TRACKERS))
    seeder = Seeder()
    try:
        seeder.seed(control.torrent().metainfo(), tmp_path / "control")
        seeder.handle.force_reannounce()
        magnet = control.magnet()
        assert "x.pe=" not in magnet and magnet.count("&tr=") == 3
        out = tmp_path / "aria2"
        proc = subprocess.run(
            [
                "aria2c", "--enable-dht=false", "--enable-dht6=false", "--bt-enable-lpd=false",
                "--enable-peer-exchange=false", "--seed-time=0", f"--dir={out}",
                f"--listen-port={free_port()}", "--bt-stop-timeout=60", "--quiet=true",
                "--bt-save-metadata=false", "--console-log-level=error",
                "--summary-interval=0", magnet,
            ],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert_identical(tmp_path / "control", out)
    finally:
        seeder.close()


@pytest.mark.peer(
    "transmission-cli",
    shutil.which("transmission-cli") is not None,
    "apt-get install transmission-cli",
)
def test_transmission_cli_downloads_identical_files(tmp_path):
    control = build(tmp_path)
    seeder = Seeder()
    try:
        seeder.seed(control.torrent().metainfo(), tmp_path / "control")
        got = run_transmission(control.torrent().metainfo(), tmp_path, seeder, budget=90)
        assert got is not None, "transmission-cli did not finish"
        assert_identical(tmp_path / "control", got[0])
    finally:
        seeder.close()
