"""A community's message store (control node and member alike): SQLite, one file per node.

Why not a loglake stream: the spec asks for two operations an append-only log does not have —
"Control nodes SHOULD remove those messages ... once they are older than 30 days and after they
have been turned into message archives" and members "MUST replace messages in their local
databases with the messages extracted from archives within the same time range". status-go keeps
a database for the same reason (protocol/communities/persistence.go: waku messages, archive ids,
last archive end date). The live community channel stays a loglake stream; the control node
ingests it here (tracking the next stream index in the same transaction), and each hydrate or
prune is one SQLite transaction, so a failure leaves the store exactly as it was.
"""

from __future__ import annotations

import contextlib
import gc
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loglake.archives.layout import DecodedMessage, IndexEntry

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
  ts_ns INTEGER NOT NULL, topic BLOB, raw BLOB NOT NULL, cap INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_ts ON messages (ts_ns);
CREATE TABLE IF NOT EXISTS archives (
  archive_id TEXT PRIMARY KEY, from_ns INTEGER, to_ns INTEGER, offset INTEGER, size INTEGER
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


@dataclass(frozen=True, slots=True)
class StoredArchive:
    archive_id: str
    from_ns: int
    to_ns: int
    offset: int
    size: int


class MessageStore:
    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if self.path != ":memory:":
            self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    # -- meta -------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: object) -> None:
        with self._tx():
            self._set_meta(key, value)

    def _set_meta(self, key: str, value: object) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))

    # -- messages ---------------------------------------------------------------------------
    def add(self, messages: Iterable[DecodedMessage], next_index: int | None = None) -> int:
        """Insert messages; with ``next_index``, record the stream position in the same
        transaction (ingest is then exactly-once across restarts)."""
        rows = [(m.timestamp_ns, m.topic, m.raw, m.cap_size) for m in messages]
        with self._tx():
            self.db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?)", rows)
            if next_index is not None:
                self._set_meta("ingest_next_index", next_index)
        return len(rows)

    def messages(self, from_ns: int | None = None, to_ns: int | None = None) -> list[tuple]:
        """``(ts_ns, topic, raw)`` rows in time order."""
        return [r[:3] for r in self._rows(from_ns, to_ns)]

    def decoded(self, from_ns: int | None = None, to_ns: int | None = None) -> list[DecodedMessage]:
        """Rows laid out as ``DecodedMessage`` ``(timestamp_ns, topic, raw, cap_size)``, without
        parsing the records again. Plain tuples (what the builder reads, by position): wrapping
        a million rows in named tuples cost a third of the control node's build."""
        return self._rows(from_ns, to_ns)  # type: ignore[return-value]

    def _rows(self, from_ns: int | None, to_ns: int | None) -> list[tuple]:
        with _gc_paused():
            return self._select(from_ns, to_ns)

    def _select(self, from_ns: int | None, to_ns: int | None) -> list[tuple]:
        q, args = "SELECT ts_ns, topic, raw, cap FROM messages", []
        conds = []
        if from_ns is not None:
            conds.append("ts_ns >= ?")
            args.append(from_ns)
        if to_ns is not None:
            conds.append("ts_ns < ?")
            args.append(to_ns)
        if conds:
            q += " WHERE " + " AND ".join(conds)
        return self.db.execute(q + " ORDER BY ts_ns, rowid", args).fetchall()

    def count(self) -> int:
        return self.db.execute("SELECT count(*) FROM messages").fetchone()[0]

    def oldest_ns(self) -> int | None:
        return self.db.execute("SELECT min(ts_ns) FROM messages").fetchone()[0]

    def snapshot(self) -> tuple:
        """Everything the store holds, for tests that assert "unchanged"."""
        return (
            tuple(self.db.execute("SELECT ts_ns, topic, raw FROM messages ORDER BY rowid")),
            tuple(self.db.execute("SELECT * FROM archives ORDER BY archive_id")),
            tuple(self.db.execute("SELECT * FROM meta ORDER BY key")),
        )

    # -- archives -----------------------------------------------------------------------------
    def archives(self) -> list[StoredArchive]:
        return [
            StoredArchive(*r)
            for r in self.db.execute("SELECT * FROM archives ORDER BY from_ns, offset")
        ]

    def archive_ids(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT archive_id FROM archives")}

    def record_archives(self, entries: Sequence[IndexEntry], end_ns: int | None) -> None:
        with self._tx():
            self._insert_archives(entries)
            if end_ns is not None:
                self._set_meta("last_archive_end_ns", end_ns)

    def _insert_archives(self, entries: Sequence[IndexEntry]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO archives VALUES (?, ?, ?, ?, ?)",
            [
                (e.archive_id, e.metadata.from_ns, e.metadata.to_ns, e.offset, e.size)
                for e in entries
            ],
        )

    def last_archive_end_ns(self) -> int | None:
        v = self.get_meta("last_archive_end_ns")
        return None if v is None else int(v)

    def hydrate(self, entry: IndexEntry, messages: Sequence[DecodedMessage]) -> int:
        """Spec "Storing historical messages": all messages within the archive's time range
        are replaced with the archive's, and its keccak id is remembered — atomically."""
        with self._tx():
            return self._hydrate(entry, messages)

    def _hydrate(self, entry: IndexEntry, messages: Sequence[DecodedMessage]) -> int:
        m = entry.metadata
        self.db.execute("DELETE FROM messages WHERE ts_ns >= ? AND ts_ns < ?", (m.from_ns, m.to_ns))
        self.db.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?)",
            [(x.timestamp_ns, x.topic, x.raw, x.cap_size) for x in messages],
        )
        self._insert_archives([entry])
        return len(messages)

    def hydrate_many(self, items: Sequence[tuple[IndexEntry, Sequence[DecodedMessage]]]) -> int:
        """``hydrate`` several archives in one transaction (all or nothing)."""
        n = 0
        with self._tx():
            for entry, messages in items:
                n += self._hydrate(entry, messages)
        return n

    def prune(self, before_ns: int) -> int:
        """Delete messages older than ``before_ns`` (the caller bounds it by what is archived)."""
        with self._tx():
            cur = self.db.execute("DELETE FROM messages WHERE ts_ns < ?", (before_ns,))
        return cur.rowcount

    def _tx(self):
        return _Tx(self.db)


@contextlib.contextmanager
def _gc_paused():
    """Bulk loads make a million tuples; each cyclic-GC pass would rescan all of them (3-5x
    the load's cost, measured). Tuples of ints/bytes cannot form cycles, so pause it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, *rest) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
