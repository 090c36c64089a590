"""A pull reads no more history than its reply can carry (``max_pull_bytes``).

Found from outside (review 5, A2): the service asked the log for every message up to the pull's
``limit`` and cut the reply to ``max_pull_bytes`` afterwards: 4 concurrent pulls with
limit=100,000 over 2,400 messages of 256 KiB were each answered with 32 messages (8 MiB, as
they should) but took 4.2 s each and took the server to 2.4 GB. The cap now goes down to the
log's read, which stops at it; the replies carry the same messages as before."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from loglake.log import StreamConfig, open_log
from loglake.log.api import cap_bytes
from loglake.streams.client import StreamClient
from loglake.streams.limits import KiB, MiB
from tests.streams.test_hostile_clients import serving

RECORD = 256 * KiB
RECORDS = 96  # 24 MiB of history; a reply carries 1 MiB (serving's max_pull_bytes)


def test_a_pull_reads_about_what_its_reply_carries(tmp_path) -> None:
    log = open_log(tmp_path / "data")
    try:
        log.create_stream("big", StreamConfig(durability="none", segment_bytes=4 * MiB))
        log.append_payloads("big", [bytes([i]) * RECORD for i in range(RECORDS)])
        with serving(log) as srv, StreamClient(port=srv.port, timeout=30) as c:
            assert len(c.pull("big", 0, 1)) == 1  # connected, partition open
            tracemalloc.start()
            try:
                tracemalloc.reset_peak()
                got = c.pull("big", 10, 100_000)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        # the same reply as before: 4 records of 256 KiB fill 1 MiB
        assert [m.index for m in got] == [10, 11, 12, 13]
        assert all(m.data == bytes([m.index]) * RECORD for m in got)
        # before: the whole 22 MiB from index 10 was read into memory, then cut
        assert peak < 8 * MiB, peak
    finally:
        log.close()


@pytest.mark.parametrize("seed", range(6))
def test_a_read_capped_in_bytes_is_the_uncapped_read_cut_to_the_cap(tmp_path, seed) -> None:
    """Across segment boundaries and the lake below them, records of mixed sizes (empty ones
    too): ``read_payloads(max_bytes=)`` is the uncapped read cut where the reply is cut."""
    rng = random.Random(seed)
    log = open_log(tmp_path / "data")
    try:
        lake = seed % 2 == 1  # half the seeds: the older segments sealed and gone to the lake
        cfg = StreamConfig(durability="none", segment_bytes=3000, retention_records=60)
        log.create_stream("s", cfg if lake else StreamConfig(durability="none", segment_bytes=3000))
        datas = [bytes(rng.choice([0, 1, 10, 300, 900, 2500])) for _ in range(200)]
        for k in range(0, len(datas), 7):
            log.append_payloads("s", datas[k : k + 7])
        if lake:
            log.wait_for_seals()
            log.enforce_retention()
        for _ in range(60):
            start = rng.randrange(0, 210)
            limit = rng.choice([1, 3, 50, 100_000])
            cap = rng.choice([0, 1, 500, 1000, 2600, 5000, 40_000])
            full = log.read_payloads("s", start, limit)
            capped = log.read_payloads("s", start, limit, max_bytes=cap)
            assert capped == cap_bytes(full, cap), (seed, start, limit, cap)
    finally:
        log.close()
