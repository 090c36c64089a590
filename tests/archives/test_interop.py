"""Third-party BitTorrent clients download our torrent from our libtorrent seeder and get
byte-identical ``data`` and ``index``: aria2c (through a local tracker: it ignores ``x.pe``) and
transmission-cli (our seeder dials it: it ignores 127.x peers from trackers). Both come from
Debian (scripts/system-deps.sh)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from coincurve import PrivateKey

from loglake.archives.bt import Seeder
from loglake.archives.control import ControlNode
from loglake.archives.layout import get_layout
from loglake.archives.signing import community_id
from loglake.archives.store import MessageStore
from loglake.log import MemoryLog
from tests.procs import free_port

from .helpers import START, WEEK, fill_weeks
from .tracker import Tracker

pytestmark = [pytest.mark.slow, pytest.mark.interop]

KEY = PrivateKey(bytes.fromhex("66" * 32))
CID = community_id(KEY)


@pytest.fixture
def tracker():
    t = Tracker()
    yield t
    t.close()


def build(tmp_path, announce=()):
    layout = get_layout("status-go")
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(2), 3000)
    control = ControlNode(tmp_path / "control", KEY, layout, MessageStore(), announce=announce)
    control.ingest_log(log, "community")
    control.build(START + 2 * WEEK)
    return control


def assert_identical(control_root, downloaded_root):
    for name in ("data", "index"):
        ours = (control_root / CID / name).read_bytes()
        theirs = (downloaded_root / CID / name).read_bytes()
        assert theirs == ours, name


@pytest.mark.skipif(shutil.which("aria2c") is None, reason="aria2c not installed")
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


@pytest.mark.skipif(shutil.which("transmission-cli") is None, reason="transmission-cli missing")
def test_transmission_cli_downloads_identical_files(tmp_path):
    control = build(tmp_path)
    tfile = tmp_path / "archive.torrent"
    tfile.write_bytes(control.torrent().metainfo())
    conf = tmp_path / "tconf"
    conf.mkdir()
    port = free_port()
    (conf / "settings.json").write_text(
        json.dumps(
            {
                "dht-enabled": False,
                "lpd-enabled": False,
                "pex-enabled": False,
                "utp-enabled": False,
                "port-forwarding-enabled": False,
                "peer-port": port,
                "bind-address-ipv4": "127.0.0.1",
                "rpc-enabled": False,
            }
        )
    )
    out = tmp_path / "transmission"
    out.mkdir()
    done = tmp_path / "done"
    script = tmp_path / "finished.sh"
    script.write_text(f"#!/bin/sh\ntouch {done}\n")
    script.chmod(0o755)
    seeder = Seeder()
    proc = subprocess.Popen(
        ["transmission-cli", "-g", str(conf), "-w", str(out), "-p", str(port),
         "-f", str(script), str(tfile)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        seeder.seed(control.torrent().metainfo(), tmp_path / "control")
        deadline = time.monotonic() + 90
        next_dial = 0.0
        while not done.exists():
            assert time.monotonic() < deadline, "transmission-cli did not finish"
            assert proc.poll() is None, "transmission-cli exited early"
            if time.monotonic() > next_dial:
                seeder.connect("127.0.0.1", port)  # transmission ignores 127.x tracker peers
                next_dial = time.monotonic() + 2
            time.sleep(0.2)
        assert_identical(tmp_path / "control", out)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        seeder.close()
