"""The content topics an archive lists (spec "Exporting messages for bundling": only messages on
the community's channel topics are exported; "Message history archives": ``contentTopic`` lists
all of them). Found from outside: with no topics configured (the node's control loop, and the
CLI and job without ``--topic``) every topic a poster used was listed in every archive's
metadata, and the append-only index repeats it for good; 600 posts on distinct 60 KB topics
made an index of 36 MB, past ``MAX_INDEX_BYTES``, and no member could fetch any history again."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner
from coincurve import PrivateKey

from loglake.archives.builder import (
    MAX_ARCHIVE_TOPICS,
    MAX_TOPIC_BYTES,
    ArchiveBuilder,
    check_topics,
    plan_windows,
)
from loglake.archives.cli import command as archives_cli
from loglake.archives.control import ControlNode
from loglake.archives.errors import ArchiveConfigError
from loglake.archives.layout import MAX_INDEX_BYTES, NS, get_layout
from loglake.archives.member_node import fetch_archives
from loglake.archives.signing import community_id
from loglake.archives.store import MessageStore
from loglake.log import MemoryLog, open_log
from loglake.log.api import Entry
from loglake.node.config import ConfigError, archive_topics, load_config
from loglake.streams.api import LocalStreams

from .helpers import SG_TOPIC, SPEC_TOPIC, START, WEEK

KEY = PrivateKey(bytes.fromhex("57" * 32))
CID = community_id(KEY)
SPEC = get_layout("spec")
SG = get_layout("status-go")


def honest(layout, n=10):
    topic = SG_TOPIC if layout is SG else SPEC_TOPIC
    return [
        Entry(layout.make_record(payload=b"hi %d" % i, topic=topic, timestamp_ns=START + i * NS))
        for i in range(n)
    ]


def junk(layout, n, size, at=START + 100 * NS):
    """``n`` posts, each on its own topic of ``size`` bytes (distinct by their first 8)."""

    def topic(i):
        t = f"{i:08d}" + "x" * (size - 8)
        return t.encode() if layout is SG else t

    return [
        Entry(layout.make_record(payload=b"", topic=topic(i), timestamp_ns=at + i))
        for i in range(n)
    ]


def built(tmp_path, layout, entries, topics=None, name="root"):
    log = MemoryLog()
    log.create_stream("community")
    log.append_many("community", entries)
    node = ControlNode(tmp_path / name, KEY, layout, MessageStore(), topics)
    node.ingest_streams(LocalStreams(log), "community", now_ns=START + 2 * WEEK)
    out = node.build(START + WEEK)
    return node, out


@pytest.mark.slow
def test_posts_on_huge_topics_leave_the_index_small_and_history_fetchable(tmp_path, seeder):
    """The attack as found: 600 posts on distinct 60 KB topics beside 10 honest messages.
    Before: a 36 MB index, refused by every member (CorruptIndex). Now: the posts are not
    archived (counted), the archive lists the honest topic, and a member fetches it."""
    node, out = built(tmp_path, SPEC, honest(SPEC) + junk(SPEC, 600, 60_000))
    index = node.index_path.read_bytes()
    assert len(index) < 1024 < MAX_INDEX_BYTES
    assert [e.metadata.content_topics for e in node.entries] == [(SPEC_TOPIC,)]
    assert out.result.topic_skipped == node.topic_skipped_count == 600
    seeder.seed(node.torrent().metainfo(), node.root)
    store = MessageStore()
    report = fetch_archives(
        node.magnet((seeder.peer,)), tmp_path / "member", store, SPEC, timeout=30.0
    )
    assert report.hydrated_messages == 10
    assert sorted(raw for *_, raw in store.messages()) == sorted(e.data for e in honest(SPEC))


@pytest.mark.parametrize("layout", [SPEC, SG], ids=lambda x: x.name)
def test_an_archive_lists_at_most_the_bound_of_topics_the_busiest_kept(tmp_path, layout):
    """300 strangers' topics of one post each (200 bytes: within the length bound) beside a
    channel of 10 messages: the archive lists ``MAX_ARCHIVE_TOPICS``, the channel among them,
    and the posts on the others are not archived (counted)."""
    node, out = built(tmp_path, layout, honest(layout) + junk(layout, 300, 200))
    (entry,) = node.entries
    listed = entry.metadata.content_topics
    assert len(listed) == MAX_ARCHIVE_TOPICS and list(listed) == sorted(listed)
    assert (SG_TOPIC if layout is SG else SPEC_TOPIC) in listed
    assert out.result.topic_skipped == 300 - (MAX_ARCHIVE_TOPICS - 1)
    records = layout.decode_archive(
        node.data_path.read_bytes()[entry.offset : entry.offset + entry.size], entry
    )
    assert len(records) == 10 + MAX_ARCHIVE_TOPICS - 1
    assert len(node.index_path.read_bytes()) < MAX_ARCHIVE_TOPICS * (MAX_TOPIC_BYTES + 8) + 512


@pytest.mark.parametrize("layout", [SPEC, SG], ids=lambda x: x.name)
def test_topics_within_the_bounds_are_listed_as_before(tmp_path, layout):
    """The honest path: ``MAX_ARCHIVE_TOPICS`` topics of ``MAX_TOPIC_BYTES`` bytes, none
    configured, are all listed, sorted, every message archived: the same bytes as a builder
    told exactly those topics (sorted), which is what the builder wrote before the bounds."""
    entries = junk(layout, MAX_ARCHIVE_TOPICS, MAX_TOPIC_BYTES, at=START)
    node, _ = built(tmp_path, layout, entries)
    rows = [layout.decode_record(e.data) for e in entries]
    told = ArchiveBuilder(layout, CID).build(
        plan_windows(START, START + WEEK), rows, sorted(r.topic for r in rows)
    )
    assert node.data_path.read_bytes() == b"".join(a.data_bytes() for a in told.archives)
    assert node.index_path.read_bytes() == told.index


@pytest.mark.parametrize("layout", [SPEC, SG], ids=lambda x: x.name)
def test_configured_channel_topics_are_the_only_ones_exported_and_all_listed(tmp_path, layout):
    """Spec: exported messages MUST be on a channel topic, and ``contentTopic`` lists all of
    them (status-go: each chat's topic, one without messages in the window too)."""
    quiet = b"\x0a\x0b\x0c\x0d" if layout is SG else "/status/1/quiet/proto"
    channel = SG_TOPIC if layout is SG else SPEC_TOPIC
    node, _ = built(tmp_path, layout, honest(layout) + junk(layout, 50, 60_000), [channel, quiet])
    (entry,) = node.entries
    assert entry.metadata.content_topics == (channel, quiet)
    data = node.data_path.read_bytes()[entry.offset : entry.offset + entry.size]
    assert len(layout.decode_archive(data, entry)) == 10


@pytest.mark.parametrize(
    "topics, why",
    [
        (["x" * (MAX_TOPIC_BYTES + 1)], "bytes"),
        (["é" * (MAX_TOPIC_BYTES // 2 + 1)], "bytes"),  # UTF-8 bytes, not characters
        ([f"/{i:03d}/" + "t" * 250 for i in range(MAX_ARCHIVE_TOPICS + 1)], "bytes in all"),
    ],
)
def test_configured_topics_past_the_bounds_are_refused(tmp_path, topics, why):
    with pytest.raises(ArchiveConfigError, match=why):
        ControlNode(tmp_path / "root", KEY, SPEC, MessageStore(), topics)
    with pytest.raises(ArchiveConfigError, match=why):
        ArchiveBuilder(SPEC, CID).build(plan_windows(START, START + WEEK), [], topics)
    assert not (tmp_path / "root").exists()


def test_a_build_without_topics_says_what_it_left_out(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, "loglake.archives"):
        built(tmp_path, SPEC, honest(SPEC) + junk(SPEC, 3, MAX_TOPIC_BYTES + 1))
    said = [r.getMessage() for r in caplog.records]
    assert any("no channel topics configured" in m for m in said)
    (left,) = [r for r in caplog.records if "not archived" in r.getMessage()]
    assert left.fields["count"] == 3 and len(left.fields["topics"]) == 3  # type: ignore[attr-defined]
    assert all(len(t) < 80 for t in left.fields["topics"])  # type: ignore[attr-defined]


def test_the_cli_builds_with_topic_and_reports_what_it_left_out_without(tmp_path):
    data = tmp_path / "data"
    log = open_log(data)
    log.create_stream("community")
    log.append_many("community", honest(SPEC) + junk(SPEC, 20, 1000))
    log.close()
    key = tmp_path / "key"
    key.write_text("57" * 32)
    now = str((START + WEEK) // NS)
    base = ["build", "--data-dir", str(data), "--key-file", str(key), "--now", now]
    runner = CliRunner()
    plain = runner.invoke(archives_cli, [*base, "--root", str(tmp_path / "a")])
    assert plain.exit_code == 0, plain.output
    assert "20 record(s) on topics past an archive's bounds" in plain.output
    told = runner.invoke(
        archives_cli, [*base, "--root", str(tmp_path / "b"), "--topic", SPEC_TOPIC]
    )
    assert told.exit_code == 0, told.output
    assert "past an archive's bounds" not in told.output
    entries = SPEC.decode_index((tmp_path / "b" / CID / "index").read_bytes())
    assert [e.metadata.content_topics for e in entries] == [(SPEC_TOPIC,)]
    huge = runner.invoke(archives_cli, [*base, "--root", str(tmp_path / "c"), "--topic", "x" * 300])
    assert huge.exit_code != 0 and "at most 256" in huge.output
    assert "--topic" in runner.invoke(archives_cli, ["build", "--help"]).output


def test_node_config_topics_are_read_by_the_layout_and_bounded():
    cfg = load_config(
        data={"archives": {"enabled": True, "layout": "status-go", "topics": ["0xd7a5d2c3"]}},
        env={},
    )
    assert archive_topics(cfg.archives) == (SG_TOPIC,)
    assert archive_topics(load_config(env={}).archives) is None
    with pytest.raises(ConfigError, match=r"\[archives\] topics"):
        load_config(data={"archives": {"layout": "status-go", "topics": ["zz"]}}, env={})
    with pytest.raises(ConfigError, match=r"\[archives\] topics"):
        load_config(data={"archives": {"topics": ["x" * 300]}}, env={})
    flags = load_config(flags={"archives.topics": "/a/1/b/proto, /c/1/d/proto"}, env={})
    assert archive_topics(flags.archives) == ("/a/1/b/proto", "/c/1/d/proto")


def test_a_community_of_many_chats_may_configure_them_all(tmp_path):
    """A count bound of 100 would have refused a community of 150 chats; what is bounded is
    the bytes an index entry repeats (status-go topics are 4 bytes)."""
    topics = [bytes([0, 0, i // 256, i % 256]) for i in range(1_000)]
    assert check_topics(topics) == tuple(topics)
    ControlNode(tmp_path / "root", KEY, SG, MessageStore(), topics)
