"""Every test here injects faults, kills or power losses: the log's recovery and failure
warnings (torn tails cut, fsyncs failed, partitions reopened) are expected by the hundred."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _quiet():
    lg = logging.getLogger("loglake")
    old = lg.level
    lg.setLevel(logging.CRITICAL)
    yield
    lg.setLevel(old)
