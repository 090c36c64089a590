"""The one place that builds loglake's SparkSession, so every job and test starts Spark alike.

Why one builder: every job, test and benchmark must start Spark the same way — the right master
(``local[*]`` by default, ``--spark-master`` / ``LOGLAKE_SPARK_MASTER`` for a real cluster), memory
sized for a 2-core 24 GB machine, loopback-only networking, the venv's Python on executors, and
the ``loglake`` data source registered. The gotchas it handles are the ones FIELD-NOTES "Spark"
records: Java 17+ (checked here with a typed error, not a JVM stack trace), ``SPARK_LOCAL_IP`` and
``PYSPARK_PYTHON`` for a standalone cluster on loopback, and Python filter pushdown being off by
default in Spark 4.3 (``spark.sql.python.filterPushdown.enabled``).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from loglake.pipeline.errors import BadOption, JavaNotFound, SparkStartFailed

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

MASTER_ENV = "LOGLAKE_SPARK_MASTER"
DEFAULT_MASTER = "local[*]"
MIN_JAVA = 17

# Sized for the reference machine (2 cores, 24 GB, shared): the driver holds local mode's
# executor too, so it gets the larger share; a cluster executor gets a modest heap.
DEFAULT_CONF: dict[str, str] = {
    "spark.driver.memory": "4g",
    "spark.executor.memory": "4g",
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # executors' Python daemon: the tasks' imports done once, before the workers fork
    "spark.python.daemon.module": "loglake.sparkdaemon",
    # the JVM's sockets to its Python workers (and the driver's for local data) as Unix
    # domain sockets. Why: over loopback TCP every Python task waited ~40 ms, the JVM's
    # command and its input going out as two small writes (Nagle's algorithm against the
    # worker's delayed ACK): 54 trivial tasks took 1.4 s, 0.2 s with these. Spark 4.1+.
    "spark.python.unix.domain.socket.enabled": "true",
}


def java_version(java: str | None = None) -> tuple[str, int]:
    """``(path, major)`` of the Java Spark will use (``JAVA_HOME`` first, then ``PATH``)."""
    if java is None:
        home = os.environ.get("JAVA_HOME")
        java = str(Path(home) / "bin" / "java") if home else (shutil.which("java") or "")
    if not java or not Path(java).exists():
        raise JavaNotFound(
            "Java not found: loglake's Spark pipeline needs Java 17+ "
            "(Debian: apt-get install openjdk-17-jre-headless, or set JAVA_HOME)"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    m = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
    if not m:
        raise JavaNotFound(f"could not read the version of {java}: {out.stderr.strip()!r}")
    parts = m.group(1).split(".")
    major = int(parts[1]) if parts[0] == "1" else int(re.sub(r"\D.*", "", parts[0]) or 0)
    return java, major


def check_java(java: str | None = None) -> int:
    """Raise ``JavaNotFound`` unless Java 17+ is available; return its major version."""
    path, major = java_version(java)
    if major < MIN_JAVA:
        raise JavaNotFound(
            f"Java {major} found at {path}; Spark 4 needs Java {MIN_JAVA}+ "
            "(set JAVA_HOME to a newer JDK)"
        )
    return major


MASTER_PREFIXES = ("local", "spark://", "k8s://")
"""What Spark's launcher takes as a master (``yarn`` besides): apache/spark
``SparkSubmitArguments`` refuses anything else ("Master must either be yarn or start with spark,
k8s, or local"), but only after the JVM started, as a stack trace on the terminal."""


def resolve_master(master: str | None = None) -> str:
    """The explicit ``master``, else ``$LOGLAKE_SPARK_MASTER``, else ``local[*]``; one Spark's
    launcher would refuse is ``BadOption`` here, before a JVM starts."""
    value = master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER
    if value != "yarn" and not value.startswith(MASTER_PREFIXES):
        name = "--spark-master" if master else MASTER_ENV
        raise BadOption(
            name, value, "expected local[*], local[N], spark://HOST:PORT, yarn or k8s://"
        )
    return value


@dataclass
class SessionSpec:
    """What ``build_session`` needs; kept as data so a test can check it without a JVM."""

    master: str = field(default_factory=resolve_master)
    app_name: str = "loglake"
    conf: dict[str, str] = field(default_factory=dict)

    def spark_conf(self) -> dict[str, str]:
        return {**DEFAULT_CONF, **self.conf}


def prepare_environment(
    env: MutableMapping[str, str] | None = None, master: str | None = None
) -> MutableMapping[str, str]:
    """Set the variables Spark's launcher and executors read, unless the user set them. On a
    local ``master`` Spark's Python processes start through ``spark_python``."""
    if env is None:
        env = os.environ
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if "PYSPARK_PYTHON" not in env:
        local = master is not None and master.startswith("local")
        env["PYSPARK_PYTHON"] = spark_python() if local else sys.executable
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


_SPARK_PYTHON = """#!/bin/sh
# Written by loglake (pipeline/session.py, spark_python): run Python without the installed
# pyspark's own zips on PYTHONPATH; the same code, from the package's cached bytecode.
# Zips are compared by their folder's real path (cd -P): Spark names them under the resolved
# SPARK_HOME, which may differ from the venv's path when the venv is reached by a symlink.
set -f
lib={lib}
new=
IFS=:
for p in $PYTHONPATH; do
  case $p in
    *.zip) dir=$(cd -P -- "${{p%/*}}" 2>/dev/null && pwd -P) ;;
    *) dir= ;;
  esac
  if [ "$dir" != "$lib" ]; then new=${{new:+$new:}}$p; fi
done
unset IFS
PYTHONPATH=$new
export PYTHONPATH
exec {python} "$@"
"""


def spark_python(python: str = sys.executable, cache: Path | None = None) -> str:
    """The Python Spark starts on a local master: ``python`` behind a small shell script that
    takes the installed pyspark's own ``pyspark.zip`` and py4j zip off ``PYTHONPATH`` first.

    Why: Spark puts those zips first on the path of every Python process it starts — task
    workers, the data source's planners, a streaming source's runner — and Python compiles a
    zip's modules at every start, with no bytecode cache: 0.95–1.0 s of CPU a process here
    against 0.16 s from the installed package (the same files). A query on the ``loglake``
    source starts several (``loglake.sparkdaemon`` covers only the task workers): docs/pipeline.md
    has the figures. Only on a local master, whose processes run on this machine where the
    script is, and only for the installed package's own zips (a cluster's Spark keeps its
    Python). Paths are compared by their real path on both sides: Spark names the zips under
    the resolved ``SPARK_HOME``, and a venv reached through a symlink names the same folder
    another way (then every process compiled the zip again). The script is written once, named
    by its content, in loglake's cache folder; ``python`` itself if that is not possible."""
    from loglake.sparkdaemon import installed_pyspark_lib

    lib = installed_pyspark_lib(sys.path)
    if lib is None or not os.path.isdir(lib):
        return python
    # the real path: the script resolves each zip's folder the same way before comparing
    real = os.path.realpath(lib)
    text = _SPARK_PYTHON.format(lib=shlex.quote(real), python=shlex.quote(python))
    folder = cache or Path(platformdirs.user_cache_dir("loglake"))
    script = folder / f"spark-python-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if script.exists():
        return str(script)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{script.name}.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, script)
    except OSError:
        return python
    return str(script)


