"""One SparkSession for the whole part (session-scoped): starting Spark costs ~10 s."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from loglake.pipeline.session import build_session

    session = build_session(
        master="local[2]",
        app_name="loglake-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"},
    )
    yield session
    session.stop()
