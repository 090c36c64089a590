"""Control node (ingest, build, resume, prune, publish) and member core (wait, authenticate,
hydrate) without the network."""

from __future__ import annotations

import logging

import pytest
from coincurve import PrivateKey

from loglake.archives.builder import MAX_FUTURE_NS
from loglake.archives.control import SKIPPED_KEPT, ControlNode, Pruned
from loglake.archives.errors import CorruptArchive
from loglake.archives.layout import NS, get_layout
from loglake.archives.member import Accepted, Ignored, MemberCore, unpack
from loglake.archives.member_node import RECENT_EVENTS, MemberNode
from loglake.archives.signing import community_id, encode_magnet_message
from loglake.archives.store import MessageStore
from loglake.log import MemoryLog
from loglake.log.api import Entry
from loglake.streams.api import LocalStreams

from .helpers import DAY, START, WEEK, fill_weeks, record, topic_for

KEY = PrivateKey(bytes.fromhex("33" * 32))
CID = community_id(KEY)
MAGNET = "magnet:?xt=urn:btih:" + "cd" * 20


@pytest.fixture(params=["spec", "status-go"])
def layout(request):
    return get_layout(request.param)


def test_ingest_from_log_and_streams_is_exactly_once(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(2), 50)
    log.append("community", b"\xff\xff not a waku message")
    store = MessageStore(tmp_path / "s.sqlite")
    node = ControlNode(tmp_path / "root", KEY, layout, store)
    assert node.ingest_streams(LocalStreams(log), "community") == 100  # the bad record is skipped
    assert node.ingest_streams(LocalStreams(log), "community") == 0
    fill_weeks(log, "community", layout, range(2, 3), 10)
    assert node.ingest_streams(LocalStreams(log), "community") == 10
    assert store.count() == 110


def test_ingest_and_member_poll_past_records_retention_removed_say_so(tmp_path, caplog):
    layout = get_layout("spec")
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(1), 10)
    log.truncate_before("community", 4)  # retention took 4 records before the first ingest
    streams = LocalStreams(log)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    with caplog.at_level("WARNING", "loglake.archives"):
        assert node.ingest_streams(streams, "community") == 6
        streams.create_stream("special")
        for i in range(3):
            streams.push("special", encode_magnet_message(i, MAGNET, KEY))
        log.truncate_before("special", 2)
        MemberNode(tmp_path / "m", MessageStore(), layout, CID).poll(streams, "special", 0)
    gaps = [r.fields for r in caplog.records if "no longer kept" in r.getMessage()]
    assert gaps == [
        {"stream": "community", "first_missing": 0, "next_kept": 4},
        {"stream": "special", "first_missing": 0, "next_kept": 2},
    ]


def test_build_writes_folder_named_by_community_and_resumes(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(3), 200)
    store_path = tmp_path / "s.sqlite"
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore(store_path))
    node.ingest_streams(LocalStreams(log), "community")
    out = node.build(START + 2 * WEEK)
    assert len(out.new) == 2
    folder = tmp_path / "root" / CID
    assert sorted(p.name for p in folder.iterdir()) == ["data", "index"]
    assert (tmp_path / "root" / f"{CID}.torrent").exists()
    data_before = (folder / "data").read_bytes()
    # a restart (new objects on the same files) continues with week 3 only
    node.store.close()
    node2 = ControlNode(tmp_path / "root", KEY, layout, MessageStore(store_path))
    assert node2.build(START + 2 * WEEK).new == []
    out3 = node2.build(START + 3 * WEEK)
    assert len(out3.new) == 1 and out3.new[0].metadata.from_ns == START + 2 * WEEK
    data_after = (folder / "data").read_bytes()
    assert data_after.startswith(data_before) and len(data_after) > len(data_before)


def test_torn_build_is_truncated_on_restart(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(1), 20)
    store_path = tmp_path / "s.sqlite"
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore(store_path))
    node.ingest_streams(LocalStreams(log), "community")
    node.build(START + WEEK)
    data = tmp_path / "root" / CID / "data"
    good = data.read_bytes()
    with open(data, "ab") as f:  # crash after appending, before writing index
        f.write(b"\x01" * 1000)
    ControlNode(tmp_path / "root", KEY, layout, MessageStore(store_path))
    assert data.read_bytes() == good


