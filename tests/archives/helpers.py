"""Shared builders for the archives tests."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from loglake.archives.layout import NS, Layout
from loglake.log.api import Entry, Log
from tests.procs import free_port, stop

START = 1577836800 * NS  # 2020-01-01, as in status-go's archive tests
DAY = 86400 * NS
WEEK = 7 * DAY
SG_TOPIC = bytes.fromhex("d7a5d2c3")
SPEC_TOPIC = "/status/1/community-chat/proto"


def topic_for(layout: Layout):
    return SG_TOPIC if layout.name == "status-go" else SPEC_TOPIC


def record(layout: Layout, at_ns: int, payload: bytes = b"hello") -> bytes:
    extra = {"sig": b"\x01" * 65} if layout.name == "status-go" else {}
    return layout.make_record(payload=payload, topic=topic_for(layout), timestamp_ns=at_ns, **extra)


def fill_weeks(
    log: Log, stream: str, layout: Layout, weeks: range, per_week: int, size: int = 300
) -> None:
    log.create_stream(stream)
    for w in weeks:
        log.append_many(
            stream,
            [
                Entry(record(layout, START + w * WEEK + i * (WEEK // per_week), os.urandom(size)))
                for i in range(per_week)
            ],
        )


def run_transmission(
    metainfo: bytes, work: Path, seeder, budget: float
) -> tuple[Path, float] | None:
    """Download a torrent with Debian's transmission-cli from our (already seeding) ``seeder``:
    DHT/LPD/PEX/uTP off in its settings.json, loopback only, and our seeder dials it, because
    transmission-cli 3.00 ignores 127.x peers from a tracker. Returns ``(download folder,
    seconds)``, or None if it exited or did not finish within ``budget`` seconds."""
    conf, out = work / "tconf", work / "transmission"
    conf.mkdir()
    out.mkdir()
    port = free_port()
    settings = {
        "dht-enabled": False,
        "lpd-enabled": False,
        "pex-enabled": False,
        "utp-enabled": False,
        "port-forwarding-enabled": False,
        "peer-port": port,
        "bind-address-ipv4": "127.0.0.1",
        "rpc-enabled": False,
    }
    (conf / "settings.json").write_text(json.dumps(settings))
    done, script, tfile = work / "tdone", work / "tdone.sh", work / "t.torrent"
    script.write_text(f"#!/bin/sh\ntouch {done}\n")
    script.chmod(0o755)
    tfile.write_bytes(metainfo)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        ["transmission-cli", "-g", str(conf), "-w", str(out), "-p", str(port), "-f", str(script),
         str(tfile)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        next_dial = 0.0
        while not done.exists() and time.perf_counter() - t0 < budget and proc.poll() is None:
            if time.perf_counter() > next_dial:
                seeder.connect("127.0.0.1", port)
                next_dial = time.perf_counter() + 1
            time.sleep(0.05)
        return (out, time.perf_counter() - t0) if done.exists() else None
    finally:
        stop(proc)
