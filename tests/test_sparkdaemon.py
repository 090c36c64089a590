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


def test_the_zips_leave_the_path_when_the_venv_is_reached_through_a_symlink(tmp_path):
    """A worktree's ``.venv`` is a symlink: the package is found under the link while Spark
    names its zips under the resolved ``SPARK_HOME``. The same folder, two names: the zips
    must still leave the path, whichever side holds the link."""
    import pyspark

    from loglake.sparkdaemon import own_spark_zips

    site = os.path.dirname(os.path.dirname(os.path.realpath(pyspark.__file__)))
    link = tmp_path / "venv-link"
    link.symlink_to(site)
    real_lib = os.path.join(site, "pyspark", "python", "lib")
    link_lib = os.path.join(str(link), "pyspark", "python", "lib")
    real_zips = [os.path.join(real_lib, "pyspark.zip"), os.path.join(real_lib, "py4j.zip")]
    link_zips = [os.path.join(link_lib, "pyspark.zip")]
    assert own_spark_zips([*real_zips, str(link), *sys.path]) == real_zips
    assert own_spark_zips([*link_zips, site, *sys.path]) == link_zips