C1_ONLY = "-XX:TieredStopAtLevel=1"
"""JVM option: compile with C1 only (no C2). Why: a job that keeps its records out of the JVM
(``job archives-build``: plain tasks, small results) leaves the JVM little to do but schedule,
yet its C1/C2 compiler threads took 3.0-3.7 of its 3.6-4.5 CPU seconds. What it costs: code the
JVM runs for long stays at C1's speed; the replay job, which reads through Spark SQL, took
2.5-3x the wall time with it on the 2-core VM, so it is per job, not the default."""

QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties").as_uri()
"""Errors only: Spark's default profile prints banner lines and WARNs nobody can act on."""


def quiet_jvm() -> bool:
    """Spark's own logging stays at its defaults when loglake logs at debug (``-vv``)."""
    import logging

    return logging.getLogger("loglake").getEffectiveLevel() > logging.DEBUG


def java_options(conf: dict[str, str], quiet: bool, c1_only: bool = False) -> dict[str, str]:
    """``conf`` with the JVMs' options loglake adds unless the user set them: the quiet log4j
    profile on the driver (``quiet``), and ``C1_ONLY`` on the driver and executors for a job
    that asks for it (``c1_only``)."""
    out = dict(conf)
    opts = ([C1_ONLY] if c1_only else []) + (
        [f"-Dlog4j2.configurationFile={QUIET_LOG4J}"] if quiet else []
    )
    if opts and "spark.driver.extraJavaOptions" not in out:
        out["spark.driver.extraJavaOptions"] = " ".join(opts)
    if c1_only:
        out.setdefault("spark.executor.extraJavaOptions", C1_ONLY)
    return out


