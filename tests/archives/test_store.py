"""The archives working store's own rules (``archives/store.py``), beyond what the nodes' tests
reach: flags follow the rows they flag, and deleted messages leave no bytes behind."""

from __future__ import annotations

from loglake.archives.messages import ArchiveMetadata, DecodedMessage, IndexEntry
from loglake.archives.store import MessageStore
from tests.archives.helpers import START, WEEK


def _msg(t: int, raw: bytes) -> DecodedMessage:
    return DecodedMessage(t, b"topic", raw, len(raw))


def test_hydrating_a_window_forgets_the_flags_of_the_rows_it_replaces(tmp_path):
    store = MessageStore(tmp_path / "store.sqlite")
    store.add([_msg(START + 1, b"old-1"), _msg(START + 2, b"old-2")])
    store.flag_archived([rowid for rowid, _ in store.rows_before(START + WEEK)])
    assert store.rows_before(START + WEEK) == []  # both flagged

    md = ArchiveMetadata(START, START + WEEK, [b"topic"])
    entry = IndexEntry("0x" + "ab" * 32, md, 0, 4096, 0, b"")
    store.hydrate(entry, [_msg(START + 3, b"from-the-archive")])
    store.add([_msg(START + WEEK + 1, b"new")])  # may reuse a freed rowid

    # nothing a member stored since looks archived because of a flag left by a replaced row
    assert [raw for _, raw in store.rows_before(START + 2 * WEEK)] == [
        b"from-the-archive",
        b"new",
    ]
    store.close()


def test_deleted_messages_leave_no_bytes_in_the_file(tmp_path):
    path = tmp_path / "store.sqlite"
    store = MessageStore(path)
    secret = b"SECRET-" * 200
    store.add([_msg(START + 1, secret)])
    assert store.prune(START + WEEK) == 1
    store.close()  # checkpoints the WAL into the database file
    assert secret[:64] not in path.read_bytes()


def test_a_record_stored_already_is_not_stored_again():
    """One row per message, as status-go's ``waku_messages`` (its hash the primary key): a
    copy in the same batch or a later one is not stored; another record of the same time is;
    the first copy keeps its place and stream index."""
    store = MessageStore()
    a, b = _msg(START + 1, b"a"), _msg(START + 1, b"b")
    assert store.add([a, b, a], indexes=[0, 1, 2]) == 2
    assert store.add([_msg(START, b"older"), a], indexes=[3, 4]) == 1
    assert store.add([_msg(START + 2, b"newer")], indexes=[5]) == 1
    assert store.messages() == [
        (START, b"topic", b"older"),
        (START + 1, b"topic", b"a"),
        (START + 1, b"topic", b"b"),
        (START + 2, b"topic", b"newer"),
    ]
    rows = store.db.execute("SELECT raw, idx FROM messages ORDER BY idx").fetchall()
    assert rows == [(b"a", 0), (b"b", 1), (b"older", 3), (b"newer", 5)]
    store.close()


def _vm_steps(store: MessageStore, work) -> int:
    """SQLite virtual-machine steps ``work()`` took: the store's work, counted, not timed (a
    shared CI machine's clock says little about a 2x)."""
    steps = 0

    def count() -> bool:
        nonlocal steps
        steps += 1
        return False  # go on

    store.db.set_progress_handler(count, 100)
    try:
        work()
    finally:
        store.db.set_progress_handler(None)
    return steps * 100


