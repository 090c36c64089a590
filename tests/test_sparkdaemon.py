"""``loglake.sparkdaemon`` without Spark: what it preloads, and which zips it takes off the path
(the Spark test is ``tests/pipeline/test_daemon.py``)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_daemon_module_preloads_without_starting_spark():
    code = (
        "import sys; from loglake.sparkdaemon import preload; preload(); "
        "print(all(m in sys.modules for m in ('numpy', 'pyarrow', 'loglake.log')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_only_the_installed_pysparks_own_zips_leave_the_path(tmp_path):
    import pyspark

    from loglake.sparkdaemon import own_spark_zips

    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    own = [os.path.join(lib, "pyspark.zip"), os.path.join(lib, "py4j-0.10.9.9-src.zip")]
    other = str(tmp_path / "spark-3.5" / "python" / "lib" / "pyspark.zip")
    path = [*own, other, *sys.path]
    assert own_spark_zips(path) == own
    # no installed pyspark on the path: nothing is taken away
    assert own_spark_zips([*own, other]) == []
