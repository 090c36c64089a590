"""The differential fuzzers' shared Node peer and budget.

Marked like the other interop tests: a missing Node or reference package is a skip on a
developer's machine and a failure under ``CI=true`` (``tests/conftest.py`` ``require_peer``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import require_peer
from tests.differential.peer import DiffPeer, available

EXAMPLES = int(os.environ.get("LOGLAKE_DIFF_EXAMPLES", "100"))
"""Batches drawn per fuzzer in ``make test`` (each batch is tens to thousands of cases):
2-5 s per fuzzer on an idle machine, ~20 s for the whole folder."""
SEED = int(os.environ.get("LOGLAKE_DIFF_SEED", "33"))
MAX_SECONDS = float(os.environ.get("LOGLAKE_DIFF_SECONDS", "8"))
"""Per fuzzer and per plant: the run stops here, so a loaded machine does not stretch the
suite; every planted bug is caught within ~1 s idle."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.interop)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def peer() -> Iterator[DiffPeer]:
    require_peer("node + @waku/sds + @bare-ts/lib", available(), "make node-deps")
    with DiffPeer() as p:
        yield p