def _live(log: MemoryLog, stream: str = "community") -> list[bytes]:
    return [r.data for r in log.read(stream, 0)]


def _archived(node: ControlNode) -> set[bytes]:
    data = node.data_path.read_bytes()
    out: set[bytes] = set()
    for e in node.entries:
        out.update(node.layout.decode_archive(data[e.offset : e.offset + e.size], e))
    return out


def test_prune_truncates_only_archived_records_older_than_30_days(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(6), 7)
    everything = _live(log)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    node.ingest_streams(LocalStreams(log), "community")
    now = START + 6 * WEEK
    assert node.prune(now).log_records == 0  # nothing archived yet: nothing removed
    assert _live(log) == everything
    node.build(START + 2 * WEEK)  # weeks 1-2 archived
    pruned = node.prune(now)
    # 30 days before `now` is day 12: only archived records before day 12 go, from the live
    # stream (the source of truth) and from the working store
    assert (pruned.log_records, pruned.store_rows, pruned.kept_from) == (12, 12, 12)
    assert _live(log) == everything[12:]
    assert log.read("community", 0)[0].index == 12
    assert set(everything[:12]) <= _archived(node)  # what left the live log is in archives
    assert node.store.oldest_ns() >= START + 12 * DAY
    # the flags of pruned rows go with them: the 2 archived rows left are flagged
    assert node.store.db.execute("SELECT count(*) FROM archived").fetchone()[0] == 2
    node.build(now)
    assert node.prune(now).log_records == 0  # week 3+ is newer than 30 days
    assert _live(log) == everything[12:]


def test_prune_goes_past_a_record_that_arrived_after_its_window_was_archived(tmp_path, layout):
    """A record dated in archived week 1 that arrives after the build is never exported
    (windows are not reopened): kept, it held every record after it in the live stream for
    good (14 of 16 truncated, years later). It is logged and counted at ingest, and truncated
    with its window once older than 30 days; a record not yet exported still holds."""
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(2), 7)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    node.ingest_streams(LocalStreams(log), "community")
    node.build(START + 2 * WEEK)
    # arrivals after the build: a message dated in archived week 1 and junk that is not a
    # WakuMessage; then a record of week 3, whose window is not built yet
    late = record(layout, START + 3 * DAY, b"late")
    log.append("community", late)  # index 14
    log.append("community", b"\xff\xff not a waku message")  # index 15
    week3 = record(layout, START + 2 * WEEK + DAY, b"week 3")
    log.append("community", week3)  # index 16
    assert node.ingest_streams(LocalStreams(log), "community") == 2
    assert node.late_count == 1 and node.late == [(14, START + 3 * DAY)]
    assert late not in _archived(node)
    # day 3 is not older than 30 days yet: the late record holds the rest
    assert node.prune(START + 33 * DAY) == Pruned(3, 3, 3)
    pruned = node.prune(START + 10 * WEEK)
    assert (pruned.log_records, pruned.store_rows, pruned.kept_from) == (13, 12, 16)
    assert _live(log) == [week3]  # not yet archived: held
    assert node.store.count() == 1
    assert node.ingest_streams(LocalStreams(log), "community") == 0
    assert node.late_count == 1  # counted once


YEAR_2200 = 7_258_118_400 * NS  # 2200-01-01


def test_a_record_dated_in_the_future_is_refused_and_holds_no_retention(tmp_path, layout):
    # one record of the year 2200 at index 1 could only be archived in 2200: kept, it held
    # every record after it, and prune truncated 1 record of 71 (kept_from 1)
    now = START + 20 * WEEK
    log = MemoryLog()
    recs = [record(layout, START + i * DAY) for i in range(70)]
    recs.insert(1, record(layout, YEAR_2200, b"future"))
    edge = MAX_FUTURE_NS - MAX_FUTURE_NS % layout.time_unit_ns  # whole seconds for status-go
    recs.append(record(layout, now + edge, b"edge"))  # index 71: just within the bound
    recs.append(record(layout, now + edge + layout.time_unit_ns, b"past"))  # index 72
    log.create_stream("community")
    log.append_many("community", [Entry(r) for r in recs])
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    assert node.ingest_streams(LocalStreams(log), "community", now_ns=now) == 71
    assert node.future_count == 2 and [i for i, _ in node.future] == [1, 72]
    assert node.skipped_count == 0 and node.decoded == 73
    node.build(now)
    pruned = node.prune(now)
    # all 70 archived records (and the refused one among them) leave the live stream; the
    # record within the bound is stored, not yet archived (its window is open), and holds
    # retention from index 71, the refused one after it with it
    assert (pruned.log_records, pruned.store_rows, pruned.kept_from) == (71, 70, 71)
    assert _live(log) == recs[71:]
    assert node.store.count() == 1


