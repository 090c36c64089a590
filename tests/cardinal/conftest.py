"""Cardinal test fixtures."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _restore_loglake_logger():
    """The CLI's ``main`` configures the ``loglake`` logger; undo it so ``caplog`` sees logs."""
    lg = logging.getLogger("loglake")
    saved = (lg.level, lg.propagate, list(lg.handlers))
    yield
    lg.level, lg.propagate = saved[0], saved[1]
    lg.handlers[:] = saved[2]
