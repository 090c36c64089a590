"""``job sds-audit``'s decode stage reads the channel as units (``loglake.pipeline.units``):
sealed lake files through pyarrow and the live tail through the log, in plain tasks that write
``_work/decoded`` themselves. On a channel partly sealed into lake files: the decoded rows equal
those of one decode over the whole channel read from the log, also after ``job compact``
replaced the planned files; the audit equals the simulator's ground truth."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from loglake.log import open_log
from loglake.log.lake import write_lake_table
from loglake.log.lake_schema import lake_partition_dir
from loglake.pipeline.jobs.sds_audit import (
    DECODE_COLUMNS,
    DECODED_SCHEMA,
    SdsAuditOptions,
    _decode_task,
    _work_batches,
    decode_batches,
    run,
    table,
)
from loglake.pipeline.units import plan_units
from tests.sds.records import readable

from .test_job_sds_audit import CFG, STREAM, expected_from_truth, simulated

CHANNEL = "sim"


def _seal(data_dir: Path, first: int, last: int) -> Path:
    """Records ``first..last`` of the stored channel as one lake file (what sealing or a
    compaction writes)."""
    with open_log(data_dir, readonly=True) as log:
        t = pa.concat_tables(log.read_tables(STREAM, first, last + 1))
    return write_lake_table(lake_partition_dir(data_dir, STREAM, 0), t).path


def _whole(data_dir: Path) -> list[dict]:
    """One decode over the whole channel read from the log: what the task must produce."""
    with open_log(data_dir, readonly=True) as log:
        batches = [
            b
            for t in log.read_tables(STREAM, 0, None)
            for b in t.select(list(DECODE_COLUMNS)).to_batches()
        ]
    return readable(decode_batches(CHANNEL)(iter(batches)))


def test_a_task_decodes_lake_files_and_the_live_tail_and_a_compacted_file(tmp_path):
    data = tmp_path / "data"
    sim = simulated(data)
    n = len(sim.channel)
    small = [_seal(data, 0, 19), _seal(data, 20, 39)]
    units = plan_units(str(data), {0: STREAM}, 0)[0]
    assert [(u.start, u.end, bool(u.path)) for u in units] == [
        (0, 20, True),
        (20, 40, True),
        (40, n, False),
    ]
    want = _whole(data)
    assert len(want) == n and sum(r["ok"] for r in want) == n

    out = tmp_path / "decoded"
    out.mkdir()
    task = _decode_task(str(data), CHANNEL, str(out))
    path, rows, reasons = task((0, units))
    got = list(_work_batches(path, DECODED_SCHEMA.names))
    assert rows == n and all(b.schema == DECODED_SCHEMA for b in got) and reasons == {}
    assert readable(got) == want
    assert [p.name for p in out.iterdir()] == [Path(path).name]  # no temporary file left

    # job compact replaced the planned files by one covering them: read from that one
    _seal(data, 0, 39)
    for f in small:
        f.unlink()
    path, rows, _ = task((1, units))
    assert readable(_work_batches(path, DECODED_SCHEMA.names)) == want


@pytest.mark.spark
@pytest.mark.slow  # one audit: ~15-25 s
def test_the_audit_of_a_partly_sealed_channel_equals_the_ground_truth(spark, tmp_path):
    data = tmp_path / "data"
    sim = simulated(data)
    _seal(data, 0, 24)
    _seal(data, 25, 44)
    exp = expected_from_truth(sim)
    summary = run(spark, SdsAuditOptions(str(data), STREAM, str(tmp_path / "out")).validate())
    out = str(tmp_path / "out")
    assert summary.records == len(sim.channel) and summary.rejects == 0
    assert summary.content_messages == CFG.messages
    got_acks = {
        (r["message_id"], r["participant"]): (r["ack_index"], r["latency_ms"])
        for r in table(spark, out, "acks").collect()
    }
    assert got_acks == exp["acks"] and got_acks
    parts = {r["participant"]: r.asDict() for r in table(spark, out, "participants").collect()}
    for pid, want in exp["participants"].items():
        for k, v in want.items():
            assert parts[pid][k] == v, (pid, k)
    assert not (tmp_path / "out" / "_work").exists()


def test_a_part_file_the_driver_cannot_see_fails_the_job_naming_it(tmp_path):
    """Both jobs that write where the records lie need one filesystem for the driver and the
    executors; a part file the driver cannot see is ``JobFailed`` saying so."""
    from loglake.pipeline.errors import JobFailed
    from loglake.pipeline.units import require_visible

    here = tmp_path / "part-00000.zstd.parquet"
    here.write_bytes(b"x")
    require_visible(str(here), "sds-audit", "--out")  # visible: nothing to say
    gone = str(tmp_path / "elsewhere" / "part-00001.zstd.parquet")
    with pytest.raises(JobFailed, match=r"part-00001.*not visible to the driver: sds-audit"):
        require_visible(gone, "sds-audit", "--out (and the data dir)")