def test_store_is_rebuilt_from_stream_and_archives(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(3), 7)
    everything = _live(log)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore(tmp_path / "a.sqlite"))
    node.ingest_streams(LocalStreams(log), "community")
    node.build(START + 2 * WEEK)
    node.store.close()
    # the store is lost: a new one is filled from the stream and re-flagged from the archives
    fresh = MessageStore(tmp_path / "b.sqlite")
    node2 = ControlNode(tmp_path / "root", KEY, layout, fresh)
    assert node2.ingest_streams(LocalStreams(log), "community") == 21
    assert {a.archive_id for a in fresh.archives()} == {e.archive_id for e in node2.entries}
    pruned = node2.prune(START + 10 * WEEK)
    assert pruned.log_records == 14  # weeks 1-2, exactly what the archives hold
    assert _live(log) == everything[14:]
    assert node2.build(START + 2 * WEEK).new == []  # no window is exported twice


def test_a_message_received_twice_is_archived_once(tmp_path, layout):
    """status-go keeps one row per message hash (protocol/communities/persistence.go
    ``SaveWakuMessages``: ``INSERT OR REPLACE INTO waku_messages``, ``hash TEXT PRIMARY KEY``):
    a message received twice — again in the same batch, in a later one, and after its window
    was archived (a store node's history sent again) — is in the archive once, exactly as if
    it had arrived once, holds no record back from truncation, and a member hydrates it once."""
    extra = {"hash": b"\x5a" * 32} if layout.name == "status-go" else {}
    twice = layout.make_record(
        payload=b"twice", topic=topic_for(layout), timestamp_ns=START + DAY, **extra
    )
    same_time = record(layout, START + DAY, b"same time, other bytes")
    once, log = MemoryLog(), MemoryLog()
    for target, recs in (
        (once, [twice, same_time, record(layout, START + 2 * DAY)]),
        (log, [twice, same_time, twice, record(layout, START + 2 * DAY)]),
    ):
        target.create_stream("community")
        target.append_many("community", [Entry(r) for r in recs])
    log.append("community", twice)  # a later batch
    ref = ControlNode(tmp_path / "ref", KEY, layout, MessageStore())
    ref.ingest_streams(LocalStreams(once), "community")
    ref.build(START + 2 * WEEK)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    assert node.ingest_streams(LocalStreams(log), "community") == 3
    out = node.build(START + 2 * WEEK)
    data = node.data_path.read_bytes()
    assert data == ref.data_path.read_bytes()
    (entry,) = out.new
    assert layout.decode_archive(data[entry.offset : entry.offset + entry.size], entry) == [
        twice,
        same_time,
        record(layout, START + 2 * DAY),
    ]
    log.append("community", twice)  # after its window was archived
    assert node.ingest_streams(LocalStreams(log), "community") == 0
    assert node.late_count == 0  # a copy of an archived record is not late: it is archived
    pruned = node.prune(START + 10 * WEEK)
    assert pruned.log_records == 6 and _live(log) == []  # no copy holds the live log
    member = MessageStore()
    member.hydrate(entry, unpack(layout, entry, data[entry.offset : entry.offset + entry.size]))
    assert member.count() == 3


def _fields_reversed(layout, raw: bytes) -> bytes:
    """``raw`` with its fields written last to first: the same message to any protobuf
    reader (fields may come in any order), other bytes than protobuf writes."""
    parsed = layout.decode_record(raw)
    assert parsed.raw == raw
    from loglake.wire.pb import archives_spec_pb2 as spec_pb
    from loglake.wire.pb import archives_statusgo_pb2 as sg_pb

    cls = (spec_pb if layout.name == "spec" else sg_pb).WakuMessage
    out = b""
    for field, value in cls.FromString(raw).ListFields():
        out = cls(**{field.name: value}).SerializeToString() + out
    return out


