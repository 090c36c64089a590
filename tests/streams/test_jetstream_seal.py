"""The sealer (streams/jetstream_seal.py, issue 13): JetStream history into the lake layout, so
pulls below JetStream's retention are served from the lake, and the lake is the same table the
embedded log seals (``LAKE_SCHEMA``, ``lake/<stream>/partition=<p>/<first>-<last>.parquet``)."""

from __future__ import annotations

import logging

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from loglake.log import StreamConfig
from loglake.log.lake_schema import LAKE_SCHEMA
from loglake.streams.jetstream import JetStreamLog
from loglake.streams.jetstream_seal import JetStreamSealer, sealed_next
from tests.streams import jetstream_fixtures as fx

pytestmark = pytest.mark.slow


@pytest.fixture
def lake_log(nats_single, tmp_path):
    log = JetStreamLog(nats_single.url, prefix=fx.new_prefix(), lake_dir=str(tmp_path))
    yield log
    log.close()


def payload(i: int) -> bytes:
    return f"m{i}".encode()


def test_sealed_history_serves_pulls_below_jetstream_retention(lake_log, tmp_path) -> None:
    lake_log.create_stream("s", StreamConfig(partitions=2, retention_records=150))
    sealer = JetStreamSealer(lake_log, tmp_path)
    lake_log.push_many("s", 1, [payload(i) for i in range(100)])
    assert [(f.first, f.last) for f in sealer.seal()] == [(0, 99)]
    assert sealer.seal() == []  # idempotent
    lake_log.push_many("s", 1, [payload(i) for i in range(100, 200)])
    assert [(f.first, f.last) for f in sealer.seal(["s"])] == [(100, 199)]
    live = lake_log.stream_info("s").partitions[1]
    assert (live.first_index, live.next_index) == (50, 200)  # JetStream dropped 0..49
    assert lake_log.read_payloads("s", 0, partition=1) == [(i, payload(i)) for i in range(200)]
    assert lake_log.read_payloads("s", 3, limit=2, partition=1) == [
        (3, payload(3)),
        (4, payload(4)),
    ]
    got = lake_log.read("s", 40, limit=20, partition=1)  # lake, then JetStream
    assert [(r.index, r.data) for r in got] == [(i, payload(i)) for i in range(40, 60)]
    assert all(r.timestamp_ns > 0 for r in got)
    # the same lake table the embedded log writes
    table = pq.read_table(tmp_path / "lake" / "s" / "partition=1")
    assert table.schema.names == LAKE_SCHEMA.names and table.num_rows == 200
    assert sorted(table.column("index").to_pylist()) == list(range(200))
    assert sealed_next(tmp_path, "s", 0) == 0  # an empty partition seals nothing


def test_the_stream_service_pulls_sealed_history(lake_log, tmp_path) -> None:
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    lake_log.create_stream("o", StreamConfig(retention_records=10))
    lake_log.push_many("o", 0, [payload(i) for i in range(10)])
    JetStreamSealer(lake_log, tmp_path).seal()
    lake_log.push_many("o", 0, [payload(i) for i in range(10, 20)])
    with BackgroundServer(StreamService(lake_log)) as srv, StreamClient(port=srv.port) as c:
        assert [(m.index, m.data) for m in c.pull("o", 0, 100)] == [
            (i, payload(i)) for i in range(20)
        ]


def test_history_dropped_before_sealing_is_reported(lake_log, tmp_path, caplog) -> None:
    lake_log.create_stream("lost", StreamConfig(retention_records=10))
    lake_log.push_many("lost", 0, [payload(i) for i in range(30)])
    with caplog.at_level(logging.ERROR, logger="loglake.streams.jetstream_seal"):
        files = JetStreamSealer(lake_log, tmp_path).seal()
    assert [(f.first, f.last) for f in files] == [(20, 29)]
    assert "history lost before sealing" in caplog.text


def _lost(caplog) -> list[tuple[int, int]]:
    return [
        (r.fields["missing_from"], r.fields["missing_to"])
        for r in caplog.records
        if "history lost before sealing" in r.getMessage()
    ]


