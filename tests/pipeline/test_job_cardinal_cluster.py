"""``loglake job cardinal-blocks`` on a real Spark standalone cluster (master + one worker from
the installed pyspark, on loopback, and one driver application on it; the session fixtures in
``conftest.py``): unchanged, and its tables equal those of ``local[*]`` on the same input
(issue 12 §3, the Cardinal half)."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from .test_job_cardinal import THRESHOLD, TOPICS, make_input, options, single_process_chain

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# run by the cluster application (``cluster_driver``: ``spark`` is its session on the cluster)
DRIVER = textwrap.dedent(
    """
    from loglake.pipeline.jobs.cardinal_blocks import CardinalBlocksOptions, run
    data_dir, out, topics, threshold = argv
    assert spark.sparkContext.master == master
    summary = run(spark, CardinalBlocksOptions(data_dir, tuple(topics.split(",")), out,
                  reorg_threshold=int(threshold), max_records_per_trigger=200))
    result = {"summary": summary.as_dict()}
    """
)


def tables_of(spark, out) -> dict[str, list]:
    from loglake.pipeline.cardinal import canonical, table

    def rows(df, cols):
        return sorted(
            json.dumps([r[c].hex() if isinstance(r[c], bytes | bytearray) else r[c] for c in cols])
            for r in df.collect()
        )

    block_cols = ["number", "hash", "parent", "weight", "time", "key", "value", "deleted"]
    return {
        "blocks": rows(table(spark, out, "blocks"), block_cols),
        "canonical": rows(canonical(spark, out), block_cols),
        "chain_updates": rows(
            table(spark, out, "chain_updates"),
            ["action", "number", "hash", "parent", "weight"],
        ),
        "rejects": rows(table(spark, out, "rejects"), ["topic", "partition", "offset", "reason"]),
    }


def test_cardinal_blocks_on_the_cluster_equals_local(spark, cluster_driver, tmp_path):
    from loglake.pipeline.jobs.cardinal_blocks import run

    src = tmp_path / "src"
    planted = make_input(src, blocks=40)
    on_cluster, local = tmp_path / "on_cluster", tmp_path / "local"
    shutil.copytree(src, on_cluster)
    shutil.copytree(src, local)
    result = cluster_driver.run(
        DRIVER,
        str(on_cluster),
        str(tmp_path / "out_cluster"),
        ",".join(TOPICS),
        str(THRESHOLD),
        timeout=600,
    )
    local_summary = run(spark, options(local, tmp_path / "out_local", max_records_per_trigger=200))
    assert result["summary"]["rejects"] == local_summary.rejects == len(planted)
    assert result["summary"]["blocks"] == local_summary.blocks > 0
    on_cluster_tables = tables_of(spark, tmp_path / "out_cluster")
    local_tables = tables_of(spark, tmp_path / "out_local")
    for name in ("blocks", "canonical", "rejects"):
        assert on_cluster_tables[name] == local_tables[name], name
    # the same chain updates (their seq and batch ids depend on how Spark cut the batches)
    assert on_cluster_tables["chain_updates"] == local_tables["chain_updates"]
    expected = single_process_chain(src, tmp_path)
    canon = {json.loads(r)[1] for r in on_cluster_tables["canonical"]}
    assert canon == {b.hash.hex() for b in expected.values()}