def test_a_record_in_non_canonical_protobuf_bytes_is_re_flagged_after_a_lost_store(
    tmp_path, layout
):
    """A lost store is re-flagged from the archives: a row is archived iff its record is in
    one. A record whose valid protobuf bytes are not the ones protobuf writes is archived as
    it is (its bytes framed), so it must be found there as it is: the live log is truncated
    past it, as past every other archived record."""
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(2), 7)
    odd = _fields_reversed(layout, record(layout, START + 2 * DAY, b"fields in reverse"))
    assert layout.decode_record(odd).timestamp_ns == START + 2 * DAY
    log.append("community", odd)  # index 14, in week 1
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore(tmp_path / "a.sqlite"))
    node.ingest_streams(LocalStreams(log), "community")
    node.build(START + 2 * WEEK)
    assert odd in node.data_path.read_bytes()  # archived as it came
    node.store.close()
    fresh = MessageStore(tmp_path / "b.sqlite")
    node2 = ControlNode(tmp_path / "root", KEY, layout, fresh)
    node2.ingest_streams(LocalStreams(log), "community")
    assert fresh.rows_before(START + 2 * WEEK) == []  # every row re-flagged
    assert node2.prune(START + 10 * WEEK).log_records == 15 and _live(log) == []


def test_member_waits_20_seconds_after_the_last_magnet():
    core = MemberCore(CID)
    t = 1_000 * NS
    assert isinstance(core.on_message(encode_magnet_message(1, MAGNET, KEY), t), Accepted)
    assert core.due(t + 19 * NS) is None
    later = MAGNET + "&dn=2"
    assert isinstance(core.on_message(encode_magnet_message(2, later, KEY), t + 10 * NS), Accepted)
    assert core.due(t + 29 * NS) is None  # the wait restarts at the last magnet
    assert core.due(t + 30 * NS) == later
    core.done(later)
    assert core.due(t + 100 * NS) is None


def test_member_ignores_unsigned_foreign_and_stale_magnets(caplog):
    core = MemberCore(CID)
    other = PrivateKey(bytes.fromhex("44" * 32))
    with caplog.at_level(logging.WARNING, logger="loglake.archives"):
        ev = core.on_message(encode_magnet_message(9, MAGNET, other), 0)
    assert isinstance(ev, Ignored) and "control node" in ev.reason
    assert any("ignoring" in r.getMessage() for r in caplog.records)
    assert isinstance(core.on_message(b"garbage", 0), Ignored)
    assert isinstance(core.on_message(encode_magnet_message(5, MAGNET, KEY), 0), Accepted)
    assert isinstance(core.on_message(encode_magnet_message(4, MAGNET + "x", KEY), 0), Ignored)
    assert core.magnet == MAGNET


def test_member_takes_a_new_link_under_the_same_clock_as_status_go_does():
    """status-go messenger_communities.go: ``clock >= lastClock`` and a link other than the
    last one fetched is taken; an older clock, or the link already fetched, is not."""
    core = MemberCore(CID, wait_ns=0)
    assert isinstance(core.on_message(encode_magnet_message(5, MAGNET, KEY), 0), Accepted)
    rebuilt = MAGNET + "&tr=x"
    assert isinstance(core.on_message(encode_magnet_message(5, rebuilt, KEY), 1), Accepted)
    assert core.due(1) == rebuilt
    assert isinstance(core.on_message(encode_magnet_message(5, rebuilt, KEY), 2), Ignored)
    core.done(rebuilt)
    # the link fetched last is not fetched again, even under a newer clock
    ev = core.on_message(encode_magnet_message(6, rebuilt, KEY), 3)
    assert isinstance(ev, Ignored) and "already fetched" in ev.reason
    assert core.due(10) is None
    ev = core.on_message(encode_magnet_message(4, MAGNET + "&tr=y", KEY), 4)
    assert isinstance(ev, Ignored) and "older" in ev.reason
    assert isinstance(core.on_message(encode_magnet_message(6, MAGNET, KEY), 5), Accepted)
    assert core.due(5) == MAGNET


