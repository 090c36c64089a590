"""Fixtures shared by every part's tests, and the one rule for missing test peers."""

from __future__ import annotations

import logging
import os
import re
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from loglake.log import MemoryLog
from tests.procs import free_port

# Hypothesis's timing checks (a 200 ms deadline per example; "data generation too slow") race
# the clock of a shared 2-core machine, where another worker's Spark job can stall an example:
# they fail a property that holds. What the properties assert is kept; only the timing is off.
# An explicit @settings on a test still wins; HYPOTHESIS_PROFILE=default restores Hypothesis's own.
settings.register_profile("loglake", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "loglake"))

TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1"
"""The JVM flag every Spark JVM the tests start runs with: only the C1 (client) JIT compiler.

Why: the tests' JVMs live seconds to a minute and run jobs on kilobytes, and in such a JVM the
C2 compiler's threads spend more CPU compiling Spark's hot paths than the jobs save by running
them compiled (a ``local[2]`` session with two tiny queries: ~45-50 CPU-s with the default
tiered JIT, ~30 with C1 only). On the suite's 2-core machine that CPU is wall time. What a test
asserts does not depend on the JIT; ``LOGLAKE_TEST_FULL_JIT=1`` runs them with the JVM's default.

Where it reaches: ``SPARK_SUBMIT_OPTS`` is read by Spark's launcher for every driver JVM
(the ``spark`` fixture's session, and the CLI, node and worker subprocesses, which inherit this
environment); the standalone cluster's daemons and executors get it from
tests/pipeline/conftest.py (``SPARK_DAEMON_JAVA_OPTS``, ``spark.executor.extraJavaOptions``)."""


def jvm_opts() -> str:
    """:data:`TEST_JVM_OPTS`, or nothing with ``LOGLAKE_TEST_FULL_JIT=1``."""
    return "" if os.environ.get("LOGLAKE_TEST_FULL_JIT") == "1" else TEST_JVM_OPTS


if jvm_opts() and jvm_opts() not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
    os.environ["SPARK_SUBMIT_OPTS"] = (
        os.environ.get("SPARK_SUBMIT_OPTS", "") + " " + jvm_opts()
    ).strip()


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def require_peer(name: str, available: bool, hint: str = "") -> None:
    """Every test that needs an outside peer (a node package, aria2c, transmission-cli,
    nats-server, redis-server, …) calls this (or carries ``@pytest.mark.peer``): a missing peer
    skips the test on a developer's machine, but fails it when ``CI=true`` (issue 17: under
    ``make test`` in CI an interop test must never pass by not running)."""
    if available:
        return
    msg = f"test peer missing: {name}" + (f" ({hint})" if hint else "")
    if in_ci():
        pytest.fail(f"{msg}; CI=true, so a missing peer is a failure, not a skip", pytrace=False)
    pytest.skip(msg)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "peer(name, available, hint=''): the test needs an outside peer; when it is missing "
        "the test is skipped, or failed under CI=true (tests/conftest.py require_peer)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers(name="peer"):
        require_peer(*mark.args, **mark.kwargs)


@pytest.fixture(autouse=True)
def _restore_loglake_logger():
    """Undo what a test did to logging, so that a later test's ``caplog`` assertions do not
    depend on which file ran before it on its worker: a CLI ``main`` run in process configures
    the ``loglake`` logger (its own handler, its level, no propagation), and a logging config
    may disable existing loggers. (Stop 27's CI: one ``caplog`` test saw no records at all;
    not reproduced alone, so every such state is reset.)"""
    lg = logging.getLogger("loglake")
    saved = (lg.level, lg.propagate, list(lg.handlers))
    yield
    lg.level, lg.propagate = saved[0], saved[1]
    lg.handlers[:] = saved[2]
    logging.disable(logging.NOTSET)
    for name, child in list(logging.root.manager.loggerDict.items()):
        if name.startswith("loglake") and isinstance(child, logging.Logger):
            child.disabled = False


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def memory_log() -> MemoryLog:
    return MemoryLog()


# -- scheduling under `make test` (pytest-xdist's `--dist loadfile`) --------------------------
SPARK_CLUSTER_UNIT = "spark-cluster"
"""The one xdist work unit of every test file that uses the standalone Spark cluster."""
_USES_CLUSTER = re.compile(r"\bcluster_driver\b")
_USES_SPARK = re.compile(r"pytest\.mark\.spark\b")
_IS_SLOW = re.compile(r"pytest\.mark\.slow\b")


@cache
def _source(rootpath: Path, file: str) -> str:
    try:
        return (rootpath / file).read_text(errors="replace")
    except OSError:  # not a file (a doctest's package, say): no special placement
        return ""


try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pragma: no cover - xdist is a dev dependency; without it no hook
    LoadFileScheduling = None

if LoadFileScheduling is not None:

    class SuiteScheduling(LoadFileScheduling):
        """``--dist loadfile`` (each file whole on one worker: module fixtures stay shared),
        with two changes for the suite's wall time on a 2-core machine.

        - Every file that uses the standalone Spark cluster (the session fixtures
          ``cluster``/``cluster_driver`` in tests/pipeline/conftest.py) is one work unit, so
          one worker starts the cluster and its driver application (70-80 s on the shared
          machine, four JVMs) instead of each worker starting its own.
        - Longest work first: that unit, then the other Spark files, then the other files with
          ``slow`` tests (subprocesses, servers, mypy), then the rest (each group in xdist's
          order). A worker keeps two units queued, so whatever is handed out last decides how
          long the other worker idles at the end: a long file there (mypy's ~45 s is collected
          near the end of the tree) would leave it idle that long; a file of quick tests does not.

        Which files: read from their source (the fixture's name; the ``spark`` and ``slow``
        marks), so a new test file is placed without a list to keep."""

        def __init__(self, config: pytest.Config, log=None) -> None:
            super().__init__(config, log)
            self._rootpath = config.rootpath
            self._ordered = False

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if _USES_CLUSTER.search(_source(self._rootpath, file)):
                return SPARK_CLUSTER_UNIT
            return file

        def _rank(self, unit: str) -> int:
            if unit == SPARK_CLUSTER_UNIT:
                return 0
            source = _source(self._rootpath, unit)
            if _USES_SPARK.search(source):
                return 1
            return 2 if _IS_SLOW.search(source) else 3

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # the queue is complete before the first unit is handed out
                self._ordered = True
                units = sorted(self.workqueue.items(), key=lambda kv: self._rank(kv[0]))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    def pytest_xdist_make_scheduler(config: pytest.Config, log):
        """``make test``'s ``--dist loadfile`` gets :class:`SuiteScheduling`; any other
        ``--dist`` is left to xdist."""
        if config.getvalue("dist") == "loadfile":
            return SuiteScheduling(config, log)
        return None
