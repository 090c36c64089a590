"""Hydrating a member's store: every archived message is there exactly once, whatever the
order, subset or repetition of the archives hydrated, and after a crash in the middle.

status-go splits a window whose messages exceed 30 MB into several archives that share one
``[from, to)`` (manager_archive_file.go ``createHistoryArchiveTorrent``); the spec says a member
replaces the messages of the archive's time range with the archive's. Both rules hold only if
hydrating one archive of a window keeps what the window's other archives brought.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from coincurve import PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.archives.control import ControlNode
from loglake.archives.errors import CorruptArchive
from loglake.archives.layout import NS, get_layout
from loglake.archives.member import unpack
from loglake.archives.messages import ArchiveMetadata, DecodedMessage, IndexEntry
from loglake.archives.signing import community_id
from loglake.archives.store import MessageStore
from loglake.log import MemoryLog
from loglake.log.api import Entry
from loglake.streams.api import LocalStreams

from .helpers import DAY, START, WEEK, record, topic_for

KEY = PrivateKey(bytes.fromhex("77" * 32))
CID = community_id(KEY)


def _week_over_30_mb(tmp_path, n: int = 700, size: int = 50_000):
    """The reproduction: one status-go week of ``n`` messages of ``size`` bytes, built by the
    control node into several archives of one window. Returns (control, [(entry, messages)])."""
    layout = get_layout("status-go")
    log = MemoryLog()
    log.create_stream("community")
    log.append_many(
        "community",
        [Entry(record(layout, START + i * (WEEK // n), os.urandom(size))) for i in range(n)],
    )
    control = ControlNode(tmp_path / "control", KEY, layout, MessageStore())
    control.ingest_streams(LocalStreams(log), "community")
    control.build(START + WEEK)
    data = (tmp_path / "control" / CID / "data").read_bytes()
    items = [(e, unpack(layout, e, data[e.offset : e.offset + e.size])) for e in control.entries]
    return control, items


def test_a_week_split_into_several_archives_hydrates_every_message(tmp_path):
    control, items = _week_over_30_mb(tmp_path)
    windows = {(e.metadata.from_ns, e.metadata.to_ns) for e, _ in items}
    assert len(items) >= 2 and len(windows) == 1  # several archives, one [from, to)
    member = MessageStore(tmp_path / "member.sqlite")
    assert member.hydrate_many(items) == 700  # the report counts what is stored ...
    assert member.count() == 700  # ... and it is all there
    assert Counter(raw for *_, raw in member.messages()) == Counter(
        raw for *_, raw in control.store.messages()
    )
    # one archive at a time, in the other order, then all again: still each message once
    other = MessageStore(tmp_path / "other.sqlite")
    for entry, msgs in reversed(items):
        other.hydrate(entry, msgs)
    assert other.hydrate_many(items) == 700
    assert other.count() == 700
    assert member.hydrated_counts() == {e.archive_id: len(m) for e, m in items}
    member.close()
    other.close()


@pytest.mark.parametrize("name", ["spec", "status-go"])
def test_a_message_at_an_archives_end_is_refused_not_lost(name):
    # An archive is [from, to), as status-go selects its messages and as hydration replaces
    # them. One holding a message at exactly ``to`` (another implementation's, or a hostile
    # control node's) was accepted, and the next week's hydration deleted that message: the
    # report counted 2, the store held 1. It is a CorruptArchive now.
    layout = get_layout(name)
    weeks = [
        ArchiveMetadata(START + k * WEEK, START + (k + 1) * WEEK, (topic_for(layout),))
        for k in (0, 1)
    ]
    a = layout.encode_archive(weeks[0], [record(layout, START + WEEK)], 0)
    b = layout.encode_archive(weeks[1], [record(layout, START + WEEK + DAY)], a.size)
    entries = layout.decode_index(layout.encode_index([a.entry, b.entry]), a.size + b.size)
    with pytest.raises(CorruptArchive, match="outside its time range"):
        unpack(layout, entries[0], a.data_bytes())
    last = record(layout, START + WEEK - (NS if name == "status-go" else 1))  # still in
    a = layout.encode_archive(weeks[0], [last], 0)
    assert [m.raw for m in unpack(layout, a.entry, a.data_bytes())] == [last]


@pytest.mark.parametrize("name", ["spec", "status-go"])
def test_an_archive_holding_a_message_twice_is_hydrated_with_it_once(name):
    # An archive built elsewhere (an older loglake archived a message received twice; any
    # other builder may) holds the same WakuMessage twice. status-go's member imports an
    # archive's messages as received ones and skips a message whose id it holds already
    # (messenger_handler.go handleArchiveMessages -> handleRetrievedMessages, "Don't process
    # duplicates"): one row each. loglake stored both copies.
    layout = get_layout(name)
    md = ArchiveMetadata(START, START + WEEK, (topic_for(layout),))
    one, two = record(layout, START + DAY, b"one"), record(layout, START + 2 * DAY, b"two")
    a = layout.encode_archive(md, [one, two, one], 0)
    entry = layout.decode_index(layout.encode_index([a.entry]), a.size)[0]
    msgs = unpack(layout, entry, a.data_bytes())
    assert [m.raw for m in msgs] == [one, two, one]  # the archive holds it twice
    member = MessageStore()
    member.add([unpack(layout, entry, a.data_bytes())[0]])  # received live too, before
    assert member.hydrate(entry, msgs) == 2
    assert [raw for *_, raw in member.messages()] == [one, two]
    assert member.hydrate(entry, msgs) == 2  # again: still once
    assert member.count() == 2
    member.close()


def test_a_message_two_archives_of_a_window_hold_is_hydrated_once():
    # status-go splits a window into several archives; a builder that put a message into two
    # of them (its copies fell into two chunks) gives a member two copies across archives
    md = ArchiveMetadata(START, START + WEEK, (b"t",))
    a = IndexEntry("0x" + "0a" * 32, md, 0, 4096, 0, b"")
    b = IndexEntry("0x" + "0b" * 32, md, 4096, 4096, 0, b"")
    both = _msg(START + DAY, "both")
    items = [(a, [both, _msg(START + 2 * DAY, "a")]), (b, [_msg(START, "b"), both])]
    member = MessageStore()
    assert member.hydrate_many(items) == 3
    assert Counter(raw for *_, raw in member.messages()) == Counter([b"both", b"a", b"b"])
    for entry, msgs in reversed(items):  # again, one at a time, in the other order
        member.hydrate(entry, msgs)
    assert Counter(raw for *_, raw in member.messages()) == Counter([b"both", b"a", b"b"])
    member.close()


@pytest.mark.slow
def test_the_fetch_report_counts_the_messages_the_member_store_holds(tmp_path):
    """The reproduction as a user meets it: ``loglake archives fetch --json`` in a process of
    its own, from our libtorrent seeder, reports what its store then holds."""
    import json

    from loglake.archives.bt import Seeder

    control, items = _week_over_30_mb(tmp_path)
    seeder = Seeder()
    try:
        seeder.seed(control.torrent().metainfo(), tmp_path / "control")
        store_path = tmp_path / "member.sqlite"
        out = subprocess.run(
            [
                sys.executable, "-m", "loglake.archives.cli", "fetch",
                "--magnet", control.magnet((seeder.peer,)), "--root", str(tmp_path / "m"),
                "--store", str(store_path), "--layout", "status-go", "--community", CID,
                "--timeout", "15", "--json",
            ],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    finally:
        seeder.close()
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["missing"]) == len(items) >= 2
    member = MessageStore(store_path)
    assert report["hydrated_messages"] == member.count() == 700
    member.close()


# -- the property -----------------------------------------------------------------------------
# Three windows: week 0 split into three archives, week 1 into two, week 2 one archive; a
# member holds live messages in every week and after them.
SPLITS = {0: 3, 1: 2, 2: 1}


def _msg(ts: int, tag: str) -> DecodedMessage:
    raw = tag.encode()
    return DecodedMessage(ts, b"t", raw, len(raw))


def _archives() -> list[tuple[IndexEntry, list[DecodedMessage]]]:
    out = []
    for week, parts in SPLITS.items():
        lo = START + week * WEEK
        md = ArchiveMetadata(lo, lo + WEEK, (b"t",))
        for part in range(parts):
            msgs = [_msg(lo + (part * 10 + i) * DAY // 40, f"w{week}p{part}m{i}") for i in range(4)]
            aid = f"0x{week:02x}{part:02x}" + "00" * 30
            out.append((IndexEntry(aid, md, (week * 3 + part) * 4096, 4096, 0, b""), msgs))
    return out


ARCHIVES = _archives()
LIVE = [_msg(START + w * WEEK + 3 * DAY + 1, f"live{w}") for w in range(4)]


class _Crash(Exception):
    pass


class _CrashingMessages(list):
    """An archive's messages whose reading stops with an error part-way: the hydrate
    transaction it is in must leave no trace."""

    def __iter__(self):
        for i, m in enumerate(list.__iter__(self)):
            if i == 2:
                raise _Crash
            yield m


def _expected(hydrated: set[int]) -> Counter:
    """Live messages of weeks no archive was hydrated for, and each hydrated archive's."""
    weeks = {(ARCHIVES[i][0].metadata.from_ns - START) // WEEK for i in hydrated}
    want: Counter = Counter(m.raw for m in LIVE if (m.timestamp_ns - START) // WEEK not in weeks)
    for i in hydrated:
        want.update(m.raw for m in ARCHIVES[i][1])
    return want


steps = st.lists(
    st.tuples(
        st.lists(st.integers(0, len(ARCHIVES) - 1), min_size=1, max_size=4),  # one call's set
        st.booleans(),  # one transaction for the set (hydrate_many) or one per archive
        st.booleans(),  # the call crashes part-way
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_any_order_subset_repeat_or_crash_leaves_every_message_exactly_once(calls):
    store = MessageStore()
    store.add(LIVE)
    done: set[int] = set()
    for picks, together, crash in calls:
        items = [ARCHIVES[i] for i in picks]
        if crash:
            before = store.snapshot()
            bad = [(e, _CrashingMessages(m)) for e, m in items]
            with pytest.raises(_Crash):
                if together:
                    store.hydrate_many(bad)
                else:
                    store.hydrate(*bad[0])
            assert store.snapshot() == before  # a crashed call changed nothing
            continue
        if together:
            n = store.hydrate_many(items)
            assert n == sum(len(ARCHIVES[i][1]) for i in set(picks))
            done.update(picks)
        else:
            for i in picks:
                assert store.hydrate(*ARCHIVES[i]) == len(ARCHIVES[i][1])
                done.add(i)
        assert Counter(raw for *_, raw in store.messages()) == _expected(done)
        assert store.archive_ids() == {ARCHIVES[i][0].archive_id for i in done}
    # finally everything, once more, in reverse: the full history, each message once
    store.hydrate_many(list(reversed(ARCHIVES)))
    assert Counter(raw for *_, raw in store.messages()) == _expected(set(range(len(ARCHIVES))))
    store.close()


# -- a real crash: a member process killed in the middle of hydrating ----------------------------
_HYDRATOR = """
import pickle, sys
from loglake.archives.store import MessageStore
items = pickle.load(open(sys.argv[2], "rb"))
s = MessageStore(sys.argv[1])
print("ready", flush=True)
while True:  # hydrate again and again until killed: each kill lands somewhere in a transaction
    for entry, msgs in items:
        s.hydrate(entry, msgs)
    s.hydrate_many(items)
"""


@pytest.mark.slow
def test_a_member_killed_mid_hydrate_ends_with_every_message_once(tmp_path):
    import pickle

    items = [(e, [m._replace(raw=m.raw * 2000) for m in msgs]) for e, msgs in ARCHIVES]
    blob = tmp_path / "items.pickle"
    blob.write_bytes(pickle.dumps(items))
    path = tmp_path / "member.sqlite"
    first = MessageStore(path)
    first.add([m._replace(raw=m.raw * 2000) for m in LIVE])
    first.close()
    for delay in (0.05, 0.2, 0.35, 0.6):
        proc = subprocess.Popen(
            [sys.executable, "-c", _HYDRATOR, str(path), str(blob)], stdout=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        store = MessageStore(path)
        # whatever the kill interrupted: the archives recorded hold their messages once
        have = store.hydrated_counts()
        assert all(have[e.archive_id] == len(m) for e, m in items if e.archive_id in have)
        store.close()
    store = MessageStore(path)
    assert store.hydrate_many(items) == sum(len(m) for _, m in items)
    assert store.count() == sum(len(m) for _, m in items) + 1  # + the live message after
    assert Counter(raw for *_, raw in store.messages()) == Counter(
        [raw for _, m in items for raw in (x.raw for x in m)] + [LIVE[3].raw * 2000]
    )
    store.close()


_OLD_SCHEMA = """
CREATE TABLE messages (ts_ns INTEGER NOT NULL, topic BLOB, raw BLOB NOT NULL,
  cap INTEGER NOT NULL DEFAULT 0, idx INTEGER);
CREATE TABLE archived (rowid INTEGER PRIMARY KEY);
CREATE INDEX messages_ts ON messages (ts_ns);
CREATE TABLE archives (archive_id TEXT PRIMARY KEY, from_ns INTEGER, to_ns INTEGER,
  offset INTEGER, size INTEGER);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
"""


def _old_store(path, items, rows) -> None:
    """A store as loglake wrote it before rows kept their archive: ``items`` recorded as
    hydrated, ``rows`` the messages it holds."""
    import apsw

    db = apsw.Connection(str(path))
    db.execute(_OLD_SCHEMA)
    for e, _ in items:
        m = e.metadata
        db.execute(
            "INSERT INTO archives VALUES (?, ?, ?, ?, ?)",
            (e.archive_id, m.from_ns, m.to_ns, e.offset, e.size),
        )
    for r in rows:
        db.execute(
            "INSERT INTO messages (ts_ns, topic, raw, cap) VALUES (?, ?, ?, ?)",
            (r.timestamp_ns, r.topic, r.raw, r.cap_size),
        )
    db.close()


def test_a_store_hit_by_the_old_hydrate_fetches_the_lost_archives_again(tmp_path):
    """Week 0's three archives were hydrated by the old code, which kept only the last one's
    messages; week 2's one archive is whole. On open, week 0's archives are forgotten (the next
    fetch finds them missing), week 2's rows are attributed to its archive; hydrating week 0
    again then leaves every message exactly once."""
    week0, week2 = ARCHIVES[:3], ARCHIVES[5:6]
    path = tmp_path / "old.sqlite"
    _old_store(path, week0 + week2, week0[2][1] + week2[0][1])
    store = MessageStore(path)
    assert store.archive_ids() == {week2[0][0].archive_id}
    assert store.hydrated_counts() == {week2[0][0].archive_id: 4}
    assert store.count() == 8  # nothing deleted until the archives come again
    assert store.hydrate_many(week0) == 12
    want = Counter(m.raw for _, msgs in week0 + week2 for m in msgs)
    assert Counter(raw for *_, raw in store.messages()) == want
    store.close()
    reopened = MessageStore(path)  # migrated once
    assert reopened.archive_ids() == {e.archive_id for e, _ in week0 + week2}
    reopened.close()


def test_a_control_nodes_old_store_is_left_as_it_was(tmp_path):
    """A control node's store (rows with their stream index) records archives of its own
    builds, several per window for status-go: none is forgotten."""
    import apsw

    path = tmp_path / "control.sqlite"
    _old_store(path, ARCHIVES[:3], [])
    db = apsw.Connection(str(path))
    for i, m in enumerate(LIVE):
        db.execute(
            "INSERT INTO messages (ts_ns, topic, raw, cap, idx) VALUES (?, ?, ?, ?, ?)",
            (m.timestamp_ns, m.topic, m.raw, m.cap_size, i),
        )
    db.close()
    store = MessageStore(path)
    assert store.archive_ids() == {e.archive_id for e, _ in ARCHIVES[:3]}
    assert store.hydrated_counts() == {} and store.count() == len(LIVE)
    store.close()
