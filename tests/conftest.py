"""Fixtures shared by every part's tests."""

from __future__ import annotations

import socket

import pytest

from loglake.log import MemoryLog


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def memory_log() -> MemoryLog:
    return MemoryLog()
