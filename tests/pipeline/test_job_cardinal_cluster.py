"""``loglake job cardinal-blocks`` on a real Spark standalone cluster (master + one worker from
the installed pyspark, on loopback; the session fixture in ``conftest.py``): unchanged, and its
tables equal those of ``local[*]`` on the same input (issue 12 §3, the Cardinal half)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from .test_job_cardinal import THRESHOLD, TOPICS, make_input, options, single_process_chain

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DRIVER = textwrap.dedent(
    """
    import json, sys
    from loglake.pipeline import build_session
    from loglake.pipeline.cardinal import canonical, table
    from loglake.pipeline.jobs.cardinal_blocks import CardinalBlocksOptions, run
    master, data_dir, out, topics, threshold = sys.argv[1:6]
    spark = build_session(master=master, app_name="loglake-cardinal-cluster-test", conf={
        "spark.executor.memory": "1g", "spark.driver.memory": "1g", "spark.cores.max": "2"})
    assert spark.sparkContext.master == master
    summary = run(spark, CardinalBlocksOptions(data_dir, tuple(topics.split(",")), out,
                  reorg_threshold=int(threshold), max_records_per_trigger=200))
    print("RESULT " + json.dumps({"summary": summary.as_dict()}), flush=True)
    spark.stop()
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


def test_cardinal_blocks_on_the_cluster_equals_local(spark, cluster, tmp_path):
    from loglake.pipeline.jobs.cardinal_blocks import run

    master, env = cluster
    src = tmp_path / "src"
    planted = make_input(src, blocks=40)
    on_cluster, local = tmp_path / "on_cluster", tmp_path / "local"
    shutil.copytree(src, on_cluster)
    shutil.copytree(src, local)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            master,
            str(on_cluster),
            str(tmp_path / "out_cluster"),
            ",".join(TOPICS),
            str(THRESHOLD),
        ],
        env=env,
        capture_output=True,
        timeout=600,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = proc.stdout.decode()
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
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
