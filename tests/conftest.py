"""Fixtures shared by every part's tests, and the one rule for missing test peers."""

from __future__ import annotations

import logging
import os

import pytest

from loglake.log import MemoryLog
from tests.procs import free_port


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
