"""Fixtures of the archives tests that fetch over real BitTorrent."""

from __future__ import annotations

import pytest

from loglake.archives.bt import Seeder


@pytest.fixture
def seeder():
    """A libtorrent seeder on loopback, closed after the test."""
    s = Seeder()
    yield s
    s.close()
