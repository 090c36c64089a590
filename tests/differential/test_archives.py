"""The archives' protobuf bytes against classes protoc builds from the ``.proto`` files, and
loglake's torrents and magnets against libtorrent's parsers, by differential fuzzing (rules in
``tests/differential/archives.py`` and ``tests/differential/torrents.py``). Seeded and
bounded (``LOGLAKE_DIFF_EXAMPLES``, ``LOGLAKE_DIFF_SEED``); the long run is
``benchmarks/fuzz.py --diff``."""

from __future__ import annotations

from tests.differential.conftest import EXAMPLES, MAX_SECONDS, SEED
from tests.differential.fuzzers import FUZZERS


def test_archive_protobufs_agree_with_the_generated_code() -> None:
    out = FUZZERS["archives"].run(None, examples=EXAMPLES, seed=SEED, max_seconds=MAX_SECONDS)
    assert out.cases > 0
    assert not out.disagreements, out.report()


def test_torrents_and_magnets_agree_with_libtorrent() -> None:
    out = FUZZERS["torrents"].run(None, examples=EXAMPLES, seed=SEED, max_seconds=MAX_SECONDS)
    assert out.cases > 0
    assert not out.disagreements, out.report()
