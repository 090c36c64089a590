"""Fixtures for the JetStream backend's tests: a single JetStream server and a 3-node R3
cluster on loopback (``tests/nats_cluster.py``), one each for the whole session (provided to every
module by ``tests/streams/conftest.py``), each test in its own namespace (``prefix``) so tests
share a cluster without seeing each other's streams."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.conftest import require_peer
from tests.nats_cluster import NATS_HINT, NatsCluster, have_nats_server
from tests.waiting import wait_until

if TYPE_CHECKING:
    from loglake.log import Record
    from loglake.streams.jetstream import JetStreamLog


def start_cluster(n: int) -> NatsCluster:
    require_peer("nats-server", have_nats_server(), NATS_HINT)
    return NatsCluster(n).start()


@pytest.fixture(scope="session")
def nats_single() -> Iterator[NatsCluster]:
    c = start_cluster(1)
    yield c
    c.close()


@pytest.fixture(scope="session")
def nats_r3() -> Iterator[NatsCluster]:
    c = start_cluster(3)
    yield c
    c.close()


def new_prefix() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture(params=["single", "r3"])
def cluster(request) -> NatsCluster:
    """Both shapes: a loglake partition as an R1 stream on one server, and as an R3 stream."""
    return request.getfixturevalue("nats_single" if request.param == "single" else "nats_r3")


@pytest.fixture
def js_log(cluster: NatsCluster):
    from loglake.streams.jetstream import JetStreamLog

    log = JetStreamLog(cluster.url, prefix=new_prefix(), replicas=cluster.n)
    yield log
    log.close()


def read_to_head(
    log: JetStreamLog, stream: str, partition: int = 0, timeout: float = 10.0
) -> list[Record]:
    """Every record of the partition, read through ``log`` once the read reaches the head the
    stream's leader reports (``stream_info``, asked before each read). Why: a direct get is
    served by any replica, and ``JetStreamLog`` is read-your-writes for its own pushes only
    (docs/jetstream.md: "Across processes, a pull right after another process's push may
    briefly miss it"); a test reading what another process or node wrote waits, bounded, for
    that to be visible instead of asserting on a lagging replica's answer."""

    def whole() -> list[Record] | None:
        part = log.stream_info(stream).partitions[partition]
        recs = log.read(stream, 0, limit=1_000_000, partition=partition)
        end = recs[-1].index + 1 if recs else part.first_index
        return recs if end >= part.next_index else None

    return wait_until(whole, timeout, f"a read of {stream!r}/{partition} at the leader's head")