def lower_priority(steps: int) -> int:
    """The calling thread, and every thread and process it starts from now on, ``steps`` lower
    in CPU priority (``nice``; the kernel caps it at 19). Called before ``build_session``, that
    is the JVM of a local session and its Python workers too; a cluster's executors keep the
    priority their worker was started with. Why: a job that follows a stream server on the
    same machine (``job cardinal-blocks --follow``) should take the CPU the server and its
    producers leave rather than share it with them. Linux keeps niceness per thread: threads
    started earlier keep theirs. Raising niceness needs no privilege, but a sandbox may refuse
    the call: the job then runs at the priority it has, with a warning. Returns the niceness."""
    import logging

    from loglake.structured_logging import log_event

    try:
        return os.nice(steps)
    except OSError as e:
        log_event(
            logging.getLogger(__name__), logging.WARNING, "cpu priority unchanged", error=repr(e)
        )
        return os.getpriority(os.PRIO_PROCESS, 0)


def _stop_at_exit() -> None:
    """The process's SparkContext stopped as the interpreter exits, if a command left it
    running. Why: Spark stops its Python daemon cleanly only from ``stop()``; a process that
    just exits leaves the daemon's Unix domain socket file behind in the temporary folder
    (``spark.python.unix.domain.socket.enabled``), one per command run."""
    import contextlib

    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is not None:
        with contextlib.suppress(Exception):  # the JVM may be gone already
            sc.stop()


INTERRUPT_WAIT = 15.0
"""Seconds Ctrl-C waits for the cancelled Spark tasks to end before the command unwinds."""

STOP_WAIT = 30.0
"""Seconds the stop after Ctrl-C waits for Spark to stop before the process exits anyway."""

_PY4J_DIR = os.sep + "py4j" + os.sep
_quiet_py4j = False  # set by the first Ctrl-C: py4j's logging is noise from then on
_cancelling = False  # a Ctrl-C is waiting for Spark's tasks to end


def _py4j_quiet(record: logging.LogRecord) -> bool:
    """A filter on the root logger: py4j logs a Ctrl-C inside a call to the JVM as an error
    with its traceback (``logging.exception("KeyboardInterrupt while sending command.")``, on
    the root logger), and the connections a stopping session breaks as more; after Ctrl-C
    (``_quiet_py4j``) none of them is news to the user."""
    return not (_quiet_py4j and _PY4J_DIR in record.pathname)


def _quiet() -> None:
    """py4j's logging silenced for the rest of the process (``_py4j_quiet``)."""
    global _quiet_py4j
    _quiet_py4j = True
    logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)


def _in_thread(work: Callable[[], None], timeout: float) -> None:
    """``work()`` on a thread of its own, waited for at most ``timeout`` seconds. Why: a call
    to the JVM from the main thread after Ctrl-C would go over the main thread's own py4j
    connection, the one the interrupted call was reading (pyspark's handler did: ``RuntimeError:
    reentrant call inside <_io.BufferedReader>``, then two py4j tracebacks); a new thread gets
    a connection of its own."""
    t = threading.Thread(target=work, name="loglake-spark-interrupt", daemon=True)
    t.start()
    t.join(timeout)


def _running_tasks(sc: SparkContext) -> int:
    """Tasks running on any executor (the driver's own in local mode)."""
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    return sum(int(i.numRunningTasks()) for i in infos)


