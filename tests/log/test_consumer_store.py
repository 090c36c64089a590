"""Consumer indexes on disk (``consumer_store.py``): durable, monotonic, crash-safe; and the
two small derived structures the engine relies on (group commit, sparse index)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.log import StreamConfig, open_log
from loglake.log.consumer_store import FILE_NAME, ConsumerStore, decode_entries, encode_entry
from loglake.log.group_commit import GroupCommit
from loglake.log.sparse_index import INTERVAL_BYTES, SparseIndex


def test_consumer_indexes_survive_reopen_and_stay_monotonic(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(partitions=2))
        log.save_index("a", "s", 3)
        log.save_index("a", "s", 8)
        log.save_index("b", "s", 2, partition=1)
    with open_log(tmp_path) as log:
        assert log.get_index("a", "s") == 8
        assert log.get_index("b", "s", partition=1) == 2
        size = (tmp_path / FILE_NAME).stat().st_size
        assert log.save_index("a", "s", 7) == 8  # lower: the stored index, unchanged
        assert log.get_index("a", "s") == 8
        assert (tmp_path / FILE_NAME).stat().st_size == size  # and nothing was written
    with open_log(tmp_path) as log:
        assert log.get_index("a", "s") == 8


def test_store_is_compacted_on_open(tmp_path):
    store = ConsumerStore(tmp_path, readonly=False)
    for i in range(100):
        store.save("c", "s", 0, i)
    store.close()
    assert (tmp_path / FILE_NAME).stat().st_size == 100 * len(encode_entry("c", "s", 0, 0))
    ConsumerStore(tmp_path, readonly=False).close()
    assert (tmp_path / FILE_NAME).read_bytes() == encode_entry("c", "s", 0, 99)


def test_torn_tail_of_the_store_is_dropped_at_every_byte(tmp_path):
    whole = encode_entry("c", "s", 0, 5) + encode_entry("c", "s", 0, 6)
    first = len(encode_entry("c", "s", 0, 5))
    for cut in range(first, len(whole)):
        (tmp_path / FILE_NAME).write_bytes(whole[:cut])
        store = ConsumerStore(tmp_path, readonly=False)
        assert store.get("c", "s", 0) == 5
        store.close()
        assert (tmp_path / FILE_NAME).read_bytes() == whole[:first]


def test_readonly_store_reads_without_writing(tmp_path):
    (tmp_path / FILE_NAME).write_bytes(encode_entry("c", "s", 0, 5) + b"\x01\x02")
    store = ConsumerStore(tmp_path, readonly=True)
    assert store.get("c", "s", 0) == 5
    assert (tmp_path / FILE_NAME).read_bytes().endswith(b"\x01\x02")


@given(st.binary(max_size=200))
def test_store_decoder_never_raises_on_garbage(raw):
    values, used = decode_entries(raw)
    assert 0 <= used <= len(raw)
    assert all(isinstance(v, int) for v in values.values())


def test_group_commit_acknowledges_only_after_a_covering_sync():
    gc = GroupCommit()
    written = [0]
    started = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def slow_sync() -> int:
        covered = written[0]
        started.set()
        release.wait(10)
        order.append(f"synced {covered}")
        return covered

    written[0] = 1
    a = threading.Thread(target=lambda: (gc.wait_durable(1, slow_sync), order.append("ack 1")))
    a.start()
    assert started.wait(10)
    written[0] = 2  # write 2 lands while the fsync for 1 is running: it needs another fsync
    b = threading.Thread(target=lambda: (gc.wait_durable(2, slow_sync), order.append("ack 2")))
    b.start()
    release.set()
    a.join(10)
    b.join(10)
    assert order.index("synced 1") < order.index("ack 1")
    assert order.index("synced 2") < order.index("ack 2")
    assert gc.fsyncs == 2 and gc.synced == 2


def test_group_commit_waiters_share_one_sync():
    gc = GroupCommit()
    gc.wait_durable(3, lambda: 5)  # one fsync covering writes up to 5
    gc.wait_durable(4, lambda: pytest.fail("4 is already covered"))
    gc.wait_durable(5, lambda: pytest.fail("5 is already covered"))
    assert gc.fsyncs == 1


def test_group_commit_failed_sync_does_not_acknowledge():
    gc = GroupCommit()

    def boom() -> int:
        raise OSError("EIO")

    with pytest.raises(OSError):
        gc.wait_durable(1, boom)
    assert gc.synced == 0
    gc.wait_durable(1, lambda: 1)
    assert gc.synced == 1


def test_sparse_index_floor_is_a_binary_search_over_sparse_entries():
    idx = SparseIndex()
    pos = 0
    for i in range(1000):
        idx.maybe_add(i, pos)
        pos += 1000
    assert len(idx) < 1000 // (INTERVAL_BYTES // 1000) + 2
    assert idx.floor(-1) == (-1, 0)
    assert idx.floor(0) == (0, 0)
    i, p = idx.floor(777)
    assert i <= 777 and p == i * 1000 and 777 - i < INTERVAL_BYTES // 1000 + 1
    parsed = SparseIndex.parse(idx.to_bytes(), 0, pos)
    assert parsed is not None and parsed.indexes == idx.indexes
    assert SparseIndex.parse(idx.to_bytes()[16:] + idx.to_bytes()[:16], 0, pos) is None
    short = SparseIndex.parse(idx.to_bytes(), 0, 500_000)
    assert short is not None and max(short.positions) < 500_000


def test_damage_before_the_tail_of_the_store_is_refused_not_dropped(tmp_path):
    from loglake.log import CorruptStore

    entries = b"".join(encode_entry(f"c{i}", "s", 0, i) for i in range(5000))
    bad = bytearray(entries)
    bad[10] ^= 0xFF  # inside the first entry: dropping the rest would lose 4999 indexes
    (tmp_path / FILE_NAME).write_bytes(bytes(bad))
    with pytest.raises(CorruptStore) as e:
        ConsumerStore(tmp_path, readonly=False)
    assert e.value.path == str(tmp_path / FILE_NAME)
    assert (tmp_path / FILE_NAME).read_bytes() == bytes(bad)  # left for a human to look at


def test_stream_config_bit_rot_that_leaves_valid_json_is_corrupt_store(tmp_path):
    """A flipped digit or key name still parses as JSON; the checksum catches it (issue 17:
    a flipped key name once turned 2 partitions into 1 without an error)."""
    import json

    from loglake.log import CorruptStore, StreamConfig

    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(partitions=2))
    cfg = tmp_path / "streams" / "s" / "config.json"
    good = cfg.read_bytes()
    for old, new in ((b'"partitions": 2', b'"partitions": 3'), (b'"partitions"', b'"partitionz"')):
        assert old in good
        cfg.write_bytes(good.replace(old, new))
        with pytest.raises(CorruptStore) as e:
            open_log(tmp_path)
        assert e.value.path == str(cfg)
    # a config written before the checksum existed is still read when every key is known
    legacy = json.loads(good)
    del legacy["crc32c"]
    cfg.write_text(json.dumps(legacy))
    with open_log(tmp_path) as log:
        assert log.stream_info("s").config.partitions == 2
    legacy["partitionz"] = legacy.pop("partitions")
    cfg.write_text(json.dumps(legacy))
    with pytest.raises(CorruptStore):
        open_log(tmp_path)


def test_damaged_stream_config_is_corrupt_store(tmp_path):
    from loglake.log import CorruptStore

    with open_log(tmp_path) as log:
        log.create_stream("s")
    cfg = tmp_path / "streams" / "s" / "config.json"
    for garbage in (b"{not json", b'{"partitions": 0}', b"[1, 2]"):
        cfg.write_bytes(garbage)
        with pytest.raises(CorruptStore) as e:
            open_log(tmp_path)
        assert e.value.path == str(cfg)
    with pytest.raises(CorruptStore):  # readers say so too, when they get to the stream
        open_log(tmp_path, readonly=True).streams()


def test_a_save_refused_by_a_full_disk_leaves_no_partial_entry_and_saves_resume(
    tmp_path, monkeypatch
):
    """ENOSPC part-way through a write (nothing fsynced yet): that save fails with the disk's
    error, its partial entry is cut off, and the next save works once space frees; only a
    failed fsync stops saves until the store reopens (``test_durability``, ``test_reopen``)."""
    import errno

    from loglake.log import fs

    store = ConsumerStore(tmp_path, readonly=False)
    store.save("c", "s", 0, 1)
    size = (tmp_path / FILE_NAME).stat().st_size
    real_write = fs.write

    def half_then_full(fd, data):
        monkeypatch.setattr(fs, "write", real_write)  # the disk frees after this call
        real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fs, "write", half_then_full)
    with pytest.raises(OSError) as e:
        store.save("c", "s", 0, 2)
    assert e.value.errno == errno.ENOSPC
    assert (tmp_path / FILE_NAME).stat().st_size == size  # the partial entry is gone
    assert store.get("c", "s", 0) == 1
    assert store.save("c", "s", 0, 3) == 3
    store.close()
    reopened = ConsumerStore(tmp_path, readonly=True)
    assert reopened.get("c", "s", 0) == 3


def test_a_short_watermark_slot_write_is_an_error_not_a_publish(tmp_path, monkeypatch):
    from loglake.log import fs
    from loglake.log.watermark import MarkWriter

    writer = MarkWriter(tmp_path)
    writer.put(0, 10, 1)
    before = writer.mark
    monkeypatch.setattr(fs, "pwrite", lambda fd, data, off: len(data) - 1)
    with pytest.raises(OSError, match="short write"):
        writer.put(0, 20, 2)
    assert writer.mark == before
    monkeypatch.undo()
    writer.close()


def test_a_group_of_saves_answers_as_one_by_one_and_is_durable(tmp_path):
    """``apply`` (the index service's group commit): each get and save answered as it would be
    alone, in order — monotonic, a get after a save in the group sees it, owners checked per
    save — with the group's saves in one write; all of it there after a reopen."""
    from loglake.log.api import IndexOp, NotOwner

    store = ConsumerStore(tmp_path, readonly=False)
    store.save("a", "s", 0, 10)
    size = (tmp_path / FILE_NAME).stat().st_size
    got = store.apply(
        [
            IndexOp("a", "s", 0, 4),  # lower: the stored 10, nothing written
            IndexOp("b", "s", 0),  # never saved
            IndexOp("b", "s", 0, 3),
            IndexOp("b", "s", 0),  # sees the save before it
            IndexOp("b", "s", 0, 2),  # lower than the save before it in the group
            IndexOp("b", "s", 1, 7, owner="cn:bob"),
            IndexOp("b", "s", 1, 8, owner="cn:eve"),  # owned by bob since the save before
            IndexOp("b", "s", 1, 9, owner="cn:eve", override=True),
            IndexOp("c", "s", 0, -1),
        ]
    )
    assert got[:6] == [10, None, 3, 3, 3, 7]
    assert isinstance(got[6], NotOwner) and got[7] == 9 and isinstance(got[8], ValueError)
    written = [("b", "s", 0, 3, ""), ("b", "s", 1, 7, "cn:bob"), ("b", "s", 1, 9, "")]
    tail = b"".join(encode_entry(c, s, p, i, 0, o) for c, s, p, i, o in written)
    assert (tmp_path / FILE_NAME).read_bytes()[size:] == tail  # one entry per stored change
    store.close()
    store = ConsumerStore(tmp_path, readonly=False)
    assert store.all() == {("a", "s", 0): 10, ("b", "s", 0): 3, ("b", "s", 1): 9}
    assert store.owner("b", "s", 1) == "cn:bob"
    store.close()


def _crashed_in_a_group(tmp_path, raw: bytes, start: int, end: int) -> None:
    """The files as a power loss during a group's write leaves them: the store's bytes, and the
    durable mark announcing the write from ``start`` to ``end`` (``_write_entries``)."""
    from loglake.log import watermark
    from loglake.log.consumer_store import DURABLE_FILE

    (tmp_path / FILE_NAME).write_bytes(raw)
    mark = watermark.MarkWriter(tmp_path, DURABLE_FILE)
    mark.put(0, start, end)
    mark.sync()
    mark.close()


def test_a_group_torn_anywhere_is_dropped_and_damage_outside_it_is_refused(tmp_path):
    """A power loss may keep any sectors of a group's write and not others: a lost sector
    leaves a bad entry with valid ones after it. Inside the write the mark announced, with
    nothing past it, that is the torn write (dropped from the first bad entry: none of it was
    acknowledged); a bad entry before it, or bytes past its end, are damage (``CorruptStore``)."""
    from loglake.log import CorruptStore
    from loglake.log.api import IndexOp

    store = ConsumerStore(tmp_path, readonly=False)
    store.save("a", "s", 0, 5)
    start = (tmp_path / FILE_NAME).stat().st_size
    assert store.apply([IndexOp(f"g{i:02d}-" + "x" * 100, "s", 0, i + 1) for i in range(40)])
    store.close()
    whole = (tmp_path / FILE_NAME).read_bytes()
    end = len(whole)
    entry = len(encode_entry("g00-" + "x" * 100, "s", 0, 1))
    for hole in range(start, end, 512):
        raw = whole[:hole] + bytes(min(512, end - hole)) + whole[hole + 512 :]
        _crashed_in_a_group(tmp_path, raw, start, end)
        store = ConsumerStore(tmp_path, readonly=False)
        kept = store.all()
        store.close()
        assert kept[("a", "s", 0)] == 5
        groups = sorted(v for (c, _, _), v in kept.items() if c != "a")
        assert groups == list(range(1, len(groups) + 1))  # the entries before the hole
        assert len(groups) == (hole - start) // entry
    raw = whole[:start] + bytes(512) + whole[start + 512 :]
    for damaged, _why in [
        (b"\xff" + whole[1:], "before the announced write"),
        (raw + encode_entry("late", "s", 0, 1), "a write past its end"),
    ]:
        _crashed_in_a_group(tmp_path, damaged, start, end)
        with pytest.raises(CorruptStore):
            ConsumerStore(tmp_path, readonly=False)