def test_member_node_reads_the_special_channel_stream(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(1), 5)
    streams = LocalStreams(log)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    node.ingest_streams(streams, "community")
    node.build(START + WEEK)
    node.publish_magnet(streams, "special", clock=1)
    streams.push("special", encode_magnet_message(2, MAGNET, PrivateKey()))  # an impostor
    member = MemberNode(tmp_path / "m", MessageStore(), layout, CID, wait_ns=5 * NS)
    events = member.poll(streams, "special", now_ns=0)
    assert [type(e) for e in events] == [Accepted, Ignored]
    assert member.core.due(5 * NS) == node.magnet()
    assert member.poll(streams, "special", now_ns=NS) == []  # consumer index saved


def test_a_restarted_member_keeps_the_link_it_read_and_its_quiet_period(tmp_path):
    # The read position was saved in the member's store, the link it read was not: a member
    # restarted within the 20 s (or after its loop died on a failed fetch) went on past the
    # link and fetched nothing until the next week's. Both are saved in one transaction now.
    streams = LocalStreams(MemoryLog())
    streams.create_stream("special")
    streams.push("special", encode_magnet_message(5, MAGNET, KEY))
    path, layout = tmp_path / "member.sqlite", get_layout("spec")
    first = MemberNode(tmp_path / "m", MessageStore(path), layout, CID, wait_ns=20 * NS)
    first.poll(streams, "special", now_ns=0)
    first.store.close()
    second = MemberNode(tmp_path / "m", MessageStore(path), layout, CID, wait_ns=20 * NS)
    assert second.poll(streams, "special", now_ns=10 * NS) == []  # read already
    assert second.core.due(19 * NS) is None  # its quiet period still counts from the link
    assert second.core.due(20 * NS) == MAGNET
    # an older signed link replayed after the restart stays refused
    streams.push("special", encode_magnet_message(4, MAGNET[:-2] + "ef", KEY))
    [old] = second.poll(streams, "special", now_ns=21 * NS)
    assert isinstance(old, Ignored) and "older" in old.reason
    second.store.close()


def test_a_failed_fetch_is_tried_again_after_another_quiet_period(tmp_path, monkeypatch):
    from loglake.archives import member_node
    from loglake.archives.errors import TorrentTimeout

    def no_peer(*a, **k):
        raise TorrentTimeout("no peer gave the metadata in time")

    monkeypatch.setattr(member_node, "fetch_archives", no_peer)
    streams = LocalStreams(MemoryLog())
    streams.create_stream("special")
    streams.push("special", encode_magnet_message(5, MAGNET, KEY))
    member = MemberNode(tmp_path / "m", MessageStore(), get_layout("spec"), CID, wait_ns=20 * NS)
    member.poll(streams, "special", now_ns=0)
    with pytest.raises(TorrentTimeout):
        member.step(20 * NS)
    assert member.core.due(39 * NS) is None and member.core.due(40 * NS) == MAGNET


def test_hydrate_replaces_the_archive_time_range_only(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(1), 10)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    node.ingest_streams(LocalStreams(log), "community")
    entry = node.build(START + WEEK).new[0]
    member = MessageStore()
    mine_inside = layout.decode_record(record(layout, START + DAY + 7 * NS, b"not in archive"))
    mine_outside = layout.decode_record(record(layout, START + 2 * WEEK, b"later"))
    member.add([mine_inside, mine_outside])
    region = (tmp_path / "root" / CID / "data").read_bytes()[
        entry.offset : entry.offset + entry.size
    ]
    member.hydrate(entry, unpack(layout, entry, region))
    raws = {raw for _, _, raw in member.messages()}
    assert mine_inside.raw not in raws and mine_outside.raw in raws
    assert len(member.messages(START, START + WEEK)) == 10
    assert member.archive_ids() == {entry.archive_id}


def test_archive_with_a_message_outside_its_range_is_rejected(tmp_path):
    layout = get_layout("spec")
    from loglake.archives.layout import ArchiveMetadata

    meta = ArchiveMetadata(START, START + WEEK, ("t",), 1)
    enc = layout.encode_archive(meta, [record(layout, START + 2 * WEEK)], 0)
    with pytest.raises(CorruptArchive, match="outside"):
        unpack(layout, enc.entry, enc.data_bytes())


