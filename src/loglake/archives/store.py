"""A community's message store (control node and member alike): SQLite, one file per node.

Control node: a *working index*, not the source of truth. The community's messages live in a
loglake stream; the control node copies them here (with their stream index, tracking the next
index in the same transaction) because building a 7-day window needs "messages with
``from <= timestamp < to``, in time order", which the stream (ordered by arrival) cannot answer.
When a build covers a window, the rowids it exported go into the ``archived`` table in the
same transaction that records the archives (a table of integers, not a column: flagging a
column rewrote every message row, 2.2 s of a 4.6 s build of a million messages, measured);
``removable_before`` then gives the longest prefix of the stream whose records are all
archived and older than the cut-off, which the control node truncates from the live log
(spec "Storing live messages": remove messages "once they are older than 30 days and after they
have been turned into message archives"). Everything here can be
rebuilt from the stream and the archives (``ControlNode`` re-ingests the stream into an empty
store and re-flags the rows found in its local archives).

Member: its local database, which "MUST replace messages ... with the messages extracted from
archives within the same time range" (hydrate), something an append-only log cannot do.
status-go keeps a database for the same reasons (protocol/communities/persistence.go: waku
messages, archive ids, last archive end date). Each hydrate or prune is one SQLite transaction,
so a failure leaves the store exactly as it was.

Why ``apsw`` and not the standard library's ``sqlite3``: the same SQLite engine and file format,
but ``apsw`` lets Python implement a VFS (SQLite's file layer), so a test can open this store
over a failing, power-losing disk (``tests/faults/sqlite_vfs.py``: the seeded failing-file
layer and simulated disk every other durable part is tested on); ``sqlite3`` cannot take a
Python VFS. ``vfs=None`` is SQLite's default VFS, as before. Transactions are explicit
(``BEGIN IMMEDIATE``, apsw does not open them implicitly), the journal is a WAL, and a busy
database is waited on for 5 s (``sqlite3``'s default, kept).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from types import TracebackType
from typing import Any

import apsw

from loglake.archives.errors import CorruptStore
from loglake.archives.layout import DecodedMessage, IndexEntry
from loglake.archives.messages import MessageRow
from loglake.structured_logging import log_event

ArchiveMessages = Sequence[DecodedMessage] | Iterator[Sequence[DecodedMessage]]
"""An archive's messages for ``hydrate``/``hydrate_many``: all of them, or an iterator of
chunks (``member.unpack_chunks``) stored one at a time."""

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
  ts_ns INTEGER NOT NULL, topic BLOB, raw BLOB NOT NULL, cap INTEGER NOT NULL DEFAULT 0,
  idx INTEGER, origin INTEGER, dig BLOB
);  -- dig: _digest(raw) of a row whose time another row has (_insert_once), else NULL.
-- origin: the rowid in archives of the archive a hydrated row came from (NULL: a live
-- message); an integer, not the 66-character archive id (+19% on 300-byte messages, measured).
-- Stable: archives rows are upserted, never replaced, and the store is never VACUUMed
CREATE TABLE IF NOT EXISTS archived (rowid INTEGER PRIMARY KEY);  -- rowids of messages (never
-- VACUUMed, so they stay stable)
CREATE INDEX IF NOT EXISTS messages_ts ON messages (ts_ns);
CREATE TABLE IF NOT EXISTS archives (
  archive_id TEXT PRIMARY KEY, from_ns INTEGER, to_ns INTEGER, offset INTEGER, size INTEGER
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""
_DIGEST_INDEX = (
    "CREATE INDEX IF NOT EXISTS messages_dig ON messages (ts_ns, dig) WHERE dig IS NOT NULL"
)
"""Where a copy of a record is looked for (``_insert_once``). Made after the migration that
adds ``dig`` to an older store. Partial: a row gets a digest only once its time is shared, so
a stream of distinct times (the usual one) computes and indexes none (digest and a full index
cost +60% on the store's inserts, measured); not ``(ts_ns, dig)`` in place of
``messages_ts``, which gives the builder's ``ORDER BY ts_ns, rowid`` without a sort."""
_DIGEST_FIRST = (
    "UPDATE messages SET dig = loglake_digest(raw) WHERE dig IS NULL AND rowid ="
    " (SELECT rowid FROM messages INDEXED BY messages_ts WHERE ts_ns = ? ORDER BY rowid LIMIT 1)"
)
"""Give a time's first row the digest it was stored without. Only that row can lack one: a row
is stored without a digest only when no other row has its time (``_insert_once``'s plain
insert), and every later row gets a greater rowid (SQLite's: one more than the largest; rows
here never name their rowid); a store older than ``dig`` is migrated to the same state."""


def _digest(raw: bytes) -> bytes:
    """The key a copy of a record is found by, with its time. Found from outside: a copy was
    looked for by time and ``raw`` with only the time indexed, so each insert at a time the
    store held compared its record with every row of that time: 20,000 distinct records of one
    time (anyone posting to the community stream picks the times) took 22.6 s to ingest,
    30,000 took 56.7 s; hydrating an archive of 20,000, 17.7 s. 8 bytes of BLAKE2b: the raw
    bytes are still compared, so a collision costs one comparison, and many are not made on
    purpose (a checksum such as CRC-32 would let a poster make thousands that collide)."""
    return blake2b(raw, digest_size=8).digest()


def _sql_digest(*args: Any) -> bytes:
    """``_digest`` as SQLite calls it (``loglake_digest(raw)``): the migration of an older
    store and the first row of a time that becomes shared (``_DIGEST_FIRST``)."""
    return _digest(args[0])


@dataclass(frozen=True, slots=True)
class StoredArchive:
    archive_id: str
    from_ns: int
    to_ns: int
    offset: int
    size: int


class MessageStore:
    def __init__(self, path: str | Path = ":memory:", vfs: str | None = None) -> None:
        """``vfs``: the name of a registered SQLite VFS (None: SQLite's default)."""
        self.path = str(path)
        try:
            self.db = apsw.Connection(self.path, vfs=vfs)
        except apsw.Error as e:
            raise _disk_error(e, self.path) from e
        try:
            self.db.set_busy_timeout(_BUSY_TIMEOUT_MS)
            self.db.set_wal_hook(_checkpoint_after_commit)
            # pruned messages leave no bytes in free pages: the default of Debian's SQLite,
            # which the store used before apsw (whose SQLite defaults to off)
            _value(self.db, "PRAGMA secure_delete=ON")
            if self.path != ":memory:":
                # read to the end: the switch is written when the statement completes, and
                # an error then is the caller's to see (unread, apsw can only report it as
                # "unraisable" when the statement is reset)
                _value(self.db, "PRAGMA journal_mode=WAL")
            self.db.create_scalar_function("loglake_digest", _sql_digest, 1, deterministic=True)
            self.db.execute(_SCHEMA)
            cols = {r[1] for r in self.db.execute("PRAGMA table_info(messages)")}
            if "idx" not in cols:  # a store written before the stream index was kept
                self.db.execute("ALTER TABLE messages ADD COLUMN idx INTEGER")
            if "origin" not in cols:  # a store written before hydrated rows kept their archive
                # one transaction: a crash leaves the old store, migrated again next time
                # (closing the connection on an error below rolls it back)
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute("ALTER TABLE messages ADD COLUMN origin INTEGER")
                self._attribute_old_rows()
                self.db.execute("COMMIT")
            if "dig" not in cols:  # a store written before copies were found by digest
                # one transaction, as above: the column, the digest of every row whose time
                # another row has (the state _insert_once keeps), and the index
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute("ALTER TABLE messages ADD COLUMN dig BLOB")
                self.db.execute(
                    "UPDATE messages SET dig = loglake_digest(raw) WHERE ts_ns IN"
                    " (SELECT ts_ns FROM messages GROUP BY ts_ns HAVING count(*) > 1)"
                )
                self.db.execute(_DIGEST_INDEX)
                self.db.execute("COMMIT")
            self.db.execute(_DIGEST_INDEX)
        except apsw.Error as e:
            with contextlib.suppress(apsw.Error):
                self.db.close()
            if isinstance(e, (apsw.NotADBError, apsw.CorruptError)):
                # a file given as --store that is something else, or a damaged one: one line,
                # not apsw's traceback
                raise CorruptStore(f"{self.path} is not a message store: SQLite: {e}") from e
            raise _disk_error(e, self.path) from e

    def _attribute_old_rows(self) -> None:
        """A member store written before rows kept their archive: give each window's rows
        the window's archive when it has one, and forget the archives of a window that has
        several — the earlier hydrate kept only the last one's messages, so the next fetch
        finds them missing and hydrates them all (the rows stay until then, and are replaced
        by it). A control node's store (rows with a stream index) holds no hydrated rows."""
        if (
            _value(self.db, "SELECT 1 FROM messages WHERE idx IS NOT NULL LIMIT 1")
            or _value(self.db, "SELECT 1 FROM meta WHERE key = 'ingest_next_index'")
            or not _value(self.db, "SELECT 1 FROM archives LIMIT 1")
        ):
            return
        windows = _all(
            self.db.execute(
                "SELECT from_ns, to_ns, count(*), min(rowid) FROM archives GROUP BY from_ns, to_ns"
            )
        )
        forgotten = 0
        for from_ns, to_ns, n, rowid in windows:
            if n == 1:
                self.db.execute(
                    "UPDATE messages SET origin = ? WHERE ts_ns >= ? AND ts_ns < ?",
                    (rowid, from_ns, to_ns),
                )
            else:
                self.db.execute(
                    "DELETE FROM archives WHERE from_ns = ? AND to_ns = ?", (from_ns, to_ns)
                )
                forgotten += n
        if forgotten:
            log_event(
                logger,
                logging.WARNING,
                "archives to fetch again: an earlier hydrate kept one of several archives of"
                " a window",
                archives=forgotten,
                store=self.path,
            )

    def close(self) -> None:
        """SQLite ignores an I/O error of the checkpoint it runs when the last connection
        closes (the committed transactions stay in the WAL; the next open replays it); apsw
        raises one that a Python VFS reported, after closing. Ignored here too."""
        with contextlib.suppress(apsw.FullError, apsw.IOError):
            self.db.close()

    # -- meta -------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self._reading():
            return _value(self.db, "SELECT value FROM meta WHERE key=?", (key,))

    def set_meta(self, key: str, value: object) -> None:
        with self._tx():
            self._set_meta(key, value)

    def set_metas(self, items: Mapping[str, object]) -> None:
        """Several meta values in one transaction (all or none)."""
        with self._tx():
            for key, value in items.items():
                self._set_meta(key, value)

    def _set_meta(self, key: str, value: object) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))

    # -- messages ---------------------------------------------------------------------------
    def add(
        self,
        messages: Iterable[DecodedMessage],
        next_index: int | None = None,
        indexes: Sequence[int] | None = None,
    ) -> int:
        """Insert messages, each once: a record the store already holds (a Waku message
        received twice) is not stored again; with ``next_index``, record the stream position
        in the same transaction (ingest is then exactly-once across restarts); ``indexes``:
        each message's stream index (control node). Returns how many rows were stored.

        Why once: status-go keys the control node's message table on the message hash
        (protocol/communities/persistence.go ``SaveWakuMessages``/``SaveWakuMessage``:
        ``INSERT OR REPLACE INTO waku_messages``, whose ``hash`` a later migration made
        ``TEXT PRIMARY KEY``), so a message received twice is archived once; a plain
        INSERT archived it twice and members hydrated it twice. The hash is a function of the
        record (status-go's ``WakuMessage`` carries it; 14/WAKU2-MESSAGE's deterministic hash
        covers payload, content topic, meta and timestamp), so a copy is the same bytes: the
        key here is the record itself, found through the time index (a copy has the same
        time). Not the ``hash`` field: a record could name another's hash and erase it.
        Which copy stays: the first. status-go's REPLACE keeps the later row, but the copies
        are the same bytes, and status-go reads a window without ORDER BY (the place of
        equal-time messages is its query plan's, which loglake does not follow: it orders by
        time, then arrival); the first keeps an archived row, its flag and its stream index
        when a copy is delivered again after its window was archived (a store node's
        history re-sent after a restart). ``pipeline/jobs/archives_build.py``
        (``_copies``) drops the same copies."""
        msgs = list(messages)
        idxs = indexes if indexes is not None else [None] * len(msgs)
        rows = [
            (m.timestamp_ns, m.topic, m.raw, m.cap_size, i) for m, i in zip(msgs, idxs, strict=True)
        ]
        with self._tx():
            stored = self._insert_once(rows)
            if next_index is not None:
                self._set_meta("ingest_next_index", next_index)
        return stored

    def _insert_once(self, rows: list[tuple], last: str = "idx") -> int:
        """Insert ``(ts_ns, topic, raw, cap, <last>)`` rows but the copies (``add``; ``_hydrate``
        with ``last="origin"``); returns how many were inserted. Only a row whose time the
        store or the batch already holds is looked for (one join of the batch's times with the
        time index, skipped when the store holds no row between the batch's first and last
        time: a live stream's batch is mostly newer than every row, and a hydrated window was
        emptied but for its other archives' rows): checked row by row, every insert cost 1.6x
        (measured, 10,000-row batches). It is looked for by its digest (``messages_dig``),
        which the rows of such a time get, and the first row stored at it (``dig`` NULL) gets
        then: O(log n) a row, however many rows its time has."""
        if not rows:
            return 0
        times = [r[0] for r in rows]
        seen: set[int] = set()
        if _value(
            self.db,
            "SELECT 1 FROM messages WHERE ts_ns BETWEEN ? AND ? LIMIT 1",
            (min(times), max(times)),
        ):
            # each distinct time once, one row of it looked for: a join visited (its rows
            # held) x (its rows in the batch), quadratic for thousands of rows of one time
            held = [
                (t,)
                for (t,) in self.db.execute(
                    "SELECT j.value FROM json_each(?) j WHERE EXISTS"
                    " (SELECT 1 FROM messages INDEXED BY messages_ts WHERE ts_ns = j.value)",
                    (json.dumps(list(set(times))),),
                )
            ]
            self.db.executemany(_DIGEST_FIRST, held)
            seen.update(t for (t,) in held)
        if len(set(times)) < len(times):  # equal times within the batch
            seen.update(t for t, n in Counter(times).items() if n > 1)
        before = self.db.total_changes()
        insert = f"INSERT INTO messages (ts_ns, topic, raw, cap, {last}) VALUES (?, ?, ?, ?, ?)"
        if not seen:
            self.db.executemany(insert, rows)
        else:
            # a time's rows all go in the second statement, in their order: the store's order
            # (time, then rowid) is the one a plain insert gives
            self.db.executemany(insert, (r for r in rows if r[0] not in seen))
            self.db.executemany(
                f"INSERT INTO messages (ts_ns, topic, raw, cap, {last}, dig)"
                " SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE NOT EXISTS (SELECT 1 FROM messages"
                " INDEXED BY messages_dig WHERE ts_ns = ?1 AND dig = ?6 AND raw = ?3)",
                ((*r, _digest(r[2])) for r in rows if r[0] in seen),  # not a list: memory
            )
        return int(self.db.total_changes() - before)

    def messages(self, from_ns: int | None = None, to_ns: int | None = None) -> list[tuple]:
        """``(ts_ns, topic, raw)`` rows in time order."""
        return [r[:3] for r in self._rows(from_ns, to_ns)]

    def decoded(self, from_ns: int | None = None, to_ns: int | None = None) -> list[MessageRow]:
        """Rows laid out as ``DecodedMessage`` ``(timestamp_ns, topic, raw, cap_size)``, without
        parsing the records again. Plain tuples (what the builder reads, by position): wrapping
        a million rows in named tuples cost a third of the control node's build."""
        return self._rows(from_ns, to_ns)

    def _rows(self, from_ns: int | None, to_ns: int | None) -> list[MessageRow]:
        with _gc_paused(), self._reading():
            return self._select(from_ns, to_ns)

    def _select(self, from_ns: int | None, to_ns: int | None) -> list[MessageRow]:
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
        return _all(self.db.execute(q + " ORDER BY ts_ns, rowid", args))

    def count(self) -> int:
        with self._reading():
            return _value(self.db, "SELECT count(*) FROM messages")

    def oldest_ns(self) -> int | None:
        with self._reading():
            return _value(self.db, "SELECT min(ts_ns) FROM messages")

    def snapshot(self) -> tuple:
        """Everything the store holds, for tests that assert "unchanged"."""
        return (
            tuple(self.db.execute("SELECT ts_ns, topic, raw FROM messages ORDER BY rowid")),
            tuple(self.db.execute("SELECT * FROM archives ORDER BY archive_id")),
            tuple(self.db.execute("SELECT * FROM meta ORDER BY key")),
        )

    # -- archives -----------------------------------------------------------------------------
    def archives(self) -> list[StoredArchive]:
        with self._reading():
            rows = _all(self.db.execute("SELECT * FROM archives ORDER BY from_ns, offset"))
        return [StoredArchive(*r) for r in rows]

    def archive_ids(self) -> set[str]:
        with self._reading():
            return {r[0] for r in _all(self.db.execute("SELECT archive_id FROM archives"))}

    def record_archives(
        self,
        entries: Sequence[IndexEntry],
        end_ns: int | None,
        exported: tuple[int, int] | None = None,
        topics: Sequence[bytes | str] | None = None,
        max_cap: int | None = None,
    ) -> int:
        """Record new archives and the end of the last window; with ``exported = (from, to)``,
        flag as archived the rows a build of that span exported (same transaction): those in
        the span, on ``topics`` (None: all), with ``cap <= max_cap`` (status-go drops bigger
        ones; None: no cap). Returns how many rows were flagged."""
        flagged = 0
        with self._tx():
            self._insert_archives(entries)
            if end_ns is not None:
                self._set_meta("last_archive_end_ns", end_ns)
            if exported is not None:
                cond, args = _exportable(topics, max_cap)
                self.db.execute(
                    "INSERT OR IGNORE INTO archived SELECT rowid FROM messages"
                    f" WHERE ts_ns >= ? AND ts_ns < ?{cond}",
                    [*exported, *args],
                )
                flagged = self.db.changes()
        return flagged

    def last_rowid(self) -> int:
        """The newest row's rowid (0: none): a row inserted later has a greater one."""
        with self._reading():
            return int(_value(self.db, "SELECT max(rowid) FROM messages") or 0)

    def late_rows(
        self,
        after_rowid: int,
        end_ns: int,
        topics: Sequence[bytes | str] | None = None,
        max_cap: int | None = None,
        limit: int = 100,
    ) -> tuple[int, list[tuple[int, int]]]:
        """Rows inserted after ``after_rowid`` that a build would have exported (``topics``,
        ``max_cap`` as ``record_archives``) but are dated before ``end_ns``, the end of the
        last archived window, and not flagged archived: they arrived after their window was
        archived, and no build will export them. Returns how many, and the first ``limit``
        as ``(stream index, ts_ns)`` in stream order."""
        cond, args = _exportable(topics, max_cap)
        where = (
            f"rowid > ? AND ts_ns < ?{cond} AND idx IS NOT NULL"
            " AND rowid NOT IN (SELECT rowid FROM archived)"
        )
        with self._reading():
            count = _value(
                self.db,
                f"SELECT count(*) FROM messages WHERE {where}",
                (after_rowid, end_ns, *args),
            )
            first = _all(
                self.db.execute(
                    f"SELECT idx, ts_ns FROM messages WHERE {where} ORDER BY idx LIMIT ?",
                    (after_rowid, end_ns, *args, limit),
                )
            )
        return int(count), first

    def flag_archived(self, rowids: Sequence[int]) -> None:
        with self._tx():
            self.db.executemany("INSERT OR IGNORE INTO archived VALUES (?)", [(r,) for r in rowids])

    def rows_before(self, to_ns: int) -> list[tuple[int, bytes]]:
        """``(rowid, raw)`` of unflagged rows older than ``to_ns`` (re-flagging after a rebuild)."""
        with self._reading():
            return _all(
                self.db.execute(
                    "SELECT rowid, raw FROM messages WHERE ts_ns < ?"
                    " AND rowid NOT IN (SELECT rowid FROM archived)",
                    (to_ns,),
                )
            )

    def removable_before(self, cutoff_ns: int, ingested: int, archived_only: bool = True) -> int:
        """The stream index below which every ingested record is older than ``cutoff_ns``
        (and, ``archived_only``, archived): the first row that is not (or ``ingested``, the
        next index to ingest, when every row is). Records that are not the layout's
        WakuMessage were never stored and hold nothing back; rows already pruned were
        removable."""
        keep = "ts_ns < ?"
        if archived_only:
            keep += " AND rowid IN (SELECT rowid FROM archived)"
        with self._reading():
            first = _value(
                self.db,
                f"SELECT min(idx) FROM messages WHERE idx IS NOT NULL AND idx < ? AND NOT ({keep})",
                (ingested, cutoff_ns),
            )
        return ingested if first is None else first

    def _insert_archives(self, entries: Sequence[IndexEntry]) -> None:
        """Upsert, not replace: a replaced row gets a new rowid, and ``messages.origin``
        refers to an archive by its rowid."""
        self.db.executemany(
            "INSERT INTO archives VALUES (?, ?, ?, ?, ?) ON CONFLICT (archive_id) DO UPDATE SET"
            " from_ns = excluded.from_ns, to_ns = excluded.to_ns, offset = excluded.offset,"
            " size = excluded.size",
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
        are replaced with the archive's, and its keccak id is remembered — atomically. A
        message the archive holds twice, or the store already holds, is stored once
        (``_hydrate``). Returns how many of the archive's messages the store holds afterwards."""
        with self._tx():
            self._hydrate(entry, messages)
            return self._count_from([entry.archive_id])

    def _hydrate(self, entry: IndexEntry, messages: ArchiveMessages) -> None:
        """Replace the window's messages with the archive's, except those hydrated from
        *another archive of the same window*.

        Why not the whole window: status-go splits a window whose messages exceed 30 MB into
        several archives sharing one ``[from, to)`` (manager_archive_file.go
        ``createHistoryArchiveTorrent``: ``messageChunks``), so "replace the time range" must
        mean "replace what the archives of that range did not bring": deleting the range once
        per archive kept only the last archive's messages. Rows remember the archive they came
        from, so hydrating any set of archives, in any order, again, or after a crash between
        two transactions leaves each archive's messages exactly once. A row from an archive of
        a *different* window that overlaps this one (a control node whose windows changed) is
        replaced, as the spec's rule says."""
        m = entry.metadata
        self._insert_archives([entry])
        origin = _value(
            self.db, "SELECT rowid FROM archives WHERE archive_id = ?", (entry.archive_id,)
        )
        window = (
            "ts_ns >= ? AND ts_ns < ? AND (origin IS NULL OR origin NOT IN"
            " (SELECT rowid FROM archives WHERE from_ns = ? AND to_ns = ? AND rowid != ?))"
        )
        args = (m.from_ns, m.to_ns, m.from_ns, m.to_ns, origin)
        # forget the flags of the rows replaced, as prune does (a reused rowid must not look
        # archived)
        self.db.execute(
            f"DELETE FROM archived WHERE rowid IN (SELECT rowid FROM messages WHERE {window})",
            args,
        )
        self.db.execute(f"DELETE FROM messages WHERE {window}", args)
        # each message once, as ``add`` stores it: an archive built elsewhere (status-go's, an
        # older loglake's) may hold a message twice, or hold one another archive of the window
        # brought. status-go's member imports an archive's messages through the path of
        # received ones (messenger_handler.go ``handleArchiveMessages`` ->
        # ``handleRetrievedMessages``), which skips a message whose id it already holds
        # ("Don't process duplicates": ``messageExists``, the batch's ids and the database);
        # the id is a function of the message's bytes, so here the key is the record itself,
        # and the first copy stays
        # a chunk at a time when given in chunks (a member's fetch, ``unpack_chunks``): each
        # chunk's copies are looked for among the rows of the chunks before it as well, so the
        # rows stored, and their order (time, then rowid), are those of one batch
        chunks = [messages] if isinstance(messages, Sequence) else messages
        for chunk in chunks:
            self._insert_once(
                [(x.timestamp_ns, x.topic, x.raw, x.cap_size, origin) for x in chunk], "origin"
            )

    def hydrate_many(self, items: Iterable[tuple[IndexEntry, ArchiveMessages]]) -> int:
        """``hydrate`` several archives in one transaction (all or nothing). Returns how many
        messages of these archives the store holds afterwards (counted, not summed: the
        figure a report shows is what a reader of the store will find).

        ``items`` is taken one archive at a time, inside the transaction, and each archive's
        messages let go once stored: a fetch passes a generator that decodes an archive only
        when it is asked for, so a member holds one archive in memory, not every one it
        fetched; an error the generator raises rolls back the archives before it. An archive's
        messages may come as an iterator of chunks (``member.unpack_chunks``): then it holds
        one chunk at a time, and an error the chunks raise rolls back the archive too."""
        ids: list[str] = []
        with self._tx():
            for entry, messages in items:
                self._hydrate(entry, messages)
                ids.append(entry.archive_id)
                del messages  # before the next archive is decoded
            return self._count_from(ids)

    def _count_from(self, archive_ids: Sequence[str]) -> int:
        n = 0
        ids = list(dict.fromkeys(archive_ids))
        for i in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            chunk = ids[i : i + 500]
            n += _value(
                self.db,
                "SELECT count(*) FROM messages WHERE origin IN (SELECT rowid FROM archives"
                f" WHERE archive_id IN ({','.join('?' * len(chunk))}))",
                tuple(chunk),
            )
        return n

    def hydrated_counts(self) -> dict[str, int]:
        """How many messages the store holds from each archive it hydrated."""
        with self._reading():
            rows = _all(
                self.db.execute(
                    "SELECT a.archive_id, count(*) FROM messages m"
                    " JOIN archives a ON a.rowid = m.origin GROUP BY a.archive_id"
                )
            )
        return dict(rows)

    def prune(self, before_ns: int, archived_only: bool = False) -> int:
        """Delete messages older than ``before_ns`` (the caller bounds it by what is archived);
        ``archived_only``: only rows flagged archived."""
        where = "ts_ns < ?"
        if archived_only:
            where += " AND rowid IN (SELECT rowid FROM archived)"
        with self._tx():
            self.db.execute("DROP TABLE IF EXISTS temp.gone")
            self.db.execute(
                f"CREATE TEMP TABLE gone AS SELECT rowid AS r FROM messages WHERE {where}",
                (before_ns,),
            )
            self.db.execute("DELETE FROM messages WHERE rowid IN (SELECT r FROM gone)")
            deleted = self.db.changes()
            # forget the flags of the rows that went (a reused rowid must not look archived)
            self.db.execute("DELETE FROM archived WHERE rowid IN (SELECT r FROM gone)")
            self.db.execute("DROP TABLE temp.gone")
        return deleted

    def _tx(self) -> _Tx:
        return _Tx(self.db, self.path)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """A read outside a transaction: SQLite's I/O error (a failed read of the database or
        its WAL, ``SQLITE_IOERR_READ``) as the ``OSError(EIO)`` naming the file that the rest
        of loglake raises for a failing disk — as a write's is (``_Tx``) — not apsw's own
        exception. A read changes nothing: the same call works once the disk does."""
        try:
            yield
        except apsw.Error as e:
            err = _disk_error(e, self.path)
            if err is e:
                raise
            raise err from e


def _exportable(topics: Sequence[bytes | str] | None, max_cap: int | None) -> tuple[str, list]:
    """The ``AND …`` condition (and its arguments) on the rows a build exports from its
    windows: on ``topics`` (None: all), with ``cap <= max_cap`` (None: no cap)."""
    cond, args = "", list[Any]()
    if topics is not None:
        cond += f" AND topic IN ({','.join('?' * len(topics))})"
        args += list(topics)
    if max_cap is not None:
        cond += " AND cap <= ?"
        args.append(max_cap)
    return cond, args


def _all(cur: apsw.Cursor) -> list[Any]:
    """Every row of ``cur`` as tuples (their types are the schema's)."""
    return cur.fetchall()


def _value(db: apsw.Connection, q: str, args: tuple = ()) -> Any:
    """The first column of the first row of ``q`` (None without a row). The statement is
    read to its end, so that it completes (and any error it meets is raised) here."""
    rows = db.execute(q, args).fetchall()
    return rows[0][0] if rows else None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Bulk loads make a million tuples; each cyclic-GC pass would rescan all of them (3-5x
    the load's cost, measured). Tuples of ints/bytes cannot form cycles, so pause it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_BUSY_TIMEOUT_MS = 5000
_AUTOCHECKPOINT_PAGES = 1000
"""SQLite's ``SQLITE_DEFAULT_WAL_AUTOCHECKPOINT``."""


def _checkpoint_after_commit(db: apsw.Connection, name: str, pages: int) -> int:
    """SQLite's own automatic checkpoint (``sqlite3WalDefaultHook``: a PASSIVE checkpoint once
    the WAL holds 1,000 pages, its failure ignored: the transaction is committed already, and
    a checkpoint that failed is redone from the WAL by the next one), done here so that an
    error a Python VFS raised during it is ignored too: apsw would otherwise raise it from the
    COMMIT that succeeded, and the caller would redo a committed transaction (seen with
    ``tests/faults/sqlite_vfs.py``)."""
    if pages >= _AUTOCHECKPOINT_PAGES:
        with contextlib.suppress(apsw.Error):
            db.wal_checkpoint(name)
    return apsw.SQLITE_OK


def _disk_error(e: apsw.Error, path: str) -> BaseException:
    """SQLite's "database or disk is full" and I/O errors as the ``OSError`` (ENOSPC, EIO)
    the rest of loglake raises for a full or failing disk; any other error unchanged."""
    if isinstance(e, apsw.FullError):
        return OSError(errno.ENOSPC, f"{path}: SQLite: {e}")
    if isinstance(e, apsw.IOError):
        return OSError(errno.EIO, f"{path}: SQLite: {e}")
    return e


class _Tx:
    """One transaction. A failed statement or COMMIT (a full disk) rolls it back, so the
    connection is usable again once space frees, and the store is exactly as it was."""

    def __init__(self, db: apsw.Connection, path: str) -> None:
        self.db = db
        self.path = path

    def __enter__(self) -> None:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except apsw.Error as e:
            raise _disk_error(e, self.path) from e

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return
            except apsw.Error as e:
                exc = e  # a COMMIT that failed leaves the transaction open: end it below
        with contextlib.suppress(apsw.Error):  # SQLite may have rolled it back already
            self.db.execute("ROLLBACK")
        if isinstance(exc, apsw.Error):
            err = _disk_error(exc, self.path)
            if err is not exc or exc_type is None:
                raise err from exc
