"""The session builder's checks, without starting a JVM."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from loglake.pipeline.errors import BadOption, JavaNotFound
from loglake.pipeline.session import (
    DEFAULT_MASTER,
    MASTER_ENV,
    SessionSpec,
    check_java,
    prepare_environment,
    resolve_master,
)


def fake_java(tmp_path, version_line: str) -> str:
    path = tmp_path / "java"
    path.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_java_11_is_refused_with_a_clear_error(tmp_path):
    java = fake_java(tmp_path, 'openjdk version "11.0.20" 2023-07-18')
    with pytest.raises(JavaNotFound, match=r"Java 11 found .* needs Java 17"):
        check_java(java)


def test_java_8_old_version_scheme(tmp_path):
    with pytest.raises(JavaNotFound, match="Java 8"):
        check_java(fake_java(tmp_path, 'java version "1.8.0_392"'))


def test_java_21_is_accepted(tmp_path):
    assert check_java(fake_java(tmp_path, 'openjdk version "21.0.1" 2023-10-17')) == 21


def test_missing_java(tmp_path):
    with pytest.raises(JavaNotFound, match="Java not found"):
        check_java(str(tmp_path / "no-java"))


@pytest.mark.parametrize("given", ["flag", "env"])
def test_a_master_spark_would_refuse_is_bad_option_before_a_jvm(monkeypatch, given):
    # "--spark-master foo://x" started a JVM that printed 55 lines of Java and Py4J traces
    monkeypatch.delenv(MASTER_ENV, raising=False)
    if given == "env":
        monkeypatch.setenv(MASTER_ENV, "foo://x")
    with pytest.raises(BadOption) as e:
        resolve_master("foo://x" if given == "flag" else None)
    assert e.value.option == ("--spark-master" if given == "flag" else MASTER_ENV)
    for ok in ("local", "local[2]", "local[*]", "spark://h:7077,h2:7077", "yarn", "k8s://h:443"):
        assert resolve_master(ok) == ok


@pytest.mark.spark
def test_a_setting_spark_refuses_is_one_line_from_the_cli(tmp_path):
    # a bad spark.sql.* value failed in register() with 79 lines of Py4J and JVM traces
    from .helpers import write_lake

    write_lake(tmp_path, "sds.x", 0, 0, 9)
    out = subprocess.run(
        [sys.executable, "-m", "loglake.cli", "job", "sds-audit", "--data-dir", str(tmp_path),
         "--stream", "sds.x", "--out", str(tmp_path / "out"),
         "--spark-master", "local[1]", "--spark-conf", "spark.sql.shuffle.partitions=-5"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1
    lines = [ln for ln in out.stderr.splitlines() if "incubator" not in ln]
    assert len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("Error: Spark did not start (master local[1]): ")
    assert "spark.sql.shuffle.partitions" in lines[0]


def test_installed_java_is_17_or_newer():
    assert check_java() >= 17


def test_master_resolution(monkeypatch):
    monkeypatch.delenv(MASTER_ENV, raising=False)
    assert resolve_master() == DEFAULT_MASTER == "local[*]"
    monkeypatch.setenv(MASTER_ENV, "spark://127.0.0.1:7077")
    assert resolve_master() == "spark://127.0.0.1:7077"
    assert resolve_master("local[2]") == "local[2]"


def test_defaults_fit_the_machine_and_user_conf_wins():
    conf = SessionSpec(master="local[*]", conf={"spark.driver.memory": "8g"}).spark_conf()
    assert conf["spark.driver.memory"] == "8g"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.sql.python.filterPushdown.enabled"] == "true"


def test_environment_defaults_do_not_override_the_user():
    env = {"PYSPARK_PYTHON": "/opt/py"}
    prepare_environment(env)
    assert env["PYSPARK_PYTHON"] == "/opt/py" and env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert os.path.isabs(env["PYSPARK_DRIVER_PYTHON"])


def test_executors_use_loglakes_daemon_and_the_user_may_choose_another():
    assert SessionSpec().spark_conf()["spark.python.daemon.module"] == "loglake.sparkdaemon"
    own = SessionSpec(conf={"spark.python.daemon.module": "pyspark.daemon"}).spark_conf()
    assert own["spark.python.daemon.module"] == "pyspark.daemon"


def test_spark_python_starts_python_without_the_installed_pysparks_own_zips(tmp_path):
    from loglake.pipeline.session import spark_python
    from loglake.sparkdaemon import installed_pyspark_lib

    script = spark_python(cache=tmp_path)
    assert script != sys.executable and os.access(script, os.X_OK)
    assert spark_python(cache=tmp_path) == script  # written once, named by its content
    lib = installed_pyspark_lib(sys.path)
    zips = [f"{lib}/pyspark.zip", f"{lib}/py4j-0.10.9.9-src.zip"]
    kept = ["/some/where", str(tmp_path / "a b")]
    code = "import json, sys, pyspark; print(json.dumps([sys.path, pyspark.__file__]))"
    env = {**os.environ, "PYTHONPATH": ":".join([zips[0], kept[0], zips[1], kept[1]])}
    out = subprocess.run([script, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    path, where = json.loads(out.stdout)
    assert [p for p in path if p in kept] == kept  # the rest of the path, in its order
    assert not [p for p in path if p.endswith(".zip") and p.startswith(lib)]
    assert ".zip" not in where
    # no script where it cannot be written: Python itself
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert spark_python(cache=blocked) == sys.executable


def test_spark_python_drops_the_zips_when_the_venv_is_reached_through_a_symlink(
    tmp_path, monkeypatch
):
    """A worktree's ``.venv`` is a symlink: the package is found under the link, while Spark
    names its zips under the resolved ``SPARK_HOME`` (and a user's ``SPARK_HOME`` may be the
    link). Either way the script must take them off the path, or every Python process Spark
    starts compiles pyspark's zip again."""
    import pyspark

    from loglake.pipeline.session import spark_python

    site = os.path.dirname(os.path.dirname(os.path.realpath(pyspark.__file__)))
    link = tmp_path / "venv-link"
    link.symlink_to(site)
    kept = "/some/where"
    code = "import os; print(os.environ.get('PYTHONPATH', ''))"
    for found, named in ((str(link), site), (site, str(link))):
        monkeypatch.setattr(sys, "path", [found, *sys.path])
        script = spark_python(cache=tmp_path / "cache")
        zips = [f"{named}/pyspark/python/lib/pyspark.zip", f"{named}/pyspark/python/lib/py4j.zip"]
        env = {**os.environ, "PYTHONPATH": ":".join([zips[0], kept, zips[1]])}
        out = subprocess.run(
            [script, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.stdout.strip() == kept, (found, named, out.stdout, out.stderr)
        monkeypatch.undo()


def test_only_a_local_master_gets_the_script():
    local, cluster = {}, {}
    prepare_environment(local, master="local[2]")
    prepare_environment(cluster, master="spark://10.0.0.1:7077")
    assert cluster["PYSPARK_PYTHON"] == sys.executable
    assert local["PYSPARK_PYTHON"] != sys.executable and os.access(local["PYSPARK_PYTHON"], os.X_OK)


@pytest.mark.slow
@pytest.mark.spark
def test_a_cli_job_shows_progress_and_no_jvm_noise(tmp_path):
    """``loglake job sds-audit`` printed nothing for tens of seconds but Spark's banner lines
    and WARNs; now its stderr holds the progress line and none of those."""
    import re

    from tests.pipeline.test_job_sds_audit import STREAM, simulated
    from tests.pipeline.test_job_sds_audit_cluster import CLUSTER_CFG

    # the smaller channel of the cluster test: what is checked here (the progress line, no JVM
    # noise) does not depend on the channel's size, and the job's cost is mostly Spark's
    simulated(tmp_path / "data", CLUSTER_CFG)
    args = ["job", "sds-audit", "--data-dir", str(tmp_path / "data"), "--stream", STREAM]
    r = subprocess.run(
        [sys.executable, "-m", "loglake.cli", *args, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    for noise in ("Using Spark's default log4j profile", "Setting default log level", " WARN "):
        assert noise not in r.stderr, r.stderr
    m = re.search(r"auditing sds\.sim .*\d+ stages, ([\d,]+)/([\d,]+) tasks", r.stderr)
    assert m and m.group(1) == m.group(2) != "0", r.stderr  # its last line: every task done


def test_c1_only_is_added_for_a_job_that_asks_and_a_users_java_options_win():
    """The JVMs compile with C1 alone only for a job that asks (``c1_only``), on the driver
    beside the quiet log4j profile and on executors; options the user set are kept as given."""
    from loglake.pipeline.session import C1_ONLY, java_options

    plain = java_options({}, quiet=True)
    assert C1_ONLY not in plain["spark.driver.extraJavaOptions"]
    assert "spark.executor.extraJavaOptions" not in plain
    c1 = java_options({}, quiet=True, c1_only=True)
    assert c1["spark.driver.extraJavaOptions"].split()[0] == C1_ONLY
    assert "log4j2.configurationFile" in c1["spark.driver.extraJavaOptions"]
    assert c1["spark.executor.extraJavaOptions"] == C1_ONLY
    mine = {"spark.driver.extraJavaOptions": "-Dx=1", "spark.executor.extraJavaOptions": "-Dy=2"}
    assert java_options(mine, quiet=True, c1_only=True) == mine
    assert java_options({}, quiet=False) == {}


def test_a_refused_priority_change_leaves_the_job_running(monkeypatch, caplog):
    """A sandbox that refuses ``setpriority`` costs the job its lower priority, not its run."""
    import logging

    from loglake.pipeline import session

    def refuse(steps):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "nice", refuse)
    with caplog.at_level(logging.WARNING, logger="loglake.pipeline.session"):
        assert session.lower_priority(5) == os.getpriority(os.PRIO_PROCESS, 0)
    [rec] = [r for r in caplog.records if r.getMessage() == "cpu priority unchanged"]
    assert "Operation not permitted" in rec.fields["error"]


def _socket_families(_: object) -> list[int]:
    """The address families of the sockets this Python worker holds (its link to the JVM)."""
    import socket

    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        out.append(int(s.family))
        s.close()
    return out


@pytest.mark.spark
def test_python_workers_reach_the_jvm_through_unix_domain_sockets(spark):
    """Over loopback TCP every Python task waited ~40 ms for its input (Nagle against delayed
    ACKs); the session's workers talk to the JVM through Unix domain sockets instead."""
    import socket

    families = spark.sparkContext.parallelize([0, 1], 2).map(_socket_families).collect()
    assert families and all(f for f in families), families
    for f in families:
        assert socket.AF_UNIX in f and socket.AF_INET not in f and socket.AF_INET6 not in f


@pytest.mark.slow
@pytest.mark.spark
def test_a_command_that_exits_without_stopping_spark_leaves_no_socket_file():
    """Spark removes its Python daemon's socket file only from ``stop()``: a command that
    just exited left one in the temporary folder per run; ``build_session`` stops the session
    at exit."""
    import shutil
    import tempfile

    # a short path of its own: a socket's path has a length limit, and other tests' sockets
    # are in the default folder
    socks = tempfile.mkdtemp(prefix="ll-socks-", dir="/tmp")
    try:
        _exit_without_stop(socks)
    finally:
        shutil.rmtree(socks, ignore_errors=True)


def _exit_without_stop(socks: str) -> None:
    probe = (
        "import os, sys\n"
        "from loglake.pipeline.session import build_session\n"
        "conf = {'spark.python.unix.domain.socket.dir': sys.argv[1]}\n"
        "spark = build_session(master='local[1]', conf=conf)\n"
        "spark.sparkContext.parallelize([1], 1).collect()\n"
        "print(len(os.listdir(sys.argv[1])))\n"  # the daemon's (and the driver's) sockets
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, socks], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) >= 1  # there were sockets to remove
    assert os.listdir(socks) == []


def _lookups(data_source: bool) -> int:
    """Spark's Python data source look-ups (``lookup_data_sources`` processes under the JVM)
    of a fresh session built with ``data_source``, after a plain task."""
    probe = (
        "import os\n"
        "from loglake.pipeline.session import build_session\n"
        f"spark = build_session(master='local[1]', data_source={data_source})\n"
        "spark.sparkContext.parallelize([1], 1).collect()\n"
        "kids, cmds = {}, {}\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        cmds[int(p)] = open(f'/proc/{p}/cmdline', 'rb').read()\n"
        "        ppid = int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "    except (OSError, ValueError):\n"
        "        continue\n"
        "    kids.setdefault(ppid, []).append(int(p))\n"
        "todo, mine = [os.getpid()], []\n"
        "while todo:\n"
        "    found = kids.get(todo.pop(), [])\n"
        "    mine += found\n"
        "    todo += found\n"
        "print(sum(b'lookup_data_sources' in cmds.get(p, b'') for p in mine))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.spark
def test_a_session_without_the_data_source_starts_no_python_to_look_sources_up():
    """``job archives-build``'s session (``data_source=False``) runs plain tasks only: Spark's
    look-up of Python data sources, which the registration starts (a Python daemon and a worker,
    about 2 CPU-s of the session's start), does not run; the default session still registers
    ``loglake``."""
    assert _lookups(False) == 0
    assert _lookups(True) >= 1