def test_bad_special_channel_messages_leave_the_member_store_unchanged(tmp_path):
    layout = get_layout("spec")
    log = MemoryLog()
    streams = LocalStreams(log)
    streams.create_stream("special")
    store = MessageStore()
    store.add([layout.decode_record(record(layout, START))])
    before = store.snapshot()
    from loglake.wire.pb import archives_statusgo_pb2 as sg_pb

    unsigned = sg_pb.ApplicationMetadataMessage(
        payload=sg_pb.CommunityMessageArchiveMagnetlink(
            clock=1, magnet_uri=MAGNET
        ).SerializeToString(),
        type=43,
    ).SerializeToString()
    streams.push_many(
        "special",
        [unsigned, encode_magnet_message(2, MAGNET, PrivateKey()), b"\x00\x01junk"],
    )
    member = MemberNode(tmp_path, store, layout, CID, wait_ns=0)
    events = member.poll(streams, "special", now_ns=0)
    assert [type(e) for e in events] == [Ignored, Ignored, Ignored]
    assert member.step(10 * NS) is None
    # messages and archive ids unchanged (only the channel read position moved on)
    assert store.snapshot()[:2] == before[:2]
    assert store.get_meta("channel_next_index:special") == "3"


def test_a_lost_store_does_not_re_export_archived_windows(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(2), 10)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    node.ingest_streams(LocalStreams(log), "community")
    assert len(node.build(START + WEEK).new) == 1
    fresh = ControlNode(tmp_path / "root", KEY, layout, MessageStore())  # store lost
    fresh.ingest_streams(LocalStreams(log), "community")
    new = fresh.build(START + 2 * WEEK).new
    assert [e.metadata.from_ns for e in new] == [START + WEEK]


def test_crash_after_index_before_store_update_does_not_re_export(tmp_path, layout):
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(2), 10)
    store_path = tmp_path / "s.sqlite"
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore(store_path))
    node.ingest_streams(LocalStreams(log), "community")
    node.build(START + WEEK)
    node.build(START + 2 * WEEK)
    # simulate the crash: the store still says the last build ended after week 1
    node.store.set_meta("last_archive_end_ns", START + WEEK)
    node.store.close()
    again = ControlNode(tmp_path / "root", KEY, layout, MessageStore(store_path))
    assert again.build(START + 2 * WEEK).new == []
    assert len(again.entries) == 2


def test_a_status_go_partial_build_at_a_sub_second_now_is_one_a_member_takes(tmp_path):
    # status-go's metadata holds whole seconds: a partial window ending at a wall-clock now
    # (12.5 s) held the message of second 12 with ``to`` = 12, which a member refuses (and
    # status-go selects [from, to) in whole seconds: that message is the next archive's).
    layout = get_layout("status-go")
    log = MemoryLog()
    boundary = START + 3 * DAY
    fill = [record(layout, START), record(layout, boundary)]
    log.create_stream("c")
    log.append_many("c", [Entry(r) for r in fill])
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    node.ingest_streams(LocalStreams(log), "c")
    assert len(node.build(boundary + NS // 2, partial=True).new) == 1
    folder = tmp_path / "root" / node.community_id
    [entry] = layout.decode_index((folder / "index").read_bytes())
    assert entry.metadata.to_ns == boundary
    region = (folder / "data").read_bytes()[entry.offset : entry.offset + entry.size]
    assert [m.timestamp_ns for m in unpack(layout, entry, region)] == [START]


def test_rows_of_a_build_whose_store_update_failed_are_flagged_and_pruned(tmp_path):
    # The files got the archives, the store's transaction failed (a full disk). A later build
    # moved the store's end past them, so a restart saw no store lagging the index: the rows
    # were never flagged archived, and the live stream never truncated past them.
    import errno

    layout = get_layout("spec")
    log = MemoryLog()
    fill_weeks(log, "c", layout, range(3), 5, size=50)
    streams = LocalStreams(log)
    path = tmp_path / "s.sqlite"
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore(path))
    node.ingest_streams(streams, "c")
    real, calls = node.store.record_archives, []

    def fails_once(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "disk full (injected)")
        return real(*a, **kw)

    node.store.record_archives = fails_once
    with pytest.raises(OSError):
        node.build(START + WEEK)
    node.build(START + 3 * WEEK)
    node.store.close()
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore(path))  # a restart
    node.ingest_streams(streams, "c")
    assert len(node.entries) == 3
    assert node.prune(START + 3 * WEEK + 40 * 7 * DAY).kept_from == 15


