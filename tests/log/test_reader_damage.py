"""A read-only view of the log reports damage below the durable watermark as the writer does.

Found from outside (review 3): one flipped byte, or a cut, inside the fsynced bytes of the active
segment made the writer refuse to open (``CorruptSegment`` naming file and byte), while every
read-only view stopped there as at a torn tail: ``loglake log verify`` printed "ok: 33 records,
no damage found" (exit 0) for a partition of 100 acknowledged records, ``log read --from 40``
returned ``[]`` and ``log info`` said ``next_index`` 33. The tests also hold a reader beside a live
writer to its old behaviour: past the watermark, a torn or zero tail is where reading stops."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from loglake.log import CorruptSegment, Entry, SegmentLog, StreamConfig, fs, open_log, recovery
from loglake.log.cli import command
from loglake.log.repair import scan_damage

RECORDS = 100
BATCH = 10  # appends of this many: the watermark is published after each one's fsync


def make(tmp_path: Path, config: StreamConfig | None = None) -> Path:
    """A cleanly closed log of ``RECORDS`` acknowledged records in one (active) segment."""
    with open_log(tmp_path) as log:
        log.create_stream("s", config or StreamConfig())
        for b in range(0, RECORDS, BATCH):
            log.append_many("s", [Entry(b"r%03d" % i + b"." * 20) for i in range(b, b + BATCH)])
    return seg_path(tmp_path)


def seg_path(data: Path) -> Path:
    (seg,) = sorted((data / "streams" / "s" / "0").glob("*.seg"))
    return seg


def flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


def writer_error(data: Path) -> CorruptSegment:
    with pytest.raises(CorruptSegment) as e, open_log(data) as log:
        log.read("s", 0)
    return e.value


def run(*args: object):
    return CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=True)


@pytest.mark.parametrize("damage", ["flip", "cut", "flip before the recovery point"])
def test_a_reader_reports_damage_below_the_watermark_as_the_writer_does(tmp_path, damage):
    """Where the writer's open finds it (the tail it scans from its newest sparse-index entry
    below the watermark), every look finds it; before that entry, reads and verify do (the
    writer's rule too: ``Segment.recover_active``)."""
    seg = make(tmp_path)
    size = seg.stat().st_size
    if damage == "flip":
        flip(seg, size - 200)
    elif damage == "cut":
        seg.write_bytes(seg.read_bytes()[: size // 2])
    else:
        flip(seg, size // 3)
    expected = writer_error(tmp_path)
    assert expected.path == str(seg)
    calls = {
        "read past it": lambda log: log.read("s", 40, limit=2),
        "verify": lambda log: log.verify(),
    }
    if damage != "flip before the recovery point":
        calls["next_index"] = lambda log: log.next_index("s")
        calls["stream_info"] = lambda log: log.stream_info("s")
    for what, call in calls.items():
        with open_log(tmp_path, readonly=True) as log, pytest.raises(CorruptSegment) as e:
            call(log)
        assert (e.value.path, e.value.offset) == (expected.path, expected.offset), what


def test_loglake_log_verify_fails_naming_the_file_and_byte(tmp_path):
    seg = make(tmp_path)
    flip(seg, seg.stat().st_size - 200)
    expected = writer_error(tmp_path)
    res = run("verify", "--data-dir", tmp_path, "--json")
    assert res.exit_code == 1 and isinstance(res.exception, CorruptSegment)
    assert "no damage found" not in res.output
    (damage,) = json.loads(res.output)["damage"]
    assert (damage["path"], damage["offset"]) == (str(seg), expected.offset)
    assert (damage["first"], damage["last"], damage["recoverable"]) == (0, RECORDS - 1, False)
    res = run("verify", "--data-dir", tmp_path)
    assert res.exit_code == 1 and "no damage found" not in res.output
    assert f"byte {expected.offset}" in res.output and "unrecoverable" in res.output
    for args in (("read", "s", "--from", "90", "--json"), ("info", "--json")):
        res = run(*args, "--data-dir", tmp_path)
        assert res.exit_code == 1 and isinstance(res.exception, CorruptSegment), args


def test_a_reader_that_read_before_the_damage_reports_it_on_its_next_look(tmp_path):
    """The damage lies past what the reader had read: its next look (``refresh_tail``) finds
    it, as a first look would."""
    seg = make(tmp_path)
    size = seg.stat().st_size
    with open_log(tmp_path, readonly=True) as reader:
        assert len(reader.read("s", 0)) == RECORDS
        raw = seg.read_bytes()
        seg.write_bytes(raw[: size // 2])  # the reader's segment holds more than the file now
        with pytest.raises(CorruptSegment):
            reader.read("s", 0)
        seg.write_bytes(raw)
        assert len(reader.read("s", 0)) == RECORDS
    with open_log(tmp_path) as writer:
        reader = SegmentLog(tmp_path, readonly=True)
        try:
            assert reader.next_index("s") == RECORDS
            writer.append_many("s", [Entry(b"late %d" % i) for i in range(BATCH)])
            writer.flush()
            flip(seg, size + 5)  # in the records the reader has not read yet, below the mark
            with pytest.raises(CorruptSegment) as e:
                reader.read("s", RECORDS)
            assert e.value.path == str(seg) and e.value.offset >= size
        finally:
            reader.close()


def test_damage_past_the_watermark_is_a_torn_tail_for_a_reader(tmp_path):
    """Bytes no fsync covered (a crash mid-append): not damage, not an error."""
    seg = make(tmp_path)
    seg.write_bytes(seg.read_bytes() + b"\x07" * 40)
    with open_log(tmp_path, readonly=True) as log:
        assert log.next_index("s") == RECORDS
        assert len(log.read("s", 0)) == RECORDS
        log.verify()
    assert scan_damage(tmp_path).damage == []


def test_a_reader_never_trusts_a_watermark_newer_than_the_bytes_it_read(tmp_path, monkeypatch):
    """The race the ordering in ``recovery.follow_writer`` is for: a writer appends (write,
    fsync, then watermark) right after the reader read the segment's bytes. A watermark read
    after them names bytes the reader did not see; read before, it never does."""
    make(tmp_path)
    with open_log(tmp_path) as writer:
        reader = SegmentLog(tmp_path, readonly=True)
        try:
            # (an append zero-fills the file ahead: the reader's next look reads past its end)
            writer.append_many("s", [Entry(b"first %d" % i) for i in range(BATCH)])
            assert reader.next_index("s") == RECORDS + BATCH
            real_pread, armed = fs.pread, [True]

            def pread_then_append(fd: int, n: int, offset: int) -> bytes:
                out = real_pread(fd, n, offset)
                if armed and os.readlink(f"/proc/self/fd/{fd}").endswith(".seg"):
                    armed.clear()  # the writer's append below must not come back here
                    writer.append_many("s", [Entry(b"raced %d" % i) for i in range(BATCH)])
                return out

            monkeypatch.setattr(fs, "pread", pread_then_append)
            assert reader.next_index("s") == RECORDS + BATCH  # it read before the append
            assert not armed
            monkeypatch.setattr(fs, "pread", real_pread)
            assert reader.next_index("s") == RECORDS + 2 * BATCH
        finally:
            reader.close()


def test_the_watermark_is_read_before_the_segments(tmp_path, monkeypatch):
    """The order itself, seen from outside: every watermark read of a look comes before its
    listing of the segment files."""
    make(tmp_path)
    order: list[str] = []
    real_list, real_read = recovery.list_bases, recovery.watermark.read
    monkeypatch.setattr(recovery, "list_bases", lambda p: order.append("list") or real_list(p))
    monkeypatch.setattr(
        recovery.watermark, "read", lambda d, *a: order.append("mark") or real_read(d, *a)
    )
    with open_log(tmp_path, readonly=True) as log:
        log.next_index("s")
        log.read("s", 0)
    assert order and order[0] == "mark"
    assert all(order[i] == "mark" for i, o in enumerate(order[1:]) if o == "list"), order


@pytest.mark.parametrize("durability", ["batch", "always"])
def test_readers_racing_a_live_writer_never_see_false_damage(tmp_path, durability, monkeypatch):
    """Readers (threads, each its own read-only log) look as fast as they can while a writer
    appends small batches (zero-filled tail, group commits, rolls): bounded to ~1.5 s. Nor
    do they read the active segment again from its start (a cost per look): that is only for
    a reader whose look the writer has cut off since (``recovery.reread_active``)."""
    config = StreamConfig(durability=durability, segment_bytes=64 * 1024)
    rereads: list[int] = []
    in_verify = threading.local()
    real_reread = recovery.reread_active

    def reread_active(p, seg):
        if not getattr(in_verify, "on", False):  # (verify reads it again on purpose)
            rereads.append(seg.base)
        return real_reread(p, seg)

    monkeypatch.setattr(recovery, "reread_active", reread_active)
    with open_log(tmp_path) as writer:
        writer.create_stream("s", config)
        stop = threading.Event()
        errors: list[BaseException] = []
        seen: list[int] = []

        def read_loop() -> None:
            with open_log(tmp_path, readonly=True) as reader:
                last = 0
                try:
                    while not stop.is_set():
                        nxt = reader.next_index("s")
                        assert nxt >= last  # what a reader saw is never taken back
                        start = max(0, nxt - 50)
                        got = [r.index for r in reader.read("s", start, limit=100)]
                        assert got[: nxt - start] == list(range(start, nxt))
                        assert got == list(range(start, start + len(got)))
                        last = start + len(got)
                    in_verify.on = True
                    reader.verify()
                except BaseException as e:  # reported by the test thread
                    errors.append(e)
                seen.append(last)

        readers = [threading.Thread(target=read_loop) for _ in range(2)]
        for t in readers:
            t.start()
        deadline, n = time.monotonic() + 1.5, 0
        while time.monotonic() < deadline and n < 40_000:
            writer.append_many("s", [Entry(b"x%d" % (n + i) + b"." * 60) for i in range(5)])
            n += 5
        stop.set()
        for t in readers:
            t.join(30)
        assert not errors, errors
        assert len(seen) == 2 and all(s > 0 for s in seen)
        assert rereads == []
    with open_log(tmp_path, readonly=True) as reader:
        assert reader.next_index("s") == n
        assert reader.verify()[0][3] == n


@pytest.mark.parametrize(
    ("lost", "lost_pad", "kept", "kept_pad"),
    [(BATCH, 0, BATCH, 50), (100, 120, 100, 0), (10, 120, 20, 0), (100, 120, 50, 0)],
)
def test_a_reader_that_read_an_append_the_writer_cut_off_follows_what_replaced_it(
    tmp_path, monkeypatch, lost, lost_pad, kept, kept_pad
):
    """An append that fails part way (a full disk) is cut off by the writer, and the next one
    takes its indexes with other bytes; a reader that read the cut-off frames first must follow
    what replaced them. Longer replacements: it stops inside them, below the watermark once
    they are fsynced, and reads the segment again rather than report damage. Shorter ones
    (found from outside): the new watermark lies below the reader's end and its next look
    found nothing wrong: it stayed at its stale end (``next_index`` 110 with 120 records
    acknowledged, ``read`` returning ``[]``), or ``read``/``verify`` rebuilt its index up to
    that end and raised ``CorruptSegment 'implausible body length 0'`` over acknowledged
    records. ``(100, 50)``: fewer records than the reader had seen, so the watermark does not
    tell; the read that finds its index wrong reads the segment again."""
    import errno

    make(tmp_path)
    with open_log(tmp_path) as writer:
        reader = SegmentLog(tmp_path, readonly=True)
        try:
            assert reader.next_index("s") == RECORDS
            real = fs.writev_all

            def write_then_fail(fd, parts, size=None):
                real(fd, parts, size)
                reader.next_index("s")  # the reader reads the frames before the writer cuts
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(fs, "writev_all", write_then_fail)
            with pytest.raises(OSError):
                writer.append_many(
                    "s", [Entry(b"lost %d " % i + b"L" * lost_pad) for i in range(lost)]
                )
            monkeypatch.setattr(fs, "writev_all", real)
            data = [b"kept %d " % i + b"k" * kept_pad for i in range(kept)]
            assert writer.append_many("s", [Entry(d) for d in data])[0] == RECORDS
            writer.flush()
            assert reader.next_index("s") == RECORDS + kept
            for start in range(RECORDS, RECORDS + kept, 7):
                got = [r.data for r in reader.read("s", start, limit=5)]
                assert got == data[start - RECORDS : start - RECORDS + 5], start
            assert [r.data for r in reader.read("s", RECORDS)] == data
            assert reader.verify()[0][3] == RECORDS + kept
        finally:
            reader.close()


@pytest.mark.parametrize("lost", ["the active segment", "every segment"])
def test_a_missing_segment_the_watermark_names_is_damage_for_readers_too(tmp_path, lost):
    """Found from outside: with the segment the watermark names gone, the writer refused to
    open ("... is missing") while every read-only view reported a healthy, shorter partition:
    ``next_index`` 250 of 300 acknowledged, ``read`` from 290 ``[]``, ``loglake log verify`` and
    ``log info`` exit 0. A live writer creates a segment and fsyncs its folder before it
    publishes a watermark naming it, and a reader reads the watermark first: no race."""
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=4096))
        for b in range(0, 300, 10):
            log.append_many("s", [Entry(b"r%03d" % i + b"." * 40) for i in range(b, b + 10)])
    pdir = tmp_path / "streams" / "s" / "0"
    segs = sorted(pdir.glob("*.seg"))
    assert len(segs) > 2
    for seg in segs[-1:] if lost == "the active segment" else segs:
        seg.unlink()
        seg.with_suffix(".idx").unlink(missing_ok=True)
    expected = writer_error(tmp_path)
    assert "is missing" in expected.reason
    for call in (
        lambda r: r.next_index("s"),
        lambda r: r.read("s", 290),
        lambda r: r.verify(),
        lambda r: r.stream_info("s"),
    ):
        with SegmentLog(tmp_path, readonly=True) as reader, pytest.raises(CorruptSegment) as e:
            call(reader)
        assert (e.value.path, e.value.offset) == (expected.path, 0)
    res = run("verify", "--data-dir", tmp_path, "--json")
    assert res.exit_code == 1
    (damage,) = json.loads(res.output)["damage"]
    assert (damage["path"], damage["first"], damage["last"]) == (expected.path, 250, 299)
    assert damage["recoverable"] is False
    for args in (("read", "s", "--from", "290", "--json"), ("info", "--json")):
        res = run(*args, "--data-dir", tmp_path)
        assert res.exit_code == 1 and isinstance(res.exception, CorruptSegment), args


def test_a_readers_verify_skips_segments_retention_deleted_since_it_listed_them(
    tmp_path, monkeypatch
):
    """Found from outside: ``Partition.verify`` read each segment by its path, so a reader's
    ``verify`` raised ``FileNotFoundError`` when the writer's retention deleted a segment
    between the reader's listing and its read. Such a segment is gone, not damaged: skipped.
    (The writer's retention runs here right after the reader has listed the files.)"""
    from loglake.log.partition import Partition

    cfg = StreamConfig(segment_bytes=1024, retention_records=10, seal_to_lake=False)
    with open_log(tmp_path) as writer:
        writer.create_stream("s", cfg)
        for b in range(0, 200, 10):
            writer.append_many("s", [Entry(b"r%03d" % i + b"." * 40) for i in range(b, b + 10)])
        with open_log(tmp_path, readonly=True) as reader:
            assert reader.next_index("s") == 200
            real_refresh = Partition.refresh
            trimmed = []

            def refresh(self):
                real_refresh(self)
                if self.readonly and not trimmed:
                    trimmed.append(writer.enforce_retention())

            monkeypatch.setattr(Partition, "refresh", refresh)
            ((_, _, segments, records, _),) = reader.verify()
            assert trimmed[0] > 0
            assert segments > 0 and 10 <= records < 200
            monkeypatch.setattr(Partition, "refresh", real_refresh)
            assert reader.verify()[0][3] == records
