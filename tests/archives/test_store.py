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
