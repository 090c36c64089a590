"""Fixtures for the JetStream backend's tests: a single JetStream server and a 3-node R3
cluster on loopback (``tests/nats_cluster.py``), one each for the whole session (provided to every
module by ``tests/streams/conftest.py``), each test in its own namespace (``prefix``) so tests
share a cluster without seeing each other's streams."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import require_peer
from tests.nats_cluster import NATS_HINT, NatsCluster, have_nats_server


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
