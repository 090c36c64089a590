"""Spark on a JetStream-backed stream (issue 13): ``pipeline.read`` takes the sealed history from
the lake the sealer wrote and the live tail from ``serve``'s stream service over JetStream, so a
Spark job sees every record once, including those JetStream's retention already dropped."""

from __future__ import annotations

import pytest

from loglake.log import StreamConfig
from loglake.streams.jetstream import JetStreamLog
from loglake.streams.jetstream_seal import JetStreamSealer
from tests.pipeline.conftest import spark as spark  # the session fixture, here too
from tests.streams import jetstream_fixtures as fx

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_pipeline_read_spans_the_sealed_lake_and_the_live_jetstream_tail(
    spark, nats_r3, tmp_path
) -> None:
    from loglake.pipeline import read
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    log = JetStreamLog(nats_r3.url, prefix=fx.new_prefix(), replicas=3, lake_dir=str(tmp_path))
    try:
        log.create_stream("s", StreamConfig(partitions=2, retention_records=40))
        log.push_many("s", 0, [b"a%d" % i for i in range(50)])  # 0..9 dropped before sealing
        log.push_many("s", 1, [b"b%d" % i for i in range(5)])
        JetStreamSealer(log, tmp_path).seal()
        log.push_many("s", 0, [b"a%d" % i for i in range(50, 80)])  # live only, 10..39 dropped
        with BackgroundServer(StreamService(log)) as srv:
            url = f"loglake://127.0.0.1:{srv.port}"
            df = read(spark, data_dir=str(tmp_path), url=url, stream="s")
            got = sorted((r["partition"], r["index"], bytes(r["data"])) for r in df.collect())
    finally:
        log.close()
    assert got == [(0, i, b"a%d" % i) for i in range(10, 80)] + [
        (1, i, b"b%d" % i) for i in range(5)
    ]
