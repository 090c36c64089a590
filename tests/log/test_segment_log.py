"""Engine behaviour of ``SegmentLog`` beyond the shared contract: reopen, recovery, sparse
indexes, rolling, retention, sealing to the lake, readonly readers and the writer lock
(issue 3 §2)."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from loglake.log import (
    CorruptSegment,
    Entry,
    InvalidTimestamp,
    LogLocked,
    QuotaExceeded,
    ReadOnlyLog,
    SegmentLog,
    StreamConfig,
    fs,
    open_log,
)
from loglake.log.lake_schema import LAKE_SCHEMA, lake_file_name
from loglake.log.record_codec import FRAME_HEAD, encode_batch
from loglake.log.segment import segment_name
from loglake.log.sparse_index import INTERVAL_BYTES
from tests.log.test_durability import hold_fdatasync


def part_dir(data: Path, stream: str = "s", p: int = 0) -> Path:
    return data / "streams" / stream / str(p)


def seg_files(data: Path, stream: str = "s", p: int = 0) -> list[Path]:
    return sorted(part_dir(data, stream, p).glob("*.seg"))


def payload(i: int) -> bytes:
    return (b"%08d" % i) * (1 + i % 7)


def fill(log, n: int, stream: str = "s", p: int = 0, ts=None) -> None:
    for i in range(n):
        log.append(
            stream, payload(i), key=b"k%d" % i, timestamp_ns=ts(i) if ts else None, partition=p
        )


def test_reopen_keeps_records_streams_configs_and_consumer_indexes(tmp_path):
    cfg = StreamConfig(partitions=2, durability="always", segment_bytes=4096)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        fill(log, 50)
        log.append("s", b"one", headers=(("h", b"v"),), partition=1)
        log.save_index("c", "s", 7, partition=1)
    with open_log(tmp_path) as log:
        assert log.streams() == ["s"]
        assert log.stream_info("s").config == cfg
        assert [r.data for r in log.read("s", 0)] == [payload(i) for i in range(50)]
        assert log.read("s", 0, partition=1)[0].headers == (("h", b"v"),)
        assert log.get_index("c", "s", partition=1) == 7
        assert log.append("s", b"more") == 50


def test_default_config_applies_to_streams_created_without_one(tmp_path):
    with open_log(tmp_path, default_config=StreamConfig(partitions=4, durability="none")) as log:
        assert log.create_stream("s").config.partitions == 4


# -- recovery --------------------------------------------------------------------------------


def _last_record_bounds(data: Path) -> tuple[Path, int, int]:
    seg = seg_files(data)[-1]
    raw = seg.read_bytes()
    pos, last = 0, 0
    while pos < len(raw):
        (length,) = FRAME_HEAD.unpack_from(raw, pos)[:1]
        last = pos
        pos += FRAME_HEAD.size + length
    return seg, last, len(raw)


def _torn_write(data: Path, n: int) -> tuple[Path, int, bytes]:
    """After ``n`` acknowledged records and a clean close, the frame an append of record ``n``
    would write: a torn tail is a prefix of it past the fsynced bytes (the durable watermark)."""
    seg = seg_files(data)[-1]
    buf, _, _ = encode_batch([Entry(payload(n), key=b"k%d" % n)], n, 1)
    return seg, seg.stat().st_size, buf


def test_torn_tail_is_truncated_at_every_byte_of_the_last_record(tmp_path, caplog):
    with open_log(tmp_path) as log:
        log.create_stream("s")
        fill(log, 2)
    seg, start, frame = _torn_write(tmp_path, 2)
    whole = seg.read_bytes()
    end = start + len(frame)
    caplog.set_level(logging.WARNING, logger="loglake.log")
    for cut in range(start + 1, end):
        seg.write_bytes(whole + frame[: cut - start])
        caplog.clear()
        with open_log(tmp_path) as log:
            assert log.next_index("s") == 2, cut
            assert [r.data for r in log.read("s", 0)] == [payload(0), payload(1)]
        assert seg.stat().st_size == start
        (rec,) = [r for r in caplog.records if "torn tail" in r.getMessage()]
        assert rec.fields["file"] == str(seg)
        assert rec.fields["offset"] == start
        assert rec.fields["bytes_dropped"] == cut - start
    seg.write_bytes(whole)


def test_corrupt_unsynced_last_record_is_truncated_and_appends_continue(tmp_path):
    """A whole but bad record past the fsynced bytes is a torn write (its sectors did not all
    reach the disk): cut, and appends go on from there."""
    with open_log(tmp_path) as log:
        log.create_stream("s")
        fill(log, 2)
    seg, start, frame = _torn_write(tmp_path, 2)
    bad = bytearray(frame)
    bad[-1] ^= 0xFF
    seg.write_bytes(seg.read_bytes() + bytes(bad))
    with open_log(tmp_path) as log:
        assert log.next_index("s") == 2
        assert seg.stat().st_size == start
        assert log.append("s", b"again") == 2
    with open_log(tmp_path) as log:
        assert log.read("s", 2)[0].data == b"again"


def test_corrupt_acknowledged_last_record_is_corrupt_segment_not_a_torn_tail(tmp_path):
    """Issue 17 §1: the last record was fsynced and acknowledged; a bad byte in it is damage,
    reported with the file and offset, and nothing is cut (this test used to assert the cut)."""
    with open_log(tmp_path) as log:
        log.create_stream("s")
        fill(log, 3)
    seg, start, end = _last_record_bounds(tmp_path)
    raw = bytearray(seg.read_bytes())
    raw[end - 1] ^= 0xFF
    seg.write_bytes(bytes(raw))
    # partitions open on first use: the log opens, the first read of the partition finds it
    with open_log(tmp_path) as log, pytest.raises(CorruptSegment) as e:
        log.read("s", 0)
    assert e.value.path == str(seg) and e.value.offset == start
    assert seg.stat().st_size == end


def test_corruption_inside_a_sealed_segment_is_corrupt_segment_with_file_and_offset(tmp_path):
    cfg = StreamConfig(segment_bytes=600, seal_to_lake=False)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        fill(log, 40)
    first = seg_files(tmp_path)[0]
    assert len(seg_files(tmp_path)) > 2
    raw = bytearray(first.read_bytes())
    # third record of the first segment: walk the frames
    pos = 0
    for _ in range(2):
        pos += FRAME_HEAD.size + FRAME_HEAD.unpack_from(raw, pos)[0]
    raw[pos + FRAME_HEAD.size + 3] ^= 0x01
    first.write_bytes(bytes(raw))
    with open_log(tmp_path) as log:
        assert log.next_index("s") == 40  # opening checks the active segment only
        assert [r.index for r in log.read("s", 0, limit=2)] == [0, 1]
        with pytest.raises(CorruptSegment) as e:
            log.read("s", 0, limit=5)
        assert e.value.path == str(first) and e.value.offset == pos
        assert "CRC32C" in str(e.value)
        # the corrupt segment is never skipped: a read that starts before it fails too
        with pytest.raises(CorruptSegment):
            list(log.iter_records("s", 0))


def test_sealed_segment_cut_short_is_corrupt_not_a_torn_tail(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=600, seal_to_lake=False))
        fill(log, 40)
    first = seg_files(tmp_path)[0]
    first.write_bytes(first.read_bytes()[:-5])
    first.with_suffix(".idx").unlink()
    with open_log(tmp_path) as log, pytest.raises(CorruptSegment) as e:
        log.read("s", 0)
    assert e.value.path == str(first)


@pytest.mark.parametrize("damage", ["missing", "partial", "garbage"])
def test_sparse_index_is_rebuilt_from_the_segment(tmp_path, damage):
    big = b"x" * 1000  # one index entry every ~4 records
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=64 * 1024, seal_to_lake=False))
        for _ in range(3):
            log.append_many("s", [Entry(big + b"%d" % i) for i in range(60)])
    idx = seg_files(tmp_path)[0].with_suffix(".idx")
    good = idx.read_bytes()
    assert len(good) // 16 >= 60 * 1000 // INTERVAL_BYTES  # sparse, not one per record
    if damage == "missing":
        idx.unlink()
    elif damage == "partial":
        idx.write_bytes(good[:-5])
    else:  # well-formed entries that point at the wrong records
        import struct

        idx.write_bytes(struct.pack("<QQ", 0, 0) + struct.pack("<QQ", 30, 5000))
    with open_log(tmp_path) as log:
        got = log.read("s", 37, limit=3)
        assert [r.data for r in got] == [big + b"%d" % i for i in (37, 38, 39)]
    assert idx.read_bytes() == good


def test_active_segment_index_is_rebuilt_on_open(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s")
        log.append_many("s", [Entry(b"y" * 900) for _ in range(50)])
    idx = seg_files(tmp_path)[-1].with_suffix(".idx")
    good = idx.read_bytes()
    idx.write_bytes(good[:7])
    with open_log(tmp_path) as log:
        assert log.read("s", 45, limit=1)[0].index == 45
    assert idx.read_bytes() == good


# -- rolling, retention, lake ------------------------------------------------------------


def test_segments_roll_by_size_and_are_named_by_first_index(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=1000, seal_to_lake=False))
        fill(log, 100)
        files = seg_files(tmp_path)
        assert len(files) > 5
        firsts = [int(f.stem) for f in files]
        assert files[0].name == segment_name(0) == "0" * 20 + ".seg"
        assert firsts == sorted(firsts)
        for f, nxt in zip(files, [*firsts[1:], 100], strict=True):
            assert f.stat().st_size <= 1000
            assert [r.index for r in log.read("s", int(f.stem), end=nxt)] == list(
                range(int(f.stem), nxt)
            )


def test_retention_by_records_bytes_and_age_drops_whole_old_segments(tmp_path):
    base = 1_000_000_000_000
    ms = 1_000_000
    cfgs = {
        "count": StreamConfig(segment_bytes=500, retention_records=10, seal_to_lake=False),
        "bytes": StreamConfig(segment_bytes=500, retention_bytes=1500, seal_to_lake=False),
        "age": StreamConfig(segment_bytes=500, retention_ms=50, seal_to_lake=False),
    }
    with open_log(tmp_path) as log:
        for name, cfg in cfgs.items():
            log.create_stream(name, cfg)
            fill(log, 60, stream=name, ts=lambda i: base + i * ms)
        now = base + 100 * ms  # records 0..49 are older than 50 ms
        dropped = log.enforce_retention(now_ns=now)
        infos = {n: log.stream_info(n).partitions[0] for n in cfgs}
        assert dropped == sum(i.first_index for i in infos.values())
        count, size, age = infos["count"], infos["bytes"], infos["age"]
        assert 0 < count.first_index <= 50 and count.next_index == 60
        assert size.bytes >= 1500 and size.first_index > 0
        assert 0 < age.first_index <= 50
        # whole segments only: every record of a dropped segment was outside the window
        assert log.read("age", 0)[0].timestamp_ns >= base  # sanity
        assert log.read("age", 0)[-1].index == 59
        assert log.enforce_retention(now_ns=now) == 0  # idempotent


def test_sealed_segments_go_to_the_lake_and_reads_span_lake_and_segments(tmp_path):
    cfg = StreamConfig(segment_bytes=800, retention_records=5)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        fill(log, 80)
        before = log.read("s", 0)
        assert log.enforce_retention() == 0  # the lake still holds what the segments lost
        first_seg = int(seg_files(tmp_path)[0].stem)
        assert first_seg > 0
        info = log.stream_info("s").partitions[0]
        assert (info.first_index, info.next_index) == (0, 80)
        assert log.read("s", 0) == before
        # a range that starts in the lake and ends in a live segment
        got = log.read("s", first_seg - 3, limit=6)
        assert [r.index for r in got] == list(range(first_seg - 3, first_seg + 3))
        assert got == before[first_seg - 3 : first_seg + 3]
        assert [r.index for r in log.iter_records("s", 1, batch=7)] == list(range(1, 80))
        assert log.read_payloads("s", first_seg - 3, limit=6) == [(r.index, r.data) for r in got]
    lake = tmp_path / "lake" / "s" / "partition=0"
    names = sorted(p.name for p in lake.iterdir())
    assert names[0] == lake_file_name(0, int(names[0].split("-")[1].split(".")[0]))
    assert not [n for n in names if not n.endswith(".parquet")]


def test_lake_is_read_directly_by_pyarrow_and_duckdb(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(partitions=2, segment_bytes=700))
        for p in (0, 1):
            for i in range(40):
                log.append(
                    "s",
                    payload(i),
                    key=None if i % 2 else b"k",
                    headers=(("n", b"%d" % i),),
                    partition=p,
                )
        sealed = {
            p: log.read("s", 0, end=int(seg_files(tmp_path, p=p)[-1].stem), partition=p)
            for p in (0, 1)
        }
    lake = tmp_path / "lake" / "s"
    table = pq.read_table(lake, partitioning=None)
    assert table.schema == LAKE_SCHEMA
    rows = sorted(table.to_pylist(), key=lambda r: (r["partition"], r["index"]))
    expect = [r for p in (0, 1) for r in sealed[p]]
    assert len(rows) == len(expect) > 0
    for row, rec in zip(rows, expect, strict=True):
        assert (row["partition"], row["index"], row["data"], row["key"]) == (
            rec.partition,
            rec.index,
            rec.data,
            rec.key,
        )
        assert [(h["key"], h["value"]) for h in row["headers"]] == list(rec.headers)
    got = duckdb.sql(
        f"select partition, count(*), min(index), max(index), sum(octet_length(data)) "
        f"from read_parquet('{lake}/*/*.parquet') group by all order by 1"
    ).fetchall()
    assert got == [
        (p, len(sealed[p]), 0, len(sealed[p]) - 1, sum(len(r.data) for r in sealed[p]))
        for p in (0, 1)
    ]


def test_lake_retention_deletes_old_lake_files(tmp_path):
    base, ms = 1_000_000_000_000, 1_000_000
    cfg = StreamConfig(segment_bytes=500, retention_records=5, lake_retention_ms=50)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        fill(log, 60, ts=lambda i: base + i * ms)
        dropped = log.enforce_retention(now_ns=base + 100 * ms)
        info = log.stream_info("s").partitions[0]
        assert dropped == info.first_index > 0
        assert log.read("s", 0)[0].index == info.first_index
        assert all(r.timestamp_ns >= base for r in log.read("s", 0))


def test_segment_retention_goes_on_after_lake_retention_removed_a_live_segments_copy(tmp_path):
    # The lake window (50 ms) ends before the live one (the newest 20 records): lake
    # retention removes the lake copies of segments still live. Those segments stayed "waiting
    # for the sealer" for good, and segment retention kept them and every newer one (190
    # records live of 20 wanted, growing until the log was reopened).
    base, ms = 1_000_000_000_000, 1_000_000
    cfg = StreamConfig(segment_bytes=500, retention_records=20, lake_retention_ms=50)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        fill(log, 30, ts=lambda i: base + i * ms)
        log.wait_for_seals()
        log.enforce_retention(now_ns=base + 1000 * ms)
        fill(log, 170, ts=lambda i: base + (1000 + i) * ms)
        log.wait_for_seals()
        log.enforce_retention(now_ns=base + 1200 * ms)
        live = log._partition("s", 0).segments
        assert live[-1].next_index - live[0].base <= 20 + 7  # a segment holds 7 records
        assert [r.index for r in log.read("s", 0, limit=1)] == [live[0].base]


def test_lake_retention_waits_for_the_lake_lock_a_compaction_holds(tmp_path):
    """A compaction checks its sources and commits under ``lake_lock``; lake retention removes
    files under it too, so it can never remove a source between that check and the commit."""
    from loglake.log.lake import lake_lock

    base, ms = 1_000_000_000_000, 1_000_000
    cfg = StreamConfig(segment_bytes=500, retention_records=5, lake_retention_ms=50)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        fill(log, 60, ts=lambda i: base + i * ms)
        log.wait_for_seals()
        lake = tmp_path / "lake" / "s" / "partition=0"
        before = sorted(lake.glob("*.parquet"))
        done = threading.Event()

        def retention() -> None:
            log.enforce_retention(now_ns=base + 100 * ms)
            done.set()

        with lake_lock(lake):
            t = threading.Thread(target=retention)
            t.start()
            assert not done.wait(0.5), "retention ran while a compaction held the lake lock"
            assert sorted(lake.glob("*.parquet")) == before
        t.join(30)
        assert done.is_set()
        assert len(sorted(lake.glob("*.parquet"))) < len(before)


def test_unsealed_rolled_segment_is_sealed_when_its_partition_opens(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=500))
        fill(log, 30)
    lake = tmp_path / "lake" / "s" / "partition=0"
    files = sorted(lake.glob("*.parquet"))
    files[-1].unlink()  # as if the process died between the roll and the seal
    (lake / ".tmp-half").write_bytes(b"PAR1 half written")
    with open_log(tmp_path) as log:  # partitions open on first use: this read opens it
        assert log.read("s", 0, limit=1)
    assert sorted(lake.iterdir()) == files


# -- concurrency, readers, lock ------------------------------------------------------------


def test_group_commit_shares_fsyncs_between_threads(tmp_path):
    threads, each = 8, 100
    log = SegmentLog(tmp_path)
    log.create_stream("s")
    acked: list[list[int]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads)

    def run(t: int) -> None:
        barrier.wait()
        for i in range(each):
            acked[t].append(log.append("s", b"%d:%d" % (t, i)))

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    all_idx = sorted(i for a in acked for i in a)
    assert all_idx == list(range(threads * each))
    assert log.fsync_count("s") < threads * each
    by_index = {r.index: r.data for r in log.read("s", 0)}
    for t in range(threads):
        assert [by_index[i] for i in acked[t]] == [b"%d:%d" % (t, i) for i in range(each)]
    log.close()


def test_readonly_reader_follows_a_writer_and_changes_nothing(tmp_path):
    writer = open_log(tmp_path)
    writer.create_stream("s", StreamConfig(segment_bytes=600))
    fill(writer, 10)
    reader = open_log(tmp_path, readonly=True)
    assert [r.index for r in reader.read("s", 0)] == list(range(10))
    for i in range(10, 40):
        writer.append("s", payload(i))
    writer.create_stream("t")
    assert [r.data for r in reader.read("s", 0)] == [payload(i) for i in range(40)]
    assert reader.streams() == ["s", "t"]
    with pytest.raises(ReadOnlyLog):
        reader.append("s", b"x")
    with pytest.raises(ReadOnlyLog):
        reader.save_index("c", "s", 1)
    writer.save_index("c", "s", 3)
    assert reader.get_index("c", "s") == 3
    reader.close()
    writer.close()


def test_readonly_stops_at_a_torn_tail_without_touching_it(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s")
        fill(log, 5)
    seg = seg_files(tmp_path)[-1]
    with open(seg, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x01\x02")  # the first bytes of a record being written
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with open_log(tmp_path, readonly=True) as ro:
        assert [r.index for r in ro.read("s", 0)] == list(range(5))
        assert ro.stream_info("s").partitions[0].next_index == 5
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before


def test_readonly_open_of_a_missing_dir_creates_nothing(tmp_path):
    with open_log(tmp_path / "nope", readonly=True) as ro:
        assert ro.streams() == []
    assert not (tmp_path / "nope").exists()


def test_second_writer_is_refused(tmp_path):
    with open_log(tmp_path):
        with pytest.raises(LogLocked) as e:
            open_log(tmp_path)
        assert str(tmp_path) in str(e.value)
        code = (
            "import sys\nfrom loglake.log import open_log, LogLocked\n"
            "try:\n    open_log(sys.argv[1])\nexcept LogLocked:\n    sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60)
        assert proc.returncode == 3
    with open_log(tmp_path):  # released on close
        pass


def test_append_many_writes_one_batch_with_one_write(tmp_path, monkeypatch):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(durability="none"))
        seg_fd = None
        calls: list[int] = []
        real_write = fs.write

        def spy(fd, data):
            if fd == seg_fd:
                calls.append(len(data))
            return real_write(fd, data)

        seg_fd = log._partition("s", 0).segments[-1].wfd
        monkeypatch.setattr(fs, "write", spy)
        log.append_many("s", [Entry(b"z" * 1024) for _ in range(100)])
        assert len(calls) == 1 and calls[0] > 100 * 1024


def test_readers_see_only_records_an_fsync_has_covered(tmp_path, monkeypatch):
    """A record written but not yet fsynced is invisible: a crash could still take it back
    and give its index to another record (batch durability)."""
    log = SegmentLog(tmp_path)
    log.create_stream("s")
    log.append("s", b"durable")
    in_sync, release = hold_fdatasync(monkeypatch)
    t = threading.Thread(target=log.append, args=("s", b"pending"))
    t.start()
    assert in_sync.wait(10)
    assert [r.data for r in log.read("s", 0)] == [b"durable"]
    release.set()
    t.join(10)
    monkeypatch.undo()  # fdatasync as it was
    assert [r.data for r in log.read("s", 0)] == [b"durable", b"pending"]
    log.close()


def test_open_checks_only_the_tail_after_the_last_good_index_entry(tmp_path):
    """Recovery scans from the newest sparse-index entry that checks out; damage before it
    in the active segment is not truncated away (acknowledged records after it stay) but is
    reported when read, like in a sealed segment."""
    with open_log(tmp_path) as log:
        log.create_stream("s")
        log.append_many("s", [Entry(b"r" * 1000 + b"%d" % i) for i in range(40)])
    seg = seg_files(tmp_path)[-1]
    raw = bytearray(seg.read_bytes())
    raw[FRAME_HEAD.size + 20] ^= 0x01  # inside record 0
    seg.write_bytes(bytes(raw))
    with open_log(tmp_path) as log:
        assert log.next_index("s") == 40
        assert seg.stat().st_size == len(raw)
        assert log.read("s", 39)[0].data == b"r" * 1000 + b"39"
        with pytest.raises(CorruptSegment) as e:
            log.read("s", 0, limit=1)
        assert e.value.offset == 0


def test_a_wrong_index_entry_falls_back_to_a_full_scan(tmp_path):
    import struct

    with open_log(tmp_path) as log:
        log.create_stream("s")
        log.append_many("s", [Entry(b"q" * 1000) for _ in range(20)])
    seg = seg_files(tmp_path)[-1]
    idx = seg.with_suffix(".idx")
    idx.write_bytes(struct.pack("<QQ", 0, 0) + struct.pack("<QQ", 5, 3000))  # wrong record
    with open(seg, "ab") as f:
        f.write(b"\x10\x00")  # and a torn tail
    with open_log(tmp_path) as log:
        assert log.next_index("s") == 20
        assert [r.index for r in log.read("s", 3, limit=3)] == [3, 4, 5]
    assert seg.stat().st_size == 20 * (FRAME_HEAD.size + 19 + 1000)  # the torn bytes are gone


def test_age_retention_after_reopen_sees_every_timestamp_of_a_segment(tmp_path):
    """Timestamps are the writer's: a segment's newest record may be at its start. A segment
    whose tail was the only part scanned on open must not be judged by its tail alone."""
    base, ms = 1_000_000_000_000, 1_000_000
    cfg = StreamConfig(segment_bytes=30_000, retention_ms=50, seal_to_lake=False)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        log.append("s", b"n" * 1000, timestamp_ns=base + 100 * ms)  # new, first
        log.append_many("s", [Entry(b"o" * 1000, timestamp_ns=base) for _ in range(20)])
    with open_log(tmp_path) as log:
        log.append_many("s", [Entry(b"x" * 1000, timestamp_ns=base + 100 * ms)] * 20)
        assert len(seg_files(tmp_path)) == 2
        assert log.enforce_retention(now_ns=base + 120 * ms) == 0
        assert log.read("s", 0, limit=1)[0].data == b"n" * 1000


@pytest.mark.slow
def test_readonly_reader_in_this_process_follows_a_writer_process(tmp_path):
    """The Spark/CLI case: a writer process appends (and rolls, and seals) while this process
    reads the same data dir read-only; every record read is whole and correct."""
    import signal
    import time

    from tests.log import crash_writer as cw

    proc = subprocess.Popen(
        [sys.executable, cw.__file__, str(tmp_path), "0", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"opening\n"
        assert proc.stdout.readline() == b"ready\n"
        seen = {p: 0 for p in range(cw.PARTITIONS)}
        with open_log(tmp_path, readonly=True) as ro:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                for p in range(cw.PARTITIONS):
                    for r in ro.read(cw.STREAM, seen[p], limit=500, partition=p):
                        assert r.index == seen[p]
                        w, s = map(int, r.key.split(b":"))
                        assert (r.data, r.key, r.headers) == cw.expected(w, s)
                        seen[p] += 1
        assert sum(seen.values()) > 0
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)


def test_a_failed_fsync_fails_the_partition_until_it_reopens(tmp_path, monkeypatch):
    import errno

    from loglake.log import StorageFailed
    from loglake.log.reopen import REOPEN_FIRST_S
    from tests.log.clock import ManualClock

    clock = ManualClock()
    log = SegmentLog(tmp_path, clock=clock)
    log.create_stream("s", StreamConfig(partitions=2))
    log.append("s", b"ok")

    def eio(fd):
        raise OSError(errno.EIO, "injected EIO")

    monkeypatch.setattr(fs, "fdatasync", eio)
    with pytest.raises(StorageFailed):
        log.append("s", b"lost?")
    monkeypatch.undo()  # fdatasync as it was
    with pytest.raises(StorageFailed):  # no silent retry of an fsync that failed
        log.append("s", b"next")
    assert log.append("s", b"other partition", partition=1) == 0
    assert [r.data for r in log.read("s", 0)] == [b"ok"]  # never covered by an fsync
    clock.advance(REOPEN_FIRST_S)  # reopened from disk (tests/log/test_reopen.py)
    assert log.append("s", b"reopened") >= 1
    log.close()
    with open_log(tmp_path) as log:
        assert log.read("s", 0)[0].data == b"ok"
        nxt = log.next_index("s")
        assert log.append("s", b"after reopen") == nxt


def test_a_write_that_fails_midway_is_cut_off(tmp_path, monkeypatch):
    import errno

    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(durability="none"))
    log.append("s", b"first")
    real = fs.write
    seg_fd = log._partition("s", 0).segments[-1].wfd

    def half_then_enospc(fd, data):
        if fd == seg_fd:
            if len(data) > 100:
                return real(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "injected ENOSPC")
        return real(fd, data)

    monkeypatch.setattr(fs, "write", half_then_enospc)
    with pytest.raises(OSError):
        log.append("s", b"x" * 500)
    monkeypatch.setattr(fs, "write", real)
    assert log.append("s", b"second") == 1
    assert [r.data for r in log.read("s", 0)] == [b"first", b"second"]
    log.close()
    with open_log(tmp_path) as log:
        assert [r.data for r in log.read("s", 0)] == [b"first", b"second"]


@pytest.mark.parametrize("keyed", [False, True], ids=["c-framer", "python-encoder"])
def test_a_batch_with_a_timestamp_outside_int64_writes_nothing(tmp_path, keyed):
    # a batch this large is written a chunk at a time (partition.CHUNK_BYTES): the bad
    # timestamp in its last entry is refused before the first chunk is written
    key = b"k" if keyed else None
    entries = [Entry(b"z" * 1024, key=key, timestamp_ns=i) for i in range(1000)]
    entries.append(Entry(b"last", key=key, timestamp_ns=2**63))
    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(durability="batch"))
    log.append("s", b"first")
    size = log.stream_info("s").partitions[0].bytes
    with pytest.raises(InvalidTimestamp):
        log.append_many("s", entries)
    assert log.stream_info("s").partitions[0].bytes == size
    assert log.append("s", b"second") == 1
    log.close()
    with open_log(tmp_path) as log:
        assert [r.data for r in log.read("s", 0)] == [b"first", b"second"]


@pytest.mark.parametrize("plain", [True, False], ids=["plain-fast-path", "keyed-row-path"])
def test_sealing_both_paths_give_the_same_rows_as_the_log(tmp_path, plain):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=3000))
        for i in range(60):
            if plain:
                log.append("s", payload(i), timestamp_ns=i)
            else:
                log.append("s", payload(i), key=b"k", headers=(("h", b"%d" % i),))
        log.wait_for_seals()
        segs = seg_files(tmp_path)
        sealed_upto = int(segs[-1].stem)
        expect = log.read("s", 0, end=sealed_upto)
    rows = pq.read_table(tmp_path / "lake" / "s", partitioning=None).to_pylist()
    assert len(rows) == sealed_upto > 0
    for row, rec in zip(rows, expect, strict=True):
        assert (row["index"], row["timestamp_ns"], row["key"], row["data"]) == (
            rec.index,
            rec.timestamp_ns,
            rec.key,
            rec.data,
        )
        assert [(h["key"], h["value"]) for h in row["headers"]] == list(rec.headers)


@pytest.mark.parametrize("plain", [True, False], ids=["plain-fast-path", "keyed-row-path"])
def test_sealing_a_damaged_segment_is_corrupt_segment_and_writes_nothing(tmp_path, plain):
    from loglake.log.lake import seal_segment

    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=1 << 20, seal_to_lake=False))
        for i in range(20):
            log.append("s", payload(i), key=None if plain else b"k")
    seg = seg_files(tmp_path)[0]
    raw = bytearray(seg.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    seg.write_bytes(bytes(raw))
    out = tmp_path / "out"
    with pytest.raises(CorruptSegment) as e:
        seal_segment(seg, 0, 20, out, "s", 0)
    assert e.value.path == str(seg)
    assert not out.exists() or not list(out.iterdir())


def test_readonly_reader_survives_the_writer_deleting_segments(tmp_path):
    writer = open_log(tmp_path)
    writer.create_stream("s", StreamConfig(segment_bytes=500, retention_records=5))
    fill(writer, 60)
    reader = open_log(tmp_path, readonly=True)
    before = reader.read("s", 0)
    assert len(before) == 60
    writer.enforce_retention()
    assert int(seg_files(tmp_path)[0].stem) > 0  # old segments are gone from disk
    assert reader.read("s", 0) == before  # served from the lake now
    assert reader.stream_info("s").partitions[0].first_index == 0
    reader.close()
    writer.close()


def test_a_long_lake_read_does_not_hold_up_appends(tmp_path, monkeypatch):
    import loglake.log.lake as lake_mod

    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(segment_bytes=500, retention_records=5))
    fill(log, 60)
    log.enforce_retention()  # the first records now live only in the lake
    in_read, release = threading.Event(), threading.Event()
    real = lake_mod.pq.read_table

    def slow_read_table(*a, **kw):
        in_read.set()
        assert release.wait(10)
        return real(*a, **kw)

    monkeypatch.setattr(lake_mod.pq, "read_table", slow_read_table)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(log.read("s", 0, limit=3)))
    reader.start()
    assert in_read.wait(10)
    assert log.append("s", b"while the lake is read") == 60  # not blocked by the reader
    release.set()
    reader.join(10)
    assert [r.index for r in got] == [0, 1, 2]
    log.close()


def test_appends_reads_seals_and_retention_race_safely(tmp_path):
    """Appenders, a reader and retention on one partition at once (bounded loops): every read
    is a contiguous run of whole, correct records, and nothing raises."""
    import random

    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(segment_bytes=2000, retention_records=50))
    errors: list[BaseException] = []
    stop = threading.Event()

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # surfaced below
                errors.append(e)
                stop.set()

        return run

    def appender(t: int):
        for i in range(150):
            log.append_many("s", [Entry(b"%d:%d:%d" % (t, i, k), key=b"k") for k in range(3)])

    def reader():
        rnd = random.Random(5)
        while not stop.is_set():
            nxt = log.next_index("s")
            start = rnd.randrange(0, nxt + 1)
            got = log.read("s", start, limit=rnd.randint(1, 40))
            if got:
                first = got[0].index
                assert first >= start  # Ockam: never lower than the index asked for
                assert [r.index for r in got] == list(range(first, first + len(got)))
                assert all(r.key == b"k" and r.data.count(b":") == 2 for r in got)

    def retention():
        while not stop.is_set():
            log.enforce_retention()

    workers = [threading.Thread(target=guard(lambda t=t: appender(t))) for t in range(2)]
    others = [threading.Thread(target=guard(reader)), threading.Thread(target=guard(retention))]
    for th in workers + others:
        th.start()
    for th in workers:
        th.join(60)
    stop.set()
    for th in others:
        th.join(60)
    assert not errors, errors
    assert log.next_index("s") == 2 * 150 * 3
    assert len(log.read("s", 0)) == 900  # all still readable: the lake kept what went
    log.close()


def test_lake_compaction_by_another_process_is_read_once_and_survives_removals(tmp_path):
    """The cover rule shared with ``loglake.pipeline.lake``: a compaction writes one file
    spanning several sealed ones, then removes them; readers see each index once throughout,
    and lake retention removes a compacted file together with what it covers."""
    import pyarrow as pa

    from loglake.log.lake_schema import lake_partition_dir

    base, ms = 1_000_000_000_000, 1_000_000
    log = SegmentLog(tmp_path)
    log.create_stream("s", StreamConfig(segment_bytes=600, retention_records=5))
    fill(log, 60, ts=lambda i: base + i * ms)
    log.enforce_retention(now_ns=base)
    expect = log.read("s", 0)
    lake = lake_partition_dir(tmp_path, "s", 0)
    small = sorted(lake.glob("*.parquet"))
    assert len(small) >= 3
    first, last = (int(x) for x in small[1].stem.split("-")[:1] + small[2].stem.split("-")[1:])
    merged = pa.concat_tables([pq.read_table(p, partitioning=None) for p in small[1:3]])
    pq.write_table(merged, lake / lake_file_name(first, last))  # the compaction's new file
    assert log.read("s", 0) == expect  # small files still there: each index once
    reader = open_log(tmp_path, readonly=True)
    assert reader.read("s", 0) == expect
    for p in small[1:3]:
        p.unlink()  # the compaction's grace period is over
    assert log.read("s", 0) == expect
    assert reader.read("s", 0) == expect
    reader.close()
    # lake retention: everything up to the compacted file's range is older than the window
    log.close()
    cfg_path = tmp_path / "streams" / "s" / "config.json"
    from dataclasses import replace

    from loglake.log.segment_log import config_from_json, config_to_json

    cfg = config_from_json(cfg_path.read_bytes())
    cfg_path.write_bytes(config_to_json(replace(cfg, lake_retention_ms=1)))
    with open_log(tmp_path) as log:
        log.enforce_retention(now_ns=base + (last + 2) * ms)
        assert log.stream_info("s").partitions[0].first_index > last
        assert not [p for p in lake.glob("*.parquet") if int(p.stem.split("-")[1]) <= last]


def test_lake_files_that_overlap_without_containment_are_corrupt_store(tmp_path):
    from loglake.log import CorruptStore
    from loglake.log.lake_schema import lake_partition_dir

    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=600))
        fill(log, 40)
    lake = lake_partition_dir(tmp_path, "s", 0)
    b = sorted(lake.glob("*.parquet"))[1]
    first_b, last_b = (int(x) for x in b.stem.split("-"))
    (lake / lake_file_name(first_b - 1, last_b + 1)).write_bytes(b.read_bytes())
    with open_log(tmp_path) as log, pytest.raises(CorruptStore):
        log.read("s", 0)  # found as the partition opens, on first use


def test_truncate_before_keeps_lake_history_readable_and_survives_reopen(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=800))
        fill(log, 80)
        before = log.read("s", 0)
        lake = tmp_path / "lake" / "s" / "partition=0"
        segs = [int(p.stem) for p in seg_files(tmp_path)]
        assert len(segs) > 3
        cut = segs[2] + 1  # inside the third segment: it must stay whole
        dropped = log.truncate_before("s", cut)
        assert dropped == segs[2]  # the first two segments' records left the live log
        assert [int(p.stem) for p in seg_files(tmp_path)] == segs[2:]
        lake_files = sorted(p.name for p in lake.iterdir())
        assert lake_files  # the lake is not touched: the history stays readable there
        assert log.read("s", 0) == before
        assert log.stream_info("s").partitions[0].first_index == 0
    with open_log(tmp_path) as log:
        assert [int(p.stem) for p in seg_files(tmp_path)] == segs[2:]
        assert sorted(p.name for p in lake.iterdir()) == lake_files
        assert log.read("s", 0) == before
        assert log.append("s", b"x") == 80


def test_truncate_before_without_lake_removes_history_for_good(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=800, seal_to_lake=False))
        fill(log, 80)
        before = log.read("s", 0)
        segs = [int(p.stem) for p in seg_files(tmp_path)]
        assert log.truncate_before("s", segs[3]) == segs[3]
    assert not (tmp_path / "lake" / "s").exists() or not any((tmp_path / "lake" / "s").iterdir())
    with open_log(tmp_path) as log:
        assert log.stream_info("s").partitions[0].first_index == segs[3]
        assert log.read("s", 0) == before[segs[3] :]
    with open_log(tmp_path, readonly=True) as reader, pytest.raises(ReadOnlyLog):
        reader.truncate_before("s", 50)


def test_truncate_before_waits_for_the_sealer_before_dropping(tmp_path):
    # A segment is dropped only once the lake holds it: truncate drains the sealer first.
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=800))
        fill(log, 80)
        active = int(seg_files(tmp_path)[-1].stem)
        assert log.truncate_before("s", 80) == active
        assert [int(p.stem) for p in seg_files(tmp_path)] == [active]
        assert [r.index for r in log.read("s", 0)] == list(range(80))


def test_a_damaged_lake_file_is_corrupt_segment_naming_it(tmp_path):
    """History served from the lake: a truncated Parquet file is a typed error naming the file,
    not a pyarrow exception, and the live segments still read."""
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=800))
        fill(log, 80)
        segs = [int(p.stem) for p in seg_files(tmp_path)]
        log.truncate_before("s", segs[2])  # the first two segments now live only in the lake
        lake = sorted((tmp_path / "lake" / "s" / "partition=0").iterdir())
        victim = lake[0]
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        with pytest.raises(CorruptSegment) as err:
            log.read("s", 0, limit=5)
        assert str(victim) in str(err.value)
        assert [r.index for r in log.read("s", segs[2], limit=3)] == [
            segs[2],
            segs[2] + 1,
            segs[2] + 2,
        ]


def test_fsync_count_counts_the_fsyncs_of_always_appends_too(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("a", StreamConfig(durability="always"))
        for i in range(3):
            log.append("a", b"%d" % i)
        assert log.fsync_count("a") == 3


def test_grow_stream_is_durable_and_leaves_existing_partitions_as_they_were(tmp_path):
    """The Ockam reference grows a stream on a CREATE for more partitions
    (stream/workers/service.ex ``ensure_streams``); here the count lives in ``config.json``,
    rewritten whole, and nothing of partition 0 (segments, sparse indexes, lake) moves."""
    cfg = StreamConfig(segment_bytes=800, retention_records=5)
    with open_log(tmp_path) as log:
        log.create_stream("s", cfg)
        fill(log, 80)  # rolls segments; the rolled ones are sealed to the lake
        log.save_index("c", "s", 40)
        log.wait_for_seals()
        before = log.read("s", 0)
    kept = [*part_dir(tmp_path).iterdir(), *(tmp_path / "lake").rglob("*.parquet")]
    files = {p: p.read_bytes() for p in kept}
    assert len(files) > 4
    with open_log(tmp_path) as log:
        reader = open_log(tmp_path, readonly=True)
        assert reader.partition_count("s") == 1
        log.grow_stream("s", 3)
        assert reader.partition_count("s") == 3  # a reader follows the writer's growth
        assert log.append("s", b"p2", partition=2) == 0
        assert reader.read_payloads("s", 0, partition=2) == [(0, b"p2")]
        reader.close()
    # partition 0's segments, sparse indexes and lake files are byte for byte as they were
    assert {p: p.read_bytes() for p in files} == files
    with open_log(tmp_path) as log:  # after a restart
        assert log.stream_info("s").config == dataclasses.replace(cfg, partitions=3)
        assert log.read("s", 0) == before
        assert log.get_index("c", "s") == 40
        assert log.read_payloads("s", 0, partition=2) == [(0, b"p2")]
        assert log.partition_count("s") == 3


def test_grow_stream_keeps_to_the_partition_quotas(tmp_path):
    with open_log(tmp_path, max_partitions_per_stream=4, max_partitions_total=6) as log:
        log.create_stream("a", StreamConfig(partitions=2))
        log.create_stream("b", StreamConfig(partitions=2))
        with pytest.raises(QuotaExceeded, match="max_partitions_per_stream"):
            log.grow_stream("a", 5)
        log.grow_stream("a", 4)  # 2 more: 6 of 6
        assert log.partition_count("a") == 4
        with pytest.raises(QuotaExceeded, match="holds 6 of at most 6"):
            log.grow_stream("b", 3)
        assert log.partition_count("b") == 2
    with open_log(tmp_path, readonly=True) as reader, pytest.raises(ReadOnlyLog):
        reader.grow_stream("a", 5)


def test_a_retention_stored_before_its_bound_opens_as_the_longest_one(tmp_path):
    """An earlier loglake stored ``retention_ms`` up to 2**62 (the node API's old bound); the
    config now refuses more than ``MAX_RETENTION_MS`` (int64 nanoseconds), and such a stored
    stream still opens, with the longest retention (292 years: as long, for any record)."""
    import json

    from loglake.log.api import MAX_RETENTION_MS
    from loglake.log.segment_log import CONFIG_CHECKSUM, _config_crc, config_from_json

    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(retention_ms=1000))
        log.append("s", b"kept")
    path = tmp_path / "streams" / "s" / "config.json"
    d = json.loads(path.read_bytes())
    d.pop(CONFIG_CHECKSUM)
    d["retention_ms"] = 2**62
    path.write_text(json.dumps({**d, CONFIG_CHECKSUM: _config_crc(d)}))
    assert config_from_json(path.read_bytes()).retention_ms == MAX_RETENTION_MS
    with open_log(tmp_path) as log:
        assert [r.data for r in log.read("s", 0, 10)] == [b"kept"]
