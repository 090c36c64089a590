"""Fixtures shared by every part's tests."""

from __future__ import annotations

import pytest

from loglake.log import MemoryLog
from tests.procs import free_port


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def memory_log() -> MemoryLog:
    return MemoryLog()
