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
