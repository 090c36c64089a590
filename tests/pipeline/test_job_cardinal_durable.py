"""``cardinal-blocks``' per-micro-batch commit survives power loss (no Spark): on the simulated
disk of the log's power-loss tests, after ``BatchWriter.process`` returns and power is lost with
every pending folder change and write dropped, a micro-batch whose marker survived has its table
files and its state whole — the files are fsynced, renamed and their folders fsynced, and the
folders the job creates are themselves made durable."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq

from loglake.pipeline.jobs.cardinal_blocks import (
    BATCHES,
    STATE,
    BatchWriter,
    CardinalBlocksOptions,
)
from tests.log.simdisk import SimDisk

from .test_job_cardinal_kernel import TOPICS, micro_batches


def test_a_marked_micro_batch_survives_power_loss_whole(tmp_path):
    table = pa.concat_tables(micro_batches(1))
    with SimDisk(tmp_path) as disk:
        out = disk.root / "tables"
        opts = CardinalBlocksOptions(str(tmp_path), TOPICS, str(out), reorg_threshold=8)
        counts = BatchWriter(opts).process(table, 0)
        assert counts["blocks"] > 0 and counts["rejects"] > 0
        disk.restart(random.Random(0), file_mode="none", entries="none")  # power loss
        out = disk.root / "tables"
        marker = out / BATCHES / f"{0:012d}.json"
        assert marker.exists(), "the micro-batch's marker was lost after process returned"
        summary = json.loads(marker.read_text())
        for name in ("blocks", "rejects"):
            f = out / name / f"batch-{0:012d}.parquet"
            assert f.exists(), f"{name} of a marked micro-batch lost"
            assert pq.read_table(f).num_rows == summary["rows"][name]
        assert (out / STATE / f"{0:012d}.pkl").stat().st_size > 0