def test_a_store_that_outlived_its_archive_folder_is_refused(tmp_path):
    # The folder was lost, the store kept its flags: prune truncated the live stream past
    # messages no archive held any more (10 records, 0 archives). The node refuses to start
    # on such a store; a new one is filled from the stream (nothing flagged, nothing pruned).
    import shutil

    from loglake.archives.errors import ArchiveConfigError

    layout = get_layout("spec")
    log = MemoryLog()
    fill_weeks(log, "c", layout, range(2), 5, size=50)
    streams = LocalStreams(log)
    root, path = tmp_path / "root", tmp_path / "s.sqlite"
    node = ControlNode(root, KEY, layout, MessageStore(path))
    node.ingest_streams(streams, "c")
    assert len(node.build(START + 2 * WEEK).new) == 2
    node.store.close()
    shutil.rmtree(root / node.community_id)
    with pytest.raises(ArchiveConfigError, match="does not hold"):
        ControlNode(root, KEY, layout, MessageStore(path))
    node = ControlNode(root, KEY, layout, MessageStore(tmp_path / "new.sqlite"))
    node.ingest_streams(streams, "c")
    assert node.prune(START + 2 * WEEK + 60 * DAY).log_records == 0


def test_junk_on_the_special_channel_is_counted_not_kept(tmp_path):
    # anyone can post to the special channel: a member that follows it for good kept every
    # decision (50,000 junk messages held 11 MB), and the node counted them all every tick
    streams = LocalStreams(MemoryLog())
    streams.create_stream("special")
    junk = 3 * RECENT_EVENTS + 7
    streams.push_many("special", [b"\x00junk%d" % i for i in range(junk)])
    member = MemberNode(tmp_path, MessageStore(), get_layout("spec"), CID, wait_ns=0)
    while member.poll(streams, "special", now_ns=0):
        pass
    assert len(member.events) == RECENT_EVENTS
    assert member.ignored == junk
    assert all(isinstance(e, Ignored) for e in member.events)
    assert member.store.get_meta("channel_next_index:special") == str(junk)


def test_junk_on_the_community_stream_is_counted_not_kept(tmp_path):
    # anyone can post to the community stream: a control node that runs for good kept the
    # index and reason of every record it skipped
    streams = LocalStreams(MemoryLog())
    streams.create_stream("community")
    layout = get_layout("spec")
    junk = 3 * SKIPPED_KEPT + 7
    streams.push_many("community", [b"\x00junk%d" % i for i in range(junk)])
    streams.push_many("community", [record(layout, START)])
    control = ControlNode(tmp_path, KEY, layout, MessageStore())
    assert control.ingest_streams(streams, "community", batch=100) == 1
    assert len(control.skipped) == SKIPPED_KEPT
    assert control.skipped_count == junk and control.skipped[0][0] == 0


def test_prune_after_a_build_that_could_not_reload_keeps_the_windows_it_did_not_write(
    tmp_path, monkeypatch
):
    # A build's write fails (a full disk) and so does reloading the builder from the files:
    # the builder's end is past windows no file holds, until the next build reloads it.
    # Retention past every row of a built window must not go by that end: it truncated the
    # week's 7 records, live stream and store, and the build after the fault archived none.
    import errno

    from loglake.log import fs

    layout = get_layout("spec")
    log = MemoryLog()
    fill_weeks(log, "community", layout, range(1), 7)
    everything = _live(log)
    node = ControlNode(tmp_path / "root", KEY, layout, MessageStore())
    node.ingest_streams(LocalStreams(log), "community")

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "disk full (injected)")

    with monkeypatch.context() as m:
        m.setattr(fs, "write_all", full)
        m.setattr(node, "_load", full)
        with pytest.raises(OSError):
            node.build(START + WEEK)
    assert node.prune(START + 10 * WEEK).log_records == 0
    assert _live(log) == everything
    assert len(node.build(START + WEEK).new) == 1  # the fault cleared: the week is archived
    assert set(everything) <= _archived(node)
    assert node.prune(START + 10 * WEEK).log_records == 7