def test_records_truncated_on_purpose_are_not_reported_lost(lake_log, tmp_path, caplog) -> None:
    # Found from outside: Cardinal's checkpoint stream, whose old records the consumer drops
    # with truncate_before, made `serve` log "jetstream history lost before sealing
    # stream=cardinal.ckpt.rs ... missing_from=0 missing_to=2" at every round.
    lake_log.create_stream("cardinal.ckpt.rs", StreamConfig())
    lake_log.push_many("cardinal.ckpt.rs", 0, [payload(i) for i in range(4)])
    lake_log.truncate_before("cardinal.ckpt.rs", 3)
    with caplog.at_level(logging.ERROR, logger="loglake.streams.jetstream_seal"):
        files = JetStreamSealer(lake_log, tmp_path).seal(["cardinal.ckpt.rs"])
    assert [(f.first, f.last) for f in files] == [(3, 3)]
    assert _lost(caplog) == []


def test_loss_past_a_truncation_is_still_reported(lake_log, tmp_path, caplog) -> None:
    lake_log.create_stream("mixed", StreamConfig(retention_records=10))
    lake_log.push_many("mixed", 0, [payload(i) for i in range(12)])
    lake_log.truncate_before("mixed", 5)  # 0..4 on purpose
    lake_log.push_many("mixed", 0, [payload(i) for i in range(12, 30)])  # retention: 5..19 lost
    with caplog.at_level(logging.ERROR, logger="loglake.streams.jetstream_seal"):
        files = JetStreamSealer(lake_log, tmp_path).seal(["mixed"])
    assert [(f.first, f.last) for f in files] == [(20, 29)]
    assert _lost(caplog) == [(5, 19)]


def test_job_seal_command(nats_single, tmp_path) -> None:
    from loglake.pipeline.cli import command

    prefix = fx.new_prefix()
    log = JetStreamLog(nats_single.url, prefix=prefix)
    try:
        log.create_stream("j", StreamConfig(partitions=2))
        log.push_many("j", 0, [payload(i) for i in range(5)])
        log.push_many("j", 1, [payload(i) for i in range(3)])
    finally:
        log.close()
    args = ["job", "seal", "--backend", nats_single.url, "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(command, [*args, "--nats-prefix", prefix, "--file-records", "2"])
    assert result.exit_code == 0, result.output
    assert "sealed 5 file(s)" in result.output  # 0-1 2-3 4-4 | 0-1 2-2
    assert sealed_next(tmp_path, "j", 0) == 5 and sealed_next(tmp_path, "j", 1) == 3


# A fresh interpreter (this test process has long since imported what a seal needs) runs the
# sealer's loop as a standby: it does not hold the lease until the script says so. It prints
# the modules the first seal after taking over imported, and the seconds from taking over to
# the lake file being there.
_STANDBY = """
import asyncio, json, sys, time
from pathlib import Path
from loglake.streams.jetstream import JetStreamLog
from loglake.streams.jetstream_seal import seal_loop, sealed_next

url, prefix, data_dir = sys.argv[1:4]
log = JetStreamLog(url, prefix=prefix)
holds = False

async def main():
    global holds
    stop = asyncio.Event()
    task = asyncio.create_task(seal_loop(log, Path(data_dir), 0.2, stop, lambda: holds))
    seen, quiet_since = len(sys.modules), time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() - quiet_since < 1.5 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # idle as a standby until it imports nothing more
        if len(sys.modules) != seen:
            seen, quiet_since = len(sys.modules), time.monotonic()
    before = set(sys.modules)
    holds, took = True, time.monotonic()
    while sealed_next(data_dir, "w", 0) < 50 and time.monotonic() - took < 60:
        await asyncio.sleep(0.01)
    sealed = time.monotonic() - took
    stop.set()
    await task
    new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("pyarrow", "pandas"))
    print(json.dumps({"sealed": sealed, "imported": new}))

asyncio.run(main())
log.close()
"""


def test_a_standby_sealer_taking_the_lease_over_seals_without_loading_anything(
    nats_single, tmp_path
) -> None:
    """The failover bound is the lease's ttl + 2 s: the node that takes the sealer over must
    not spend those seconds importing pyarrow's pandas support and Parquet writer, nor wait
    long before its first round."""
    import json
    import subprocess
    import sys

    prefix = fx.new_prefix()
    log = JetStreamLog(nats_single.url, prefix=prefix)
    try:
        log.create_stream("w", StreamConfig())
        log.push_many("w", 0, [payload(i) for i in range(50)])
    finally:
        log.close()
    out = subprocess.run(
        [sys.executable, "-c", _STANDBY, nats_single.url, prefix, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["imported"] == [], got
    assert got["sealed"] < 2.0, got
