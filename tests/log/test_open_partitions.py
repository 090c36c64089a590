"""Descriptors and partition quotas of the embedded log: partitions open on first use, an LRU
bounds how many are open, and ``create_stream`` refuses or undoes a stream atomically."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import pytest

from loglake.log import CreateFailed, QuotaExceeded, StreamConfig, open_log
from loglake.log import fs as logfs


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def stream_dirs(data_dir) -> list[str]:
    root = data_dir / "streams"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_creating_4096_partitions_makes_one_folder_and_opens_nothing(tmp_path) -> None:
    before = open_fds()
    with open_log(tmp_path, max_open_partitions=8) as log:
        info = log.create_stream("wide", StreamConfig(partitions=4096))
        assert len(info.partitions) == 4096
        assert all(p.next_index == 0 for p in info.partitions)
        assert log.open_partitions() == 0
        assert open_fds() - before < 20  # was three descriptors per partition (12,288)
        assert sorted(p.name for p in (tmp_path / "streams" / "wide").iterdir()) == ["config.json"]


def test_an_lru_bounds_open_partitions_and_closing_one_loses_nothing(tmp_path) -> None:
    cfg = StreamConfig(partitions=64, durability="batch")
    with open_log(tmp_path, max_open_partitions=4) as log:
        log.create_stream("s", cfg)
        base = open_fds()
        for rnd in range(3):
            for p in range(64):
                assert log.append_payloads("s", [b"%d/%d" % (rnd, p)], partition=p) == [rnd]
                assert log.open_partitions() <= 4
        assert open_fds() - base <= 4 * 4 + 4  # four per open partition, a few spare
        for p in range(64):  # read back through evictions: every acknowledged record is there
            assert [d for _, d in log.read_payloads("s", 0, 10, partition=p)] == [
                b"%d/%d" % (r, p) for r in range(3)
            ]
        info = log.stream_info("s")  # answered without opening all 64
        assert [p.next_index for p in info.partitions] == [3] * 64
        assert log.open_partitions() <= 4
    with open_log(tmp_path, max_open_partitions=4) as log:  # and after a restart
        assert [p.next_index for p in log.stream_info("s").partitions] == [3] * 64
        assert log.read_payloads("s", 2, 1, partition=63) == [(2, b"2/63")]


def test_quota_per_stream_refuses_and_makes_nothing(tmp_path) -> None:
    with open_log(tmp_path, max_partitions_per_stream=16) as log:
        with pytest.raises(QuotaExceeded, match="max_partitions_per_stream"):
            log.create_stream("big", StreamConfig(partitions=17))
        assert log.streams() == [] and stream_dirs(tmp_path) == []
        log.create_stream("ok", StreamConfig(partitions=16))
        assert log.streams() == ["ok"]


def test_quota_total_counts_every_stream_and_an_existing_stream_is_not_counted_twice(
    tmp_path,
) -> None:
    with open_log(tmp_path, max_partitions_total=10) as log:
        log.create_stream("a", StreamConfig(partitions=6))
        with pytest.raises(QuotaExceeded, match="holds 6 of at most 10"):
            log.create_stream("b", StreamConfig(partitions=5))
        assert stream_dirs(tmp_path) == ["a"]
        log.create_stream("a", StreamConfig(partitions=6))  # opening it again is not a create
        log.create_stream("b", StreamConfig(partitions=4))
    # counted from disk after a restart
    with open_log(tmp_path, max_partitions_total=10) as log, pytest.raises(QuotaExceeded):
        log.create_stream("c")


def test_a_create_that_fails_on_the_disk_leaves_no_folder(tmp_path, monkeypatch) -> None:
    """Out of descriptors half way (the attack that left 2,564 folders per stream): a typed
    error, nothing left behind, and a retry once descriptors are back starts clean."""
    with open_log(tmp_path) as log:
        real = logfs.replace_file_atomic

        def emfile(*a, **kw):
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(logfs, "replace_file_atomic", emfile)
        with pytest.raises(CreateFailed, match="Too many open files"):
            log.create_stream("s", StreamConfig(partitions=4096))
        assert stream_dirs(tmp_path) == [] and log.streams() == []
        monkeypatch.setattr(logfs, "replace_file_atomic", real)
        log.create_stream("s", StreamConfig(partitions=4096))
        assert log.streams() == ["s"]


def test_max_open_partitions_below_one_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="max_open_partitions"):
        open_log(tmp_path, max_open_partitions=0)


def test_reopening_an_evicted_partition_leaves_its_seal_in_progress_alone(
    tmp_path, monkeypatch, caplog
) -> None:
    """Found from outside: with ``max_open_partitions`` and ``seal_to_lake``, reopening an
    evicted partition removed the lake's ``.tmp-`` files while the sealer was writing that
    partition's next lake file: the seal failed (and ``SEAL_FAILED`` stayed), or the race
    reached the append that reopened the partition as ``FileNotFoundError``. The seal here is
    held just before its rename until the partition has been evicted and opened again."""
    at_rename, go = threading.Event(), threading.Event()
    real_replace = logfs.replace

    def replace(src, dst) -> None:
        if Path(src).name.startswith(".tmp-") and not go.is_set():
            at_rename.set()
            go.wait(10)
        real_replace(src, dst)

    monkeypatch.setattr(logfs, "replace", replace)
    caplog.set_level(logging.ERROR, logger="loglake")
    cfg = StreamConfig(segment_bytes=4096)
    with open_log(tmp_path, max_open_partitions=1) as log:
        log.create_stream("a", cfg)
        log.create_stream("b", cfg)
        log.append_payloads("a", [b"x" * 1000] * 3)
        log.append_payloads("a", [b"y" * 1000] * 3)  # rolls: the first segment is sealed
        assert at_rename.wait(10)
        log.append_payloads("b", [b"b"])  # evicts a
        log.append_payloads("a", [b"z"])  # opens a again, its seal still writing
        go.set()
        log.wait_for_seals()
        assert [i for i, _ in log.read_payloads("a", 0)] == list(range(7))
        assert not [r for r in caplog.records if "seal" in r.getMessage()]
        assert not (tmp_path / "streams" / "a" / "0" / "SEAL_FAILED").exists()
        lake = tmp_path / "lake" / "a" / "partition=0"
        assert sorted(f.name for f in lake.iterdir() if f.suffix == ".parquet") == [
            "00000000000000000000-00000000000000000002.parquet"
        ]


def test_a_lake_temp_file_gone_before_its_unlink_is_not_an_error(tmp_path, monkeypatch) -> None:
    """The first open removes a crashed writer's lake temp files; one that is gone between
    the listing and the unlink is what it wanted (was: ``FileNotFoundError`` from the open)."""
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig())
        log.append_payloads("s", [b"a"])
    lake = tmp_path / "lake" / "s" / "partition=0"
    lake.mkdir(parents=True)
    (lake / ".tmp-left-over.parquet").write_bytes(b"PAR1 half")
    real_listdir = logfs.listdir

    def listdir(path):
        names = real_listdir(path)
        return [*names, ".tmp-gone.parquet"] if Path(path) == lake else names

    monkeypatch.setattr(logfs, "listdir", listdir)
    with open_log(tmp_path) as log:
        assert log.read_payloads("s", 0) == [(0, b"a")]
    assert not (lake / ".tmp-left-over.parquet").exists()
