"""Power loss under the log, on a simulated disk (issue 17, "Tests that would have caught these").

The first half tests the simulator itself (``tests/log/simdisk.py``): what an fsync keeps and
what a power loss may take. The second half drives the log with seeded random workloads and
loses power at random points; after each recovery a checker holds the log to its promises:

- every acknowledged record is present and identical (records ``truncate_before`` may have
  dropped excepted), and so is every record a reader was served (it was durable);
- no index is reused: a record at an index equals the one acknowledged there, and the next index
  is past every acknowledged one;
- a consumer index never moves back below an acknowledged save (or a value read before);
- plain power loss never yields ``CorruptSegment``/``CorruptStore``: those are for real damage.

Every failure names the seed and the command that replays it.
"""

from __future__ import annotations

import os
import random

import pytest

from loglake.log import fs
from tests.log.simdisk import SECTOR, PowerLoss, SimDisk


def _create(path, data: bytes = b"") -> int:
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if data:
        fs.write_all(fd, data)
    return fd


def _files(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


# -- the simulated disk --------------------------------------------------------------------------


def test_an_unsynced_write_can_be_lost_and_a_reader_sees_it_before_the_crash(tmp_path):
    with SimDisk(tmp_path) as disk:
        fd = _create(disk.root / "f")
        fs.fsync_dir(disk.root)
        fs.write(fd, b"x" * 100)
        assert fs.read_file(disk.root / "f") == b"x" * 100  # the page cache serves reads
        disk.restart(random.Random(1), file_mode="none")
        assert _files(disk.root) == {"f": b""}


def test_an_fsynced_write_is_kept_by_every_power_loss(tmp_path):
    with SimDisk(tmp_path) as disk:
        for seed in range(40):
            fd = _create(disk.root / f"f{seed}", b"durable" * 100)
            fs.fdatasync(fd)
            fs.fsync_dir(disk.root)
            fs.write(fd, b"pending" * 200)
            disk.restart(random.Random(seed))
            got = _files(disk.root)[f"f{seed}"]
            assert got.startswith(b"durable" * 100), seed


def test_a_new_file_needs_its_folder_fsynced(tmp_path):
    with SimDisk(tmp_path) as disk:
        fd = _create(disk.root / "f", b"data")
        fs.fsync(fd)  # the data is durable, the name is not
        disk.restart(random.Random(0), entries="none")
        assert _files(disk.root) == {}


def test_a_rename_without_a_folder_fsync_can_vanish(tmp_path):
    with SimDisk(tmp_path) as disk:
        fd = _create(disk.root / "f.tmp", b"new")
        fs.fsync(fd)
        fs.close(fd)
        fs.fsync_dir(disk.root)
        fs.replace(disk.root / "f.tmp", disk.root / "f")
        disk.restart(random.Random(0), entries="none")
        assert _files(disk.root) == {"f.tmp": b"new"}
        fs.replace(disk.root / "f.tmp", disk.root / "f")
        fs.fsync_dir(disk.root)
        disk.restart(random.Random(0), entries="none")
        assert _files(disk.root) == {"f": b"new"}


def test_an_unlink_without_a_folder_fsync_can_be_undone(tmp_path):
    with SimDisk(tmp_path) as disk:
        fs.fsync(_create(disk.root / "old", b"old"))
        fs.fsync_dir(disk.root)
        fs.unlink(disk.root / "old")
        disk.restart(random.Random(0), entries="none")
        assert _files(disk.root) == {"old": b"old"}


def test_a_folder_whose_parent_was_not_fsynced_vanishes_with_its_files(tmp_path):
    with SimDisk(tmp_path) as disk:
        fs.mkdir(disk.root / "d")
        fs.fsync(_create(disk.root / "d" / "f", b"data"))
        fs.fsync_dir(disk.root / "d")
        disk.restart(random.Random(0), entries="none")
        assert _files(disk.root) == {}
        fs.makedirs_durable(disk.root / "a" / "b")
        fs.fsync(_create(disk.root / "a" / "b" / "f", b"data"))
        fs.fsync_dir(disk.root / "a" / "b")
        disk.restart(random.Random(0), entries="none")
        assert _files(disk.root) == {"a/b/f": b"data"}


def test_a_torn_write_keeps_whole_sectors(tmp_path):
    data = bytes(range(256)) * 8  # 2048 bytes, written at offset 100
    lengths = set()
    with SimDisk(tmp_path) as disk:
        for seed in range(60):
            fd = _create(disk.root / "f", b"h" * 100)
            fs.fsync(fd)
            fs.fsync_dir(disk.root)
            fs.write(fd, data)
            disk.restart(random.Random(seed), file_mode="prefix")
            got = _files(disk.root)["f"]
            assert got == (b"h" * 100 + data)[: len(got)], seed
            assert len(got) in (100, 100 + len(data)) or len(got) % SECTOR == 0, (seed, len(got))
            lengths.add(len(got))
            fs.unlink(disk.root / "f")
            fs.fsync_dir(disk.root)
    assert {100, 512, 1024, 2048, 2148} <= lengths, lengths


def test_reordered_writeback_can_keep_a_later_sector_without_an_earlier_one(tmp_path):
    holes = 0
    with SimDisk(tmp_path) as disk:
        for seed in range(60):
            fd = _create(disk.root / "f")
            fs.fsync_dir(disk.root)
            fs.write(fd, b"a" * SECTOR)
            fs.write(fd, b"b" * SECTOR)
            disk.restart(random.Random(seed), file_mode="reorder")
            got = _files(disk.root)["f"]
            assert len(got) in (0, SECTOR, 2 * SECTOR), seed
            for i, letter in enumerate((b"a", b"b")[: len(got) // SECTOR]):
                assert got[i * SECTOR : (i + 1) * SECTOR] in (letter * SECTOR, bytes(SECTOR))
            holes += got == bytes(SECTOR) + b"b" * SECTOR
            fs.unlink(disk.root / "f")
            fs.fsync_dir(disk.root)
    assert holes, "reorder never kept the second sector alone"


def test_power_loss_stops_the_call_and_every_later_one(tmp_path):
    with SimDisk(tmp_path) as disk:
        fd = _create(disk.root / "f")  # op 1
        disk.crash_after(2)
        fs.write(fd, b"one")  # op 1 from here
        with pytest.raises(PowerLoss):
            fs.write(fd, b"two")  # op 2: does not happen
        with open(disk.root / "f", "rb") as f:
            assert f.read() == b"one"
        with pytest.raises(PowerLoss):
            fs.pread(fd, 3, 0)
        disk.restart(random.Random(0), file_mode="all", entries="all")
        assert _files(disk.root) == {"f": b"one"}
        fs.write(_create(disk.root / "g"), b"alive again")


def test_fsync_disabled_loses_what_was_fsynced(tmp_path):
    with SimDisk(tmp_path, fsync=False) as disk:
        fd = _create(disk.root / "f", b"data")
        fs.fsync(fd)
        fs.fsync_dir(disk.root)
        disk.restart(random.Random(0), file_mode="none", entries="none")
        assert _files(disk.root) == {}


def test_the_simulator_restores_fs_on_exit(tmp_path):
    before = fs.write
    with SimDisk(tmp_path):
        assert fs.write is not before
    assert fs.write is before