def test_distinct_records_of_one_time_cost_the_same_a_record_whatever_their_number():
    """Found from outside: a copy was looked for among the rows of its time by comparing the
    records, so every insert at a time the store held scanned every row of it: a control node
    ingesting 20,000 distinct records of one time took 22.6 s, 30,000 took 56.7 s (anyone
    posting to the community stream picks the times); a member hydrating an archive of 20,000,
    17.7 s. Four times the records now cost about four times the work, not sixteen."""

    def ingest(n: int) -> int:  # as ControlNode.ingest_streams: batches, times held already
        store = MessageStore()
        msgs = [_msg(START, i.to_bytes(4, "big") * 8) for i in range(n)]
        return _vm_steps(store, lambda: [store.add(msgs[i : i + 500]) for i in range(0, n, 500)])

    def hydrate(n: int) -> int:  # as a member: one archive, one batch
        store = MessageStore()
        entry = IndexEntry("0x" + "cd" * 32, ArchiveMetadata(START, START + WEEK, ()), 0, 1, 0, b"")
        msgs = [_msg(START, i.to_bytes(4, "big") * 8) for i in range(n)]
        return _vm_steps(store, lambda: store.hydrate(entry, msgs))

    for work in (ingest, hydrate):
        small, large = work(1_000), work(4_000)
        assert large < 6 * small, (work.__name__, small, large)


def test_a_copy_of_a_record_stored_alone_at_its_time_is_not_stored_again():
    # a record alone at its time is stored without a digest (no copy can be looked for yet):
    # a copy or another record of that time later still finds it
    store = MessageStore()
    a, b = _msg(START + 1, b"a"), _msg(START + 1, b"b")
    assert store.add([a]) == 1
    assert store.add([a]) == 0
    assert store.add([b, a]) == 1
    assert store.add([a, b, _msg(START + 1, b"c")]) == 1
    entry = IndexEntry("0x" + "ef" * 32, ArchiveMetadata(START + 2, START + 3, ()), 0, 1, 0, b"")
    store.hydrate(entry, [_msg(START + 2, b"x")])
    store.hydrate(entry, [_msg(START + 2, b"x"), _msg(START + 2, b"x"), _msg(START + 2, b"y")])
    assert [raw for *_, raw in store.messages()] == [b"a", b"b", b"c", b"x", b"y"]
    store.close()


_STORE_BEFORE_DIGESTS = """
CREATE TABLE messages (ts_ns INTEGER NOT NULL, topic BLOB, raw BLOB NOT NULL,
  cap INTEGER NOT NULL DEFAULT 0, idx INTEGER, origin INTEGER);
CREATE TABLE archived (rowid INTEGER PRIMARY KEY);
CREATE INDEX messages_ts ON messages (ts_ns);
CREATE TABLE archives (archive_id TEXT PRIMARY KEY, from_ns INTEGER, to_ns INTEGER,
  offset INTEGER, size INTEGER);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
"""


def test_a_store_written_before_digests_still_finds_the_copies_it_holds(tmp_path):
    """A store as loglake wrote it before copies were found by digest opens, gets its digests
    once, and a copy of any row it held (alone at its time or not) is not stored again."""
    import apsw

    path = tmp_path / "old.sqlite"
    db = apsw.Connection(str(path))
    db.execute(_STORE_BEFORE_DIGESTS)
    old = [(START + 1, b"alone"), (START + 2, b"p"), (START + 2, b"q"), (START + 2, b"r")]
    for i, (t, raw) in enumerate(old):
        db.execute(
            "INSERT INTO messages (ts_ns, topic, raw, cap, idx) VALUES (?, ?, ?, ?, ?)",
            (t, b"topic", raw, len(raw), i),
        )
    db.execute("INSERT INTO meta VALUES ('ingest_next_index', '4')")
    db.close()
    store = MessageStore(path)
    assert store.get_meta("ingest_next_index") == "4" and store.count() == 4
    assert store.add([_msg(t, raw) for t, raw in old]) == 0
    assert store.add([_msg(START + 2, b"s"), _msg(START + 1, b"alone")]) == 1
    store.close()
    store = MessageStore(path)  # migrated once: opens as a current store
    assert store.add([_msg(START + 2, b"s")]) == 0
    assert [raw for *_, raw in store.messages()] == [b"alone", b"p", b"q", b"r", b"s"]
    store.close()
