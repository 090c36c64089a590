"""``pipeline.scratch``: a job's intermediate files in memory (tmpfs) when there is room,
else on disk, and never lost between the two."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loglake.pipeline import scratch as sc

TMPFS = sc._is_tmpfs(sc.MEMORY_ROOT)
needs_tmpfs = pytest.mark.peer(f"a tmpfs at {sc.MEMORY_ROOT}", TMPFS, "the memory path's folder")


@pytest.fixture
def key(tmp_path: Path):
    k = sc.scratch_key("test", tmp_path)
    yield k
    sc.clear_stale(k)


def _writer(body: bytes):
    def write(path: str) -> None:
        with open(path, "wb") as f:
            f.write(body)

    return write


def test_modes_and_where_memory_is_used(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="scratch mode 'ram'"):
        sc.open_scratch(tmp_path / "d", key, "j", "ram")
    assert sc.open_scratch(tmp_path / "d", key, "j", "disk").memory is None
    # a master that is not local: executors may not share this machine's /dev/shm
    assert sc.open_scratch(tmp_path / "d", key, "j", "auto", local_master=False).memory is None
    s = sc.open_scratch(tmp_path / "d", key, "j", "auto", local_master=True)
    assert (tmp_path / "d").is_dir()
    if TMPFS:
        assert s.memory == os.path.join(sc.MEMORY_ROOT, f"loglake-{key}", "j")
        assert os.path.isdir(s.memory)
        assert sc.open_scratch(tmp_path / "e", key, "k", "memory", local_master=False).memory
    else:
        assert s.memory is None


def test_keys_differ_by_output_and_purpose(tmp_path: Path) -> None:
    a = sc.scratch_key("archives-build", tmp_path / "a")
    assert a == sc.scratch_key("archives-build", tmp_path / "a")
    assert a != sc.scratch_key("archives-build", tmp_path / "b")
    assert a != sc.scratch_key("sds-audit", tmp_path / "a")


@needs_tmpfs
def test_a_file_goes_to_memory_when_it_has_room_and_is_found_there(
    tmp_path: Path, key: str
) -> None:
    s = sc.open_scratch(tmp_path / "d", key, "j", "memory")
    assert s.memory is not None
    where = s.write("s-1.arrow", 5, _writer(b"hello"))
    assert where == os.path.join(s.memory, "s-1.arrow")
    assert s.find("s-1.arrow") == where and Path(where).read_bytes() == b"hello"
    assert os.listdir(s.memory) == ["s-1.arrow"] and os.listdir(s.disk) == []  # no .tmp left
    assert s.find("s-2.arrow") is None


@needs_tmpfs
def test_no_room_in_memory_beside_the_reserve_writes_on_disk(tmp_path: Path, key: str) -> None:
    s = sc.open_scratch(tmp_path / "d", key, "j", "memory")
    free = os.statvfs(sc.MEMORY_ROOT)
    huge = sc.Scratch(s.disk, s.memory, reserve_bytes=free.f_blocks * free.f_frsize)
    where = huge.write("s-1.arrow", 5, _writer(b"hello"))
    assert where == os.path.join(s.disk, "s-1.arrow") and huge.find("s-1.arrow") == where
    assert os.listdir(s.memory) == []


@needs_tmpfs
def test_a_write_that_fails_in_memory_is_written_again_on_disk(tmp_path: Path, key: str) -> None:
    """An executor that does not see the memory folder (another machine), or a tmpfs filling
    between the check and the write: the file is on disk, whole, and no partial one is left."""
    s = sc.open_scratch(tmp_path / "d", key, "j", "memory")
    assert s.memory is not None
    calls: list[str] = []

    def write(path: str) -> None:
        calls.append(path)
        with open(path, "wb") as f:
            f.write(b"part")
            if path.startswith(sc.MEMORY_ROOT):
                raise OSError(28, "No space left on device")
            f.write(b"-whole")

    where = s.write("s-1.arrow", 10, write)
    assert [os.path.dirname(c) for c in calls] == [s.memory, s.disk]
    assert Path(where).read_bytes() == b"part-whole" and s.find("s-1.arrow") == where
    assert os.listdir(s.memory) == []
    os.rmdir(s.memory)  # the folder gone under the writer: disk again
    assert s.write("s-2.arrow", 3, _writer(b"abc")) == os.path.join(s.disk, "s-2.arrow")


def test_a_write_that_fails_on_disk_raises_and_leaves_no_file(tmp_path: Path, key: str) -> None:
    s = sc.open_scratch(tmp_path / "d", key, "j", "disk")

    def write(path: str) -> None:
        Path(path).write_bytes(b"x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        s.write("s-1.arrow", 1, write)
    assert s.find("s-1.arrow") is None


def test_unlink_and_remove_clear_both_folders(tmp_path: Path, key: str) -> None:
    s = sc.open_scratch(tmp_path / "d", key, "j", "auto")
    s.write("s-1.arrow", 1, _writer(b"a"))
    sc.Scratch(s.disk, None).write("s-2.arrow", 1, _writer(b"b"))  # one on disk for sure
    Path(s.disk, "0-1").write_bytes(b"part file")  # not a spill: kept by unlink
    s.unlink("s-*.arrow")
    assert s.find("s-1.arrow") is None and s.find("s-2.arrow") is None
    assert os.listdir(s.disk) == ["0-1"]
    s.remove()
    assert not Path(s.disk).exists()
    assert not os.path.exists(os.path.join(sc.MEMORY_ROOT, f"loglake-{key}"))


@needs_tmpfs
def test_clear_stale_removes_a_killed_runs_memory_scratch_and_only_its_keys(
    tmp_path: Path, key: str
) -> None:
    killed = sc.open_scratch(tmp_path / "d", key, "old", "memory")
    killed.write("s-1.arrow", 1, _writer(b"a"))
    other_key = sc.scratch_key("test", tmp_path / "other")
    other = sc.open_scratch(tmp_path / "o", other_key, "run", "memory")
    other.write("s-1.arrow", 1, _writer(b"b"))
    try:
        sc.clear_stale(key)
        assert not os.path.exists(os.path.dirname(str(killed.memory)))
        assert other.find("s-1.arrow") == os.path.join(str(other.memory), "s-1.arrow")
    finally:
        other.remove()
