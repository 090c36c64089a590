"""``job archives-build`` and the bounds of an archive's content topics: without ``--topic`` the
job lists every topic the stream's posters used, as the control node did (found from outside:
distinct long topics made an index no member decodes); now it leaves out what the control node
leaves out (``archives.builder.bounded_topics``), byte for byte, and counts it in its report."""

from __future__ import annotations

from pathlib import Path

import pytest

from loglake.archives import ArchiveConfigError, get_layout
from loglake.archives.builder import MAX_ARCHIVE_TOPICS, MAX_TOPIC_BYTES
from loglake.log import Entry, StreamConfig, open_log
from tests.archives.helpers import DAY, START, WEEK, record
from tests.pipeline.test_job_archives_build import (
    LAYOUTS,
    assert_same,
    control_build,
    files,
    job,
)

pytestmark = pytest.mark.spark


def write_with_strangers(data_dir: Path, layout_name: str) -> None:
    """A week of 40 messages on the community's topic, 120 strangers' topics of 100 bytes with
    one post each, and 5 of ``MAX_TOPIC_BYTES + 1`` bytes; then a second week of the channel
    only."""
    layout = get_layout(layout_name)

    def stranger(i: int, size: int) -> bytes:
        t = f"{size:04d}{i:04d}" + "x" * (size - 8)
        extra = {"sig": b"\x02" * 65} if layout_name == "status-go" else {}
        return layout.make_record(
            payload=b"junk",
            topic=t.encode() if layout_name == "status-go" else t,
            timestamp_ns=START + DAY + i * 10**9,
            **extra,
        )

    with open_log(data_dir) as log:
        log.create_stream("c", StreamConfig(partitions=1, segment_bytes=64 * 1024))
        honest = [Entry(record(layout, START + i * 3600 * 10**9)) for i in range(40)]
        junk = [Entry(stranger(i, 100)) for i in range(120)]
        junk += [Entry(stranger(i, MAX_TOPIC_BYTES + 1)) for i in range(5)]
        log.append_many("c", honest + junk)
        log.append_many("c", [Entry(record(layout, START + WEEK + i * 10**9)) for i in range(9)])


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_strangers_topics_are_bounded_as_by_the_control_node(spark, tmp_path, layout_name):
    """The spec layout's sized path cannot leave records out: a window past the bounds is
    built by the general path; both give the control node's bytes."""
    layout = get_layout(layout_name)
    data = tmp_path / "data"
    write_with_strangers(data, layout_name)
    now = START + 2 * WEEK + DAY
    rep = job(spark, data, tmp_path / "job", layout_name, now)
    out = control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(tmp_path / "job", tmp_path / "ctl")
    entries = layout.decode_index(files(tmp_path / "job")["index"] or b"")
    assert [len(e.metadata.content_topics) for e in entries] == [MAX_ARCHIVE_TOPICS, 1]
    left_out = (120 + 1 - MAX_ARCHIVE_TOPICS) + 5
    assert rep.communities[0].topic_skipped == out.result.topic_skipped == left_out
    assert rep.to_json()["communities"][0]["topic_skipped"] == left_out


def test_topics_past_the_bounds_are_refused_before_spark(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(ArchiveConfigError, match="at most"):
        job(None, tmp_path / "data", tmp_path / "job", "spec", START, topics=("x" * 300,))
    assert not (tmp_path / "job").exists()