def cancel_jobs(timeout: float = INTERRUPT_WAIT) -> None:
    """Cancel every job of the process's SparkContext and wait (at most ``timeout``) until no
    task runs any more. Why wait: the command then unwinds through its clean-ups (a job's
    staging folder removed, ``compact``'s and ``staged_output``'s) with no task still writing
    into the folder being removed."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return
    deadline = time.monotonic() + timeout

    def work() -> None:
        with contextlib.suppress(Exception):  # the JVM may be gone already
            # the tasks cancelled log their end as errors with JVM stack traces (``Utils:
            # Aborting task``, ``TaskKilledException``): not news after Ctrl-C
            sc.setLogLevel("OFF")
            sc.cancelAllJobs()
            while _running_tasks(sc) and time.monotonic() < deadline:
                time.sleep(0.05)

    _in_thread(work, timeout)


def _on_sigint(signum: int, frame: object) -> None:
    """The SIGINT handler while a session is up: Spark's jobs cancelled (``cancel_jobs``), then
    ``KeyboardInterrupt`` as Python's own handler raises it. A second Ctrl-C while waiting
    raises at once. In place of pyspark's handler, which called the JVM from inside the
    interrupted call (``_in_thread`` says what that printed)."""
    global _cancelling
    if _cancelling:
        raise KeyboardInterrupt
    _cancelling = True
    _quiet()
    try:
        cancel_jobs()
    finally:
        _cancelling = False
    raise KeyboardInterrupt


def stop_after_interrupt() -> None:
    """Stop the process's SparkContext after Ctrl-C, quietly and on a thread of its own
    (``_in_thread``), waiting at most ``STOP_WAIT``: the ``on_interrupt`` cleanup of the
    commands (``loglake.clitools.interrupted``)."""
    from pyspark import SparkContext

    _quiet()
    sc = SparkContext._active_spark_context
    if sc is None or _starting is not None:  # a second Ctrl-C while it starts: let it be
        return

    def work() -> None:
        with contextlib.suppress(Exception):
            sc.setLogLevel("OFF")  # as in ``cancel_jobs``
            sc.cancelAllJobs()
        with contextlib.suppress(Exception):
            sc.stop()

    _in_thread(work, STOP_WAIT)


def _handle_interrupts() -> None:
    """Ctrl-C while a session is up: ``_on_sigint`` in place of pyspark's handler (only on the
    main thread, the one Python delivers signals to, where pyspark set its own), the py4j
    noise filtered (``_py4j_quiet``), and the session stopped before a command reports
    ``interrupted`` (``stop_after_interrupt``)."""
    from loglake.clitools import on_interrupt

    root = logging.getLogger()
    if _py4j_quiet not in root.filters:
        root.addFilter(_py4j_quiet)
    on_interrupt(stop_after_interrupt)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)


_starting: threading.Thread | None = None
"""The thread starting Spark for ``_start`` while it runs."""


def _start(builder: SparkSession.Builder) -> SparkSession:
    """``builder.getOrCreate()``; on the main thread, run on a thread of its own while a first
    Ctrl-C waits for it (the session is then stopped as after any Ctrl-C), a second one at
    once. Why: a session half started when the process exits had the JVM print a stack trace
    ("Error initializing SparkContext ... Shutdown hooks cannot be modified during
    shutdown"), and ``SparkContext`` installs its own SIGINT handler on the main thread only
    (``_on_sigint`` says what it printed), which it then does not."""
    global _starting
    if threading.current_thread() is not threading.main_thread():
        return builder.getOrCreate()
    out: list[SparkSession] = []
    failed: list[BaseException] = []

    def start() -> None:
        try:
            out.append(builder.getOrCreate())
        except BaseException as e:
            failed.append(e)

    hit: list[int] = []

    def defer(signum: int, frame: object) -> None:
        if hit:
            raise KeyboardInterrupt
        hit.append(signum)

    previous = signal.signal(signal.SIGINT, defer)
    _starting = threading.Thread(target=start, name="loglake-spark-start", daemon=True)
    try:
        _starting.start()
        _starting.join()
        _starting = None
    finally:
        signal.signal(signal.SIGINT, previous)
    if failed:
        raise failed[0]
    if hit:
        _quiet()
        raise KeyboardInterrupt
    return out[0]


def build_session(
    master: str | None = None,
    app_name: str = "loglake",
    conf: dict[str, str] | None = None,
    c1_only: bool = False,
    data_source: bool = True,
) -> SparkSession:
    """Start (or reuse) the SparkSession and register the ``loglake`` data source on it.
    ``c1_only``: the JVMs compile with C1 alone (``C1_ONLY``), for a job whose JVM only
    schedules. ``data_source=False``: the source is not registered, for a session that never
    reads it (``job archives-build`` and ``job sds-audit``, which read the lake in their own
    tasks, and ``compact``, which reads it with Spark's Parquet reader). Why: Spark's first
    registration of a Python data source starts a Python daemon and worker to look the
    installed ones up (``pyspark.sql.worker.lookup_data_sources``), for a source such a job
    never reads (and that stock daemon printed a ``BrokenPipeError`` traceback when a failing
    job stopped Spark under it): the session's start took 7.3-8.5 s and 8.1-8.4 CPU-s with
    it against 5.3-5.7 s and 6.2-6.6 CPU-s without (3 alternations, load 3-4)."""
    check_java()
    spec = SessionSpec(master=resolve_master(master), app_name=app_name, conf=dict(conf or {}))
    prepare_environment(master=spec.master)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(spec.master).appName(spec.app_name)
    conf_items = java_options(spec.spark_conf(), quiet_jvm(), c1_only)
    for k, v in conf_items.items():
        builder = builder.config(k, v)
    from loglake.pipeline import register

    try:
        _handle_interrupts()
        spark = _start(builder)
        atexit.unregister(_stop_at_exit)  # once, however many sessions are built
        atexit.register(_stop_at_exit)
        spark.sparkContext.setLogLevel("ERROR")
        # the first SQL setting set checks the session's (a bad spark.sql.* value fails here)
        if data_source:
            register(spark)
        else:
            spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    except Exception as e:  # pyspark's or py4j's: the JVM did not start, or refused a setting
        raise SparkStartFailed(spec.master, e) from e
    return spark
