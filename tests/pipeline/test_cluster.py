"""A real Spark standalone cluster (the session fixtures in ``conftest.py``: master + one worker
from the installed pyspark package, on loopback, and one driver application on it): the same
``read`` and ``compact`` give the same results as ``local[*]``."""

from __future__ import annotations

import shutil
import textwrap

import pytest

from loglake.pipeline import read
from loglake.pipeline.jobs.compact import CompactOptions, run
from loglake.pipeline.lake import visible_lake_files

from .helpers import make_log_stream, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.slow]


# run by the cluster application (``cluster_driver``: ``spark`` is its session on the cluster)
DRIVER = textwrap.dedent(
    """
    from loglake.pipeline import read
    from loglake.pipeline.jobs.compact import CompactOptions, run
    from loglake.pipeline.lake import visible_lake_files
    (data_dir,) = argv
    assert spark.sparkContext.master == master
    def rows():
        df = read(spark, data_dir, "cl")
        return sorted([r[0], r[1], bytes(r[2]).hex()]
                      for r in df.select("partition", "index", "data").collect())
    before = rows()
    compacted = run(spark, CompactOptions(data_dir, "cl", target_bytes=48 * 1024))
    files = [[f.first, f.last] for p in (0, 1) for f in visible_lake_files(data_dir, "cl", p)]
    result = {"before": before, "after": rows(), "files": files,
              "groups": len(compacted.groups)}
    """
)


def test_cluster_read_and_compact_equal_local(spark, cluster_driver, tmp_path):
    src = tmp_path / "src"
    make_log_stream(src, "cl", partitions=2, records=100)
    on_cluster, local = tmp_path / "on_cluster", tmp_path / "local"
    shutil.copytree(src, on_cluster)
    shutil.copytree(src, local)

    result = cluster_driver.run(DRIVER, str(on_cluster))

    def local_rows():
        return sorted(
            [p, i, d.hex()] for (p, i), d in rows_of(read(spark, str(local), "cl")).items()
        )

    assert result["groups"] > 0, "the cluster compacted nothing: nothing was compared"
    assert result["before"] == local_rows()
    run(spark, CompactOptions(str(local), "cl", target_bytes=48 * 1024))
    assert result["after"] == local_rows() == result["before"]
    files = [[f.first, f.last] for p in (0, 1) for f in visible_lake_files(local, "cl", p)]
    assert result["files"] == files
