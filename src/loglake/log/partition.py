"""One partition of a stream: its segments, its lake files, appends and durability.

Why here: everything that must agree about a partition's index range (the active segment, the
sealed ones, the lake files, the group commit) changes under one lock in one object, so the
rules of ``loglake.log.api`` hold between any two calls:

- indexes are assigned from ``next_index`` in append order, one ``write`` per batch;
- a segment rolls when the next batch would push it past ``segment_bytes``; the rolled segment is
  fsynced, closed and, with ``seal_to_lake``, written to the lake before appends go on;
- a failed fsync fails the partition for good (``_fsync``): it writes nothing more, and
  ``SegmentLog`` replaces it with a new ``Partition`` opened from disk (``retire``,
  ``PartitionRetired``) once the back-off of ``reopen.py`` has passed.

The rest works on a partition from its own module, each under this object's lock: opening it
and following a writer (``recovery.py``), reading it (``reads.py``), sealing, retention and
truncation (``retention.py``). What stays here is the append path and the durability state.
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loglake.log import fs, reads, recovery, retention, watermark
from loglake.log.api import (
    CorruptSegment,
    Durability,
    Entry,
    LogClosed,
    PartitionHealth,
    SealFailure,
    StorageFailed,
    StorageFailure,
    StreamConfig,
)
from loglake.log.group_commit import GroupCommit
from loglake.log.lake import (
    LakeFile,
    check_lake_file,
)
from loglake.log.reads import TABLE_BYTES
from loglake.log.record_codec import encode_batch_parts, encode_plain_parts
from loglake.log.recovery import STORAGE_FAILED_FILE
from loglake.log.reopen import Reopen
from loglake.log.retention import SEAL_FAILED_FILE
from loglake.log.sealer import Sealer
from loglake.log.segment import Segment
from loglake.structured_logging import log_event

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger(__name__)


class PartitionRetired(LogClosed):
    """The partition object was replaced by a reopened one. Raised before the call did
    anything, so ``SegmentLog`` runs the call again on the new object; never seen by users."""


CHUNK_BYTES = 256 * 1024
"""A ``batch`` append larger than this is written in chunks of about this size, an fsync of
each started while the next is encoded (see ``Partition._append``)."""


class Partition:
    def __init__(
        self,
        stream: str,
        partition: int,
        directory: Path,
        lake_dir: Path,
        config: StreamConfig,
        readonly: bool,
        sealer: Sealer | None = None,
        clock: Callable[[], float] = time.monotonic,
        sweep_lake_temps: bool = True,
    ) -> None:
        self.stream = stream
        self.partition = partition
        self.dir = directory
        self.lake_dir = lake_dir
        self.config = config
        self.readonly = readonly
        self.sealer = sealer
        self._lock = threading.RLock()
        self._gc = GroupCommit()
        self._always_fsyncs = 0
        self._seq = 0
        self.reopen = Reopen(clock)
        """Its storage failure (``reopen.error``, None while healthy) and when ``SegmentLog``
        may replace it by a partition opened from disk; ``reopen.reopens`` counts the reopens of
        its predecessors (``took_over``)."""
        self.retired = False
        """Replaced by a reopened partition: every call raises ``PartitionRetired``."""
        self._opening = True
        self._sync_lock = threading.RLock()
        """The durability state: held across every fsync of the partition and the recording
        of its outcome (see ``_fsync``), the watermark and ``_durable_next``, and any change of
        the active segment's write handle (a roll, close). Taken after ``_lock`` when both are
        held, never the other way round: appends (under ``_lock``) go on while it is held."""
        self._written: tuple[int, Segment | None, int, int] = (0, None, 0, 0)
        """``(seq, segment, size, next_index)`` after the newest finished write: what an fsync
        starting now covers. Replaced whole (one atomic store) under ``_lock``, read without it
        by the group commit's fsync, so appends never wait for an fsync to take a snapshot."""
        self._closed = False
        self.seal_failure: SealFailure | None = None
        self.retention_error: str | None = None
        self.segments: list[Segment] = []
        self.lake: list[LakeFile] = []
        self.lake_expired_to = 0
        """Records below this had their lake copies removed by lake retention (in this
        process): a segment wholly below it was sealed, it does not wait for the sealer."""
        self.damaged: set[str] = set()
        """Sealed segments found damaged and served from their lake copies (logged once)."""
        self._mark: watermark.MarkWriter | None = None
        self._mark_synced_at = 0.0
        self._reader_mark: watermark.Mark | None = None
        """Readers: the writer's durable watermark as last read (``refresh``)."""
        self.sweep_lake_temps = sweep_lake_temps
        """The writer's open removes the lake folder's ``.tmp-`` files: True only where no
        seal of this process can be writing one (``SegmentLog``: its first open of the
        partition; not after an eviction or a failed partition's reopen, while the sealer may
        still be writing this partition's next lake file)."""
        try:
            recovery.open_partition(self)
        except BaseException:
            recovery.release(self)  # a reopen that fails is retried: it must not leak descriptors
            raise
        self._opening = False
        if self.segments:
            active = self.segments[-1]
            self._written = (0, active, active.size, active.next_index)
        self._durable_next = self.next_index
        """One past the newest record known to be on disk (fsynced): in-process readers of a
        ``batch``/``always`` stream see no further, so nobody reads a record that a crash could
        still take back and whose index could then be given to another record."""

    # -- opening: recovery.py ----------------------------------------------------------------
    def refresh(self) -> None:
        """Readers only: follow the writer (``recovery.follow_writer``)."""
        recovery.follow_writer(self)

    def _put_mark(self, base: int, size: int, next_index: int) -> None:
        """Publish the watermark (caller holds ``_sync_lock``). A failed write of it fails
        the partition like a failed fsync (``StorageFailed``): the slot may be torn (its CRC
        catches that), and a raw ``OSError`` here would leave appends going on with a group
        commit that reports the same error to every later write."""
        assert self._mark is not None
        try:
            self._mark.publish(base, size, next_index)
        except OSError as e:
            raise self._fail("writing the durable watermark", e) from e

    def _publish_durable(self, sync: bool = False) -> None:
        """Tell recovery and other processes' readers how far the disk is known to hold
        (caller: under the partition lock, right after an fsync of the active segment)."""
        if self._mark is None:
            return
        active = self.segments[-1]
        with self._sync_lock:
            self._make_name_durable(active)
            self._put_mark(active.base, active.size, active.next_index)
            if sync:
                self._fsync(self._mark.sync)
                self._mark_synced_at = time.monotonic()

    def _make_name_durable(self, active: Segment) -> None:
        """Before the first watermark naming ``active`` (caller holds ``_sync_lock``): fsync
        the folder, so the name is durable. The watermark may name a segment only then, or a
        power loss can take the file away from under acknowledged records. A roll does it
        before it publishes, except for ``durability="none"`` (no folder fsync on its append
        path), whose watermark then still names an older segment: the folder is fsynced here,
        before ``flush`` or ``close`` publishes one naming the new segment. So is it after a
        roll whose folder fsync failed in this process (the open: only the cache may hold the
        name). No watermark yet: the open made the segment (or found it) and fsyncs the
        folder. Found from outside: after a clean close of a ``none`` stream that had rolled,
        a power loss made the writer refuse to open ("segment holding acknowledged records up
        to index 200 is missing")."""
        assert self._mark is not None
        mark = self._mark.mark
        if mark is not None and mark.base != active.base:
            self._fsync(lambda: fs.fsync_dir(self.dir))

    # -- state ------------------------------------------------------------------------------
    @property
    def next_index(self) -> int:
        if self.segments:
            return self.segments[-1].next_index
        return self.lake[-1].last + 1 if self.lake else 0

    @property
    def visible_next(self) -> int:
        """Readers see indexes below this: durable records only, unless the stream's policy is
        ``none`` (nothing is ever known durable, so readers see whole records as they land).
        A reader in another process caps at the writer's durable watermark (``DURABLE``); a
        data dir written before the watermark existed has none, and its readers see every
        whole record."""
        if self.config.durability == "none":
            return self.next_index
        if self.readonly:
            mark = self._reader_mark
            if mark is None:
                return self.next_index
            return min(self.next_index, max(mark.next_index, self.first_index))
        return self._durable_next

    @property
    def first_index(self) -> int:
        first = self.segments[0].base if self.segments else self.next_index
        if self.lake and self.lake[0].first < first:
            first = self.lake[0].first
        return first

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def snapshot(self) -> tuple[int, int, int, int]:
        """``(first_index, next_index, bytes, durable_next)`` read together under the
        partition lock (a read-only log's ``next_index`` is what it can read)."""
        with self._lock:
            if self.readonly:
                self.refresh()
                return self.first_index, self.visible_next, self.bytes, self.visible_next
            return self.first_index, self.next_index, self.bytes, self.visible_next

    @property
    def fsyncs(self) -> int:
        """Data fsyncs that made appends durable: the group commit's (``batch``) and one per
        ``always`` append (folder and watermark fsyncs are not counted)."""
        return self._gc.fsyncs + self._always_fsyncs

    # -- writing ----------------------------------------------------------------------------
    def append_many(self, entries: Sequence[Entry], durability: Durability) -> list[int]:
        return self._append(entries, durability, encode_batch_parts)

    def append_payloads(self, datas: Sequence[builtins.bytes], durability: Durability) -> list[int]:
        """``append_many`` of data-only records, encoded without an ``Entry`` each."""
        return self._append(datas, durability, encode_plain_parts)

    def _append(self, items: Sequence, durability: Durability, encode: Callable) -> list[int]:
        """Encode ``items`` (entries or data), write them, wait per ``durability``.

        A ``batch`` append larger than ``CHUNK_BYTES`` is encoded and written a chunk at a
        time, and after each chunk but the last an fsync of what is written is started on the
        group commit's helper thread (``GroupCommit.kick``): the disk writes chunk k while the
        CPU encodes chunk k+1, and the final fsync (the one that acknowledges the batch) finds
        most of it on disk already. The partition lock is held throughout, so the batch's
        indexes stay contiguous; the fsync needs only ``_sync_lock`` and ``_written``."""
        if not items:
            return []
        now = time.time_ns()
        n = len(items)
        with self._lock:
            # (the checks and the chunk size inline: this is the push path, a call each costs)
            if self.retired or self._closed or self.reopen.error is not None:
                self._check_writable()  # raises the error that says why
            active = self.segments[-1]
            first = active.next_index
            step = n
            if durability == "batch" and n > 1:  # chunks of about CHUNK_BYTES, by the first
                head = items[0]
                raw = isinstance(head, (builtins.bytes, bytearray, memoryview))
                head_size = len(head) if raw else len(head.data)
                step = max(1, CHUNK_BYTES // (head_size + 64))
            done = 0
            while True:
                part = items if step >= n else items[done : done + step]
                at = active.next_index
                parts, size, offsets, max_ts = encode(part, at, now)
                if active.size and active.size + size > self.config.segment_bytes:
                    active = self._roll(durability)
                # the zero fill is for a small append's fsync (segment.py); a large one's
                # last chunk may be small, but its zeros would only be written twice
                active.write(parts, size, offsets, at, max_ts, step >= n)
                self._seq += 1
                seq = self._seq
                self._written = (seq, active, active.size, active.next_index)
                done += len(part)
                if done >= n:
                    break
                self._gc.kick(seq, self._sync_newest)
            if durability == "always":
                with self._sync_lock:
                    self._fsync(active.sync)
                    self._always_fsyncs += 1
                    self._durable_next = active.next_index
                    self._publish_durable()
                self._gc.mark_synced(seq)
        if durability == "batch":
            self._gc.wait_durable(seq, self._sync_newest)
        return list(range(first, first + n))

    def append_payloads_then(
        self, datas: Sequence[builtins.bytes], done: Callable[[BaseException | None], None]
    ) -> list[int]:
        """Write data-only records now and return their indexes; ``done(None)`` is called once
        an fsync covers them (``done(error)`` if it failed), from whichever thread's fsync did.
        ``batch`` semantics without waiting: the caller may write its next batch while this one
        is fsynced (a written/durable split for a server). The indexes must not be acknowledged
        before ``done``; readers in this process see them only then, as for ``append``."""
        if not datas:
            done(None)
            return []
        now = time.time_ns()
        with self._lock:
            if self.retired or self._closed or self.reopen.error is not None:
                self._check_writable()  # raises the error that says why
            active = self.segments[-1]
            first = active.next_index
            parts, size, offsets, max_ts = encode_plain_parts(datas, first, now)
            if active.size and active.size + size > self.config.segment_bytes:
                active = self._roll("batch")
            active.write(parts, size, offsets, first, max_ts)
            self._seq += 1
            seq = self._seq
            self._written = (seq, active, active.size, active.next_index)
        self._gc.when_durable(seq, self._sync_newest, done)
        return list(range(first, first + len(datas)))

    def _sync_newest(self) -> int:
        """For the group commit: fsync what is written; return the write seq it covered.

        Runs under ``_sync_lock`` only, so appends go on meanwhile; the snapshot
        ``_written`` names a segment whose write handle cannot be closed while the lock is
        held (a roll seals it and ``close()`` closes it under the same lock, each after an
        fsync that covers every write, or a failure recorded in ``reopen.error``)."""
        with self._sync_lock:
            if self.reopen.error is not None:
                raise self.reopen.error
            seq, seg, size, nxt = self._written
            if seg is None or seg.wfd is None:
                return seq  # a roll's seal or close() fsynced it (else reopen.error is set)
            try:  # ``_fsync``'s rule, inline (this runs per group commit): the lock is held
                fs.fdatasync(seg.wfd)
            except OSError as e:
                raise self._fail("fsync", e) from e
            self._durable_next = max(self._durable_next, nxt)
            if self._mark is not None:  # ``_put_mark``, inline: no-op if a roll published past it
                try:
                    self._mark.publish(seg.base, size, nxt)
                except OSError as e:
                    raise self._fail("writing the durable watermark", e) from e
                if time.monotonic() - self._mark_synced_at >= watermark.SYNC_INTERVAL_S:
                    self._mark_synced_at = time.monotonic()
                    self._fsync(self._mark.sync)
        return seq

    def _roll(self, durability: Durability) -> Segment:
        """Seal the active segment and start the next (caller holds ``_lock``)."""
        old = self.segments[-1]
        with self._sync_lock:
            self._fsync(old.seal)
            self._durable_next = max(self._durable_next, old.next_index)
            self._gc.mark_synced(self._seq)
            new = Segment.create(self.dir, old.next_index, self.config.segment_bytes)
            try:
                if durability != "none":
                    self._fsync(lambda: fs.fsync_dir(self.dir))
            except BaseException:
                new.close()  # (the empty file stays: recovery opens it as the active one)
                raise
            self.segments.append(new)
            self._written = (self._seq, new, 0, new.base)
            if durability != "none":  # the new segment's name is durable: the mark may name it
                self._publish_durable()
        if self.config.seal_to_lake:
            retention.schedule_seal(self, old)
        return new

    def _check_writable(self) -> None:
        """Caller holds the lock."""
        if self.retired:
            raise PartitionRetired(f"{self.stream}/{self.partition}: reopened")
        if self.reopen.error is not None:
            raise self.reopen.error
        self._check_open()

    def _check_open(self) -> None:
        """Caller holds the lock."""
        if self._closed:
            if self.retired:
                raise PartitionRetired(f"{self.stream}/{self.partition}: reopened")
            raise LogClosed(f"{self.stream}/{self.partition}: the log is closed")

    def _fsync(self, fn: Callable[[], None]) -> None:
        """Run an fsync; on failure, fail the partition for good (see ``StorageFailed``).

        fsyncgate: after a failed fsync Linux may drop the dirty pages it could not write and
        mark them clean, so the next fsync of the file reports success without writing them.
        An fsync is trusted only if no fsync of the partition failed before it, so the
        partition's fsyncs run one at a time under ``_sync_lock`` and a failure is recorded
        before the lock is released: an fsync that starts after a failed one (a roll's seal,
        a ``flush``, ``close``, the group commit) raises the failure instead of running.
        (Before, a roll or a flush holding the partition lock could fsync between another
        thread's failed group-commit fsync and the moment that thread recorded it, then
        publish a watermark over bytes the disk never got.)"""
        with self._sync_lock:
            if self.reopen.error is not None:
                raise self.reopen.error
            try:
                fn()
            except OSError as e:
                raise self._fail("fsync", e) from e

    def _fail(self, what: str, e: OSError) -> StorageFailed:
        """Fail the partition for good (caller holds ``_sync_lock``): nothing is written to it
        any more, and ``SegmentLog`` reopens it from disk (a new ``Partition``) on an append
        after the back-off (``reopen.py``). Logged, and kept for ``health`` and in
        ``STORAGE_FAILED``, as seal failures are. A failure while opening is the open's error
        only (a reopen attempt's failure is reported by ``recovery.reopen_failed``)."""
        if self.reopen.error is not None:
            return self.reopen.error
        then = (  # (an open that fails raises this itself)
            ""
            if self._opening
            else "; the appends waiting for it failed, and the partition "
            "reopens from disk on an append after a back-off"
        )
        error = StorageFailed(f"{self.stream}/{self.partition}: {what} failed ({e}){then}")
        delay = self.reopen.fail(error, f"{what} failed ({e})")
        if not self._opening:
            log_event(
                logger,
                logging.ERROR,
                "a partition failed; it will be reopened from disk",
                stream=self.stream,
                partition=self.partition,
                error=f"{what} failed ({e})",
                reopen_in_s=delay,
            )
            recovery.record_failure(self)
        return error

    def quiesce(self) -> None:
        """Return once nothing is still writing into this failed partition: an append that
        was writing when it failed holds the lock until its last write (later ones raise), and
        the thread that recorded the failure holds the sync lock until ``STORAGE_FAILED`` is
        written (the reopen removes it)."""
        assert self.reopen.error is not None
        with self._lock, self._sync_lock:
            pass

    def took_over(self, old: Partition) -> None:
        """This partition was opened to replace ``old`` (failed): carry the counters."""
        self.reopen.reopens = old.reopen.reopens + 1
        self._always_fsyncs += old.fsyncs

    def retire(self) -> None:
        """Replaced by a reopened partition: refuse every later call (``PartitionRetired``),
        fail any waiter still pending, and release the files. A read under way keeps the read
        descriptors of the segments it pinned until it unpins them (``Segment.close``), so no
        descriptor number it uses can be reused for another file meanwhile."""
        with self._lock:
            self.retired = True
        if self.reopen.error is not None:
            self._gc.fail_pending(self.reopen.error)
        self.close()

    def health(self) -> PartitionHealth:
        """The partition's failures. A reader in another process sees what the writer
        recorded in ``SEAL_FAILED`` and ``STORAGE_FAILED``."""
        seal, failure = self.seal_failure, self.reopen.record
        failed = str(self.reopen.error) if self.reopen.error is not None else None
        if self.readonly:
            seal = _read_record(self.dir / SEAL_FAILED_FILE, SealFailure)
            failure = _read_record(self.dir / STORAGE_FAILED_FILE, StorageFailure)
            failed = failure.error if failure is not None else None
        return PartitionHealth(
            self.stream,
            self.partition,
            failed,
            seal,
            self.retention_error,
            failure,
            self.reopen.reopens,
        )

    def flush(self) -> None:
        """fsync the active segment; a failure fails the partition (``StorageFailed``)."""
        with self._lock:
            self._check_writable()
            if self.segments and self.segments[-1].wfd is not None:
                with self._sync_lock:
                    self._fsync(self.segments[-1].sync)
                    self._durable_next = self.next_index
                    self._publish_durable()
                self._gc.mark_synced(self._seq)

    # -- reading ----------------------------------------------------------------------------
    # -- reading: reads.py --------------------------------------------------------------------
    def read(
        self,
        start: int,
        limit: int | None,
        end: int | None,
        pairs: bool = False,
        max_bytes: int | None = None,
    ) -> list:
        """Records ``start <= index < end`` (at most ``limit``, and about ``max_bytes`` of
        data), or ``(index, data)`` pairs (``reads.read``)."""
        return reads.read(self, start, limit, end, pairs, max_bytes)

    def read_tables(self, start: int, end: int, max_bytes: int = TABLE_BYTES) -> Iterator[pa.Table]:
        """``read(start, None, end)`` as tables in the lake's schema (``reads.read_tables``)."""
        return reads.read_tables(self, start, end, max_bytes)

    def _lake_file_at(self, pos: int) -> LakeFile | None:
        """The first lake file holding an index >= ``pos``."""
        i = bisect.bisect_right([f.last for f in self.lake], pos - 1)
        return self.lake[i] if i < len(self.lake) else None

    # -- retention: retention.py ------------------------------------------------------------
    def enforce_retention(self, now_ns: int) -> int:
        """``retention.enforce``: delete what the stream's retention lets go."""
        return retention.enforce(self, now_ns)

    def truncate_before(self, index: int) -> int:
        """``retention.truncate_before``: delete whole segments below ``index``."""
        return retention.truncate_before(self, index)

    def verify(self) -> tuple[int, int, int]:
        """Read every segment whole and check every lake file's index range; return
        ``(segments, records, lake_files)``. Damage → ``CorruptSegment``."""
        with self._lock:
            self._check_open()
            if self.readonly:
                self.refresh()
                if self.segments and not self.segments[-1].is_sealed:
                    # read as on a first look: an earlier look of this reader may hold frames
                    # the writer has cut since (a full disk), which are not damage
                    with contextlib.suppress(FileNotFoundError):  # (rolled and deleted since)
                        recovery.reread_active(self, self.segments[-1])
            # A reader's listing can be older than the files: the writer's retention (or a
            # compaction, for lake files) deletes them meanwhile. One gone since is skipped,
            # not an error (found from outside: ``FileNotFoundError`` from a reader's
            # ``verify`` under live retention). The writer holds the lock: no segment goes.
            segments = records = lake_files = 0
            for seg in self.segments:
                try:
                    records += len(seg.iter_all())
                except FileNotFoundError:
                    if not self.readonly:
                        raise
                    continue
                segments += 1
            for lf in self.lake:
                try:
                    check_lake_file(lf)
                except CorruptSegment:
                    if not Path(lf.path).exists():  # (compaction: for the writer too)
                        continue
                    raise
                lake_files += 1
            return segments, records, lake_files

    def close(self) -> None:
        """fsync and release the files. Appends racing it get ``LogClosed``; an fsync failure
        here is ``StorageFailed`` like anywhere else (raised after the files are released)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            failed: StorageFailed | None = None
            with self._sync_lock:  # a group-commit fsync never sees a half-closed partition
                if not self.readonly and self.reopen.error is None and self.segments:
                    try:
                        for seg in self.segments:
                            if seg.wfd is not None:
                                self._fsync(seg.trim)  # (an ftruncate: fails as an fsync does)
                                self._fsync(seg.sync)
                        self._durable_next = self.next_index
                        self._publish_durable(sync=True)
                        self._gc.mark_synced(self._seq)
                    except StorageFailed as e:
                        failed = e
                for seg in self.segments:
                    seg.close()
                if self._mark is not None:
                    self._mark.close()
            if failed is not None:
                self._gc.fail_pending(failed)
        if failed is not None:
            raise failed


def _read_record(path: Path, cls: type) -> Any:
    """A ``SEAL_FAILED``/``STORAGE_FAILED`` record written by the writer, or None."""
    try:
        return cls(**json.loads(fs.read_file(path)))
    except (FileNotFoundError, ValueError, TypeError):
        return None
